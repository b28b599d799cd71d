"""The supervised loop shared by SFT and reward-model training. Read `SupervisedTrainer._step` first.

One iteration (one optimizer step):
  1. take this process's examples of the shared seeded order            `_next_examples`
  2. count what the step's loss is an average over, on every process    `example_weight` (subclass)
  3. forward/backward each micro-batch; its summed loss is divided by    `example_sums` (subclass)
     that global count, so accumulation, packing and process count leave the step's gradient unchanged
  4. clip, check loss and gradient are finite, optimizer and schedule step
  5. log metrics, evaluate on the held-out rows, checkpoint

It shares the on-policy loop's run state (trainers/loop/on_policy.py `RunState`: counters, data position, RNG streams),
optimizer construction (trainers/loop/setup.py), checkpoints (checkpoint.py), stop signals (signals.py) and metric
sinks (tracking/). A subclass turns its rows into tensors and gives sums: `loss` (with gradient) and the sums of
its metrics, all divided by the step's weight (SFT: completion tokens; reward model: pairs).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from accelerate import Accelerator

from training_wizard import guards
from training_wizard.collectives import Collectives
from training_wizard.errors import UserError
from training_wizard.lifecycle import RunLifecycle
from training_wizard.sharding import engine_kind, unwrap_model
from training_wizard.signals import StopRequest, fault_point
from training_wizard.tracking import MetricsLogger, ProgressDisplay
from training_wizard.trainers.loop.run_state import RunState
from training_wizard.trainers.supervised.config import SupervisedConfig
from training_wizard.trainers.loop.setup import build_optimizer, configure_deepspeed, enable_activation_checkpointing
from training_wizard.trainers.loop.step import OptimizerStep, check_accumulation, make_accelerator, stop_with_checkpoint


class SupervisedTrainer:
    """The loop. Subclasses implement `example_weight` and `example_sums` (and may add metrics).

    The checkpoint interface (checkpoint.py) is the on-policy trainers': `accelerator`, `collectives`, `config`,
    `optimizer`, `lr_scheduler`, `state`, `checkpoint_models()` and `last_saved_step`; `policy` and `tokenizer`
    are what the final save reads (the trained model, whatever it is).
    """

    config: SupervisedConfig
    weight_metric: str | None = None  # logs the step's divisor under this name (SFT: num_tokens)
    metric_names: tuple[str, ...] = ()  # the sums example_sums returns besides the loss

    def __init__(self, config: SupervisedConfig, tokenizer, model: torch.nn.Module, train_rows: list,
                 eval_rows: list | None = None, accelerator: Accelerator | None = None):
        self.config = config
        self.tokenizer = tokenizer
        self.accelerator = accelerator or make_accelerator(config)
        check_accumulation(self.accelerator, config.gradient_accumulation_steps)
        if not train_rows:
            raise UserError("dataset: no rows to train on")
        self.collectives = Collectives(self.accelerator)
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.plan = config.supervised_plan(self.accelerator.num_processes, len(train_rows))
        self.state = RunState(config.seed, len(train_rows))
        self.is_main = self.accelerator.is_main_process
        self._evaluating = False
        self._setup_model(model)
        self.metrics = MetricsLogger(config.output_dir, config.report_to, self.is_main, config.model_dump(mode="json"))
        self.last_saved_step: int | None = None
        self.lifecycle = RunLifecycle(self)  # takes output_dir, once

    def _setup_model(self, model: torch.nn.Module) -> None:
        config = self.config
        if engine_kind(self.accelerator):  # evaluation splits rows unevenly: a sharded forward would wait forever
            raise UserError(f"accelerate config: SFT and reward-model training run on one process or with plain "
                            f"data parallel (accelerate launch --multi_gpu), not under "
                            f"{self.accelerator.distributed_type.name} yet")
        if config.gradient_checkpointing:
            enable_activation_checkpointing(model)
            if hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise UserError("model: the model has no trainable parameters")
        optimizer, self.lr_scheduler = build_optimizer(params, config, self.plan.num_steps)
        configure_deepspeed(self.accelerator, config)
        self.policy, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.optimizer_step = OptimizerStep(
            self.accelerator, self.collectives, self.optimizer,
            lambda: [p for p in self.policy.parameters() if p.requires_grad], config.max_grad_norm,
            skip_nonfinite=config.skip_nonfinite_batches)

    @property
    def forward_model(self) -> torch.nn.Module:
        """The model the subclasses' forward passes call: the prepared one in training, the unwrapped one in
        evaluation, where processes run different numbers of batches (DDP's forward may broadcast buffers)."""
        return unwrap_model(self.accelerator, self.policy) if self._evaluating else self.policy

    def checkpoint_models(self) -> dict[str, torch.nn.Module]:
        return {"model": self.policy}

    # ---------------------------------------------------------------------------------------------- hooks
    def example_weight(self, rows: list) -> int:
        """What this micro-batch adds to the step's divisor (SFT: completion tokens; reward model: pairs)."""
        raise NotImplementedError

    def example_sums(self, rows: list) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(summed loss with gradient, {metric: detached sum}) of one micro-batch; both get divided by the weight."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------------- loop
    def train(self, resume_from_checkpoint: str | None = None) -> None:
        """Run the remaining steps. On SIGTERM/SIGINT: checkpoint at the next step boundary, then raise
        `TrainingInterrupted` (the CLI exits 128 + signal number)."""
        self.lifecycle.take_output_dir(resume_from_checkpoint)  # from Python; a recipe has taken it already
        total = self.plan.num_steps * self.plan.batch_size
        progress = ProgressDisplay(total, enabled=self.is_main, start_episode=self.state.episode)
        self._clock = (time.perf_counter(), self.state.episode)
        try:
            with StopRequest() as stop:
                while self.state.iteration < self.plan.num_steps:
                    if self.collectives.any_process(stop.requested):
                        self._stop(stop)
                    self._step(progress)
                if self.collectives.any_process(stop.requested):  # a signal during the last step
                    self._stop(stop)
        finally:
            progress.close()
            self.metrics.close()

    def _step(self, progress: ProgressDisplay) -> None:
        config, plan = self.config, self.plan
        # 1. this process's share of the next batch_size examples of the shared order
        micro_batches = self._next_examples()
        # 2. the divisor of the whole step, over every process
        weight = float(self.collectives.sum(torch.tensor(
            float(sum(self.example_weight(rows) for rows in micro_batches)), device=self.accelerator.device)))
        # 3. forward/backward; accelerate divides each loss by the accumulation steps and DDP averages over
        # processes, so multiplying by both makes the step's gradient that of sum(loss) / weight
        scale = config.gradient_accumulation_steps * self.accelerator.num_processes / max(weight, 1.0)
        self.policy.train()
        sums: dict[str, torch.Tensor] = {}
        bad_loss = torch.zeros((), dtype=torch.bool, device=self.accelerator.device)
        for rows in micro_batches:
            with self.accelerator.accumulate(self.policy):
                loss, stats = self.example_sums(rows)
                if fault_point("loss", self.state.iteration):  # test hook (action `nan`)
                    loss = loss * float("nan")
                bad_loss |= ~guards.all_finite(loss.detach())
                self.accelerator.backward(loss * scale)
                for name, value in {"loss": loss.detach(), **stats}.items():
                    sums[name] = sums.get(name, 0) + value.detach().float()
                fault_point("update", self.state.iteration)
                if self.accelerator.sync_gradients:
                    grad_norm = self._optimizer_step(bad_loss)
        # 5. counters, metrics, evaluation, checkpoint
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        self.state.iteration += 1
        self.state.episode += plan.batch_size
        self._record_step(sums, weight, grad_norm, lr, progress)

    def _next_examples(self) -> list[list]:
        """This process's rows of the step, cut into micro-batches."""
        plan = self.plan
        indices = self.state.prompt_order.take(plan.batch_size)
        local = plan.batch_size // plan.world_size
        first = self.accelerator.process_index * local
        mine = [self.train_rows[i] for i in indices[first : first + local]]
        return [mine[start : start + plan.micro_batch_size] for start in range(0, local, plan.micro_batch_size)]

    def _optimizer_step(self, bad_loss: torch.Tensor) -> float:
        """4. Clip, check the loss and the gradient norm are finite on every process, then step (trainers/loop/step.py);
        returns the gradient norm before clipping, for the grad_norm metric."""
        outcome = self.optimizer_step(
            bad_loss.reshape(1), ("loss", "gradient"),
            lambda name: UserError(f"training: non-finite {name} at step {self.state.iteration}; lower "
                                   "training.learning_rate, check the data, or set training.skip_nonfinite_batches "
                                   "= true to skip such steps"))
        if not outcome.stepped:
            self.state.skipped_batches += 1
        return outcome.grad_norm if outcome.grad_norm is not None else 0.0

    def _record_step(self, sums: dict[str, torch.Tensor], weight: float, grad_norm: float, lr: float,
                     progress: ProgressDisplay) -> None:
        from training_wizard.checkpoint import save_checkpoint

        config, plan, state = self.config, self.plan, self.state
        totals = self._global_means(sums, weight)
        started, start_episode = self._clock
        metrics = {
            **totals, "grad_norm": grad_norm, "lr": lr, "epoch": state.episode / plan.rows, "step": state.iteration,
            "episode": state.episode,
            "eps": (state.episode - start_episode) / max(time.perf_counter() - started, 1e-9),
        }
        if self.weight_metric:
            metrics[self.weight_metric] = weight
        if config.skip_nonfinite_batches:
            metrics["guards/skipped_batches"] = state.skipped_batches
        if state.iteration % config.logging_steps == 0 or state.iteration == plan.num_steps:
            self.metrics.log(metrics, state.iteration)
            progress.update(state.episode, metrics)
        last = state.iteration == plan.num_steps
        if self.eval_rows and ((config.eval_steps and state.iteration % config.eval_steps == 0) or last):
            self.metrics.log(self.evaluate(), state.iteration)
        fault_point("iteration", state.iteration)
        if config.save_steps and state.iteration % config.save_steps == 0:
            save_checkpoint(self)

    def _global_means(self, sums: dict[str, torch.Tensor], weight: float) -> dict[str, float]:
        """Each summed metric over every process, divided by the step's weight (one all-reduce)."""
        names = ["loss", *self.metric_names]
        totals = self.collectives.sum(torch.stack([sums[n].to(self.accelerator.device) for n in names]))
        return {name: float(value) / max(weight, 1.0) for name, value in zip(names, totals)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """The training metrics on the held-out rows as `eval/<name>` (each process takes every world_size-th
        row; sums and weights are added over processes, so the result does not depend on the process count)."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        mine = self.eval_rows[rank::world]
        size = self.config.per_device_eval_batch_size
        names = ["loss", *self.metric_names]  # fixed: a process with no rows still adds its zeros
        sums = torch.zeros(len(names) + 1, device=self.accelerator.device)  # + the weight
        self.policy.eval()
        self._evaluating = True
        try:
            for start in range(0, len(mine), size):
                rows = mine[start : start + size]
                loss, stats = self.example_sums(rows)
                values = [loss, *(stats[name] for name in self.metric_names), torch.tensor(self.example_weight(rows))]
                sums += torch.stack([v.detach().float().to(sums.device) for v in values])
        finally:
            self._evaluating = False
            self.policy.train()
        totals = self.collectives.sum(sums)
        count = max(float(totals[-1]), 1.0)
        return {**{f"eval/{n}": float(v) / count for n, v in zip(names, totals[:-1])}, "episode": self.state.episode}

    # ---------------------------------------------------------------------------------------------- stopping
    def _stop(self, stop: StopRequest) -> None:
        """Checkpoint the current state (a step boundary) unless it is saved already, then raise."""
        stop_with_checkpoint(self, stop)
