"""Every cross-process collective of a run, in one place.

A collective is a call that every process must make, in the same order, with tensors of the same shape: if one
process skips it (an early return, an exception, a different branch), the others wait in it forever. That is why
they live here and nowhere else: each method says why every process reaches it, and the single-process shortcut
is taken in one place (`Collectives.single`), so a one-process run never touches torch.distributed.

The trainer owns one `Collectives`; the rollout collector and the checkpoint code receive it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

import torch

from training_wizard.errors import UserError

T = TypeVar("T")


class Collectives:
    """Collectives over the processes of one `accelerate.Accelerator`."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.world_size = accelerator.num_processes
        self.rank = accelerator.process_index
        self.is_main = accelerator.is_main_process
        self.device = accelerator.device

    @property
    def single(self) -> bool:
        """One process: every collective is the identity (no torch.distributed call is made)."""
        return self.world_size == 1

    # -- agreement ---------------------------------------------------------------------------------------------
    def any_true(self, *flags: bool) -> list[bool]:
        """Each flag is True on every process if it is True on any: one all-reduce for all flags.

        Every process calls it at the same safe points (stop requests, non-finite guards, end of generation), so
        all of them take the same branch afterwards: stop together, skip the same optimizer step, or decode one
        more token together.
        """
        if self.single:
            return [bool(flag) for flag in flags]
        local = torch.tensor([int(bool(flag)) for flag in flags], device=self.device)
        return [bool(v) for v in (self.accelerator.reduce(local, "sum") > 0).tolist()]

    def any_process(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any (a stop request seen by one process stops all)."""
        (anywhere,) = self.any_true(flag)
        return anywhere

    def all_true(self, flag: bool) -> bool:
        """True when `flag` is True on every process (the sharded decoding loop asks "is everyone done?")."""
        return not self.any_process(not flag)

    def max_int(self, value: int) -> int:
        """The largest `value` over processes: every process pads its response batch to the same width, so the
        (B, T) tensors gathered later have one shape."""
        if self.single:
            return int(value)
        return int(self.accelerator.reduce(torch.tensor(int(value), device=self.device), "max"))

    # -- reductions over the global batch ----------------------------------------------------------------------
    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over processes (metrics and weighted means: every process logs every iteration)."""
        if self.single:
            return tensor
        return self.accelerator.reduce(tensor.to(self.device), "sum")

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise mean over processes (metrics: every process logs every iteration)."""
        if self.single:
            return tensor
        return self.accelerator.reduce(tensor.to(self.device), "mean")

    def max(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum over processes (metrics such as a largest difference)."""
        if self.single:
            return tensor
        return self.accelerator.reduce(tensor.to(self.device), "max")

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rows of every process concatenated in rank order; shapes must agree (see `max_int`)."""
        if self.single:
            return tensor
        return self.accelerator.gather(tensor.to(self.device).contiguous())

    def gather_json(self, obj: Any) -> list[Any]:
        """Every process's `obj` (a JSON value: dicts with string keys, lists, numbers, strings), in rank order; one
        process: `[obj]`. Its JSON bytes are zero-padded to the widest process's (a zero byte is never part of JSON
        text): two small collectives (`max_int`, `gather`) whatever the size, and no pickle crosses processes."""
        if self.single:
            return [obj]
        payload = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8)
        width = self.max_int(payload.numel())
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[: payload.numel()] = payload
        rows = self.gather(padded).view(-1, width).cpu()
        return [json.loads(bytes(row.tolist()).rstrip(b"\0").decode()) for row in rows]

    def on_global_batch(self, fn: Callable[..., torch.Tensor], values: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        """`fn` applied to the global batch (every process's rows), then this process's rows of the result.

        Batch statistics (normalisation, whitening) must not depend on how many processes share the batch; every
        process gathers the same tensors, so all of them call it in the same place.
        """
        if self.single:
            return fn(values, *more)
        gathered = [self.gather(t) for t in (values, *more)]
        rows = values.shape[0]
        start = self.rank * rows
        return fn(*gathered)[start : start + rows].to(values.device)

    def global_moments(self, moments: Callable[..., tuple[torch.Tensor, torch.Tensor]]):
        """Wrap a `moments(values, mask)` function so it sees the global batch (for `core.advantages.whiten`)."""
        if self.single:
            return moments

        def over_all_processes(values: torch.Tensor, mask: torch.Tensor | None = None):
            gathered_mask = self.gather(mask) if mask is not None else None
            mean, var = moments(self.gather(values), gathered_mask)
            return mean.to(values.device), var.to(values.device)

        return over_all_processes

    # -- errors and decisions ----------------------------------------------------------------------------------
    def raise_if_any_failed(self, error: str | None) -> None:
        """A user error on one process stops every process with its message. Called after each step that can fail
        on one process only (a reward, a checkpoint write), instead of leaving the others blocked in the next
        collective."""
        if not self.single:
            from accelerate.utils import gather_object

            errors = [e for e in gather_object([error]) if e]
            error = errors[0] if errors else None
        if error:
            raise UserError(error)

    def decide_on_main(self, decide: Callable[[], T]) -> T:
        """Run `decide()` on the main process only and give its result (or its UserError) to every process, so
        all of them act on one decision (which checkpoint to resume from) and do the expensive part once."""
        if self.single:
            return decide()
        from accelerate.utils import broadcast_object_list

        choice: list[tuple[Any, str | None]] = [(None, None)]  # (result, error message)
        if self.is_main:
            try:
                choice = [(decide(), None)]
            except UserError as exc:
                choice = [(None, str(exc))]
        broadcast_object_list(choice, from_process=0)
        result, error = choice[0]
        if error is not None:
            raise UserError(error)
        return result

    def barrier(self) -> None:
        """Wait until every process is here (the main process writes a file the others read next)."""
        if not self.single:
            self.accelerator.wait_for_everyone()

    def whole_state(self, model: torch.nn.Module):
        """`model.state_dict()`'s (name, tensor) pairs, each tensor whole on every process, one at a time: an FSDP2
        shard (a DTensor) is all-gathered, a plain tensor passes through. Every process must go through it alike
        (the vLLM weight push: each process's engine takes the whole weights)."""
        for name, tensor in model.state_dict().items():
            yield name, (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The full weights when they are sharded (DeepSpeed, FSDP): each process holds a shard, so every process
        takes part in gathering them. None otherwise (save_pretrained reads the unwrapped model directly)."""
        accelerator = self.accelerator
        if accelerator.distributed_type.name == "FSDP" and not accelerator.is_fsdp2 and self.device.type == "cpu":
            # FSDP1's full state dict with offload_to_cpu=True (accelerate's choice) segfaults inside torch when
            # the shards already live on the CPU; they are there already, so gather without the offload
            from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

            gathered = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
            with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, gathered):
                return model.state_dict()
        if accelerator.distributed_type.name in ("DEEPSPEED", "FSDP"):
            return accelerator.get_state_dict(model)
        return None

    # -- the engine's sharded checkpoint (DeepSpeed, FSDP) ---------------------------------------------------------
    def save_sharded_state(self, models: dict[str, torch.nn.Module], optimizer, folder) -> None:
        """Every process writes its shard of the trained weights and optimizer state into `folder` (which exists
        already): every process reaches it from `save_checkpoint`. DeepSpeed: the engine's own checkpoint, one tag
        per model; FSDP: a torch distributed checkpoint (DCP)."""
        if self.accelerator.distributed_type.name == "DEEPSPEED":
            for name, engine in models.items():
                engine.save_checkpoint(str(folder), tag=name, save_latest=False)
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        (model,) = models.values()  # sharding.check_supported: one trained model under FSDP
        model_state, optimizer_state = get_state_dict(model, optimizers=_torch_optimizer(optimizer))
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))

    def load_sharded_state(self, models: dict[str, torch.nn.Module], optimizer, folder) -> None:
        """Restore what `save_sharded_state` wrote, each process its own shard, exactly (from `load_checkpoint`,
        which every process runs)."""
        if self.accelerator.distributed_type.name == "DEEPSPEED":
            for name, engine in models.items():
                path, _ = engine.load_checkpoint(str(folder), tag=name, load_optimizer_states=True,
                                                 load_lr_scheduler_states=False)
                if path is None:
                    raise UserError(f"resume_from_checkpoint: {folder} has no DeepSpeed state for '{name}'")
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        (model,) = models.values()
        plain = _torch_optimizer(optimizer)
        model_state, optimizer_state = get_state_dict(model, optimizers=plain)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(folder))  # fills the shards in place
        set_state_dict(model, optimizers=plain, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def process_group_backend() -> str | None:
    """The backend of the default process group ("gloo", "nccl"), or None when there is none (one process)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    return torch.distributed.get_backend()


def _torch_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the torch optimizer

