"""The batch glossary, and the one place batch sizes are derived from an on-policy config (`derive_batch_plan`).

All counts are of *completions* unless named otherwise:

    local_batch_size   = per_device_train_batch_size * gradient_accumulation_steps * num_mini_batches  (per process)
    batch_size         = local_batch_size * world_size                            (per iteration, all processes)
    local_mini_batch   = local_batch_size / num_mini_batches    (one optimizer step, per process)
    micro_batch        = per_device_train_batch_size            (one forward/backward, per process), or with
                         max_tokens_per_micro_batch as many rows of similar length as fit that many tokens
    local_prompts      = local_batch_size / rloo_k              (prompts per process per iteration; GRPO:
    prompts/iteration  = batch_size / rloo_k                     num_generations instead of rloo_k)
    total_episodes     = given, or num_train_epochs x dataset rows x rloo_k (passes over the prompts, TRL 1.x's)
    iterations         = ceil(total_episodes / batch_size), or with max_steps (optimizer steps, TRL's):
                         ceil(max_steps / (num_ppo_epochs * num_mini_batches)), total_episodes = iterations * batch_size

Epochs with a partial last batch: TRL's RepeatSampler drops the prompts left over after the last whole generation
batch of each epoch (7 prompts at 2 per batch: 3 batches an epoch); here the prompt order runs on into the next
epoch and the count rounds up (4), so no prompt is skipped and an epoch boundary may fall inside an iteration
(RELIABILITY.md, guarantee 6). A TRL config whose prompts are not a multiple of its generation batch therefore
trains up to one iteration more per run; max_steps gives TRL's count exactly.

TRL 1.x's steps_per_generation and generation_batch_size are other spellings of num_mini_batches; they are
resolved into it here too. So is the async schedule's depth (`iterations_ahead`), which max_inflight_tasks gives
in completions: derived with the plan, a recipe's --dry-run refuses what its run would.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

from training_wizard.errors import UserError
from training_wizard.spec import key_path


class BatchSettings(Protocol):
    """What the derivation reads from a config (trainers/config/on_policy.py's OnPolicyConfig)."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    num_mini_batches: int
    steps_per_generation: int | None
    generation_batch_size: int | None
    total_episodes: int | None
    num_train_epochs: float
    max_steps: int | None
    num_ppo_epochs: int
    group_key: str

    @property
    def model_fields_set(self) -> set[str]: ...

    def group_size(self) -> int: ...


@dataclass(frozen=True)
class BatchPlan:
    world_size: int
    local_batch_size: int
    batch_size: int
    local_mini_batch_size: int
    micro_batch_size: int
    local_prompts: int
    prompts_per_iteration: int
    total_episodes: int
    num_iterations: int
    iterations_ahead: int = 0  # the async schedule's depth (rollout/asynchronous.py reads it); 0 when synchronous
    max_tokens_per_micro_batch: int | None = None  # micro-batches by tokens (trainers/loop/token_budget.py)

    def rows(self) -> list[tuple[str, int | str]]:
        """The batch sizes --dry-run shows (the schedule's depth is the async keys' business, not a size); with
        a token budget the micro-batch is a number of tokens, not of completions."""
        rows: list[tuple[str, int | str]] = []
        for name, value in asdict(self).items():
            if name == "micro_batch_size" and self.max_tokens_per_micro_batch is not None:
                rows.append((name, f"by tokens: <= {self.max_tokens_per_micro_batch} tokens per pass"))
            elif name not in ("iterations_ahead", "max_tokens_per_micro_batch"):
                rows.append((name, value))
        return rows


def mini_batches_from_steps_per_generation(config: BatchSettings) -> int:
    """num_mini_batches for a config that sets steps_per_generation: TRL counts micro-batches, we count optimizer
    steps. A ValueError (the config is being validated) when it contradicts the other batch keys."""
    if config.generation_batch_size is not None:
        raise ValueError("set generation_batch_size or steps_per_generation, not both (they say the same thing)")
    steps, accumulation = config.steps_per_generation, config.gradient_accumulation_steps
    if steps % accumulation:
        raise ValueError(f"steps_per_generation ({steps}) must be a multiple of gradient_accumulation_steps "
                         f"({accumulation}): it counts forward/backward passes per rollout, as in TRL; for {steps} "
                         f"optimizer steps per rollout set num_mini_batches = {steps} instead")
    derived = steps // accumulation
    if "num_mini_batches" in config.model_fields_set and config.num_mini_batches != derived:
        raise ValueError(f"steps_per_generation ({steps}) means num_mini_batches = {derived}, but "
                         f"num_mini_batches is {config.num_mini_batches}; set one of them")
    return derived


def mini_batches_from_generation_batch_size(config: BatchSettings, world_size: int) -> int:
    """num_mini_batches for a config that sets generation_batch_size, once the number of processes is known."""
    per_step = config.per_device_train_batch_size * world_size * config.gradient_accumulation_steps
    if config.generation_batch_size % per_step:
        raise UserError(
            f"{key_path(config, None, 'training')}: generation_batch_size ({config.generation_batch_size}) must be a multiple of "
            f"per_device_train_batch_size x processes x gradient_accumulation_steps ({per_step})"
        )
    return config.generation_batch_size // per_step


def derive_batch_plan(config: BatchSettings, world_size: int, dataset_rows: int | None) -> BatchPlan:
    """Every batch size of a config whose num_mini_batches is final, checking divisibility with an error that names
    both numbers."""
    local = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.num_mini_batches
    group = config.group_size()
    if local % group:
        raise UserError(
            f"{key_path(config, None, 'training')}: local_batch_size ({local} = per_device_train_batch_size {config.per_device_train_batch_size}"
            f" x gradient_accumulation_steps {config.gradient_accumulation_steps} x num_mini_batches"
            f" {config.num_mini_batches}) must be a multiple of {config.group_key} ({group})"
        )
    batch = local * world_size
    ahead = iterations_ahead(config, batch)
    total = config.total_episodes
    if config.max_steps is not None:
        if total is not None:
            raise UserError(f"{key_path(config, None, 'training')}: set max_steps (optimizer steps) or "
                            "total_episodes (completions), not both")
        steps_per_iteration = config.num_ppo_epochs * config.num_mini_batches
        total = math.ceil(config.max_steps / steps_per_iteration) * batch
    if total is None:
        if dataset_rows is None:
            raise UserError(f"{key_path(config, 'total_episodes', 'training')}: required when the dataset size is "
                            "unknown")
        # passes over the prompts, as TRL 1.x counts epochs: each prompt gets its group's completions
        total = max(1, int(config.num_train_epochs * dataset_rows)) * group
    return BatchPlan(
        world_size=world_size,
        local_batch_size=local,
        batch_size=batch,
        local_mini_batch_size=local // config.num_mini_batches,
        micro_batch_size=config.per_device_train_batch_size,
        local_prompts=local // group,
        prompts_per_iteration=batch // group,
        total_episodes=total,
        num_iterations=math.ceil(total / batch),
        iterations_ahead=ahead,
        max_tokens_per_micro_batch=getattr(config, "max_tokens_per_micro_batch", None),
    )


def iterations_ahead(config, batch_size: int) -> int:
    """Iterations sampled ahead of the one being trained (the async schedule, rollout/asynchronous.py): 0 in the
    synchronous loop, max_staleness by default, else max_inflight_tasks over the `batch_size` completions of one
    iteration, which must divide it (batches are sampled ahead whole)."""
    if not getattr(config, "samples_ahead", False):
        return 0
    if config.max_inflight_tasks == -1:
        return config.max_staleness
    if config.max_inflight_tasks % batch_size:
        raise UserError(f"{key_path(config, 'max_inflight_tasks', 'training')}: {config.max_inflight_tasks} is not a "
                        f"multiple of the {batch_size} completions of one iteration (batches are sampled ahead "
                        f"whole); use a multiple of {batch_size}, or -1 for max_staleness iterations' worth")
    return config.max_inflight_tasks // batch_size
