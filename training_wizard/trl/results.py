"""What scripts written for TRL's trainers read and call after `train()`, as transformers' Trainer defines them:
`args`, `model`, `processing_class`, `log_metrics`, `save_metrics`, `save_state`, `push_to_hub` and
`hub_model_id`, and `train()`'s TrainOutput.

Files these write into output_dir (run files): `{split}_results.json` (train_results.json, eval_results.json, ...),
`all_results.json`, `trainer_state.json`, and with push_to_hub the saved model (config, weights, tokenizer),
uploaded as a recipe's final model is (trainers/config/hub.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from training_wizard.trainers.config import hub


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as indented JSON with sorted keys (transformers' layout), written whole or not at all."""
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=4, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staging, path)


def format_value(key: str, value: Any) -> Any:
    """A metric as transformers' log_metrics prints it: runtimes as h:mm:ss.ff, floats to 4 places."""
    if "_runtime" in key and isinstance(value, (int, float)):
        hours, rest = divmod(float(value), 3600)
        minutes, seconds = divmod(rest, 60)
        return f"{int(hours)}:{int(minutes):02d}:{seconds:05.2f}"
    return round(value, 4) if isinstance(value, float) else value


class TRLResults:
    """Mixed into a trainer: transformers Trainer's attributes and methods for results after training."""

    hub_model_id: str | None = None  # the Hub repository push_to_hub uploaded to, as transformers' Trainer sets it
    _train_started: float | None = None

    @property
    def args(self):
        """The trainer's config (TRL's `trainer.args`: the GRPOConfig or RLOOConfig it was given)."""
        return self.config

    @property
    def model(self):
        """The trained policy (a LoRA policy: the PEFT model), without accelerate's or a sharding wrapper."""
        return self.unwrapped_policy

    @property
    def processing_class(self):
        """The policy's tokenizer, as the trainer pads and decodes with it."""
        return self.tokenizer

    def is_world_process_zero(self) -> bool:
        return self.accelerator.is_main_process

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        """Print `metrics` under `***** {split} metrics *****`, one `key = value` line each (main process only)."""
        if not self.is_world_process_zero():
            return
        shown = {key: format_value(key, value) for key, value in metrics.items()}
        key_width = max((len(str(key)) for key in shown), default=0)
        value_width = max((len(str(value)) for value in shown.values()), default=0)
        print(f"***** {split} metrics *****")
        for key in sorted(shown):
            print(f"  {key: <{key_width}} = {shown[key]:>{value_width}}")

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        """Write `metrics` to output_dir/{split}_results.json and, with `combined`, merge them into
        all_results.json (main process only)."""
        if not self.is_world_process_zero():
            return
        folder = Path(self.config.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / f"{split}_results.json", metrics)
        if combined:
            path = folder / "all_results.json"
            merged = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
            write_json(path, {**merged, **metrics})

    def save_state(self) -> None:
        """Write `state` (global_step, log_history, ...) to output_dir/trainer_state.json (main process only)."""
        if not self.is_world_process_zero():
            return
        folder = Path(self.config.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / ".trainer_state.json.tmp"
        self.state.save_to_json(str(staging))
        os.replace(staging, folder / "trainer_state.json")

    def train_output(self, loss_sum: float, steps: int):
        """train()'s TrainOutput: global_step, the mean `loss` over the `steps` optimizer steps this call ran
        (`loss_sum`: their losses added), and the speed metrics transformers reports (also appended to
        `state.log_history`, as transformers logs them)."""
        from transformers.trainer_utils import TrainOutput

        runtime = time.perf_counter() - (self._train_started or time.perf_counter())
        training_loss = loss_sum / steps if steps else 0.0
        metrics = {"train_runtime": round(runtime, 4), "total_flos": 0.0, "train_loss": training_loss}
        if runtime > 0:
            samples = steps / max(self.state.max_steps, 1) * self.plan.num_iterations * self.plan.batch_size
            metrics["train_samples_per_second"] = round(samples / runtime, 3)
            metrics["train_steps_per_second"] = round(steps / runtime, 3)
        metrics["epoch"] = self.state.epoch
        self.state.log_history.append({**metrics, "step": self.state.global_step})
        return TrainOutput(self.state.global_step, training_loss, metrics)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any):
        """Save the model into output_dir (save_model) and upload output_dir, checkpoints left out, to the Hub
        repository args.hub_model_id names (unset: output_dir's folder name), as transformers' Trainer does. Offline or without a token:
        one line (UserError) after the save, so the model is on disk either way."""
        self.save_model()
        if not self.is_world_process_zero():
            return None
        folder = Path(self.config.output_dir)
        self.hub_model_id, result = hub.upload_to_hub(folder, hub.hub_repository(self.config), "push_to_hub",
                                                      token=token, private=private, commit_message=commit_message,
                                                      revision=revision, run_as_future=not blocking)
        return result
