"""Pushing only a LoRA policy's adapter to the colocated engine (vllm_lora_push = "adapter", what "auto" picks for a
plain LoRA policy): it samples what the merged push samples, follows every update under a fresh adapter id, and a
run with it logs what a run with merged pushes logs."""

import copy

import pytest
import torch

from training_wizard.rollout.vllm import VLLMColocateBackend

from conftest import vllm_sized_model
from test_vllm_backend import sample_rows, training_logprobs
from test_vllm_training import distinct_characters, lora_policy, rloo_run, without_timings

pytestmark = pytest.mark.vllm

ROWS = [0, 1, 2, 3, 4, 5]


def backend_for(policy, lora_push):
    return VLLMColocateBackend(policy, max_model_len=128, seed=0, gpu_memory_utilization=0.3, tensor_parallel_size=1,
                               sleep_mode=False, world_size=1, sampling_options={}, lora_push=lora_push)


def update_adapter(policy, step):
    """What an optimizer step does to the adapter: every A and B moves (deterministically per step)."""
    generator = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)


def test_adapter_pushes_sample_what_merged_pushes_sample_across_updates(tokenizer):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(vllm_sized_model(tokenizer).eval(),
                            LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    adapter, merged = backend_for(policy, "adapter"), backend_for(policy, "merged")
    assert adapter.adapter is not None and merged.adapter is None
    earlier, ids_seen = None, []
    for step in range(3):  # the first push, then two updates
        for backend in (adapter, merged):
            backend.weights_changed()
        greedy = [sample_rows(backend, policy, tokenizer, ROWS, temperature=0.0)[2] for backend in (adapter, merged)]
        assert torch.equal(greedy[0].responses, greedy[1].responses), step
        gap = (greedy[0].sampling_logprobs - greedy[1].sampling_logprobs)[greedy[0].mask].abs().max()
        assert gap < 1e-4, (step, gap)
        ids, mask, drawn = sample_rows(adapter, policy, tokenizer, ROWS, temperature=1.0)
        follows = training_logprobs(policy, ids, mask, drawn, 1.0)
        assert (follows - drawn.sampling_logprobs)[drawn.mask].abs().max() < 1e-4
        if earlier is not None:  # the engine sampled from this update's adapter, not a cached earlier one
            stale = training_logprobs(earlier, ids, mask, drawn, 1.0)
            assert (stale - drawn.sampling_logprobs)[drawn.mask].abs().max() > 1e-2
        ids_seen.append(adapter.adapter.request.lora_int_id)
        assert adapter.engine.llm_engine.list_loras() == {ids_seen[-1]}  # the previous adapter was dropped
        earlier = copy.deepcopy(policy)
        update_adapter(policy, step)
    assert ids_seen == [1, 2, 3]


def test_a_run_pushing_the_adapter_logs_what_a_run_pushing_merged_weights_logs(tokenizer, tmp_path, monkeypatch):
    from training_wizard.rollout.vllm_lora import AdapterPush

    adapter_pushes = []
    original = AdapterPush.push
    monkeypatch.setattr(AdapterPush, "push", lambda self, *args: adapter_pushes.append(1) or original(self, *args))
    runs = {push: rloo_run(tokenizer, tmp_path / push, policy=lora_policy(tokenizer), reward=distinct_characters,
                           use_vllm=True, total_episodes=16 * 4, learning_rate=3e-2, kl_coef=0.05,
                           vllm_lora_push=push)
            for push in ("adapter", "merged")}
    adapter, merged = (without_timings(runs[push]) for push in ("adapter", "merged"))
    assert len(adapter) == len(merged) == 4
    assert len(adapter_pushes) == 4  # one per iteration, all in the "adapter" run
    for iteration, (ours, theirs) in enumerate(zip(adapter, merged)):
        assert ours.keys() == theirs.keys()
        # the same tokens are drawn (equal scores and lengths); every other number agrees to float rounding
        assert ours["objective/scores"] == theirs["objective/scores"], iteration
        for key in ours:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-3, abs=1e-5), (iteration, key)
