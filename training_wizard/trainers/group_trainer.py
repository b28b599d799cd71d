"""What GRPO and RLOO share beyond the loop in trainers/base.py: one keyword-only constructor, which prepares the
prompt rows (TRL's environment modes, the rows' checks) and the tokenizer's chat template variables, and the
metrics under TRL's names (trainers/group_metrics.py, trainers/scored_rows.py)."""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator

from training_wizard.errors import UserError
from training_wizard.rollout.episode_start import environment_rows
from training_wizard.specs.chat_rendering import bind_chat_template_kwargs
from training_wizard.specs.prompt_rows import check_prompt_rows
from training_wizard.trainers.base import OnPolicyTrainer
from training_wizard.trainers.config import OnPolicyConfig
from training_wizard.trainers.group_metrics import GroupMetrics
from training_wizard.trainers.scored_rows import ScoredRowsMetrics


class GroupTrainer(ScoredRowsMetrics, GroupMetrics, OnPolicyTrainer):
    """A trainer sampling a group of completions per prompt (GRPO, RLOO)."""

    def __init__(self, *, config: OnPolicyConfig, tokenizer, policy, reward_model, train_dataset, ref_policy=None,
                 eval_dataset=None, accelerator: Accelerator | None = None, **sources: Any):
        """`reward_model`: a sequence classifier sharing the policy's tokenizer, a RewardSpec, a callable
        `fn(prompts, completions, **columns) -> list[float]`, or None when an environment scores the episodes;
        `sources`: `generation_backend`, `rollout_source`, and `environment_factory`, `tools` and
        `episode_settings` for episodes, as for every trainer (trainers/base.py)."""
        train_dataset = training_rows(config, train_dataset, eval_dataset, sources.get("environment_factory"))
        bind_chat_template_kwargs(tokenizer, config.chat_template_kwargs)
        super().__init__(config=config, tokenizer=tokenizer, policy=policy, reward_model=reward_model,
                         train_dataset=train_dataset, ref_policy=ref_policy, eval_dataset=eval_dataset,
                         accelerator=accelerator, **sources)


def training_rows(config: OnPolicyConfig, train_dataset: Any, eval_dataset: Any, environment_factory: Any) -> Any:
    """The train rows, in TRL's modes where the environment supplies the prompt made of its placeholders; both
    datasets checked, so that a bad row is refused before any model loads (the TRL-form constructor calls this
    before loading its model= too)."""
    if environment_factory is not None:
        train_dataset = environment_rows(train_dataset, environment_factory,
                                         rows_for_one_iteration(config, train_dataset))
    for name, rows in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if rows is not None:
            check_prompt_rows(rows, name)
    return train_dataset


def rows_for_one_iteration(config: OnPolicyConfig, train_dataset: Any) -> int:
    """Without a dataset, `reset` supplies every prompt: one iteration's worth of placeholder rows (on one process),
    so that max_steps, which TRL then requires, sets the run's length (an epoch is one iteration)."""
    if train_dataset is not None:
        return 0  # unused: the rows given are kept
    if config.max_steps is None:
        raise UserError("train_dataset: not given, so the environment's reset supplies each prompt and max_steps "
                        "sets the run's length (as in TRL); set args.max_steps")
    return config.batch_plan(1).prompts_per_iteration
