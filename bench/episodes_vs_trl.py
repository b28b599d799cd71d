"""Multi-turn tool episodes per second: training-wizard's GRPOTrainer against TRL 1.16's GRPOTrainer, both given
`environment_factory=` the calculator of examples/tools, at equal settings, in alternating fresh processes (ours,
TRL, ours, TRL, ...).

    scripts/setup_trl_bench.sh                   # once: .venv-trl-bench, trl 1.16.0 with our torch/transformers pins
    training-wizard examples/tools/sft.toml      # once: the model both sides start from (see below)
    OMP_NUM_THREADS=2 .venv/bin/python bench/episodes_vs_trl.py [--pairs 2] [--warmup 1] [--iterations 2]
        [--json results.json] [--prompts 8] [--generations 4] [--length 96] [--model runs/tools/sft/model]

What it measures: episodes per second = episodes generated and trained on in the timed iterations / the wall
seconds of those iterations (generation with its tool rounds, scoring and the optimizer update), after `--warmup`
untimed iterations, per process; the report gives each run, the ratio ours/TRL per pair, the split into generation
and update, the share of episodes in which the model called the tool (counted by the environment itself, the same
code on both sides) and tool calls per episode, and the mean reward.

Model: the SFT stage of examples/tools (SmolLM2-135M-Instruct fine-tuned on 256 worked calculator episodes, LoRA
merged: a plain float32 folder), so that most episodes are multi-turn on both sides; full fine-tuning (no LoRA) here.
Both sides load that folder. Ours runs in .venv; TRL's worker runs in .venv-trl-bench, which does not have
training-wizard installed: the worker imports only this file and examples/tools/calculator.py.

Chat template: the example's (examples/tools/chat_template.jinja: ChatML with Hermes tool calls, one line per tool),
read from that file by both sides, so both render the same prompt tokens (TRL also renders an assistant message's
structured `tool_calls` with it, which it checks at start). TRL does not recognise it for
its tool-call parser (trl.chat_template_utils.add_response_schema: "Unrecognized chat template"), so the TRL worker
sets `tokenizer.response_template` to TRL's Qwen3 response template, which parses the same
`<tool_call>\\n{json}\\n</tool_call>` form inside ChatML; TRL finds the template prefix-preserving and keeps it.

Environment: examples/tools' `Calculator` (one tool, `calculate(expression)`), with a `get_reward` that records the
episode's calls and adds 0, on both sides; the reward is the example's `right_answer` (1.0 when the last number of
the last reply is a * b + c). Prompts: the example's first questions, "What is a * b + c?".

Equal settings (one iteration = one generation of 32 episodes + one optimizer step on both sides):
  8 prompts x 4 generations = 32 episodes         TRL: per_device_train_batch_size=32, num_generations=4,
                                                    steps_per_generation=1, gradient_accumulation_steps=1
                                                  ours: per_device_train_batch_size=32, num_generations=4,
                                                    num_mini_batches=1
  one epoch over each batch, no KL (beta 0)       TRL: num_iterations=1, beta=0.0; ours: num_ppo_epochs=1, kl_coef=0
  loss "dapo", rewards scaled by the group std    both defaults; clip epsilon 0.2 (both defaults)
  96 tokens for the whole episode                 TRL: max_completion_length=96; ours: response_length=96
  at most 2 tool rounds                           both: max_tool_calling_iterations=2
  temperature 0.7, top_p 1, top_k off             both
  learning rate 1e-5, AdamW, grad clip 1.0, fp32  TRL: use_cpu=True, bf16=False (no autocast)
  gradient checkpointing off                      both
  OMP_NUM_THREADS and torch.set_num_threads       `--threads` (default $OMP_NUM_THREADS or 2), both sides
Differences that remain are the two loops' own: TRL generates each turn with `transformers` `generate`
(max_new_tokens = max_completion_length every turn, cut to the budget afterwards) and re-reads the whole context
each turn; ours samples each turn with its own decode loop, the whole episode held to response_length, and also
re-reads the context each turn (`[environment] keep_kv_cache`, off by default and here, keeps its KV cache instead:
bench/episode_kv_cache.py). TRL (num_iterations=1, steps_per_generation=1) skips the old-logprob pass; ours in
float32 takes the old logprobs from the sampling pass ("auto"), so neither makes an extra pass. TRL normalises
the loss over the batch's completion tokens as ours does with "dapo".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # examples.tools.calculator, on both sides

from bench.bench_rloo import cpu_description, peak_mb, train_timed, wait_for_quiet  # noqa: E402 (shared)
from examples.tools.calculator import Calculator, right_answer  # noqa: E402

PROMPTS_PER_ITERATION, K, LENGTH, TOOL_ROUNDS = 8, 4, 96, 2
TEMPERATURE, LEARNING_RATE, SEED = 0.7, 1e-5, 1
QUESTIONS = REPO / "examples" / "tools" / "data" / "train.jsonl"
TEMPLATE = REPO / "examples" / "tools" / "chat_template.jinja"  # set on both sides' tokenizer (the docstring)

EPISODES: list[dict] = []  # one entry per finished episode, appended by CountingCalculator.get_reward on both sides


class CountingCalculator(Calculator):
    """The example's calculator; its get_reward only records the episode's calls (and adds 0 to the reward)."""

    def get_reward(self) -> float:
        EPISODES.append({"calls": self.calls})
        return 0.0


def reward(prompts, completions, answer, **_) -> list[float]:
    """The example's right_answer, callable both ways: TRL passes every argument by keyword, our trainer's
    `reward_model=` callable gets (prompts, completions) by position and the row's columns by keyword."""
    return right_answer(completions, answer)


def rows(count: int) -> list[dict]:
    """The dataset, the same on both sides: the example's first `count` training questions."""
    lines = QUESTIONS.read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


def episode_summary(iterations_skipped: int) -> dict:
    timed = EPISODES[iterations_skipped * PROMPTS_PER_ITERATION * K:]
    return {"episodes_logged": len(timed),
            "tool_call_share": statistics.mean(e["calls"] > 0 for e in timed),
            "calls_per_episode": statistics.mean(e["calls"] for e in timed)}


# ------------------------------------------------------------------------------------------------ workers
def worker_ours(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training_wizard import GRPOConfig, GRPOTrainer
    from training_wizard.tracking.metrics import read_metrics

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    iterations = args.warmup + args.iterations
    batch = PROMPTS_PER_ITERATION * K
    config = GRPOConfig(
        output_dir=args.out, per_device_train_batch_size=batch, num_generations=K, num_mini_batches=1,
        num_ppo_epochs=1, total_episodes=batch * iterations, response_length=LENGTH,
        max_tool_calling_iterations=TOOL_ROUNDS, temperature=TEMPERATURE, learning_rate=LEARNING_RATE, kl_coef=0.0,
        seed=SEED, num_sample_generations=0, gradient_checkpointing=False, max_grad_norm=1.0)
    trainer = GRPOTrainer(config=config, tokenizer=tokenizer, policy=model, reward_model=reward,
                          train_dataset=rows(PROMPTS_PER_ITERATION * iterations), environment_factory=CountingCalculator)
    seconds = train_timed(trainer)[args.warmup:]
    metrics = read_metrics(args.out)
    timed_metrics = metrics[args.warmup:]

    def mean_of(key):
        values = [m[key] for m in timed_metrics if key in m]
        return statistics.mean(values) if values else None

    return {
        "seconds": seconds, "episodes": batch * len(seconds), "peak_mb": peak_mb(),
        "generation_s": mean_of("time/generation"), "update_s": mean_of("time/update"),
        "completion_length": mean_of("completions/mean_length"),
        "reported_call_frequency": mean_of("tools/call_frequency"),
        "replies_per_episode": mean_of("episodes/replies_mean"),
        "scores": [m.get("objective/scores") for m in metrics],
        **episode_summary(args.warmup),
    }


def worker_trl(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    tokenizer.response_template = qwen3_template  # TRL's parser for <tool_call> JSON in ChatML (see the docstring)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    iterations = args.warmup + args.iterations
    batch = PROMPTS_PER_ITERATION * K
    config = GRPOConfig(
        output_dir=args.out, per_device_train_batch_size=batch, num_generations=K, steps_per_generation=1,
        gradient_accumulation_steps=1, num_iterations=1, beta=0.0, max_completion_length=LENGTH,
        max_tool_calling_iterations=TOOL_ROUNDS, temperature=TEMPERATURE, top_p=1.0, top_k=0,
        learning_rate=LEARNING_RATE, max_grad_norm=1.0, max_steps=iterations, use_vllm=False, use_cpu=True,
        bf16=False, fp16=False, gradient_checkpointing=False, logging_steps=1, save_strategy="no", report_to="none",
        seed=SEED, disable_tqdm=True, log_level="error", dataloader_num_workers=0, log_completions=False,
    )
    ends, logs, generation = [], [], []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

        def on_log(self, _args, _state, _control, logs=None, **__):
            logs_seen.append(dict(logs or {}))

    logs_seen = logs
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                          train_dataset=Dataset.from_list(rows(PROMPTS_PER_ITERATION * iterations)), processing_class=tokenizer,
                          environment_factory=CountingCalculator, callbacks=[Clock()])
    assert trainer.chat_template is None, "TRL replaced the template: the two sides would not see the same tokens"
    generate_and_score = trainer._generate_and_score_completions

    def timed_generation(*a, **k):
        begun = time.perf_counter()
        out = generate_and_score(*a, **k)
        generation.append(time.perf_counter() - begun)
        return out

    trainer._generate_and_score_completions = timed_generation
    started = time.perf_counter()
    trainer.train()
    marks = [started, *ends]
    seconds = [b - a for a, b in zip(marks, marks[1:])][args.warmup:]
    steps = [entry for entry in logs if "reward" in entry]
    timed_steps = steps[args.warmup:]

    def mean_of(key):
        values = [e[key] for e in timed_steps if key in e]
        return statistics.mean(values) if values else None

    return {
        "seconds": seconds, "episodes": batch * len(seconds), "peak_mb": peak_mb(),
        "generation_s": statistics.mean(generation[args.warmup:]),
        "update_s": statistics.mean(s - g for s, g in zip(seconds, generation[args.warmup:])),
        "completion_length": mean_of("completions/mean_length"),
        "reported_call_frequency": mean_of("tools/call_frequency"),
        "replies_per_episode": None,
        "scores": [e["reward"] for e in steps],
        **episode_summary(args.warmup),
    }


# ------------------------------------------------------------------------------------------------ driver
def report(runs: list[dict]) -> None:
    print(f"\n## {PROMPTS_PER_ITERATION} prompts x {K} episodes per iteration, {LENGTH} tokens per episode, "
          f"at most {TOOL_ROUNDS} tool rounds")
    print("| run | side | episodes/s | s/iteration | generation s | update s | tool-call share | calls/episode | "
          "model tokens/episode | peak RSS MB | mean reward per iteration |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for index, run in enumerate(runs):
        r = run["result"]
        rate = r["episodes"] / sum(r["seconds"])
        print(f"| {index} | {run['side']} | {rate:.3f} | {statistics.mean(r['seconds']):.1f} | "
              f"{r['generation_s']:.1f} | {r['update_s']:.1f} | {r['tool_call_share']:.2f} | "
              f"{r['calls_per_episode']:.2f} | {r['completion_length'] or float('nan'):.1f} | {r['peak_mb']:.0f} | "
              f"{[round(s, 3) for s in r['scores'] if s is not None]} |")
    for side in ("ours", "trl"):
        eps = [run["result"]["episodes"] / sum(run["result"]["seconds"]) for run in runs if run["side"] == side]
        if eps:
            print(f"{side}: episodes/s median {statistics.median(eps):.3f} (range {min(eps):.3f}-{max(eps):.3f})")
    pairs = [(runs[i]["result"], runs[i + 1]["result"]) for i in range(0, len(runs) - 1, 2)]
    ratios = [(o["episodes"] / sum(o["seconds"])) / (t["episodes"] / sum(t["seconds"])) for o, t in pairs]
    print(f"ours/TRL episodes/s per pair: {', '.join(f'{x:.2f}' for x in ratios)}")


def main() -> None:
    global PROMPTS_PER_ITERATION, K, LENGTH
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=PROMPTS_PER_ITERATION, help="prompts per iteration")
    parser.add_argument("--generations", type=int, default=K, help="episodes per prompt")
    parser.add_argument("--length", type=int, default=LENGTH, help="tokens per episode")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--trl-python", type=Path, default=REPO / ".venv-trl-bench" / "bin" / "python")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", choices=["ours", "trl"])
    parser.add_argument("--model", default=str(REPO / "runs" / "tools" / "sft" / "model"),
                        help="the model folder both sides load (default: examples/tools/sft.toml's)")
    parser.add_argument("--out")
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()
    PROMPTS_PER_ITERATION, K, LENGTH = args.prompts, args.generations, args.length
    if args.worker:
        result = (worker_ours if args.worker == "ours" else worker_trl)(args)
        args.result.write_text(json.dumps(result))
        return

    started = time.perf_counter()
    if not args.trl_python.exists():
        sys.exit(f"{args.trl_python} is missing: run scripts/setup_trl_bench.sh first")
    folder = Path(args.model)
    if not (folder / "config.json").exists():
        sys.exit(f"{folder} is not a model folder: run `training-wizard examples/tools/sft.toml` first")
    versions = subprocess.run([str(args.trl_python), "-c", "import trl, transformers, torch; "
                               "print(trl.__version__, transformers.__version__, torch.__version__)"],
                              capture_output=True, text=True, check=True).stdout.split()
    print(f"CPU: {cpu_description()}, {os.cpu_count()} cores; {args.threads} torch threads; model {folder}; "
          f"TRL side: trl {versions[0]}, transformers {versions[1]}, torch {versions[2]}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(args.pairs):
            for side in ("ours", "trl"):
                out = Path(scratch) / f"{pair}-{side}"
                python = str(args.trl_python) if side == "trl" else sys.executable
                command = [python, __file__, "--worker", side, "--model", str(folder),
                           "--out", str(out), "--result", f"{out}.json", "--warmup", str(args.warmup),
                           "--iterations", str(args.iterations), "--threads", str(args.threads),
                           "--prompts", str(args.prompts), "--generations", str(args.generations),
                           "--length", str(args.length)]
                waited = wait_for_quiet()
                load_before = os.getloadavg()[0]
                began = time.perf_counter()
                done = subprocess.run(command, env={**env, **({"PYTHONPATH": str(REPO)} if side == "ours" else {})},
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"{side} run {pair} failed (exit {done.returncode}):\n{done.stderr[-6000:]}", flush=True)
                    runs.append({"side": side, "error": done.stderr[-6000:]})
                    continue
                result = json.loads(Path(f"{out}.json").read_text())
                result["waited_s"], result["load"] = waited, [load_before, os.getloadavg()[0]]
                runs.append({"side": side, "result": result})
                print(f"pair {pair} {side}: {result['episodes'] / sum(result['seconds']):.3f} episodes/s, "
                      f"tool-call share {result['tool_call_share']:.2f} ({time.perf_counter() - began:.0f} s in all; "
                      f"waited {waited:.0f} s for a quiet machine; 1-min load average {load_before:.2f} before, "
                      f"{os.getloadavg()[0]:.2f} after)", flush=True)
    finished = [run for run in runs if "result" in run]
    if len(finished) == len(runs):
        report(runs)
    else:
        if finished:
            print("\nonly some runs finished; their figures:")
            for run in finished:
                r = run["result"]
                print(f"{run['side']}: {r['episodes'] / sum(r['seconds']):.3f} episodes/s, "
                      f"tool-call share {r['tool_call_share']:.2f}")
    print(f"\nbench time: {(time.perf_counter() - started) / 60:.1f} min")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "cpu": cpu_description(), "trl": versions,
                                         "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
