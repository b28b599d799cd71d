"""The loss mask of a trajectory batch: tokens outside it (what an environment wrote between two replies) get no
gradient, enter no statistic, and PPO's GAE steps over them. Each check builds the same rows twice: once with two
such tokens in the middle of every completion, once without them; every number must agree."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from training_wizard.core.ppo import gae_advantages
from training_wizard.trainers.config.on_policy import GRPOConfig, PPOConfig, RLOOConfig
from training_wizard.trainers.algorithms.grpo import GRPOTrainer, grpo_loss
from training_wizard.trainers.loop.iteration_metrics import IterationMetrics
from training_wizard.trainers.algorithms.ppo import PPOTrainer, ppo_loss
from training_wizard.trainers.algorithms.rloo import RLOOTrainer, rloo_loss
from training_wizard.trainers.loop.update import PolicyForward, UpdateResult
from training_wizard.testing import build_causal_lm

from tests.helpers import prompts, x_share

AT, INSERTED = 2, 2  # two environment tokens after each completion's second token
WALL_CLOCK = ("eps", "tokens_per_s", "time/")


def insert(values: torch.Tensor, filler: float | int | bool) -> torch.Tensor:
    """(B, T) -> (B, T + INSERTED): `filler` columns at AT."""
    middle = torch.full((values.shape[0], INSERTED), filler, dtype=values.dtype)
    return torch.cat([values[:, :AT], middle, values[:, AT:]], dim=1)


def drop_inserted(values: torch.Tensor) -> torch.Tensor:
    return torch.cat([values[:, :AT], values[:, AT + INSERTED:]], dim=1)


def with_environment_tokens(batch):
    """The same rows with INSERTED environment tokens in the middle: real (completion mask) but not the policy's
    (loss mask); their logprobs and values are garbage the trainer must never read."""
    return dataclasses.replace(
        batch,
        completion_ids=insert(batch.completion_ids, 7), completion_mask=insert(batch.completion_mask, True),
        loss_mask=insert(batch.loss_mask, False), logprobs=insert(batch.logprobs, -40.0),
        ref_logprobs=insert(batch.ref_logprobs, 3.0),
        extras={name: insert(values, 1e3) for name, values in batch.extras.items()},
    )


def on_a_grid(batch):
    """The batch with every number a multiple of 1/16: sums of them are exact in any order, so the rows with and
    without the inserted tokens must give identical numbers, not merely close ones. Scores that differ within
    every group (the tiny model's own are mostly 0)."""
    def grid(values):
        return torch.round(values * 16) / 16

    return dataclasses.replace(batch, logprobs=grid(batch.logprobs), ref_logprobs=grid(batch.ref_logprobs),
                               scores=torch.tensor([(row * 5) % 7 / 8 for row in range(batch.num_rows)]),
                               extras={name: grid(values) for name, values in batch.extras.items()})


def make(kind: str, tokenizer, tmp_path, **overrides):
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, total_episodes=8, response_length=6,
                  num_sample_generations=0, seed=3)
    data = prompts(8)
    policy = build_causal_lm(tokenizer, seed=1)
    if kind == "rloo":
        return RLOOTrainer(config=RLOOConfig(**common, kl_coef=0.1, **overrides), tokenizer=tokenizer, policy=policy,
                           reward_model=x_share, train_dataset=data)
    if kind == "ppo":
        return PPOTrainer(config=PPOConfig(**common, kl_coef=0.1, **overrides), tokenizer=tokenizer, policy=policy,
                          reward_model=x_share, train_dataset=data)
    return GRPOTrainer(config=GRPOConfig(**common, num_generations=4, beta=0.1, **overrides), tokenizer=tokenizer,
                       policy=policy, reward_model=x_share, train_dataset=data)


def test_ppo_gae_steps_over_tokens_outside_the_loss_mask():
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False], [True, True, False, False, False]])
    compact_adv, compact_ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    adv, ret = gae_advantages(insert(rewards, 5.0), insert(values, -9.0), insert(mask, False), gamma=0.9, lam=0.8)
    assert torch.equal(drop_inserted(adv), compact_adv) and torch.equal(drop_inserted(ret), compact_ret)
    assert (adv[:, AT:AT + INSERTED] == 0).all() and (ret[:, AT:AT + INSERTED] == 0).all()


@pytest.mark.parametrize("kind,options", [("rloo", {}), ("rloo", {"token_level_kl": True}), ("ppo", {}),
                                          ("grpo", {}), ("grpo", {"loss_type": "grpo"})],
                         ids=["rloo", "rloo-token", "ppo", "grpo-dapo", "grpo-grpo"])
def test_environment_tokens_change_no_advantage_metric_or_loss(kind, options, tokenizer, tmp_path):
    trainer = make(kind, tokenizer, tmp_path, **options)
    compact = on_a_grid(trainer.collect_rollout())
    assert compact.loss_mask[:, :AT + 1].all()  # every row has tokens on both sides of the inserted ones
    mixed = with_environment_tokens(compact)

    # step 6: advantages, returns and the rollout's statistics
    compact_shaped, mixed_shaped = trainer.shape_rewards(compact), trainer.shape_rewards(mixed)
    for name, value in vars(compact_shaped).items():
        other = getattr(mixed_shaped, name)
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            if name != "ref_logprobs":  # GRPO's copy of the rollout's, for its KL term
                assert not other[:, AT:AT + INSERTED].any(), name
            other = drop_inserted(other)
        if isinstance(value, torch.Tensor):
            assert torch.equal(other, value), name

    # step 8: every logged statistic of the rollout
    def metrics(batch, shaped):
        logged = IterationMetrics.of(trainer, batch, shaped, UpdateResult(), eps=1.0, lr=0.0, update_seconds=0.0)
        return {k: v for k, v in logged.values.items() if not k.startswith(WALL_CLOCK)}

    assert metrics(mixed, mixed_shaped) == metrics(compact, compact_shaped)

    # step 7: the loss of the same logprobs, and no gradient on the environment's tokens
    index = torch.arange(compact.num_rows)
    results = []
    for batch, shaped, spread in ((compact, compact_shaped, lambda t: t), (mixed, mixed_shaped, insert_zero)):
        rows = batch.rows(index)
        width = rows.pop("width")
        shaped_rows = {name: value[index, :width] if value.dim() == 2 else value[index]
                       for name, value in vars(shaped).items() if isinstance(value, torch.Tensor)}
        logprobs = spread(compact.logprobs[:, :width - (INSERTED if batch is mixed else 0)] - 0.0625)
        logprobs = torch.where(rows["loss_mask"], logprobs, torch.full_like(logprobs, -30.0)).requires_grad_()
        entropy = torch.where(rows["loss_mask"], torch.ones_like(logprobs), torch.full_like(logprobs, 99.0))
        forward = PolicyForward(SimpleNamespace(logprobs=logprobs, entropy=entropy), rows["logprobs"], None)
        out = loss_of(kind, trainer, rows, shaped_rows, forward, logprobs)
        out.loss.backward()
        stats = {k: float(v) for k, v in out.stats.items()}
        results.append((float(out.loss.detach()), stats, logprobs.grad))
    (loss, stats, grad), (mixed_loss, mixed_stats, mixed_grad) = results
    assert mixed_loss == loss and mixed_stats == stats
    assert (mixed_grad[:, AT:AT + INSERTED] == 0).all()
    assert torch.equal(drop_inserted(mixed_grad), grad)
    assert grad.abs().sum() > 0  # the model's tokens did get a gradient


def insert_zero(values: torch.Tensor) -> torch.Tensor:
    return insert(values, 0.0)


def loss_of(kind, trainer, rows, shaped, forward, logprobs):
    if kind == "rloo":
        return rloo_loss(rows, shaped, forward, trainer.config)
    if kind == "ppo":
        # the value model's output: the rollout's values moved a little, garbage outside the loss mask
        values = torch.where(rows["loss_mask"], rows["values"] + 0.125, torch.full_like(rows["values"], 5e2))
        return ppo_loss(rows, shaped, forward, values, trainer.config)
    order = torch.arange(rows["loss_mask"].shape[0])
    totals = trainer.optimizer_step_totals(SimpleNamespace(loss_mask=shaped["loss_mask"], kept_rows=None), order)
    return grpo_loss(shaped, forward, totals[0], trainer.config, trainer.loss_options)


def test_group_statistics_follow_the_group_ids_not_the_row_order():
    """The same rows shuffled give the same advantages, shuffled: RLOO's leave-one-out baseline, GRPO's group
    advantages and dynamic sampling's constant groups find each prompt's rows by id."""
    from training_wizard.core.advantages import rloo_advantages
    from training_wizard.core.groups import group_members, repeated_layout_ids
    from training_wizard.core.grpo import constant_groups, group_advantages

    rewards = torch.tensor([0.5, 2.0, 1.0, 3.5, 2.0, 0.0, -1.0, 2.0, 1.5])  # 3 completions of 3 prompts
    ids = repeated_layout_ids(3, 3)
    order = torch.tensor([4, 0, 8, 2, 6, 1, 3, 7, 5])
    assert torch.equal(rloo_advantages(rewards[order], ids[order]), rloo_advantages(rewards, ids)[order])
    for scale in ("group", "batch", "none"):
        shuffled, zero = group_advantages(rewards[order], ids[order], scale)
        expected, expected_zero = group_advantages(rewards, ids, scale)
        assert torch.equal(shuffled, expected[order]) and torch.equal(zero, expected_zero[order])
    assert torch.equal(constant_groups(rewards[order], ids[order]), constant_groups(rewards, ids)[order])
    assert constant_groups(rewards, ids).tolist() == [False, True, False] * 3  # prompt 1 always scores 2
    with pytest.raises(ValueError, match="unequal size"):
        group_members(torch.tensor([0, 0, 1]))
