"""transformers `TrainerCallback`s on the on-policy loop, and the other Trainer methods scripts written for TRL's
trainers call (`save_model`, `add_callback`).

A callback gets the events TRL's trainers raise where the loop has a matching point, with a real transformers
`TrainerState` and `TrainerControl`:

- `on_init_end` when the trainer is built; `on_train_begin` and `on_train_end` around `train()` (on_train_end
  only when training finished or a callback stopped it, not after an error or a stop signal);
- `on_step_begin` and `on_step_end` around each iteration (one rollout and its update). An iteration holds
  `num_ppo_epochs x num_mini_batches` optimizer steps, so `state.global_step` moves by that many at once; it counts
  optimizer steps as TRL's does and as `max_steps` does here;
- `on_log` with `logs=` the metrics dict each time metrics are written (`metrics.jsonl`), evaluation included;
  this comes inside the iteration, so before that iteration's `on_step_end` (transformers calls on_step_end first).

`control.should_training_stop` set by a callback ends training after the current iteration; the other `control`
flags are not read (logging, evaluation and checkpoints follow logging_steps, eval_steps and save_steps).

The `TrainerState` is the trainer's own `state` (trainers/loop/run_state.py), kept up to date with or without
callbacks, so a script reads `trainer.state.global_step` and `trainer.state.log_history` after `train()` as it
does with TRL's trainers; `train()` returns transformers' TrainOutput (trl/results.py).
"""

from __future__ import annotations

from typing import Any

from training_wizard.errors import UserError
from training_wizard.trl.results import TRLResults


class StopFromCallback(Exception):
    """Raised after an iteration whose callbacks set `control.should_training_stop`; `train()` catches it."""


class CallbackRunner:
    """The callbacks of one trainer, its `TrainerState` and `TrainerControl`, and the events it raises."""

    def __init__(self, callbacks: list[Any] | None, state):
        from transformers import TrainerCallback, TrainerControl

        self.callbacks = []
        for callback in callbacks or []:
            # transformers accepts a callback class as well as an instance
            callback = callback() if isinstance(callback, type) else callback
            if not isinstance(callback, TrainerCallback):
                raise UserError(f"callbacks: expected transformers TrainerCallback instances, got "
                                f"{type(callback).__name__}")
            self.callbacks.append(callback)
        self.state = state
        self.control = TrainerControl()

    def sync(self, trainer) -> None:
        """Copy the trainer's counters into `state`: global_step in optimizer steps, epoch in passes over the
        prompts (completions made / (rows x completions per prompt))."""
        config, plan = trainer.config, trainer.plan
        steps_per_iteration = config.num_ppo_epochs * config.num_mini_batches
        state = self.state
        state.global_step = trainer.state.iteration * steps_per_iteration
        state.max_steps = plan.num_iterations * steps_per_iteration
        state.epoch = trainer.state.episode / (len(trainer.train_prompts) * config.group_size())
        state.num_train_epochs = max(1, -(-plan.total_episodes // (len(trainer.train_prompts) * config.group_size())))
        state.logging_steps, state.save_steps = config.logging_steps, config.save_steps or 0
        state.eval_steps = config.eval_steps or 0
        state.train_batch_size = config.per_device_train_batch_size
        state.is_world_process_zero = trainer.accelerator.is_main_process
        state.is_local_process_zero = trainer.accelerator.is_local_main_process

    def event(self, name: str, trainer, **kwargs: Any) -> None:
        """Call `name` on every callback (args: the trainer's config), as transformers does: a callback that returns
        a TrainerControl replaces the current one."""
        self.sync(trainer)
        for callback in self.callbacks:
            result = getattr(callback, name)(trainer.config, self.state, self.control, model=trainer.unwrapped_policy,
                                             processing_class=trainer.tokenizer, optimizer=trainer.optimizer,
                                             lr_scheduler=trainer.lr_scheduler, **kwargs)
            if result is not None:
                self.control = result


class CallbackMetrics:
    """The trainer's metrics logger, which also raises `on_log` with what it writes (and records it in
    `state.log_history` with its step, as transformers does)."""

    def __init__(self, logger, runner: CallbackRunner, trainer):
        self.logger, self.runner, self.trainer = logger, runner, trainer

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logger.log(metrics, step)
        self.runner.sync(self.trainer)
        wall_clock = getattr(self.trainer, "wall_clock_logs", None)  # TRL's step_time (trainers/algorithms/group.py)
        logs = {**metrics, **(wall_clock(metrics) if wall_clock else {}), "epoch": self.runner.state.epoch}
        self.runner.state.log_history.append({**logs, "step": self.runner.state.global_step})
        self.runner.event("on_log", self.trainer, logs=logs)

    def close(self) -> None:
        self.logger.close()

    def __getattr__(self, name: str) -> Any:  # the logger's other attributes (path, enabled) as they are
        return getattr(self.logger, name)


class TRLTrainerMethods(TRLResults):
    """Mixed into a trainer before OnPolicyTrainer: raises the callbacks' events around the loop's steps, keeps
    `state` a TrainerState, and adds the methods of TRL's trainers that scripts call besides train()
    (add_callback, save_model, and trl/results.py's)."""

    events: CallbackRunner  # raises the events and keeps `state` current, with or without callbacks

    @property
    def callback_runner(self) -> CallbackRunner | None:
        """The runner when a callback is attached, else None."""
        return self.events if self.events.callbacks else None

    def attach_callbacks(self, callbacks: list[Any] | None) -> None:
        """Called once the trainer is built."""
        self.events = CallbackRunner(callbacks, self.state)
        self.metrics = CallbackMetrics(self.metrics, self.events, self)
        self.events.event("on_init_end", self)

    def add_callback(self, callback: Any) -> None:
        """transformers' Trainer.add_callback: one more callback (an instance or a class)."""
        self.events.callbacks += CallbackRunner([callback], self.state).callbacks

    def save_model(self, output_dir: str | None = None) -> None:
        """transformers' Trainer.save_model: the policy (a LoRA policy's adapter) and its tokenizer, in Hugging
        Face format, into `output_dir` (default: the config's output_dir), as a recipe saves its `model/`."""
        from pathlib import Path

        from training_wizard.lifecycle import save_final_model

        save_final_model(self, Path(output_dir or self.config.output_dir))

    def train(self, resume_from_checkpoint: str | None = None):
        """The loop's train(); returns transformers' TrainOutput(global_step, training_loss, metrics)."""
        import time

        runner = self.events
        self._train_started, self.trl_loss_sum, self.trl_loss_steps = time.perf_counter(), 0.0, 0
        runner.event("on_train_begin", self)
        try:
            super().train(resume_from_checkpoint)
        except StopFromCallback:
            pass  # the loop's own clean-up ran (trainers/loop/on_policy.py: train's finally)
        runner.event("on_train_end", self)
        # transformers logs these before on_train_end; after it here, so callbacks see only the iterations' logs
        return self.train_output(self.trl_loss_sum, self.trl_loss_steps)

    def _iteration(self, stop, progress) -> None:
        runner = self.events
        runner.event("on_step_begin", self)
        super()._iteration(stop, progress)
        runner.event("on_step_end", self)
        if runner.control.should_training_stop:
            raise StopFromCallback
