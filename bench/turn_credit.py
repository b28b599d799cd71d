"""Does credit per turn learn faster? `turn_credit` on a hidden-rule text environment of three turns, at equal budget.

    OMP_NUM_THREADS=1 .venv/bin/python bench/turn_credit.py [--seeds 3] [--iterations 200] [--out results.json]
    OMP_NUM_THREADS=1 .venv/bin/python bench/turn_credit.py --quick      # a one-minute smoke: 1 seed, 4 iterations

The environment (`HiddenRule`, the text protocol of docs/environments.md): at each of 3 turns it names one of
three error words (the row's `errors` column, e.g. "2,0,1": every sequence of three appears among the rows). A
reply fixes the error when its first character, after leading spaces, is in the error's hidden class: characters
whose code point is congruent to the error's index modulo 3 (`fixes`). A fix earns +1 that turn and the next
error is named; a wrong reply earns 0 and ends the episode, so an episode's total return is the number of turns
fixed in a row (0 to 3), and a later turn is only reached by fixing the earlier ones. The rule is the same at every
turn and the model never sees it: it must learn which tokens fix which error word. Each reply is one token (every
token id is a stop token), so a random model fixes a turn about a third of the time.

Model: a random Qwen2 (hidden 64, 2 layers) on training_wizard.testing's byte-level BPE tokenizer (320 tokens),
full fine-tuning, float32, the built-in keyed decode loop.

Runs, each in a fresh process, interleaved by seed (for each seed: GRPO episode, GRPO turn_baseline, PPO episode,
PPO gae), all at the same budget: `--iterations` iterations of 16 episodes (GRPO: 4 prompts x 4 generations; PPO:
16 prompts, a value model started from the policy's weights), learning rate 3e-3 (AdamW, linear decay to 0), 2
epochs over each batch, one mini-batch, temperature 1, no KL (kl_coef 0), turn_gamma 1, PPO's gamma 1 and lam 0.95 at
their defaults. The seed sets the model's initial weights and the run's sampling seed. A worker's own output is
shown only when it fails.

Per run, from each iteration's rollout (its `turn_rewards`, read where the trainer shapes them): the mean reward at
each turn over the last quarter of the iterations (a turn not reached counts 0, so the three sum to the mean total
return), the mean total return over that quarter, the first iteration at which the mean total return over a
window of 5 iterations reaches `--threshold` (1.5 of 3 by default; none if never), and the run's seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ERRORS = ("amber", "cobalt", "violet")  # error k is fixed by a reply whose first character's code point is k mod 3
TURNS, BATCH, GROUP, WINDOW = 3, 16, 4, 5
RESPONSE_LENGTH = 96  # the whole episode: three one-token replies and two namings of about 30 tokens each
RUNS = (("grpo", "episode"), ("grpo", "turn_baseline"), ("ppo", "episode"), ("ppo", "gae"))


def fixes(error: int, reply: str) -> bool:
    """Whether `reply` fixes error `error`: its first character after leading spaces is in the error's class."""
    text = reply.lstrip()
    return bool(text) and ord(text[0]) % len(ERRORS) == error


class HiddenRule:
    """Three turns; each names an error word and pays +1 for a reply that fixes it; a wrong reply ends the episode."""

    def reset(self, prompt=None, **row):
        self.errors = [int(index) for index in row["errors"].split(",")]
        self.turn = 0
        return self.naming()

    def naming(self) -> str:
        return f"Error: {ERRORS[self.errors[self.turn]]}."

    def step(self, reply: str):
        if not fixes(self.errors[self.turn], reply):
            return None, 0.0, True
        self.turn += 1
        if self.turn == TURNS:
            return None, 1.0, True
        return self.naming(), 1.0, False


def rows() -> list[dict]:
    """Every sequence of three errors, once."""
    sequences = itertools.product(range(len(ERRORS)), repeat=TURNS)
    return [{"prompt": [{"role": "user", "content": "Fix each error I name."}], "errors": ",".join(map(str, sequence))}
            for sequence in sequences]


def worker(algorithm: str, mode: str, seed: int, iterations: int, output_dir: Path) -> dict:
    """One training run; returns the mean reward per turn of every iteration and the run's seconds."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from training_wizard import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer
    from training_wizard.specs.episode import EpisodeSettings
    from training_wizard.testing import build_causal_lm, build_tokenizer

    tokenizer = build_tokenizer()
    policy = build_causal_lm(tokenizer, arch="qwen2", hidden_size=64, num_layers=2, seed=seed)
    options = dict(output_dir=str(output_dir), per_device_train_batch_size=BATCH, total_episodes=BATCH * iterations,
                   response_length=RESPONSE_LENGTH, stop_token_ids=list(range(len(tokenizer))), max_turns=TURNS,
                   learning_rate=3e-3, temperature=1.0, kl_coef=0.0, num_ppo_epochs=2, num_sample_generations=0,
                   seed=seed, turn_credit=mode)
    trainer_class, config = ((GRPOTrainer, GRPOConfig(num_generations=GROUP, **options)) if algorithm == "grpo"
                             else (PPOTrainer, PPOConfig(**options)))
    trainer = trainer_class(config=config, tokenizer=tokenizer, policy=policy, reward_model=None,
                            train_dataset=rows(), environment_factory=HiddenRule,
                            episode_settings=EpisodeSettings(protocol="text"))
    per_turn: list[list[float]] = []
    shape = trainer.shape_rewards

    def recording(rollout):
        rewards = rollout.turn_rewards[:, :TURNS].float()
        per_turn.append([float(value) for value in rewards.mean(0)] + [0.0] * (TURNS - rewards.shape[1]))
        return shape(rollout)

    trainer.shape_rewards = recording
    started = time.perf_counter()
    trainer.train()
    return {"algorithm": algorithm, "mode": mode, "seed": seed, "seconds": time.perf_counter() - started,
            "per_turn": per_turn}


def summary(run: dict, threshold: float) -> dict:
    """The run's figures: reward per turn and total return over the last quarter, iterations to the threshold."""
    per_turn = run["per_turn"]
    last = per_turn[-max(1, len(per_turn) // 4):]
    totals = [sum(turns) for turns in per_turn]
    reached = next((end for end in range(WINDOW, len(totals) + 1)
                    if statistics.mean(totals[end - WINDOW:end]) >= threshold), None)
    return {"last_quarter_per_turn": [statistics.mean(turns[k] for turns in last) for k in range(TURNS)],
            "last_quarter_return": statistics.mean(sum(turns) for turns in last),
            "iterations_to_threshold": reached, "seconds": run["seconds"]}


def run_one(algorithm: str, mode: str, seed: int, iterations: int, folder: Path) -> dict:
    """One run in a fresh process."""
    out = folder / f"{algorithm}-{mode}-{seed}.json"
    done = subprocess.run([sys.executable, __file__, "--worker", f"{algorithm}:{mode}:{seed}", "--iterations",
                           str(iterations), "--worker-out", str(out)], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{algorithm} {mode} seed {seed} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return json.loads(out.read_text())


def report(results: list[dict], threshold: float) -> None:
    print(f"| algorithm | turn_credit | reward per turn, last quarter (turns 1/2/3) | total return, last quarter "
          f"| iterations to {threshold} | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for algorithm, mode in RUNS:
        runs = [run for run in results if (run["algorithm"], run["mode"]) == (algorithm, mode)]
        figures = [run["summary"] for run in runs]
        turns = [statistics.mean(f["last_quarter_per_turn"][k] for f in figures) for k in range(TURNS)]
        reached = [f["iterations_to_threshold"] for f in figures]
        mean_reached = (f"{statistics.mean(reached):.1f}" if None not in reached else "not all reached")
        returns = [f["last_quarter_return"] for f in figures]
        print(f"| {algorithm} | {mode} | {'/'.join(f'{t:.2f}' for t in turns)} | **{statistics.mean(returns):.2f}** "
              f"({', '.join(f'{value:.2f}' for value in returns)}) | {mean_reached} "
              f"({', '.join(str(r) if r is not None else 'never' for r in reached)}) | "
              f"{statistics.mean(f['seconds'] for f in figures):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--threshold", type=float, default=1.5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, 4 iterations")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker")
    parser.add_argument("--worker-out", type=Path)
    args = parser.parse_args()
    if args.worker:
        algorithm, mode, seed = args.worker.split(":")
        with tempfile.TemporaryDirectory() as folder:
            result = worker(algorithm, mode, int(seed), args.iterations, Path(folder))
        args.worker_out.write_text(json.dumps(result))
        return
    seeds, iterations = (1, 4) if args.quick else (args.seeds, args.iterations)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(1, seeds + 1):  # interleaved: every mode of a seed before the next seed
            for algorithm, mode in RUNS:
                run = run_one(algorithm, mode, seed, iterations, Path(folder))
                run["summary"] = summary(run, args.threshold)
                print(f"{algorithm} {mode} seed {seed}: {json.dumps(run['summary'])}", flush=True)
                results.append(run)
    report(results, args.threshold)
    if args.out:
        settings = {"seeds": seeds, "iterations": iterations, "threshold": args.threshold, "batch": BATCH,
                    "group": GROUP, "threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count()}
        args.out.write_text(json.dumps({"settings": settings, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
