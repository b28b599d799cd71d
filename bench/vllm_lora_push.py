"""Pushing a LoRA policy to a colocated vLLM engine: the adapter alone (`vllm_lora_push = "adapter"`) against the
merged weights (`"merged"`, the push before adapter pushes existed), on vLLM's CPU build.

    OMP_NUM_THREADS=2 .venv-vllm/bin/python bench/vllm_lora_push.py [--pushes 5] [--length 32]

SmolLM2-135M-Instruct in float32 with LoRA r 16 (alpha 32) on every linear layer, its adapter B set to small random
values so that it changes the logits, as after training. One engine per mode, in this one process. After the
first push (the adapter engine's carries the base weights), each round changes the adapter (as an update does)
and times each engine's push (`push_weights`: what the trainer runs once per iteration), the two modes
alternating so that both see the same load. Prints one markdown row per mode (median push seconds, MiB sent per
push), then both engines sample greedily from the last adapter (`--rows` completions of `--length` tokens, no stop
token, timed once): whether the tokens agree, and the largest gap between the two engines' logprobs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_rloo import K, LORA, PROMPTS, PROMPTS_PER_ITERATION, wait_for_quiet  # noqa: E402

MODES = ("adapter", "merged")


def lora_policy():
    import torch

    from training_wizard.specs.model import TransformerSpec

    spec = TransformerSpec(pretrained_name="HuggingFaceTB/SmolLM2-135M-Instruct", lora=LORA)
    tokenizer = spec.load_tokenizer()
    tokenizer.padding_side = "left"
    policy = spec.apply_lora(spec.load_causal_lm("float32")).eval()
    change_adapter(policy, seed=0)
    return policy, tokenizer


def change_adapter(policy, seed: int) -> None:
    """New random B matrices (A as peft initialised it): a stand-in for an update of the adapter."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.01)


def mib_sent(policy, mode: str) -> float:
    tensors = [p for n, p in policy.named_parameters() if ("lora_" in n) == (mode == "adapter")]
    return sum(p.numel() * p.element_size() for p in tensors) / 2**20


def timed(call) -> tuple[float, object]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--rows", type=int, default=PROMPTS_PER_ITERATION * K, help="completions per sampling call")
    parser.add_argument("--quiet-wait", type=float, default=20.0,
                        help="seconds to wait, at most, for the other processes to go quiet before each timing")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from training_wizard.rollout.generation import GenerationParams
    from training_wizard.rollout.vllm import VLLMColocateBackend

    policy, tokenizer = lora_policy()
    engines = {mode: VLLMColocateBackend(policy, max_model_len=256, seed=0, gpu_memory_utilization=0.3,
                                         tensor_parallel_size=1, sleep_mode=False, world_size=1, sampling_options={},
                                         lora_push=mode)
               for mode in MODES}
    assert engines["adapter"].adapter is not None and engines["merged"].adapter is None
    encoded = tokenizer((PROMPTS[:PROMPTS_PER_ITERATION] * K)[: args.rows], return_tensors="pt", padding=True)
    seeds = list(range(args.rows))

    def sample(mode, temperature):
        params = GenerationParams(args.length, temperature, (), tokenizer.pad_token_id)
        return engines[mode].sample(policy, encoded.input_ids, encoded.attention_mask, params, seeds)

    first = {mode: timed(lambda: engines[mode].sync_weights(policy))[0] for mode in MODES}
    print(f"first push (the adapter engine's carries the base weights too): {first}", flush=True)
    pushes: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_index in range(args.pushes):
        change_adapter(policy, seed=round_index + 1)
        for mode in MODES if round_index % 2 == 0 else MODES[::-1]:
            wait_for_quiet(args.quiet_wait)
            engines[mode].weights_changed()
            pushes[mode].append(timed(lambda: engines[mode].sync_weights(policy))[0])
            print(f"round {round_index} {mode}: push {pushes[mode][-1]:.3f} s", flush=True)
    print("| push | push s (median) | MiB sent per push |")
    print("| --- | --- | --- |")
    for mode in MODES:
        print(f"| {mode} | {statistics.median(pushes[mode]):.3f} | {mib_sent(policy, mode):.1f} |", flush=True)
    # after the timed pushes, as they may take long on a busy CPU: the two engines' samples of the last adapter
    greedy = {}
    for mode in MODES:
        seconds, greedy[mode] = timed(lambda: sample(mode, 0.0))
        print(f"greedy sampling, {mode}: {seconds:.2f} s", flush=True)
    same_tokens = torch.equal(greedy["adapter"].tokens, greedy["merged"].tokens)
    gap = (greedy["adapter"].logprobs - greedy["merged"].logprobs).abs().max().item()
    print(f"greedy, {len(seeds)} rows x {args.length} tokens: same tokens {same_tokens}; largest logprob gap "
          f"{gap:.1e}", flush=True)


if __name__ == "__main__":
    main()
