"""The on-policy training loop shared by RLOO, PPO and GRPO. Read `OnPolicyTrainer._iteration` first.

One iteration:
  1. take this process's prompts of the shared order          `iteration_prompts` (rollout/prompts.py)
  2-5. sample, truncate, logprobs (policy, reference), score   the loop's source's `take` (rollout/iteration_source.py,
                                                              rollout/collector.py): a TrajectoryBatch
  6. shape rewards with KL and compute advantages             subclass: `shape_rewards` (math in core/)
  7. update: epochs x mini-batches x gradient accumulation    `_update` (trainers/loop/update.py), subclass `micro_batch_loss`
  8. log metrics and samples, evaluate, checkpoint            `_record_iteration`; the metrics:
                                                              trainers/loop/iteration_metrics.py

Reliability (RELIABILITY.md): a stop signal is honoured at two safe points per iteration (before the update, with
the iteration's starting state; after the iteration), agreed across processes; numerical guards (guards.py) check
the rollout and every mini-batch; a checkpoint restores the run exactly (weights, optimizer, scheduler, RunState).
Every cross-process collective goes through `self.collectives` (collectives.py). The models, optimizer and
schedule are set up once by trainers/loop/setup.py; the update loop of step 7 is in trainers/loop/update.py.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from training_wizard import guards
from training_wizard.collectives import Collectives
from training_wizard.core.advantages import ShapedRewards
from training_wizard.core.kl import kl_per_token
from training_wizard.errors import UserError
from training_wizard.lifecycle import RunLifecycle
from training_wizard.rollout.backends import GenerationBackend
from training_wizard.rollout.episodes import episode_source, prepare_episodes
from training_wizard.rollout.collector import RolloutCollector, RolloutSource, SamplingSettings
from training_wizard.rollout.generation import default_stop_token_ids
from training_wizard.rollout.iteration_source import IterationSource, SourceContext, SourceWrapper
from training_wizard.rollout.prompts import EncodedPrompts, IterationPrompts, RolloutRequest, longest_prompt, row_seed
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.signals import StopRequest, fault_point
from training_wizard.timeouts import StoppedWhileWaiting
from training_wizard.specs.environment import EnvironmentReward
from training_wizard.specs.episode import EpisodeSettings
from training_wizard.specs.reward import RewardSpec
from training_wizard.tracking import MetricsLogger, ProgressDisplay, PromptLog, SampleTable
from training_wizard.trainers.config.on_policy import OnPolicyConfig
from training_wizard.trainers.loop.environment_failures import stop_on_environment_failures
from training_wizard.trainers.loop.iteration_metrics import IterationMetrics, TRLRewardInputs, record_samples
from training_wizard.trainers.loop.setup import as_reward, prepare_models, resolve_logprobs_from_sampling
from training_wizard.trainers.loop.setup import generation_backend as choose_generation_backend
from training_wizard.trainers.loop.run_state import RunState
from training_wizard.trainers.loop.teacher import (
    TEACHER_LOGPROBS, prepare_teacher, teacher_logprobs_pass, with_distillation_reward,
)
from training_wizard.trainers.loop.step import OptimizerStep, check_accumulation, make_accelerator, stop_with_checkpoint
from training_wizard.trainers.loop.update import MicroBatchLoss, PolicyForward, UpdateLoop, UpdateResult


class OnPolicyTrainer(UpdateLoop):
    """The shared loop. Subclasses implement `shape_rewards` (step 6) and `micro_batch_loss` (step 7).

    The checkpoint interface (checkpoint.py) is public: `accelerator`, `collectives`, `config`, `optimizer`,
    `lr_scheduler`, `state`, `checkpoint_models()` and `last_saved_step`.
    """

    config: OnPolicyConfig
    last_saved_step: int | None = None  # step of the newest checkpoint written or loaded

    def __init__(
        self,
        config: OnPolicyConfig,
        tokenizer,
        policy: torch.nn.Module,
        reward_model: torch.nn.Module | RewardSpec | Callable[..., list[float]] | None,
        train_dataset,
        ref_policy: torch.nn.Module | None = None,
        eval_dataset=None, accelerator: Accelerator | None = None,
        additional_models: dict[str, torch.nn.Module] | None = None,
        generation_backend: GenerationBackend | None = None,
        rollout_source: RolloutSource | Callable[[RolloutCollector], RolloutSource] | None = None,
        environment_factory: Callable[[], Any] | dict[str, Callable[[], Any]] | None = None,
        tools: list[Callable] | None = None,
        episode_settings: EpisodeSettings | None = None, source_wrapper: SourceWrapper | None = None,
        teacher_model: torch.nn.Module | None = None):
        """additional_models: models trained beside the policy with the same optimizer, by checkpoint folder name
        (PPO's value model). generation_backend: what samples completions (rollout/backends.py), instead of the
        one the config chooses. rollout_source: what makes each iteration's TrajectoryBatch instead of the
        single-turn collector; a callable is given that collector (it holds the models, the reward and the
        backend, and runs the logprob passes and scoring of any token batch) and returns the source.
        environment_factory (a mapping of them routes rows by their `environment` column) and tools, TRL's
        arguments: the rollout becomes episodes (rollout/episodes.py) played as `episode_settings` say; then
        reward_model may be None (the environment's reward is the reward). source_wrapper: what the loop asks for
        each iteration's batch, made of that source (default: `IterationSource`, sampled now). teacher_model: see
        trainers/loop/teacher.py."""
        self.tokenizer, self.lifecycle = tokenizer, RunLifecycle(self)  # the lifecycle holds output_dir
        episodes = prepare_episodes(tokenizer, environment_factory, tools, episode_settings, reward_model is not None)
        self.accelerator = accelerator or make_accelerator(config)
        # generation_batch_size becomes num_mini_batches before anything reads it (it depends on the process count)
        self.config = config = config.for_processes(self.accelerator.num_processes)
        check_accumulation(self.accelerator, config.gradient_accumulation_steps)
        self.collectives = Collectives(self.accelerator)
        set_seed(config.seed)
        if tokenizer.pad_token_id is None:
            raise UserError("model: the tokenizer has no pad token; set one (e.g. tokenizer.pad_token = ...)")
        self.train_prompts = EncodedPrompts.from_rows(train_dataset, tokenizer)
        self.eval_prompts = EncodedPrompts.from_rows(eval_dataset, tokenizer) if eval_dataset is not None else None
        self.plan = config.batch_plan(self.accelerator.num_processes, len(self.train_prompts))
        self.state = RunState(config.seed, len(self.train_prompts))
        self.iteration_prompts = self._iteration_prompts()
        self.reward = as_reward(EnvironmentReward() if reward_model is None and episodes else reward_model)
        self._setup_models(policy, ref_policy, additional_models or {}, teacher_model)
        longest = longest_prompt(self.train_prompts, self.eval_prompts)
        self.generation = generation_backend or choose_generation_backend(
            self.accelerator, config, self.unwrapped_policy, longest, self.collectives)
        # decided once: "auto" becomes True or False here (trainers/loop/setup.py)
        self.logprobs_from_sampling = resolve_logprobs_from_sampling(config, self.accelerator, self.unwrapped_policy)
        self.collector = RolloutCollector(
            accelerator=self.accelerator, collectives=self.collectives, tokenizer=tokenizer,
            settings=self._sampling_settings(), policy=self.policy, ref_policy=self.ref_policy, reward=self.reward,
            extra_passes={**self.extra_rollout_passes(), **self.teacher_rollout_passes()}, backend=self.generation,
        )
        self.rollout_source = self._choose_rollout_source(rollout_source, environment_factory, episodes, source_wrapper)
        self.is_main = self.accelerator.is_main_process
        self.metrics = MetricsLogger(config.output_dir, config.report_to, self.is_main, config.model_dump(mode="json"))
        self.samples = SampleTable(config.output_dir, enabled=self.is_main)
        self.prompt_log = PromptLog(config.output_dir, enabled=self.is_main)
        events = config.num_sample_generations
        self.sample_every = max(1, self.plan.num_iterations // events) if events else 0

    # ---------------------------------------------------------------------------------------------- set-up
    def _choose_rollout_source(self, rollout_source, environment_factory, episodes,
                               source_wrapper: SourceWrapper | None) -> IterationSource:
        """The loop's source (`source_wrapper`'s, else `IterationSource`) of the given source (or what its factory
        makes of the collector), episodes with the given environment, or the single-turn collector."""
        if episodes is not None:
            rollout_source = episode_source(environment_factory, episodes, self.config)
        if rollout_source is None:
            rollout_source = self.collector
        elif not hasattr(rollout_source, "collect"):
            rollout_source = rollout_source(self.collector)
        context = SourceContext(self.config, self.plan, self.accelerator, self.collectives, self.collector,
                                lambda: self.unwrapped_policy, lambda: self.state.prompt_order.state_dict())
        source = source_wrapper(rollout_source, context) if source_wrapper else IterationSource(rollout_source)
        self.state.parts.append(source)
        return source

    def _iteration_prompts(self) -> IterationPrompts:
        """This process's requests of the training prompts, in the shared order the run state keeps."""
        config, plan = self.config, self.plan
        return IterationPrompts(self.train_prompts, self.state, config.seed, config.group_size(),
                                plan.prompts_per_iteration, plan.local_prompts, self.accelerator.process_index)

    def _sampling_settings(self) -> SamplingSettings:
        config = self.config
        return SamplingSettings(
            response_length=config.response_length, temperature=config.temperature,
            stop_token_ids=self._stop_token_ids(), pad_token_id=self.tokenizer.pad_token_id,
            forward_batch_size=config.local_rollout_forward_batch_size,
            missing_eos_penalty=config.missing_eos_penalty,
            gather_weights_for_generation=config.ds3_gather_for_generation,
            logprobs_from_sampling=self.logprobs_from_sampling,
            share_prompts=self.shared_prompt_passes, head_logprobs=self.rollout_head_logprobs,
            padding_free=config.padding_free,
            reference_logprobs=config.uses_reference, filters=config.sampling_filters(),
            reward_timeout=config.reward_timeout, max_tokens_per_forward=config.max_tokens_per_micro_batch,
        )

    def _stop_token_ids(self) -> tuple[int, ...]:
        """stop_token_ids, else stop_token_id, else with stop_token = "eos" the tokenizer's EOS and the ids of the
        policy's generation_config.eos_token_id (TRL's default); () without a stop token."""
        config = self.config
        if config.stop_token_ids:
            return tuple(config.stop_token_ids)
        if config.stop_token_id is not None:
            return (config.stop_token_id,)
        if config.stop_token == "eos":
            ids = default_stop_token_ids(self.tokenizer, self.unwrapped_policy)
            if not ids:
                raise UserError("training.stop_token: 'eos' but neither the tokenizer nor the model's generation "
                                "config has an EOS token; set stop_token_ids")
            return ids
        return ()

    def _setup_models(self, policy: torch.nn.Module, ref_policy: torch.nn.Module | None,
                      additional_models: dict[str, torch.nn.Module], teacher: torch.nn.Module | None = None) -> None:
        """trainers/loop/setup.py prepares every model; its record becomes the trainer's public attributes."""
        models = prepare_models(self.accelerator, self.config, self.plan.num_iterations,
                                {"model": policy, **additional_models}, ref_policy, self.reward)
        self.teacher = prepare_teacher(self.accelerator, self.config, teacher)  # after DeepSpeed's configuration
        self.trained_models, self.update_forward = models.trained, models.update_forward
        self.policy = self.trained_models["model"]
        self.optimizer, self.lr_scheduler = models.optimizer, models.lr_scheduler
        self.ref_policy, self.reward = models.ref_policy, models.reward
        self.uses_adapter_as_reference = models.uses_adapter_as_reference
        self.deepspeed_guard = models.deepspeed_guard
        self.shared_prompt_passes = models.shared_prompt_passes
        self.rollout_head_logprobs = models.rollout_head_logprobs
        self.share_prompts_in_update = models.update_shares_prompts
        self.head_logprobs_in_update = models.update_head_logprobs
        self.optimizer_step = OptimizerStep(
            self.accelerator, self.collectives, self.optimizer,
            lambda: [p for model in self.trained_models.values() for p in model.parameters()],
            self.config.max_grad_norm, self.config.skip_nonfinite_batches, self.deepspeed_guard, engine=self.policy)

    def checkpoint_models(self) -> dict[str, torch.nn.Module]:
        """The trained models a checkpoint saves, by folder name (the policy in `model/`)."""
        return self.trained_models

    # ---------------------------------------------------------------------------------------------- hooks
    def extra_rollout_passes(self) -> dict[str, Callable[..., torch.Tensor]]:
        """Per-token no-grad passes the collector adds to the rollout (PPO: values). None by default."""
        return {}

    def teacher_rollout_passes(self) -> dict[str, Callable[..., torch.Tensor]]:
        """The teacher's logprob pass in the rollout, where the config reads it (trainers/loop/teacher.py)."""
        if self.teacher is None or not self.config.teacher_logprobs_in_rollout:
            return {}
        return {TEACHER_LOGPROBS: teacher_logprobs_pass(self)}

    def shape_rewards(self, rollout: TrajectoryBatch) -> ShapedRewards:
        """Step 6: KL-shaped rewards and advantages of this process's rows (statistics over all processes)."""
        raise NotImplementedError

    def micro_batch_loss(self, rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor],
                         forward: PolicyForward, step_totals) -> MicroBatchLoss:
        """Step 7, one micro-batch: `rows` from `TrajectoryBatch.rows`, `shaped` the ShapedRewards tensors of those
        rows, `forward` the policy's pass over them, `step_totals` what `optimizer_step_totals` gave for the
        optimizer step (None by default)."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------------- loop
    def train(self, resume_from_checkpoint: str | None = None) -> None:
        """Run the remaining iterations (first resuming from `resume_from_checkpoint`, "latest" or a folder, when
        given). On SIGTERM/SIGINT: checkpoint at the next safe point, then raise
        `TrainingInterrupted` (the CLI exits 128 + signal number)."""
        self.lifecycle.take_output_dir(resume_from_checkpoint)  # from Python; a recipe has taken it already
        plan = self.plan
        # the episodes the run will make: whole iterations, so total_episodes rounded up to a batch
        progress = ProgressDisplay(plan.num_iterations * plan.batch_size, enabled=self.is_main,
                                   start_episode=self.state.episode)
        try:
            with StopRequest() as stop:
                while self.state.iteration < plan.num_iterations:
                    self._iteration(stop, progress)
        finally:
            progress.close()
            self.metrics.close()
            self.generation.close()
            self.rollout_source.close()

    def _iteration(self, stop: StopRequest, progress: ProgressDisplay) -> None:
        self._iteration_started = time.perf_counter()
        start_state = self.state.state_dict()  # what a stop before the update saves: nothing has changed yet
        # 1. prompts of the shared order, 2-5. sample, mask, logprobs, score (or the batch the source sampled ahead)
        try:
            taken = self.rollout_source.take(self.state.iteration, self.iteration_prompts.next_request)
            rollout = taken.batch
            self.prompt_log.record(self.state.iteration + 1, list(taken.prompt_ids), taken.reissued)
            # the next batch, if the source samples ahead: before the update changes the weights
            self.rollout_source.prepare_ahead(self.state.iteration, self.iteration_prompts.next_request)
        except StoppedWhileWaiting:  # a stop signal while the reward ran: nothing has changed yet
            self._stop(stop, start_state)
        # 6. KL-shaped rewards and advantages (a teacher's term in the scores with distillation_coef)
        shaped = self.shape_rewards(with_distillation_reward(rollout, self.config.distillation_coef))
        skip_update = self._safe_point_before_update(stop, rollout, shaped, start_state)
        # 7. the update
        update_started = time.perf_counter()
        update = UpdateResult() if skip_update else self._update(rollout, shaped, self.rollout_source.off_policy)
        self.generation.weights_changed()  # the one point where the sampled-from weights go stale (vLLM: pushed)
        update_seconds = time.perf_counter() - update_started
        # 8. counters, logs, samples, evaluation, checkpoint
        try:
            self._record_iteration(rollout, shaped, update, update_seconds, progress)
        except StoppedWhileWaiting:  # in the sample probes' or evaluation's reward: the iteration is counted
            self._stop(stop)
        self._safe_point_after_iteration(stop)

    def collect_rollout(self, iteration: int | None = None, request: RolloutRequest | None = None) -> TrajectoryBatch:
        """Steps 1-5: `request` (default: the next prompts' request of `iteration`, the current one by default),
        sampled and scored with the current weights."""
        request = request or self.iteration_prompts.next_request(iteration)
        return self.rollout_source.sampled_now(request, self.state.iteration)

    def _record_iteration(self, rollout, shaped, update: UpdateResult, update_seconds: float, progress) -> None:
        from training_wizard.checkpoint import save_checkpoint

        plan, config = self.plan, self.config
        lr = self.lr_scheduler.get_last_lr()[0]  # the rate this iteration's update used
        self.lr_scheduler.step()
        self.state.iteration += 1
        self.state.episode += plan.batch_size
        # this iteration's rate (sampling, scoring and update), not a running average since the start
        eps = plan.batch_size / max(time.perf_counter() - self._iteration_started, 1e-9)
        measured = IterationMetrics.of(self, rollout, shaped, update, eps, lr, update_seconds, self._iteration_started)
        self.state.num_input_tokens_seen += measured.tokens_read  # before the checkpoint below saves it
        metrics = measured.values
        if self.state.iteration % config.logging_steps == 0 or self.state.iteration == plan.num_iterations:
            self.metrics.log(metrics, self.state.iteration)
            progress.update(self.state.episode, metrics)
        if self.sample_every and self.state.iteration % self.sample_every == 0:
            progress.print(self._sample_table(rollout, config.num_completions_to_print or 4))
            self._record_probes()
        if config.eval_steps and self.eval_prompts is not None and self.state.iteration % config.eval_steps == 0:
            self.metrics.log(self.evaluate(), self.state.iteration)
        fault_point("iteration", self.state.iteration)
        if config.save_steps and self.state.iteration % config.save_steps == 0:
            save_checkpoint(self)

    # ---------------------------------------------------------------------------------------------- safe points
    def _safe_point_before_update(self, stop: StopRequest, rollout: TrajectoryBatch, shaped: ShapedRewards,
                                  start_state: dict[str, Any]) -> bool:
        """Stop here (checkpoint of the iteration's starting state) if any process got a signal; returns whether
        to skip the update. Stop and guard flags are agreed in one all-reduce. A non-finite rollout (logprobs,
        reference logprobs, scores, advantages) stops the run, or skips the whole update in skip mode. Failed
        episodes past max_environment_failures stop it too (trainers/loop/environment_failures.py)."""
        flags = guards.rollout_flags(rollout, shaped.advantages)
        stop_now, *bad = self.collectives.any_true(stop.requested, *flags.tolist())
        if stop_now:
            self._stop(stop, start_state)
        name = guards.first_flagged(guards.ROLLOUT_TENSORS, bad)  # read now, acted on after the environments' check
        stop_on_environment_failures(self, rollout)
        if name is None:
            return False
        if not self.config.skip_nonfinite_batches:
            raise guards.nonfinite_error(name, self.state.iteration, " (rollout)")
        self.state.skipped_batches += self.config.num_ppo_epochs * self.config.num_mini_batches
        return True

    def _safe_point_after_iteration(self, stop: StopRequest) -> None:
        if self.collectives.any_process(stop.requested):
            self._stop(stop)

    def _stop(self, stop: StopRequest, state: dict[str, Any] | None = None) -> None:
        """Commit a checkpoint of `state` (default: the current one) unless it is already saved, then raise."""
        stop_with_checkpoint(self, stop, state)

    # ---------------------------------------------------------------------------------------------- metrics
    def trl_reward_inputs(self, rollout: TrajectoryBatch, shaped: ShapedRewards) -> TRLRewardInputs | None:
        """The algorithm's inputs to TRL's reward metrics (trainers/loop/iteration_metrics.py); None: the trainer logs no
        TRL names (PPO)."""
        return None

    def _sample_table(self, rollout: TrajectoryBatch, rows: int = 4):
        return record_samples(self.samples, self.state, rollout, rows)

    def _record_probes(self, count: int = 4) -> None:
        """Completions of the first `count` dataset prompts with the same sampling keys at every sample event, so
        report.html can show one prompt's completion at the start, middle and end of training."""
        rows = list(range(min(count, len(self.train_prompts))))
        seeds = [row_seed(self.config.seed + 104_729, 0, i) for i in rows]
        request = self.iteration_prompts.request(self.train_prompts, rows, seeds, self.state.iteration)
        probe = self.rollout_source.collect(request)
        record_samples(self.samples, self.state, probe, probe.num_rows, probe=True)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean score, KL to the reference and completion length on eval_dataset (one sample per prompt).

        Every process runs the same number of rows (sharded weights make each forward pass a collective); the
        padding rows repeat prompt 0 and are left out of the means, which are weighted by real rows.
        """
        prompts, world = self.eval_prompts, self.accelerator.num_processes
        rows = list(range(self.accelerator.process_index, len(prompts), world))
        real = len(rows)
        rows += [0] * (math.ceil(len(prompts) / world) - real)
        seeds = [row_seed(self.config.seed + 7_919, self.state.iteration, i) for i in rows]
        request = self.iteration_prompts.request(prompts, rows, seeds, self.state.iteration)
        rollout = self.rollout_source.collect(request)
        mask = rollout.loss_mask
        kl = (kl_per_token(rollout.logprobs, rollout.ref_logprobs, self.config.kl_estimator) * mask).sum(-1)
        counted = (torch.arange(len(rows), device=mask.device) < real).float()
        totals = torch.stack([(v.float() * counted).sum() for v in (rollout.scores, kl, mask.sum(-1))] + [counted.sum()])
        totals = self.collectives.sum(totals.to(self.accelerator.device))
        count = float(totals[3].clamp(min=1))
        return {
            "eval/scores": float(totals[0]) / count,
            "eval/kl": float(totals[1]) / count,
            "eval/response_length": float(totals[2]) / count,
            "episode": self.state.episode,
        }

