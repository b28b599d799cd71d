"""What GRPO and RLOO share beyond the loop in trainers/loop/on_policy.py: one keyword-only constructor, which prepares the
prompt rows (TRL's environment modes, the rows' checks) and the tokenizer's chat template variables, the inputs
of TRL's reward metrics (computed in trainers/loop/iteration_metrics.py), TRL's names of evaluation's metrics, and the
counters train()'s TrainOutput reads (trl/callbacks.py)."""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator

from training_wizard.core.advantages import ShapedRewards
from training_wizard.core.grpo import group_advantages
from training_wizard.errors import UserError
from training_wizard.rollout.environments import environment_rows
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.specs.chat_rendering import bind_chat_template_kwargs
from training_wizard.specs.prompt_rows import check_prompt_rows
from training_wizard.trainers.loop.on_policy import OnPolicyTrainer
from training_wizard.trainers.config.on_policy import OnPolicyConfig
from training_wizard.trainers.loop.iteration_metrics import TRLRewardInputs


class GroupTrainer(OnPolicyTrainer):
    """A trainer sampling a group of completions per prompt (GRPO, RLOO)."""

    trl_loss_sum = 0.0  # `loss` times the optimizer steps of each iteration since train() began
    trl_loss_steps = 0  # those optimizer steps
    trl_step_time = 0.0  # seconds per optimizer step of the last iteration

    def __init__(self, *, config: OnPolicyConfig, tokenizer, policy, reward_model, train_dataset, ref_policy=None,
                 eval_dataset=None, accelerator: Accelerator | None = None, **sources: Any):
        """`reward_model`: a sequence classifier sharing the policy's tokenizer, a RewardSpec, a callable
        `fn(prompts, completions, **columns) -> list[float]`, or None when an environment scores the episodes;
        `sources`: `generation_backend`, `rollout_source`, and `environment_factory`, `tools` and
        `episode_settings` for episodes, as for every trainer (trainers/loop/on_policy.py)."""
        train_dataset = training_rows(config, train_dataset, eval_dataset, sources.get("environment_factory"))
        bind_chat_template_kwargs(tokenizer, config.chat_template_kwargs)
        super().__init__(config=config, tokenizer=tokenizer, policy=policy, reward_model=reward_model,
                         train_dataset=train_dataset, ref_policy=ref_policy, eval_dataset=eval_dataset,
                         accelerator=accelerator, **sources)

    def trl_reward_inputs(self, rollout: TrajectoryBatch, shaped: ShapedRewards) -> TRLRewardInputs:
        """By default a row's group scored all its completions alike, and each row's KL summed over its tokens
        where TRL logs `kl` (beta != 0)."""
        return TRLRewardInputs(std_is_zero=group_advantages(rollout.scores.float(), rollout.group_ids)[1],
                               kl_sum=shaped.kl if self.config.kl_coef != 0.0 else None)

    def wall_clock_logs(self, metrics: dict[str, float]) -> dict[str, float]:
        """TRL's `step_time` for `state.log_history` beside a training record: a wall-clock figure kept out of
        metrics.jsonl, whose values two runs of one recipe repeat exactly apart from eps, time/* and tokens_per_s."""
        return {"step_time": self.trl_step_time} if "loss" in metrics else {}

    def evaluate(self) -> dict[str, float]:
        """Ours (eval/*) and TRL's eval_ names of the same values (reward, completion length)."""
        metrics = super().evaluate()
        metrics["eval_reward"] = metrics["eval/scores"]
        metrics["eval_completions/mean_length"] = metrics["eval/response_length"]
        return metrics


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
