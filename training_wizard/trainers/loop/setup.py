"""Set-up of every model a run uses, before the first iteration: the trained models (the policy, plus PPO's value
model) with their optimizer and schedule, the reference, and the reward.

Kept apart from the loop (trainers/loop/on_policy.py) because it runs once and its decisions are about wiring, not about the
algorithm: which reference (a frozen copy, or the LoRA policy with its adapter disabled), dropout off everywhere
(the N+ implementation details: logprobs must not change between passes), activation checkpointing, one AdamW
over every trained model, and accelerate/DeepSpeed/FSDP preparation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from accelerate import Accelerator

from training_wizard.errors import UserError
from training_wizard.rollout.packing import unpackable_reason
from training_wizard.rollout.backends import DecodeLoopBackend, GenerationBackend
from training_wizard.sharding import (
    DeepSpeedStepGuard, check_supported, engine_kind, is_partitioned, prepare_frozen, wait_for_each_zero3_gather,
)
from training_wizard.specs.reward import CallableRewardSpec, RewardSpec
from training_wizard.trainers.config.on_policy import OnPolicyConfig
from training_wizard.trainers.config.run import RunConfig


@dataclass
class PreparedModels:
    """trained: the prepared trained models by checkpoint folder name ("model" is the policy); update_forward: the
    modules the update's forward passes call (compiled with `torch_compile`, sharing the parameters); ref_policy:
    None when the reference is the LoRA policy with its adapter disabled (`uses_adapter_as_reference`);
    deepspeed_guard: set under DeepSpeed, whose engine steps inside the backward (sharding.py).

    shared_prompt_passes: whether the k samples of a prompt share one pass over it in the rollout's logprob passes
    (rollout/scoring.py); not under DeepSpeed or FSDP, where every forward pass is a collective that must run
    alike on every process, and the number of passes would depend on each process's data. update_shares_prompts:
    the same for the update's forward, which also keeps the per-row pass under torch_compile (it traces that one).
    rollout_head_logprobs and update_head_logprobs: whether those passes take logprobs from the final hidden states
    with the output layer applied a chunk at a time (`scoring.response_token_logprobs`), under the same
    conditions: a sharded output layer holds its weight only inside the model's forward. With `padding_free` no
    pass shares prompts (rollout/packing.py)."""

    trained: dict[str, torch.nn.Module]
    update_forward: dict[str, torch.nn.Module]
    optimizer: torch.optim.Optimizer
    lr_scheduler: object
    ref_policy: torch.nn.Module | None
    reward: torch.nn.Module | RewardSpec
    uses_adapter_as_reference: bool
    deepspeed_guard: DeepSpeedStepGuard | None
    shared_prompt_passes: bool
    update_shares_prompts: bool
    rollout_head_logprobs: bool
    update_head_logprobs: bool


def prepare_models(
    accelerator: Accelerator,
    config: OnPolicyConfig,
    num_iterations: int,
    trained: dict[str, torch.nn.Module],
    ref_policy: torch.nn.Module | None,
    reward: torch.nn.Module | RewardSpec,
) -> PreparedModels:
    """`trained` holds the unprepared policy under "model" and any model trained beside it with the same optimizer.
    They are prepared together, so one accumulation context and one gradient clip cover all of them."""
    policy = trained["model"]
    for model in (*trained.values(), ref_policy, reward if isinstance(reward, torch.nn.Module) else None):
        if model is not None:
            disable_dropout(model)
    if not config.uses_reference:  # GRPO with beta = 0: no reference model, no reference pass
        ref_policy = None
    uses_adapter_as_reference = config.uses_reference and ref_policy is None and hasattr(policy, "disable_adapter")
    if config.uses_reference and ref_policy is None and not uses_adapter_as_reference:
        if is_partitioned(policy):
            raise UserError("ref_policy: under DeepSpeed ZeRO-3 the policy's weights are partitioned and cannot "
                            "be copied; pass ref_policy (the same model loaded a second time)")
        ref_policy = copy.deepcopy(policy)  # a frozen copy of the starting policy is the reference
    check_supported(accelerator, trained)
    check_engine_options(accelerator, config)
    if config.padding_free:
        check_packable(accelerator, config, [*trained.values(), ref_policy, reward])
    if config.gradient_checkpointing:
        for model in trained.values():
            enable_activation_checkpointing(model)
            if hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
    params = [p for model in trained.values() for p in model.parameters() if p.requires_grad]
    if not any(p.requires_grad for p in policy.parameters()):
        raise UserError("model: the policy has no trainable parameters")
    optimizer, scheduler = build_optimizer(params, config, num_iterations)
    configure_deepspeed(accelerator, config)
    *prepared_models, optimizer = accelerator.prepare(*trained.values(), optimizer)
    prepared = dict(zip(trained, prepared_models))
    # Generation and the no-grad passes stay eager (a decode step's shapes change every token).
    update_forward = {name: torch.compile(model, dynamic=True) if config.torch_compile else model
                      for name, model in prepared.items()}
    guard = DeepSpeedStepGuard(prepared["model"]) if engine_kind(accelerator) == "deepspeed" else None
    return PreparedModels(
        trained=prepared,
        update_forward=update_forward,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        ref_policy=prepare_frozen(accelerator, ref_policy) if ref_policy is not None else None,
        reward=prepare_frozen(accelerator, reward) if isinstance(reward, torch.nn.Module) else reward,
        uses_adapter_as_reference=uses_adapter_as_reference,
        deepspeed_guard=guard,
        shared_prompt_passes=not (engine_kind(accelerator) or config.padding_free),
        update_shares_prompts=not (engine_kind(accelerator) or config.torch_compile or config.padding_free),
        rollout_head_logprobs=not engine_kind(accelerator),
        update_head_logprobs=not (engine_kind(accelerator) or config.torch_compile),
    )


def check_engine_options(accelerator: Accelerator, config: OnPolicyConfig) -> None:
    """The options tested with one process and plain data parallel only, refused under DeepSpeed and FSDP."""
    if config.torch_compile and engine_kind(accelerator):
        raise UserError(f"torch_compile: not supported under {accelerator.distributed_type.name} here; "
                        "set torch_compile = false (it is tested with one process and plain data parallel)")
    if config.max_tokens_per_micro_batch is not None and engine_kind(accelerator):
        raise UserError(f"training.max_tokens_per_micro_batch: not supported under "
                        f"{accelerator.distributed_type.name} (its engine counts micro-batches itself, and a sharded "
                        "model needs the same forward passes on every process); unset it, or train with plain data "
                        "parallel")


def check_packable(accelerator: Accelerator, config: OnPolicyConfig, models: list) -> None:
    """`padding_free` only where every model a packed pass runs keeps packed rows apart, with one line naming the
    key otherwise. Not under DeepSpeed or FSDP, nor with torch_compile: untested there."""
    if engine_kind(accelerator) or config.torch_compile:
        where = accelerator.distributed_type.name if engine_kind(accelerator) else "torch_compile"
        raise UserError(f"training.padding_free: not supported with {where}; set padding_free = false")
    for model in models:
        reason = unpackable_reason(model) if isinstance(model, torch.nn.Module) else None
        if reason is not None:
            raise UserError(f"training.padding_free: {reason}; set padding_free = false")


def resolve_logprobs_from_sampling(config: OnPolicyConfig, accelerator: Accelerator, policy: torch.nn.Module) -> bool:
    """Whether the rollout takes the policy's old logprobs from the sampling pass (`logprobs_from_sampling`).

    True and False are the user's choice. "auto" turns it on only where the sampling pass and a training-style
    forward pass are the same computation up to float32 rounding: every policy weight in float32, no mixed
    precision autocast, and our decode loop (rollout/generation.py) on one process or plain data parallel.
    Anything that makes the sampler's logits differ from the training pass turns it off: bf16/fp16 weights or
    autocast (the mismatch the RLOO blog post and the N+ implementation details describe), and DeepSpeed or FSDP,
    whose decode runs a sharded forward step by step, so that the process count moves the sampled logprobs'
    rounding more than the recompute's (FSDP2, two processes against one: final weights 1.8e-5 apart with them,
    4.4e-6 with the recompute). vLLM (`use_vllm`) samples with kernels of its own: off; its logprobs are the
    sampling logprobs of the importance-sampling correction. Sampling filters (top_k, top_p, min_p,
    repetition_penalty) make the sampling distribution another one than the policy's: off.
    """
    choice = config.logprobs_from_sampling
    if choice != "auto":
        return bool(choice)
    all_float32 = all(p.dtype == torch.float32 for p in policy.parameters())
    no_autocast = accelerator.mixed_precision == "no"
    unfiltered = not config.sampling_filters().active
    return all_float32 and no_autocast and unfiltered and not engine_kind(accelerator) and not config.use_vllm


def build_optimizer(params: list[torch.nn.Parameter], config: RunConfig, num_iterations: int):
    """(AdamW over `params`, its learning-rate schedule over `num_iterations` scheduler steps): the optimizer of
    every trainer, on-policy and supervised."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(
        params,
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        weight_decay=config.weight_decay,
    )
    warmup = config.warmup_steps or int(config.warmup_ratio * num_iterations)
    return optimizer, get_scheduler(config.lr_scheduler_type, optimizer, warmup, num_iterations)


def configure_deepspeed(accelerator: Accelerator, config: RunConfig) -> None:
    """DeepSpeed needs its micro-batch size up front (there is no dataloader for accelerate to read it from)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds_config = plugin.deepspeed_config
    ds_config["train_micro_batch_size_per_gpu"] = config.per_device_train_batch_size
    ds_config["gradient_accumulation_steps"] = config.gradient_accumulation_steps
    if config.max_grad_norm is not None:
        ds_config["gradient_clipping"] = config.max_grad_norm
    wait_for_each_zero3_gather(accelerator)  # a model loaded before the Accelerator is partitioned by prepare


def as_reward(reward_model) -> torch.nn.Module | RewardSpec:
    """A reward model or spec as given; a plain callable becomes a `CallableRewardSpec`."""
    if isinstance(reward_model, (torch.nn.Module, RewardSpec)):
        return reward_model
    if not callable(reward_model):
        raise UserError("reward_model: expected a model, a RewardSpec or a callable")
    return CallableRewardSpec(fn=reward_model)


# Dropout rates models keep as plain floats: Llama-family attention copies `config.attention_dropout` onto each
# attention module when the model is built, so changing the config afterwards would leave it on.
_DROPOUT_RATE_ATTRIBUTES = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop",
                            "attn_pdrop", "dropout_rate", "attention_probs_dropout_prob", "hidden_dropout_prob")


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off in policy, reference and reward model: logprobs must not change between passes (N+ details)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in _DROPOUT_RATE_ATTRIBUTES:
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    for name in _DROPOUT_RATE_ATTRIBUTES:
        if config is not None and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in the backward pass (non-reentrant). transformers 5 renamed the method
    (`activation_checkpointing_enable`) and warns on the old name; a peft model forwards either to its base."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)



def generation_backend(accelerator: Accelerator, config: OnPolicyConfig, policy: torch.nn.Module,
                       max_prompt_length: int, collectives) -> GenerationBackend:
    """The one choice of what samples completions (rollout/backends.py): the built-in decode loop, or vLLM
    colocated in this process or as a server. `policy` is the unwrapped policy; `max_prompt_length` the longest
    prompt the run will sample from. Under FSDP2 every push gathers the weights one tensor at a time
    (`Collectives.whole_state`)."""
    if not config.use_vllm:
        return DecodeLoopBackend(config.local_rollout_forward_batch_size, fold_lora=config.fold_lora_for_sampling)
    check_generation_can_start(accelerator, config)
    from training_wizard.rollout.vllm import VLLMColocateBackend, VLLMServerBackend

    options = vllm_sampling_options(config)
    if config.vllm_mode == "server":
        url = vllm_server_url(config)
        return VLLMServerBackend(policy, base_url=url, timeout=config.vllm_server_timeout,
                                 push=accelerator.is_main_process, barrier=collectives.barrier,
                                 sampling_options=options, whole=collectives.whole_state)
    return VLLMColocateBackend(
        policy, max_model_len=config.vllm_max_model_length or max_prompt_length + config.response_length,
        seed=config.seed, gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        tensor_parallel_size=config.vllm_tensor_parallel_size, sleep_mode=config.vllm_enable_sleep_mode,
        world_size=accelerator.num_processes, sampling_options=options, whole=collectives.whole_state,
        lora_push=config.vllm_lora_push,
    )


def check_generation_can_start(accelerator: Accelerator, config: OnPolicyConfig) -> None:
    """What the generation backend needs before it starts, checked the same way by a run and by `--dry-run`
    (recipes/on_policy.py): vLLM installed for a colocated engine, a launch it can run under, a server URL."""
    if not config.use_vllm:
        return
    kind = engine_kind(accelerator)
    if kind == "deepspeed":
        # Tried: ZeRO-3 with colocated engines on two CPU processes gave non-finite policy or reference logprobs at
        # the first iteration in three of five runs (gathered for the rollout or one parameter at a time).
        raise UserError("training.use_vllm: not supported under DeepSpeed here; use FSDP2 (fsdp_version = 2), plain "
                        "data parallel, or use_vllm = false")
    if kind == "fsdp" and not accelerator.is_fsdp2:
        raise UserError("training.use_vllm: not supported under FSDP1 (its flat parameters have no per-parameter "
                        "gather); use fsdp_version = 2, plain data parallel, or use_vllm = false")
    if config.vllm_mode == "server":
        vllm_server_url(config)
    else:
        from training_wizard.rollout.vllm import check_vllm_installed

        check_vllm_installed()


def vllm_server_url(config: OnPolicyConfig) -> str:
    url = config.vllm_server_base_url or f"http://{config.vllm_server_host}:{config.vllm_server_port}"
    if not url.startswith(("http://", "https://")):
        raise UserError(f"training.vllm_server_base_url: expected an http:// or https:// URL, got {url!r}")
    return url


# Sampling options a config may carry beside temperature, with the value that leaves sampling unchanged.
_NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}


def vllm_sampling_options(config: OnPolicyConfig) -> dict:
    """The config's truncation and penalty options under vLLM's names, those that change sampling only."""
    options = {}
    for name, neutral in _NEUTRAL_SAMPLING.items():
        value = getattr(config, name, neutral)
        if value != neutral and value is not None:
            options[name] = value
    return options
