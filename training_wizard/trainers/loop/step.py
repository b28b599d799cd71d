"""The parts of a training step every loop shares (the on-policy update of trainers/loop/update.py and the supervised
loop of trainers/supervised/loop.py): the accumulation check, the optimizer step with its clip, finite guard and
skip mode, and the stop with a checkpoint.

Written once so the loops cannot drift apart: a fix to the guard, to DeepSpeed's overflow handling or to the
gradient norm under FSDP2 reaches every stage of a pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from training_wizard import guards
from training_wizard.errors import UserError
from training_wizard.signals import StopRequest, TrainingInterrupted


def make_accelerator(config):
    """The run's Accelerator, as the config says (RunConfig.accelerate_options). accelerate keeps one state per
    process: a second Accelerator asking for another mixed precision or device is refused in one line."""
    from accelerate import Accelerator

    try:
        return Accelerator(**config.accelerate_options())
    except ValueError as exc:
        if "already been initialized" not in str(exc):
            raise
        raise UserError("training.bf16 / fp16 / use_cpu: this process already made an Accelerator with other "
                        "mixed precision or device settings (accelerate allows one per process); run it in a "
                        "process of its own") from None


def check_accumulation(accelerator, gradient_accumulation_steps: int) -> None:
    """A caller-made Accelerator must accumulate as the config says: it divides each micro-batch loss by its own
    count, and the step boundaries, checkpoints and token counts all assume the config's."""
    if accelerator.gradient_accumulation_steps != gradient_accumulation_steps:
        raise ValueError(
            f"the Accelerator was made with gradient_accumulation_steps={accelerator.gradient_accumulation_steps}, "
            f"the config says {gradient_accumulation_steps}"
        )


@dataclass
class StepOutcome:
    """stepped: the optimizer stepped (False: the step was skipped); grad_norm: the norm before clipping, or
    None when no parameter had a gradient."""

    stepped: bool
    grad_norm: float | None


class OptimizerStep:
    """Clip, check that every flagged tensor and the gradient are finite on every process, then step, or skip
    (`skip_nonfinite`), or stop with `error(name)`.

    `flags` (bool tensor) and `names` say which tensors of the step were non-finite, in the order the error names
    the first one; the gradient's flag is appended as the last name. Under DeepSpeed the engine steps inside its
    backward (`deepspeed_guard`, trainers/loop/setup.py): its own overflow check is what says the step was skipped.
    """

    def __init__(self, accelerator, collectives, optimizer, parameters: Callable[[], list[torch.nn.Parameter]],
                 max_grad_norm: float | None, skip_nonfinite: bool, deepspeed_guard=None, engine=None):
        self.accelerator, self.collectives, self.optimizer = accelerator, collectives, optimizer
        self.parameters, self.max_grad_norm, self.skip_nonfinite = parameters, max_grad_norm, skip_nonfinite
        self.deepspeed_guard, self.engine = deepspeed_guard, engine

    def __call__(self, flags: torch.Tensor, names: tuple[str, ...], error: Callable[[str], UserError]) -> StepOutcome:
        norm = self._grad_norm()
        # fp16 loss scaling expects inf gradients now and then: its GradScaler skips those steps itself.
        checks_grad = isinstance(norm, torch.Tensor) and self.accelerator.scaler is None
        grad_bad = ~torch.isfinite(norm).reshape(1) if checks_grad else flags.new_zeros(1)
        if self.deepspeed_guard is not None and not self.engine.fp16_enabled():
            # the engine has stepped already (inside backward), or skipped the step on a non-finite gradient
            grad_bad = flags.new_tensor([self.deepspeed_guard.step_was_skipped()])
        bad = self.collectives.any_true(*torch.cat([flags, grad_bad.to(flags.device)]).tolist())  # all agree
        name = guards.first_flagged(names, bad)
        stepped = name is None
        if stepped:
            self.optimizer.step()
        elif not self.skip_nonfinite:
            self.optimizer.zero_grad(set_to_none=True)
            raise error(name)
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(stepped, float(norm) if isinstance(norm, torch.Tensor) else None)

    def _grad_norm(self) -> torch.Tensor | None:
        """The gradient norm over every trained parameter (clipping to max_grad_norm when set)."""
        parameters = self.parameters()
        if self.max_grad_norm is not None:
            norm = self.accelerator.clip_grad_norm_(parameters, self.max_grad_norm)
        else:
            grads = [torch.linalg.vector_norm(p.grad.detach()) for p in parameters if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(grads)) if grads else None
        if hasattr(norm, "full_tensor"):  # FSDP2 returns the norm as a DTensor: make it a plain tensor
            norm = norm.full_tensor()
        return norm


def stop_with_checkpoint(trainer, stop: StopRequest, state: dict[str, Any] | None = None) -> None:
    """Commit a checkpoint of `state` (default: the trainer's current one) unless it is already saved, then raise
    `TrainingInterrupted`. Processes that saw no signal themselves stop with the signal the others got (SIGTERM
    if unknown)."""
    from training_wizard.checkpoint import checkpoints_dir, save_checkpoint

    step = int(state["iteration"]) if state is not None else trainer.state.iteration
    folder = checkpoints_dir(trainer.config.output_dir) / f"step-{step}"
    if trainer.last_saved_step != step:
        folder = save_checkpoint(trainer, state=state)
    raise TrainingInterrupted(stop.signum or 15, str(folder), step)
