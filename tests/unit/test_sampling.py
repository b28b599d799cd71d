"""The keyed device sampler (rollout/sampling.py): right distribution, keyed draws, batch independence."""

import math

import pytest
import torch

from training_wizard.rollout.prompts import row_seed
from training_wizard.rollout.sampling import (
    SamplingFilters, filtered_logits, greedy_with_logprobs, keyed_uniforms, sample_from_logits, sample_with_logprobs,
)

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


# Truncated distributions worked by hand. LOGITS sorted: t0 2.0, t6 1.5, t1 1.0, t2 0.5, t7 0.2, t3 0.0, t4 -0.5,
# t5 -1.0; softmax 0.3802, 0.2306, 0.1399, 0.0848, 0.0628, 0.0515, 0.0312, 0.0189 (sum of exps 19.434).
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
CHI2_999_SMALL = {1: 10.83, 2: 13.82, 3: 16.27}


def truncated(kept: list[int], logits=LOGITS, temperature=1.0) -> torch.Tensor:
    """softmax over the kept tokens only, zero elsewhere (float64)."""
    scaled = logits.double() / temperature
    out = torch.zeros_like(scaled)
    out[kept] = torch.softmax(scaled[kept], -1)
    return out


@pytest.mark.parametrize("filters, temperature, kept, seen", [
    # the 3 largest logits
    (SamplingFilters(top_k=3), 1.0, [0, 6, 1], None),
    # cumulative mass before each token: t0 0, t6 0.380, t1 0.611, t2 0.751, t7 0.836 >= 0.8: t7 and later dropped
    (SamplingFilters(top_p=0.8), 1.0, [0, 6, 1, 2], None),
    # exp(l) >= 0.3 exp(2.0) <=> l >= 2 + ln 0.3 = 0.796
    (SamplingFilters(min_p=0.3), 1.0, [0, 6, 1], None),
    # at temperature 0.5 the scaled logits double; top 2 of them, then their softmax
    (SamplingFilters(top_k=2), 0.5, [0, 6], None),
    # top_k 4 keeps t0 t6 t1 t2 (mass 0.455 0.276 0.167 0.102 among them); top_p 0.6 then drops t1 and t2
    (SamplingFilters(top_k=4, top_p=0.6), 1.0, [0, 6], None),
], ids=["top_k", "top_p", "min_p", "top_k_temperature", "top_k_then_top_p"])
def test_filtered_draws_follow_the_truncated_distribution(filters, temperature, kept, seen):
    rows = 10_000
    tokens, logprobs = sample_with_logprobs(LOGITS.expand(rows, -1), temperature, keys(rows), 3, filters)
    assert set(tokens.tolist()) == set(kept)  # nothing outside the kept set, everything in it drawn
    probs = truncated(kept, temperature=temperature)
    counts = torch.bincount(tokens, minlength=8).double()[kept]
    assert chi_square(counts, probs[kept]) < CHI2_999_SMALL[len(kept) - 1]
    # each token's logprob is that of the distribution it was drawn from, not of the full softmax
    assert (logprobs.double() - probs.log()[tokens]).abs().max() < 2e-6


def test_repetition_penalty_by_hand():
    # tokens 0 (logit 2.0), 6 (1.5) and 5 (-1.0) were seen: with penalty 2 they become 1.0, 0.75 and -2.0
    seen = torch.zeros(1, 8, dtype=torch.bool)
    seen[0, [0, 6, 5]] = True
    penalised = torch.tensor([1.0, 1.0, 0.5, 0.0, -0.5, -2.0, 0.75, 0.2])
    filters = SamplingFilters(repetition_penalty=2.0)
    torch.testing.assert_close(filtered_logits(LOGITS[None], 1.0, filters, seen)[0], penalised)
    rows = 10_000
    tokens, logprobs = sample_with_logprobs(LOGITS.expand(rows, -1), 1.0, keys(rows), 1, filters,
                                            seen.expand(rows, -1))
    probs = torch.softmax(penalised.double(), -1)
    assert chi_square(torch.bincount(tokens, minlength=8).double(), probs) < CHI2_999[7]
    assert (logprobs.double() - probs.log()[tokens]).abs().max() < 2e-6


def test_filtered_draws_do_not_depend_on_the_batch():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2)) * 3
    row_keys = keys(6, iteration=2)
    filters = SamplingFilters(top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.3)
    seen = torch.rand(6, 300, generator=torch.Generator().manual_seed(3)) < 0.1
    together = sample_with_logprobs(logits, 0.8, row_keys, 4, filters, seen)
    for i in range(6):
        alone = sample_with_logprobs(logits[i : i + 1], 0.8, row_keys[i : i + 1], 4, filters, seen[i : i + 1])
        assert torch.equal(alone[0], together[0][i : i + 1]) and torch.equal(alone[1], together[1][i : i + 1])


def test_the_penalty_covers_prompt_tokens_and_drawn_ones():
    from training_wizard.rollout.generation import seen_tokens

    prompt_ids = torch.tensor([[0, 0, 5, 7], [3, 4, 4, 1]])
    prompt_mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    seen = seen_tokens(prompt_ids, prompt_mask, 9, SamplingFilters(repetition_penalty=1.1))
    assert seen.nonzero().tolist() == [[0, 5], [0, 7], [1, 1], [1, 3], [1, 4]]  # padding id 0 is not "seen"
    assert seen_tokens(prompt_ids, prompt_mask, 9, SamplingFilters(top_p=0.5)) is None
