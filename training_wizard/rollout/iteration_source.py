"""What the training loop asks of its rollout source, iteration by iteration (`IterationSource`).

A `RolloutSource` (rollout/collector.py) only turns a request into a batch. The loop needs a little more of it:
this iteration's batch (`take`), a chance to prepare the next ones (`prepare_ahead`), its metrics, its part of the
checkpoint, whether its batches may have been sampled by older weights than they train (`off_policy`), and
`close`. `IterationSource` is the plain synchronous answer: each batch sampled now, with the current weights,
nothing ahead, nothing to save. A wrapper given to the trainer (`SourceWrapper`, e.g. rollout/asynchronous.py's
`with_async`) may replace it with a source of its own, from the run's `SourceContext`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from training_wizard.rollout.collector import RolloutCollector, RolloutSource
from training_wizard.rollout.prompts import RolloutRequest
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.signals import fault_point

# the request of iteration i (its prompts taken from the run's shared order)
RequestFor = Callable[[int], RolloutRequest]


@dataclasses.dataclass(frozen=True)
class TakenBatch:
    """An iteration's batch, the dataset prompts it trains on (logged to prompts.jsonl) and whether they were
    sampled again (its batch sampled ahead was dropped)."""

    batch: TrajectoryBatch
    prompt_ids: tuple[int, ...]
    reissued: bool = False


@dataclasses.dataclass(frozen=True)
class OffPolicyRule:
    """How the update treats batches that may have been sampled by older weights than they train: always
    corrected by the importance weights, whatever vllm_importance_sampling_correction says, and with a single
    update pass against that pass's own logprobs (the batch's were not recomputed). `report`: the update returns
    those corrections' metrics (trainers/loop/update.py)."""

    report: bool


@dataclasses.dataclass(frozen=True)
class SourceContext:
    """What a source wrapper may read of the run: the training config and batch plan, the accelerator and its
    collectives, the collector (the models, the reward and the logprob passes), the unwrapped policy as it is now,
    and the state of the shared prompt order before the next prompts are taken."""

    config: Any
    plan: Any
    accelerator: Any
    collectives: Any
    collector: RolloutCollector
    policy: Callable[[], torch.nn.Module]
    prompt_position: Callable[[], dict[str, Any]]


class IterationSource:
    """The synchronous loop's source: each iteration's batch sampled now by `source`, with the current weights."""

    off_policy: OffPolicyRule | None = None  # its batches are sampled by the weights that train them

    def __init__(self, source: RolloutSource):
        self.source = source

    def collect(self, request: RolloutRequest) -> TrajectoryBatch:
        """`request` sampled and scored now (the sample probes and evaluation ask for theirs here too)."""
        return self.source.collect(request)

    def sampled_now(self, request: RolloutRequest, iteration: int) -> TrajectoryBatch:
        """A training batch of `iteration`, sampled now (the `generation` fault point follows it)."""
        batch = self.collect(request)
        fault_point("generation", iteration)
        return batch

    def take(self, iteration: int, request_for: RequestFor) -> TakenBatch:
        """The batch that iteration `iteration` trains on."""
        request = request_for(iteration)
        return TakenBatch(self.sampled_now(request, iteration), request.prompt_ids)

    def prepare_ahead(self, iteration: int, request_for: RequestFor) -> None:
        """Called once the batch of `iteration` is taken, before its update: nothing to prepare here."""

    def metrics(self, batch: TrajectoryBatch, iteration: int) -> dict[str, float]:
        """The source's metrics of the iteration that trained `batch` (`iteration`: the iterations done)."""
        return {}

    def state_dict(self, run_state: dict[str, Any]) -> dict[str, Any]:
        """The run state a checkpoint saves (RunState.state_dict), with the source's own part: none here."""
        return run_state

    def load_state_dict(self, run_state: dict[str, Any]) -> None:
        """Restore the source's part of a saved run state: none here."""

    def close(self) -> None:
        """The run has ended (or stopped)."""


# makes the loop's source of the trainer's rollout source (rollout/asynchronous.py: `with_async`)
SourceWrapper = Callable[[RolloutSource, SourceContext], IterationSource]
