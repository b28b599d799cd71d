"""A rich progress bar over episodes (with rate and ETA) on a terminal; one plain line per log step otherwise."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

_SHOWN = ("objective/scores", "objective/rlhf_reward", "objective/kl", "val/ratio")


class ProgressDisplay:
    def __init__(self, total_episodes: int, enabled: bool = True, start_episode: int = 0):
        self.enabled = enabled
        self.console = Console(file=sys.stdout)
        if not self.console.is_terminal:
            self.console = Console(file=sys.stdout, width=160)  # log files: no wrapping at 80 columns
        self.interactive = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        if self.interactive:
            self._progress = Progress(
                TextColumn("[bold]episodes"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:.3g} eps/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[summary]}"),
                console=self.console,
            )
            self._task = self._progress.add_task("train", total=total_episodes, completed=start_episode, rate=0.0, summary="")
            self._progress.start()
        self.total = total_episodes

    def update(self, episode: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        summary = "  ".join(f"{key.split('/')[-1]}={metrics[key]:.3g}" for key in _SHOWN if key in metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=episode, rate=metrics.get("eps", 0.0), summary=summary)
        else:
            eta = (self.total - episode) / metrics["eps"] if metrics.get("eps") else float("nan")
            self.console.print(
                f"episode {episode}/{self.total}  {metrics.get('eps', 0.0):.3g} eps/s  ETA {eta:.0f}s  {summary}",
                highlight=False,
            )
            self.console.file.flush()  # log files and pipes see each line as it happens

    def print(self, renderable) -> None:
        if self.enabled:
            self.console.print(renderable)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
