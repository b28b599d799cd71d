"""The k-step-off-policy schedule (`async_rollouts = true`, docs/async.md): batches are sampled ahead of the
iteration that trains them, by weights k = batches_ahead updates older (1 by default: veRL's one-step-off).

Order within iteration i: take the batch sampled ahead (`next_rollout`), or drop it and sample its prompts again
with the current weights if it is staler than max_staleness; recompute its policy logprobs (and PPO's values) with
the current weights (the proximal policy of decoupled PPO: the ratio and its clip are taken against it), keeping
the sampler's as the behaviour policy's; queue the batches of the next iterations up to i + k (`sample_ahead`);
then update. The update weighs each token by the importance weight exp(proximal - behaviour), bounded by the
async_correction rule within the vllm_importance_sampling_clip_* bounds (core/importance_sampling.py), always on
for a stale batch.

Where batches ahead are sampled (`async_producer`): "thread", by a `RolloutProducer` in a thread of its own with a
copy of the policy, given the trained weights every weight_sync_steps updates, while the update runs; or
"inline", in the training thread before the update. Both sample the same keys with the same weights: the same
numbers. Sampling keys are keyed by the iteration a batch trains in, so the schedule is as reproducible as the
synchronous loop. A checkpoint saves the prompt order before the first batch sampled ahead: a resumed run samples
those batches again, with the resumed weights, and no prompt is lost or repeated.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import queue
import threading
import time
import types
from typing import Any

import torch

from training_wizard.core.importance_sampling import ImportanceWeights
from training_wizard.errors import UserError
from training_wizard.rollout.collector import RolloutRequest
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.sharding import unwrap_model
from training_wizard.spec import key_path
from training_wizard.trainers.batch_plan import iterations_ahead
from training_wizard.trainers.rollout_metrics import sampling_metrics


@dataclasses.dataclass
class PendingBatch:
    """A batch sampled ahead: the iteration it trains in, its request (policy_version: the weights that sample
    it), the prompt order before its prompts were taken, and the batch (inline) or its Future (producer thread)."""

    iteration: int
    request: RolloutRequest
    order_before: dict[str, Any]
    batch: TrajectoryBatch | concurrent.futures.Future


def batches_ahead(config: Any, plan: Any) -> int:
    """Iterations sampled ahead of the one being trained, as the batch plan derived them (checked there)."""
    return iterations_ahead(config, plan.batch_size)


def staleness(trainer: Any, policy_version: int) -> int:
    """Weight syncs between the weights that sampled a row (`policy_version` updates) and the current ones: the
    producer is given the weights every weight_sync_steps updates (TRL's unit)."""
    every = trainer.config.weight_sync_steps
    return trainer.state.iteration // every - policy_version // every


def next_rollout(trainer: Any) -> TrajectoryBatch:
    """This iteration's batch: the one sampled ahead, refreshed for the current weights (dropped, and its prompts
    sampled again now, if it is staler than max_staleness), or without one sampled now. Its prompts are logged."""
    if not trainer.pending_rollouts:
        request = trainer.next_request()
        return logged(trainer, request, trainer.collect_rollout(request=request))
    entry = trainer.pending_rollouts.popleft()
    batch = entry.batch
    if isinstance(batch, concurrent.futures.Future):
        waited = time.perf_counter()
        batch = trainer.producer.result(batch, trainer.config.async_producer_timeout)
        trainer.producer.trainer_idle_s = time.perf_counter() - waited
    note_pending(trainer)
    if staleness(trainer, entry.request.policy_version) > trainer.config.max_staleness:
        trainer.state.dropped_stale_rows += trainer.plan.batch_size
        trainer.state.reissued_prompts += trainer.plan.prompts_per_iteration
        request = dataclasses.replace(entry.request, policy_version=trainer.state.iteration)
        return logged(trainer, request, trainer.collect_rollout(request=request), reissued=True)
    batch = refreshed_for_current_weights(trainer.collector, batch, policy_pass=not trainer.config.single_update_pass)
    return logged(trainer, entry.request, batch)


def sample_ahead(trainer: Any) -> None:
    """Under async_rollouts: sample (or submit to the producer) the batches of the next iterations until
    `batches_ahead` are pending, each with the producer's weights: synced with the current ones every
    weight_sync_steps updates, and at the first submit of a run (or of a resumed one)."""
    state, pending = trainer.state, trainer.pending_rollouts
    last = min(state.iteration + trainer.batches_ahead, trainer.plan.num_iterations - 1)
    next_iteration = state.iteration + 1 + len(pending)
    if next_iteration > last:
        return
    producer = trainer.producer if trainer.producer is not None else start_producer(trainer)
    if producer is not None and (producer.version is None or state.iteration % trainer.config.weight_sync_steps == 0):
        producer.sync(unwrap_model(trainer.accelerator, trainer.policy), state.iteration)
    for iteration in range(next_iteration, last + 1):
        order = state.prompt_order.state_dict()
        version = state.iteration if producer is None else producer.version
        request = dataclasses.replace(trainer.next_request(iteration), policy_version=version)
        batch = trainer.rollout_source.collect(request) if producer is None else producer.submit(request)
        pending.append(PendingBatch(iteration, request, order, batch))
    note_pending(trainer)


def note_pending(trainer: Any) -> None:
    """What a checkpoint needs of the batches sampled ahead: the prompt order before the first of them (a
    resumed run samples them again) and how many prompts they hold."""
    pending = trainer.pending_rollouts
    trainer.state.order_before_pending = pending[0].order_before if pending else None
    trainer.state.pending_prompts = len(pending) * trainer.plan.prompts_per_iteration


def logged(trainer: Any, request: RolloutRequest, batch: TrajectoryBatch, reissued: bool = False) -> TrajectoryBatch:
    """`batch`, after its dataset prompts (global order) are written to prompts.jsonl by the main process."""
    trainer.prompt_log.record(trainer.state.iteration + 1, list(request.prompt_ids), reissued)
    return batch


def start_producer(trainer: Any) -> RolloutProducer | None:
    """The producer thread where the run can have one (async_producer = "thread"), else None (inline): one
    process (a producer's collectives would interleave with the update's), the decode loop (vLLM has its own
    engine and weight push), and the trainer's own rollout sources (a custom source cannot be given the copy).
    weight_sync_steps above 1 needs it (the inline producer samples with the current weights)."""
    config = trainer.config
    source = trainer.rollout_source
    ours = source is trainer.collector or getattr(source, "collector", None) is trainer.collector
    if config.async_producer != "thread" or trainer.accelerator.num_processes > 1 or config.use_vllm or not ours:
        if config.weight_sync_steps > 1:
            raise UserError(f"{key_path(config, 'weight_sync_steps', 'training')}: above 1 needs the producer thread, which runs with one "
                            "process, the decode loop (use_vllm = false) and the trainer's own rollout sources")
        return None
    trainer.producer = RolloutProducer(trainer)
    return trainer.producer


class RolloutProducer:
    """Samples and scores the batches ahead, in order, in one thread of its own, with `replica`: a copy of the
    policy given the policy's weights at each sync, so the update can change the policy meanwhile. A sync while
    jobs are queued travels with the next job as a snapshot (one more copy of the weights per sync in flight).
    Extra passes (PPO's values) are left to the refresh, which has the models being trained."""

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
        self.version: int | None = None  # the updates the replica's weights (or the last snapshot) have seen
        self.jobs: queue.Queue = queue.Queue()
        self.unfinished: list[concurrent.futures.Future] = []
        self.snapshot: dict[str, torch.Tensor] | None = None  # weights for the next job, while jobs run
        # seconds the trainer waited for the last batch, and the producer for its last job
        self.trainer_idle_s = self.producer_idle_s = 0.0
        self.thread: threading.Thread | None = None
        self.timeout_key = key_path(trainer.config, "async_producer_timeout", "training")  # as the user wrote it

    @torch.no_grad()
    def sync(self, policy: torch.nn.Module, version: int) -> None:
        """Give the producer the policy's current weights (`version` updates): at once when it is idle, else as
        a snapshot taken now and loaded before its next job."""
        self.version = version
        self.unfinished = [future for future in self.unfinished if not future.done()]
        if self.unfinished:
            self.snapshot = {name: tensor.detach().clone() for name, tensor in policy.state_dict().items()}
            return
        for mine, theirs in zip(self.replica.state_dict().values(), policy.state_dict().values()):
            mine.copy_(theirs)

    def submit(self, request) -> concurrent.futures.Future:
        """Queue `request` for the producer thread (started at the first submit: a daemon, so one that stalls
        never keeps the process from exiting once the run has stopped)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((future, request, self.snapshot))
        self.snapshot = None
        self.unfinished.append(future)
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="rollout-producer", daemon=True)
            self.thread.start()
        return future

    @torch.no_grad()
    def _work(self) -> None:
        while True:
            waited = time.perf_counter()
            future, request, snapshot = self.jobs.get()
            self.producer_idle_s = time.perf_counter() - waited
            if future is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if snapshot is not None:
                    self.replica.load_state_dict(snapshot)
                future.set_result(self.source.collect(request))
            except BaseException as exc:  # handed to the training thread, which raises it
                future.set_exception(exc)

    def result(self, future: concurrent.futures.Future, timeout: float) -> TrajectoryBatch:
        """The producer's batch; its exception, as it raised it; one line if it gave nothing within `timeout`."""
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise UserError(f"{self.timeout_key}: the rollout producer gave no batch within {timeout:g} "
                            "s; the run stops here (its last checkpoint is intact)") from None

    def close(self) -> None:
        """Cancel the jobs not started, and let the thread end after the one it runs (which is dropped)."""
        for future in self.unfinished:
            future.cancel()
        self.jobs.put((None, None, None))


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
    """How many weight syncs older than the weights it trains each row's sampling weights were (mean and max over
    every process's rows), the rows dropped as too stale and the prompts sampled again (both since the start),
    and with a producer thread how long each side waited for the other this iteration."""
    every = trainer.config.weight_sync_steps  # in weight syncs, as `staleness`; metrics come after the count
    lag = ((trainer.state.iteration - 1) // every - torch.div(batch.policy_version, every, rounding_mode="floor")).float()
    device = trainer.accelerator.device
    sums = trainer.collectives.sum(torch.stack([lag.sum(), torch.tensor(float(lag.numel()))]).to(device))
    metrics = {"sample/staleness_mean": float(sums[0] / sums[1]),
               "sample/staleness_max": float(trainer.collectives.max(lag.max().to(device)))}
    metrics["time/logprob_refresh"] = batch.timings.get("refresh", 0.0)
    metrics.update(update_correction_metrics(trainer))
    metrics["sample/dropped_stale_total"] = float(trainer.state.dropped_stale_rows)
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
    per_sequence = trainer.correction_mode.startswith("sequence")
    flat = types.SimpleNamespace(
        logprobs=torch.cat([proximal[mask] for proximal, _, mask, _ in parts]),
        sampling_logprobs=torch.cat([behaviour[mask] for _, behaviour, mask, _ in parts]))
    flat.loss_mask = torch.ones_like(flat.logprobs, dtype=torch.bool)
    weights = ImportanceWeights(token=torch.cat([w.token[mask] for _, _, mask, w in parts]),
                                sequence=torch.cat([w.sequence for *_, w in parts]), raw=flat.logprobs)
    return sampling_metrics(trainer.collectives, trainer.accelerator.device, flat, weights, per_sequence)
