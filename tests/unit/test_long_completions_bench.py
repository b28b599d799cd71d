"""bench/long_completions.py: its recorded lengths are the seeded draw its docstring describes, and its forward hook
ends every completion at its recorded length both in our decode loop (which drops stopped rows) and in transformers'
`generate` (TRL's path), on a tiny random model (timing is not checked)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from training_wizard.core.masking import truncate_after_stop
from training_wizard.rollout.generation import GenerationParams, sample
from training_wizard.testing import build_causal_lm

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, GENERATIONS = 3, 3


@pytest.fixture(scope="module")
def bench():
    """bench/long_completions.py is a script, not part of the package: loaded from its file."""
    spec = importlib.util.spec_from_file_location("long_completions_bench", ROOT / "bench" / "long_completions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_ids(bench, tokenizer, order: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded chat prompts of the bench's PROMPTS, one row per entry of `order`."""
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": bench.PROMPTS[p]}], add_generation_prompt=True,
                                          tokenize=False) for p in order]
    encoded = tokenizer(rows, add_special_tokens=False, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def stopped_lengths(tokens: torch.Tensor, stop: int, pad: int) -> list[int]:
    return truncate_after_stop(tokens, (stop,), pad)[1].sum(-1).tolist()


def test_the_recorded_lengths_are_the_seeded_draw_and_span_20_to_512(bench):
    assert bench.LENGTHS == bench.draw_lengths(bench.LENGTHS_SEED)
    assert bench.LENGTHS_SEED == bench.first_spanning_seed()
    block = [n for row in bench.lengths_for(4, 4, 512) for n in row]
    assert min(block) <= 40 and max(block) == 512


def test_our_decode_loop_ends_each_row_at_its_recorded_length(bench, tokenizer):
    model = build_causal_lm(tokenizer).eval()
    lengths = bench.lengths_for(PROMPTS, GENERATIONS, 40)  # short enough for a test, with rows stopping early
    forced = bench.ForcedLengths(model, tokenizer, lengths, tokenizer.eos_token_id, [tokenizer.pad_token_id])
    order = [p for _ in range(GENERATIONS) for p in range(PROMPTS)]  # ours: generation by generation
    ids, mask = prompt_ids(bench, tokenizer, order)
    params = GenerationParams(max_new_tokens=max(map(max, lengths)), temperature=1.0,
                              stop_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id)
    with forced.generating():
        tokens = sample(model, ids, mask, params, row_seeds=list(range(len(order)))).tokens
    expected = [lengths[p][g] for g in range(GENERATIONS) for p in range(PROMPTS)]
    assert len(set(expected)) > 2  # rows stop at different steps, so the loop drops some while others run
    assert stopped_lengths(tokens, tokenizer.eos_token_id, tokenizer.pad_token_id) == expected
    assert forced.targets_per_generation == [expected]


def test_transformers_generate_ends_each_row_at_its_recorded_length(bench, tokenizer):
    model = build_causal_lm(tokenizer, seed=1).eval()
    lengths = bench.lengths_for(PROMPTS, GENERATIONS, 40)
    forced = bench.ForcedLengths(model, tokenizer, lengths, tokenizer.eos_token_id, [tokenizer.pad_token_id])
    order = [p for p in range(PROMPTS) for _ in range(GENERATIONS)]  # TRL: prompt by prompt
    ids, mask = prompt_ids(bench, tokenizer, order)
    torch.manual_seed(0)
    with forced.generating():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             max_new_tokens=max(map(max, lengths)), eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    expected = [lengths[p][g] for p in range(PROMPTS) for g in range(GENERATIONS)]
    assert stopped_lengths(out[:, ids.shape[1]:], tokenizer.eos_token_id, tokenizer.pad_token_id) == expected


def test_outside_generation_the_hook_changes_nothing(bench, tokenizer):
    model = build_causal_lm(tokenizer).eval()
    ids, mask = prompt_ids(bench, tokenizer, [0, 1])
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        bench.ForcedLengths(model, tokenizer, [[5], [5]], tokenizer.eos_token_id, [tokenizer.pad_token_id])
        after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(before, after)
