"""TRL's GRPO variants as its documentation configures them run here with only the import changed."""

from __future__ import annotations

import math

import pytest

from training_wizard.tracking.metrics import read_metrics


@pytest.mark.slow
def test_each_documented_grpo_variant_trains_two_optimizer_steps(run_trl_script, tiny_model_dir, tmp_path):
    trainers = run_trl_script("trl_grpo_config_snippets.py", tiny_model_dir, tmp_path)["TRAINERS"]
    assert len(trainers) == 8
    for name, trainer in trainers.items():
        per_iteration = trainer.config.num_ppo_epochs * trainer.config.num_mini_batches  # optimizer steps
        # max_steps counts optimizer steps, as TRL's, rounded up to whole iterations (GSPO's 4 steps per generation)
        assert trainer.state.global_step == math.ceil(2 / per_iteration) * per_iteration, name
        records = read_metrics(tmp_path / name)
        assert records and all(math.isfinite(record["loss/policy_avg"]) for record in records), name
