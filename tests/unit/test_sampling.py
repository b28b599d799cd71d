"""The keyed device sampler (rollout/sampling.py): right distribution, keyed draws, batch independence."""

import math

import pytest
import torch

from training_wizard.rollout.prompts import row_seed
from training_wizard.rollout.sampling import greedy_with_logprobs, keyed_uniforms, sample_from_logits, sample_with_logprobs

# Chi-square critical values at p = 0.001 (degrees of freedom -> value), from the standard table.
CHI2_999 = {7: 24.32, 11: 31.26}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def keys(n: int, iteration: int = 0) -> torch.Tensor:
    return torch.tensor([row_seed(17, iteration, slot) for slot in range(n)], dtype=torch.long)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_token_frequencies_follow_softmax_over_temperature(temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
    rows = 40_000
    tokens = sample_from_logits(logits.expand(rows, -1), temperature, keys(rows), step=3)
    counts = torch.bincount(tokens, minlength=8).double()
    probs = torch.softmax(logits.double() / temperature, -1)
    assert chi_square(counts, probs) < CHI2_999[7]


def test_blocks_of_a_large_vocabulary_are_sampled_in_proportion():
    # 12 groups of tokens spread over three CDF blocks (V = 2,500 > 1,024); each group holds equal mass.
    torch.manual_seed(0)
    vocab, rows = 2_500, 30_000
    logits = torch.full((vocab,), -1e9)
    chosen = torch.randperm(vocab)[:12]
    logits[chosen] = torch.log(torch.arange(1.0, 13.0))  # probabilities proportional to 1..12
    tokens = sample_from_logits(logits.expand(rows, -1), 1.0, keys(rows), step=0)
    assert set(tokens.tolist()) <= set(chosen.tolist())  # nothing of (near) zero probability
    counts = torch.stack([(tokens == c).sum() for c in chosen]).double()
    assert chi_square(counts, torch.arange(1.0, 13.0, dtype=torch.float64) / 78) < CHI2_999[11]


def test_a_row_draws_the_same_token_whatever_else_is_in_its_batch():
    torch.manual_seed(1)
    logits = torch.randn(6, 50)
    row_keys = keys(6, iteration=4)
    together = sample_from_logits(logits, 0.7, row_keys, step=5)
    alone = torch.stack([sample_from_logits(logits[i : i + 1], 0.7, row_keys[i : i + 1], step=5)[0] for i in range(6)])
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = sample_from_logits(logits[order], 0.7, row_keys[order], step=5)
    assert torch.equal(together, alone) and torch.equal(together[order], shuffled)


def test_uniforms_are_keyed_by_key_and_step_and_look_uniform():
    row_keys = keys(20_000)
    first, again, next_step = keyed_uniforms(row_keys, 0), keyed_uniforms(row_keys, 0), keyed_uniforms(row_keys, 1)
    assert torch.equal(first, again)
    assert first.dtype == torch.float64 and 0.0 <= float(first.min()) and float(first.max()) < 1.0
    assert abs(float(first.mean()) - 0.5) < 0.01 and abs(float(first.var()) - 1 / 12) < 0.005
    assert abs(float(torch.corrcoef(torch.stack([first, next_step]))[0, 1])) < 0.03  # steps are independent
    assert len(set(first.tolist())) == 20_000
    negative = keyed_uniforms(torch.tensor([-5, 2**62 + 3]), 7)  # any int64 key works
    assert all(0.0 <= v < 1.0 for v in negative.tolist()) and not math.isclose(*negative.tolist())


def test_zero_probability_tokens_are_never_drawn():
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(5_000, -1)
    tokens = sample_from_logits(logits, 1.0, keys(5_000), step=2)
    assert set(tokens.tolist()) == {0, 2}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_tokens_carry_their_log_probability(temperature):
    """The draw and its logprob come from one pass over the vocabulary (unnormalised weights and their total):
    the tokens are `sample_from_logits`'s, the logprobs those of a float64 log-softmax to float32 rounding."""
    logits = torch.randn(16, 5000, generator=torch.Generator().manual_seed(0)) * 4  # one partial block of 904
    tokens, logprobs = sample_with_logprobs(logits, temperature, keys(16), step=2)
    assert torch.equal(tokens, sample_from_logits(logits, temperature, keys(16), step=2))
    exact = torch.log_softmax(logits.double() / temperature, -1).gather(1, tokens[:, None]).squeeze(1)
    assert logprobs.dtype == torch.float32 and (logprobs.double() - exact).abs().max() < 2e-6


def test_greedy_tokens_carry_their_log_probability():
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    tokens, logprobs = greedy_with_logprobs(logits)
    assert torch.equal(tokens, logits.argmax(-1))
    exact = torch.log_softmax(logits.double(), -1).gather(1, tokens[:, None]).squeeze(1)
    assert (logprobs.double() - exact).abs().max() < 2e-6
