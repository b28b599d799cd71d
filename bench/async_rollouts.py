"""Synchronous against asynchronous rollouts (async_rollouts, docs/async.md) on this machine, side by side in one run.

Three runs of the same RLOO recipe (the 25M-parameter model of bench/bench_rloo.py, 16 prompts x 4 samples of 32
tokens, one update pass per rollout), each in a fresh interpreter:
  sync-1t   the synchronous loop, torch on 1 thread
  sync-2t   the synchronous loop, torch on 2 threads
  async     the one-step-off schedule with its producer thread: torch on 1 thread in each of the two threads
            (sampling the next batch, and the update), so one core each

Reported: seconds per iteration and episodes per second (after warm-up iterations), the phases' seconds (sampling +
logprob passes + scoring = the producer's work; the update, with the stale batch's logprob refresh), the trainer's
and the producer's idle time, and the ideal overlap, (producer work + update) / max(producer work, update) from
sync-1t: the speed-up of a perfect overlap with one core per side. Then the learning curve of sync-1t and async on
the share-of-'e' reward over the same iterations.

    OMP_NUM_THREADS=1 .venv/bin/python bench/async_rollouts.py --iterations 8 --warmup 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_rloo import (  # noqa: E402
    PROMPTS, build_models, cpu_description, peak_mb, reward, train_timed, wait_for_quiet,
)

PROMPTS_PER_ITERATION, K, LENGTH = 16, 4, 32
VARIANTS = {"sync-1t": (1, False), "sync-2t": (2, False), "async": (1, True)}


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from training_wizard import RLOOConfig, RLOOTrainer
    from training_wizard.specs.model import TransformerSpec
    from training_wizard.tracking.metrics import read_metrics

    spec = TransformerSpec(pretrained_name=args.model)
    iterations = args.warmup + args.iterations
    config = RLOOConfig(
        output_dir=args.out, per_device_train_batch_size=PROMPTS_PER_ITERATION * K, rloo_k=K, response_length=LENGTH,
        total_episodes=PROMPTS_PER_ITERATION * K * iterations, num_ppo_epochs=1, num_mini_batches=1,
        learning_rate=args.learning_rate, temperature=1.0, kl_coef=0.05, num_sample_generations=0, seed=1,
        local_rollout_forward_batch_size=PROMPTS_PER_ITERATION * K, max_grad_norm=1.0,
        async_rollouts=args.asynchronous)
    trainer = RLOOTrainer(config=config, tokenizer=spec.load_tokenizer(), policy=spec.load_causal_lm("float32"),
                          reward_model=reward, train_dataset=[{"prompt": p} for p in PROMPTS])
    seconds = train_timed(trainer)[args.warmup:]
    metrics = read_metrics(args.out)
    timed_metrics = metrics[args.warmup:]

    def mean(name: str) -> float:
        return statistics.mean(m.get(name, 0.0) for m in timed_metrics)

    return {
        "seconds": seconds, "episodes": PROMPTS_PER_ITERATION * K * len(seconds), "peak_mb": peak_mb(),
        "producer_s": mean("time/generation") + mean("time/scoring"), "generation_s": mean("time/generation"),
        "update_s": mean("time/update"), "refresh_s": mean("time/logprob_refresh"), "trainer_idle_s": mean("async/trainer_idle_s"),
        "producer_idle_s": mean("async/producer_idle_s"), "scores": [m["objective/scores"] for m in metrics],
    }


def run_variant(name: str, model: Path, out: Path, args) -> dict:
    threads, asynchronous = VARIANTS[name]
    command = [sys.executable, __file__, "--worker", "--model", str(model), "--out", str(out / name),
               "--threads", str(threads), "--warmup", str(args.warmup), "--iterations", str(args.iterations),
               "--learning-rate", str(args.learning_rate)] + (["--asynchronous"] if asynchronous else [])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict) -> None:
    base = results["sync-1t"]
    ideal = (base["producer_s"] + base["update_s"]) / max(base["producer_s"], base["update_s"])
    print(f"\n{cpu_description()}; {PROMPTS_PER_ITERATION} prompts x {K} samples x {LENGTH} tokens, RLOO, 25M model")
    print(f"{'run':8} {'s/iter':>7} {'eps/s':>7} {'vs sync-1t':>10} {'producer s':>10} {'refresh s':>9} "
          f"{'update s':>9} {'trainer idle':>12} {'producer idle':>13} {'peak MB':>8}")
    for name, result in results.items():
        per_iteration = statistics.mean(result["seconds"])
        speed = statistics.mean(base["seconds"]) / per_iteration
        print(f"{name:8} {per_iteration:7.2f} {result['episodes'] / sum(result['seconds']):7.1f} {speed:9.2f}x "
              f"{result['producer_s']:10.2f} {result['refresh_s']:9.2f} {result['update_s']:9.2f} "
              f"{result['trainer_idle_s']:12.2f} "
              f"{result['producer_idle_s']:13.2f} {result['peak_mb']:8.0f}")
    achieved = statistics.mean(base["seconds"]) / statistics.mean(results["async"]["seconds"])
    print(f"ideal overlap from sync-1t: {ideal:.2f}x; async achieved {achieved:.2f}x = {achieved / ideal:.0%} of it")
    trainer_side = results["async"]["refresh_s"] + results["async"]["update_s"]
    print(f"async's training thread: refresh {results['async']['refresh_s']:.2f} s + update "
          f"{results['async']['update_s']:.2f} s = {trainer_side:.2f} s per iteration (sync-1t's update: "
          f"{base['update_s']:.2f} s)")
    print("scores by iteration (share of 'e'):")
    for name in ("sync-1t", "async"):
        print(f"  {name:8} " + " ".join(f"{score:.3f}" for score in results[name]["scores"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-async"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report", type=Path, help="print the report of a saved --json file again, and stop")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--asynchronous", action="store_true")
    args = parser.parse_args()
    if args.worker:
        args.out = str(args.out)
        print(json.dumps(worker(args)))
        return
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    model = build_models(args.cache)["25m"]
    print(f"waited {wait_for_quiet():.0f} s for a quiet machine")
    results = {name: run_variant(name, model, args.out, args) for name in VARIANTS}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
