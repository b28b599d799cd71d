"""The colocated vLLM engine as a generation backend: its logprobs against the training forward pass, seeded rows,
weight pushes (full and LoRA), and the one-line refusals."""

import copy

import pytest
import torch

from training_wizard.errors import UserError
from training_wizard.rollout.backends import sample_completions
from training_wizard.rollout.generation import GenerationParams
from training_wizard.rollout.prompts import EncodedPrompts, row_seed
from training_wizard.rollout.scoring import batched_logprobs
from training_wizard.rollout.vllm import VLLMColocateBackend

from conftest import vllm_sized_model

pytestmark = pytest.mark.vllm

PROMPTS = [{"prompt": text} for text in ("Write a short line.", "Paraphrase: the fox jumps.", "Hi", "Numbers 1 2 3 4",
                                         "What is the capital of France?", "A b c")]


def make_backend(model):
    return VLLMColocateBackend(model, max_model_len=128, seed=0, gpu_memory_utilization=0.3, tensor_parallel_size=1,
                               sleep_mode=False, world_size=1, sampling_options={})


@pytest.fixture(scope="module")
def model(tokenizer):
    return vllm_sized_model(tokenizer).eval()


@pytest.fixture(scope="module")
def backend(model):
    return make_backend(model)


def encoded(tokenizer, rows):
    prompts = EncodedPrompts.from_rows(PROMPTS, tokenizer)
    return prompts.left_pad(rows, tokenizer.pad_token_id)


def sample_rows(backend, model, tokenizer, rows, temperature=1.0, seeds=None, max_new_tokens=12, stop_token_ids=None):
    ids, mask = encoded(tokenizer, rows)
    params = GenerationParams(max_new_tokens, temperature, stop_token_ids or (tokenizer.eos_token_id,),
                              tokenizer.pad_token_id)
    seeds = seeds if seeds is not None else [row_seed(3, 0, row) for row in rows]
    return ids, mask, sample_completions(backend, model, ids, mask, params, seeds)


def training_logprobs(model, ids, mask, completions, temperature):
    with torch.no_grad():
        return batched_logprobs(model, ids, mask, completions.responses, completions.mask, temperature, 64,
                                share_prompts=False, from_hidden_states=False)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_equal_the_training_forward_pass(backend, model, tokenizer, temperature):
    backend.weights_changed()
    ids, mask, completions = sample_rows(backend, model, tokenizer, list(range(len(PROMPTS))), temperature)
    assert int(completions.mask.sum()) >= len(PROMPTS) * 4  # real completions, not empty rows
    train = training_logprobs(model, ids, mask, completions, temperature)
    gap = (train - completions.sampling_logprobs)[completions.mask].abs().max()
    assert gap < 1e-4, gap
    # temperature is applied: at 0.7 the logprobs are not those of temperature 1
    if temperature != 1.0:
        plain = training_logprobs(model, ids, mask, completions, 1.0)
        assert (plain - completions.sampling_logprobs)[completions.mask].abs().max() > 1e-2


def test_a_rows_completion_depends_on_its_key_not_on_the_batch_around_it(backend, model, tokenizer):
    backend.weights_changed()
    rows = [0, 1, 2, 3, 4, 5]
    seeds = [row_seed(11, 2, slot) for slot in range(len(rows))]
    _, _, whole = sample_rows(backend, model, tokenizer, rows, seeds=seeds)
    _, _, again = sample_rows(backend, model, tokenizer, rows, seeds=seeds)
    assert torch.equal(whole.responses, again.responses)
    # row 4 alone, and rows 3 and 1 in the other order with two new neighbours
    _, _, alone = sample_rows(backend, model, tokenizer, [4], seeds=[seeds[4]])
    _, _, mixed = sample_rows(backend, model, tokenizer, [5, 3, 0, 1], seeds=[99, seeds[3], 7, seeds[1]])
    for got, row in ((alone, 4),):
        width = int(got.mask[0].sum())
        assert torch.equal(got.responses[0, :width], whole.responses[row, :width])
    for position, row in ((1, 3), (3, 1)):
        width = int(mixed.mask[position].sum())
        assert width == int(whole.mask[row].sum())
        assert torch.equal(mixed.responses[position, :width], whole.responses[row, :width])
    # another key gives another completion
    _, _, other = sample_rows(backend, model, tokenizer, [4], seeds=[seeds[4] + 1])
    assert not torch.equal(other.responses[0], alone.responses[0])


def test_pushed_weights_are_the_ones_sampled_from(backend, model, tokenizer):
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    backend.weights_changed()
    ids, mask, completions = sample_rows(backend, changed, tokenizer, [0, 1, 2, 3])
    follows = training_logprobs(changed, ids, mask, completions, 1.0)
    before = training_logprobs(model, ids, mask, completions, 1.0)
    assert (follows - completions.sampling_logprobs)[completions.mask].abs().max() < 1e-4
    assert (before - completions.sampling_logprobs)[completions.mask].abs().max() > 1e-2
    # without weights_changed() nothing is pushed: the engine keeps the weights it has
    ids, mask, unchanged = sample_rows(backend, model, tokenizer, [0, 1, 2, 3])
    still = training_logprobs(changed, ids, mask, unchanged, 1.0)
    assert (still - unchanged.sampling_logprobs)[unchanged.mask].abs().max() < 1e-4


def test_a_lora_policy_is_pushed_with_its_adapters_folded_in(backend, model, tokenizer):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(copy.deepcopy(model),
                            LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    base_before = {name: p.clone() for name, p in policy.named_parameters() if "base_layer" in name}
    backend.weights_changed()
    ids, mask, completions = sample_rows(backend, policy, tokenizer, [0, 1, 2, 3, 4, 5])
    with_adapter = training_logprobs(policy, ids, mask, completions, 1.0)
    assert (with_adapter - completions.sampling_logprobs)[completions.mask].abs().max() < 1e-4
    base = training_logprobs(model, ids, mask, completions, 1.0)
    assert (base - completions.sampling_logprobs)[completions.mask].abs().max() > 1e-2  # the adapter matters
    for name, parameter in policy.named_parameters():  # folding made new tensors: the base weights are untouched
        if name in base_before:
            assert torch.equal(parameter, base_before[name]), name


def test_head_sizes_the_cpu_build_cannot_run_are_refused_in_one_line(tokenizer):
    from training_wizard.testing import build_causal_lm

    model = build_causal_lm(tokenizer, arch="qwen2")  # 4 heads of 16
    with pytest.raises(UserError, match="head size is 16; vLLM's CPU build runs only head sizes 32, 64"):
        make_backend(model)


def test_sleep_mode_is_refused_on_cpu(model):
    with pytest.raises(UserError, match="vllm_enable_sleep_mode: vLLM has no sleep mode on CPU"):
        VLLMColocateBackend(model, max_model_len=128, seed=0, gpu_memory_utilization=0.3, tensor_parallel_size=1,
                            sleep_mode=True, world_size=1, sampling_options={})


def test_a_completion_ends_at_any_of_the_stop_ids(backend, model, tokenizer):
    """As the decode loop (tests/unit/test_stop_tokens.py): sampled again with the same keys and a token the first
    row drew as a second stop id, every row keeps its tokens up to its first stop of either kind and ends there."""
    backend.weights_changed()
    rows = list(range(len(PROMPTS)))
    _, _, alone = sample_rows(backend, model, tokenizer, rows)
    first_row = alone.responses[0][alone.mask[0]].tolist()
    assert len(first_row) >= 4
    second = first_row[2]
    _, _, both = sample_rows(backend, model, tokenizer, rows, stop_token_ids=(tokenizer.eos_token_id, second))
    for row in rows:
        kept = alone.responses[row][alone.mask[row]].tolist()
        cut = next((i for i, t in enumerate(kept) if t in (tokenizer.eos_token_id, second)), len(kept) - 1)
        assert both.responses[row][both.mask[row]].tolist() == kept[: cut + 1]
    assert bool(both.has_stop[0])
