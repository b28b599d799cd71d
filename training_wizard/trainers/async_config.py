"""The asynchronous-rollout options of the on-policy configs (trainers/config.py), in TRL's async names and
units where TRL has them. docs/async.md explains the schedule, the bound and the correction."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, model_validator

from training_wizard.trainers.run_config import RunConfig


class AsyncRolloutOptions(RunConfig):
    """Rollouts sampled by weights one update older than those they train: the one-step-off-policy schedule."""

    async_rollouts: bool = Field(
        False, description="Sample each iteration's next batch with the weights before this iteration's update "
        "(one-step-off-policy, as veRL's one-step-off trainer and TRL's async GRPO with max_staleness = 1); the "
        "update then trains on rows one optimizer update stale, corrected by importance weights "
        "(docs/async.md). Deterministic for a seed. Off: the synchronous loop.")
    max_staleness: NonNegativeInt = Field(
        1, description="Updates a row's sampling weights may lag the weights it trains (TRL counts weight syncs; "
        "here each update is one). 0 gives the synchronous loop exactly; 1 is the one-step-off schedule. Larger "
        "bounds are not built yet.")
    async_producer: Literal["thread", "inline"] = Field(
        "thread", description="Where the batch ahead is sampled: 'thread', in a thread of its own with a copy of the "
        "policy, while the update runs (one process, the decode loop; elsewhere 'inline' is used); 'inline', in "
        "the training thread before the update. Both give the same numbers.")
    async_producer_timeout: PositiveFloat = Field(
        3600.0, description="Seconds the update waits for the producer's batch before the run stops with one line.")

    @model_validator(mode="after")
    def _staleness_built(self) -> AsyncRolloutOptions:
        if self.async_rollouts and self.max_staleness > 1:
            raise ValueError(f"max_staleness = {self.max_staleness}: only 0 (synchronous) and 1 (one-step-off) are "
                             "built yet")
        return self

    @property
    def one_step_off(self) -> bool:
        """Whether the next batch is sampled before the update (async_rollouts with a bound of 1)."""
        return self.async_rollouts and self.max_staleness >= 1
