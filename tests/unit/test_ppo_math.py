"""PPO math (core/ppo.py) against numbers worked out by hand."""

import torch

from training_wizard.core.advantages import reward_to_go
from training_wizard.core.ppo import PPOShaping, clipped_value_loss, gae_advantages, ppo_shaped_rewards

ALL = torch.ones(1, 3, dtype=torch.bool)


def test_three_token_gae_gamma_one():
    rewards, values = torch.tensor([[0.1, -0.2, 1.0]]), torch.tensor([[0.5, 0.4, 0.3]])
    advantages, returns = gae_advantages(rewards, values, ALL, gamma=1.0, lam=0.95)
    # delta_2 = 1.0 - 0.3 = 0.7               A_2 = 0.7
    # delta_1 = -0.2 + 0.3 - 0.4 = -0.3       A_1 = -0.3 + 0.95 * 0.7 = 0.365
    # delta_0 = 0.1 + 0.4 - 0.5 = 0.0         A_0 = 0.95 * 0.365 = 0.34675
    torch.testing.assert_close(advantages, torch.tensor([[0.34675, 0.365, 0.7]]))
    torch.testing.assert_close(returns, torch.tensor([[0.84675, 0.765, 1.0]]))


def test_three_token_gae_with_discount():
    rewards, values = torch.tensor([[0.1, -0.2, 1.0]]), torch.tensor([[0.5, 0.4, 0.3]])
    advantages, returns = gae_advantages(rewards, values, ALL, gamma=0.9, lam=0.5)
    # delta_2 = 0.7; delta_1 = -0.2 + 0.9 * 0.3 - 0.4 = -0.33; delta_0 = 0.1 + 0.9 * 0.4 - 0.5 = -0.04
    # A_2 = 0.7; A_1 = -0.33 + 0.45 * 0.7 = -0.015; A_0 = -0.04 + 0.45 * -0.015 = -0.04675
    torch.testing.assert_close(advantages, torch.tensor([[-0.04675, -0.015, 0.7]]))
    torch.testing.assert_close(returns, torch.tensor([[0.45325, 0.385, 1.0]]))


def test_nothing_after_the_stop_token_gets_advantage_or_return():
    mask = torch.tensor([[True, True, False, False]])  # the stop token at position 1
    rewards, values = torch.tensor([[0.1, 1.0, 5.0, 5.0]]), torch.tensor([[0.5, 0.4, 9.0, 9.0]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.95)
    # the episode ends at position 1: delta_1 = 1.0 - 0.4 = 0.6, delta_0 = 0.1 + 0.4 - 0.5 = 0, A_0 = 0.95 * 0.6
    torch.testing.assert_close(advantages, torch.tensor([[0.57, 0.6, 0.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.07, 1.0, 0.0, 0.0]]))
    changed = gae_advantages(torch.tensor([[0.1, 1.0, -7.0, 3.0]]), torch.tensor([[0.5, 0.4, 2.0, -1.0]]), mask, 1.0, 0.95)
    torch.testing.assert_close(changed[0], advantages)  # masked rewards and values change nothing
    torch.testing.assert_close(changed[1], returns)


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    torch.manual_seed(0)
    rewards, values = torch.randn(4, 6), torch.randn(4, 6)
    mask = torch.arange(6).expand(4, 6) < torch.tensor([[6], [3], [1], [5]])
    advantages, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(advantages, (reward_to_go(rewards, mask) - values) * mask)


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 2.0, 50.0]], requires_grad=True)
    old, returns = torch.tensor([[0.8, 1.0, 0.0]]), torch.tensor([[1.5, 3.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    loss, clipfrac = clipped_value_loss(values, old, returns, mask, cliprange_value=0.2)
    # token 0: V - V_old = 0.2 (within the range): both branches (1.0 - 1.5)^2 = 0.25, not clipped
    # token 1: clipped V = 1.2: (2 - 3)^2 = 1 < (1.2 - 3)^2 = 3.24, clipped branch taken
    # loss = 0.5 * (0.25 + 3.24) / 2 = 0.8725; clipfrac = 1 / 2; the masked token counts for nothing
    torch.testing.assert_close(loss, torch.tensor(0.8725))
    torch.testing.assert_close(clipfrac, torch.tensor(0.5))
    loss.backward()
    # d/dV of 0.5 * mean: token 0 -> 0.5 * 2 * (1 - 1.5) / 2 = -0.25; token 1 clipped (flat in V) -> 0; masked -> 0
    torch.testing.assert_close(values.grad, torch.tensor([[-0.25, 0.0, 0.0]]))


def test_shaped_rewards_put_the_score_on_the_last_token_and_whiten_advantages():
    scores = torch.tensor([2.0, -1.0])
    logprobs = torch.tensor([[-1.0, -2.0, -1.5], [-0.5, -0.5, -9.0]])
    ref = torch.tensor([[-1.5, -2.0, -1.0], [-1.0, -0.5, 0.0]])  # kl = [0.5, 0, -0.5], [0.5, 0, masked]
    mask = torch.tensor([[True, True, True], [True, True, False]])
    values = torch.zeros(2, 3)
    shaped = ppo_shaped_rewards(scores, logprobs, ref, values, mask, PPOShaping(kl_coef=0.2, gamma=1.0, lam=1.0))
    # per-token rewards: [-0.1, 0, 0.1 + 2.0], [-0.1, 0 - 1.0, 0]; with V = 0 and gamma = lam = 1 returns are the
    # rewards-to-go: [2.0, 2.1, 2.1] and [-1.1, -1.0, 0]
    torch.testing.assert_close(shaped.returns, torch.tensor([[2.0, 2.1, 2.1], [-1.1, -1.0, 0.0]]))
    torch.testing.assert_close(shaped.kl, torch.tensor([0.0, 0.5]))
    torch.testing.assert_close(shaped.non_score_reward, torch.tensor([0.0, -0.1]))
    torch.testing.assert_close(shaped.rlhf_reward, torch.tensor([2.0, -1.1]))
    real = shaped.advantages[mask]
    torch.testing.assert_close(real.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(real.std(), torch.tensor(1.0), atol=1e-4, rtol=0)
    assert shaped.advantages[1, 2] == 0


def test_whiten_rewards_keeps_the_mean_of_the_real_token_rewards():
    scores = torch.tensor([3.0, 1.0])
    zeros = torch.zeros(2, 2)
    mask = torch.tensor([[True, True], [True, False]])
    shaped = ppo_shaped_rewards(scores, zeros, zeros, zeros, mask,
                                PPOShaping(kl_coef=0.0, gamma=1.0, lam=1.0, whiten_rewards=True))
    # real token rewards 0, 3, 1: mean 4/3, unbiased var 7/3; whitened with the mean added back
    std = (7 / 3 + 1e-8) ** 0.5
    expected = [[(0 - 4 / 3) / std + 4 / 3, (3 - 4 / 3) / std + 4 / 3], [(1 - 4 / 3) / std + 4 / 3, 0.0]]
    first = torch.tensor(expected)
    torch.testing.assert_close(shaped.returns, torch.stack([first[0].flip(0).cumsum(0).flip(0), first[1]]))
