"""The producer thread of the asynchronous schedule (rollout/asynchronous.py, docs/async.md): it samples and
scores the batches ahead, in order, with a copy of the policy, while the training thread updates."""

from __future__ import annotations

import concurrent.futures
import copy
import queue
import threading
import time

import torch

from training_wizard.errors import UserError
from training_wizard.rollout.collector import RolloutCollector, RolloutSource
from training_wizard.rollout.prompts import RolloutRequest
from training_wizard.rollout.trajectory import TrajectoryBatch


class RolloutProducer:
    """Samples and scores the batches ahead, in order, in one thread of its own, with `replica`: a copy of the
    policy given the policy's weights at each sync, so the update can change the policy meanwhile. A sync while
    jobs are queued travels with the next job as a snapshot (one more copy of the weights per sync in flight).
    Extra passes (PPO's values) are left to the refresh, which has the models being trained."""

    def __init__(self, policy: torch.nn.Module, collector: RolloutCollector, source: RolloutSource,
                 timeout_key: str):
        """`policy`: the unwrapped policy; `source`: the collector or a source built on it (its `collector`),
        copied to sample with the replica; `timeout_key`: async_producer_timeout as the user wrote it."""
        self.replica = copy.deepcopy(policy).eval()
        self.replica.requires_grad_(False)
        own_collector = copy.copy(collector)
        own_collector.policy, own_collector.extra_passes = self.replica, {}
        if source is collector:
            self.source = own_collector
        else:
            self.source = copy.copy(source)
            self.source.collector = own_collector
        self.version: int | None = None  # the updates the replica's weights (or the last snapshot) have seen
        self.jobs: queue.Queue = queue.Queue()
        self.unfinished: list[concurrent.futures.Future] = []
        self.snapshot: dict[str, torch.Tensor] | None = None  # weights for the next job, while jobs run
        # seconds the trainer waited for the last batch, and the producer for its last job
        self.trainer_idle_s = self.producer_idle_s = 0.0
        self.thread: threading.Thread | None = None
        self.timeout_key = timeout_key

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

    def submit(self, request: RolloutRequest) -> concurrent.futures.Future:
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
