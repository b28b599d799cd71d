"""The adapter-only push to vLLM (rollout/vllm_lora.py) without vLLM: which policies qualify, the adapter folder
it writes (what peft itself saves), the base weights it sends once, and a fresh adapter id per push. The engine is
a stand-in here; tests/with_vllm/test_vllm_lora_adapter_engine.py runs the same path on vLLM's CPU build."""

import json
import os
import sys
import types
from dataclasses import dataclass

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from training_wizard import RLOOConfig
from training_wizard.errors import UserError
from training_wizard.rollout.vllm import checkpoint_weights, local_state
from training_wizard.rollout.vllm_lora import (AdapterPush, adapter_push, adapter_push_refusal, engine_lora_rank,
                                               write_adapter)
from training_wizard.spec import KeywordError
from training_wizard.testing import build_causal_lm


def lora_policy(tokenizer, **options):
    settings = dict(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    settings.update(options)
    return get_peft_model(build_causal_lm(tokenizer, seed=1), LoraConfig(**settings))


def test_the_adapter_folder_holds_what_peft_saves(tokenizer, tmp_path):
    policy = lora_policy(tokenizer)
    write_adapter(policy, str(tmp_path / "ours"), local_state)
    policy.save_pretrained(str(tmp_path / "peft"))
    ours, theirs = (load_file(str(tmp_path / name / "adapter_model.safetensors")) for name in ("ours", "peft"))
    assert ours.keys() == theirs.keys() and len(ours) > 0
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    config = json.loads((tmp_path / "ours" / "adapter_config.json").read_text())
    peft_config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    for key in ("r", "lora_alpha", "peft_type", "use_rslora", "use_dora", "modules_to_save", "bias"):
        assert config[key] == peft_config[key], key
    assert sorted(config["target_modules"]) == sorted(peft_config["target_modules"])


def test_the_base_weights_are_the_models_own_without_the_adapter(tokenizer):
    base = build_causal_lm(tokenizer, seed=1)
    expected = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    policy = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    pushed = dict(checkpoint_weights(policy, fold_adapters=False))
    assert pushed.keys() == expected.keys()
    assert all(torch.equal(pushed[name], expected[name]) for name in expected)
    merged = dict(checkpoint_weights(policy))  # the merged push differs where an adapter sits
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           expected["model.layers.0.self_attn.q_proj.weight"])


@pytest.mark.parametrize("change, reason", [
    ("plain", None),
    ("no_adapter", "not a peft model"),
    ("dora", "only a plain LoRA adapter"),
    ("modules_to_save", "modules_to_save (lm_head)"),
    ("unfrozen_base", "base weights train"),
    ("rank_above_vllm", "rank 600 is above"),
    ("server", "server"),
    ("sleep", "sleep mode"),
])
def test_which_policies_can_push_their_adapter_alone(tokenizer, change, reason):
    options = {"dora": dict(use_dora=True), "modules_to_save": dict(modules_to_save=["lm_head"]),
               "rank_above_vllm": dict(r=600)}.get(change, {})
    policy = build_causal_lm(tokenizer) if change == "no_adapter" else lora_policy(tokenizer, **options)
    if change == "unfrozen_base":
        policy.get_base_model().model.norm.weight.requires_grad_(True)
    refusal = adapter_push_refusal(policy, server=change == "server", sleep_mode=change == "sleep")
    assert refusal is None if reason is None else reason in refusal, refusal


def test_auto_falls_back_to_merged_pushes_and_adapter_refuses_in_one_line(tokenizer):
    dora = lora_policy(tokenizer, use_dora=True)
    assert adapter_push(dora, "auto", server=False, sleep_mode=False) is None
    assert adapter_push(build_causal_lm(tokenizer), "auto", server=False, sleep_mode=False) is None
    assert adapter_push(lora_policy(tokenizer), "merged", server=False, sleep_mode=False) is None
    with pytest.raises(UserError, match=r'^training.vllm_lora_push: "adapter" cannot push .*DoRA.*; use "auto"'):
        adapter_push(dora, "adapter", server=False, sleep_mode=False)
    assert adapter_push(lora_policy(tokenizer), "auto", server=False, sleep_mode=False, cpu=True) is None
    assert adapter_push(lora_policy(tokenizer), "adapter", server=False, sleep_mode=False, cpu=True) is not None
    push = adapter_push(lora_policy(tokenizer, r=12), "auto", server=False, sleep_mode=False)
    assert push.engine_arguments() == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    assert [engine_lora_rank(rank) for rank in (1, 2, 16, 17, 512, 513)] == [1, 8, 16, 32, 512, None]


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeEngine:
    """What AdapterPush calls of vLLM's LLM: llm_engine.add_lora / remove_lora; `refuse` makes add_lora fail as
    vLLM does for target modules its LoRA layers do not wrap."""

    def __init__(self, refuse: bool = False):
        self.llm_engine = self
        self.loaded: dict[int, dict[str, torch.Tensor]] = {}
        self.refuse = refuse

    def add_lora(self, request) -> bool:
        if self.refuse:
            raise ValueError("While loading the adapter, expected target modules in [...] but received [...]")
        self.loaded[request.lora_int_id] = load_file(f"{request.lora_path}/adapter_model.safetensors")
        return True

    def remove_lora(self, lora_id: int) -> bool:
        return self.loaded.pop(lora_id, None) is not None


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm.lora.request")
    module.LoRARequest = FakeLoRARequest
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", module)


def test_every_push_loads_the_current_adapter_under_a_fresh_id_and_drops_the_last(tokenizer, fake_vllm):
    policy = lora_policy(tokenizer)
    push, engine, base_pushes = AdapterPush(policy, strict=True), FakeEngine(), []
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    seen, folders = [], []
    for _ in range(3):
        assert push.push(engine, policy, local_state, lambda: base_pushes.append(1))
        request = push.request
        assert list(engine.loaded) == [request.lora_int_id]  # only the current adapter stays loaded
        seen.append((request.lora_int_id, engine.loaded[request.lora_int_id][name].clone()))
        folders.append(request.lora_path)
        with torch.no_grad():  # an update changes the adapter
            for parameter_name, parameter in policy.named_parameters():
                if "lora_" in parameter_name:
                    parameter.add_(0.5)
    ids = [lora_id for lora_id, _ in seen]
    assert len(set(ids)) == 3 and len(set(folders)) == 3
    assert not torch.equal(seen[0][1], seen[1][1]) and not torch.equal(seen[1][1], seen[2][1])
    assert base_pushes == [1]  # the frozen base weights go once
    assert [os.path.isdir(folder) for folder in folders] == [False, False, True]
    push.close()
    assert not os.path.isdir(folders[-1])


def test_vllm_refusing_the_adapter_falls_back_under_auto_and_ends_the_run_under_adapter(tokenizer, fake_vllm, capsys):
    policy = lora_policy(tokenizer)
    assert AdapterPush(policy, strict=False).push(FakeEngine(refuse=True), policy, local_state, lambda: None) is False
    assert "warning: vLLM refused the policy's adapter" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"^training.vllm_lora_push: vLLM refused the policy's adapter \(While"):
        AdapterPush(policy, strict=True).push(FakeEngine(refuse=True), policy, local_state, lambda: None)


@pytest.mark.parametrize("options, message", [
    (dict(vllm_mode="server"), 'needs vllm_mode = "colocate"'),
    (dict(vllm_enable_sleep_mode=True), "vllm_enable_sleep_mode = true"),
])
def test_adapter_pushes_the_engine_cannot_take_are_refused_at_the_config(tmp_path, options, message):
    with pytest.raises(KeywordError, match=message):
        RLOOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_lora_push="adapter", **options)
    RLOOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_lora_push="auto", **options)  # auto merges there
