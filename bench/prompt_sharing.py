"""The logprob passes with and without one shared pass per prompt, side by side on the same rows: the no-grad
passes of the rollout (old policy, reference) and the update's forward and backward.

    OMP_NUM_THREADS=2 .venv/bin/python bench/prompt_sharing.py [--model ~/.cache/training-wizard/bench/25m]
        [--prompt-tokens 9 64 256] [--k 4] [--prompts 16] [--length 32] [--repeats 5] [--gradient-checkpointing]

Rows come in the trainer's (k, prompts) layout: `--prompts` distinct prompts of `--prompt-tokens` random tokens,
each repeated k times, and random responses of `--length` tokens. "plain" runs `response_logits` over prompt +
response for every row; "shared" runs `shared_prompt_logits`, one pass per distinct prompt and the responses
per row over its repeated KV cache. The no-grad pass goes through `batched_logprobs` as the collector calls it
(one chunk of all rows); the update pass is one micro-batch of all rows, forward and backward of a weighted sum
of the logprobs, as `UpdateLoop.policy_forward` runs it (with `--gradient-checkpointing`, under activation
checkpointing, each layer replayed in the backward). Prints the median seconds of each, the ratio
plain / shared, the tokens each pass computes, and the largest difference between the two results. The model is any causal LM folder (`bench/bench_rloo.py`
builds the 25M one); without one, a random 25M-parameter Qwen2 is built in memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from sampler import median_seconds

from training_wizard.core.logprobs import selective_logprobs
from training_wizard.rollout.scoring import batched_logprobs, response_logits, shared_prompt_logits
from training_wizard.trainers.loop.setup import enable_activation_checkpointing


def load_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    if folder.exists():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path.home() / ".cache/training-wizard/bench/25m")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[9, 64, 256])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    model = load_model(args.model)
    if args.gradient_checkpointing:
        enable_activation_checkpointing(model)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    rows = args.k * args.prompts
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {torch.get_num_threads()} threads, "
          f"{args.prompts} prompts x k = {args.k}, responses of {args.length} tokens, activation checkpointing "
          f"{'on' if args.gradient_checkpointing else 'off'} in the update")
    print("| prompt tokens | pass | plain (s) | shared (s) | plain / shared | tokens per pass plain / shared | max diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for prompt_tokens in args.prompt_tokens:
        prompts = torch.randint(10, vocab, (args.prompts, prompt_tokens), generator=generator)
        ids = prompts.repeat(args.k, 1)  # row j * prompts + i holds prompt i, as the trainer lays them out
        mask = torch.ones_like(ids, dtype=torch.bool)
        responses = torch.randint(10, vocab, (rows, args.length), generator=generator)
        response_mask = torch.ones_like(responses, dtype=torch.bool)

        def no_grad_pass(share: bool) -> torch.Tensor:
            model.eval()
            return batched_logprobs(model, ids, mask, responses, response_mask, 1.0, rows, share_prompts=share)

        def update_pass(share: bool) -> torch.Tensor:
            model.train().zero_grad(set_to_none=True)
            logits = (shared_prompt_logits if share else response_logits)(model, ids, mask, responses)
            (selective_logprobs(logits, responses) * weights).sum().backward()
            return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

        weights = torch.randn(rows, args.length, generator=generator) / (rows * args.length)
        tokens_plain = rows * (prompt_tokens + args.length)
        tokens_shared = args.prompts * (prompt_tokens - 1) + rows * args.length  # the last prompt token runs per row
        for name, run in (("no-grad", no_grad_pass), ("update", update_pass)):
            plain, shared = (median_seconds(lambda s=share: run(s), args.repeats) for share in (False, True))
            diff = float((run(True) - run(False)).abs().max())
            print(f"| {prompt_tokens} | {name} | {plain:.3f} | {shared:.3f} | {plain / shared:.2f} | {tokens_plain} / "
                  f"{tokens_shared} | {diff:.1e} |")

if __name__ == "__main__":
    main()
