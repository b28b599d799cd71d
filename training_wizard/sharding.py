"""What a run does differently when its weights are sharded (DeepSpeed ZeRO, FSDP): frozen models, the
optimizer-step guard, and the engine's own sharded checkpoint.

Plain data parallel needs none of this: every process holds every weight, so the trainer works on the unwrapped
model and a checkpoint is the main process's copy. Under sharding each process holds a part, so:
- a frozen model (the reference, a reward classifier) loaded under ZeRO-3 arrives partitioned and only runs
  through a DeepSpeed engine, whose forward gathers each layer's weights (`prepare_frozen`);
- a copy of a ZeRO-3 partitioned policy holds empty weights, so the reference must be loaded on its own
  (`needs_separate_reference`);
- DeepSpeed steps the optimizer inside `accelerator.backward`, so the non-finite guard works through DeepSpeed's
  own overflow check (`DeepSpeedStepGuard`);
- the optimizer state (and under FSDP the weights) of a checkpoint are each process's shard, written and read by
  every process through the engine (`Collectives.save_sharded_state` / `load_sharded_state`: collectives.py).
"""

from __future__ import annotations

import contextlib
import copy

import torch

from training_wizard.errors import UserError

SHARDED_STATE = "sharded"  # checkpoint sub-folder of the engine's own per-process files


def engine_kind(accelerator) -> str | None:
    """"deepspeed", "fsdp" or None (plain data parallel or one process)."""
    name = accelerator.distributed_type.name
    return {"DEEPSPEED": "deepspeed", "FSDP": "fsdp"}.get(name)


@contextlib.contextmanager
def deepspeed_lookup_skipped(accelerator):
    """Within: accelerate's model unwrapping (`accelerator.unwrap_model`, and transformers' `save_pretrained`,
    which calls it) does not import DeepSpeed.

    That unwrapping imports DeepSpeed whenever it is installed, to recognise its engine: 221 MB of resident memory
    and 4 s on a CPU machine, in every run. A run whose accelerate state is not DeepSpeed has no engine to
    recognise, so here the lookup answers "not installed"; DeepSpeed runs keep it.
    """
    if engine_kind(accelerator) == "deepspeed":
        yield
        return
    import accelerate.utils.other as unwrapping

    installed = unwrapping.is_deepspeed_available
    unwrapping.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        unwrapping.is_deepspeed_available = installed


def unwrap_model(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """`accelerator.unwrap_model(model)` without importing DeepSpeed in runs that do not use it."""
    with deepspeed_lookup_skipped(accelerator):
        return accelerator.unwrap_model(model)


def zero_stage(accelerator) -> int | None:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin.zero_stage if plugin is not None else None


def is_partitioned(model: torch.nn.Module) -> bool:
    """True for a model whose parameters ZeRO-3 partitioned when it was loaded (each holds only its shard)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def wait_for_each_zero3_gather(accelerator) -> None:
    """Under ZeRO-3 over gloo (CPU processes), DeepSpeed gathers parameters one at a time, waiting for each.

    DeepSpeed's gather of several parameters at once (`Init._allgather_params_coalesced`: `GatheredParameters`
    over the whole policy for a rollout, and the re-gather of its small "persistent" parameters after every
    optimizer step) starts one asynchronous all-gather per parameter and waits on the last one only, which orders
    them on a GPU stream. Gloo runs asynchronous collectives on a pool of threads, so the last can finish before
    an earlier one has filled its buffer (`torch.empty`): that weight is then read as whatever the memory held,
    and a rollout samples from wrong weights on that process (scripts/zero3_gloo_gather_race.py shows it with
    DeepSpeed alone; docs/distributed.md). `stage3_allgather_sequential` makes each gather blocking.

    Each parameter remembers the config it was partitioned with: a model loaded after the Accelerator is
    partitioned as it loads, from transformers' copy of the config (accelerate's `dschf`), so that copy is
    renewed too. Call before any model loads (and again before `prepare`, which partitions a model loaded
    earlier); it does nothing outside ZeRO-3 on gloo.
    """
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None or plugin.zero_stage != 3:
        return
    from training_wizard.collectives import process_group_backend

    if process_group_backend() != "gloo":
        return
    zero = plugin.deepspeed_config.setdefault("zero_optimization", {})
    if zero.get("stage3_allgather_sequential") is True:
        return
    zero["stage3_allgather_sequential"] = True
    if getattr(plugin, "dschf", None) is not None:
        plugin.set_deepspeed_weakref()


def zero3_lora_warning(accelerator, uses_lora: bool) -> str | None:
    """The line a run that trains a LoRA adapter under DeepSpeed ZeRO-3 prints at start; None for any other run.

    Two-process ZeRO-3 + LoRA runs on CPU (gloo) have ended away from the one-process run now and then, and what
    differed is not yet known (docs/distributed.md, "ZeRO-3 + LoRA"): until it is, such a run says so rather than
    leave a user to find out from a model that trained differently.
    """
    if not uses_lora or zero_stage(accelerator) != 3:
        return None
    return ("DeepSpeed ZeRO-3 with LoRA: two-process runs have been seen to differ from one-process runs now and then "
            "(cause under investigation, docs/distributed.md); for results that must not depend on the process count, "
            "train the adapter under ZeRO-2 or plain data parallel")


def needs_separate_reference(accelerator, policy: torch.nn.Module) -> bool:
    """Under ZeRO-3 a full (non-LoRA) policy cannot be copied into a reference: its parameters are partitioned
    stubs. The recipe then loads the reference from the model spec a second time (TRL does the same)."""
    return zero_stage(accelerator) == 3 and not hasattr(policy, "disable_adapter")


def prepare_frozen(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """A frozen model ready for no-grad forward passes on this process.

    ZeRO-3: a DeepSpeed inference engine over the partitioned model; FSDP2: the model fully sharded. Each
    forward pass then gathers a layer's weights at a time, so every process must run the same number of passes,
    which the collector guarantees. Anything else (data parallel, ZeRO-1/2, FSDP1): the full model on this
    process's device.
    """
    model.requires_grad_(False)
    if engine_kind(accelerator) == "fsdp" and getattr(accelerator, "is_fsdp2", False):
        return _fully_shard(model.to(accelerator.device)).eval()
    if zero_stage(accelerator) != 3:
        return model.to(accelerator.device).eval()
    import deepspeed

    plugin = accelerator.state.deepspeed_plugin
    config = copy.deepcopy(plugin.deepspeed_config)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    config["train_micro_batch_size_per_gpu"] = config.get("train_micro_batch_size_per_gpu", 1)
    if config.get("train_micro_batch_size_per_gpu") == "auto":
        config["train_micro_batch_size_per_gpu"] = 1
    config.pop("train_batch_size", None)
    config["gradient_accumulation_steps"] = 1
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()  # DeepSpeedEngine.eval returns None, unlike Module.eval
    return engine


def _fully_shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over a frozen model, one unit per decoder layer (the classes a model names as not to be split) and
    one for the rest, as accelerate's transformer-based wrap does for the trained policy: each process keeps
    1/N of the weights and gathers one layer at a time in the forward pass."""
    from torch.distributed.fsdp import fully_shard

    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module)
    fully_shard(model)
    return model


class DeepSpeedStepGuard:
    """The non-finite guard under DeepSpeed, whose engine steps inside `accelerator.backward`.

    A step cannot be undone afterwards, so the guard acts before and inside it: DeepSpeed's own gradient overflow
    check is switched on (for fp32 and bf16 it is off by default), which skips a step with a non-finite gradient
    on every process; a micro-batch whose logits or loss are non-finite on any process gets a NaN loss, so its
    gradients are non-finite too and that check skips the step. Afterwards `step_was_skipped` says what happened.
    """

    def __init__(self, engine):
        self.engine = engine
        optimizer = engine.optimizer
        if hasattr(optimizer, "check_grad_overflow"):  # ZeRO-1/2 (ZeRO-3 always checks)
            optimizer.check_grad_overflow = True

    @staticmethod
    def poison(loss: torch.Tensor) -> torch.Tensor:
        """The loss to back-propagate when the mini-batch must not be applied: NaN gradients everywhere."""
        return loss * float("nan")

    def step_was_skipped(self) -> bool:
        return bool(getattr(self.engine.optimizer, "overflow", False))


def check_supported(accelerator, trained_models: dict[str, torch.nn.Module]) -> None:
    """One trained model per engine: accelerate prepares a single model for DeepSpeed, and the FSDP checkpoint
    above covers one. PPO trains a policy and a value model, so it runs with plain data parallel for now."""
    if engine_kind(accelerator) and len(trained_models) > 1:
        raise UserError(f"accelerate config: {accelerator.distributed_type.name} trains one model per run here, and "
                        f"this trainer trains {len(trained_models)} ({', '.join(trained_models)}); use plain data "
                        "parallel (accelerate launch --multi_gpu) for PPO")
