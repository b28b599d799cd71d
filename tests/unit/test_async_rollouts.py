"""The one-step-off-policy schedule (async_rollouts, rollout/asynchronous.py): a bound of 0 is the synchronous
run exactly, the schedule is deterministic for a seed, each batch after the first was sampled by the weights one
update older, and the update corrects it with exp(current - behaviour) logprobs, truncated per token."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import threading

import pytest
import torch

from tests.helpers import make_grpo_trainer, make_ppo_trainer, make_rloo_trainer
from training_wizard.errors import UserError
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
    return [{k: v for k, v in record.items() if not k.startswith(("time/", "eps", "tokens_per_s", "async/"))}
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

    def record(rollout, shaped, off_policy):
        seen.append((rollout, copy.deepcopy(trainer.unwrapped_policy)))
        return update(rollout, shaped, off_policy)

    trainer._update = record
    trainer.train()
    (first, _), (stale, current) = seen
    assert first.sampling_logprobs is None and stale.sampling_logprobs is not None
    collector = trainer.collector

    def logprobs(model):
        with torch.no_grad():
            return collector.logprobs_of(model, stale.prompt_ids, stale.prompt_mask, stale.completion_ids,
                                         stale.completion_mask)

    mask = stale.loss_mask
    # behaviour: the weights before the first update sampled it; the ratio's old side: the weights it trains
    torch.testing.assert_close(stale.sampling_logprobs[mask], logprobs(initial)[mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(stale.logprobs[mask], logprobs(current)[mask], rtol=0, atol=1e-6)
    assert (stale.sampling_logprobs[~mask] == 0).all()
    weights = trainer.correction_weights(stale.logprobs, stale.sampling_logprobs, mask)
    # the default rule, token_truncate at TRL's cap of 3: each token's ratio, lowered to 3 where above; a completion
    # (RLOO's sequence loss) weighs the product of its tokens' weights, lowered to 3 where above
    ratio = torch.exp((stale.logprobs - stale.sampling_logprobs) * mask).clamp(max=3.0) * mask
    torch.testing.assert_close(weights.token, ratio, rtol=1e-5, atol=0)
    product = torch.where(mask, ratio, torch.ones_like(ratio)).prod(-1).clamp(max=3.0)
    torch.testing.assert_close(weights.sequence, product, rtol=1e-5, atol=0)
    assert not torch.allclose(product, torch.ones_like(product))


def test_async_options_that_contradict_each_other_are_refused_with_one_line(tokenizer, tmp_path):
    from training_wizard import RLOOConfig

    with pytest.raises(ValueError, match=r"max_inflight_tasks = 0: expected -1 \(automatic\) or a positive"):
        RLOOConfig(async_rollouts=True, max_inflight_tasks=0)
    with pytest.raises(ValueError, match=r"max_staleness = 0 is the synchronous loop.*leave max_inflight_tasks"):
        RLOOConfig(async_rollouts=True, max_staleness=0, max_inflight_tasks=16)
    with pytest.raises(ValueError, match=r"weight_sync_steps above 1 .* needs async_producer = 'thread'"):
        RLOOConfig(async_rollouts=True, weight_sync_steps=2, async_producer="inline")
    with pytest.raises(UserError, match=r"^args.max_inflight_tasks: 24 is not a multiple of the 16 completions"):
        make_rloo_trainer(tokenizer, tmp_path, **OPTIONS, async_rollouts=True, max_inflight_tasks=24)


def read_prompts(folder):
    return [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]


def staleness_seen(records):
    return [(r["sample/staleness_mean"], r["sample/staleness_max"]) for r in records]


def test_a_bound_of_two_samples_two_iterations_ahead_the_same_way_in_a_thread_and_inline(tokenizer, tmp_path):
    options = dict(async_rollouts=True, max_staleness=2, total_episodes=16 * 5)
    _, thread = run(make_rloo_trainer, tokenizer, tmp_path / "thread", **options)
    _, inline = run(make_rloo_trainer, tokenizer, tmp_path / "inline", async_producer="inline", **options)
    _, sync = run(make_rloo_trainer, tokenizer, tmp_path / "sync", total_episodes=16 * 5)
    assert comparable(thread) == comparable(inline)
    # batches 1 and 2 are sampled by the first weights; from then on each by the weights two updates older
    assert staleness_seen(thread) == [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0), (2.0, 2.0), (2.0, 2.0)]
    assert all(r["sample/dropped_stale_total"] == 0.0 for r in thread)
    assert [r["prompts"] for r in read_prompts(tmp_path / "thread")] == [r["prompts"] for r in read_prompts(
        tmp_path / "sync")]  # the synchronous run's prompts, in its order
    assert thread[2]["objective/rlhf_reward"] != sync[2]["objective/rlhf_reward"]  # sampled by older weights


def test_rows_staler_than_the_bound_are_dropped_and_their_prompts_sampled_again(tokenizer, tmp_path):
    """Weights pushed every 2 updates, 3 iterations sampled ahead, a bound of 1: the batches trained at
    iterations 4 and 6 were sampled by weights 2 syncs old, so they are dropped and their prompts sampled again
    with the current weights (staleness 0); the others are kept."""
    options = dict(async_rollouts=True, max_staleness=1, weight_sync_steps=2, max_inflight_tasks=3 * 16,
                   total_episodes=16 * 8)
    _, first = run(make_rloo_trainer, tokenizer, tmp_path / "a", **options)
    _, second = run(make_rloo_trainer, tokenizer, tmp_path / "b", **options)
    _, sync = run(make_rloo_trainer, tokenizer, tmp_path / "sync", total_episodes=16 * 8)
    assert comparable(first) == comparable(second)
    assert [r["sample/staleness_max"] for r in first] == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert [r["sample/dropped_stale_total"] for r in first] == [0, 0, 0, 0, 16, 16, 32, 32]
    assert [r["async/reissued_prompts_total"] for r in first] == [0, 0, 0, 0, 8, 8, 16, 16]  # 2 completions each
    logged = read_prompts(tmp_path / "a")
    assert [r["step"] for r in logged if r["reissued"]] == [5, 7]
    assert [r["prompts"] for r in logged] == [r["prompts"] for r in read_prompts(tmp_path / "sync")]
    # a batch sampled again is fresh: not corrected; a kept stale one is
    assert "sampling/importance_sampling_ratio/mean" not in first[4]
    assert first[5]["sampling/importance_sampling_ratio/mean"] != 1.0


@pytest.mark.parametrize("make, options", [
    (make_rloo_trainer, {}), (make_grpo_trainer, {}), (make_ppo_trainer, {}),
    (make_rloo_trainer, {"kl_coef": 0.1, "num_ppo_epochs": 1, "num_mini_batches": 1}),
    (make_grpo_trainer, {"max_staleness": 2}), (make_ppo_trainer, {"max_staleness": 2}),
], ids=["rloo", "grpo", "ppo", "rloo-one-pass-kl", "grpo-bound-2", "ppo-bound-2"])
def test_the_producer_thread_gives_the_inline_schedule_s_numbers(make, options, tokenizer, tmp_path):
    """The thread samples with a copy of the pre-update weights while the update runs; the inline schedule samples
    with the policy itself before the update: the same keys and weights, so the same run (PPO: values refreshed
    by the critic being trained, in both)."""
    threaded, thread_metrics = run(make, tokenizer, tmp_path / "thread", async_rollouts=True, **options)
    inline, inline_metrics = run(make, tokenizer, tmp_path / "inline", async_rollouts=True, async_producer="inline",
                                 **options)
    assert threaded.rollout_source.producer is not None and inline.rollout_source.producer is None
    assert thread_metrics[1]["async/trainer_idle_s"] >= 0.0 and "async/trainer_idle_s" not in inline_metrics[1]
    assert comparable(thread_metrics) == comparable(inline_metrics)
    ours, theirs = threaded.unwrapped_policy.state_dict(), inline.unwrapped_policy.state_dict()
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


class StallsAtTheThirdBatch:
    """A length reward that scores two batches, then blocks at the third until released (or 120 s pass): a stalled
    producer whose stall the test ends, not the clock. `stalled` is a future so it can be waited on with a batch."""

    def __init__(self):
        self.calls = 0
        self.stalled: concurrent.futures.Future = concurrent.futures.Future()
        self.release, self.returned = threading.Event(), threading.Event()

    def __call__(self, prompts, completions, **columns):
        self.calls += 1
        if self.calls == 3:
            self.stalled.set_result(None)
            self.release.wait(120)
            self.returned.set()
        return [float(len(c)) for c in completions]


def test_a_stalled_producer_stops_the_run_with_one_line_and_the_checkpoint_intact(tokenizer, tmp_path, monkeypatch):
    from training_wizard.checkpoint import find_checkpoint, is_valid_checkpoint
    from training_wizard.rollout.async_producer import RolloutProducer

    reward = StallsAtTheThirdBatch()
    result = RolloutProducer.result

    def result_once_sampled_or_stalled(self, future, timeout):
        # a healthy batch can take longer than the short timeout on a busy machine: it is waited for, so the timeout
        # can fire only at the stalled batch, as it would with the default timeout of an hour
        concurrent.futures.wait([future, reward.stalled], timeout=120, return_when=concurrent.futures.FIRST_COMPLETED)
        return result(self, future, timeout)

    monkeypatch.setattr(RolloutProducer, "result", result_once_sampled_or_stalled)
    trainer = make_rloo_trainer(tokenizer, tmp_path, reward=reward, **OPTIONS, async_rollouts=True,
                                async_producer_timeout=0.5, save_steps=1)
    try:
        with pytest.raises(UserError, match=r"args.async_producer_timeout: the rollout producer gave no batch "
                                            r"within 0.5 s"):
            trainer.train()
        assert not reward.returned.is_set()  # the run stopped while the third batch's reward was still blocked
    finally:
        reward.release.set()
    assert reward.calls == 3 and trainer.state.iteration == 2  # two batches trained, the third never arrived
    assert is_valid_checkpoint(find_checkpoint(tmp_path, "latest"))


def test_episodes_sampled_ahead_by_the_thread_match_the_inline_schedule(tokenizer, tmp_path):
    from tests.unit.test_episodes import make
    from training_wizard import GRPOConfig, GRPOTrainer

    def episode_run(folder, **options):  # Echo, the text protocol: each reply answered, 2 replies at most
        trainer = make(GRPOTrainer, GRPOConfig, tokenizer, folder, total_episodes=8 * 3, response_length=48,
                       max_turns=2, num_generations=2, async_rollouts=True, **options)
        trainer.train()
        return read_metrics(folder)

    threaded = episode_run(tmp_path / "thread")
    inline = episode_run(tmp_path / "inline", async_producer="inline")
    assert comparable(threaded) == comparable(inline)
    assert [record["sample/staleness_max"] for record in threaded] == [0.0] + [1.0] * 5  # 4 episodes an iteration
    assert threaded[-1]["episodes/replies_mean"] > 1.0


def final_score(tokenizer, folder, seed, **options):
    """The mean score of the last 5 of 60 iterations on the 'x' share reward (tests/unit/test_rloo_trainer.py's
    learnable reward: a random model starts near 2%)."""
    trainer = make_rloo_trainer(tokenizer, folder, rloo_k=4, per_device_train_batch_size=16,
                                total_episodes=16 * 60, response_length=8, learning_rate=3e-3, num_ppo_epochs=2,
                                temperature=1.0, kl_coef=0.0, seed=seed, **options)
    trainer.train()
    return sum(m["objective/scores"] for m in read_metrics(folder)[-5:]) / 5


@pytest.mark.slow  # five runs of 60 iterations (about 30 s): in .ci/run's slow part
def test_bounds_of_one_and_two_learn_as_the_synchronous_runs_do(tokenizer, tmp_path):
    synchronous = [final_score(tokenizer, tmp_path / f"sync{seed}", seed) for seed in (1, 2, 3)]
    bounded = {bound: final_score(tokenizer, tmp_path / f"async{bound}", 1, async_rollouts=True, max_staleness=bound)
               for bound in (1, 2)}
    print(f"final scores: synchronous {synchronous}, async by bound {bounded}")
    assert min(synchronous) > 0.3  # the reward is learned at all
    for bound, score in bounded.items():
        assert min(synchronous) <= score <= max(synchronous) + 0.05, (bound, synchronous, score)


def test_with_one_pass_the_update_s_own_logprobs_are_the_proximal_policy_and_no_refresh_runs(tokenizer, tmp_path):
    """One epoch of one mini-batch: the stale batch is not refreshed (its logprobs stay the behaviour's); the update
    corrects each completion by exp(its own detached logprobs - the behaviour's) and logs those weights."""
    options = dict(num_ppo_epochs=1, num_mini_batches=1, async_rollouts=True)
    _, one_pass = run(make_rloo_trainer, tokenizer, tmp_path / "one", **options)
    _, refreshed = run(make_rloo_trainer, tokenizer, tmp_path / "two", **{**options, "num_ppo_epochs": 2})
    assert all(r["time/logprob_refresh"] == 0.0 for r in one_pass)  # no pass ran
    assert all(r["time/logprob_refresh"] > 0.0 for r in refreshed[1:])
    for record in one_pass[1:]:
        assert record["sampling/importance_sampling_ratio/mean"] != 1.0
        assert record["sampling/sampling_logp_difference/max"] > 0.0
