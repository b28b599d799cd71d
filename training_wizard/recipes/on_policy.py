"""What every on-policy recipe (RLOO, PPO) shares: the model, data and reward keys, and the run lifecycle.

`OnPolicyRecipe.main` builds everything from the specs, prints the batch plan (and stops there on --dry-run),
checks output_dir is writable, builds the trainer, and runs the lifecycle every recipe runs (`train_and_save`,
lifecycle.py): take output_dir (resume if asked, or refuse another run's files), write the resolved config, train,
save the final model; then its summary and report (`finish`). A stop signal leaves `train()` as
`TrainingInterrupted`, which the CLI turns into its exit code. A recipe subclass names its `[training]` config
class and its trainer class (`trainer_class`), or builds its trainer itself (`build_trainer`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, PrivateAttr, model_validator
from rich.console import Console
from rich.table import Table

from training_wizard.rollout.asynchronous import with_async
from training_wizard.errors import UserError
from training_wizard.recipes.base import Recipe
from training_wizard.recipes.memory_report import show_memory_plan
from training_wizard.spec import KeyValueError
from training_wizard.specs.chat_rendering import bind_chat_template_kwargs
from training_wizard.specs.dataset import DataSourceSpec
from training_wizard.specs.environment import EnvironmentSpec
from training_wizard.specs.episode import limits_from_environment
from training_wizard.specs.model import TransformerSpec
from training_wizard.specs.reward import RewardSpec
from training_wizard.trainers.config.batch_plan import BatchPlan
from training_wizard.trainers.config.on_policy import OnPolicyConfig


class OnPolicyRecipe(Recipe):
    """Model, prompt data and reward of an on-policy run; subclasses add `training` (and their own models)."""

    model: TransformerSpec = Field(description="The policy to train (hub id, local folder, or packaged model).")
    ref_model: TransformerSpec | None = Field(
        None, description="Reference model for the KL penalty. Default: the policy's starting weights."
    )
    dataset: DataSourceSpec | None = Field(
        None, description="Prompt-only training data. Rows without a prompt (only an `environment` column, say) "
        "are an [environment]'s: its reset supplies each prompt. Optional with an [environment] of one factory, "
        "whose reset then supplies every prompt and training.max_steps sets the run's length (TRL's modes, "
        "docs/environments.md).")
    eval_dataset: DataSourceSpec | None = Field(None, description="Prompts for evaluation every eval_steps.")
    reward: RewardSpec | None = Field(
        None, description="Scores each completion. Required, except with an [environment] whose own reward "
        "(get_reward, or a text environment's step rewards) is then the reward.")
    environment: EnvironmentSpec | None = Field(
        None, description="An environment (or tools): each rollout is an episode of several turns "
        "(docs/environments.md).")
    teacher_model: TransformerSpec | None = Field(
        None, description="A teacher whose per-token term joins the reward with training.distillation_coef "
        "(on-policy distillation beside the task reward; docs/algorithms.md). Its tokenizer must be the policy's.")
    merge_lora: bool = Field(False, description="Save the final model with the LoRA adapter merged into it.")
    training: OnPolicyConfig

    trainer_class: ClassVar[type]  # the OnPolicyTrainer subclass `build_trainer` makes
    _started: float = PrivateAttr(0.0)  # time.perf_counter() at main()'s start: the summary's wall time

    def build_trainer(self, config, tokenizer, train_rows, eval_rows, accelerator):
        """The policy (LoRA applied), its reference (none when the config uses none: GRPO with beta = 0 loads no
        reference at all) and `trainer_class` built from them."""
        policy = self.model.apply_lora(self.model.load_causal_lm(config.dtype))
        ref_policy = self.load_reference(config, policy, accelerator) if config.uses_reference else None
        return self.trainer_class(config=config, tokenizer=tokenizer, policy=policy, ref_policy=ref_policy,
                                  reward_model=self.reward, train_dataset=train_rows, eval_dataset=eval_rows,
                                  accelerator=accelerator, source_wrapper=with_async,
                                  **self.environment_factory(), **self.teacher_arguments(config, tokenizer))

    def teacher_arguments(self, config, tokenizer) -> dict[str, Any]:
        """The trainer's `teacher_model`, loaded with the policy's tokenizer (the same pad id and embedding size),
        when the recipe names one."""
        if self.teacher_model is None:
            return {}
        return {"teacher_model": self.teacher_model.load_causal_lm(config.dtype, tokenizer)}

    @model_validator(mode="after")
    def _teacher_with_its_coefficient(self) -> OnPolicyRecipe:
        if self.teacher_model is not None and self.training.distillation_coef == 0.0:
            raise KeyValueError("teacher_model", "given, but training.distillation_coef is 0: set it (e.g. 0.1) to "
                                "add the teacher's term to the reward, or remove [teacher_model]")
        if self.teacher_model is None and self.training.distillation_coef > 0.0:
            raise KeyValueError("training.distillation_coef", "needs a [teacher_model] table (the teacher whose "
                                "logprobs the term reads)")
        return self

    @model_validator(mode="after")
    def _teacher_key(self) -> OnPolicyRecipe:
        if self.teacher_model is not None:
            self.teacher_model._key = "teacher_model"  # its errors name [teacher_model], not [model]
        return self

    @model_validator(mode="after")
    def _episode_limits_in_one_place(self) -> OnPolicyRecipe:
        if self.environment is not None:
            limits_from_environment(self.environment, self.training, "training.")
        return self

    @model_validator(mode="after")
    def _something_gives_prompts(self) -> OnPolicyRecipe:
        if self.dataset is not None:
            return self
        if self.environment is None or self.environment.factory is None:
            raise KeyValueError("dataset", "required (a [dataset] table of prompts), unless an [environment] "
                                "factory's reset supplies each prompt")
        if isinstance(self.environment.factory, dict):
            raise KeyValueError("dataset", "required with a table of environment factories: rows whose "
                                f"`environment` column names each row's factory (e.g. {{\"environment\": "
                                f"\"{next(iter(self.environment.factory))}\"}}), or name one factory")
        if self.training.max_steps is None:
            raise KeyValueError("dataset", "not given, so the environment's reset supplies each prompt and "
                                "training.max_steps sets the run's length; set training.max_steps, or add a "
                                "[dataset]")
        return self

    @model_validator(mode="after")
    def _something_scores(self) -> OnPolicyRecipe:
        if self.reward is None and self.environment is None:
            raise ValueError("reward: required (a [reward] table), unless an [environment] scores the episodes")
        # TRL's constructor arguments that only the Python API reads (trl/arguments.py)
        for key, table in (("model_init_kwargs", "[model] (revision, trust_remote_code, attn_implementation, "
                                                 "from_pretrained_kwargs) and [training] dtype"),
                           ("reward_weights", "[reward] reward_weights, beside reward_funcs")):
            if getattr(self.training, key, None) is not None:
                raise ValueError(f"training.{key}: a recipe sets these in {table}")
        return self

    def environment_factory(self) -> dict[str, Any]:
        """The trainer's environment arguments (`environment_factory`, `episode_settings`), when the recipe names
        an environment."""
        if self.environment is None:
            return {}
        return {"environment_factory": self.environment.load(), "episode_settings": self.environment.settings()}

    def use_chat_template(self, tokenizer) -> None:
        """An environment's training template replaces the model's before any prompt is rendered, and the
        template is checked for episodes at start (--dry-run included): one line, exit 2, when it cannot serve."""
        if self.environment is None:
            return
        from training_wizard.rollout.chat_turns import TurnRenderer
        from training_wizard.rollout.episodes import use_episode_chat_template

        use_episode_chat_template(tokenizer, self.environment.chat_template)
        TurnRenderer(tokenizer, with_tools=self.environment.protocol == "tools")

    def load_reference(self, config, policy, accelerator):
        """The `[ref_model]`; else None (the trainer copies the starting policy, or disables a LoRA adapter),
        except under ZeRO-3, where a full policy is partitioned and the reference is the model loaded again."""
        from training_wizard.sharding import needs_separate_reference

        if self.ref_model:
            return self.ref_model.load_causal_lm(config.dtype)
        if needs_separate_reference(accelerator, policy):
            return self.model.load_causal_lm(config.dtype)
        return None

    # ------------------------------------------------------------------------------------------- the lifecycle
    def main(self, dry_run: bool = False, memory_budget: int | None = None) -> None:
        """Build and run (or on --dry-run only plan) the run. The memory plan is printed on --dry-run, or before the
        run when `memory_budget` (bytes, the CLI's --memory-budget) is given."""
        self._started = time.perf_counter()
        config = self.training_config()
        accelerator, console = self.open_run(config)
        tokenizer = self.model.load_tokenizer()
        self.use_chat_template(tokenizer)
        bind_chat_template_kwargs(tokenizer, config.chat_template_kwargs)  # before any prompt is rendered
        train_rows = self._training_prompts(config, accelerator.num_processes, tokenizer, console)
        plan = config.batch_plan(accelerator.num_processes, len(train_rows))
        console.print(batch_table(plan))
        for note in batch_notes(plan, len(train_rows)):
            console.print(f"note: {note}", soft_wrap=True)
        self.check_can_start(config, accelerator, console, train_rows)
        eval_rows = self._load_prompts(self.eval_dataset, "eval_dataset", tokenizer, console) if self.eval_dataset else None
        if dry_run or memory_budget is not None:
            show_memory_plan(self, config, accelerator, tokenizer, train_rows, console, memory_budget)
        if dry_run:
            self._show_prompts(train_rows, tokenizer, console)
            return
        self.prepare_output(accelerator)
        trainer = self.build_trainer(config, tokenizer, train_rows, eval_rows, accelerator)
        warn_long_prompts(trainer, console)
        self.train_and_save(trainer, console, merge_lora=self.merge_lora)

    def finish(self, trainer, console: Console) -> None:
        """After the final save (main process): the summary, model card and report, and the upload with
        push_to_hub."""
        if trainer.accelerator.is_main_process:
            self.finish_outputs(time.perf_counter() - self._started, console)
            self.push_final_model(trainer.config, console)

    def check_can_start(self, config, accelerator, console: Console, train_rows=None) -> None:
        """What a run checks before it loads any model, and `--dry-run` with it (the same call): trackers and the
        generation backend (vLLM installed, a launch it runs under); a [teacher_model] (loadable, the policy's
        tokenizer: recipes/teacher.py); with an [environment], one environment built
        and reset on the first row of `train_rows` it serves, its tools and a reward (rollout/environment_check.py);
        warnings about likely mistakes."""
        from training_wizard.trainers.loop.setup import check_generation_can_start

        super().check_can_start(config, accelerator, console)
        check_generation_can_start(accelerator, config)
        if self.teacher_model is not None:
            from training_wizard.recipes.teacher import check_teacher

            check_teacher(self.model, self.teacher_model)
        if self.environment is not None and train_rows is not None:
            self.check_episodes_can_start_everywhere(accelerator, train_rows)
        from training_wizard.sharding import zero3_lora_warning

        warnings = [*config.start_warnings(), zero3_lora_warning(accelerator, self.model.lora is not None)]
        for warning in filter(None, warnings):
            console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)

    def check_episodes_can_start_everywhere(self, accelerator, train_rows) -> None:
        """Every process builds and resets an environment on the first row it serves (each plays its own episodes,
        and an OpenEnv server may answer one process and not another); then all of them stop with the first error
        any process found, so no process loads models and waits alone in a collective for one that has left."""
        from training_wizard.collectives import Collectives
        from training_wizard.rollout.environment_check import check_episodes_can_start

        error = None
        try:
            check_episodes_can_start(self.environment.load(), self.environment.settings(), self.reward is not None,
                                     train_rows)
        except UserError as failure:
            error = str(failure)
        Collectives(accelerator).raise_if_any_failed(error)

    def finish_outputs(self, wall_seconds: float, console: Console) -> None:
        """After the final save (main process): the model card, plots and report.html, and the run's summary as the
        last lines in the terminal."""
        from training_wizard.checkpoint import library_versions
        from training_wizard.tracking.model_card import write_model_card
        from training_wizard.tracking.report import write_run_outputs
        from training_wizard.tracking.summary import run_summary

        model_dir = Path(self.output_dir) / "model"
        summary = run_summary(self.output_dir, base_model=self.model.model_name(), wall_seconds=wall_seconds)
        write_model_card(model_dir, summary, library_versions())
        report = write_run_outputs(self.output_dir, summary)
        console.rule("run summary")
        for line in summary.lines():
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        console.print(f"report: {report}  (plots: {Path(self.output_dir) / 'metrics.png'})", markup=False,
                      highlight=False, soft_wrap=True)

    def _training_prompts(self, config, num_processes: int, tokenizer, console: Console):
        """The [dataset]'s prompts; without one (an environment's reset supplies each prompt, TRL's mode), one
        iteration's worth of rows with an empty prompt, so an epoch is one iteration and max_steps decides."""
        if self.dataset is not None:
            return self._load_prompts(self.dataset, "dataset", tokenizer, console)
        from datasets import Dataset

        from training_wizard.rollout.environments import environment_rows

        count = config.batch_plan(num_processes).prompts_per_iteration
        return Dataset.from_list(environment_rows(None, self.environment.load(), count))

    def _load_prompts(self, spec: DataSourceSpec, label: str, tokenizer, console: Console):
        from training_wizard.rollout.environments import environment_rows
        from training_wizard.specs.dataset import filter_long_prompts, validate_prompts

        dataset = spec.load(label)
        if self.environment is not None:  # rows without a prompt: the environment's reset supplies it
            dataset = environment_rows(dataset, self.environment.load(), len(dataset))
        validate_prompts(dataset, label)
        if getattr(spec, "filter_length", False):
            dataset, dropped = filter_long_prompts(dataset, tokenizer, self.training.response_length)
            console.print(f"{label}: filter_length dropped {dropped} prompt(s) longer than 0.9 x response_length")
            if len(dataset) == 0:
                raise UserError(f"{label}: filter_length dropped every prompt; raise training.response_length")
        return dataset

    def _show_prompts(self, rows, tokenizer, console: Console) -> None:
        from training_wizard.rollout.prompts import render_prompt

        for index in range(min(3, len(rows))):
            text = tokenizer.decode(render_prompt(tokenizer, rows[index]["prompt"]))
            console.rule(f"prompt {index}")
            console.print(text, markup=False, highlight=False)


def batch_notes(plan: BatchPlan, dataset_rows: int) -> list[str]:
    """What a batch larger than the run or the dataset will do, said once at the start."""
    notes = []
    if plan.batch_size > plan.total_episodes:
        notes.append(f"one iteration is batch_size = {plan.batch_size} completions, more than total_episodes "
                     f"({plan.total_episodes}): the run trains 1 iteration of {plan.batch_size} completions")
    if plan.prompts_per_iteration > dataset_rows:
        notes.append(f"each iteration takes {plan.prompts_per_iteration} prompts but the dataset has {dataset_rows}: "
                     "prompts repeat within an iteration")
    return notes


def warn_long_prompts(trainer, console: Console) -> None:
    """Prompts longer than the model's context minus response_length run past the positions it was trained on
    (RoPE models accept them silently): say how many, once."""
    limit = getattr(getattr(trainer.unwrapped_policy, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int):
        return
    room = limit - trainer.config.response_length
    too_long = sum(len(ids) > room for ids in trainer.train_prompts.input_ids)
    if too_long:
        console.print(f"warning: {too_long} prompt(s) are longer than max_position_embeddings ({limit}) minus "
                      f"response_length ({trainer.config.response_length}); set dataset.filter_length = true or "
                      "shorten them", soft_wrap=True)


def batch_table(plan: BatchPlan) -> Table:
    table = Table(title="batch plan (completions unless noted)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for name, value in plan.rows():
        table.add_row(name, str(value))
    return table
