"""TRL-form reward functions in scripts written as TRL's GRPO documentation writes them, with only the import
line changed: each runs end to end (runpy, a tiny local model, 2-4 local rows, two optimizer steps)."""

from __future__ import annotations

import json
import pytest

from training_wizard.tracking.metrics import read_metrics


def test_multitask_rewards_returning_none_train_with_a_warning(run_trl_script, tiny_model_dir, tmp_path, capsys):
    run_trl_script("trl_rewards_multitask.py", tiny_model_dir, tmp_path)
    records = read_metrics(tmp_path)
    assert [r["episode"] for r in records] == [6, 12]  # every iteration holds the three rows, two samples each
    warnings = [line for line in capsys.readouterr().err.splitlines() if "every reward function returned None" in line]
    assert warnings == [f"warning: reward RewardObjectsSpec at step {step}: every reward function returned None for "
                        "2 of 6 completions; GRPO and RLOO give them advantage 0 outside their group's baseline, "
                        "as TRL 1.16 does, PPO counts them 0" for step in (1, 2)]
    for record in records:
        assert all(key in record for key in ("rewards/arithmetic_reward/mean", "rewards/echo_reward/mean"))


def test_format_length_and_column_rewards_are_weighted(run_trl_script, tiny_model_dir, tmp_path):
    run_trl_script("trl_rewards_format_length.py", tiny_model_dir, tmp_path)
    records = read_metrics(tmp_path)
    assert [r["episode"] for r in records] == [4, 8]
    for record in records:
        parts = [record[f"rewards/{name}/mean"] for name in ("format_reward", "length_reward", "reference_reward")]
        assert record["reward"] == pytest.approx(0.5 * parts[0] + 1.0 * parts[1] + 2.0 * parts[2], abs=1e-5)


def test_log_extra_and_log_metric_reach_the_logs(run_trl_script, tiny_model_dir, tmp_path):
    run_trl_script("trl_rewards_logging.py", tiny_model_dir, tmp_path)
    records = read_metrics(tmp_path)
    assert [r["episode"] for r in records] == [4, 8]
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    trained = [row for row in rows if not row.get("probe")]
    assert trained and all(row["vowels"] == sum(ch in "aeiou" for ch in row["response"].lower()) for row in rows)
    compared = 0
    for record in records:  # TRL's name, as the function gave it: the mean of the batch's shares
        batch = [row for row in trained if row["episode"] == record["episode"]]
        assert len(batch) in (0, 4)  # a sample event shows the whole batch of 4 (num_completions_to_print unset)
        if batch:
            shares = [row["vowels"] / max(len(row["response"]), 1) for row in batch]
            assert record["vowel_share"] == pytest.approx(sum(shares) / len(shares), abs=1e-9)
            compared += 1
        assert 0.0 <= record["vowel_share"] <= 1.0
    assert compared
