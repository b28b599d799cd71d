"""A completion every reward function in TRL's form returned None for: left out of its group's baseline and
standard deviation with advantage 0, and out of the logged score means, as TRL 1.16's GRPO and RLOO trainers
treat it (nanmean / nanstd, leave-one-out over the scored siblings)."""

from __future__ import annotations

import math
import statistics
import sys
import types

import pytest
import torch

from training_wizard.core.advantages import RLOOShaping, rloo_advantages, rloo_shaped_rewards, scored_rows
from training_wizard.core.grpo import constant_groups, group_advantages

NAN = math.nan
ONE_GROUP = torch.zeros(4, dtype=torch.long)
LAST_UNSCORED = torch.tensor([True, True, True, False])


def test_a_row_is_unscored_when_every_component_is_nan():
    components = {"a": [1.0, NAN, NAN], "b": [NAN, 2.0, NAN]}
    assert scored_rows(components, 3).tolist() == [True, True, False]
    assert scored_rows({}, 2).tolist() == [True, True]  # a reward model or a plain function scores every row


def test_grpo_group_statistics_leave_the_unscored_row_out():
    rewards = torch.tensor([1.0, 2.0, 4.0, 0.0])
    advantages, std_is_zero = group_advantages(rewards, ONE_GROUP, "group", scored=LAST_UNSCORED)
    mean, std = 7 / 3, math.sqrt(7 / 3)  # of 1, 2, 4; unbiased: ((4/3)^2 + (1/3)^2 + (5/3)^2) / 2 = 7/3
    expected = [(r - mean) / (std + 1e-4) for r in (1.0, 2.0, 4.0)] + [0.0]
    assert advantages.tolist() == pytest.approx(expected, rel=1e-6)
    assert advantages[3].item() == 0.0 and not std_is_zero.any()
    centred, _ = group_advantages(rewards, ONE_GROUP, "none", scored=LAST_UNSCORED)
    assert centred.tolist() == pytest.approx([1 - mean, 2 - mean, 4 - mean, 0.0])


def test_grpo_batch_scale_uses_the_scored_rows_only():
    rewards = torch.tensor([1.0, 2.0, 4.0, 0.0, 3.0, 5.0, 0.0, 0.0])
    scored = torch.tensor([True, True, True, False, True, True, False, False])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    advantages, _ = group_advantages(rewards, group_ids, "batch", scored=scored)
    std = statistics.stdev([1.0, 2.0, 4.0, 3.0, 5.0])
    expected = [(r - 7 / 3) / (std + 1e-4) for r in (1.0, 2.0, 4.0)] + [0.0, -1 / (std + 1e-4), 1 / (std + 1e-4)]
    assert advantages.tolist() == pytest.approx(expected + [0.0, 0.0], rel=1e-6)


def test_a_grpo_group_with_one_scored_row_has_no_std_and_zero_advantages():
    advantages, std_is_zero = group_advantages(torch.tensor([3.0, 0.0, 0.0, 0.0]), ONE_GROUP,
                                               scored=torch.tensor([True, False, False, False]))
    assert advantages.tolist() == [0.0] * 4
    assert not std_is_zero.any()  # TRL's nanstd of one value is NaN, not 0


def test_dynamic_sampling_compares_the_scored_rows_only():
    rewards = torch.tensor([2.0, 2.0, 2.0, 0.0, 1.0, 2.0, 2.0, 0.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    scored = torch.tensor([True, True, True, False, True, True, True, False])
    assert constant_groups(rewards, group_ids, scored).tolist() == [True] * 4 + [False] * 4
    assert not constant_groups(rewards, group_ids).any()  # the unscored 0 made group 0 look varied


def test_rloo_leave_one_out_over_the_scored_siblings():
    advantages = rloo_advantages(torch.tensor([1.0, 2.0, 4.0, 0.0]), ONE_GROUP, LAST_UNSCORED)
    # baselines: (2 + 4) / 2, (1 + 4) / 2, (1 + 2) / 2; the unscored row 0
    assert advantages.tolist() == pytest.approx([1 - 3.0, 2 - 2.5, 4 - 1.5, 0.0])
    alone = rloo_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), torch.tensor([True, False]))
    assert alone.tolist() == [0.0, 0.0]  # no scored sibling: TRL's 0 / 0, zeroed


def shaped(scores, options, scored, width=3):
    logprobs = torch.linspace(-1.0, -0.2, scores.numel() * width).reshape(-1, width)
    mask = torch.ones_like(logprobs, dtype=torch.bool)
    return rloo_shaped_rewards(scores, logprobs, logprobs - 0.1, mask, options, ONE_GROUP, scored=scored)


@pytest.mark.parametrize("token_level_kl", [False, True])
def test_rloo_shaping_gives_the_unscored_row_zero_advantage(token_level_kl):
    options = RLOOShaping(rloo_k=4, kl_coef=0.05, token_level_kl=token_level_kl, normalize_advantage=True,
                          whiten_rewards=True)
    out = shaped(torch.tensor([1.0, 2.0, 4.0, 0.0]), options, LAST_UNSCORED)
    assert (out.advantages[3] == 0).all() and out.scored.tolist() == LAST_UNSCORED.tolist()
    scored_part = out.advantages[:3]
    assert scored_part.mean().item() == pytest.approx(0.0, abs=1e-5)  # whitened over the scored rows alone
    assert scored_part.reshape(-1).std().item() == pytest.approx(1.0, rel=1e-3)


def test_a_nan_from_a_broken_reward_still_reaches_the_guard():
    rewards = torch.tensor([NAN, 2.0, 4.0, 0.0])
    assert group_advantages(rewards, ONE_GROUP, scored=LAST_UNSCORED)[0][:3].isnan().all()
    assert rloo_advantages(rewards, ONE_GROUP, LAST_UNSCORED)[1:3].isnan().all()


RETURNED: list[list] = []


def first_unscored(prompts, completions, **columns):
    values = [None if row == 0 else float(len(text) % 7) for row, text in enumerate(completions)]
    RETURNED.append(values)
    return values


def first_unscored_too(prompts, completions, **columns):
    return [None if row == 0 else 1.0 for row in range(len(completions))]


@pytest.fixture
def rewards_module(monkeypatch):
    module = types.ModuleType("tw_unscored_rewards")
    module.first_unscored, module.first_unscored_too = first_unscored, first_unscored_too
    monkeypatch.setitem(sys.modules, module.__name__, module)
    RETURNED.clear()


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_an_all_none_row_gets_advantage_zero_and_leaves_the_score_means(tmp_path, rewards_module, algorithm):
    from training_wizard import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
    from training_wizard.specs.reward_functions import RewardFunctionsSpec
    from training_wizard.testing import build_causal_lm, build_tokenizer
    from training_wizard.tracking.metrics import read_metrics

    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=4, response_length=5,
                  num_sample_generations=0)
    if algorithm == "grpo":
        trainer_class, config = GRPOTrainer, GRPOConfig(**common, num_generations=4)
    else:
        trainer_class, config = RLOOTrainer, RLOOConfig(**common, rloo_k=4)
    spec = RewardFunctionsSpec(reward_funcs=["tw_unscored_rewards:first_unscored",
                                             "tw_unscored_rewards:first_unscored_too"], reward_weights=[1.0, 0.0])
    tokenizer = build_tokenizer()
    trainer = trainer_class(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer),
                            reward_model=spec, train_dataset=[{"prompt": "Say 1."}])
    trainer.train()
    logged = read_metrics(tmp_path)[0]
    scored_values = RETURNED[0][1:]
    assert statistics.mean(scored_values) != 0  # counted as 0, the unscored row would pull the mean down
    assert logged["objective/scores"] == pytest.approx(statistics.mean(scored_values))
    assert logged["reward"] == pytest.approx(statistics.mean(scored_values))
    assert logged["reward_std"] == pytest.approx(statistics.stdev(scored_values))
    assert logged["frac_reward_all_none"] == 0.25
    out = trainer.shape_rewards(trainer.collect_rollout())
    assert out.scored.tolist() == [False, True, True, True]
    assert out.advantages[0].item() == 0.0


@pytest.mark.parametrize("token_level_kl", [False, True])
def test_rloo_normalize_advantage_leaves_a_lone_scored_row_out(token_level_kl):
    """TRL 1.16 whitens with nanmean / nanstd after a lone scored row's 0 / 0 baseline made its advantage NaN."""
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    scored = torch.tensor([True, True, True, False, True, False, False, False])
    scores = torch.tensor([2.0, 0.0, 1.0, 0.0, 5.0, 0.0, 0.0, 0.0])
    options = RLOOShaping(rloo_k=4, kl_coef=0.0, token_level_kl=token_level_kl, normalize_advantage=True)
    logprobs = torch.zeros(8, 3)
    out = rloo_shaped_rewards(scores, logprobs, logprobs, torch.ones(8, 3, dtype=torch.bool), options, group_ids,
                              scored=scored)
    # leave-one-out advantages 2 - 1/2, 0 - 3/2, 1 - 1, once per token: unbiased variance 2.25 per row, 27/16 per token
    std = math.sqrt(27 / 16) if token_level_kl else 1.5
    expected = torch.tensor([1.5 / std, -1.5 / std, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    advantages = out.advantages if not token_level_kl else out.advantages.mean(-1)
    assert advantages.tolist() == pytest.approx(expected.tolist(), rel=1e-6)
    if token_level_kl:
        assert (out.advantages == out.advantages[:, :1]).all()  # no KL: every token carries the row's advantage
        with_kl = rloo_shaped_rewards(scores, torch.linspace(-1.0, -0.2, 24).reshape(8, 3), logprobs,
                                      torch.ones(8, 3, dtype=torch.bool), RLOOShaping(4, 0.05, token_level_kl=True),
                                      group_ids, scored=scored)
        assert (with_kl.advantages[3:] == 0).all() and (with_kl.advantages[:3] != 0).any()  # KL parts zeroed too
