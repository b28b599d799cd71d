"""Metrics (JSONL always; TensorBoard, W&B, trackio on request), progress display, sample tables and the log of
the prompts each iteration trained on."""

from training_wizard.tracking.metrics import MetricsLogger
from training_wizard.tracking.progress import ProgressDisplay
from training_wizard.tracking.samples import PromptLog, SampleTable

__all__ = ["MetricsLogger", "ProgressDisplay", "PromptLog", "SampleTable"]
