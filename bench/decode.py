"""The decode loop (`rollout.generation.sample`) of an earlier revision against this one, in alternating fresh
processes, on the bench models of `bench/bench_rloo.py`.

    git worktree add --detach ../before REVISION
    OMP_NUM_THREADS=2 .venv/bin/python bench/decode.py --before ../before [--rounds 2] [--repeats 2]
        [--configs 25m:64,smollm2-lora:32]

Each process loads the model (SmolLM2-135M with LoRA r 16 on every linear layer for "smollm2-lora", its adapter
B set to small random values so that folding it changes the weights, as after training), then samples 16 prompts
x 4 completions of the given length at temperature 1 with no stop token, once to warm up and `--repeats` times
timed, with the collector's wrapping: this revision folds LoRA into the base weights around the loop
(`rollout.adapters.adapters_folded`), the earlier one has no such step. Prints the median seconds per completion
batch on each side, their ratio, and whether both sides drew the same tokens (LoRA folding changes the logits by
rounding, so an occasional row may differ from the first token whose draw falls that close to a boundary).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_rloo import K, LORA, PROMPTS, PROMPTS_PER_ITERATION, build_models, wait_for_quiet  # noqa: E402


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from training_wizard.rollout.generation import GenerationParams, sample
    from training_wizard.specs.model import TransformerSpec

    try:
        from training_wizard.rollout.adapters import adapters_folded
    except ImportError:  # an earlier revision: no folding
        adapters_folded = lambda model: contextlib.nullcontext()  # noqa: E731
    lora = LORA if args.lora else None
    spec = TransformerSpec(pretrained_name=args.model, lora=lora)
    tokenizer = spec.load_tokenizer()
    tokenizer.padding_side = "left"
    model = spec.apply_lora(spec.load_causal_lm("float32")).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.01)
    encoded = tokenizer(PROMPTS[:PROMPTS_PER_ITERATION] * K, return_tensors="pt", padding=True)
    params = GenerationParams(args.length, 1.0, (), tokenizer.pad_token_id)
    seeds = list(range(PROMPTS_PER_ITERATION * K))
    seconds = []
    for repeat in range(args.repeats + 1):
        started = time.perf_counter()
        with adapters_folded(model):
            drawn = sample(model, encoded.input_ids, encoded.attention_mask, params, seeds)
        if repeat:
            seconds.append(time.perf_counter() - started)
    Path(args.result).write_text(json.dumps({"seconds": seconds, "tokens": drawn.tokens.tolist()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the earlier revision")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", default="25m:64,smollm2-lora:32")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model")
    parser.add_argument("--length", type=int)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.before is None:
        parser.error("--before is required")
    folders = build_models(args.cache)
    print("| model : new tokens | before s (median) | after s (median) | after / before | same tokens |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        for config in args.configs.split(","):
            name, length = config.split(":")
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for round_index in range(args.rounds):
                sides = [("before", args.before.resolve()), ("after", REPO)]
                for side, checkout in sides if round_index % 2 == 0 else sides[::-1]:
                    wait_for_quiet()
                    result = Path(scratch) / f"{name}-{round_index}-{side}.json"
                    command = [sys.executable, __file__, "--worker", "--model", str(folders[name]), "--length", length,
                               "--repeats", str(args.repeats), "--threads", str(args.threads), "--result", str(result)]
                    command += ["--lora"] if name.endswith("lora") else []
                    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(checkout),
                           "HF_HUB_OFFLINE": "1"}
                    subprocess.run(command, env=env, check=True, capture_output=True)
                    runs[side].append(json.loads(result.read_text()))
            before, after = (statistics.median(s for run in runs[side] for s in run["seconds"]) for side in runs)
            same = runs["before"][0]["tokens"] == runs["after"][0]["tokens"]
            print(f"| {config} | {before:.2f} | {after:.2f} | {after / before:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
