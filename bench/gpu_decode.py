"""Our decode loop (`rollout.generation.sample`) against transformers' `generate` at the same batch, on a CUDA
device (or the CPU, to check the script), with a profile of where one warm call of ours spends its time.

    python3 bench/gpu_decode.py --model FOLDER [--rows 16] [--tokens 256] [--dtype bfloat16] [--device cuda]
        [--repeats 3] [--profile-tokens 32]

FOLDER is a model folder whose config and tokenizer are used with random weights (seed 0), made once into a
temporary folder (`bench/bench_rloo.py: random_weight_copy`): random weights never end a completion, so every row
runs `--tokens` steps on both sides. Both sample at temperature 1 with no stop token; `generate` with its own
sampler (`do_sample=True, top_k=0, top_p=1`) and its static defaults otherwise. Each side is called once to warm up
(CUDA kernels load and compile on first use), then `--repeats` times timed; the device is synchronised around each
call. Printed: seconds per call, token steps per second and ms per step for each side, ours / generate.

Then one call of ours of `--profile-tokens` steps under `torch.profiler` (CPU and CUDA activities): the ten
operators with the most CPU time, and the count of device-to-host waits (`cudaStreamSynchronize`,
`cudaMemcpyAsync` to the host, `aten::item`, `aten::is_nonzero`), which tell a launch-bound or sync-bound step from
a compute-bound one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

WAITS = ("cudaStreamSynchronize", "cudaMemcpyAsync", "aten::item", "aten::is_nonzero", "aten::_local_scalar_dense")


def timed(call, device, repeats: int) -> list[float]:
    import torch

    call()  # warm-up
    seconds = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile-tokens", type=int, default=32)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench_rloo import PROMPTS, random_weight_copy
    from training_wizard.rollout.generation import GenerationParams, sample

    folder = random_weight_copy(args.model, Path(tempfile.mkdtemp()) / "random", args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    prompts = [PROMPTS[row % len(PROMPTS)] for row in range(args.rows)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True).to(args.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    seeds = list(range(args.rows))

    def ours(tokens=args.tokens):
        return sample(model, encoded.input_ids, encoded.attention_mask, GenerationParams(tokens, 1.0, (), pad), seeds)

    def theirs():
        with torch.no_grad():
            return model.generate(**encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=args.tokens, min_new_tokens=args.tokens, pad_token_id=pad)

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"{device_name}; torch {torch.__version__}; {args.rows} rows x {args.tokens} tokens, {args.dtype}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)
    results = {"ours": timed(ours, args.device, args.repeats), "generate": timed(theirs, args.device, args.repeats)}
    for side, seconds in results.items():
        median = statistics.median(seconds)
        print(f"{side}: {median:.2f} s per call ({', '.join(f'{s:.2f}' for s in seconds)}), "
              f"{args.tokens / median:.1f} steps/s, {1000 * median / args.tokens:.1f} ms per step", flush=True)
    print(f"ours / generate, steps per second: "
          f"{statistics.median(results['generate']) / statistics.median(results['ours']):.2f}", flush=True)

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as profiler:
        ours(args.profile_tokens)
        if args.device == "cuda":
            torch.cuda.synchronize()
    events = profiler.key_averages()
    print(f"\nours, {args.profile_tokens} steps under the profiler: the operators with the most CPU time")
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[:10]:
        print(f"  {event.key}: {event.self_cpu_time_total / 1000:.1f} ms self CPU, {event.count} calls")
    waits = {event.key: event.count for event in events if event.key in WAITS}
    print(f"device-to-host waits per step: " + ", ".join(
        f"{name} {count / args.profile_tokens:.1f}" for name, count in sorted(waits.items())) or "none")


if __name__ == "__main__":
    main()
