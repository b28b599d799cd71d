"""Building PPO's value model: a sequence classifier with one output, read at every response token
(`rollout/value.py`). It starts from a reward model, a classifier folder, or a causal LM's weights with a new head.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import torch

from training_wizard.errors import UserError


def value_model_from_policy(policy: torch.nn.Module, lora: Any = None) -> torch.nn.Module:
    """A sequence classifier (num_labels = 1) with the causal LM's starting weights and a zero-initialised head.

    The head starts at zero so the first values are 0, a neutral baseline, and the backbone gets gradient once the
    head has moved. A LoRA (peft) policy gives a value model with the same adapter settings (its own, new adapter)
    and a trainable head; `lora` (a peft LoraConfig) overrides that. The base weights are copied, never shared.
    """
    from transformers import AutoModelForSequenceClassification

    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    config = copy.deepcopy(base.config)
    config.num_labels = 1
    value = AutoModelForSequenceClassification.from_config(config, dtype=next(base.parameters()).dtype)
    weights = {_plain_name(name): tensor for name, tensor in base.state_dict().items() if "lora_" not in name}
    missing, _ = value.load_state_dict(weights, strict=False)  # lm_head is left out: the head is new
    if any(not name.startswith("score") for name in missing):
        raise ValueError(f"value model: the policy's weights do not cover {missing[0]}")
    torch.nn.init.zeros_(value.score.weight)
    if lora is None and hasattr(policy, "peft_config"):
        lora = copy.deepcopy(policy.peft_config[getattr(policy, "active_adapter", "default")])
    return with_classifier_lora(value, lora)


def load_value_model(spec, dtype: Any, tokenizer) -> torch.nn.Module:
    """The value model a recipe's TransformerSpec names: a one-output sequence classifier folder, or a causal LM
    folder (its weights get a new scalar head). `spec.lora` trains an adapter plus the head."""
    from transformers import AutoModelForSequenceClassification

    from training_wizard.specs.model import name_model, parse_dtype

    folder = spec.resolved_path()
    lora = spec.lora.to_peft_config() if spec.lora is not None else None
    architectures = _architectures(folder)
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        return value_model_from_policy(spec.load_causal_lm(dtype, tokenizer), lora=lora)
    model = name_model(AutoModelForSequenceClassification.from_pretrained(
        folder, dtype=parse_dtype(dtype), use_safetensors=True, local_files_only=True,
        trust_remote_code=spec.trust_remote_code,
    ), spec.model_name())  # the name as the recipe gives it, not the cache folder it resolved to
    if model.config.num_labels != 1:
        raise UserError(f"value_model.pretrained_name: '{folder}' has {model.config.num_labels} labels; a value model "
                        "has one output (num_labels = 1)")
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    return with_classifier_lora(model, lora)


def with_classifier_lora(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    """A peft LoRA model for sequence classification (adapter + the `score` head trainable), or `model` as is."""
    if lora is None:
        return model
    from peft import get_peft_model

    lora = copy.deepcopy(lora)
    lora.task_type = "SEQ_CLS"
    lora.modules_to_save = sorted(set(lora.modules_to_save or []) | {"score"})
    return get_peft_model(model, lora)


def _plain_name(name: str) -> str:
    """A weight name of a peft-injected model as the plain model calls it (`q_proj.base_layer.weight` ->
    `q_proj.weight`)."""
    return name.replace(".base_layer.", ".")


def _architectures(folder) -> list[str]:
    try:
        return list(json.loads((folder / "config.json").read_text()).get("architectures") or [])
    except (OSError, ValueError):
        return []
