"""The final save every recipe ends with: the trained model in Hugging Face format beside its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training_wizard.sharding import deepspeed_lookup_skipped, unwrap_model


def save_final_model(trainer, folder: Path, merge_lora: bool = False) -> None:
    """Hugging Face folder (safetensors) with the tokenizer; a LoRA policy is merged on request."""
    from training_wizard.checkpoint import save_options

    collectives = trainer.collectives
    collectives.barrier()
    state_dict: dict[str, Any] | None = collectives.full_state_dict(trainer.policy)
    if collectives.is_main:
        model = unwrap_model(trainer.accelerator, trainer.policy)
        if merge_lora and hasattr(model, "merge_and_unload"):
            if state_dict is not None:
                model.load_state_dict(state_dict)
                state_dict = None
            model = model.merge_and_unload()
        with deepspeed_lookup_skipped(trainer.accelerator):  # save_pretrained unwraps through accelerate
            model.save_pretrained(folder, state_dict=state_dict, safe_serialization=True, **save_options(model))
        trainer.tokenizer.save_pretrained(folder)
    collectives.barrier()
