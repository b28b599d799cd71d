"""The one-step-off-policy schedule (`async_rollouts = true`, docs/async.md): each iteration samples the next
iteration's batch with the weights before its own update, so every batch after the first trains weights one
update newer than those that sampled it.

Order within iteration i: take the batch sampled ahead (by the weights of update i - 1), recompute its policy
logprobs with the current weights (the proximal policy of decoupled PPO: the ratio and its clip are taken against
it), keep the sampler's as the behaviour policy's, sample batch i + 1 with the current weights, then update. The
update weighs each token by the truncated importance weight exp(proximal - behaviour), with the
vllm_importance_sampling_* mode and bounds (core/importance_sampling.py), always on for a stale batch.

Sampling keys are keyed by the iteration a batch trains in, so the schedule is as deterministic as the synchronous
loop. A checkpoint saves the prompt order before the batch sampled ahead: a resumed run samples that batch again,
with the resumed weights, and no prompt is lost or repeated.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from training_wizard.rollout.trajectory import TrajectoryBatch


def sample_ahead(trainer: Any) -> None:
    """Under the one-step-off schedule, unless this is the last iteration: sample and score the next iteration's
    batch with the current weights, and keep it for that iteration."""
    if not trainer.config.one_step_off or trainer.state.iteration + 1 >= trainer.plan.num_iterations:
        return
    order = trainer.state.prompt_order.state_dict()
    trainer.pending_rollout = trainer.collect_rollout(trainer.state.iteration + 1)
    trainer.state.order_before_pending = order


def take_pending(trainer: Any) -> TrajectoryBatch:
    """The batch sampled ahead, for the current weights (refreshed policy logprobs, the sampler's kept)."""
    batch, trainer.pending_rollout = trainer.pending_rollout, None
    trainer.state.order_before_pending = None
    return refreshed_for_current_weights(trainer.collector, batch)


def refreshed_for_current_weights(collector: Any, batch: TrajectoryBatch) -> TrajectoryBatch:
    """A batch sampled by older weights, with `logprobs` recomputed by the current ones (the proximal policy)
    and `sampling_logprobs` the behaviour policy's: the sampler's where it gave its own (vLLM), else the
    training forward pass's at sampling time. Without a reference pass the reference stays the policy (KL 0)."""
    started = time.perf_counter()
    with collector.rollout_engine() as engine:
        logprobs = collector._logprobs(engine.model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                       batch.completion_mask)
    behaviour = batch.sampling_logprobs if batch.sampling_logprobs is not None else batch.logprobs
    reference = batch.ref_logprobs if collector.settings.reference_logprobs else logprobs
    timings = {**batch.timings, "logprobs": batch.timings.get("logprobs", 0.0) + time.perf_counter() - started}
    return dataclasses.replace(batch, logprobs=logprobs, ref_logprobs=reference,
                               sampling_logprobs=behaviour * batch.loss_mask, timings=timings)
