"""TRL's modes in a recipe: the environment supplies the prompt (no [dataset], or rows with only an `environment`
column), and push_to_hub (a start check that the Hub can be reached, the upload after the final save)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training_wizard.cli import main
from training_wizard.tracking.metrics import read_metrics

FACTORY = "tests.unit.test_recipe_trl_modes"


class Echo:
    """Text environment supplying its own prompt; pays 1 per reply and ends the episode."""

    def reset(self, **row):
        return "Say anything."

    def step(self, reply):
        return "ok", 1.0, True


class Counter(Echo):
    def reset(self, **row):
        return "Count to three."

    def step(self, reply):
        return "ok", 2.0, True


HEAD = """\
recipe_class = "grpo"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
{tables}
[training]
num_generations = 2
per_device_train_batch_size = 4
response_length = 24
num_sample_generations = 0
stop_token_ids = {stops}
{training}
"""
STOPS = list(range(40, 300, 2))  # half the vocabulary ends a reply: replies end well inside the token budget
ONE_ENVIRONMENT = f'[environment]\nfactory = "{FACTORY}:Echo"\nprotocol = "text"\n'
ROUTED = f'[environment]\nprotocol = "text"\nfactory = {{ echo = "{FACTORY}:Echo", count = "{FACTORY}:Counter" }}\n'


def write_recipe(folder: Path, model_dir: Path, tables: str, training: str = "") -> Path:
    recipe = folder / "recipe.toml"
    recipe.write_text(HEAD.format(out=folder / "out", model=model_dir, tables=tables, training=training,
                                  stops=STOPS))
    return recipe


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_without_a_dataset_the_environment_supplies_each_prompt_for_max_steps(tiny_model_dir, tmp_path):
    assert main([str(write_recipe(tmp_path, tiny_model_dir, ONE_ENVIRONMENT, "max_steps = 2"))]) == 0
    records = read_metrics(tmp_path / "out")
    assert len(records) == 2 and all(record["rewards/Echo"] == 1.0 for record in records)
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()


def test_without_a_dataset_or_max_steps_is_one_line_and_writes_nothing(tiny_model_dir, tmp_path, capsys):
    recipe = write_recipe(tmp_path, tiny_model_dir, ONE_ENVIRONMENT)
    assert main([str(recipe), "--dry-run"]) == 2
    assert error_line(capsys) == (f"error: {recipe}: dataset: not given, so the environment's reset supplies each "
                                  "prompt and training.max_steps sets the run's length; set training.max_steps, or "
                                  "add a [dataset]")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tables, expected", [
    ("", "dataset: required (a [dataset] table of prompts), unless an [environment] factory's reset supplies each "
         "prompt"),
    (ROUTED, "dataset: required with a table of environment factories: rows whose `environment` column names each "
             "row's factory (e.g. {\"environment\": \"echo\"}), or name one factory"),
])
def test_a_recipe_with_no_source_of_prompts_is_one_line(tiny_model_dir, tmp_path, capsys, tables, expected):
    recipe = write_recipe(tmp_path, tiny_model_dir, tables + '[reward]\nreward_funcs = ["tests.helpers:distinct"]\n'
                          if not tables else tables, "max_steps = 2")
    assert main([str(recipe), "--dry-run"]) == 2
    assert error_line(capsys) == f"error: {recipe}: {expected}"


def test_rows_with_only_an_environment_column_route_to_their_factory(tiny_model_dir, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"environment": name}) for name in ["echo", "count"] * 2))
    tables = f'[dataset]\ndata_files = "{data}"\n' + ROUTED
    assert main([str(write_recipe(tmp_path, tiny_model_dir, tables, "total_episodes = 8"))]) == 0
    records = read_metrics(tmp_path / "out")
    assert len(records) == 2
    # each iteration's two prompts are one row of each environment: 1.0 and 2.0 per episode, 1.5 on average
    assert all(record["objective/scores"] == pytest.approx(1.5) for record in records)


PUSH = 'max_steps = 1\npush_to_hub = true\nhub_model_id = "me/tiny"'


@pytest.fixture
def hub_online(monkeypatch):
    """The Hub reachable with a token (nothing is contacted: the tests replace the upload)."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_push_to_hub_offline_stops_at_start_in_one_line_writing_nothing(tiny_model_dir, tmp_path, capsys, dry_run):
    recipe = write_recipe(tmp_path, tiny_model_dir, ONE_ENVIRONMENT, PUSH)
    assert main([str(recipe), *dry_run]) == 2
    assert error_line(capsys) == (f"error: {recipe}: training.push_to_hub: the Hugging Face Hub is offline here "
                                  "(HF_HUB_OFFLINE=1), so the final model could not be uploaded; fix that, or set "
                                  "push_to_hub = false and upload output_dir/model later (hf upload)")
    assert not (tmp_path / "out").exists()


def test_push_to_hub_without_a_token_stops_at_start_in_one_line(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    recipe = write_recipe(tmp_path, tiny_model_dir, ONE_ENVIRONMENT, PUSH)
    assert main([str(recipe), "--dry-run"]) == 2
    assert error_line(capsys).startswith(f"error: {recipe}: training.push_to_hub: no Hugging Face token (set "
                                         "HF_TOKEN or run `hf auth login`), so the final model could not be uploaded")


def test_push_to_hub_uploads_the_final_model_folder_to_hub_model_id(tiny_model_dir, tmp_path, hub_online,
                                                                    monkeypatch, capsys):
    from training_wizard.trainers.config import hub

    uploads = []

    def upload(folder, repo, label, **options):
        uploads.append((folder, repo, sorted(path.name for path in folder.iterdir())))
        return repo, None

    monkeypatch.setattr(hub, "upload_to_hub", upload)
    assert main([str(write_recipe(tmp_path, tiny_model_dir, ONE_ENVIRONMENT, PUSH))]) == 0
    [(folder, repo, files)] = uploads
    assert folder == tmp_path / "out" / "model" and repo == "me/tiny"
    assert {"model.safetensors", "README.md", "tokenizer_config.json"} <= set(files)  # saved, with its card
    assert "final model pushed to the Hub: https://huggingface.co/me/tiny" in capsys.readouterr().out


def test_a_failed_upload_is_one_line_and_the_model_stays_saved(tiny_model_dir, tmp_path, hub_online, monkeypatch,
                                                               capsys):
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", unreachable)
    recipe = write_recipe(tmp_path, tiny_model_dir, ONE_ENVIRONMENT, PUSH)
    assert main([str(recipe)]) == 2
    model = tmp_path / "out" / "model"
    assert error_line(capsys) == (f"error: {recipe}: training.push_to_hub: the upload to me/tiny failed (Network is "
                                  f"unreachable); the model is saved in {model}")
    assert (model / "model.safetensors").exists() and read_metrics(tmp_path / "out")
