"""Metric sinks. Only the main process writes; the others get a logger that drops everything."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

from training_wizard.errors import UserError

_TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


class MetricsLogger:
    """Appends one JSON object per logging step to `metrics.jsonl`, and mirrors to the trackers asked for."""

    def __init__(
        self,
        output_dir: str | Path,
        report_to: list[str] | None = None,
        is_main_process: bool = True,
        run_config: dict[str, Any] | None = None,
        run_name: str | None = None,
    ):
        self.enabled = is_main_process
        self.path = Path(output_dir) / "metrics.jsonl"
        self._writers: list[Any] = []
        check_trackers_installed(report_to)
        # Opened at the first record, not here: a tracker writes into output_dir when it opens (TensorBoard's event
        # file), and the run takes output_dir only after the trainer is built (run_start.py).
        # A trainer passes its config as run_config: its run_name and project name the run in wandb and trackio.
        run_name = run_name or (run_config or {}).get("run_name")
        self._to_open = (list(report_to or []), Path(output_dir), run_config or {}, run_name)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        if self._to_open is not None:
            names, folder, run_config, run_name = self._to_open
            self._to_open = None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writers = [_open_tracker(name, folder, run_config, run_name) for name in names]
        record = {key: _jsonable(value) for key, value in metrics.items()}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        for writer in self._writers:
            writer.log(record, step)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers = []


def check_trackers_installed(report_to: list[str] | None) -> None:
    """One line naming the trackers `report_to` asks for that are not installed (a run and --dry-run check it)."""
    missing = [name for name in report_to or [] if importlib.util.find_spec(_TRACKER_PACKAGES[name]) is None]
    if missing:
        raise UserError(
            f"training.report_to: {', '.join(missing)} requested but not installed (pip install {' '.join(missing)})"
        )


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the information as text
    return value


def read_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl, in order."""
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class _TensorBoard:
    def __init__(self, output_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"))

    def log(self, record: dict[str, Any], step: int) -> None:
        for key, value in record.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _ModuleTracker:
    """wandb and trackio share the init/log/finish API."""

    def __init__(self, module_name: str, run_config: dict[str, Any], run_name: str | None):
        import importlib

        self.module = importlib.import_module(module_name)
        project = run_config.get("project") or "training-wizard"
        # trackio sends the run to a Hugging Face Space when given one (TRL's trackio_space_id), else logs locally
        space = {"space_id": run_config["trackio_space_id"]} if module_name == "trackio" and run_config.get(
            "trackio_space_id") else {}
        self.module.init(project=project, name=run_name, config=run_config, **space)

    def log(self, record: dict[str, Any], step: int) -> None:
        self.module.log(record, step=step)

    def close(self) -> None:
        self.module.finish()


def _open_tracker(name: str, output_dir: Path, run_config: dict[str, Any], run_name: str | None):
    if name == "tensorboard":
        return _TensorBoard(output_dir)
    return _ModuleTracker(name, run_config, run_name)
