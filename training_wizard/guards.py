"""Numerical guards: non-finite logits, loss, rewards, advantages or gradients never reach the weights.

Each check is one `isfinite` reduction per tensor per micro-batch (or per rollout), kept on the device until the
mini-batch ends, so the guard adds one host sync per optimizer step. A failing check either stops the run with a
one-line UserError naming the step and the tensor, or, with `training.skip_nonfinite_batches = true`, skips the
optimizer step of that mini-batch (counted in the `guards/skipped_batches` metric).
"""

from __future__ import annotations

import torch

from training_wizard.errors import UserError

# Order matters: the first non-finite tensor is the one named in the error.
MINI_BATCH_TENSORS = ("logits", "loss", "gradient")
ROLLOUT_TENSORS = ("rollout logprobs", "reference logprobs", "reward scores", "advantages")


def all_finite(tensor: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """0-dim bool tensor (no host sync): every (masked-in) element is finite."""
    if mask is not None:
        tensor = torch.where(mask, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device))
    return torch.isfinite(tensor).all()


def rollout_flags(rollout, advantages: torch.Tensor) -> torch.Tensor:
    """Bool (4,) tensor: True where the ROLLOUT_TENSORS entry has a non-finite value."""
    mask = rollout.loss_mask
    advantage_mask = mask if advantages.dim() == 2 else None
    checks = [
        all_finite(rollout.logprobs, mask),
        all_finite(rollout.ref_logprobs, mask),
        all_finite(rollout.scores),
        all_finite(advantages, advantage_mask),
    ]
    return ~torch.stack([c.to(mask.device) for c in checks])


def first_flagged(names: tuple[str, ...], flags) -> str | None:
    for name, flagged in zip(names, flags):
        if flagged:
            return name
    return None


def nonfinite_error(name: str, step: int, where: str = "") -> UserError:
    return UserError(
        f"training: non-finite {name} at step {step}{where}; the policy or reward diverged: lower "
        "training.learning_rate, check the reward, or set training.skip_nonfinite_batches = true to skip such batches"
    )


def first_nonfinite_parameter(model: torch.nn.Module) -> str | None:
    """Name of the first trainable parameter with a NaN or inf, or None. Checked before a checkpoint is written."""
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and parameter.numel() and not bool(torch.isfinite(parameter.detach()).all()):
            return name
    return None
