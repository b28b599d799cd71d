"""The one-step-off-policy schedule (`async_rollouts = true`, docs/async.md): each iteration samples the next
iteration's batch with the weights before its own update, so every batch after the first trains weights one
update newer than those that sampled it.

Order within iteration i: take the batch sampled ahead (by the weights of update i - 1), recompute its policy
logprobs (and PPO's values) with the current weights (the proximal policy of decoupled PPO: the ratio and its clip
are taken against it), keep the sampler's as the behaviour policy's, start sampling batch i + 1 with the current
weights, then update. The update weighs each token by the truncated importance weight exp(proximal - behaviour),
with the vllm_importance_sampling_* mode and bounds (core/importance_sampling.py), always on for a stale batch.

Where batch i + 1 is sampled (`async_producer`): "thread", by a `RolloutProducer` in a thread of its own with a
copy of the policy given the pre-update weights, while the update runs; or "inline", in the training thread
before the update. Both sample the same keys with the same weights: the same numbers. Sampling keys are keyed by
the iteration a batch trains in, so the schedule is as reproducible as the synchronous loop. A checkpoint saves
the prompt order before the batch sampled ahead: a resumed run samples that batch again, with the resumed
weights, and no prompt is lost or repeated.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import threading
import time
import types
from typing import Any

import torch

from training_wizard.core.importance_sampling import ImportanceWeights
from training_wizard.errors import UserError
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.sharding import unwrap_model
from training_wizard.trainers.rollout_metrics import sampling_metrics


def sample_ahead(trainer: Any) -> None:
    """Under the one-step-off schedule, unless this is the last iteration: sample and score the next iteration's
    batch with the current weights, and keep it for that iteration."""
    if not trainer.config.one_step_off or trainer.state.iteration + 1 >= trainer.plan.num_iterations:
        return
    order = trainer.state.prompt_order.state_dict()
    producer = trainer.producer if trainer.producer is not None else start_producer(trainer)
    if producer is None:
        trainer.pending_rollout = trainer.collect_rollout(trainer.state.iteration + 1)
    else:
        trainer.pending_rollout = producer.submit(unwrap_model(trainer.accelerator, trainer.policy),
                                                  trainer.next_request(trainer.state.iteration + 1))
    trainer.state.order_before_pending, trainer.state.pending_prompts = order, trainer.plan.prompts_per_iteration


def take_pending(trainer: Any) -> TrajectoryBatch:
    """The batch sampled ahead (waited for, from a producer thread), for the current weights: refreshed policy
    logprobs and extra passes, the sampler's logprobs kept as the behaviour policy's."""
    batch, trainer.pending_rollout = trainer.pending_rollout, None
    if isinstance(batch, concurrent.futures.Future):
        waited = time.perf_counter()
        batch = trainer.producer.result(batch, trainer.config.async_producer_timeout)
        trainer.producer.trainer_idle_s = time.perf_counter() - waited
    trainer.state.order_before_pending = None
    return refreshed_for_current_weights(trainer.collector, batch, policy_pass=not trainer.config.single_update_pass)


def start_producer(trainer: Any) -> RolloutProducer | None:
    """The producer thread where the run can have one (async_producer = "thread"), else None (inline): one
    process (a producer's collectives would interleave with the update's), the decode loop (vLLM has its own
    engine and weight push), and the trainer's own rollout sources (a custom source cannot be given the copy)."""
    config = trainer.config
    source = trainer.rollout_source
    ours = source is trainer.collector or getattr(source, "collector", None) is trainer.collector
    if config.async_producer != "thread" or trainer.accelerator.num_processes > 1 or config.use_vllm or not ours:
        return None
    trainer.producer = RolloutProducer(trainer)
    return trainer.producer


class RolloutProducer:
    """Samples and scores the batch ahead in one thread of its own, with `replica`: a copy of the policy that
    gets the policy's weights at each submit (the weights the inline schedule would sample with), so the update
    can change the policy meanwhile. Extra passes (PPO's values) are left to the refresh, which has the models
    being trained. Memory: one more copy of the policy's weights."""

    def __init__(self, trainer: Any):
        self.replica = copy.deepcopy(unwrap_model(trainer.accelerator, trainer.policy)).eval()
        self.replica.requires_grad_(False)
        collector = copy.copy(trainer.collector)
        collector.policy, collector.extra_passes = self.replica, {}
        source = trainer.rollout_source
        if source is trainer.collector:
            self.source = collector
        else:
            self.source = copy.copy(source)
            self.source.collector = collector
        # seconds the trainer waited for the last batch, and the producer for its last submit
        self.trainer_idle_s = self.producer_idle_s = 0.0
        self.finished_at: float | None = None

    @torch.no_grad()
    def submit(self, policy: torch.nn.Module, request) -> concurrent.futures.Future:
        """Copy the policy's current weights into the replica, then sample and score `request` in a thread. A
        daemon thread: one that stalls must not keep the process from exiting once the run has stopped."""
        for mine, theirs in zip(self.replica.state_dict().values(), policy.state_dict().values()):
            mine.copy_(theirs)
        future: concurrent.futures.Future = concurrent.futures.Future()
        now = time.perf_counter()
        self.producer_idle_s = now - self.finished_at if self.finished_at is not None else 0.0

        def produce() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self.source.collect(request))
            except BaseException as exc:  # handed to the training thread, which raises it
                future.set_exception(exc)
            self.finished_at = time.perf_counter()
        threading.Thread(target=produce, name="rollout-producer", daemon=True).start()
        return future

    def result(self, future: concurrent.futures.Future, timeout: float) -> TrajectoryBatch:
        """The producer's batch; its exception, as it raised it; one line if it gave nothing within `timeout`."""
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise UserError(f"training.async_producer_timeout: the rollout producer gave no batch within {timeout:g} "
                            "s; the run stops here (its last checkpoint is intact)") from None


def refreshed_for_current_weights(collector: Any, batch: TrajectoryBatch, policy_pass: bool = True
                                  ) -> TrajectoryBatch:
    """A batch sampled by older weights, with `logprobs` recomputed by the current ones (the proximal policy)
    and `sampling_logprobs` the behaviour policy's: the sampler's where it gave its own (vLLM), else the
    training forward pass's at sampling time. Without a reference pass the reference stays the policy (KL 0).
    Without `policy_pass` (one epoch of one mini-batch: the update's own forward pass is the proximal policy's,
    trainers/update.py) `logprobs` stay the behaviour policy's, which the KL penalty then reads."""
    started = time.perf_counter()
    logprobs, extras, timings = batch.logprobs, {}, dict(batch.timings)
    if policy_pass or collector.extra_passes:
        with collector.rollout_engine() as engine:
            if policy_pass:
                logprobs = collector._logprobs(engine.model, batch.prompt_ids, batch.prompt_mask,
                                               batch.completion_ids, batch.completion_mask)
            extras = {name: run(batch.prompt_ids, batch.prompt_mask, batch.completion_ids)
                      for name, run in collector.extra_passes.items()}
        timings["refresh"] = time.perf_counter() - started  # the training thread's part
    behaviour = batch.sampling_logprobs if batch.sampling_logprobs is not None else batch.logprobs
    reference = batch.ref_logprobs if collector.settings.reference_logprobs else logprobs
    return dataclasses.replace(batch, logprobs=logprobs, ref_logprobs=reference, extras={**batch.extras, **extras},
                               sampling_logprobs=behaviour * batch.loss_mask, timings=timings)


def async_metrics(trainer: Any, batch: TrajectoryBatch) -> dict[str, float]:
    """How many updates older than the weights it trains each row's sampling weights were (mean and max over every
    process's rows), and with a producer thread how long each side waited for the other this iteration."""
    lag = (trainer.state.iteration - 1 - batch.policy_version).float()  # metrics are taken after the count
    device = trainer.accelerator.device
    sums = trainer.collectives.sum(torch.stack([lag.sum(), torch.tensor(float(lag.numel()))]).to(device))
    metrics = {"sample/staleness_mean": float(sums[0] / sums[1]),
               "sample/staleness_max": float(trainer.collectives.max(lag.max().to(device)))}
    metrics["time/logprob_refresh"] = batch.timings.get("refresh", 0.0)
    metrics.update(update_correction_metrics(trainer))
    metrics["async/reissued_prompts_total"] = float(trainer.state.reissued_prompts)
    if trainer.producer is not None:
        metrics["async/trainer_idle_s"] = trainer.producer.trainer_idle_s
        metrics["async/producer_idle_s"] = trainer.producer.producer_idle_s
    return metrics


def update_correction_metrics(trainer: Any) -> dict[str, float]:
    """The sampling/* metrics of the corrections the update computed itself (one pass over a stale batch, which
    was not refreshed): the gap between the proximal and the behaviour logprobs, and the bounded weights."""
    parts, trainer.update_corrections = getattr(trainer, "update_corrections", []), []
    if not parts:
        return {}
    per_sequence = trainer.config.vllm_importance_sampling_mode.startswith("sequence")
    flat = types.SimpleNamespace(
        logprobs=torch.cat([proximal[mask] for proximal, _, mask, _ in parts]),
        sampling_logprobs=torch.cat([behaviour[mask] for _, behaviour, mask, _ in parts]))
    flat.loss_mask = torch.ones_like(flat.logprobs, dtype=torch.bool)
    weights = ImportanceWeights(token=torch.cat([w.token[mask] for _, _, mask, w in parts]),
                                sequence=torch.cat([w.sequence for *_, w in parts]), raw=flat.logprobs)
    return sampling_metrics(trainer.collectives, trainer.accelerator.device, flat, weights, per_sequence)
