"""Tool episodes with and without `[environment] keep_kv_cache`: the seconds the decode loop takes to play the
same batch of examples/tools episodes both ways, side by side in one process (alternating which goes first), and
whether both ways sampled the same tokens.

    training-wizard examples/tools/sft.toml      # once: the model (SmolLM2-135M-Instruct after the SFT stage)
    OMP_NUM_THREADS=1 .venv/bin/python bench/episode_kv_cache.py [--rounds 4] [--prompts 8] [--generations 4]
        [--length 96] [--chunk 32] [--model runs/tools/sft/model] [--json results.json]

What it measures: the wall and CPU seconds (the process's, which a machine shared with other jobs disturbs less)
of `EpisodePlayer.play` (every turn's sampling, the tool calls and the splicing;
no scoring, no update: the kept cache changes only the sampling) for `--prompts` x `--generations` episodes of the
example's calculator, with its chat template and its questions, at most 2 tool rounds per episode, `--length`
tokens per episode, temperature 0.7, `--chunk` rows per decode-loop chunk (local_rollout_forward_batch_size). Each
round plays the same episodes (the same sampling keys) both ways; the report gives each round's seconds, the ratio
re-encoding / kept per round and its median, the tokens both ways sampled (the same, row for row, or a count of the
rows that differ) and the largest difference of their sampling logprobs, and the episodes' shape (replies per
episode, tokens per episode, the share that called the tool).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # examples.tools.calculator

from bench.bench_rloo import cpu_description  # noqa: E402 (shared)
from examples.tools.calculator import Calculator  # noqa: E402

QUESTIONS = REPO / "examples" / "tools" / "data" / "train.jsonl"
TEMPLATE = REPO / "examples" / "tools" / "chat_template.jinja"
TEMPERATURE, TOOL_ROUNDS = 0.7, 2


def player_and_prompts(args, model, tokenizer, keep: bool):
    from training_wizard.rollout.backends import DecodeLoopBackend
    from training_wizard.rollout.collector import SamplingSettings
    from training_wizard.rollout.episodes import EpisodePlayer
    from training_wizard.rollout.generation import default_stop_token_ids
    from training_wizard.rollout.prompts import EncodedPrompts
    from training_wizard.specs.episode import EpisodeSettings

    sampling = SamplingSettings(args.length, TEMPERATURE, default_stop_token_ids(tokenizer, model),
                                tokenizer.pad_token_id, args.chunk)
    settings = EpisodeSettings(protocol="tools", max_tool_calling_iterations=TOOL_ROUNDS, keep_kv_cache=keep)
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()[: args.prompts]]
    player = EpisodePlayer(tokenizer, DecodeLoopBackend(args.chunk), sampling, Calculator, settings)
    return player, EncodedPrompts.from_rows(rows, tokenizer)


def play(args, model, tokenizer, keep: bool, round_index: int):
    import torch

    player, prompts = player_and_prompts(args, model, tokenizer, keep)
    rows = [row for row in range(args.prompts) for _ in range(args.generations)]
    seeds = [1000 * round_index + index for index in range(len(rows))]
    started, cpu_started = time.perf_counter(), time.process_time()
    episodes = player.play(model, prompts, rows, seeds, torch.device("cpu"))
    return (time.perf_counter() - started, time.process_time() - cpu_started), episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "runs" / "tools" / "sft" / "model"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    small = argparse.Namespace(**{**vars(args), "prompts": 1, "generations": 2})
    for keep in (False, True):  # warm-up: first calls allocate and load kernels
        play(small, model, tokenizer, keep, -1)
    rounds = []
    for index in range(args.rounds):
        order = (False, True) if index % 2 == 0 else (True, False)
        results = {keep: play(args, model, tokenizer, keep, index) for keep in order}
        ((again_s, again_cpu), again), ((kept_s, kept_cpu), kept) = results[False], results[True]
        differing = sum(one.ids != other.ids for one, other in zip(again, kept))
        logprob_gap = max((abs(a - b) for one, other in zip(again, kept) if one.ids == other.ids
                           for a, b in zip(one.logprobs, other.logprobs)), default=0.0)
        rounds.append({
            "re_encoding_s": again_s, "kept_s": kept_s, "ratio": again_s / kept_s, "re_encoding_cpu_s": again_cpu,
            "kept_cpu_s": kept_cpu, "cpu_ratio": again_cpu / kept_cpu, "first": "kept" if order[0] else "re-encoding", "rows_differing": differing, "max_logprob_difference": logprob_gap,
            "replies_per_episode": statistics.mean(len(e.replies) for e in again),
            "tokens_per_episode": statistics.mean(len(e.prompt_ids) + len(e.ids) for e in again),
            "tool_call_share": statistics.mean(e.counts["calls"] > 0 for e in again),
        })
        print(json.dumps(rounds[-1]), flush=True)
    report = {"cpu": cpu_description(), "threads": threads, "date": time.strftime("%Y-%m-%d"), "args": vars(args),
              "rounds": rounds, "median_ratio": statistics.median(r["ratio"] for r in rounds),
              "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds)}
    print(f"re-encoding / kept cache, median of {args.rounds} rounds: {report['median_ratio']:.2f}x wall, "
          f"{report['median_cpu_ratio']:.2f}x CPU seconds")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
