"""GRPO at real lengths: training-wizard's GRPOTrainer against TRL 1.16's GRPOTrainer on SmolLM2-135M-Instruct (its
49,152-token vocabulary), every completion's length fixed by a recorded distribution of 20 to 512 tokens, the same on
both sides, in alternating fresh processes (TRL, ours, TRL, ours, ...).

    scripts/setup_trl_bench.sh          # once: .venv-trl-bench, trl 1.16.0 with our torch/transformers pins
    OMP_NUM_THREADS=2 .venv/bin/python bench/long_completions.py [--pairs 2] [--warmup 1] [--iterations 2]
        [--prompts 4] [--generations 4] [--max-length 512] [--gradient-checkpointing on|off]
        [--ours-option padding_free=true ...] [--json results.json] [--report results.json]
    python3 bench/long_completions.py --device cuda --model FOLDER --random-weights --trl-python python3 ...

On a CUDA device (`--device cuda`) both sides keep float32 weights under bfloat16 autocast (TRL: bf16=True, its
default on a GPU; ours: bf16 = true), and the peak memory is `torch.cuda.max_memory_allocated` besides the resident
set. `--model FOLDER` replaces the offline SmolLM2 folder; `--random-weights` gives both sides random weights of
its shape (seed 0) with its tokenizer: the lengths are forced, so what trained weights would change is only the
tokens' text.

What it measures, per run (one fresh process each, after waiting for a quiet machine): seconds per iteration (one
generation + one optimizer step, after `--warmup` untimed iterations), completion tokens per second (the realised
completion tokens of the timed iterations over their seconds), the split into generation and update, the CPU
seconds of the process's threads per iteration (`time.process_time`: on a shared machine they move far less than
wall seconds), and the peak resident memory of the process; per pair, ours/TRL iterations per second (by wall and by
CPU seconds) and peak memory ours/TRL.

Time: on a quiet 2-core CPU, 2 threads, one pair at the full lengths took about 15 minutes (TRL about 10, ours about
6: BENCHMARKS.md), so the defaults (2 pairs, 1 warm-up + 2 timed iterations) run for about half an hour;
`--pairs 1` is the short form, and `--max-length 128 --warmup 0 --iterations 1` a check that everything runs.

The lengths. `LENGTHS[p][g]` is the length, end-of-turn token included, of generation g of prompt p: 8 prompts x 8
generations drawn once by `draw_lengths(LENGTHS_SEED)` (log-normal with median 110 tokens and sigma 0.85, rounded and
clipped to 20..512: many short completions and a long tail, a few cut at the limit, as GRPO reasoning runs give).
`LENGTHS_SEED` is the first seed from 0 whose default 4 x 4 block spans the range (shortest <= 40, longest 512), so the
default batch has what the issue asks for: lengths from about 20 to 512. A run uses the block [:prompts][:generations];
`--max-length N` scales every length by N / 512 (for quick checks). Every iteration samples each prompt once (the
dataset is exactly `--prompts` prompts), so every iteration realises the same lengths on both sides.

How the lengths are imposed (`ForcedLengths`): a forward hook on the policy (the `*ForCausalLM` module), switched on
only while the side generates (around our decode loop's `DecodeLoopBackend.sample`; around `model.generate`, which
TRL's GRPOTrainer calls through `unwrap_model_for_generation`), edits the logits of the last position: before a
row's length it sets the end-of-turn and pad tokens to -inf, at its length it leaves only end-of-turn. Both samplers
then stop the row there, each by its own rule, so nothing of either loop is switched off: our decode loop still
drops stopped rows and stops when all have, transformers' `generate` still runs to its longest row, and each side's
update sees the batch it would build for those lengths. A row is recognised by its prompt (which of `PROMPTS` the
prefill's tokens decode to, then its attention mask's length, which differs for every prompt) and by its rank among
the rows of that prompt in the batch (TRL orders rows prompt by prompt, ours generation by generation; both keep
the order). The hook costs a few tensor indexings per decode step on both sides. The realised lengths are read
back from each side's own completion mask (ours: the sampled rollout's `completion_mask`; TRL: the
`completion_mask` of `_generate_and_score_completions`) and compared with the recorded ones per iteration.

Equal settings (one iteration = one generation + one optimizer step on both sides):
  4 prompts x 4 generations = 16 completions      TRL: per_device_train_batch_size=16, num_generations=4,
                                                    steps_per_generation=1, gradient_accumulation_steps=1
                                                  ours: per_device_train_batch_size=16, num_generations=4,
                                                    num_mini_batches=1, local_rollout_forward_batch_size=16
  one epoch over each batch, no KL (beta 0)       TRL: num_iterations=1, beta=0.0; ours: num_ppo_epochs=1, kl_coef=0
  loss "dapo", rewards scaled by the group std    both, explicitly; clip epsilon 0.2 (both defaults)
  max new tokens = the longest recorded length    TRL: max_completion_length; ours: response_length
  temperature 1.0, top_p 1, top_k off             both
  learning rate 1e-6, AdamW, grad clip 1.0, fp32  TRL: use_cpu=True, bf16=False (no autocast); full fine-tuning
  gradient checkpointing on (TRL's default)       `--gradient-checkpointing`, the same on both sides
  conversational prompts, the model's template    both render them with SmolLM2's chat template
  reward: share of 'e' characters                 a plain Python function on both sides
  OMP_NUM_THREADS and torch.set_num_threads       `--threads` (default $OMP_NUM_THREADS or 2), both sides
Neither side makes a separate old-logprob pass (one epoch of one mini-batch: the update's own logprobs, detached).
Ours runs with its defaults plus `--ours-option key=value` (repeatable, our GRPOConfig's [training] keys).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench.bench_rloo, on both sides (it imports only the standard library at the top)

from bench.bench_rloo import (  # noqa: E402 (shared helpers)
    _option_value, cpu_description, matmul_rate, peak_mb, random_weight_copy, wait_for_quiet,
)

PROMPTS = [  # user messages of different token lengths (the hook tells rows apart by their prompt's length)
    "What is 17 times 23? Think step by step.",
    "A train leaves at 9:40 and arrives at 13:05. How long is the trip? Explain your reasoning.",
    "Is 221 a prime number? Show how you check it, then give a one-word answer at the end.",
    "A shop sells pens at 3 for 2 dollars. How much do 27 pens cost, and how many pens can you buy for 15 dollars? "
    "Reason carefully before answering.",
    "Sort these numbers from smallest to largest and explain each comparison: 0.5, 1/3, 0.45, 2/5.",
    "Sam is twice as old as Kim was when Sam was as old as Kim is now. Kim is 30. How old is Sam? Work it out step "
    "by step, checking each equation, and state the answer on its own line.",
    "How many minutes are there in a week?",
    "Find the sum of all two-digit numbers divisible by 7. Explain the method.",
]
LENGTH_LIMIT, LENGTHS_SEED = 512, 2
LENGTHS = [  # draw_lengths(LENGTHS_SEED): LENGTHS[prompt][generation], end-of-turn token included
    [512, 157, 163, 127, 93, 463, 99, 102],
    [22, 120, 82, 150, 512, 404, 98, 91],
    [111, 20, 324, 380, 208, 60, 156, 248],
    [262, 111, 188, 78, 143, 134, 512, 229],
    [161, 149, 33, 218, 74, 38, 25, 189],
    [25, 92, 39, 211, 47, 32, 489, 512],
    [105, 155, 38, 206, 135, 113, 272, 144],
    [22, 228, 54, 45, 272, 166, 87, 95],
]
LEARNING_RATE, SEED = 1e-6, 1


def draw_lengths(seed: int, prompts: int = 8, generations: int = 8) -> list[list[int]]:
    """The recorded table: log-normal lengths (median 110 tokens, sigma 0.85) rounded and clipped to 20..512."""
    draw = random.Random(seed)
    return [[min(LENGTH_LIMIT, max(20, round(draw.lognormvariate(math.log(110), 0.85)))) for _ in range(generations)]
            for _ in range(prompts)]


def first_spanning_seed(prompts: int = 4, generations: int = 4) -> int:
    """The first seed whose [:prompts][:generations] block has a length <= 40 and one at the limit."""
    seed = 0
    while True:
        block = [n for row in draw_lengths(seed)[:prompts] for n in row[:generations]]
        if min(block) <= 40 and max(block) == LENGTH_LIMIT:
            return seed
        seed += 1


def lengths_for(prompts: int, generations: int, max_length: int) -> list[list[int]]:
    """The block a run uses, each length scaled by max_length / 512 (at least 2: one token, then end-of-turn)."""
    if prompts > len(LENGTHS) or generations > len(LENGTHS[0]):
        sys.exit(f"--prompts and --generations: at most {len(LENGTHS)} and {len(LENGTHS[0])} (the recorded table)")
    return [[max(2, round(n * max_length / LENGTH_LIMIT)) for n in row[:generations]] for row in LENGTHS[:prompts]]


def reward(prompts, completions, **_) -> list[float]:
    """Share of 'e' characters of the reply: cheap and the same on both sides (TRL passes conversational
    completions as message lists, ours as text)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch == "e" for ch in text) / max(1, len(text)) for text in texts]


def dataset_rows(prompts: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": text}]} for text in PROMPTS[:prompts]]


# ------------------------------------------------------------------------------------------------ the lengths
class ForcedLengths:
    """Makes generation g of prompt p end at `lengths[p][g]` tokens (end-of-turn included): a forward hook on the
    causal LM, active only inside `generating()`. See the module docstring for why it costs both sides the same."""

    def __init__(self, model, tokenizer, lengths: list[list[int]], stop_token_id: int, banned_ids: list[int]):
        self.tokenizer, self.lengths, self.stop_token_id = tokenizer, lengths, stop_token_id
        self.banned_ids = sorted(set(banned_ids) | {stop_token_id})
        self.active = False
        self.targets_per_generation: list[list[int]] = []  # what each generation call was made to produce, by row
        model.register_forward_hook(self._hook, with_kwargs=True)

    @contextlib.contextmanager
    def generating(self):
        if self.active:
            raise RuntimeError("nested generation calls: the hook counts one prefill per call")
        self.active, self.step, self.prompt_of_length, self.targets, self.alive = True, 0, {}, None, None
        try:
            yield
        finally:
            self.active = False
            if self.targets is not None:
                self.targets_per_generation.append(self.targets)

    def _hook(self, module, args, kwargs, output):
        if not self.active:
            return None
        import torch

        mask = kwargs["attention_mask"]
        last = output.logits[:, -1, :]  # the logits that draw token `self.step` of every row in this pass
        if self.step == 0:
            self._learn_prompts(kwargs["input_ids"], mask)
            last[:, self.banned_ids] = float("-inf")  # every length is at least 2
        else:
            if self.targets is None:
                self._assign_targets(mask)
            elif mask.shape[0] < len(self.alive):  # ours dropped the rows that had stopped, keeping the order
                self.alive = [row for row in self.alive if self.targets[row] > self.step]
            if len(self.alive) != mask.shape[0]:
                raise RuntimeError(f"step {self.step}: {mask.shape[0]} rows in the pass, {len(self.alive)} expected")
            targets = torch.tensor([self.targets[row] for row in self.alive], device=last.device)
            early = (targets - 1 > self.step).nonzero().squeeze(1)
            ending = (targets - 1 == self.step).nonzero().squeeze(1)
            last[early.unsqueeze(1), torch.tensor(self.banned_ids, device=last.device)] = float("-inf")
            last[ending] = float("-inf")
            last[ending, self.stop_token_id] = 0.0
        self.step += 1
        return output

    def _learn_prompts(self, input_ids, mask) -> None:
        """Which prompt each prefill row holds, by its text, and so which prompt each prompt length means."""
        if input_ids.shape[1] == 1:
            raise RuntimeError("the first pass of a generation call is not a prefill")
        for ids, row_mask in zip(input_ids, mask):
            text = self.tokenizer.decode(ids[row_mask.bool()])
            found = [index for index, prompt in enumerate(PROMPTS) if prompt in text]
            if len(found) != 1:
                raise RuntimeError(f"a prefill row matches {len(found)} prompts: {text!r}")
            length = int(row_mask.sum())
            if self.prompt_of_length.get(length, found[0]) != found[0]:
                raise RuntimeError(f"two prompts of {length} tokens: the rows cannot be told apart")
            self.prompt_of_length[length] = found[0]

    def _assign_targets(self, mask) -> None:
        """At the first decode pass, where every row of the batch is present: row -> its recorded length."""
        seen: dict[int, int] = {}
        self.targets = []
        for prompt_length in (mask.sum(-1) - self.step).tolist():
            prompt = self.prompt_of_length[int(prompt_length)]
            rank = seen.get(prompt, 0)
            seen[prompt] = rank + 1
            if rank >= len(self.lengths[prompt]):
                raise RuntimeError(f"prompt {prompt} has more than {len(self.lengths[prompt])} rows in one batch")
            self.targets.append(self.lengths[prompt][rank])
        self.alive = list(range(len(self.targets)))


def check_lengths(recorded: list[list[int]], realised: list[list[int]], forced: list[list[int]],
                  warmup: int) -> dict:
    """Per iteration: the realised lengths (the side's own completion mask) against the recorded multiset and
    against what the hook forced, row by row."""
    expected = sorted(n for row in recorded for n in row)
    return {
        "realised_sorted": [sorted(lengths) for lengths in realised],
        "equal_to_recorded": all(sorted(lengths) == expected for lengths in realised),
        "equal_to_forced_row_by_row": realised == forced,
        "completion_tokens_timed": sum(sum(lengths) for lengths in realised[warmup:]),
        "iterations_seen": len(realised),
    }


# ------------------------------------------------------------------------------------------------ workers
def gpu_peak() -> dict:
    """{"peak_gpu_mb": the CUDA allocator's peak in MiB} on a CUDA device, else {}."""
    import torch

    return {"peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20} if torch.cuda.is_available() else {}


def train_timed(trainer) -> tuple[list[float], list[float]]:
    """Train; (wall seconds, CPU seconds of this process's threads) of each iteration, each from the end of the one
    before (the first from the start of train()). CPU seconds tell more than wall seconds on a shared machine."""
    ends = []
    iteration = trainer._iteration

    def timed(*args, **kwargs):
        iteration(*args, **kwargs)
        ends.append((time.perf_counter(), time.process_time()))

    trainer._iteration = timed
    marks = [(time.perf_counter(), time.process_time())]
    trainer.train()
    marks += ends
    return ([b[0] - a[0] for a, b in zip(marks, marks[1:])], [b[1] - a[1] for a, b in zip(marks, marks[1:])])


def worker_ours(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from training_wizard import GRPOConfig, GRPOTrainer
    from training_wizard.rollout.backends import DecodeLoopBackend
    from training_wizard.rollout.collector import RolloutCollector
    from training_wizard.specs.model import TransformerSpec
    from training_wizard.tracking.metrics import read_metrics

    lengths = lengths_for(args.prompts, args.generations, args.max_length)
    spec = TransformerSpec(pretrained_name=args.model)
    tokenizer = spec.load_tokenizer()
    policy = spec.load_causal_lm("float32")
    forced = ForcedLengths(policy, tokenizer, lengths, tokenizer.eos_token_id, [tokenizer.pad_token_id])
    realised: list[list[int]] = []
    prompt_tokens: list[float] = []
    sample_rows, collect_sample = DecodeLoopBackend.sample, RolloutCollector.sample

    def sample_forced(self, *a, **k):
        with forced.generating():
            return sample_rows(self, *a, **k)

    def sample_recorded(self, *a, **k):
        sampled = collect_sample(self, *a, **k)
        realised.append(sampled.completion_mask.sum(-1).tolist())
        prompt_tokens.append(sampled.prompt_mask.sum(-1).float().mean().item())
        return sampled

    DecodeLoopBackend.sample, RolloutCollector.sample = sample_forced, sample_recorded
    batch, iterations = args.prompts * args.generations, args.warmup + args.iterations
    options = dict(bf16=args.device == "cuda",
        output_dir=args.out, per_device_train_batch_size=batch, num_generations=args.generations, num_mini_batches=1,
        num_ppo_epochs=1, total_episodes=batch * iterations, response_length=max(map(max, lengths)),
        local_rollout_forward_batch_size=batch, temperature=1.0, top_p=1.0, top_k=0, learning_rate=LEARNING_RATE,
        kl_coef=0.0, loss_type="dapo", scale_rewards="group", seed=SEED, num_sample_generations=0,
        gradient_checkpointing=args.gradient_checkpointing == "on", max_grad_norm=1.0)
    for item in args.ours_option:
        key, _, value = item.partition("=")
        options[key] = _option_value(value)
    trainer = GRPOTrainer(config=GRPOConfig(**options), tokenizer=tokenizer, policy=policy, reward_model=reward,
                          train_dataset=dataset_rows(args.prompts))
    seconds, cpu_seconds = (values[args.warmup:] for values in train_timed(trainer))
    timed_metrics = read_metrics(args.out)[args.warmup:]
    return {
        "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mb": peak_mb(), "options": options, **gpu_peak(),
        "generation_s": statistics.mean(m["time/generation"] for m in timed_metrics),
        "update_s": statistics.mean(m["time/update"] for m in timed_metrics),
        "prompt_tokens": statistics.mean(prompt_tokens),
        **check_lengths(lengths, realised, forced.targets_per_generation, args.warmup),
    }


def worker_trl(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    lengths = lengths_for(args.prompts, args.generations, args.max_length)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    forced = ForcedLengths(model, tokenizer, lengths, tokenizer.eos_token_id, [tokenizer.pad_token_id])
    generate = model.generate

    def generate_forced(*a, **k):
        with forced.generating():
            return generate(*a, **k)

    model.generate = generate_forced  # TRL calls the unwrapped model's generate: this very object on one CPU process
    batch, iterations = args.prompts * args.generations, args.warmup + args.iterations
    config = GRPOConfig(
        output_dir=args.out, per_device_train_batch_size=batch, num_generations=args.generations,
        steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1, beta=0.0, loss_type="dapo",
        scale_rewards="group", max_completion_length=max(map(max, lengths)), temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LEARNING_RATE, max_grad_norm=1.0, max_steps=iterations, use_vllm=False,
        use_cpu=args.device == "cpu", bf16=args.device == "cuda", fp16=False,
        gradient_checkpointing=args.gradient_checkpointing == "on", logging_steps=1,
        save_strategy="no", report_to="none", seed=SEED, disable_tqdm=True, log_level="error",
        dataloader_num_workers=0, log_completions=False,
    )
    ends, generation, realised, prompt_tokens = [], [], [], []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append((time.perf_counter(), time.process_time()))

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                          train_dataset=Dataset.from_list(dataset_rows(args.prompts)), processing_class=tokenizer,
                          callbacks=[Clock()])
    generate_and_score = trainer._generate_and_score_completions

    def timed_generation(*a, **k):
        begun = time.perf_counter()
        out = generate_and_score(*a, **k)
        generation.append(time.perf_counter() - begun)
        realised.append(out["completion_mask"].sum(-1).tolist())
        prompt_tokens.append(out["prompt_mask"].sum(-1).float().mean().item())
        return out

    trainer._generate_and_score_completions = timed_generation
    marks = [(time.perf_counter(), time.process_time())]
    trainer.train()
    marks += ends
    seconds = [b[0] - a[0] for a, b in zip(marks, marks[1:])][args.warmup:]
    return {
        "seconds": seconds, "cpu_seconds": [b[1] - a[1] for a, b in zip(marks, marks[1:])][args.warmup:],
        "peak_mb": peak_mb(), **gpu_peak(),
        "generation_s": statistics.mean(generation[args.warmup:]),
        "update_s": statistics.mean(s - g for s, g in zip(seconds, generation[args.warmup:])),
        "prompt_tokens": statistics.mean(prompt_tokens),
        **check_lengths(lengths, realised, forced.targets_per_generation, args.warmup),
    }


# ------------------------------------------------------------------------------------------------ driver
def per_second(result: dict) -> tuple[float, float]:
    """(iterations per second, completion tokens per second) over the timed iterations."""
    return len(result["seconds"]) / sum(result["seconds"]), result["completion_tokens_timed"] / sum(result["seconds"])


def report(saved: dict) -> None:
    runs, lengths = saved["runs"], saved["lengths"]
    flat = sorted(n for row in lengths for n in row)
    print(f"\n## {saved.get('device', 'CPU')}: GRPO, {len(lengths)} prompts x {len(lengths[0])} generations per iteration, recorded lengths "
          f"{flat} (mean {statistics.mean(flat):.1f}); ours with {saved['ours_options'] or 'its defaults'}; "
          f"gradient checkpointing {saved['gradient_checkpointing']} on both sides; {saved['threads']} threads")
    print("| run | side | s/iteration | iterations/s | completion tokens/s | generation s | update s | CPU s/iteration | "
          "peak RSS MB | peak GPU MiB | prompt tokens | lengths = recorded |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for index, run in enumerate(runs):
        r = run["result"]
        iterations, tokens = per_second(r)
        print(f"| {index} | {run['side']} | {statistics.mean(r['seconds']):.1f} | {iterations:.4f} | {tokens:.1f} | "
              f"{r['generation_s']:.1f} | {r['update_s']:.1f} | {statistics.mean(r.get('cpu_seconds') or [math.nan]):.1f} | "
              f"{r['peak_mb']:.0f} | {r.get('peak_gpu_mb', math.nan):.0f} | {r['prompt_tokens'] or 0:.1f} | "
              f"{'yes' if r['equal_to_recorded'] and r['equal_to_forced_row_by_row'] else 'NO'} "
              f"({r['iterations_seen']} iterations) |")
    pairs = [(runs[i]["result"], runs[i + 1]["result"]) for i in range(0, len(runs) - 1, 2)]
    speed = [per_second(o)[0] / per_second(t)[0] for t, o in pairs]
    cpu = [statistics.mean(t.get("cpu_seconds") or [math.nan]) / statistics.mean(o.get("cpu_seconds") or [math.nan])
           for t, o in pairs]
    peak = "peak_gpu_mb" if "peak_gpu_mb" in runs[0]["result"] else "peak_mb"  # the device's memory on a GPU
    memory = [o[peak] / t[peak] for t, o in pairs]
    print(f"ours/TRL iterations per second per pair: {', '.join(f'{x:.2f}' for x in speed)} (by CPU seconds: "
          f"{', '.join(f'{x:.2f}' for x in cpu)}); peak {'GPU' if peak == 'peak_gpu_mb' else 'resident'} memory ours/TRL: "
          f"{', '.join(f'{x:.2f}' for x in memory)}")
    for run in runs:
        if not (run["result"]["equal_to_recorded"] and run["result"]["equal_to_forced_row_by_row"]):
            print(f"{run['side']}: realised lengths {run['result']['realised_sorted']} differ from the recorded ones")


def run_side(side: str, args, folder: Path, out: Path, env: dict) -> dict:
    python = str(args.trl_python) if side == "trl" else sys.executable
    command = [python, __file__, "--worker", side, "--model", str(folder), "--out", str(out),
               "--result", f"{out}.json", "--warmup", str(args.warmup), "--iterations", str(args.iterations),
               "--threads", str(args.threads), "--prompts", str(args.prompts), "--generations", str(args.generations),
               "--max-length", str(args.max_length), "--gradient-checkpointing", args.gradient_checkpointing]
    command += [f"--ours-option={item}" for item in args.ours_option] if side == "ours" else []
    command += ["--device", args.device]
    paths = os.pathsep.join(filter(None, [str(REPO) if side == "ours" else "", env.get("PYTHONPATH", "")]))
    done = subprocess.run(command, env={**env, "PYTHONPATH": paths},
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{side} run failed (exit {done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads(Path(f"{out}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per iteration (and in the dataset)")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-length", type=int, default=LENGTH_LIMIT,
                        help="scale the recorded lengths by this / 512 (quick checks: 128)")
    parser.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on")
    parser.add_argument("--ours-option", action="append", default=[],
                        help="key=value for our GRPOConfig (repeatable), e.g. padding_free=true")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--trl-python", type=Path, default=REPO / ".venv-trl-bench" / "bin" / "python")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report", type=Path, help="print the report of a saved --json file again, and stop")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--random-weights", action="store_true", help="random weights of --model's shape, both sides")
    parser.add_argument("--worker", choices=["ours", "trl"])
    parser.add_argument("--model", help="the model's folder (default: SmolLM2-135M-Instruct, converted offline)")
    parser.add_argument("--out")
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    if args.worker:
        result = (worker_ours if args.worker == "ours" else worker_trl)(args)
        args.result.write_text(json.dumps(result))
        return

    started = time.perf_counter()
    if not args.trl_python.exists() and not shutil.which(str(args.trl_python)):
        sys.exit(f"{args.trl_python} is missing: run scripts/setup_trl_bench.sh first (or give --trl-python)")
    from training_wizard.specs.model import TransformerSpec

    folder = Path(args.model) if args.model else TransformerSpec(
        pretrained_name="HuggingFaceTB/SmolLM2-135M-Instruct").resolved_path()
    if args.random_weights:
        folder = random_weight_copy(folder, Path(tempfile.mkdtemp()) / "random")
    versions = subprocess.run([str(args.trl_python), "-c", "import trl, transformers, torch; "
                               "print(trl.__version__, transformers.__version__, torch.__version__)"],
                              capture_output=True, text=True, check=True).stdout.split()
    import torch

    device = (f"GPU: {torch.cuda.get_device_name()}, bfloat16 autocast" if args.device == "cuda" else
              f"CPU float32 matmul rate {matmul_rate(args.threads):.0f} GFLOP/s")
    print(f"CPU: {cpu_description()}, {os.cpu_count()} cores; {args.threads} torch threads; {device}; model "
          f"{folder}{' (random weights)' if args.random_weights else ''}; TRL side: trl {versions[0]}, transformers "
          f"{versions[1]}, torch {versions[2]}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(args.pairs):
            for side in ("trl", "ours"):
                waited = wait_for_quiet()
                load_before, began = os.getloadavg()[0], time.perf_counter()
                result = run_side(side, args, folder, Path(scratch) / f"{pair}-{side}", env)
                result["waited_s"], result["load"] = waited, [load_before, os.getloadavg()[0]]
                runs.append({"side": side, "result": result})
                print(f"pair {pair} {side}: {statistics.mean(result['seconds']):.1f} s/iteration, peak RSS "
                      f"{result['peak_mb']:.0f} MB, lengths as recorded: {result['equal_to_recorded']} "
                      f"({time.perf_counter() - began:.0f} s in all; waited {waited:.0f} s for a quiet machine; "
                      f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after)", flush=True)
    saved = {"threads": args.threads, "device": device, "cpu": cpu_description(), "trl": versions,
             "ours_options": args.ours_option,
             "gradient_checkpointing": args.gradient_checkpointing,
             "lengths": lengths_for(args.prompts, args.generations, args.max_length), "runs": runs}
    report(saved)
    print(f"\nbench time: {(time.perf_counter() - started) / 60:.1f} min")
    if args.json:
        args.json.write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
