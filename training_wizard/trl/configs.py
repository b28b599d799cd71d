"""The public on-policy configs: the native ones (trainers/config/on_policy.py) that also read TRL 1.x's keys (trl/keys.py).

`training_wizard.GRPOConfig`, `DistillationConfig` and the others are these classes, and the recipes' [training] tables use them, so
`GRPOConfig(max_completion_length=..., report_to="none", save_strategy="no")` and the same keys in a TOML recipe
are read as TRL's; the native trainers take either kind.
"""

from __future__ import annotations

from training_wizard.trainers.config import distill as native_distill
from training_wizard.trainers.config import on_policy as native
from training_wizard.trl.keys import TRLKeys


class RLOOConfig(native.RLOOConfig, TRLKeys):
    __doc__ = native.RLOOConfig.__doc__  # one docstring, the native class's: docs/configuration.md prints it


class RLOORecipeConfig(native.RLOORecipeConfig, RLOOConfig):
    __doc__ = native.RLOORecipeConfig.__doc__


class PPOConfig(native.PPOConfig, TRLKeys):
    __doc__ = native.PPOConfig.__doc__


class GRPOConfig(native.GRPOConfig, TRLKeys):
    __doc__ = native.GRPOConfig.__doc__


class DistillationConfig(native_distill.DistillationConfig, TRLKeys):
    __doc__ = native_distill.DistillationConfig.__doc__
