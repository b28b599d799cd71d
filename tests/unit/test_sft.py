"""SFT: which tokens the loss covers (masks built by hand), packing, gradient accumulation, learning."""

import json

import pytest
import torch

from training_wizard.errors import UserError
from training_wizard.testing import build_causal_lm
from training_wizard.trainers.supervised.config import SFTConfig
from training_wizard.trainers.supervised.sft import SFTExample, SFTTrainer, collate, encode_sft_row, pack_examples


def ids(tokenizer, text, special=False):
    return tokenizer(text, add_special_tokens=special)["input_ids"]


def test_prompt_completion_trains_the_completion_and_its_eos_only(tokenizer):
    prompt, completion = ids(tokenizer, "Paraphrase: the sun", True), ids(tokenizer, "a bright star")
    example = encode_sft_row({"prompt": "Paraphrase: the sun", "completion": "a bright star"}, tokenizer, SFTConfig())
    assert example.input_ids == prompt + completion + [tokenizer.eos_token_id]
    assert example.loss_mask == [False] * len(prompt) + [True] * (len(completion) + 1)
    assert example.position_ids == list(range(len(example.input_ids)))
    every = encode_sft_row({"prompt": "Paraphrase: the sun", "completion": "a bright star"}, tokenizer,
                           SFTConfig(completion_only_loss=False))
    assert every.loss_mask == [False] + [True] * (len(example.input_ids) - 1)  # nothing predicts token 0


def test_messages_train_the_assistant_turns_only(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "and?"},
                {"role": "assistant", "content": "bye"}]
    pieces = [  # (text, trains), written out from the ChatML template by hand
        ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", False),
        ("hello there<|im_end|>\n", True),
        ("<|im_start|>user\nand?<|im_end|>\n<|im_start|>assistant\n", False),
        ("bye<|im_end|>\n", True),
    ]
    expected_ids = [t for text, _ in pieces for t in ids(tokenizer, text)]
    expected_mask = [trains for text, trains in pieces for _ in ids(tokenizer, text)]
    example = encode_sft_row({"messages": messages}, tokenizer, SFTConfig())
    assert example.input_ids == expected_ids
    assert example.loss_mask == expected_mask
    # TRL's name for it is accepted; false trains every token
    every = encode_sft_row({"messages": messages}, tokenizer, SFTConfig(assistant_only_loss=False))
    assert every.loss_mask == [False] + [True] * (len(expected_ids) - 1)


def test_conversational_prompt_completion_and_text_rows(tokenizer):
    row = {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]}
    context = ids(tokenizer, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    answer = ids(tokenizer, "yo<|im_end|>\n")
    example = encode_sft_row(row, tokenizer, SFTConfig())
    assert example.input_ids == context + answer
    assert example.loss_mask == [False] * len(context) + [True] * len(answer)
    text = encode_sft_row({"text": "the sun is a star"}, tokenizer, SFTConfig())
    assert text.loss_mask == [False] + [True] * (len(text.input_ids) - 1)
    # a language-modelling row ends with EOS as TRL's SFTTrainer ends it (add_eos_token), once
    assert text.input_ids == ids(tokenizer, "the sun is a star") + [tokenizer.eos_token_id]
    ended = encode_sft_row({"text": "the sun is a star<|im_end|>"}, tokenizer, SFTConfig())
    assert ended.input_ids == text.input_ids
    bare = encode_sft_row({"text": "the sun is a star"}, tokenizer, SFTConfig(add_eos_token=False))
    assert bare.input_ids == ids(tokenizer, "the sun is a star")


def test_max_length_cuts_the_end_and_bad_rows_name_the_row(tokenizer):
    example = encode_sft_row({"prompt": "Paraphrase: the sun", "completion": "a bright star"}, tokenizer,
                             SFTConfig(max_length=5))
    assert len(example.input_ids) == 5
    with pytest.raises(UserError, match="dataset row 3: expected a 'text', 'prompt' \\+ 'completion'"):
        encode_sft_row({"question": "x"}, tokenizer, SFTConfig(), "dataset row 3")


def test_the_loss_is_the_mean_cross_entropy_over_exactly_the_completion_tokens(tokenizer, tmp_path):
    rows = [{"prompt": "Tell me: the moon", "completion": "it is bright"}, {"prompt": "Hi", "completion": "a b c d"}]
    examples = [encode_sft_row(r, tokenizer, SFTConfig()) for r in rows]
    trainer = make_trainer(tokenizer, tmp_path, examples)
    loss, stats = trainer.example_sums(examples)
    # By hand: every completion token's -log p(token | tokens before it), one row at a time, no padding.
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            prompt = ids(tokenizer, row["prompt"], True)
            completion = ids(tokenizer, row["completion"]) + [tokenizer.eos_token_id]
            sequence = torch.tensor([prompt + completion])
            logprobs = trainer.policy(input_ids=sequence).logits.log_softmax(-1)[0]
            for t in range(len(prompt), len(prompt) + len(completion)):
                total -= logprobs[t - 1, sequence[0, t]].item()
                count += 1
    assert trainer.example_weight(examples) == count
    assert loss.item() == pytest.approx(total, rel=1e-5)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_and_unpacked_batches_give_the_same_loss(tokenizer, tmp_path, attention):
    rows = [{"prompt": f"Question {i}: what is {'big ' * i}here?", "completion": "a small answer " * (1 + i % 3)}
            for i in range(6)]
    examples = [encode_sft_row(r, tokenizer, SFTConfig()) for r in rows]
    packed = pack_examples(examples, max_length=160)
    assert len(packed) == 2 and max(len(p) for p in packed) > max(len(e) for e in examples)
    trainer = make_trainer(tokenizer, tmp_path, examples, attn_implementation=attention)
    with torch.no_grad():
        unpacked_loss, _ = trainer.example_sums(examples)
        packed_loss, _ = trainer.example_sums(packed)
        # the same rows packed without restarting positions: attention runs across examples, the loss changes
        naive = [SFTExample(p.input_ids, p.loss_mask, list(range(len(p)))) for p in packed]
        naive_loss, _ = trainer.example_sums(naive)
    tokens = trainer.example_weight(examples)
    assert trainer.example_weight(packed) == tokens
    mean = unpacked_loss.item() / tokens  # the loss the step optimises: per completion token
    assert packed_loss.item() / tokens == pytest.approx(mean, abs=1e-5, rel=0)
    assert abs(naive_loss.item() / tokens - mean) > 1e-3


def test_packing_is_first_fit_decreasing_and_keeps_positions():
    examples = [SFTExample([i] * n, [True] * n, list(range(n))) for i, n in enumerate([5, 3, 4, 2])]
    packed = pack_examples(examples, max_length=7)
    # longest first: 5 -> row A (room 2), 4 -> row B (room 3), 3 -> row B (room 0), 2 -> row A (room 0)
    assert [p.input_ids for p in packed] == [[0] * 5 + [3] * 2, [1] * 3 + [2] * 4]
    assert packed[0].position_ids == [0, 1, 2, 3, 4, 0, 1]
    batch = collate(packed[:1] + [examples[3]], pad_token_id=99)
    assert batch["input_ids"][1].tolist() == [3, 3, 99, 99, 99, 99, 99]
    assert batch["position_ids"][1].tolist() == [0, 1, 0, 1, 2, 3, 4]  # padding restarts: a segment of its own
    assert batch["loss_mask"][1].tolist() == [True, True, False, False, False, False, False]


def test_one_step_is_the_same_split_into_micro_batches(tokenizer, tmp_path):
    """The step's loss is divided by its completion tokens, whatever micro-batch holds them: 1 x 8 and 4 x 2
    (gradient accumulation) give the same update although the rows have different numbers of tokens."""
    rows = [{"prompt": f"Item {i}:", "completion": "word " * (1 + i)} for i in range(8)]
    examples = [encode_sft_row(r, tokenizer, SFTConfig()) for r in rows]
    weights = []
    for batch, accumulation in ((8, 1), (2, 4)):
        trainer = make_trainer(tokenizer, tmp_path / f"{batch}", examples, per_device_train_batch_size=batch,
                               gradient_accumulation_steps=accumulation, max_steps=1, max_grad_norm=None)
        trainer.train()
        weights.append({k: v.detach().clone() for k, v in trainer.policy.state_dict().items()})
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=2e-6)


def test_a_tiny_model_learns_the_task_held_out_loss_falls(tokenizer, tmp_path):
    words = ["sun", "moon", "tree", "cat", "dog", "red", "blue", "green"]
    rows = [{"prompt": f"Repeat: {a} {b}\n", "completion": f"{a} {b}"} for a in words for b in words if a != b]
    examples = [encode_sft_row(r, tokenizer, SFTConfig()) for r in rows]
    train, held_out = examples[:46], examples[46:]  # 10 pairs of words never trained on
    trainer = make_trainer(tokenizer, tmp_path, train, eval_rows=held_out, num_train_epochs=6, learning_rate=3e-3,
                           per_device_train_batch_size=8, eval_steps=10)
    before = trainer.evaluate()
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/loss" in r]
    training = [r for r in records if "loss" in r]
    assert {"loss", "mean_token_accuracy", "num_tokens", "lr", "grad_norm", "epoch", "episode"} <= set(training[0])
    # seen: 5.75 -> 2.33; held-out token accuracy 0.00 -> 0.58
    assert evals[-1]["eval/loss"] < 0.5 * before["eval/loss"], (before, evals[-1])
    assert evals[-1]["eval/mean_token_accuracy"] > before["eval/mean_token_accuracy"] + 0.3


def make_trainer(tokenizer, tmp_path, train_rows, eval_rows=None, attn_implementation=None, **options):
    config = SFTConfig(output_dir=str(tmp_path), **{"per_device_train_batch_size": 4, **options})
    overrides = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = build_causal_lm(tokenizer, **overrides)
    return SFTTrainer(config=config, tokenizer=tokenizer, model=model, train_rows=train_rows, eval_rows=eval_rows)


SFT_RECIPE = """\
recipe_class = "sft"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
[training]
max_length = 64
"""


def test_recipe_dry_run_shows_the_trained_tokens_and_bad_rows_exit_2(tmp_path, tiny_model_dir, capsys):
    from training_wizard.cli import main

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "Repeat: cat", "completion": "cat"}) + "\n")
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT_RECIPE.format(out=tmp_path / "out", model=tiny_model_dir, data=data))
    assert main([str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "Repeat: catcat<|im_end|>" in out and "trained on (" in out and "cat<|im_end|>" in out
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    data.write_text(json.dumps({"prompt": "Repeat: cat", "answer": "cat"}) + "\n")
    assert main([str(recipe)]) == 2
    assert f"dataset row 0 ({data} line 1): column 'completion' missing (the row has 'prompt'); expected 'text', " \
        "'prompt' + 'completion', or 'messages'" in capsys.readouterr().err
    assert main([str(recipe), "training.output_dir=x"]) == 2
    assert "set output_dir at the top level of the recipe" in capsys.readouterr().err


def test_a_non_finite_loss_stops_before_the_weights_change(tokenizer, tmp_path, monkeypatch):
    from training_wizard import signals

    rows = [encode_sft_row({"prompt": f"Item {i}:", "completion": "word"}, tokenizer, SFTConfig()) for i in range(8)]
    trainer = make_trainer(tokenizer, tmp_path, rows, max_steps=3)
    monkeypatch.setenv(signals.FAULT_ENV, "loss@1=nan")  # the loss of step 1 (the second) becomes NaN
    monkeypatch.setattr(signals, "_fired", set())
    with pytest.raises(UserError, match="training: non-finite loss at step 1"):
        trainer.train()
    assert trainer.state.iteration == 1
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())


def test_skip_nonfinite_batches_skips_the_step_with_a_nan_loss_and_counts_it(tokenizer, tmp_path, monkeypatch):
    """The supervised loop shares the on-policy loop's optimizer step (trainers/loop/step.py), skip mode included:
    step 1's NaN loss leaves the weights as step 0 left them, is counted, and the run goes on."""
    from training_wizard import signals
    from training_wizard.tracking.metrics import read_metrics

    rows = [encode_sft_row({"prompt": f"Item {i}:", "completion": "word"}, tokenizer, SFTConfig()) for i in range(8)]
    trainer = make_trainer(tokenizer, tmp_path, rows, max_steps=3, skip_nonfinite_batches=True)
    monkeypatch.setenv(signals.FAULT_ENV, "loss@1=nan")
    monkeypatch.setattr(signals, "_fired", set())
    after_step = []
    real_record = trainer._record_step

    def record(*args):
        after_step.append({k: v.detach().clone() for k, v in trainer.policy.state_dict().items()})
        real_record(*args)

    trainer._record_step = record
    trainer.train()
    assert trainer.state.iteration == 3 and trainer.state.skipped_batches == 1
    assert [m["guards/skipped_batches"] for m in read_metrics(tmp_path)] == [0, 1, 1]
    assert all(torch.equal(after_step[0][k], after_step[1][k]) for k in after_step[0])  # step 1 was skipped
    assert any(not torch.equal(after_step[1][k], after_step[2][k]) for k in after_step[1])  # step 2 was not


CALCULATOR_SCHEMA = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "It."}},
                   "required": ["expression"]}}}
TOOL_EXCHANGE = [
    {"role": "user", "content": "What is 51 * 29 + 504?"},
    {"role": "assistant", "content": '<tool_call>\n{"name": "calculate", "arguments": {"expression": "51*29+504"}}'
                                     "\n</tool_call>"},
    {"role": "tool", "name": "calculate", "content": "1983"},
    {"role": "assistant", "content": "51 * 29 + 504 = 1983"},
]


def test_tool_calling_rows_render_their_tools_and_train_the_assistant_turns_only(tokenizer):
    import copy

    from training_wizard.rollout.chat_templates import HERMES

    hermes = copy.deepcopy(tokenizer)
    hermes.chat_template = HERMES
    opening = hermes.apply_chat_template(TOOL_EXCHANGE[:1], tools=[CALCULATOR_SCHEMA], add_generation_prompt=True,
                                         tokenize=False)
    assert "Evaluate an arithmetic expression." in opening  # the tools column reached the template
    pieces = [
        (opening, False),
        (TOOL_EXCHANGE[1]["content"] + "<|im_end|>\n", True),
        ("<|im_start|>user\n<tool_response>\n1983\n</tool_response><|im_end|>\n<|im_start|>assistant\n", False),
        ("51 * 29 + 504 = 1983<|im_end|>\n", True),
    ]
    expected_ids = [t for text, _ in pieces for t in ids(tokenizer, text)]
    expected_mask = [trains for text, trains in pieces for _ in ids(tokenizer, text)]
    config = SFTConfig(extra_roles=["tool"], max_length=None)
    example = encode_sft_row({"messages": TOOL_EXCHANGE, "tools": [CALCULATOR_SCHEMA]}, hermes, config)
    assert example.input_ids == expected_ids
    assert example.loss_mask == expected_mask
    as_string = encode_sft_row({"messages": TOOL_EXCHANGE, "tools": json.dumps([CALCULATOR_SCHEMA])}, hermes, config)
    assert as_string.input_ids == expected_ids
    for bad in ("[{not json", [1, 2]):
        with pytest.raises(UserError, match="dataset row 4: 'tools'"):
            encode_sft_row({"messages": TOOL_EXCHANGE, "tools": bad}, hermes, config, "dataset row 4")


def test_chat_template_path_renders_the_rows_and_is_saved_with_the_model(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from training_wizard.cli import main
    from training_wizard.rollout.chat_templates import HERMES

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"messages": TOOL_EXCHANGE, "tools": [CALCULATOR_SCHEMA]}) + "\n")
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT_RECIPE.format(out=tmp_path / "out", model=tiny_model_dir, data=data).replace(
        "max_length = 64", 'max_length = 4096\nmax_steps = 1\nextra_roles = ["tool"]\nchat_template_path = "hermes"'))
    assert main([str(recipe)]) == 0
    assert AutoTokenizer.from_pretrained(tmp_path / "out" / "model").chat_template == HERMES
    assert AutoTokenizer.from_pretrained(tiny_model_dir).chat_template != HERMES
