"""The on-policy option that stops a run whose environment keeps failing (trainers/loop/environment_failures.py).

No peer has such a bound: RLlib restarts failed environment runners (`restart_failed_env_runners`) or ignores them
(`ignore_env_runner_failures`), and TRL, veRL and OpenRLHF train on whatever the episodes returned.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from training_wizard.trainers.config.run import RunConfig


class EnvironmentFailureOptions(RunConfig):
    """When failed episodes stop the run rather than being trained on."""

    max_environment_failures: float = Field(
        0.5, ge=0.0, le=1.0, description="With an environment: the share of an iteration's episodes that may "
        "fail (the environment could not reset or go on: EnvironmentFailure, e.g. an OpenEnv server that stopped "
        "answering; counted in episodes/failed) before the iteration counts as failed. After "
        "environment_failure_iterations failed iterations in a row the run stops in one line, before that "
        "iteration's update, its checkpoints as they were. 1.0: never stop.")
    environment_failure_iterations: PositiveInt = Field(
        3, description="Failed iterations in a row (see max_environment_failures) that stop the run; 1 stops at "
        "the first.")
