"""Training-wizard 1.0's modular recipe (`training_wizard.recipes.modular.ModularTrainingSpec`) with an
instruction-tuning module, read as today's "sft", or a sequence-classification module, read as
"sequence_classification". translators.py does the models, data and shared training keys;
docs/migrating.md lists what each key becomes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training_wizard.errors import UserError
from training_wizard.legacy.translation import Translation, check_top_keys
from training_wizard.legacy.translators import (
    IGNORED_TRAINING_ARGS, translate_dataset, translate_model, translate_training, translate_validation,
)

_MODULES = {
    "training_wizard.specs.modules.instruction_tune.InstructionTuningModule": "sft",
    "training_wizard.specs.modules.seq_cls.SequenceClassifierModule": "sequence_classification",
}
_SUPERVISED_SAME = {
    "learning_rate", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "num_train_epochs", "warmup_steps", "warmup_ratio", "logging_steps", "save_steps", "save_total_limit",
    "gradient_checkpointing", "lr_scheduler_type", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "eval_steps",
}
_SUPERVISED_IGNORED = {
    **{k: v for k, v in IGNORED_TRAINING_ARGS.items() if k != "per_device_eval_batch_size"},
    "neftune_noise_alpha": "NEFTune's embedding noise is not available: training runs without it",
    "torch_compile": "the supervised loop runs eager",
}
# What each 1.0 module key becomes: a [training] key, or None (dropped) with the reason.
_MODULE_KEYS: dict[str, dict[str, tuple[str | None, str]]] = {
    "sft": {
        "assistant_only": ("completion_only_loss", ""),
        "eval_sample_size": (None, "held-out rows are scored by eval/loss and eval/mean_token_accuracy, not sampled"),
        "peek_rate": (None, "no generations are printed during SFT"),
        "peek_sample_size": (None, "no generations are printed during SFT"),
        "generation_args": (None, "no generations are made during SFT"),
    },
    "sequence_classification": {
        "loss_type": ("loss_type", ""), "label_smoothing": ("label_smoothing", ""),
        "compute_eval_metrics": (None, "eval/loss and eval/accuracy are always logged"),
        "save_plots": (None, "metrics.png is always written"),
    },
}


def translate_modular(data: dict[str, Any], path: Path | str) -> Translation:
    """1.0's modular recipe with an instruction-tuning module (-> "sft") or a sequence-classification module
    (-> "sequence_classification")."""
    module = dict(data.get("wizard_module") or {})
    kind = _MODULES.get(module.pop("spec_class", None))
    if kind is None:
        raise UserError(f"{path}: wizard_module.spec_class: this version reads 1.0's instruction tuning and sequence "
                        f"classification modules ({', '.join(_MODULES)})")
    out = Translation({"recipe_class": kind}, output_column="messages" if kind == "sft" else "prompt")
    out.note("spec_class", "recipe_class", f"the {kind} recipe")
    check_top_keys(data, path, "modular", ("wizard_module", "dataset_spec", "training_args_spec", "validation",
                                           "callbacks_spec"), ("dataset_spec",))
    if not isinstance(module.get("transformer_spec"), dict):
        raise UserError(f"{path}: wizard_module.transformer_spec: required table is missing")
    translate_training(data.get("training_args_spec", {}), out, _SUPERVISED_SAME, _SUPERVISED_IGNORED,
                       reads_max_steps=True)
    out.recipe["model"] = _supervised_model(module.pop("transformer_spec"), kind, out)
    training = out.recipe["training"]
    for key, value in module.items():
        target, reason = _MODULE_KEYS[kind].get(key, ("", ""))
        if target == "":
            raise UserError(f"{path}: wizard_module.{key}: no equivalent here")
        if target is not None:
            training[target] = value
        out.note(f"wizard_module.{key}", f"training.{target}" if target else None, reason)
    if kind == "sft" and training.get("completion_only_loss", True):
        _note_last_turn_only(data["dataset_spec"], out)
    out.recipe["dataset"] = translate_dataset(data["dataset_spec"], "dataset_spec", "dataset", out)
    if "validation" in data:
        translate_validation(data["validation"], out)
    if "callbacks_spec" in data:
        out.note("callbacks_spec", None, "no early stopping: the run trains its full length and logs the held-out "
                 "metrics every eval_steps")
    return out


def _supervised_model(table: dict[str, Any], kind: str, out: Translation) -> dict[str, Any]:
    """The module's transformer_spec: the tokenizer's max_length becomes training.max_length, a classifier's
    num_labels training.num_labels."""
    table = dict(table)
    call = dict(table.pop("tokenizer_call_kwargs", None) or {})
    if "max_length" in call:
        out.recipe["training"]["max_length"] = call.pop("max_length")
        out.note("wizard_module.transformer_spec.tokenizer_call_kwargs.max_length", "training.max_length")
    for key in call:
        out.note(f"wizard_module.transformer_spec.tokenizer_call_kwargs.{key}", None,
                 "examples are cut to training.max_length tokens")
    model = translate_model(table, "wizard_module.transformer_spec", "model", out)
    extra = model.get("from_pretrained_kwargs", {})
    if kind == "sequence_classification" and "num_labels" in extra:
        out.recipe["training"]["num_labels"] = extra.pop("num_labels")
        out.note("wizard_module.transformer_spec.from_pretrained_kwargs.num_labels", "training.num_labels")
        if not extra:
            model.pop("from_pretrained_kwargs")
    return model


def _note_last_turn_only(dataset: dict[str, Any], out: Translation) -> None:
    """1.0 trained only the last assistant message of each conversation; this SFT trains every assistant turn.
    Say so when a template has several."""
    template = dataset.get("messages_template") or []
    if sum(m.get("role") == "assistant" for m in template if isinstance(m, dict)) > 1:
        out.note("wizard_module.assistant_only", None, "every assistant message of the template trains here; "
                 "1.0 trained the last one only")
