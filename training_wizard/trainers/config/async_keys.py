"""The asynchronous-rollout options of the on-policy configs (trainers/config/on_policy.py), in TRL's async names and
units where TRL has them. docs/async.md explains the schedule, the bound and the correction."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from training_wizard.core.importance_sampling import ImportanceSamplingMode
from training_wizard.spec import KeyValueError, shown
from training_wizard.trainers.config.run import RunConfig

# The keys that only the asynchronous schedule reads: set to anything but their default without async_rollouts they
# would change nothing, which is refused rather than ignored. TRL 1.16's GRPOConfig and RLOOConfig have none of them
# (tests/fixtures/trl_1_16_config_fields.json), so a ported TRL config never sets them.
ASYNC_ONLY_KEYS = ("max_staleness", "max_inflight_tasks", "weight_sync_steps", "async_producer",
                   "async_producer_timeout", "async_correction")


class AsyncRolloutOptions(RunConfig):
    """Rollouts sampled ahead by older weights than those they train: the k-step-off-policy schedule."""

    async_rollouts: bool = Field(
        False, description="Sample the batches of the next iterations while this iteration updates (as veRL's "
        "one-step-off trainer and TRL's async GRPO): a batch is trained by weights newer than those that sampled "
        "it, and the update corrects for the gap with importance weights (docs/async.md). Deterministic for a "
        "seed. Off: the synchronous loop.")
    max_staleness: NonNegativeInt = Field(
        1, description="Weight syncs a row's sampling weights may lag the weights it trains (TRL's unit; with "
        "weight_sync_steps = 1 each update is one sync). Rows older than this when their iteration comes are "
        "dropped and their prompts sampled again with the current weights. 0: the synchronous loop exactly.")
    max_inflight_tasks: int = Field(
        -1, description="Completions sampled ahead of the batch being trained (TRL's unit), a multiple of the "
        "completions per iteration: the producer runs that many iterations ahead. -1: max_staleness iterations' "
        "worth (as TRL), the most the bound keeps without dropping rows.")
    weight_sync_steps: PositiveInt = Field(
        1, description="Updates between two pushes of the trained weights to the producer (TRL's key). Above 1 "
        "needs the producer thread, and staleness (in syncs) then counts pushes, not updates.")
    async_producer: Literal["thread", "inline"] = Field(
        "thread", description="Where the batches ahead are sampled: 'thread', in a thread of its own with a copy "
        "of the policy, while the update runs (one process, the decode loop; elsewhere 'inline' is used); "
        "'inline', in the training thread before the update. Both give the same numbers.")
    async_producer_timeout: PositiveFloat = Field(
        3600.0, description="Seconds the update waits for the producer's batch before the run stops with one line.")
    async_correction: ImportanceSamplingMode = Field(
        "token_truncate", description="How the importance weight exp(proximal - behaviour logprob) of a batch "
        "sampled ahead is bounded, in TRL's vllm_importance_sampling_mode names, within "
        "vllm_importance_sampling_clip_min and vllm_importance_sampling_clip_max: 'token_truncate' clamps each "
        "token's weight (TRL's cap); 'token_mask' zeroes the tokens outside the bounds (AReaL's rule, with "
        "clip_max = 5); 'sequence_mask' (the earlier default) and 'sequence_truncate' bound one weight per "
        "completion, the product over its tokens, which grows with the length (docs/async.md measures both). It "
        "replaces vllm_importance_sampling_mode wherever batches are sampled ahead (max_staleness of 1 or more), "
        "unless a recipe sets vllm_importance_sampling_mode and not this key: then that mode holds for every batch.")

    @model_validator(mode="after")
    def _async_options_agree(self) -> AsyncRolloutOptions:
        if not self.async_rollouts:
            refuse_async_keys_without_async(self)
            return self
        if self.max_inflight_tasks == 0 or self.max_inflight_tasks < -1:
            raise ValueError(f"max_inflight_tasks = {self.max_inflight_tasks}: expected -1 (automatic) or a "
                             "positive number of completions")
        for key, default in (("max_inflight_tasks", -1), ("async_correction", "token_truncate")):
            if self.max_staleness == 0 and getattr(self, key) != default:
                raise ValueError(f"max_staleness = 0 is the synchronous loop, which samples nothing ahead: leave "
                                 f"{key} at {shown(default)}")
        if self.weight_sync_steps > 1 and self.async_producer == "inline":
            raise ValueError("weight_sync_steps above 1 keeps the producer on older weights than the trainer's: "
                             "it needs async_producer = 'thread'")
        return self

    @property
    def samples_ahead(self) -> bool:
        """Whether batches are sampled ahead of their iteration (async_rollouts with a bound above 0)."""
        return self.async_rollouts and self.max_staleness >= 1


def refuse_async_keys_without_async(config: AsyncRolloutOptions) -> None:
    """A KeyValueError naming the first async-only key set to a value other than its default (a key written at
    its default asks for nothing and passes)."""
    for key in ASYNC_ONLY_KEYS:
        value, default = getattr(config, key), type(config).model_fields[key].default
        if key in config.model_fields_set and value != default:
            raise KeyValueError(key, f"{shown(value)} takes effect only with async_rollouts = true (sampling ahead of the "
                                f"update); set async_rollouts = true, or remove {key}")
