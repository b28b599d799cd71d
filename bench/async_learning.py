"""Learning at a staleness of 2 under each async correction rule, against the synchronous loop, on the same seeds.

RLOO (one weight per completion: a token rule weighs a completion by the product of its bounded token weights,
bounded again) on the tests' 'x' share reward with the tiny random model of tests/helpers.py: 60 iterations of
16 completions (4 per prompt), 2 update epochs, learning rate 3e-3, temperature 1, no KL. Per rule and completion
length: the mean score of the last 5 iterations (final) and of all 60 (how fast it learned), per seed, and the
share of stale completions whose weight was 0 (masked), counted over the correction weights the run computed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/async_learning.py [--seeds 1 2 3] [--lengths 8 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers import make_rloo_trainer  # noqa: E402
from training_wizard.testing import build_tokenizer  # noqa: E402
from training_wizard.tracking.metrics import read_metrics  # noqa: E402

RULES = {  # name: options
    "synchronous": {},
    "token_truncate, 3 (new default)": dict(async_rollouts=True, max_staleness=2),
    "sequence_mask, 3 (old default)": dict(async_rollouts=True, max_staleness=2, async_correction="sequence_mask"),
    "token_mask, 5 (AReaL)": dict(async_rollouts=True, max_staleness=2, async_correction="token_mask",
                                  vllm_importance_sampling_clip_max=5.0),
}


def scores(tokenizer, seed: int, length: int, options: dict) -> tuple[float, float, float]:
    """(final score, mean score over the run, share of stale completions weighted 0) of one run."""
    zeroed: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        trainer = make_rloo_trainer(tokenizer, Path(folder), rloo_k=4, per_device_train_batch_size=16,
                                    total_episodes=16 * 60, response_length=length, learning_rate=3e-3,
                                    num_ppo_epochs=2, temperature=1.0, kl_coef=0.0, seed=seed, **options)
        weigh = trainer.correction_weights

        def counted(logprobs, sampling_logprobs, mask):
            weights = weigh(logprobs, sampling_logprobs, mask)
            zeroed.append(float((weights.sequence == 0).double().mean()))
            return weights

        trainer.correction_weights = counted
        trainer.train()
        records = read_metrics(Path(folder))
    values = [record["objective/scores"] for record in records]
    return sum(values[-5:]) / 5, sum(values) / len(values), statistics.fmean(zeroed) if zeroed else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    print("| rule | tokens | final score per seed | mean final | mean score over the run | stale completions "
          "weighted 0 |")
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        for name, options in RULES.items():
            runs = [scores(tokenizer, seed, length, options) for seed in args.seeds]
            finals = ", ".join(f"{final:.3f}" for final, _, _ in runs)
            print(f"| {name} | {length} | {finals} | {statistics.fmean(r[0] for r in runs):.3f} | "
                  f"{statistics.fmean(r[1] for r in runs):.3f} | {statistics.fmean(r[2] for r in runs):.1%} |",
                  flush=True)


if __name__ == "__main__":
    main()
