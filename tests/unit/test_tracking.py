"""metrics.jsonl, TensorBoard, sample tables, the resolved config, and the spec round trip."""

import json
import tomllib

import pytest
from optional_extras import requires

from training_wizard.errors import UserError
from training_wizard.recipes.base import load_recipe
from training_wizard.tracking import MetricsLogger, SampleTable
from training_wizard.tracking.metrics import read_metrics


def test_metrics_jsonl_appends_one_object_per_step(tmp_path):
    logger = MetricsLogger(tmp_path, report_to=[])
    logger.log({"objective/scores": 1.5, "episode": 8}, step=1)
    logger.log({"objective/scores": float("nan"), "episode": 16}, step=2)
    assert read_metrics(tmp_path) == [{"objective/scores": 1.5, "episode": 8}, {"objective/scores": "nan", "episode": 16}]


@requires("tensorboard")
def test_non_main_process_writes_nothing(tmp_path):
    MetricsLogger(tmp_path, report_to=["tensorboard"], is_main_process=False).log({"a": 1.0}, step=1)
    assert SampleTable(tmp_path, enabled=False).record(1, 8, ["q"], ["r"], [1.0]) is None
    assert list(tmp_path.iterdir()) == []


@requires("tensorboard")
def test_tensorboard_writes_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, report_to=["tensorboard"])
    logger.log({"objective/scores": 0.25, "episode": 4}, step=1)
    logger.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    # what TensorBoard reads back: each number under its own tag, at the step it was logged for
    written = EventAccumulator(str(events[0])).Reload()
    assert sorted(written.Tags()["scalars"]) == ["episode", "objective/scores"]
    assert [(e.step, e.value) for e in written.Scalars("objective/scores")] == [(1, 0.25)]
    assert [(e.step, e.value) for e in written.Scalars("episode")] == [(1, 4.0)]


@requires("tensorboard")
def test_a_tensorboard_run_takes_an_empty_output_dir_as_a_new_run(tmp_path):
    """The tracker opens at the first record: a trainer built with report_to = ["tensorboard"] has written nothing
    when the run takes its folder, which then holds no other run's files (before, every such run was refused)."""
    from training_wizard import RLOOConfig, RLOOTrainer
    from training_wizard.testing import build_causal_lm, build_tokenizer

    tokenizer = build_tokenizer()
    config = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=8, response_length=4,
                        num_sample_generations=0, rloo_k=2, report_to=["tensorboard"])
    trainer = RLOOTrainer(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer),
                          reward_model=lambda prompts, completions, **columns: [1.0] * len(completions),
                          train_dataset=[{"prompt": f"Say {i}."} for i in range(4)])
    assert not (tmp_path / "tensorboard").exists()
    trainer.train()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_tracker_that_is_not_installed_is_a_user_error(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match="report_to: wandb requested but not installed"):
        MetricsLogger(tmp_path, report_to=["wandb"])


def test_sample_table_rows_and_components(tmp_path):
    table = SampleTable(tmp_path).record(3, 24, ["q1", "q2"], ["r1", "r2"], [0.5, -1.0], {"eos": [1.0, 0.0]})
    assert table.row_count == 2 and [c.header for c in table.columns] == ["query", "model response", "score", "eos"]
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert rows[1] == {"step": 3, "episode": 24, "query": "q2", "response": "r2", "score": -1.0, "rewards/eos": 0.0}


def test_resolved_config_round_trips_and_redacts_secrets(tmp_path, tiny_model_dir):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(
        f'recipe_class = "rloo"\noutput_dir = "{tmp_path / "out"}"\n[model]\npretrained_name = "{tiny_model_dir}"\n'
        f'[dataset]\ndata_files = "{tmp_path / "p.jsonl"}"\n'
        '[reward]\nspec_class = "training_wizard.specs.reward.FunctionRewardSpec"\nfunction = "os.path:join"\n'
        "[training]\nbeta = 0.2\ntotal_episodes = 4\n"
    )
    recipe = load_recipe(recipe_file)
    written = recipe.write_resolved_config()
    data = tomllib.loads(written.read_text())
    assert data["recipe_class"] == "training_wizard.recipes.rloo.RLOORecipe"
    assert data["training"]["kl_coef"] == 0.2 and data["training"]["temperature"] == 0.5  # recipe defaults shown
    again = load_recipe(written)
    assert again.to_dict() == recipe.to_dict()
    from training_wizard.spec import redact_secrets

    assert redact_secrets({"a": {"hf_token": "x", "api_key": "y", "tokens": 3, "stop_token": "eos"}}) == {
        "a": {"hf_token": "<redacted>", "api_key": "<redacted>", "tokens": 3, "stop_token": "eos"}
    }
