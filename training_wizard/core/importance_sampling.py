"""Correction for the gap between the engine that sampled a completion and the training forward pass.

vLLM samples with its own kernels, so the probability it gave a token differs a little from the probability the
training forward pass gives it (in bf16 by far more than rounding: the RLOO blog post's bf16 mismatch). The
"old" logprobs of the ratio always come from the training forward pass; the update's loss is then re-weighted by
how much more (or less) likely the training policy made each sample than the sampler did, as in TRL's GRPO
(`vllm_importance_sampling_correction`, following "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", Yao et al. 2025):

    token modes:     w_t = exp(logp_old_t - logp_sampling_t)                    one weight per token
    sequence modes:  w   = exp(sum_t (logp_old_t - logp_sampling_t))           one weight per completion
    *_truncate:      w <- clamp(w, clip_min, clip_max)                         (truncated importance sampling)
    *_mask:          w <- w where clip_min <= w <= clip_max, else 0           (masked importance sampling)

Where the whole completion is one action (RLOO's sequence loss) a token mode weighs it by the product of its
bounded token weights, bounded once more the same way: every weight stays within [clip_min, clip_max].

A bound given as None is not applied. The weights carry no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from training_wizard.core.masking import masked_sum

ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
IMPORTANCE_SAMPLING_MODES: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class ImportanceWeights:
    """token: (B, T) weight of each token's loss term (a sequence mode repeats its sequence weight on every token;
    0 where mask is False); sequence: (B,) weight of each completion's loss term when the whole completion is one
    action (a token mode multiplies the bounded per-token weights of the completion's real tokens and bounds the
    product again); raw: the
    unbounded ratios, (B, T) in token modes and (B,) in sequence modes, for the metrics."""

    token: torch.Tensor
    sequence: torch.Tensor
    raw: torch.Tensor


def sampling_correction_weights(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: ImportanceSamplingMode,
    clip_min: float | None,
    clip_max: float | None,
) -> ImportanceWeights:
    """old_logprobs: (B, T) from the training forward pass; sampling_logprobs: (B, T) as the sampler reported them
    (same temperature); mask: (B, T) bool, True = real response token."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"unknown importance sampling mode {mode!r}; expected one of {IMPORTANCE_SAMPLING_MODES}")
    real = mask.to(old_logprobs.dtype)
    log_ratio = ((old_logprobs - sampling_logprobs) * real).detach()
    per_sequence = mode.startswith("sequence")
    raw = torch.exp(masked_sum(log_ratio, mask) if per_sequence else log_ratio)
    bounded = _bound(raw, mode.endswith("truncate"), clip_min, clip_max)
    if per_sequence:
        return ImportanceWeights(token=bounded.unsqueeze(-1) * real, sequence=bounded, raw=raw)
    token = bounded * real
    # The product over real tokens (padding counts as a factor 1), bounded again: a product of bounded factors is
    # not bounded (256 tokens each at most 3 can multiply to any size), and a sequence loss must not weigh one
    # completion by more than the mode allows a single ratio.
    product = torch.where(mask, bounded, torch.ones_like(bounded)).prod(dim=-1)
    sequence = _bound(product, mode.endswith("truncate"), clip_min, clip_max)
    return ImportanceWeights(token=token, sequence=sequence, raw=raw)


def _bound(ratio: torch.Tensor, truncate: bool, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    if truncate:
        return ratio if clip_min is None and clip_max is None else ratio.clamp(min=clip_min, max=clip_max)
    keep = torch.ones_like(ratio, dtype=torch.bool)
    if clip_min is not None:
        keep &= ratio >= clip_min
    if clip_max is not None:
        keep &= ratio <= clip_max
    return torch.where(keep, ratio, torch.zeros_like(ratio))
