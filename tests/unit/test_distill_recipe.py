"""`recipe_class = "distill"` from a TOML file through the CLI: a LoRA student learns from a teacher that is a LoRA
run's saved adapter folder (the GRPO example's output is one); a teacher whose tokenizer differs, or that cannot
load, is refused in one line (exit 2) by --dry-run and a run alike, before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training_wizard.cli import main
from training_wizard.testing import build_causal_lm, build_tokenizer

RECIPE = """\
recipe_class = "distill"
output_dir = "{out}"

[model]
pretrained_name = "{student}"
lora = {{ r = 4, alpha = 8, target_modules = "all-linear" }}

[teacher_model]
pretrained_name = "{teacher}"

[dataset]
data_files = "{data}"

[training]
per_device_train_batch_size = 4
total_episodes = 8
max_completion_length = 6
beta = 0.5
learning_rate = 1e-3
num_sample_generations = 0
{training}
"""


def write_recipe(folder: Path, student: Path, teacher: Path | str, training: str = "") -> Path:
    data = folder / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Tell me about {t}."}) for t in ["owls", "ice", "sand", "oak"]))
    recipe = folder / "recipe.toml"
    recipe.write_text(RECIPE.format(out=folder / "out", student=student, teacher=teacher, data=data,
                                    training=training))
    return recipe


def save_adapter(folder: Path, base: Path) -> Path:
    """A LoRA run's model/ folder: an adapter (non-zero, so merging it changes the model) and the tokenizer."""
    import torch

    torch.manual_seed(0)  # init_lora_weights=False: random A and B, so the merged teacher differs from its base
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    peft_model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base)
    return folder


def test_a_lora_student_learns_from_a_saved_adapter_teacher(tiny_model_dir, tmp_path, capsys):
    teacher = save_adapter(tmp_path / "teacher", tiny_model_dir)
    recipe = write_recipe(tmp_path, tiny_model_dir, teacher, training='distillation_loss = "sampled_k3"')
    assert main([str(recipe)]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        # the merged adapter moved the teacher away from its base, the student's start: a divergence to learn
        assert record["distill/divergence"] > 1e-4
        assert record["objective/scores"] == 0.0  # no [reward]: the teacher is the signal
    assert (tmp_path / "out" / "model" / "adapter_config.json").is_file()  # the LoRA student's adapter
    assert "distill/divergence" in capsys.readouterr().out  # among the run summary's main metrics


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tiny_model_dir, tmp_path, capsys, dry_run):
    other = tmp_path / "other"
    tokenizer = build_tokenizer(300)
    build_causal_lm(tokenizer).save_pretrained(other)
    tokenizer.save_pretrained(other)
    recipe = write_recipe(tmp_path, tiny_model_dir, other)
    assert main([str(recipe), *(["--dry-run"] if dry_run else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "teacher_model: its tokenizer is not the student's ([model])" in err[-1]
    assert "300 tokens against 320" in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out").exists()


def test_a_teacher_folder_without_weights_is_refused_by_dry_run(tiny_model_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert main([str(write_recipe(tmp_path, tiny_model_dir, empty)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "teacher_model.pretrained_name" in err and "no *.safetensors weights" in err


@pytest.mark.parametrize("table,message", [
    ("", "teacher_model"),
    ('teacher_model_name_or_path = "x"', "training.teacher_model_name_or_path: a recipe names its teacher"),
    ("kl_coef = 0.1", "kl_coef"),
])
def test_recipe_keys_are_checked(tiny_model_dir, tmp_path, capsys, table, message):
    recipe = write_recipe(tmp_path, tiny_model_dir, tiny_model_dir, training=table if table else "")
    if not table:  # no [teacher_model] table at all
        text = recipe.read_text().replace(f'[teacher_model]\npretrained_name = "{tiny_model_dir}"\n', "")
        recipe.write_text(text)
    assert main([str(recipe), "--dry-run"]) == 2
    assert message in capsys.readouterr().err
