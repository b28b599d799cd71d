"""Metrics (JSONL always; TensorBoard, W&B, trackio on request), progress display and sample tables."""

from training_wizard.tracking.metrics import MetricsLogger
from training_wizard.tracking.progress import ProgressDisplay
from training_wizard.tracking.samples import SampleTable

__all__ = ["MetricsLogger", "ProgressDisplay", "SampleTable"]
