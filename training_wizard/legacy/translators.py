"""Recipes written for training-wizard 1.0: read them as they are, or convert them once (`training-wizard migrate`).

A 1.0 recipe names its recipe class in a top-level `spec_class` and keeps its parts in `[transformer_spec]`,
`[reference_transformer_spec]`, `[dataset_spec]`, `[reward_spec]` and `[training_args_spec]` (the RLOO options
next to Hugging Face `TrainingArguments` keys), with `validation` holding rows out for evaluation. `translate`
maps every key to today's recipe and records a `Note` for each one it translated or dropped: dropped keys that do
not change the result are warned about, one line each; a key whose loss would change the result stops with one
line. 1.0 reward classes keep working through `LegacyRewardSpec`, which gives them the inputs they were written
against. 1.0's GRPO recipe is read by legacy_grpo.py and its modular (SFT, sequence classification) recipe by
legacy_supervised.py, both on top of this module. docs/migrating.md has the key tables.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from training_wizard.errors import UserError
from training_wizard.specs.reward import RewardSpec, iterations_before

RLOO_CLASSES = ("training_wizard.recipes.rloo.RLOOTrainingSpec", "training_wizard.recipes.rloo.RLOOSpec")
GRPO_CLASS = "training_wizard.recipes.grpo.GRPOTrainingSpec"
MODULAR_CLASS = "training_wizard.recipes.modular.ModularTrainingSpec"
LEGACY_TABLES = ("transformer_spec", "reference_transformer_spec", "dataset_spec", "reward_spec", "training_args_spec")


@dataclass
class Note:
    """What happened to one 1.0 key: `new` is its new key (None when dropped), `reason` a short explanation."""

    old: str
    new: str | None
    reason: str = ""


@dataclass
class Translation:
    recipe: dict[str, Any]
    notes: list[Note] = field(default_factory=list)
    output_column: str = "prompt"  # where a template source puts its messages: "messages" for SFT

    def note(self, old: str, new: str | None, reason: str = "") -> None:
        self.notes.append(Note(old, new, reason))

    @property
    def warnings(self) -> list[str]:
        return [f"{n.old}: ignored ({n.reason})" for n in self.notes if n.new is None]


def is_legacy_recipe(data: dict[str, Any]) -> bool:
    """A 1.0 recipe: a top-level `spec_class` naming the recipe, and no `recipe_class`."""
    return "recipe_class" not in data and isinstance(data.get("spec_class"), str)


def translate_legacy_recipe(data: dict[str, Any], path: Path | str) -> Translation:
    """Today's recipe dict (with `recipe_class`) for a 1.0 recipe, and a note for every key."""
    data = copy.deepcopy(data)
    recipe_class = data.pop("spec_class")
    if recipe_class == MODULAR_CLASS:
        from training_wizard.legacy_supervised import translate_modular  # it builds on this module's translators

        return translate_modular(data, path)
    if recipe_class == GRPO_CLASS:
        from training_wizard.legacy_grpo import translate_grpo  # it builds on this module's translators

        return translate_grpo(data, path, Translation({"recipe_class": "grpo"}))
    if recipe_class not in RLOO_CLASSES:
        raise UserError(f"{path}: spec_class: '{recipe_class}' is a training-wizard 1.0 recipe class this version "
                        "does not run; it reads only RLOO recipes (training_wizard.recipes.rloo.RLOOTrainingSpec), "
                        "GRPO recipes (training_wizard.recipes.grpo.GRPOTrainingSpec) and the modular recipe with "
                        "an instruction tuning or sequence classification module")
    out = Translation({"recipe_class": "rloo"})
    out.note("spec_class", "recipe_class", "the RLOO recipe")
    check_top_keys(data, path, "RLOO", (*LEGACY_TABLES, "validation"),
                   ("transformer_spec", "dataset_spec", "reward_spec"))
    out.recipe["model"] = _model(data["transformer_spec"], "transformer_spec", "model", out)
    if "reference_transformer_spec" in data:
        out.recipe["ref_model"] = _model(data["reference_transformer_spec"], "reference_transformer_spec",
                                         "ref_model", out)
    out.recipe["dataset"] = _dataset(data["dataset_spec"], "dataset_spec", "dataset", out)
    _training(data.get("training_args_spec", {}), out)
    out.recipe["reward"] = _reward(data["reward_spec"], "reward_spec", out)
    if "validation" in data:
        _validation(data["validation"], out)
    return out


def check_top_keys(data: dict[str, Any], path: Path | str, kind: str, allowed: tuple[str, ...],
                   required: tuple[str, ...]) -> None:
    """One line for the first top-level key a 1.0 `kind` recipe did not have, or the first required one missing."""
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise UserError(f"{path}: {unknown[0]}: unknown key in a training-wizard 1.0 {kind} recipe")
    for key in required:
        if key not in data:
            raise UserError(f"{path}: {key}: required key is missing (training-wizard 1.0 {kind} recipe)")


# -- models ---------------------------------------------------------------------------------------------------
_LORA_KEYS = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "target_modules",
              "bias": "bias"}
_DTYPE_NAMES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "auto": "auto"}


def _model(table: dict[str, Any], old: str, new: str, out: Translation, policy: bool = True) -> dict[str, Any]:
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


def _dataset(table: dict[str, Any], old: str, new: str, out: Translation) -> dict[str, Any]:
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
            source["parent"] = _dataset(value, where, f"{new}.parent", out)
        elif key == "parents":
            source["sources"] = [_dataset(p, f"{where}[{i}]", f"{new}.sources[{i}]", out) for i, p in enumerate(value)]
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


def _validation(value: Any, out: Translation) -> None:
    """`validation`: a count or share of the dataset's rows held out for evaluation, or a data source table."""
    if isinstance(value, dict):
        out.recipe["eval_dataset"] = _dataset(value, "validation", "eval_dataset", out)
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
_IGNORED = {
    "run_name": "runs are named by output_dir", "per_device_eval_batch_size": "evaluation uses the rollout batch",
    "save_only_model": "checkpoints always hold the optimizer so a resume is exact",
    "load_best_model_at_end": "the final model is the last one", "logging_dir": "metrics go to output_dir",
    "overwrite_output_dir": "output_dir is reused", "dataloader_num_workers": "prompts are prepared once",
    "push_to_hub": "nothing is uploaded", "remove_unused_columns": "every column reaches the reward",
}
_ADAMW = ("adamw_torch", "adamw_hf", "adamw_torch_fused", "adamw")


def _training(table: dict[str, Any], out: Translation, same: set[str] = _SAME,
              ignored: dict[str, str] = _IGNORED, reads_max_steps: bool = False) -> None:
    """`training_args_spec` into `[training]`: `same` keys keep their names, `ignored` ones are dropped with their
    reason; `reads_max_steps` for a recipe whose training is counted in optimizer steps (the supervised ones)."""
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


def _reward(table: dict[str, Any], old: str, out: Translation, raw_text: bool = True) -> dict[str, Any]:
    """A 1.0 reward table wrapped in LegacyRewardSpec. raw_text: the inputs of 1.0's RLOO trainer (templated
    prompt, completion with special tokens); False: those of 1.0's GRPO recipe (TRL's GRPOTrainer)."""
    table = dict(table)
    spec_class = table.get("spec_class")
    if spec_class is None:
        raise UserError(f"{old}.spec_class: required key is missing")
    if spec_class in _OLD_MULTI and "rewards" in table:
        return _multi_reward(table, old, out, raw_text)
    if isinstance(table.get("transformer_spec"), dict):
        table["transformer_spec"] = _model(table["transformer_spec"], f"{old}.transformer_spec",
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
        components[name] = {"spec": _reward(reward, f"{old}.rewards[{index}]", out, raw_text), "weight": weight,
                            "normalize": bool(table.get("normalize_rewards", False))}
    out.note(f"{old}.rewards", "reward.components", "one component per reward, named by position and class")
    out.note(f"{old}.normalize_weights", "reward.strategy", "mean (weights divided by their sum) when true")
    return {"spec_class": "training_wizard.specs.reward.MultiRewardSpec", "components": components,
            "strategy": "mean" if table.get("normalize_weights") else "sum"}


class _TrainerState:
    def __init__(self, step: int):
        self.global_step = step


class _TrainerArgs:
    def __init__(self, logging_steps: int):
        self.logging_steps = logging_steps


class LegacyTrainerView:
    """What 1.0 reward code reads from `self.trainer`: `is_world_process_zero()`, `state.global_step`,
    `args.logging_steps`, and `_metrics["train"][name]`, the lists 1.0 GRPO rewards append their own metrics to
    (TRL's private log buffer): here they take the values and drop them, since no tracker reads them."""

    def __init__(self, step: int, logging_steps: int):
        self.state, self.args = _TrainerState(step), _TrainerArgs(logging_steps)
        self._metrics: defaultdict[str, defaultdict[str, list]] = defaultdict(lambda: defaultdict(list))

    @staticmethod
    def is_world_process_zero() -> bool:
        from accelerate import PartialState

        return PartialState().is_main_process


class LegacyRewardSpec(RewardSpec):
    """Runs a reward class written for training-wizard 1.0: its `compute_reward(prompts, completions, **kwargs)`
    gets what 1.0's recipe gave it (`raw_text`: the RLOO recipe's templated prompt and completion with special
    tokens, or the GRPO recipe's plain text), and `self.trainer` answers what 1.0 rewards ask of it."""

    reward: RewardSpec = Field(description="The 1.0 reward spec (its own spec_class and keys).")
    logging_steps: int = Field(1, ge=1, description="What `self.trainer.args.logging_steps` answers.")
    raw_text: bool = Field(
        True, description="true: the prompt as the model saw it and the completion with its special tokens (1.0's "
        "RLOO recipe). false: the prompt's text (a conversation's last message) and the completion without special "
        "tokens, what 1.0's GRPO recipe (TRL's GRPOTrainer) gave a reward that reads a message's content."
    )

    def uses_raw_text(self) -> bool:
        return self.raw_text

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        step = columns.pop("step", 0)
        templated = columns.pop("templated_prompts", prompts)
        raw = columns.pop("raw_completions", completions)
        object.__setattr__(self.reward, "trainer", LegacyTrainerView(iterations_before(step), self.logging_steps))
        return self.reward.compute_reward(templated, raw, **accepted_columns(self.reward.compute_reward, columns))

    def score(self, prompts, completions, columns, step: int = 0, label: str | None = None):
        return super().score(prompts, completions, {**columns, "step": step}, step=step,
                             label=label or type(self.reward).__name__)


def accepted_columns(method: Any, columns: dict[str, Any]) -> dict[str, Any]:
    """The row columns `method` takes: all of them if it has **kwargs, else those it names. 1.0's reward classes
    are often `compute_reward(self, queries, completions)` with no **kwargs (1.0 never passed columns), and a
    template source's row columns (e.g. `input`) would otherwise end the run at the first reward call."""
    import inspect

    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: pass everything, as before
        return columns
    parameters = list(parameters)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    positional = [p for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    names = {p.name for p in positional[2:] if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}  # after the
    names |= {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}  # prompts and completions
    return {key: value for key, value in columns.items() if key in names}


def migrated_text(translation: Translation, source: Path | str) -> str:
    """The translated recipe as TOML, headed by one comment line per 1.0 key: where it went, or why it was dropped."""
    from training_wizard.spec import dump_toml

    lines = [f"# Migrated from {source} (a training-wizard 1.0 recipe) by `training-wizard migrate`.",
             "# Every 1.0 key and what became of it:"]
    for note in translation.notes:
        target = f"-> {note.new}" if note.new else "dropped"
        lines.append(f"#   {note.old} {target}" + (f" ({note.reason})" if note.reason else ""))
    return "\n".join(lines) + "\n\n" + dump_toml(translation.recipe)
