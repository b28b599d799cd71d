"""Translators of the tables every 1.0 recipe shares: models, data sources, training arguments and rewards.

Each one reads a 1.0 table, returns (or writes into `out.recipe`) today's table, and records in `out` what became
of every key; the recipe translators (rloo.py, grpo.py, supervised.py) call them.
"""

from __future__ import annotations

import copy
from typing import Any

from training_wizard.errors import UserError
from training_wizard.legacy.translation import Translation


# -- models ---------------------------------------------------------------------------------------------------
_LORA_KEYS = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "target_modules",
              "bias": "bias"}
_DTYPE_NAMES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "auto": "auto"}


def translate_model(table: dict[str, Any], old: str, new: str, out: Translation,
                    policy: bool = True) -> dict[str, Any]:
    """A 1.0 `transformer_spec` table as today's TransformerSpec table."""
    model: dict[str, Any] = {}
    for key, value in table.items():
        where = f"{old}.{key}"
        if key in ("pretrained_name", "revision", "trust_remote_code", "tokenizer_name"):
            model[key] = value
            out.note(where, f"{new}.{key}")
        elif key == "from_pretrained_kwargs":
            model.update(_from_pretrained(value, where, new, out, policy))
        elif key == "lora_spec":
            model["lora"] = _lora(value, where, new, out)
        elif key == "device_map":
            out.note(where, None, "accelerate places the model; launch with accelerate for several devices")
        elif key in ("tokenizer_init_kwargs", "tokenizer_call_kwargs"):
            out.note(where, None, "the tokenizer loads with its saved settings; prompts are not truncated (use "
                     "dataset.filter_length to drop long ones)")
        elif key in ("tokenizer_special_tokens", "apply_chat_template_kwargs") and value:
            raise UserError(f"{where}: has no equivalent here and ignoring it would change the prompts the model "
                            "sees; remove it (or save a tokenizer with these settings and point tokenizer_name at it)")
        elif key in ("tokenizer_special_tokens", "apply_chat_template_kwargs"):
            out.note(where, None, "empty")
        else:
            raise UserError(f"{where}: unknown key in a training-wizard 1.0 transformer_spec")
    if "pretrained_name" not in model:
        raise UserError(f"{old}.pretrained_name: required key is missing")
    return model


def _from_pretrained(kwargs: dict[str, Any], where: str, new: str, out: Translation, policy: bool) -> dict[str, Any]:
    moved: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in ("torch_dtype", "dtype") and policy:
            if value not in _DTYPE_NAMES:
                raise UserError(f"{where}.{key}: expected one of {', '.join(_DTYPE_NAMES)}, got {value!r}")
            out.recipe.setdefault("training", {})["dtype"] = _DTYPE_NAMES[value]
            out.note(f"{where}.{key}", "training.dtype")
        elif key == "attn_implementation":
            moved["attn_implementation"] = value
            out.note(f"{where}.{key}", f"{new}.attn_implementation")
        elif key in ("trust_remote_code", "revision"):
            moved[key] = value
            out.note(f"{where}.{key}", f"{new}.{key}")
        else:
            extra["dtype" if key == "torch_dtype" else key] = value  # transformers 5 spells it dtype
            out.note(f"{where}.{key}", f"{new}.from_pretrained_kwargs.{'dtype' if key == 'torch_dtype' else key}")
    if extra:
        moved["from_pretrained_kwargs"] = extra
    return moved


def _lora(table: dict[str, Any], where: str, new: str, out: Translation) -> dict[str, Any]:
    lora: dict[str, Any] = {}
    for key, value in table.items():
        if key in _LORA_KEYS:
            lora[_LORA_KEYS[key]] = value
            out.note(f"{where}.{key}", f"{new}.lora.{_LORA_KEYS[key]}")
        elif key in ("task_type", "inference_mode", "spec_class"):
            out.note(f"{where}.{key}", None, "set by training-wizard")
        else:
            raise UserError(f"{where}.{key}: no LoRA equivalent here (supported: {', '.join(_LORA_KEYS)})")
    return lora


# -- data -----------------------------------------------------------------------------------------------------
_SOURCES = {
    "training_wizard.specs.dataset.SimpleDataSourceSpec": "training_wizard.specs.dataset.SimpleDataSourceSpec",
    "training_wizard.specs.dataset.TemplateInstructDatasourceSpec":
        "training_wizard.specs.dataset.TemplateInstructDatasourceSpec",
    "training_wizard.specs.dataset.MultiDataSourceSpec": "training_wizard.specs.dataset.MultiDataSourceSpec",
}


def translate_dataset(table: dict[str, Any], old: str, new: str, out: Translation) -> dict[str, Any]:
    """A 1.0 data source table (simple, template, multi; recursively) as today's."""
    table = dict(table)
    spec_class = table.pop("spec_class", "training_wizard.specs.dataset.SimpleDataSourceSpec")
    source: dict[str, Any] = {}
    if spec_class not in _SOURCES:
        source["spec_class"] = spec_class  # a user's own source: passed through unchanged
        source.update(table)
        out.note(f"{old}.spec_class", f"{new}.spec_class", "a source of your own: its keys are passed through")
        return source
    if spec_class != "training_wizard.specs.dataset.SimpleDataSourceSpec":
        source["spec_class"] = _SOURCES[spec_class]
    for key, value in table.items():
        where = f"{old}.{key}"
        if key == "parent":
            source["parent"] = translate_dataset(value, where, f"{new}.parent", out)
        elif key == "parents":
            source["sources"] = [translate_dataset(p, f"{where}[{i}]", f"{new}.sources[{i}]", out)
                                 for i, p in enumerate(value)]
        elif key == "messages_template":
            source[key] = value
            out.note(where, f"{new}.{key}")
        elif key == "output_column":
            if value != out.output_column:
                raise UserError(f"{where}: '{value}': this recipe reads the rendered messages from the column "
                                f"'{out.output_column}'; set output_column = \"{out.output_column}\"")
            if value == "messages":
                source[key] = value
            out.note(where, f"{new}.output_column" if value == "messages" else None,
                     "" if value == "messages" else "the rendered messages always go to the 'prompt' column")
        elif key == "data_files" or key in ("name", "split", "subset"):
            source[key] = value
            out.note(where, f"{new}.{key}")
        elif key == "load_dataset_kwargs":
            source.update(_load_kwargs(value, where, new, out))
        elif key == "loader":
            out.note(where, None, "the file type comes from the file name")
        elif key == "preprocessing":
            source.update(_preprocessing(value, where, new, out))
        else:
            raise UserError(f"{where}: unknown key in a training-wizard 1.0 data source")
    return source


def _load_kwargs(kwargs: dict[str, Any], where: str, new: str, out: Translation) -> dict[str, Any]:
    moved = {}
    for key, value in kwargs.items():
        target = {"path": "name", "data_files": "data_files", "split": "split", "name": "subset"}.get(key)
        if key == "sep" and value == "\t":
            out.note(f"{where}.{key}", None, "tab-separated files are read as such by their .tsv name")
            continue
        if target is None:
            raise UserError(f"{where}.{key}: no equivalent for this load_dataset argument here")
        moved[target] = value
        out.note(f"{where}.{key}", f"{new}.{target}")
    return moved


def _preprocessing(table: dict[str, Any], where: str, new: str, out: Translation) -> dict[str, Any]:
    moved: dict[str, Any] = {}
    for key, value in table.items():
        if key == "select_columns":
            moved["columns"] = value
        elif key in ("rename_columns", "take"):
            moved[key] = value
        elif key == "shuffle":
            moved["shuffle"] = bool(value)
            if isinstance(value, int) and not isinstance(value, bool):
                moved["shuffle_seed"] = value
        elif key == "token_length_filter":
            moved["filter_length"] = bool(value)
        else:
            raise UserError(f"{where}.{key}: unknown preprocessing step")
        out.note(f"{where}.{key}", f"{new}.{_PREPROCESSING_NEW.get(key, key)}")
    return moved


_PREPROCESSING_NEW = {"select_columns": "columns", "token_length_filter": "filter_length"}


def translate_validation(value: Any, out: Translation) -> None:
    """`validation`: a count or share of the dataset's rows held out for evaluation, or a data source table."""
    if isinstance(value, dict):
        out.recipe["eval_dataset"] = translate_dataset(value, "validation", "eval_dataset", out)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UserError(f"validation: expected a row count, a share in (0, 1) or a data source table, got {value!r}")
    out.recipe["dataset"]["hold_out"] = value
    out.recipe["eval_dataset"] = {**copy.deepcopy(out.recipe["dataset"]), "part": "held_out"}
    out.recipe.setdefault("training", {}).setdefault("eval_steps", out.recipe["training"].get("logging_steps", 1))
    out.note("validation", "dataset.hold_out + eval_dataset (part = held_out)", "evaluated every eval_steps")


# -- training arguments ---------------------------------------------------------------------------------------
_SAME = {
    "rloo_k", "kl_coef", "cliprange", "num_ppo_epochs", "num_mini_batches", "whiten_rewards", "temperature",
    "response_length", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
    "total_episodes", "num_train_epochs", "warmup_steps", "warmup_ratio", "logging_steps", "save_steps",
    "save_total_limit", "gradient_checkpointing", "lr_scheduler_type", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_epsilon", "max_grad_norm", "local_rollout_forward_batch_size", "num_sample_generations", "stop_token",
    "stop_token_id", "missing_eos_penalty", "normalize_reward", "reward_clip_range", "normalize_advantage",
    "token_level_kl", "kl_estimator", "eval_steps", "ds3_gather_for_generation",
}
IGNORED_TRAINING_ARGS = {
    "run_name": "runs are named by output_dir", "per_device_eval_batch_size": "evaluation uses the rollout batch",
    "save_only_model": "checkpoints always hold the optimizer so a resume is exact",
    "load_best_model_at_end": "the final model is the last one", "logging_dir": "metrics go to output_dir",
    "overwrite_output_dir": "output_dir is reused", "dataloader_num_workers": "prompts are prepared once",
    "push_to_hub": "nothing is uploaded", "remove_unused_columns": "every column reaches the reward",
}
_ADAMW = ("adamw_torch", "adamw_hf", "adamw_torch_fused", "adamw")


def translate_training(table: dict[str, Any], out: Translation, same: set[str] = _SAME,
                       ignored: dict[str, str] = IGNORED_TRAINING_ARGS, reads_max_steps: bool = False) -> None:
    """`training_args_spec` into `[training]`: `same` keys keep their names, `ignored` ones are dropped with their
    reason; `reads_max_steps` for a recipe whose training is counted in optimizer steps (the supervised ones, and
    GRPO, whose 1.0 recipe was TRL's)."""
    training = out.recipe.setdefault("training", {})
    for key, value in table.items():
        where = f"training_args_spec.{key}"
        if key in ("output_dir", "seed"):
            out.recipe[key] = value
            out.note(where, key)
        elif key == "max_steps" and reads_max_steps:
            if value is not None and value > 0:
                training[key] = value
            out.note(where, "training.max_steps" if value and value > 0 else None, "" if value and value > 0
                     else "-1: num_train_epochs decides")
        elif key in same:
            training[key] = value
            out.note(where, f"training.{key}")
        elif key in ("bf16", "fp16"):
            if value:
                training["dtype"] = "bfloat16" if key == "bf16" else "float16"
            out.note(where, "training.dtype" if value else None, "" if value else "false: float32 stays")
        elif key == "optim":
            out.note(where, None if value not in _ADAMW else "AdamW",
                     "" if value in _ADAMW else f"'{value}' is not available: training uses AdamW (32-bit states)")
        elif key in ("eval_strategy", "evaluation_strategy", "save_strategy"):
            _strategy(key, value, where, out)
        elif key == "report_to":
            reports = [value] if isinstance(value, str) else list(value)
            training["report_to"] = [r for r in reports if r not in ("none", "all")]
            out.note(where, "training.report_to")
        elif key in ignored:
            out.note(where, None, ignored[key])
        else:
            raise UserError(f"{where}: no equivalent here; remove it (see docs/migrating.md for the supported keys)")
    out.recipe.setdefault("output_dir", "runs/migrated")


def _strategy(key: str, value: str, where: str, out: Translation) -> None:
    if value in ("steps", "no"):
        if value == "no" and key == "save_strategy":
            out.recipe["training"].pop("save_steps", None)
        out.note(where, None, "the *_steps keys decide" if value == "steps" else "nothing to do")
        return
    raise UserError(f"{where}: '{value}' has no equivalent here; use 'steps' with save_steps / eval_steps")


# -- rewards --------------------------------------------------------------------------------------------------
_OLD_MULTI = ("training_wizard.specs.reward.MultiRewardSpec",)


def translate_reward(table: dict[str, Any], old: str, out: Translation, raw_text: bool = True) -> dict[str, Any]:
    """A 1.0 reward table wrapped in LegacyRewardSpec. raw_text: the inputs of 1.0's RLOO trainer (templated
    prompt, completion with special tokens); False: those of 1.0's GRPO recipe (TRL's GRPOTrainer)."""
    table = dict(table)
    spec_class = table.get("spec_class")
    if spec_class is None:
        raise UserError(f"{old}.spec_class: required key is missing")
    if spec_class in _OLD_MULTI and "rewards" in table:
        return _multi_reward(table, old, out, raw_text)
    if isinstance(table.get("transformer_spec"), dict):
        table["transformer_spec"] = translate_model(table["transformer_spec"], f"{old}.transformer_spec",
                                                    "reward.reward.transformer_spec", out, policy=False)
    seen = "the templated prompt and raw completion" if raw_text else "the prompt's last message and the completion"
    out.note(old, "reward", f"wrapped in LegacyRewardSpec: the reward sees {seen}")
    logging_steps = out.recipe.get("training", {}).get("logging_steps", 1)
    wrapped = {"spec_class": "training_wizard.legacy.LegacyRewardSpec", "reward": table, "logging_steps": logging_steps}
    return wrapped if raw_text else {**wrapped, "raw_text": False}


def _multi_reward(table: dict[str, Any], old: str, out: Translation, raw_text: bool = True) -> dict[str, Any]:
    rewards = table.get("rewards") or []
    weights = table.get("weights") or [1.0] * len(rewards)
    if len(weights) != len(rewards):
        raise UserError(f"{old}.weights: {len(weights)} weights for {len(rewards)} rewards")
    unknown = [k for k in table if k not in ("spec_class", "rewards", "weights", "normalize_rewards",
                                             "normalize_weights")]
    if unknown:
        raise UserError(f"{old}.{unknown[0]}: unknown key in a training-wizard 1.0 MultiRewardSpec")
    components = {}
    for index, (reward, weight) in enumerate(zip(rewards, weights)):
        name = f"{index}_{reward.get('spec_class', 'reward').rsplit('.', 1)[-1]}"
        spec = translate_reward(reward, f"{old}.rewards[{index}]", out, raw_text)
        components[name] = {"spec": spec, "weight": weight, "normalize": bool(table.get("normalize_rewards", False))}
    out.note(f"{old}.rewards", "reward.components", "one component per reward, named by position and class")
    out.note(f"{old}.normalize_weights", "reward.strategy", "mean (weights divided by their sum) when true")
    return {"spec_class": "training_wizard.specs.reward.MultiRewardSpec", "components": components,
            "strategy": "mean" if table.get("normalize_weights") else "sum"}
