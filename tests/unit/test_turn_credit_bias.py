"""Monte-Carlo check that the per-turn advantages of core/turn_credit.py give an unbiased policy gradient when the
policy decides how many turns an episode lasts, and that whitening the returns per turn index over the episodes
that reached that turn (mean and std including the row itself) does not.

The toy environment: at most 3 turns; the state is the turn index k; a tabular softmax policy with logits
theta[k] picks one of STOP (the episode ends after this reply), GO (go on, no step reward) or WORK (go on, earning
a step reward). The last turn ends the episode whatever it picks. The exact gradient of the expected total return
(gamma = 1) comes from autograd on the expectation over every trajectory; the estimates are the score-function
sums sum_k grad log pi(a_k | k) A_k of each sampled episode, with the leave-one-out baseline, averaged over each
group of 4 (the groups are independent, the rows of a group are not).

Margins measured with seeds 0-4 (20,000 groups each; the test uses seed 0):
- "discounted_return": largest |error| 1.52-1.96 standard errors, chi-square 4.5-15.2;
- "turn_baseline": largest |error| 1.56-1.88 standard errors, chi-square 4.6-17.6;
  over seeds 0-19 the chi-squares average 6.3 and 6.4 (6 expected for 6 degrees of freedom), the largest |error|
  is 2.83 standard errors;
- per-turn whitening: largest |error| 174-178 standard errors; after the best rescaling c * exact (c = 0.445 to
  0.451, so not a mere change of step size) still 29.5-31.9 standard errors.
"""

import itertools

import pytest
import torch

from training_wizard.core.groups import from_grid, group_members, on_grid, repeated_layout_ids
from training_wizard.core.turn_credit import turn_advantages, turn_mask, turn_returns

STOP, GO, WORK = 0, 1, 2
TURNS, ACTIONS, GROUP_SIZE, GROUPS = 3, 3, 4, 20_000
THETA = torch.tensor([[0.0, 0.5, -0.5], [0.3, 0.0, 0.2], [0.0, -0.4, 0.4]], dtype=torch.float64)
STOP_REWARD = torch.tensor([1.0, 0.2, 3.0], dtype=torch.float64)  # reward of a reply that ends the episode at turn k
WORK_REWARD = torch.tensor([0.5, 0.5, 1.0], dtype=torch.float64)  # step reward of WORK at turn k


def step_reward(turn: int, action: torch.Tensor) -> torch.Tensor:
    """Reward of the reply at `turn` given its action (any shape, long); GO earns nothing."""
    rewards = torch.zeros(action.shape, dtype=torch.float64)
    rewards = torch.where(action == STOP, STOP_REWARD[turn], rewards)
    return torch.where(action == WORK, WORK_REWARD[turn], rewards)


def trajectories() -> list[tuple[int, ...]]:
    """Every action sequence: it ends at the first STOP or after the last turn."""
    found = []
    for length in range(1, TURNS + 1):
        for actions in itertools.product(range(ACTIONS), repeat=length):
            if STOP not in actions[:-1] and (actions[-1] == STOP or length == TURNS):
                found.append(actions)
    return found


def exact_gradient(theta: torch.Tensor) -> torch.Tensor:
    """(TURNS, ACTIONS) gradient of E[sum_k r_k] by autograd over the enumerated trajectories."""
    theta = theta.clone().requires_grad_(True)
    logp = theta.log_softmax(-1)
    expected = sum(
        torch.stack([logp[k, a] for k, a in enumerate(actions)]).sum().exp()
        * sum(step_reward(k, torch.tensor(a)) for k, a in enumerate(actions))
        for actions in trajectories()
    )
    (gradient,) = torch.autograd.grad(expected, theta)
    return gradient


def sample_episodes(theta: torch.Tensor, rows: int, seed: int):
    """(actions (B, K) long, turn rewards (B, K), turn counts (B,)) of `rows` episodes sampled with one seed."""
    uniforms = torch.rand(rows, TURNS, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    cdf = theta.softmax(-1).cumsum(-1)
    actions = (uniforms[:, :, None] > cdf[None, :, :]).sum(-1).clamp(max=ACTIONS - 1)
    stops = (actions == STOP).long()
    # the episode lasts up to and including its first STOP, or every turn
    counts = torch.where(stops.any(1), stops.argmax(1) + 1, torch.full_like(stops[:, 0], TURNS))
    rewards = torch.stack([step_reward(k, actions[:, k]) for k in range(TURNS)], 1)
    valid = turn_mask(counts, TURNS)
    return actions, torch.where(valid, rewards, torch.zeros_like(rewards)), counts


def per_turn_whitened(returns: torch.Tensor, counts: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """The biased variant: at each turn index, G_{i,k} whitened over the group's episodes that reached turn k
    (mean and unbiased std including row i; 0 where fewer than two reached it), as a per-turn GRPO would."""
    members = group_members(group_ids)
    reached = on_grid(turn_mask(counts, TURNS), members)  # (group_size, G, K)
    values = torch.where(reached, on_grid(returns, members), torch.zeros_like(returns[0]))
    number = reached.sum(0, keepdim=True)
    mean = values.sum(0, keepdim=True) / number.clamp(min=1)
    spread = torch.where(reached, values - mean, torch.zeros_like(values))
    std = (spread.pow(2).sum(0, keepdim=True) / (number - 1).clamp(min=1)).sqrt()
    whitened = torch.where(reached & (number > 1), spread / (std + 1e-4), torch.zeros_like(spread))
    return torch.stack([from_grid(whitened[..., k], members) for k in range(TURNS)], 1)


def group_estimates(theta: torch.Tensor, actions, counts, advantages, group_ids) -> torch.Tensor:
    """(G, TURNS * (ACTIONS - 1)) mean over each group of sum_k grad log pi(a_k | k) A_k. The score of a softmax,
    onehot(a) - pi, sums to 0 over the actions of a turn, so the last action's component is left out (it is minus
    the others' sum) and the covariance is full rank."""
    scores = torch.nn.functional.one_hot(actions, ACTIONS).double() - theta.softmax(-1)[None]
    scores = scores * turn_mask(counts, TURNS)[:, :, None]
    per_row = (scores * advantages[:, :, None])[:, :, : ACTIONS - 1].reshape(len(actions), -1)
    return on_grid(per_row, group_members(group_ids)).mean(0)


def deviation(estimates: torch.Tensor, exact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(mean estimate, its error in standard errors per component, chi-square of the error under the estimates'
    covariance)."""
    mean = estimates.mean(0)
    covariance = torch.cov(estimates.T) / len(estimates)
    error = mean - exact[:, : ACTIONS - 1].reshape(-1)
    chi_square = float(error @ torch.linalg.solve(covariance, error))
    return mean, error / covariance.diagonal().sqrt(), chi_square


SEED = 0
# P(chi-square with 6 degrees of freedom > 27.86) = 1e-4: an unbiased estimator exceeds it once in 10,000 seeds
CHI_SQUARE_BOUND = 27.86


def sampled(seed: int = SEED):
    """(actions, counts, turn rewards, group ids, exact gradient) of GROUPS groups of GROUP_SIZE episodes."""
    actions, rewards, counts = sample_episodes(THETA, GROUP_SIZE * GROUPS, seed)
    return actions, counts, rewards, repeated_layout_ids(GROUP_SIZE, GROUPS), exact_gradient(THETA)


def test_the_toy_lets_the_policy_choose_the_episode_length():
    probabilities = [THETA.softmax(-1)[range(len(a)), list(a)].prod() for a in trajectories()]
    assert abs(float(sum(probabilities)) - 1.0) < 1e-12
    _, counts, _, _, _ = sampled()
    assert set(counts.tolist()) == {1, 2, 3}


@pytest.mark.parametrize("mode", ["discounted_return", "turn_baseline"])
def test_per_turn_advantages_give_an_unbiased_gradient(mode):
    actions, counts, rewards, group_ids, exact = sampled()
    advantages = turn_advantages(mode, rewards, counts, group_ids, gamma=1.0)
    _, errors, chi_square = deviation(group_estimates(THETA, actions, counts, advantages, group_ids), exact)
    assert errors.abs().max() < 4, errors
    assert chi_square < CHI_SQUARE_BOUND


def test_whitening_per_turn_over_the_episodes_that_reached_it_is_biased():
    actions, counts, rewards, group_ids, exact = sampled()
    advantages = per_turn_whitened(turn_returns(rewards, counts, 1.0), counts, group_ids)
    estimates = group_estimates(THETA, actions, counts, advantages, group_ids)
    mean, errors, _ = deviation(estimates, exact)
    assert errors.abs().max() > 10, errors
    # not a mere change of scale either: the best multiple of the exact gradient is still far off
    flat = exact[:, : ACTIONS - 1].reshape(-1)
    scaled = (mean @ flat) / (flat @ flat) * flat
    standard_errors = (estimates.var(0) / len(estimates)).sqrt()
    assert ((mean - scaled) / standard_errors).abs().max() > 10
