"""core/turn_credit.py: hand-computed returns and advantages per turn, and the case where per-turn credit is
today's episode credit (gamma = 1, one reward at the end)."""

import pytest
import torch

from training_wizard.core.advantages import rloo_advantages
from training_wizard.core.groups import from_grid, group_members, on_grid, repeated_layout_ids
from training_wizard.core.turn_credit import token_advantages, turn_advantages, turn_end_rewards, turn_returns

# Two groups of three episodes (layout (3, 2): group 0 = rows 0, 2, 4; group 1 = rows 1, 3, 5) of 1 to 3 turns.
# The 9s stand beyond each episode's last turn and must be ignored.
REWARDS = torch.tensor([[1.0, 0.0, 2.0], [4.0, 9.0, 9.0], [3.0, 9.0, 9.0], [0.0, 2.0, 9.0], [2.0, -2.0, 9.0],
                        [1.0, 1.0, 1.0]])
COUNTS = torch.tensor([3, 1, 1, 2, 2, 3])
GROUPS = repeated_layout_ids(3, 2)


def test_turn_returns_by_hand():
    undiscounted = torch.tensor([[3.0, 2, 2], [4, 0, 0], [3, 0, 0], [2, 2, 0], [0, -2, 0], [3, 2, 1]])
    torch.testing.assert_close(turn_returns(REWARDS, COUNTS, 1.0), undiscounted)
    # gamma 0.5: row 0 = [1 + 0.5 * (0 + 0.5 * 2), 0 + 0.5 * 2, 2]
    halved = torch.tensor([[1.5, 1, 2], [4, 0, 0], [3, 0, 0], [1, 2, 0], [1, -2, 0], [1.75, 1.5, 1]])
    torch.testing.assert_close(turn_returns(REWARDS, COUNTS, 0.5), halved)
    # gamma 0: each turn keeps its own reward
    torch.testing.assert_close(turn_returns(REWARDS, COUNTS, 0.0), REWARDS * (REWARDS != 9))


def test_discounted_return_advantages_by_hand():
    # gamma 0.5, G_{.,0}: group 0 = (1.5, 3, 1), group 1 = (4, 1, 1.75); baselines: the other two rows' mean
    expected = torch.tensor([[1.5 - 2, 1 - 2, 2 - 2], [4 - 1.375, 0, 0], [3 - 1.25, 0, 0], [1 - 2.875, 2 - 2.875, 0],
                             [1 - 2.25, -2 - 2.25, 0], [1.75 - 2.5, 1.5 - 2.5, 1 - 2.5]])
    torch.testing.assert_close(turn_advantages("discounted_return", REWARDS, COUNTS, GROUPS, 0.5), expected)


def test_turn_baseline_advantages_by_hand():
    # gamma 1; the returns compared at turn k, G_{j,min(k, n_j - 1)}: group 0 rows (3, 2, 2), (3, 3, 3), (0, -2, -2);
    # group 1 rows (4, 4, 4), (2, 2, 2), (3, 2, 1)
    expected = torch.tensor([[3 - 1.5, 2 - 0.5, 2 - 0.5], [4 - 2.5, 0, 0], [3 - 1.5, 0, 0], [2 - 3.5, 2 - 3, 0],
                             [0 - 3, -2 - 2.5, 0], [3 - 3, 2 - 3, 1 - 3]])
    loo = turn_advantages("turn_baseline", REWARDS, COUNTS, GROUPS, 1.0)
    torch.testing.assert_close(loo, expected)
    # with the group mean (row i included) every advantage is (k - 1) / k of the leave-one-out one, k = 3
    group_mean = turn_advantages("turn_baseline", REWARDS, COUNTS, GROUPS, 1.0, baseline="group_mean")
    assert group_mean[0, 0].item() == pytest.approx(3 - (3 + 3 + 0) / 3)
    torch.testing.assert_close(group_mean, loo * 2 / 3)


def test_token_advantages_by_hand():
    per_turn = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 0.0]])
    turn_index = torch.tensor([[0, 0, -1, 1, 1, -1, 2, -1], [0, 0, 0, -1, -1, -1, -1, -1]])
    expected = torch.tensor([[1.0, 1, 0, 2, 2, 0, 3, 0], [-1.0, -1, -1, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(token_advantages(per_turn, turn_index), expected)


def test_turn_end_rewards_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 4.0], [3.0, 9.0, 9.0]])
    last_token = torch.tensor([[1, 3, 5], [2, -1, -1]])
    placed = turn_end_rewards(rewards, last_token, torch.tensor([3, 1]), width=6)
    torch.testing.assert_close(placed, torch.tensor([[0.0, 1, 0, 2, 0, 4], [0.0, 0, 3, 0, 0, 0]]))


def episodes_with_one_reward_at_the_end(rows: int, width: int, seed: int):
    """(scores, turn rewards, turn counts, turn index) of random episodes of 1-3 turns whose only reward is the
    score, on the last turn; the turns' tokens are separated by environment tokens and followed by padding."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, generator=generator)
    counts = torch.randint(1, 4, (rows,), generator=generator)
    rewards = torch.zeros(rows, 3)
    rewards[torch.arange(rows), counts - 1] = scores
    turn_index = torch.full((rows, width), -1)
    for row, turns in enumerate(counts.tolist()):
        start = 0
        for turn in range(turns):
            length = int(torch.randint(1, 4, (), generator=generator))
            turn_index[row, start : start + length] = turn
            start += length + 2  # two environment tokens after each reply
    return scores, rewards, counts, turn_index


@pytest.mark.parametrize("mode", ["discounted_return", "turn_baseline"])
@pytest.mark.parametrize("baseline", ["leave_one_out", "group_mean"])
def test_one_reward_at_the_end_with_gamma_1_is_todays_episode_credit(mode, baseline):
    group_ids = repeated_layout_ids(4, 5)
    scores, rewards, counts, turn_index = episodes_with_one_reward_at_the_end(20, 16, seed=3)
    if baseline == "leave_one_out":
        today = rloo_advantages(scores, group_ids)
    else:
        members = group_members(group_ids)
        grid = on_grid(scores, members)
        today = from_grid(grid - grid.mean(0, keepdim=True), members)
    per_turn = turn_advantages(mode, rewards, counts, group_ids, 1.0, baseline=baseline)
    expected = torch.where(turn_index >= 0, today[:, None].expand_as(turn_index), torch.zeros(()))
    torch.testing.assert_close(token_advantages(per_turn, turn_index), expected, atol=1e-6, rtol=0)


def test_refused_modes_and_baselines():
    with pytest.raises(ValueError, match="'episode'"):
        turn_advantages("episode", REWARDS, COUNTS, GROUPS, 1.0)
    with pytest.raises(ValueError, match="'gae'"):
        turn_advantages("gae", REWARDS, COUNTS, GROUPS, 1.0)
    with pytest.raises(ValueError, match="baseline"):
        turn_advantages("turn_baseline", REWARDS, COUNTS, GROUPS, 1.0, baseline="batch")
    with pytest.raises(ValueError, match="at least 2"):
        turn_advantages("turn_baseline", REWARDS, COUNTS, torch.arange(6), 1.0)
