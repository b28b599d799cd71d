"""A run whose environment keeps failing stops instead of training on failed episodes (max_environment_failures,
trainers/config/environment_keys.py).

An episode failed when its environment raised EnvironmentFailure at reset or at a step (an OpenEnv server that
stopped answering, a dropped connection): the environment ended it there with an error counted. Such an episode
still has a reply and a reward, so a run whose server died would train on nothing but failures and end with exit
0. The check runs before the update, agreed over every process (one collective), so the iteration whose episodes
failed is never trained on and no checkpoint is written for it: the newest checkpoint stays the last one saved.
"""

from __future__ import annotations

import torch

from training_wizard.errors import UserError


def failed_episodes(batch) -> torch.Tensor:
    """Per row of an episode batch, 1.0 where an EnvironmentFailure ended the episode (at reset or at a step); a
    step that merely raised is a message to the model and leaves the episode running, so it is not a failure."""
    return (batch.episode_stats["failed"] > 0).float()


def stop_on_environment_failures(trainer, batch) -> None:
    """Count this iteration's failed episodes (every process's) into the run's state; stop the run in one line
    once more than max_environment_failures of an iteration's episodes failed environment_failure_iterations
    iterations in a row. Without episodes (no environment) nothing is counted."""
    if not batch.episode_stats:
        return
    config, state = trainer.config, trainer.state
    local = torch.stack([failed_episodes(batch).sum(), torch.tensor(float(batch.num_rows))])
    failed, episodes = (int(value) for value in trainer.collectives.sum(local.to(trainer.accelerator.device)))
    state.failed_episodes += failed
    too_many = failed > config.max_environment_failures * episodes
    state.failed_iterations_in_a_row = state.failed_iterations_in_a_row + 1 if too_many else 0
    if state.failed_iterations_in_a_row >= config.environment_failure_iterations:
        raise UserError(failure_stop_message(trainer, failed, episodes))


def failure_stop_message(trainer, failed: int, episodes: int) -> str:
    """The one line that ends the run: how many episodes failed, the rule, and where to resume from."""
    from training_wizard.checkpoint import checkpoints_dir

    config, iteration = trainer.config, trainer.state.iteration + 1
    streak = config.environment_failure_iterations
    which = f"iteration {iteration}" if streak == 1 else f"iterations {iteration - streak + 1}-{iteration}"
    saved = trainer.last_saved_step
    kept = (f"the newest checkpoint is {checkpoints_dir(config.output_dir) / f'step-{saved}'}" if saved is not None
            else "no checkpoint was saved")
    return (f"training.max_environment_failures: more than {config.max_environment_failures:.0%} of the episodes "
            f"failed in {which} (environment_failure_iterations = {streak}; the last: {failed} of {episodes}); "
            f"the environment could not reset or go on (its errors are the warnings above). The run stopped before "
            f"training on them and {kept}; fix the environment or its server, then resume")
