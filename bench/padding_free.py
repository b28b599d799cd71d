"""The passes over completions padded and padding-free (`padding_free`), side by side on the same rows: the no-grad
logprob pass of the rollout and the update's forward and backward.

    OMP_NUM_THREADS=2 .venv/bin/python bench/padding_free.py [--model ~/.cache/training-wizard/bench/25m]
        [--rows 16] [--prompt-tokens 8 64] [--lengths 16 512] [--attention sdpa] [--repeats 3]

Rows have left-padded prompts of between the two `--prompt-tokens` and completions of between the two
`--lengths` real tokens, spread evenly (the spread of reasoning completions is what padding wastes). "padded" pads
every row to the longest, as the passes do without the key; "packed" runs the rows as one sequence
(rollout/packing.py). The no-grad pass is `batched_logprobs` over one chunk of all rows; the update pass is one
micro-batch of all rows, forward and backward of a weighted sum of the logprobs, as `UpdateLoop.policy_forward`
runs it. Prints the median seconds of each, padded / packed, the tokens each pass computes, and the largest
difference between the two results on real tokens. Under eager and SDPA attention the packed mask is one
(N x N) block-diagonal matrix over all N packed tokens, so its attention work grows with N squared; flash-attention's
variable-length kernels skip the blocks between rows. Without a model folder, a random 25M-parameter Qwen2 is
built in memory (`bench/prompt_sharing.py`'s).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from prompt_sharing import load_model
from sampler import median_seconds

from training_wizard.rollout.scoring import batched_logprobs, response_token_logprobs


def spread_rows(rows: int, prompt_tokens: tuple[int, int], lengths: tuple[int, int], vocab: int):
    """Left-padded prompts and right-padded completions whose real lengths are spread evenly over the ranges."""
    generator = torch.Generator().manual_seed(0)
    prompt_lengths = torch.linspace(*prompt_tokens, rows).round().long()
    completion_lengths = torch.linspace(*lengths, rows).round().long()[torch.randperm(rows, generator=generator)]
    prompt_mask = torch.arange(prompt_tokens[1])[None] >= (prompt_tokens[1] - prompt_lengths)[:, None]
    completion_mask = torch.arange(lengths[1])[None] < completion_lengths[:, None]
    prompt_ids = torch.randint(10, vocab, prompt_mask.shape, generator=generator) * prompt_mask
    completions = torch.randint(10, vocab, completion_mask.shape, generator=generator) * completion_mask
    return prompt_ids, prompt_mask, completions, completion_mask


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path.home() / ".cache/training-wizard/bench/25m")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=[8, 64])
    parser.add_argument("--lengths", type=int, nargs=2, default=[16, 512])
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = load_model(args.model)
    model.config._attn_implementation = args.attention
    prompt_ids, prompt_mask, completions, mask = spread_rows(args.rows, tuple(args.prompt_tokens),
                                                             tuple(args.lengths), model.config.vocab_size)
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) / mask.sum()

    def no_grad_pass(packed: bool) -> torch.Tensor:
        model.eval()
        return batched_logprobs(model, prompt_ids, prompt_mask, completions, mask, 1.0, args.rows,
                                share_prompts=False, padding_free=packed)

    def update_pass(packed: bool) -> torch.Tensor:
        model.train().zero_grad(set_to_none=True)
        token = response_token_logprobs(model, prompt_ids, prompt_mask, completions, 1.0, share_prompts=False,
                                        from_hidden_states=True, packed_by=mask if packed else None)
        (token.logprobs * weights * mask).sum().backward()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    padded_tokens = args.rows * (args.prompt_tokens[1] + args.lengths[1])
    packed_tokens = int(prompt_mask.sum() + mask.sum())
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {torch.get_num_threads()} threads, "
          f"{args.attention} attention, {args.rows} rows: prompts of {args.prompt_tokens[0]}-{args.prompt_tokens[1]} "
          f"tokens, completions of {args.lengths[0]}-{args.lengths[1]}")
    print("| pass | padded (s) | packed (s) | padded / packed | tokens padded / packed | max diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, run in (("no-grad", no_grad_pass), ("update", update_pass)):
        padded, packed = (median_seconds(lambda p=packed: run(p), args.repeats) for packed in (False, True))
        first, second = run(False), run(True)
        diff = float(((first - second)[mask] if name == "no-grad" else first - second).abs().max())
        print(f"| {name} | {padded:.3f} | {packed:.3f} | {padded / packed:.2f} | {padded_tokens} / {packed_tokens} "
              f"| {diff:.1e} |")


if __name__ == "__main__":
    main()
