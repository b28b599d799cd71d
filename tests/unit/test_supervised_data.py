"""Supervised data validation: rows name their file and line, rows of mixed keys name the missing column, unknown
chat roles are refused, and identical preference pairs are counted once."""

import json
import re
from pathlib import Path

import datasets
import pytest

from training_wizard.cli import main
from training_wizard.errors import UserError
from training_wizard.specs.dataset import (
    DataSourceSpec,
    MultiDataSourceSpec,
    SimpleDataSourceSpec,
    TemplateInstructDatasourceSpec,
)
from training_wizard.trainers.supervised.config import RewardConfig, SFTConfig
from training_wizard.trainers.supervised.reward_model import encode_pair, encode_pairs
from training_wizard.trainers.supervised.sft import encode_sft_row, encode_sft_rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROLE_HINT = ("expected system, user or assistant (or a role listed in training.extra_roles, if the chat template "
             "renders it)")


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------------------------------------------
# Rows name their file and line


def test_json_lines_rows_name_their_physical_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "data" / "sft.jsonl", ['{"text": "a"}', "", '{"text": "b"}', "   ", '{"text": "c"}'])
    spec = SimpleDataSourceSpec(data_files="data/sft.jsonl")
    ds = spec.load("dataset")
    assert list(ds["text"]) == ["a", "b", "c"]
    assert [spec.row_name(i, "dataset") for i in range(3)] == [
        "dataset row 0 (data/sft.jsonl line 1)", "dataset row 1 (data/sft.jsonl line 3)",
        "dataset row 2 (data/sft.jsonl line 5)"]


def test_csv_json_list_text_and_several_files_name_their_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "x.csv", ["id,text", "0,plain", "", '1,"two', 'lines"', "2,last"])
    csv_spec = SimpleDataSourceSpec(data_files="x.csv")
    assert list(csv_spec.load()["id"]) == [0, 1, 2]
    assert [csv_spec.row_name(i) for i in range(3)] == ["dataset row 0 (x.csv line 2)", "dataset row 1 (x.csv line 4)",
                                                        "dataset row 2 (x.csv line 6)"]
    (tmp_path / "x.json").write_text(json.dumps([{"text": "a"}, {"text": "b"}], indent=2))
    json_spec = SimpleDataSourceSpec(data_files="x.json")
    json_spec.load("eval_dataset")
    assert json_spec.row_name(1, "eval_dataset") == "eval_dataset row 1 (x.json item 1)"
    write_lines(tmp_path / "x.txt", ["one", "", "three"])
    text_spec = SimpleDataSourceSpec(data_files="x.txt")
    assert len(text_spec.load()) == 3 and text_spec.row_name(2) == "dataset row 2 (x.txt line 3)"
    write_lines(tmp_path / "a.jsonl", ['{"text": "a"}'])
    write_lines(tmp_path / "b.jsonl", ["", '{"text": "b"}'])
    both = SimpleDataSourceSpec(data_files=["a.jsonl", "b.jsonl"])
    both.load()
    assert both.row_name(1) == "dataset row 1 (b.jsonl line 2)"


class InMemorySource(DataSourceSpec):
    """A source written in code: its rows have no file, so rows are named by their position alone."""

    def load_raw(self, label: str = "dataset"):
        return datasets.Dataset.from_dict({"text": ["a", "b", "c", "d"]})


def test_rows_of_unknown_origin_are_named_by_position():
    spec = InMemorySource()
    spec.load()
    assert spec.row_name(3, "dataset") == "dataset row 3"


def test_shuffle_take_and_columns_keep_the_rows_and_track_their_lines():
    # The rows and order below are what this source gave before row origins were tracked.
    spec = SimpleDataSourceSpec(data_files=str(FIXTURES / "sentences.jsonl"), shuffle=True, shuffle_seed=5, take=4,
                                columns=["id", "text"], rename_columns={"text": "sentence"})
    ds = spec.load()
    assert ds.column_names == ["id", "sentence"]
    assert ds.to_list() == [
        {"id": 1, "sentence": "It is raining in the city today."},
        {"id": 4, "sentence": "He plays the piano every evening."},
        {"id": 2, "sentence": "She bought three red apples."},
        {"id": 3, "sentence": "The train leaves at noon."},
    ]
    # The fixture's row with id k is on line k + 1.
    assert [spec.row_name(i).rsplit(" ", 1)[1] for i in range(4)] == ["2)", "5)", "3)", "4)"]
    held = SimpleDataSourceSpec(data_files=str(FIXTURES / "sentences.jsonl"), shuffle=True, shuffle_seed=5,
                                hold_out=2, part="held_out")
    assert held.load().to_list() == [{"id": 5, "text": "Our team won the final match."},
                                     {"id": 0, "text": "The cat sat on the mat."}]
    assert held.row_name(1).endswith("sentences.jsonl line 1)")


def test_template_and_multi_sources_name_the_file_of_the_parent_row(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "a.jsonl", ['{"text": "x"}', '{"text": "y"}'])
    template = TemplateInstructDatasourceSpec(parent=SimpleDataSourceSpec(data_files="a.jsonl", shuffle=True),
                                              messages_template=[{"role": "user", "content": "Say {text}"}])
    rows = template.load()
    line = 1 if rows[0]["text"] == "x" else 2
    assert template.row_name(0) == f"dataset row 0 (a.jsonl line {line})"
    write_lines(tmp_path / "b.jsonl", ["", '{"text": "z"}'])
    multi = MultiDataSourceSpec(sources=[SimpleDataSourceSpec(data_files="a.jsonl"),
                                         SimpleDataSourceSpec(data_files="b.jsonl")])
    assert list(multi.load()["text"]) == ["x", "y", "z"]
    assert multi.row_name(2) == "dataset row 2 (b.jsonl line 2)"


# --------------------------------------------------------------------------------------------------------------
# Rows of mixed keys: a null value is an absent column


def test_sft_row_without_completion_names_its_line_and_the_column(tmp_path, monkeypatch, tokenizer):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "data" / "sft.jsonl", ['{"prompt": "a", "completion": "b"}', "",
                                                  '{"prompt": "c"}'])
    spec = SimpleDataSourceSpec(data_files="data/sft.jsonl")
    rows = spec.load("dataset")
    with pytest.raises(UserError) as caught:
        encode_sft_rows(rows, tokenizer, SFTConfig(), "dataset", lambda i: spec.row_name(i, "dataset"))
    assert str(caught.value) == ("dataset row 1 (data/sft.jsonl line 3): column 'completion' missing (the row has "
                                 "'prompt'); expected 'text', 'prompt' + 'completion', or 'messages'")


def test_sft_rows_of_other_formats_with_null_columns_still_encode(tokenizer):
    text = encode_sft_row({"text": "the sun", "prompt": None, "completion": None, "messages": None}, tokenizer,
                          SFTConfig())
    assert text.input_ids == tokenizer("the sun")["input_ids"] + [tokenizer.eos_token_id]  # add_eos_token
    pair = encode_sft_row({"text": None, "prompt": "the", "completion": "sun", "messages": None}, tokenizer,
                          SFTConfig())
    assert pair.loss_mask.count(False) == len(tokenizer("the")["input_ids"])


def test_pair_without_rejected_names_its_line_and_the_column(tmp_path, tokenizer):
    path = write_lines(tmp_path / "pairs.jsonl", ['{"prompt": "p", "chosen": "a", "rejected": "b"}',
                                                  '{"prompt": "p", "chosen": "a"}'])
    spec = SimpleDataSourceSpec(data_files=str(path))
    rows = spec.load("dataset")
    with pytest.raises(UserError, match=r"^dataset row 1 \(.*pairs\.jsonl line 2\): column 'rejected' missing"):
        encode_pairs(rows, tokenizer, RewardConfig(), "dataset", lambda i: spec.row_name(i, "dataset"))


# --------------------------------------------------------------------------------------------------------------
# Roles


@pytest.mark.parametrize("completion_only_loss", [True, False])
def test_sft_refuses_an_unknown_role(tokenizer, completion_only_loss):
    config = SFTConfig(completion_only_loss=completion_only_loss)
    messages = [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"},
                {"role": "assistant", "content": "hello"}]
    with pytest.raises(UserError) as caught:
        encode_sft_row({"messages": messages}, tokenizer, config, "dataset row 2 (data/sft.jsonl line 3)")
    assert str(caught.value) == f"dataset row 2 (data/sft.jsonl line 3): message 1 has role 'robot'; {ROLE_HINT}"
    conversational = {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "robot", "content": "x"}]}
    with pytest.raises(UserError, match="dataset row 0: completion message 0 has role 'robot'; expected system"):
        encode_sft_row(conversational, tokenizer, config)
    with pytest.raises(UserError, match="message 0 has no 'role' string; expected system, user or assistant"):
        encode_sft_row({"messages": [{"content": "hi"}, {"role": "assistant", "content": "yo"}]}, tokenizer, config)


def test_extra_roles_admit_a_tool_message_the_template_renders(tokenizer):
    messages = [{"role": "user", "content": "time?"}, {"role": "tool", "content": "noon"},
                {"role": "assistant", "content": "It is noon."}]
    with pytest.raises(UserError, match="message 1 has role 'tool'"):
        encode_sft_row({"messages": messages}, tokenizer, SFTConfig())
    example = encode_sft_row({"messages": messages}, tokenizer, SFTConfig(extra_roles=["tool"]))
    context = tokenizer("<|im_start|>user\ntime?<|im_end|>\n<|im_start|>tool\nnoon<|im_end|>\n<|im_start|>assistant\n")
    assert example.input_ids[: len(context["input_ids"])] == context["input_ids"]
    assert not any(example.loss_mask[: len(context["input_ids"])])  # the tool's message is context, not a target


def test_pairs_refuse_an_unknown_role(tokenizer):
    row = {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}],
           "rejected": [{"role": "robot", "content": "b"}]}
    with pytest.raises(UserError, match=re.escape(f"dataset row 4: rejected message 0 has role 'robot'; {ROLE_HINT}")):
        encode_pair(row, tokenizer, RewardConfig(), "dataset row 4")
    assert encode_pair(row, tokenizer, RewardConfig(extra_roles=["robot"])).rejected


# --------------------------------------------------------------------------------------------------------------
# Through the CLI

SFT_RECIPE = """\
recipe_class = "{recipe}"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
[training]
max_length = 64
"""


def test_cli_sft_row_without_completion_is_one_line_naming_file_line_and_column(tmp_path, tiny_model_dir, capsys):
    data = write_lines(tmp_path / "sft.jsonl", ['{"prompt": "Repeat: cat", "completion": "cat"}', "",
                                                '{"prompt": "Repeat: dog"}'])
    recipe = tmp_path / "sft.toml"
    recipe.write_text(SFT_RECIPE.format(recipe="sft", out=tmp_path / "out", model=tiny_model_dir, data=data))
    code = main([str(recipe), "--dry-run"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert f"dataset row 1 ({data} line 3): column 'completion' missing" in lines[0]


def test_cli_identical_pairs_are_counted_in_one_warning(tmp_path, tiny_model_dir, capsys):
    rows = [{"chosen": "the sun", "rejected": "a dog"}, {"chosen": "same", "rejected": "same"},
            {"chosen": "a tree", "rejected": "a cat"}, {"prompt": "Say: ", "chosen": "moon", "rejected": "moon"}]
    data = write_lines(tmp_path / "pairs.jsonl", [json.dumps(r) for r in rows])
    recipe = tmp_path / "rm.toml"
    recipe.write_text(SFT_RECIPE.format(recipe="reward_model", out=tmp_path / "out", model=tiny_model_dir, data=data))
    assert main([str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if "identical" in line]
    assert warnings == [f"warning: dataset: 2 pair(s) have identical chosen and rejected (first: dataset row 1 "
                        f"({data} line 2)); they carry no preference signal"]
