"""The vLLM sampling correction (core/importance_sampling.py) against numbers worked by hand, its use in the
surrogate losses, and the vLLM keys of the config."""

import math

import pytest
import torch

from training_wizard import RLOOConfig
from training_wizard.core.importance_sampling import sampling_correction_weights
from training_wizard.core.losses import clipped_surrogate_sequence, clipped_surrogate_token

# Two completions of two real tokens (the third column is padding).
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, 0.0]])
SAMPLING = torch.tensor([[-1.5, -1.0, -7.0], [-0.3, -1.2, 0.0]])
MASK = torch.tensor([[True, True, False], [True, True, False]])
# log-ratios old - sampling: row 0 (0.5, -1.0), row 1 (0.0, 1.0); sums -0.5 and 1.0
E = math.e


def weights(mode, clip_min, clip_max):
    return sampling_correction_weights(OLD, SAMPLING, MASK, mode, clip_min, clip_max)


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_token_truncate_clamps_each_tokens_ratio():
    out = weights("token_truncate", 0.5, 2.0)
    close(out.raw[MASK], [E**0.5, E**-1, 1.0, E])
    close(out.token, [[E**0.5, 0.5, 0.0], [1.0, 2.0, 0.0]])  # exp(-1) = 0.37 -> 0.5; e -> 2; padding 0
    close(out.sequence, [E**0.5 * 0.5, 2.0])  # product over the real tokens


def test_token_mask_zeroes_ratios_outside_the_bounds():
    out = weights("token_mask", 0.5, 2.0)
    close(out.token, [[E**0.5, 0.0, 0.0], [1.0, 0.0, 0.0]])
    close(out.sequence, [0.0, 0.0])


def test_sequence_truncate_clamps_the_completions_ratio():
    out = weights("sequence_truncate", None, 2.0)
    close(out.raw, [E**-0.5, E])
    close(out.sequence, [E**-0.5, 2.0])
    close(out.token, [[E**-0.5, E**-0.5, 0.0], [2.0, 2.0, 0.0]])


def test_sequence_mask_zeroes_completions_outside_the_bounds():
    close(weights("sequence_mask", None, 3.0).sequence, [E**-0.5, E])  # TRL's default bounds keep both
    close(weights("sequence_mask", 0.7, 3.0).sequence, [0.0, E])  # exp(-0.5) = 0.61 < 0.7
    close(weights("sequence_mask", 0.5, 2.0).sequence, [E**-0.5, 0.0])  # e > 2


def test_no_bounds_keep_the_raw_ratio_and_equal_logprobs_give_weight_one():
    close(weights("token_truncate", None, None).token, [[E**0.5, E**-1, 0.0], [1.0, E, 0.0]])
    same = sampling_correction_weights(OLD, OLD, MASK, "sequence_mask", None, 3.0)
    close(same.sequence, [1.0, 1.0])


def test_the_weights_carry_no_gradient():
    old = OLD.clone().requires_grad_(True)
    out = sampling_correction_weights(old, SAMPLING, MASK, "token_truncate", None, 3.0)
    assert not out.token.requires_grad and not out.sequence.requires_grad


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown importance sampling mode"):
        weights("token", None, None)


def test_surrogate_losses_multiply_each_term_by_its_weight():
    logprobs = OLD.clone().requires_grad_(True)  # ratio 1: the loss is -A * w, averaged
    advantages = torch.tensor([1.0, -2.0])
    sequence = clipped_surrogate_sequence(logprobs, OLD, advantages, MASK, 0.2, torch.tensor([0.5, 2.0]))
    close(sequence.loss, (-1.0 * 0.5 + 2.0 * 2.0) / 2)
    sequence.loss.backward()
    # d/dlogp_t of -A w exp(sum logp - sum old) at ratio 1 = -A w on each real token, / 2 completions
    close(logprobs.grad, [[-0.25, -0.25, 0.0], [2.0, 2.0, 0.0]])
    token_advantages = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    token_weights = torch.tensor([[0.5, 1.0, 0.0], [2.0, 0.0, 0.0]])
    token = clipped_surrogate_token(OLD, OLD, token_advantages, MASK, 0.2, token_weights)
    close(token.loss, ((-0.5 - 1.0) / 2 + (4.0 + 0.0) / 2) / 2)
    unweighted = clipped_surrogate_token(OLD, OLD, token_advantages, MASK, 0.2)
    close(unweighted.loss, ((-1.0 - 1.0) / 2 + (2.0 + 2.0) / 2) / 2)


def test_vllm_keys_take_trls_names_and_defaults():
    config = RLOOConfig(use_vllm=True, vllm_importance_sampling_cap=5.0)
    assert config.vllm_mode == "colocate" and config.vllm_gpu_memory_utilization == 0.3
    assert config.vllm_importance_sampling_correction and config.vllm_importance_sampling_mode == "sequence_mask"
    assert config.vllm_importance_sampling_clip_max == 5.0 and config.vllm_importance_sampling_clip_min is None
    assert config.vllm_server_port == 8000 and config.vllm_server_timeout == 240.0
    with pytest.raises(ValueError, match="logprobs must come from the training forward pass"):
        RLOOConfig(use_vllm=True, logprobs_from_sampling=True)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
def test_a_token_modes_sequence_weight_stays_within_the_bounds(mode):
    """1000 completions of 256 tokens, each token's sampler logprob 0.02 below the training pass's (a bf16-sized
    gap): every token weight is e^0.02 < 3, but their product over a completion is e^5.1 = 166; the sequence
    weight RLOO's sequence loss uses must stay within [clip_min, clip_max] all the same."""
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(1000, 256, generator=generator)
    mask = torch.ones(1000, 256, dtype=torch.bool)
    mask[:, 200:] = torch.rand(1000, 56, generator=generator) < 0.5  # ragged lengths, padding inside
    out = sampling_correction_weights(old, old - 0.02, mask, mode, None, 3.0)
    assert float(out.token.max()) <= 3.0
    if mode == "token_truncate":
        assert float(out.sequence.max()) == 3.0 and float(out.sequence.min()) > 0
    else:
        assert float(out.sequence.max()) == 0.0  # every product is above 3: masked
