"""TRL 1.16's trainer arguments turned into this library's, so that `GRPOTrainer(model=..., reward_funcs=...,
args=..., train_dataset=...)` as TRL's documentation writes it builds the same trainer as the older
`GRPOTrainer(config=..., tokenizer=..., policy=..., reward_model=..., train_dataset=...)`: the facades
(trl/trainers.py) call `trainer_arguments` first and the native trainer's keyword-only constructor
(trainers/algorithms/group.py) with what it returns (docs/porting_from_trl.md).

TRL's arguments and what they become:
- `model`: a folder or cached Hub id, loaded as the `[model]` table loads one (TransformerSpec, safetensors, never
  downloaded) with `args.model_init_kwargs` (dtype, revision, trust_remote_code, attn_implementation, the rest to
  from_pretrained), or a model object; `peft_config` wraps it in a peft adapter as `[model] lora` does;
- `processing_class`: the tokenizer (default: the model's, left-padded, with a pad token distinct from EOS as the
  `[model]` table loads it); a given tokenizer without a pad token pads with EOS, as TRL's trainers do;
- `reward_funcs`, `reward_processing_classes`, `args.reward_weights`: one RewardObjectsSpec (specs/reward_functions.py);
- `args`: the config (default: the config class's defaults with output_dir "<model name>-GRPO" / "-RLOO", as TRL);
- `callbacks`: transformers TrainerCallbacks (trl/callbacks.py); `tools`, `environment_factory`: episodes
  (rollout/episodes.py), as the older constructor takes them.

Refused with one line each: `optimizers` (the optimizer is AdamW set up from the config with the models,
accelerate and DeepSpeed), `quantization_config` (also inside model_init_kwargs), `rollout_func`, and an
`eval_dataset` mapping of several datasets.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from os import PathLike
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from training_wizard.errors import UserError
from training_wizard.spec import describe_error, error_key, shown
from training_wizard.specs.chat_rendering import bind_chat_template_kwargs
from training_wizard.trainers.config.on_policy import OnPolicyConfig
from training_wizard.trainers.algorithms.group import training_rows

# The older constructor's name for each TRL argument it shares a meaning with.
_SAME_ROLE = {"args": "config", "processing_class": "tokenizer", "model": "policy", "reward_funcs": "reward_model"}
# The arguments only TRL's form has: any of them given, the model and tokenizer are set up as TRL's trainers do.
_TRL_ONLY = ("model", "reward_funcs", "processing_class", "reward_processing_classes", "peft_config")
# TRL 1.16's defaults that decide how many optimizer steps a run takes, by trainer: followed by the TRL-form
# constructor (TrainingArguments' 3 epochs; RLOO's one pass over each generation, num_iterations).
_STEP_DEFAULTS = {"GRPO": {"num_train_epochs": 3.0}, "RLOO": {"num_train_epochs": 3.0, "num_ppo_epochs": 1},
                  "Distillation": {"num_train_epochs": 3.0}}
# TRL 1.16's defaults ours keep (docs/trl_options.md, "Where our defaults differ"): named at start when unset.
_KEPT_DEFAULTS = {
    "GRPO": {"bf16": True, "gradient_checkpointing": True, "logging_steps": 10, "save_steps": 500},
    "RLOO": {"bf16": True, "gradient_checkpointing": True, "logging_steps": 10, "save_steps": 500,
             "response_length": 512, "temperature": 1.0, "learning_rate": 1e-6},
    "Distillation": {"bf16": True, "gradient_checkpointing": True, "logging_steps": 10, "save_steps": 500},
}
# TransformerSpec fields that model_init_kwargs may set; the remaining keys go to from_pretrained as they are.
_SPEC_KEYS = ("revision", "trust_remote_code", "attn_implementation")


def trainer_arguments(config_class: type[OnPolicyConfig], suffix: str, trl: dict[str, Any],
                      older: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `OnPolicyTrainer.__init__` (plus `callbacks`) from TRL's arguments `trl` and the
    older ones `older` (config, tokenizer, policy, reward_model, ...); a name given both ways is refused."""
    refuse_unsupported(trl)
    for new, old in _SAME_ROLE.items():
        if trl.get(new) is not None and older.get(old) is not None:
            raise UserError(f"{new} and {old}: the same argument under TRL's name and the older one; pass one")
    if isinstance(trl.get("model"), OnPolicyConfig):
        raise UserError("model: got a config; pass it as args= (TRL's name) or config=")
    config = trl.get("args") or older.pop("config", None) or default_config(config_class, suffix, trl.get("model"))
    if not isinstance(config, config_class):
        raise UserError(f"args: expected a {config_class.__name__}, got {type(config).__name__}")
    passed = {**older, "config": config, "callbacks": trl.get("callbacks")}
    for name in ("train_dataset", "eval_dataset", "tools", "environment_factory"):
        if trl.get(name) is not None:
            passed[name] = trl[name]
    # before any model loads: a bad row costs no loading time (the native constructor takes the rows as they are)
    rows = training_rows(config, passed.get("train_dataset"), passed.get("eval_dataset"),
                         passed.get("environment_factory"))
    if rows is not None:
        passed["train_dataset"] = rows
    if not any(trl.get(name) is not None for name in _TRL_ONLY):
        return passed  # the older arguments as they were given; the native constructor binds chat_template_kwargs
    follow_trl_defaults(config, suffix)
    model = trl["model"] if trl.get("model") is not None else passed.pop("policy", None)
    if model is None:
        raise UserError("model: required (a model folder, a cached Hub id or a model object)")
    tokenizer = trl["processing_class"] if trl.get("processing_class") is not None else passed.get("tokenizer")
    policy, tokenizer = load_policy(model, tokenizer, config, trl.get("peft_config"))
    bind_chat_template_kwargs(tokenizer, config.chat_template_kwargs)
    passed.update(policy=policy, tokenizer=tokenizer)
    if trl.get("reward_funcs") is not None:
        passed["reward_model"] = reward_spec(trl["reward_funcs"], trl.get("reward_processing_classes"), config)
    elif passed.get("reward_model") is None and passed.get("environment_factory") is None and not passed.get("tools"):
        raise UserError("reward_funcs: required (a reward function, a reward model's name, or a list of them), "
                        "unless an environment_factory's get_reward scores the episodes")
    if passed.get("train_dataset") is None:
        raise UserError("train_dataset: required (a datasets.Dataset with a 'prompt' column, or a list of rows)")
    return passed


def follow_trl_defaults(config: OnPolicyConfig, suffix: str) -> None:
    """The TRL-form constructor trains as many optimizer steps on the same rows as TRL 1.16 would: TRL's defaults
    that decide the count replace ours where `args` leaves them unset (a recipe and the older constructor keep
    ours). The defaults that still differ, unset in `args`, are printed once."""
    unset = [key for key in _STEP_DEFAULTS[suffix] if key not in config.model_fields_set]
    # under max_steps or total_episodes the epochs decide nothing, and an existing script's count of passes over
    # each generation is kept
    follow = [key for key in unset if key == "num_train_epochs" or (config.total_episodes is None
                                                                   and config.max_steps is None)]
    for key in follow:
        setattr(config, key, _STEP_DEFAULTS[suffix][key])
    config.model_fields_set.difference_update(follow)  # still TRL's default, not the caller's choice
    kept = [f"{key} {shown(getattr(config, key))} (TRL {shown(trl_value)})"
            for key, trl_value in {**_STEP_DEFAULTS[suffix], **_KEPT_DEFAULTS[suffix]}.items()
            if key not in config.model_fields_set and getattr(config, key) != trl_value]
    if kept and os.environ.get("RANK", "0") == "0":
        print(f"{type(config).__name__}: defaults that differ from TRL 1.16's (set them in args for TRL's): "
              f"{', '.join(kept)}")


def refuse_unsupported(trl: dict[str, Any]) -> None:
    """One line for each TRL argument with no counterpart here, naming what to use instead."""
    if any(part is not None for part in trl.get("optimizers") or ()):
        raise UserError("optimizers: not supported; the optimizer is AdamW made from args (learning_rate, "
                        "adam_beta1, adam_beta2, adam_epsilon, weight_decay) and the schedule from lr_scheduler_type, "
                        "warmup_steps and warmup_ratio: set those instead")
    if trl.get("quantization_config") is not None:
        raise UserError("quantization_config: quantized models are not supported; load the model in bfloat16 "
                        "(model_init_kwargs={'dtype': 'bfloat16'}) and train a LoRA adapter (peft_config)")
    if trl.get("rollout_func") is not None:
        raise UserError("rollout_func: not supported; use environment_factory or tools for multi-turn episodes "
                        "(docs/environments.md), or rollout_source= (a RolloutSource) for a rollout of your own")
    if isinstance(trl.get("eval_dataset"), dict):
        raise UserError("eval_dataset: a mapping of several datasets is not supported; pass one datasets.Dataset")


def default_config(config_class: type[OnPolicyConfig], suffix: str, model: Any) -> OnPolicyConfig:
    """TRL's default args: the config's defaults, output_dir named after the model ("<base name>-GRPO")."""
    name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "name_or_path", "") or "model"
    return config_class(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-{suffix}")


def model_init_kwargs(config: OnPolicyConfig) -> dict[str, Any]:
    """args.model_init_kwargs (a copy), None as {}; quantization_config refused."""
    kwargs = dict(getattr(config, "model_init_kwargs", None) or {})
    if kwargs.get("quantization_config") is not None:
        refuse_unsupported({"quantization_config": kwargs["quantization_config"]})
    return kwargs


def load_policy(model: Any, tokenizer: Any, config: OnPolicyConfig, peft_config: Any) -> tuple[Any, Any]:
    """(policy, tokenizer): `model` loaded if it is a name, the tokenizer loaded if none is given, `peft_config`
    applied."""
    from training_wizard.specs.model import TransformerSpec, apply_peft

    kwargs = model_init_kwargs(config)
    if not isinstance(model, (str, PathLike, torch.nn.Module)):
        raise UserError(f"model: expected a model folder, a cached Hub id or a transformers model, got "
                        f"{type(model).__name__}")
    if isinstance(model, PathLike):
        model = str(model)
    if isinstance(model, str):
        spec, dtype = model_spec(model, kwargs, config)
        with model_argument_errors():
            tokenizer = padded(tokenizer) if tokenizer is not None else spec.load_tokenizer()
            model = spec.load_causal_lm(dtype, tokenizer)
    else:
        if tokenizer is None:
            name = getattr(model.config, "name_or_path", None)
            if not name:
                raise UserError("processing_class: required with a model object that names no folder")
            tokenizer = TransformerSpec(pretrained_name=name).load_tokenizer()
        tokenizer = padded(tokenizer)
        if len(tokenizer) > model.get_input_embeddings().num_embeddings:  # a pad token was added
            model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    if peft_config is not None:
        from peft import PeftModel

        if isinstance(model, PeftModel):
            raise UserError("peft_config: the model already has a peft adapter; merge it first (merge_and_unload) "
                            "or pass the model without peft_config")
        model = apply_peft(model, peft_config, "peft_config")
    return model, tokenizer


def model_spec(name: str, kwargs: dict[str, Any], config: OnPolicyConfig, key: str = "model"):
    """(the TransformerSpec, the dtype) that load a model= name with TRL's init keywords `kwargs` (a copy, used up)
    as the [model] table loads one; `key` is the argument its errors name."""
    from training_wizard.specs.model import TransformerSpec

    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None)) or config.dtype
    fields = {key: kwargs.pop(key) for key in _SPEC_KEYS if key in kwargs}
    fields.setdefault("trust_remote_code", getattr(config, "trust_remote_code", False))
    kwargs.pop("device_map", None)  # accelerate places the model
    spec = TransformerSpec(pretrained_name=name, from_pretrained_kwargs=kwargs, **fields)
    spec._key = key
    return spec, checkpoint_dtype(spec) if str(dtype) == "auto" else str(dtype).removeprefix("torch.")


def load_teacher(teacher: Any, config: OnPolicyConfig, tokenizer: Any) -> torch.nn.Module:
    """TRL's teacher_model= (a model object, or a folder / cached Hub id loaded with args.teacher_model_init_kwargs
    and args.teacher_model_revision, with the student's tokenizer); None: args.teacher_model_name_or_path."""
    init_kwargs = getattr(config, "teacher_model_init_kwargs", None)
    teacher = teacher if teacher is not None else getattr(config, "teacher_model_name_or_path", None)
    if teacher is None:
        raise UserError("teacher_model: required (a model object, a folder or a cached Hub id; or "
                        "args.teacher_model_name_or_path)")
    if isinstance(teacher, torch.nn.Module):
        if init_kwargs is not None:
            raise UserError("args.teacher_model_init_kwargs: given, but teacher_model is already a model object")
        return teacher
    if not isinstance(teacher, (str, PathLike)):
        raise UserError(f"teacher_model: expected a model folder, a cached Hub id or a transformers model, got "
                        f"{type(teacher).__name__}")
    kwargs = dict(init_kwargs or {})
    if getattr(config, "teacher_model_revision", None) is not None:
        kwargs.setdefault("revision", config.teacher_model_revision)
    spec, dtype = model_spec(str(teacher), kwargs, config, key="teacher_model")
    return spec.load_causal_lm(dtype, tokenizer)


@contextlib.contextmanager
def model_argument_errors():
    """Errors of loading the model= argument name that argument, where the [model] table's loader names its key
    (model.pretrained_name) for a recipe."""
    try:
        yield
    except UserError as exc:
        raise UserError(re.sub(r"^model\.(pretrained_name|tokenizer_name):", "model:", str(exc))) from None


def padded(tokenizer: Any) -> Any:
    """A given tokenizer: without a pad token it pads with EOS, as TRL's trainers set it."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def checkpoint_dtype(spec) -> str:
    """dtype "auto": the dtype the checkpoint's config.json records (float32 when it records none)."""
    config = json.loads((Path(spec.resolved_path()) / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def reward_spec(reward_funcs: Any, processing_classes: Any, config: OnPolicyConfig):
    """One RewardObjectsSpec of TRL's reward_funcs (functions, reward model names, reward model objects), weighted
    by args.reward_weights, the reward models read with their reward_processing_classes."""
    from training_wizard.specs.reward_model_function import ModelRewardFunction, model_reward_function
    from training_wizard.specs.reward_functions import RewardObjectsSpec

    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise UserError("reward_funcs: empty; give at least one reward function or reward model")
    tokenizers = processing_classes if isinstance(processing_classes, (list, tuple)) else [processing_classes] * (
        len(funcs) if processing_classes is None else 1)
    if len(tokenizers) != len(funcs):
        raise UserError(f"reward_processing_classes: {len(tokenizers)} given for {len(funcs)} reward_funcs "
                        "(one per reward function, None for a function)")
    kwargs = model_init_kwargs(config)
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    dtype = None if dtype in (None, "auto") else str(dtype).removeprefix("torch.")
    trust = bool(kwargs.get("trust_remote_code", getattr(config, "trust_remote_code", False)))
    functions = [model_reward_function(fn, tokenizer, dtype, trust) if isinstance(fn, str) or is_model(fn) else fn
                 for fn, tokenizer in zip(funcs, tokenizers)]
    for function in functions:  # TRL renders conversations for reward models with the same template variables
        if isinstance(function, ModelRewardFunction):
            bind_chat_template_kwargs(function.spec.load()[1], config.chat_template_kwargs)
    weights = getattr(config, "reward_weights", None)
    try:
        return RewardObjectsSpec(reward_funcs=functions, reward_weights=weights)
    except ValidationError as exc:  # its validators name reward_funcs[i] or reward_weights (which args holds)
        message = describe_error(error_key(exc.errors()[0])[1])
        if message.startswith("reward_weights"):
            raise UserError(f"args.{message}") from None
        raise UserError(message if message.startswith("reward_funcs") else f"reward_funcs: {message}") from None


def is_model(value: Any) -> bool:
    return isinstance(value, torch.nn.Module)
