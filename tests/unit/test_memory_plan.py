"""The memory plan (memory_plan.py): its arithmetic against the models' own counts and hand-computed cases, the
budget check and its one key, and the CLI's --memory-budget."""

import json

import pytest
import torch

from training_wizard.cli import main
from training_wizard.errors import UserError
from training_wizard.memory_plan import (
    LOGITS_CHUNK_ELEMENTS, MemoryFacts, ModelShape, parse_size, plan_memory, verdict,
)
from training_wizard.testing import build_causal_lm

SHAPE = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=320, intermediate=128)


def terms(facts: MemoryFacts) -> dict[str, int]:
    return {term.name: term.bytes for term in plan_memory(facts).terms}


@pytest.mark.parametrize("arch, overrides", [
    ("llama", {}), ("qwen2", {}), ("llama", {"tie_word_embeddings": True}),
    ("llama", {"attention_bias": True, "mlp_bias": True}), ("qwen2", {"head_dim": 8}),
])
def test_parameters_equal_the_models_numel(tokenizer, arch, overrides):
    model = build_causal_lm(tokenizer, arch=arch, **overrides)
    shape = ModelShape.from_config(model.config.to_dict())
    assert shape.parameters() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["down_proj", "lm_head"]])
def test_lora_parameters_equal_pefts_trainable_count(tokenizer, targets):
    from peft import LoraConfig, get_peft_model

    model = build_causal_lm(tokenizer, arch="qwen2")
    shape = ModelShape.from_config(model.config.to_dict())
    peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=targets))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert shape.lora_parameters(4, targets if isinstance(targets, str) else tuple(targets)) == trainable


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_folded_lora_weights_are_what_sampling_allocates(tokenizer, targets):
    """The sampling phase's "folded LoRA weights" term is the size of the tensors `adapters_folded` makes (the
    term a LoRA run's plan was missing: 0.78 and 0.73 of the measured peak before it)."""
    from peft import LoraConfig, get_peft_model

    from training_wizard.rollout.adapters import adapters_folded, foldable_lora_layers

    model = get_peft_model(build_causal_lm(tokenizer, arch="qwen2"),
                           LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=targets))
    shape = ModelShape.from_config(model.config.to_dict())
    with adapters_folded(model) as folded:
        assert folded
        made = sum(layer.forward.args[0].nbytes for layer in foldable_lora_layers(model))
    plan = terms(MemoryFacts(policy=shape, lora_rank=4, lora_targets=targets if isinstance(targets, str)
                             else tuple(targets), reference="adapter"))
    assert plan["folded LoRA weights"] == made
    assert "folded LoRA weights" not in terms(MemoryFacts(policy=shape))
    unfolded = MemoryFacts(policy=shape, lora_rank=4, reference="adapter", fold_lora=False)
    assert "folded LoRA weights" not in terms(unfolded)


@pytest.mark.parametrize("sharding, gather, switch, folds", [
    ("none", True, True, True), ("zero2", True, True, True), ("zero3", True, True, True),
    ("zero3", False, True, False), ("fsdp", True, True, False), ("none", True, False, False),
])
def test_the_plan_folds_where_the_decode_loop_folds(sharding, gather, switch, folds):
    """As rollout_model decides: ZeRO-3 gathering for generation samples (and folds) the whole model; ZeRO-3
    without it and FSDP sample with the sharded model, unfolded."""
    from training_wizard import GRPOConfig
    from training_wizard.recipes.memory_report import folds_lora

    config = GRPOConfig(output_dir="unused", ds3_gather_for_generation=gather, fold_lora_for_sampling=switch)
    assert folds_lora(config, sharding) is folds


def test_when_the_folded_copy_decides_the_peak_the_plan_names_fold_lora_for_sampling():
    seven_b = ModelShape(hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128, vocab=152064, intermediate=18944,
                         qkv_bias=True)  # Qwen2.5-7B's config.json
    facts = MemoryFacts(policy=seven_b, weight_bytes=2, activation_bytes=2, lora_rank=16, reference="adapter",
                        micro_batch_rows=4, rollout_rows=16, prompt_length=256, completion_length=1024,
                        gradient_checkpointing=True)
    plan = plan_memory(facts)
    assert plan.peak_phase == "sampling"
    assert verdict(plan, plan.total - 1).knob == "training.fold_lora_for_sampling = false"
    assert plan_memory(MemoryFacts(**{**facts.__dict__, "fold_lora": False})).total < plan.total


def saved_values_per_layer(tokenizer, attention: str, rank: int | None, width: int = 24) -> float:
    """Values autograd keeps per token for one more decoder layer, in a forward pass over left-padded rows."""
    def saved(layers: int) -> int:
        model = build_causal_lm(tokenizer, num_layers=layers, attn_implementation=attention)
        if rank is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=rank, target_modules="all-linear"))
        model.train()
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        kept: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in weights:
                kept[storage.data_ptr()] = storage.nbytes()
            return tensor

        ids = torch.randint(5, len(tokenizer), (2, width))
        mask = torch.ones_like(ids)
        mask[0, :5] = 0  # a shorter prompt, left-padded
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(input_ids=ids, attention_mask=mask, use_cache=False)
        return sum(kept.values())

    return (saved(3) - saved(2)) / (2 * width) / 4  # float32 values per token


@pytest.mark.parametrize("attention, rank", [("sdpa", None), ("eager", None), ("sdpa", 4)])
def test_activation_values_equal_what_autograd_keeps(tokenizer, attention, rank):
    shape = ModelShape.from_config(build_causal_lm(tokenizer).config.to_dict())
    expected = saved_values_per_layer(tokenizer, attention, rank)
    assert shape.activation_values(24, eager=attention == "eager", lora_rank=rank or 0) == expected


def test_zero_stages_and_fsdp_divide_by_processes():
    params, trained = SHAPE.parameters(), SHAPE.parameters()
    alone = terms(MemoryFacts(policy=SHAPE, reference="none"))
    assert alone["policy weights"] == 4 * params and alone["AdamW states"] == 8 * trained
    assert alone["gradients"] == 4 * trained
    for sharding, divided in (("zero1", {"AdamW states"}), ("zero2", {"AdamW states", "gradients"}),
                              ("zero3", {"AdamW states", "gradients", "policy weights"}),
                              ("fsdp", {"AdamW states", "gradients", "policy weights"})):
        shared = terms(MemoryFacts(policy=SHAPE, reference="none", processes=4, sharding=sharding))
        for name in ("policy weights", "AdamW states", "gradients"):
            assert shared[name] == (alone[name] // 4 if name in divided else alone[name]), (sharding, name)


def test_lora_trains_only_the_adapter_and_its_reference_is_the_adapter_disabled():
    lora = SHAPE.lora_parameters(8, "all-linear")
    full = terms(MemoryFacts(policy=SHAPE, reference="copy"))
    adapter = terms(MemoryFacts(policy=SHAPE, lora_rank=8, reference="adapter"))
    assert full["reference weights"] == 4 * SHAPE.parameters() and "reference weights" not in adapter
    assert adapter["AdamW states"] == 8 * lora and adapter["gradients"] == 4 * lora
    assert adapter["policy weights"] == full["policy weights"]


def test_activations_kv_cache_and_output_layer_by_hand():
    facts = MemoryFacts(policy=SHAPE, micro_batch_rows=2, rollout_rows=3, prompt_length=6, completion_length=10)
    per_layer = 10 * 64 + 4 * 128 + 2 + 4 + 16  # SDPA, a sequence of 16
    tokens = 2 * 16
    got = terms(facts)
    assert got["activations"] == 4 * tokens * (2 * per_layer + 2 * 64 + 2 * 16)
    assert got["KV cache"] == 3 * 16 * 2 * 2 * (2 * 16) * 4  # rows, positions, layers, keys and values, kv width
    assert got["output layer"] == 2 * 4 * 320 * (2 * 10)  # two float32 buffers of the response positions' logits
    checkpointed = terms(MemoryFacts(**{**facts.__dict__, "gradient_checkpointing": True}))
    assert checkpointed["activations"] == 4 * tokens * (2 * 64 + per_layer + 2 * 64 + 2 * 16)


def test_output_layer_work_stops_at_the_chunk_and_grows_without_it():
    long = MemoryFacts(policy=SHAPE, micro_batch_rows=64, prompt_length=10, completion_length=1024)
    chunks = 2 * 4 * 320 * (LOGITS_CHUNK_ELEMENTS // 320)  # two float32 buffers of whole rows of logits
    assert terms(long)["output layer"] == chunks
    sharded = terms(MemoryFacts(**{**long.__dict__, "head_logprobs": False}))
    assert sharded["output layer"] == 64 * 1024 * 320 * 4 * 2 + chunks  # logits and their gradient


def test_peak_is_what_is_held_plus_the_largest_phase():
    plan = plan_memory(MemoryFacts(policy=SHAPE, runtime_bytes=10**6, micro_batch_rows=4, rollout_rows=64,
                                   prompt_length=8, completion_length=512))
    held = sum(term.bytes for term in plan.terms if term.phase == "held")
    phases = {phase: sum(term.bytes for term in plan.terms if term.phase == phase)
              for phase in ("sampling", "rollout", "update")}
    assert plan.total == held + max(phases.values())
    assert plan.peak_phase == max(phases, key=phases.get)


def test_the_one_key_is_the_largest_terms_knob_that_still_turns():
    facts = MemoryFacts(policy=SHAPE, lora_rank=4, reference="adapter", micro_batch_rows=8, rollout_rows=1,
                        prompt_length=64, completion_length=512)
    plan = plan_memory(facts)
    assert plan.total > 10**6 and verdict(plan, plan.total).fits and verdict(plan, plan.total).knob is None
    assert verdict(plan, 10**6).knob == "training.gradient_checkpointing = true"
    checkpointed = plan_memory(MemoryFacts(**{**facts.__dict__, "gradient_checkpointing": True}))
    assert not verdict(checkpointed, 10**6).fits
    assert verdict(checkpointed, 10**6).knob == "training.per_device_train_batch_size = 4"
    one_row = plan_memory(MemoryFacts(**{**facts.__dict__, "gradient_checkpointing": True, "micro_batch_rows": 1}))
    assert verdict(one_row, 10**6).knob == "training.response_length = 256"
    rollout = plan_memory(MemoryFacts(**{**facts.__dict__, "rollout_rows": 512, "micro_batch_rows": 1}))
    assert rollout.peak_phase != "update"
    assert verdict(rollout, 10**6).knob == "training.local_rollout_forward_batch_size = 256"
    full = plan_memory(MemoryFacts(policy=SHAPE, reference="copy"))  # AdamW's two moments per weight lead
    assert verdict(full, 1).knob == "model.lora = { r = 16 }"


@pytest.mark.parametrize("text, expected", [("24GB", 24 * 10**9), ("80GiB", 80 * 2**30), ("512mb", 512 * 10**6),
                                            ("1.5 TB", 15 * 10**11), ("1000", 1000), ("64k", 64000)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["24XB", "GB", "-1GB", "0", "24 G B", ""])
def test_a_malformed_size_is_a_user_error_naming_the_flag(text):
    with pytest.raises(UserError, match="--memory-budget: .* is not a size"):
        parse_size(text)


RECIPE = """\
recipe_class = "rloo"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
[dataset]
data_files = "prompts.jsonl"
[reward]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "training_wizard.rewards:think_format_reward"
[training]
per_device_train_batch_size = 4
total_episodes = 8
response_length = 6
"""


@pytest.fixture
def recipe(tmp_path, tiny_model_dir):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Say something about {topic}."}) + "\n"
                                                    for topic in ("cats", "rain", "tea", "maps")))
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(out=tmp_path / "run", model=tiny_model_dir))
    return path


def test_dry_run_with_a_budget_too_small_says_so_and_names_the_key(recipe, capsys):
    assert main([str(recipe), "--dry-run", "--memory-budget", "1MB"]) == 0
    out = capsys.readouterr().out
    assert "memory plan per process" in out and "KV cache" in out
    line = next(text for text in out.splitlines() if text.startswith("memory: "))
    assert "does not fit 1 MB (--memory-budget); change first: training.gradient_checkpointing = true" in line
    assert not (recipe.parent / "run").exists()


def test_a_malformed_budget_is_one_line_and_exit_2(recipe, capsys):
    assert main([str(recipe), "--dry-run", "--memory-budget", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: --memory-budget: 'lots' is not a size; expected a positive number and a unit, e.g. 24GB, 512MB or "
        "80GiB"]
