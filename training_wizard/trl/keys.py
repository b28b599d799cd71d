"""TRL 1.x config keys on the on-policy configs: each field of TRL 1.16's GRPOConfig and RLOOConfig, the inherited
transformers.TrainingArguments ones included, is accepted with TRL's meaning or refused with one line that names
it and says what to use instead. None is silently dropped.

`TRL_KEYS` is the one table (docs/trl_options.md is its prose; tests/fixtures/trl_1_16_config_fields.json the list
it must cover); the public configs (trl/configs.py) mix `TRLKeys` into the native ones. A key the config has as a
field or alias passes to it, after `Rule.translate` where TRL's values differ in form (report_to = "none",
max_steps = -1, ...). A key the config does not have is translated into ours
(save_strategy = "no" -> save_steps = None), accepted when its value is what we always do (disable_dropout = true,
hub_strategy = "end"), or refused. What TRL's scripts read off the config after building it (trust_remote_code,
eval_strategy, resume_from_checkpoint) are read-only properties of `TRLKeys` giving TRL's value for what a run does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import Field, field_serializer, model_validator

from training_wizard.spec import KeyValueError, shown
from training_wizard.trainers.config.run import RunConfig


class TRLKeyError(KeyValueError):
    """A TRL key refused in one line (its key and detail: spec.KeyValueError)."""


def is_off(value: Any) -> bool:
    """Whether a value leaves a feature off (unset, false, 0, "no", "none", empty): a TRL key we have no
    counterpart for is accepted with such a value, since it asks for nothing, and refused with any other."""
    if value is None or isinstance(value, bool):
        return value is not True
    if isinstance(value, (int, float, str)):
        return value in (0, "", "no", "none")
    return value in ([], {})


@dataclass(frozen=True)
class Rule:
    """What one TRL key becomes. kind: "ours" (a field or alias of ours), "top" (a top-level key of the recipe),
    "translated" (read into our keys by `translate`), "unsupported" (accepted only with a value that leaves it
    off) or "refused" (never accepted). `note` is the reason and what to use instead."""

    kind: str
    note: str = ""
    translate: Callable[[str, Any], dict[str, Any]] | None = None

    def apply(self, key: str, value: Any) -> dict[str, Any]:
        """Our keys for `key = value` (empty: nothing to set), or a TRLKeyError."""
        if self.translate is not None:
            return self.translate(key, value)
        if self.kind == "unsupported" and is_off(value):
            return {}
        if self.kind in ("ours", "top"):
            return {key: value}
        if self.kind == "unsupported":
            raise TRLKeyError(key, f"{shown(value)} is not supported: {self.note}; remove it")
        raise TRLKeyError(key, self.note)


def ours(note: str = "", translate=None) -> Rule:
    return Rule("ours", note, translate)


def unsupported(note: str) -> Rule:
    return Rule("unsupported", note)


def refused(note: str) -> Rule:
    """Refused whatever the value: `note` is the whole line after the key."""
    return Rule("refused", note)


def only(accepted: tuple, note: str, target: str | None = None) -> Rule:
    """Accepted when the value is one of `accepted` (what we always do, or `target`'s value), refused otherwise."""

    def translate(key: str, value: Any) -> dict[str, Any]:
        if any(type(value) is type(a) and value == a for a in accepted):  # strict: 1 is not True
            return {target: value} if target else {}
        choices = " or ".join(shown(a) for a in accepted)
        raise TRLKeyError(key, f"{shown(value)} is not supported (only {choices}): {note}")

    return Rule("translated", note, translate)


def _strategy(steps_key: str | None, allowed: tuple[str, ...]):
    """TRL's *_strategy: "steps" keeps *_steps, "no" clears it (where allowed); anything else is refused."""

    def translate(key: str, value: Any) -> dict[str, Any]:
        if value == "steps" and "steps" in allowed:
            return {}
        if value == "no" and "no" in allowed:
            return {steps_key: None}
        raise TRLKeyError(key, f"{shown(value)} is not supported: use {' or '.join(shown(a) for a in allowed)} with "
                          f"{steps_key or 'logging_steps'} (counted in iterations)")

    return translate


def _report_to(key: str, value: Any) -> dict[str, Any]:
    """TRL takes a name, a list, "none" or "all"; ours is the list of extra trackers."""
    if value in (None, "none", ["none"]):
        return {key: []}
    if value == "all" or value == ["all"]:
        raise TRLKeyError(key, '"all" is not supported: name the trackers, e.g. ["tensorboard", "wandb", "trackio"]')
    return {key: [value] if isinstance(value, str) else value}


def _max_steps(key: str, value: Any) -> dict[str, Any]:
    return {key: None if value == -1 else value}  # TRL's -1: not set, the epochs decide


def _max_grad_norm(key: str, value: Any) -> dict[str, Any]:
    return {key: None if value == 0 else value}  # transformers: 0 turns clipping off


def _warmup_steps(key: str, value: Any) -> dict[str, Any]:
    """transformers 5: a float in (0, 1) is a share of the training steps, which is our warmup_ratio."""
    if isinstance(value, float) and 0.0 < value < 1.0:
        return {"warmup_ratio": value}
    return {key: value}


def _log_completions(key: str, value: Any) -> dict[str, Any]:
    """false: no sample tables (num_sample_generations = 0); true: tables on, num_sample_generations times a run."""
    if value is False:
        return {"num_sample_generations": 0}
    if value is True:
        return {}
    raise TRLKeyError(key, f"expected true or false, got {shown(value)}")


def _unset_is_ours(key: str, value: Any) -> dict[str, Any]:
    return {} if value is None else {key: value}  # TRL's None: its default, which ours stands for


def _renamed(target: str):
    def translate(key: str, value: Any) -> dict[str, Any]:
        return {} if value is None else {target: value}

    return translate


LAUNCHER = "set it in accelerate's launch config (accelerate launch --config_file ...), which every recipe runs under"
NO_DATALOADER = "no DataLoader here: rows come from one seeded permutation per epoch shared by every process"

TRAINING_ARGUMENTS: dict[str, Rule] = {
    "output_dir": Rule("top", "set output_dir at the top level of the recipe", _unset_is_ours),
    "seed": Rule("top", "set seed at the top level of the recipe"),
    "resume_from_checkpoint": refused("a top-level key of the recipe (\"latest\" or a folder), not one of [training]; "
                                      "from Python, trainer.train(resume_from_checkpoint=...)"),
    "per_device_train_batch_size": ours(), "gradient_accumulation_steps": ours(), "num_train_epochs": ours(),
    "max_steps": ours(translate=_max_steps), "learning_rate": ours(), "lr_scheduler_type": ours(),
    "warmup_steps": ours(translate=_warmup_steps), "weight_decay": ours(), "adam_beta1": ours(),
    "adam_beta2": ours(), "adam_epsilon": ours(), "max_grad_norm": ours(translate=_max_grad_norm),
    "gradient_checkpointing": ours(), "logging_steps": ours(), "eval_steps": ours(), "save_steps": ours(),
    "save_total_limit": ours(), "report_to": ours(translate=_report_to), "run_name": ours(), "project": ours(),
    "torch_compile": ours(),
    "activation_checkpointing": Rule("translated", "transformers 5's name of gradient_checkpointing",
                                     _renamed("gradient_checkpointing")),
    "save_strategy": Rule("translated", "", _strategy("save_steps", ("steps", "no"))),
    "eval_strategy": Rule("translated", "", _strategy("eval_steps", ("steps", "no"))),
    "logging_strategy": Rule("translated", "", _strategy(None, ("steps",))),
    # TRL's bf16 = None means "on where supported"; unset, ours (off: float32) stands
    "bf16": ours(translate=_unset_is_ours), "fp16": ours(), "use_cpu": ours(),
    "optim": only(("adamw_torch", "adamw_torch_fused"), "the optimizer is torch's AdamW (adam_beta1, adam_beta2, "
                  "adam_epsilon, weight_decay)"),
    "remove_unused_columns": only((False,), "every dataset column travels to the reward"),
    "train_sampling_strategy": only(("random",), "rows are drawn in a seeded random order"),
    "skip_memory_metrics": only((True,), "no memory-profiler metrics are logged"),
    "log_on_each_node": only((True,), "only the main process logs here; set nothing"),
    "ignore_data_skip": only((False,), "a resumed run continues the data order exactly where it stopped"),
    "local_rank": only((-1,), "the launcher sets the process's rank (accelerate launch)"),
    "ddp_timeout": only((1800,), LAUNCHER),
    "dataloader_pin_memory": only((True,), NO_DATALOADER),
    "dataloader_in_order": only((True,), NO_DATALOADER),
    "logging_nan_inf_filter": only((True,), "a non-finite loss stops the run, or skips the step with "
                                   "skip_nonfinite_batches = true"),
    "eval_do_concat_batches": unsupported("evaluation's metrics are means over the eval prompts (eval/*)"),
    "per_device_eval_batch_size": unsupported("evaluation samples in chunks of local_rollout_forward_batch_size"),
    "log_level": unsupported("training-wizard prints its own lines; library logging is kept quiet"),
    "log_level_replica": unsupported("only the main process prints"),
    "length_column_name": only(("length",), "no length-grouped sampling (train_sampling_strategy)"),
    "hub_strategy": only(("every_save", "end"), "push_to_hub uploads the final model once, at the end of the run"),
    "save_only_model": unsupported("checkpoints keep the optimizer and random state so a run resumes exactly"),
    "push_to_hub": ours(), "hub_model_id": ours(),
    "hub_token": unsupported("push_to_hub reads the token of HF_TOKEN or `hf auth login`"),
    "hub_private_repo": unsupported("push_to_hub creates a missing repository with the Hub's default visibility; "
                                    "create a private one first (hf repo create --private)"),
    "hub_always_push": unsupported("push_to_hub uploads once, at the end of the run"),
    "hub_revision": unsupported("push_to_hub uploads to the repository's main branch"),
    "lr_scheduler_kwargs": unsupported("linear, cosine, constant and constant_with_warmup take no extra arguments here"),
    "optim_args": unsupported("the optimizer is torch's AdamW with adam_beta1, adam_beta2, adam_epsilon"),
    "optim_target_modules": unsupported("the optimizer is AdamW on every trainable parameter"),
    "average_tokens_across_devices": unsupported("loss_type decides how the loss averages tokens (dapo: over the "
                                                 "whole optimizer step on every process; docs/algorithms.md)"),
    "label_smoothing_factor": unsupported("no label smoothing in an RL loss"),
    "bf16_full_eval": unsupported("evaluation runs in the training dtype"),
    "fp16_full_eval": unsupported("evaluation runs in the training dtype"),
    "tf32": unsupported("TF32 matmuls follow torch's setting (torch.backends.cuda.matmul.allow_tf32)"),
    "activation_checkpointing_kwargs": unsupported("checkpointing is non-reentrant and covers every layer"),
    "gradient_checkpointing_kwargs": unsupported("checkpointing is non-reentrant and covers every layer"),
    "torch_compile_backend": unsupported("torch_compile uses the inductor backend"),
    "torch_compile_mode": unsupported("torch_compile uses the default mode, dynamic shapes"),
    "use_liger_kernel": unsupported("no Liger kernels"), "liger_kernel_config": unsupported("no Liger kernels"),
    "use_cache": unsupported("the decode loop keeps its own key/value cache; training passes use none"),
    "neftune_noise_alpha": unsupported("no NEFTune noise"),
    "torch_empty_cache_steps": unsupported("the CUDA cache is not emptied on a schedule"),
    "auto_find_batch_size": unsupported("set per_device_train_batch_size (docs/performance.md)"),
    "logging_first_step": unsupported("the first logged iteration is iteration logging_steps; set logging_steps = 1"),
    "include_num_input_tokens_seen": unsupported("tokens_per_s is logged instead"),
    "disable_tqdm": unsupported("progress is printed by training-wizard's own line"),
    "trackio_space_id": ours(),
    "trackio_bucket_id": unsupported("trackio logs locally (report_to = [\"trackio\"])"),
    "trackio_static_space_id": unsupported("trackio logs locally (report_to = [\"trackio\"])"),
    "eval_delay": unsupported("evaluation runs every eval_steps iterations from the first"),
    "prediction_loss_only": unsupported("evaluation logs sampled rewards (eval/*), not a loss"),
    "eval_on_start": unsupported("evaluation runs every eval_steps iterations and at the end"),
    # in two pieces: tests/unit/test_architecture.py looks for collective calls by name, and this is only a key
    "eval_use_gather" "_object": unsupported("evaluation gathers its rewards itself"),
    "eval_accumulation_steps": unsupported("evaluation keeps no predictions to move to the CPU"),
    "include_for_metrics": unsupported("no compute_metrics: evaluation's metrics are built in (eval/*)"),
    "batch_eval_metrics": unsupported("no compute_metrics: evaluation's metrics are built in (eval/*)"),
    "save_on_each_node": unsupported("the main process writes every checkpoint"),
    "enable_jit_checkpoint": unsupported("a stop signal already commits a checkpoint before the process exits"),
    "load_best_model_at_end": unsupported("no best-model selection: model/ is the last iteration's weights"),
    "metric_for_best_model": unsupported("no best-model selection: model/ is the last iteration's weights"),
    "greater_is_better": unsupported("no best-model selection: model/ is the last iteration's weights"),
    "restore_callback_states_from_checkpoint": unsupported("no callbacks: a checkpoint restores the whole loop state"),
    "full_determinism": unsupported("a run is reproducible for a seed; deterministic kernels are torch's setting "
                                    "(torch.use_deterministic_algorithms)"),
    "data_seed": unsupported("the data order follows seed"),
    "label_names": unsupported("no labels: rewards score the completions"),
    "do_train": unsupported("a recipe always trains"),
    "do_eval": unsupported("evaluation runs when there is an eval_dataset and eval_steps is set"),
    "do_predict": unsupported("no prediction stage; training-wizard eval compares models"),
    "debug": unsupported("no debug modes; guards stop a run on non-finite values"),
    "accelerator_config": unsupported(LAUNCHER), "parallelism_config": unsupported(LAUNCHER),
    "fsdp": unsupported(LAUNCHER + " with FSDP"), "fsdp_config": unsupported(LAUNCHER + " with FSDP"),
    "deepspeed": unsupported(LAUNCHER + " with DeepSpeed"),
    "ddp_find_unused_parameters": unsupported(LAUNCHER), "ddp_bucket_cap_mb": unsupported(LAUNCHER),
    "ddp_broadcast_buffers": unsupported(LAUNCHER), "ddp_static_graph": unsupported(LAUNCHER),
    "ddp_backend": unsupported(LAUNCHER),
    "dataloader_drop_last": unsupported(NO_DATALOADER), "dataloader_num_workers": unsupported(NO_DATALOADER),
    "dataloader_persistent_workers": unsupported(NO_DATALOADER),
    "dataloader_prefetch_factor": unsupported(NO_DATALOADER),
    "dataloader_multiprocessing_context": unsupported(NO_DATALOADER),
}

NO_HUB = "nothing is pushed to the Hub"
NO_SAPO_VESPO = "not supported: loss_type has no sapo or vespo loss here; remove it"
NO_ENTROPY_BONUS = "no entropy bonus here (entropy is logged)"
NO_REFERENCE_SYNC = "not supported: the reference stays the starting policy (no sync_ref_model); remove it"

TRL_OPTIONS: dict[str, Rule] = {
    **{key: ours() for key in (
        "num_generations", "max_completion_length", "ds3_gather_for_generation", "generation_batch_size",
        "steps_per_generation", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "use_vllm",
        "vllm_mode", "vllm_enable_sleep_mode", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
        "vllm_server_timeout", "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
        "beta", "num_iterations", "epsilon", "delta", "epsilon_high", "importance_sampling_level", "scale_rewards",
        "loss_type", "mask_truncated_completions", "top_entropy_quantile", "max_tool_calling_iterations",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "normalize_advantages")},
    # TRL's deprecated name is None unless set, leaving clip_max (3.0) in force; None must not clear our bound
    "vllm_importance_sampling_cap": ours(translate=_unset_is_ours),
    # TRL's None clips nothing; so does our default (10 acts only on standardised scores, with normalize_reward)
    "reward_clip_range": ours(translate=_unset_is_ours),
    "model_init_kwargs": ours(), "reward_weights": ours(),
    "trust_remote_code": unsupported("set [model] trust_remote_code = true"),
    "disable_dropout": only((True,), "dropout is always disabled in policy, reference and reward model"),
    "shuffle_dataset": only((True,), "prompts are always shuffled (one seeded permutation per epoch)"),
    "pad_to_multiple_of": only((None, "auto"), "batches are cut to their content; no Neuron support"),
    "vllm_model_impl": only(("vllm",), "the engine uses vLLM's own model implementation"),
    "multi_objective_aggregation": only(("sum_then_normalize",), "the reward's weighted total is normalised per "
                                        "group"),
    "use_bias_correction_kl": only((False,), "the KL term is not multiplied by the importance ratio here; set it "
                                   "to false"),
    "log_multimodal": only((False,), "text only: there are no images to log; set it to false"),
    "num_completions_to_print": ours(),
    "log_completions": Rule("translated", "", _log_completions),
    "log_unique_prompts": unsupported("the sample table shows every completion of its batch"),
    "router_aux_loss_coef": unsupported("no mixture-of-experts load-balancing loss is added"),
    "cast_lm_head_to_fp32": unsupported("logits are cast to float32 before every log-softmax; the output layer "
                                        "runs in the model's dtype"),
    "num_generations_eval": unsupported("evaluation samples one completion per prompt"),
    "generation_kwargs": unsupported("temperature, top_p, top_k, min_p and repetition_penalty are the sampler's "
                                     "options"),
    "chat_template_kwargs": ours(),
    "cache_implementation": unsupported("the decode loop manages its own key/value cache"),
    "vllm_structured_outputs_regex": unsupported("no constrained decoding"),
    "vllm_group_port": refused("not supported: training-wizard vllm-serve receives weights over HTTP, not a NCCL "
                               "group; remove it"),
    "sapo_temperature_neg": refused(NO_SAPO_VESPO), "sapo_temperature_pos": refused(NO_SAPO_VESPO),
    "vespo_k_pos": refused(NO_SAPO_VESPO), "vespo_lambda_pos": refused(NO_SAPO_VESPO),
    "vespo_k_neg": refused(NO_SAPO_VESPO), "vespo_lambda_neg": refused(NO_SAPO_VESPO),
    "sync_ref_model": unsupported("the reference stays the starting policy"),
    "ref_model_mixup_alpha": refused(NO_REFERENCE_SYNC), "ref_model_sync_steps": refused(NO_REFERENCE_SYNC),
    "entropy_coef": unsupported(NO_ENTROPY_BONUS), "use_adaptive_entropy": unsupported(NO_ENTROPY_BONUS),
    **{key: refused(f"not supported: {NO_ENTROPY_BONUS}; remove it")
       for key in ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target")},
    "off_policy_mask_threshold": unsupported("no off-policy sequence masking"),
    "log_completions_hub_repo": unsupported(NO_HUB),
    "use_transformers_continuous_batching": unsupported("the decode loop drops finished rows; vLLM batches "
                                                        "continuously (use_vllm)"),
    "transformers_continuous_batching_config": unsupported("no transformers continuous batching (use_vllm)"),
    "use_transformers_paged": unsupported("no transformers paged attention (use_vllm)"),
}

TRL_KEYS: dict[str, Rule] = {**TRAINING_ARGUMENTS, **TRL_OPTIONS}


def accepted_names(config_class) -> set[str]:
    """The input names a config takes: its fields and their aliases."""
    names = set()
    for name, field in config_class.model_fields.items():
        names.add(name)
        alias = field.validation_alias
        names.update(getattr(alias, "choices", [alias] if isinstance(alias, str) else []))
    return names


def read_trl_keys(config_class, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with TRL's keys in our terms: translated, dropped (accepted with the value we always use) or refused
    (TRLKeyError naming the first). Keys TRL does not have pass unchanged (unknown ones are refused by the spec)."""
    names = accepted_names(config_class)
    out, derived = {}, {}
    for key, value in data.items():
        rule = TRL_KEYS.get(key)
        if rule is None or (key in names and rule.translate is None):
            out[key] = value
        elif key in names or rule.kind != "ours":
            derived.update({k: (key, v) for k, v in rule.apply(key, value).items()})
        else:
            out[key] = value  # a TRL name of another trainer's field (GRPO's delta on RLOO): the spec says unknown
    for target, (key, value) in derived.items():
        if target != key and target in data and data[target] != value:
            raise TRLKeyError(key, f"{key} = {shown(data[key])} means {target} = {shown(value)}, but {target} is "
                              f"{shown(data[target])}; set one of them")
        out[target] = value
    return out


class TRLKeys(RunConfig):
    """Mixed into a config, it reads TRL's keys through `TRL_KEYS` before validation."""

    # Read by the Python constructor when it loads the model and reward functions itself (trl/arguments.py,
    # TRL's form); a recipe refuses them (recipes/on_policy.py): its [model] and [reward] tables say the same.
    model_init_kwargs: dict[str, Any] | None = Field(
        None, description="TRL's keywords for loading the model named by the Python constructor's model= (dtype, "
        "revision, trust_remote_code, attn_implementation; the rest to from_pretrained). Python API only: a "
        "recipe uses its [model] table.")
    reward_weights: list[float] | None = Field(
        None, description="TRL's weights of the Python constructor's reward_funcs, one each (default: 1 each). "
        "Python API only: a recipe sets [reward] reward_weights.")

    # Read-only: what TRL's scripts (trl/scripts/grpo.py, rloo.py) read off the config after building it, with
    # TRL's value for what a run here does.
    @property
    def trust_remote_code(self) -> bool:
        """TRL's trust_remote_code: what model_init_kwargs says, else False (a recipe sets it in [model])."""
        return bool((self.model_init_kwargs or {}).get("trust_remote_code", False))

    @property
    def eval_strategy(self) -> str:
        """TRL's eval_strategy: "steps" when eval_steps is set (evaluation every eval_steps iterations), else "no"."""
        return "steps" if self.eval_steps is not None else "no"

    @property
    def resume_from_checkpoint(self) -> None:
        """TRL's resume_from_checkpoint, None: a run resumes through trainer.train(resume_from_checkpoint=...), or
        a recipe's top-level key."""
        return None

    @field_serializer("model_init_kwargs")
    def _dtype_names(self, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        """A torch dtype (TRL's scripts pass torch.bfloat16) is written as its name, which loading reads back."""
        if kwargs is None:
            return None
        return {key: str(value).removeprefix("torch.") if _is_dtype(value) else value for key, value in kwargs.items()}

    @model_validator(mode="before")
    @classmethod
    def _trl_keys(cls, data: Any) -> Any:
        return read_trl_keys(cls, data) if isinstance(data, dict) else data


def _is_dtype(value: Any) -> bool:
    import torch

    return isinstance(value, torch.dtype)
