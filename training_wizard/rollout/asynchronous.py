"""The k-step-off-policy schedule (`async_rollouts = true`, docs/async.md): a source that wraps the run's rollout
source and samples batches ahead of the iteration that trains them, by weights k = batches_ahead updates older
(1 by default: veRL's one-step-off). `with_async` decides, from the config, whether a run's source is wrapped.

Order within iteration i: take the batch sampled ahead (`AsynchronousSource.take`), or drop it and sample its
prompts again with the current weights if it is staler than max_staleness; recompute its policy logprobs (and
PPO's values) with the current weights (the proximal policy of decoupled PPO: the ratio and its clip are taken
against it), keeping the sampler's as the behaviour policy's; queue the batches of the next iterations up to i + k
(`prepare_ahead`); then the trainer updates. The update weighs each token by the importance weight
exp(proximal - behaviour), bounded by the async_correction rule within the vllm_importance_sampling_clip_*
bounds (core/importance_sampling.py), always on for this source's batches (its `off_policy` rule).

Where batches ahead are sampled (`async_producer`): "thread", by a `RolloutProducer` (rollout/async_producer.py)
in a thread of its own with a copy of the policy, given the trained weights every weight_sync_steps updates,
while the update runs; or "inline", in the training thread before the update. Both sample the same keys with the
same weights: the same numbers. Sampling keys are keyed by the iteration a batch trains in, so the schedule is as
reproducible as the synchronous loop. The source's part of a checkpoint is the prompt order before the first
batch sampled ahead: a resumed run samples those batches again, with the resumed weights, and no prompt is lost
or repeated.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from typing import Any

import torch

from training_wizard.errors import UserError
from training_wizard.rollout.async_producer import RolloutProducer
from training_wizard.rollout.collector import RolloutCollector, RolloutSource
from training_wizard.rollout.iteration_source import (IterationSource, OffPolicyRule, RequestFor, SourceContext,
                                                      TakenBatch)
from training_wizard.rollout.prompts import RolloutRequest
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.spec import key_path


def with_async(source: RolloutSource, context: SourceContext) -> IterationSource:
    """The loop's source for `source`: sampling ahead under async_rollouts (at a bound of 0 too, whose batches
    the update then corrects as every async run's), else the synchronous one."""
    if context.config.async_rollouts:
        return AsynchronousSource(source, context)
    return IterationSource(source)


@dataclasses.dataclass
class PendingBatch:
    """A batch sampled ahead: the iteration it trains in, its request (policy_version: the weights that sample
    it), the prompt order before its prompts were taken, and the batch (inline) or its Future (producer thread)."""

    iteration: int
    request: RolloutRequest
    order_before: dict[str, Any]
    batch: TrajectoryBatch | concurrent.futures.Future


class AsynchronousSource(IterationSource):
    """Samples the batches of the next `batches_ahead` iterations ahead with `source` (queued in `pending`,
    oldest first), by the producer thread (`producer`) or inline; counts the completions dropped as too stale
    and the prompts sampled again, and saves both with the prompt order in the run's checkpoint."""

    def __init__(self, source: RolloutSource, context: SourceContext):
        super().__init__(source)
        self.context, self.config, self.plan = context, context.config, context.plan
        self.off_policy = OffPolicyRule(report=self.config.samples_ahead)
        self.batches_ahead = self.plan.iterations_ahead  # derived and checked by the batch plan
        self.pending: collections.deque[PendingBatch] = collections.deque()
        self.producer: RolloutProducer | None = None
        # the prompt order's state before the first batch sampled ahead of its iteration was taken, and how many
        # prompts those batches hold: a checkpoint saves that order, so a resumed run samples them again
        self.order_before_pending: dict[str, Any] | None = None
        self.pending_prompts = 0
        # prompts sampled again: after resumes (their batches dropped with the stop) and after stale batches
        self.reissued_prompts = 0
        self.dropped_stale_rows = 0  # completions dropped as staler than max_staleness

    def staleness(self, iteration: int, policy_version: int) -> int:
        """Weight syncs between the weights that sampled a row (`policy_version` updates) and those of
        `iteration`: the producer is given the weights every weight_sync_steps updates (TRL's unit)."""
        every = self.config.weight_sync_steps
        return iteration // every - policy_version // every

    def take(self, iteration: int, request_for: RequestFor) -> TakenBatch:
        """This iteration's batch: the one sampled ahead, refreshed for the current weights (dropped, and its
        prompts sampled again now, if it is staler than max_staleness), or without one sampled now."""
        if not self.pending:
            return super().take(iteration, request_for)
        entry = self.pending.popleft()
        batch = entry.batch
        if isinstance(batch, concurrent.futures.Future):
            waited = time.perf_counter()
            batch = self.producer.result(batch, self.config.async_producer_timeout)
            self.producer.trainer_idle_s = time.perf_counter() - waited
        self._note_pending()
        if self.staleness(iteration, entry.request.policy_version) > self.config.max_staleness:
            self.dropped_stale_rows += self.plan.batch_size
            self.reissued_prompts += self.plan.prompts_per_iteration
            request = dataclasses.replace(entry.request, policy_version=iteration)
            return TakenBatch(self.sampled_now(request, iteration), request.prompt_ids, reissued=True)
        batch = refreshed_for_current_weights(self.context.collector, batch,
                                              policy_pass=not self.config.single_update_pass)
        return TakenBatch(batch, entry.request.prompt_ids)

    def prepare_ahead(self, iteration: int, request_for: RequestFor) -> None:
        """Sample (or submit to the producer) the batches of the next iterations until `batches_ahead` are
        pending, each with the producer's weights: synced with the current ones every weight_sync_steps updates,
        and at the first submit of a run (or of a resumed one)."""
        pending = self.pending
        last = min(iteration + self.batches_ahead, self.plan.num_iterations - 1)
        next_iteration = iteration + 1 + len(pending)
        if next_iteration > last:
            return
        producer = self.producer if self.producer is not None else self._start_producer()
        if producer is not None and (producer.version is None or iteration % self.config.weight_sync_steps == 0):
            producer.sync(self.context.policy(), iteration)
        for ahead in range(next_iteration, last + 1):
            order = self.context.prompt_position()
            version = iteration if producer is None else producer.version
            request = dataclasses.replace(request_for(ahead), policy_version=version)
            batch = self.source.collect(request) if producer is None else producer.submit(request)
            pending.append(PendingBatch(ahead, request, order, batch))
        self._note_pending()

    def _note_pending(self) -> None:
        """What a checkpoint needs of the batches sampled ahead: the prompt order before the first of them (a
        resumed run samples them again) and how many prompts they hold."""
        pending = self.pending
        self.order_before_pending = pending[0].order_before if pending else None
        self.pending_prompts = len(pending) * self.plan.prompts_per_iteration

    def _start_producer(self) -> RolloutProducer | None:
        """The producer thread where the run can have one (async_producer = "thread"), else None (inline): one
        process (a producer's collectives would interleave with the update's), the decode loop (vLLM has its own
        engine and weight push), and the trainer's own rollout sources (a custom source cannot be given the
        copy). weight_sync_steps above 1 needs it (the inline producer samples with the current weights)."""
        config, collector = self.config, self.context.collector
        ours = self.source is collector or getattr(self.source, "collector", None) is collector
        if (config.async_producer != "thread" or self.context.accelerator.num_processes > 1 or config.use_vllm
                or not ours):
            if config.weight_sync_steps > 1:
                raise UserError(f"{key_path(config, 'weight_sync_steps', 'training')}: above 1 needs the producer "
                                "thread, which runs with one process, the decode loop (use_vllm = false) and the "
                                "trainer's own rollout sources")
            return None
        self.producer = RolloutProducer(self.context.policy(), collector, self.source,
                                        key_path(config, "async_producer_timeout", "training"))
        return self.producer

    def metrics(self, batch: TrajectoryBatch, iteration: int) -> dict[str, float]:
        """Where batches are sampled ahead: how many weight syncs older than the weights it trains each row's
        sampling weights were (mean and max over every process's rows), the rows dropped as too stale and the
        prompts sampled again (both since the start), and with a producer thread how long each side waited for
        the other this iteration."""
        if not self.config.samples_ahead:
            return {}
        every = self.config.weight_sync_steps  # in weight syncs, as `staleness`; metrics come after the count
        lag = ((iteration - 1) // every - torch.div(batch.policy_version, every, rounding_mode="floor")).float()
        collectives, device = self.context.collectives, self.context.accelerator.device
        sums = collectives.sum(torch.stack([lag.sum(), torch.tensor(float(lag.numel()))]).to(device))
        metrics = {"sample/staleness_mean": float(sums[0] / sums[1]),
                   "sample/staleness_max": float(collectives.max(lag.max().to(device)))}
        metrics["time/logprob_refresh"] = batch.timings.get("refresh", 0.0)
        metrics["sample/dropped_stale_total"] = float(self.dropped_stale_rows)
        metrics["async/reissued_prompts_total"] = float(self.reissued_prompts)
        if self.producer is not None:
            metrics["async/trainer_idle_s"] = self.producer.trainer_idle_s
            metrics["async/producer_idle_s"] = self.producer.producer_idle_s
        return metrics

    def state_dict(self, run_state: dict[str, Any]) -> dict[str, Any]:
        """`run_state` with the prompt order from before the batches sampled ahead (a run resumed from it samples
        their prompts again, which count as reissued) and the counters."""
        if self.order_before_pending:
            run_state["prompt_order"] = self.order_before_pending
        run_state["reissued_prompts"] = self.reissued_prompts + (self.pending_prompts if self.order_before_pending
                                                                 else 0)
        run_state["dropped_stale_rows"] = self.dropped_stale_rows
        return run_state

    def load_state_dict(self, run_state: dict[str, Any]) -> None:
        self.reissued_prompts = int(run_state.get("reissued_prompts", 0))
        self.dropped_stale_rows = int(run_state.get("dropped_stale_rows", 0))

    def close(self) -> None:
        """The batches queued or being sampled are dropped."""
        if self.producer is not None:
            self.producer.close()


def refreshed_for_current_weights(collector: RolloutCollector, batch: TrajectoryBatch, policy_pass: bool = True
                                  ) -> TrajectoryBatch:
    """A batch sampled by older weights, with `logprobs` recomputed by the current ones (the proximal policy)
    and `sampling_logprobs` the behaviour policy's: the sampler's where it gave its own (vLLM), else the
    training forward pass's at sampling time. Without a reference pass the reference stays the policy (KL 0).
    Without `policy_pass` (one epoch of one mini-batch: the update's own forward pass is the proximal policy's,
    trainers/loop/update.py) `logprobs` stay the behaviour policy's, which the KL penalty then reads."""
    started = time.perf_counter()
    logprobs, extras, timings = batch.logprobs, {}, dict(batch.timings)
    if policy_pass or collector.extra_passes:
        with collector.rollout_engine() as engine:
            if policy_pass:
                logprobs = collector.logprobs_of(engine.model, batch.prompt_ids, batch.prompt_mask,
                                                 batch.completion_ids, batch.completion_mask)
            extras = {name: run(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
                      for name, run in collector.extra_passes.items()}
        timings["refresh"] = time.perf_counter() - started  # the training thread's part
    behaviour = batch.sampling_logprobs if batch.sampling_logprobs is not None else batch.logprobs
    reference = batch.ref_logprobs if collector.settings.reference_logprobs else logprobs
    return dataclasses.replace(batch, logprobs=logprobs, ref_logprobs=reference, extras={**batch.extras, **extras},
                               sampling_logprobs=behaviour * batch.loss_mask, timings=timings)
