"""The one-step-off-policy schedule (async_rollouts, trainers/async_rollouts.py): a bound of 0 is the synchronous
run exactly, the schedule is deterministic for a seed, each batch after the first was sampled by the weights one
update older, and the update corrects it with exp(current - behaviour) logprobs, truncated."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import make_grpo_trainer, make_rloo_trainer
from training_wizard.tracking.metrics import read_metrics

OPTIONS = dict(total_episodes=16 * 4, num_ppo_epochs=2, num_mini_batches=2, seed=5)  # 4 iterations


def run(make, tokenizer, folder, **options):
    trainer = make(tokenizer, folder, **{**OPTIONS, **options})
    trainer.train()
    return trainer, read_metrics(folder)


@pytest.mark.parametrize("make", [make_rloo_trainer, make_grpo_trainer], ids=["rloo", "grpo"])
def test_a_staleness_bound_of_zero_is_the_synchronous_run_exactly(make, tokenizer, tmp_path):
    sync, sync_metrics = run(make, tokenizer, tmp_path / "sync")
    bound_zero, zero_metrics = run(make, tokenizer, tmp_path / "zero", async_rollouts=True, max_staleness=0)
    strip = [{k: v for k, v in record.items() if not k.startswith(("time/", "eps", "tokens_per_s", "sample/"))}
             for record in sync_metrics + zero_metrics]
    assert strip[: len(sync_metrics)] == strip[len(sync_metrics):]
    ours, theirs = bound_zero.unwrapped_policy.state_dict(), sync.unwrapped_policy.state_dict()
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def comparable(records):
    return [{k: v for k, v in record.items() if not k.startswith(("time/", "eps", "tokens_per_s"))}
            for record in records]


def test_the_one_step_off_schedule_is_deterministic_and_one_update_stale(tokenizer, tmp_path):
    _, first = run(make_rloo_trainer, tokenizer, tmp_path / "a", async_rollouts=True)
    _, second = run(make_rloo_trainer, tokenizer, tmp_path / "b", async_rollouts=True)
    _, sync = run(make_rloo_trainer, tokenizer, tmp_path / "sync")
    assert comparable(first) == comparable(second)
    assert [(r["sample/staleness_mean"], r["sample/staleness_max"]) for r in first] == [
        (0.0, 0.0), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0)]
    # the first batch is the synchronous run's; from the second on, batches come from older weights
    assert first[0]["objective/rlhf_reward"] == sync[0]["objective/rlhf_reward"]
    assert first[1]["objective/rlhf_reward"] != sync[1]["objective/rlhf_reward"]
    # a stale batch is corrected: its weights are logged, and are not all 1
    assert "sampling/importance_sampling_ratio/mean" not in first[0]
    assert first[1]["sampling/importance_sampling_ratio/mean"] != 1.0


def test_a_stale_batch_holds_the_behaviour_and_current_logprobs_and_is_weighted_by_their_ratio(tokenizer,
                                                                                                tmp_path):
    trainer = make_rloo_trainer(tokenizer, tmp_path, **{**OPTIONS, "total_episodes": 32}, async_rollouts=True)
    initial = copy.deepcopy(trainer.unwrapped_policy)
    seen = []
    update = trainer._update

    def record(rollout, shaped):
        seen.append((rollout, copy.deepcopy(trainer.unwrapped_policy)))
        return update(rollout, shaped)

    trainer._update = record
    trainer.train()
    (first, _), (stale, current) = seen
    assert first.sampling_logprobs is None and stale.sampling_logprobs is not None
    collector = trainer.collector

    def logprobs(model):
        with torch.no_grad():
            return collector._logprobs(model, stale.prompt_ids, stale.prompt_mask, stale.completion_ids,
                                       stale.completion_mask)

    mask = stale.loss_mask
    # behaviour: the weights before the first update sampled it; the ratio's old side: the weights it trains
    torch.testing.assert_close(stale.sampling_logprobs[mask], logprobs(initial)[mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(stale.logprobs[mask], logprobs(current)[mask], rtol=0, atol=1e-6)
    assert (stale.sampling_logprobs[~mask] == 0).all()
    weights = trainer._correction_weights(stale.logprobs, stale.sampling_logprobs, mask)
    # the default mode, sequence_mask with an upper bound of 3 (TRL's): one weight per completion, exp of the summed
    # log-ratio over its sampled tokens, 0 where it is above the bound
    ratio = torch.exp(((stale.logprobs - stale.sampling_logprobs) * mask).sum(-1))
    by_hand = torch.where(ratio <= 3.0, ratio, torch.zeros_like(ratio))
    torch.testing.assert_close(weights.sequence, by_hand, rtol=1e-5, atol=0)
    torch.testing.assert_close(weights.token, by_hand.unsqueeze(-1) * mask, rtol=1e-5, atol=0)
    assert not torch.allclose(by_hand, torch.ones_like(by_hand))


def test_bounds_above_one_are_refused_with_one_line():
    from training_wizard import RLOOConfig

    with pytest.raises(ValueError, match=r"max_staleness = 2: only 0 \(synchronous\) and 1 \(one-step-off\)"):
        RLOOConfig(async_rollouts=True, max_staleness=2)
