"""RLOO reward shaping (core/advantages.py: rloo_shaped_rewards) against numbers worked out by hand."""

import math

import pytest
import torch

from training_wizard.core.groups import repeated_layout_ids
from training_wizard.core.advantages import RLOOShaping, inverse_std, rloo_shaped_rewards, whiten

# Two prompts, k = 2, laid out [k0 p0, k0 p1, k1 p0, k1 p1]; per-token KL (k1 = logp - ref) on two positions.
SCORES = torch.tensor([1.0, 2.0, 3.0, 0.0])
KL = torch.tensor([[0.5, 0.5], [0.2, 9.0], [0.0, 0.0], [1.0, -0.5]])
MASK = torch.tensor([[True, True], [True, False], [True, True], [True, True]])  # row 1 stopped after one token
REF = torch.zeros(4, 2)


def shape(**options):
    return rloo_shaped_rewards(SCORES, KL.clone(), REF, MASK, RLOOShaping(rloo_k=2, kl_coef=0.1, **options),
                               repeated_layout_ids(2, 2))


def test_sequence_level_rewards_and_leave_one_out_advantages():
    shaped = shape()
    # summed KL (the masked 9.0 never counts): 1.0, 0.2, 0.0, 0.5; non-score = -0.1 * that
    torch.testing.assert_close(shaped.kl, torch.tensor([1.0, 0.2, 0.0, 0.5]))
    torch.testing.assert_close(shaped.non_score_reward, torch.tensor([-0.1, -0.02, 0.0, -0.05]))
    torch.testing.assert_close(shaped.rlhf_reward, torch.tensor([0.9, 1.98, 3.0, -0.05]))
    # prompt 0: rows 0 and 2 -> 0.9 - 3.0 and 3.0 - 0.9; prompt 1: rows 1 and 3 -> 1.98 + 0.05 and its negative
    torch.testing.assert_close(shaped.advantages, torch.tensor([-2.1, 2.03, 2.1, -2.03]))


def test_whiten_rewards_scales_by_one_over_the_standard_deviation():
    shaped = shape(whiten_rewards=True)
    # rlhf rewards 0.9, 1.98, 3.0, -0.05: mean 1.4575; squared deviations sum to 5.235675; unbiased var / 3
    scale = 1 / math.sqrt(5.235675 / 3 + 1e-8)
    torch.testing.assert_close(shaped.advantages, torch.tensor([-2.1, 2.03, 2.1, -2.03]) * scale)
    torch.testing.assert_close(shaped.rlhf_reward, torch.tensor([0.9, 1.98, 3.0, -0.05]))  # logged unscaled
    torch.testing.assert_close(inverse_std(torch.tensor([0.9, 1.98, 3.0, -0.05])), torch.tensor(scale))


def test_normalize_reward_standardises_then_clips_the_scores():
    shaped = rloo_shaped_rewards(SCORES, KL, REF, MASK, RLOOShaping(rloo_k=2, kl_coef=0.0, normalize_reward=True,
                                                                    reward_clip_range=1.0),
                                 repeated_layout_ids(2, 2))
    # scores 1, 2, 3, 0: mean 1.5, unbiased var 5/3; z = -0.3873, 0.3873, 1.1619 -> 1.0, -1.1619 -> -1.0
    z = 0.5 / math.sqrt(5 / 3 + 1e-8)
    torch.testing.assert_close(shaped.rlhf_reward, torch.tensor([-z, z, 1.0, -1.0]))
    torch.testing.assert_close(shaped.advantages, torch.tensor([-z - 1.0, z + 1.0, 1.0 + z, -1.0 - z]))


def test_normalize_advantage_whitens_the_sequence_advantages():
    shaped = shape(normalize_advantage=True)
    # advantages -2.1, 2.03, 2.1, -2.03 have mean 0 and squares summing to 17.0618
    std = math.sqrt(17.0618 / 3 + 1e-8)
    torch.testing.assert_close(shaped.advantages, torch.tensor([-2.1, 2.03, 2.1, -2.03]) / std)


def test_token_level_kl_advantages_are_reward_to_go_minus_the_leave_one_out_baseline():
    scores = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 7.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    shaped = rloo_shaped_rewards(scores, kl, torch.zeros(2, 3), mask,
                                 RLOOShaping(rloo_k=2, kl_coef=1.0, token_level_kl=True), repeated_layout_ids(2, 1))
    # per-token rewards: [-0.1, -0.2, -0.3 + 1.0] and [-0.4, -0.5 + 0.0, masked]; sums 0.4 and -0.9
    torch.testing.assert_close(shaped.rlhf_reward, torch.tensor([0.4, -0.9]))
    torch.testing.assert_close(shaped.non_score_reward, torch.tensor([-0.6, -0.9]))
    # reward-to-go [0.4, 0.5, 0.7] minus baseline -0.9; [-0.9, -0.5, 0] minus baseline 0.4 (masked stays 0)
    torch.testing.assert_close(shaped.advantages, torch.tensor([[1.3, 1.4, 1.6], [-1.3, -0.9, 0.0]]))


def test_whiten_with_a_mask_uses_only_real_entries():
    values = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    mask = torch.tensor([[True, True], [True, False]])
    # entries 1, 3, 5: mean 3, unbiased var 4 -> -1, 0, 1; the masked entry comes back as 0
    torch.testing.assert_close(whiten(values, mask), torch.tensor([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(whiten(values, mask, shift_mean=False), torch.tensor([[2.0, 3.0], [4.0, 0.0]]),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("k", [2, 4])
def test_advantages_sum_to_zero_per_prompt_with_every_option(k):
    torch.manual_seed(0)
    scores, kl = torch.randn(3 * k), torch.randn(3 * k, 5)
    mask = torch.ones(3 * k, 5, dtype=torch.bool)
    shaped = rloo_shaped_rewards(scores, kl, torch.zeros_like(kl), mask,
                                 RLOOShaping(rloo_k=k, kl_coef=0.2, normalize_reward=True, whiten_rewards=True),
                                 repeated_layout_ids(k, 3))
    torch.testing.assert_close(shaped.advantages.reshape(k, 3).sum(0), torch.zeros(3), atol=1e-5, rtol=0)
