"""Keyed sampling on the device: one token per row from softmax(logits / temperature), with randomness that
depends only on the row's key and the token step.

Each row carries a 63-bit key (run seed, iteration, slot: `prompts.row_seed`). At token step t the row's uniform
u = hash(key, t) in [0, 1) is computed on the logits' device by integer mixing (no generator, no host copy), and
the token is the inverse CDF of the row's distribution at u. A completion is therefore the same whichever process
samples it and whatever else is in its batch, which is what lets one process and two end with the same weights.

Inverse-CDF sampling needs one uniform per row and step (B numbers), where the Gumbel/exponential race needs one
per vocabulary entry (B x V). The CDF is taken in two stages, over blocks of the vocabulary and then inside the
chosen block: each block's sum in float32 (pairwise, relative error near 1e-7 of the block's mass), the running
sums across blocks and inside the block in float64. A single float32 cumulative sum over a 150k-token vocabulary
drifts by about 1e-5; the two stages keep the error near float32 rounding of one block, while the only (B, V)
tensors are the scaled logits and their weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_BLOCK = 1024  # vocabulary entries per block of the two-stage CDF


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2^32 for int64 x in [0, 2^32), without int64 overflow (16-bit halves)."""
    low = (x & 0xFFFF) * constant
    high = (((x >> 16) * constant) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (the "lowbias32" constants of C. Wellons' hash prospector): every input bit
    affects every output bit. int64 tensor with values in [0, 2^32) -> the same."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """Uniforms in [0, 1) with 53 random bits, one per key, for token step `step`. keys: (B,) int64 -> (B,) float64
    on the keys' device. The same (key, step) always gives the same number; different steps or keys are
    independent for sampling purposes."""
    low, high = keys & _MASK32, (keys >> 32) & _MASK32  # the mask undoes the sign extension of negative keys
    state = _mix32(low ^ _mix32(high ^ _mix32(torch.full_like(keys, step & _MASK32) ^ 0x9E3779B9)))
    first = _mix32(state ^ 0x85EBCA6B)
    second = _mix32(first ^ 0xC2B2AE35)
    bits = (first >> 5) * (1 << 26) + (second >> 6)  # 27 + 26 = 53 bits
    return bits.to(torch.float64) / float(1 << 53)


@dataclass(frozen=True)
class SamplingFilters:
    """Truncations of the sampling distribution (names as in TRL 1.x and transformers' generation config).

    top_k: keep the k most likely tokens (0: off); top_p: keep the smallest set of most likely tokens whose
    probability reaches top_p (nucleus sampling, Holtzman et al. 2020; 1.0: off); min_p: keep tokens at least
    min_p times as likely as the most likely one (None: off); repetition_penalty: divide the positive logits (and
    multiply the negative ones) of tokens already in the prompt or the completion by it, before the temperature
    (the CTRL paper, Keskar et al. 2019; 1.0: off). Applied in transformers' order: penalty, temperature, top_k,
    top_p, min_p, each on what the previous left.
    """

    top_k: int = 0
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p is not None or self.repetition_penalty != 1.0


def filtered_logits(
    logits: torch.Tensor, temperature: float, filters: SamplingFilters, seen: torch.Tensor | None = None
) -> torch.Tensor:
    """float32 logits / temperature with the filtered-out tokens at -inf: softmax of the result is the
    distribution a token is then drawn from. logits: (B, V); seen: (B, V) bool, the tokens the repetition penalty
    applies to (needed when it is not 1). Every operation is per row, so a row's result does not depend on the
    other rows of its batch. At least one token (the most likely) is always kept."""
    scaled = logits.float()
    if filters.repetition_penalty != 1.0:
        penalised = torch.where(scaled > 0, scaled / filters.repetition_penalty, scaled * filters.repetition_penalty)
        scaled = torch.where(seen, penalised, scaled)
    if temperature != 1.0:
        scaled = scaled / temperature
    if filters.top_k > 0 and filters.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, filters.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if filters.top_p < 1.0:
        ordered, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # mass of the more likely tokens
        drop = before >= filters.top_p
        drop[:, 0] = False
        scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    if filters.min_p is not None:
        peak = scaled.amax(dim=-1, keepdim=True)
        scaled = scaled.masked_fill(scaled < peak + math.log(filters.min_p), float("-inf"))
    return scaled


def sample_from_logits(logits: torch.Tensor, temperature: float, keys: torch.Tensor, step: int) -> torch.Tensor:
    """One token per row from softmax(logits / temperature), by inverse CDF at the row's keyed uniform.

    logits: (B, V); keys: (B,) int64 on the same device -> (B,) long. Tokens of probability 0 are never drawn.
    """
    return sample_with_logprobs(logits, temperature, keys, step)[0]


def sample_with_logprobs(
    logits: torch.Tensor, temperature: float, keys: torch.Tensor, step: int,
    filters: SamplingFilters | None = None, seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_from_logits`'s tokens (B,) and their float32 log-probabilities under softmax(logits / temperature),
    or with `filters` under the truncated distribution `filtered_logits` gives (renormalised over the kept tokens:
    the distribution each token was really drawn from).

    One pass over the vocabulary makes the unnormalised weights exp(scaled - row max), which both the draw (the
    inverse CDF needs no normalised probabilities: the target is scaled by the total instead) and the
    log-normaliser (row max + log total) use, where a softmax, a float64 copy of the probabilities and a separate
    log-sum-exp each went over the (B, V) logits at every token step (`bench/decode.py` measures the decode loop).
    """
    if filters is not None and filters.active:
        scaled = filtered_logits(logits, temperature, filters, seen)
    else:
        scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    peak = scaled.amax(dim=-1, keepdim=True)
    weights = (scaled - peak).exp_()
    rows, vocab = weights.shape
    full = vocab // _BLOCK * _BLOCK
    # per-block sums in float32 (pairwise, relative error near 1e-7 of a block's mass), accumulated in float64
    blocks = [weights[:, :full].reshape(rows, -1, _BLOCK).sum(-1).double()] if full else []
    if full < vocab:
        blocks.append(weights[:, full:].sum(-1, keepdim=True).double())
    block_cdf = torch.cat(blocks, dim=1).cumsum(-1)  # (B, number of blocks)
    total = block_cdf[:, -1]
    target = keyed_uniforms(keys, step) * total
    block = torch.searchsorted(block_cdf, target.unsqueeze(-1), right=True).clamp(max=block_cdf.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target).unsqueeze(-1))
    columns = block * _BLOCK + torch.arange(_BLOCK, device=weights.device)  # (B, _BLOCK) vocabulary ids
    inside = torch.where(columns < vocab, weights.gather(1, columns.clamp(max=vocab - 1)), torch.zeros((), device=weights.device))
    inside_cdf = inside.to(torch.float64).cumsum(-1)
    position = torch.searchsorted(inside_cdf, target.unsqueeze(-1) - before, right=True)
    # Rounding can put the target past the block's last nonzero entry: take that entry, never a zero one.
    last_nonzero = (inside > 0).long().cumsum(-1).argmax(-1, keepdim=True)
    position = torch.minimum(position, last_nonzero)
    token = columns.gather(1, position)
    logprob = scaled.gather(1, token).squeeze(-1) - peak.squeeze(-1) - total.log().float()
    return token.squeeze(-1), logprob


def greedy_with_logprobs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely token of each row and its float32 log-probability under softmax(logits). (B, V) -> (B,), (B,)."""
    scaled = logits.float()
    token = scaled.argmax(dim=-1, keepdim=True)
    return token.squeeze(-1), (scaled.gather(1, token) - torch.logsumexp(scaled, dim=-1, keepdim=True)).squeeze(-1)
