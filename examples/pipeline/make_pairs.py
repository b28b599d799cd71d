"""Stage 0 of the pipeline example: preference pairs from the paraphrase example's own sentences.

For each of the first `--sentences` training sentences of examples/rloo/config.toml (the same seeded shuffle, so
its 100 held-out sentences are never used), the base policy samples two completions (temperature 1.0, seeded,
with training-wizard's decode loop);
the handcrafted ParaphraseRewardSpec of examples/rloo scores both, and the higher one is `chosen`. Pairs whose
scores differ by less than `--min-gap` are left out (a coin flip teaches nothing). Rows are written in the form a
[reward] ModelRewardSpec reads during RL: `prompt` = the user message, `chosen` / `rejected` = the completion
text without special tokens.

    python examples/pipeline/make_pairs.py --out runs/pipeline/pairs.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `examples.rloo.reward_spec` as the recipes name it

from training_wizard.recipes.base import load_recipe  # noqa: E402
from training_wizard.core.masking import is_stop_token  # noqa: E402
from training_wizard.rollout.generation import GenerationParams, default_stop_token_ids, generate  # noqa: E402
from training_wizard.rollout.prompts import prompt_text, render_prompt, row_seed  # noqa: E402


def sample_two(model, tokenizer, prompts: list, seed: int, max_new_tokens: int):
    """Two sampled completions per prompt (training-wizard's decode loop, temperature 1.0, seeded per row):
    (texts without special tokens, ended with the stop token), each 2 * len(prompts) long, in prompt order."""
    encoded = [render_prompt(tokenizer, p) for p in prompts for _ in range(2)]
    width = max(len(ids) for ids in encoded)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(x)) + x for x in encoded])
    mask = torch.tensor([[False] * (width - len(x)) + [True] * len(x) for x in encoded])
    stop = default_stop_token_ids(tokenizer, model)  # as the trainer's: the tokenizer's EOS and the model's list
    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=stop,
                              pad_token_id=tokenizer.pad_token_id)
    tokens = generate(model, ids, mask, params, [row_seed(seed, 0, slot) for slot in range(len(encoded))])
    ended = is_stop_token(tokens, stop).any(-1).tolist()
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
    return texts, ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/pipeline/pairs.jsonl")
    parser.add_argument("--sentences", type=int, default=320)
    parser.add_argument("--min-gap", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    recipe = load_recipe(ROOT / "examples" / "rloo" / "config.toml")
    rows = list(recipe.dataset.load("dataset"))[: args.sentences]  # training part only: hold_out stays unseen
    tokenizer = recipe.model.load_tokenizer()
    model = recipe.model.load_causal_lm("float32", tokenizer).eval()
    reward = recipe.reward
    pairs, skipped = [], 0
    for start in range(0, len(rows), args.batch):
        chunk = rows[start : start + args.batch]
        with torch.no_grad():
            texts, ended = sample_two(model, tokenizer, [r["prompt"] for r in chunk], args.seed + start,
                                      recipe.training.response_length)
        queries = [prompt_text(r["prompt"]) for r in chunk for _ in range(2)]
        columns = {"text": [r["text"] for r in chunk for _ in range(2)], "completion_has_eos": ended}
        scores = reward.compute_reward(queries, texts, **columns)
        for i, row in enumerate(chunk):
            (a, score_a), (b, score_b) = (texts[2 * i], scores[2 * i]), (texts[2 * i + 1], scores[2 * i + 1])
            if abs(score_a - score_b) < args.min_gap:
                skipped += 1
                continue
            chosen, rejected = (a, b) if score_a > score_b else (b, a)
            pairs.append({"prompt": queries[2 * i], "chosen": chosen, "rejected": rejected,
                          "score_chosen": max(score_a, score_b), "score_rejected": min(score_a, score_b)})
        print(f"{start + len(chunk)}/{len(rows)} sentences, {len(pairs)} pairs", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    print(f"wrote {len(pairs)} pairs to {out} ({skipped} left out: scores closer than {args.min_gap})")


if __name__ == "__main__":
    main()
