"""What a run leaves a user: a model/ folder that names its base by the recipe's model name and loads from anywhere,
a model card with Hub metadata, a report that opens with a summary, and a summary as the terminal's last lines."""

import json
import shutil

import torch
import yaml
from transformers import AutoModelForCausalLM

from training_wizard.cli import main

from tests.helpers import run_recipe


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def test_a_lora_runs_outputs_name_the_base_and_load_from_another_folder(tmp_path, tiny_model_dir, capsys):
    from peft import PeftModel

    from training_wizard.specs.model import TransformerSpec

    assert run_recipe(tmp_path, tiny_model_dir, lora="lora = { r = 4, alpha = 8 }") == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    out = tmp_path / "out"
    adapter = json.loads((out / "model" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    # the terminal ends with the summary: what from what, the main metrics' start and end, evaluation, model
    tail = printed[printed.index("run summary"):]
    assert f"RLOO of {tiny_model_dir.resolve()} (LoRA adapter): 16 episodes, 4 logged iterations in" in tail
    assert "objective/scores" in tail and "->" in tail and "last evaluation (episode 16)" in tail
    assert f"model: {out / 'model'}" in tail and "report.html" in tail
    # the model card: Hub metadata, sections, no peft template
    card = (out / "model" / "README.md").read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "peft" and meta["pipeline_tag"] == "text-generation"
    assert {"training-wizard", "rloo", "lora"} <= set(meta["tags"])
    assert "base_model" not in meta  # a local folder is no Hub id
    for text in ("## Algorithm", "Back to Basics: Revisiting REINFORCE", "## Training", "| rloo_k | `2` |",
                 "| metric | start | end |", "| objective/scores |", "Last evaluation (episode 16)",
                 "## How to load", "AutoPeftModelForCausalLM", "## Framework versions", "- transformers: "):
        assert text in card, text
    assert "More Information Needed" not in card
    # the report opens with the summary, above the plots
    report = (out / "report.html").read_text()
    assert report.index('id="summary"') < report.index('src="metrics.png"')
    # model/ copied elsewhere loads through the name it records, with peft or with our spec
    moved = shutil.copytree(out / "model", tmp_path / "elsewhere" / "model")
    shutil.rmtree(out / "model")
    base = AutoModelForCausalLM.from_pretrained(adapter["base_model_name_or_path"])
    with_peft = PeftModel.from_pretrained(base, moved).merge_and_unload()
    with_spec = TransformerSpec(pretrained_name=str(moved)).load_causal_lm()
    ids = torch.tensor([[5, 9, 13, 2]])
    with torch.no_grad():
        assert torch.allclose(with_peft(ids).logits, with_spec(ids).logits, atol=1e-5)
        trained_away = (with_spec(ids).logits - AutoModelForCausalLM.from_pretrained(tiny_model_dir)(ids).logits)
    assert trained_away.abs().max() > 0  # the adapter was trained and is applied


def test_a_full_runs_model_has_a_transformers_card_and_no_machine_path(tmp_path, tiny_model_dir, capsys):
    assert run_recipe(tmp_path, tiny_model_dir) == 0, capsys.readouterr().err
    folder = tmp_path / "out" / "model"
    meta = front_matter((folder / "README.md").read_text())
    assert meta["library_name"] == "transformers" and "lora" not in meta["tags"]
    config = json.loads((folder / "config.json").read_text())
    assert config.get("_name_or_path", str(tiny_model_dir.resolve())) == str(tiny_model_dir.resolve())
    assert main(["plot", str(tmp_path / "out"), "-o", str(tmp_path / "again.png")]) == 0
