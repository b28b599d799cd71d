"""Data source specs: file formats, preprocessing, templates, several sources, validation, length filtering."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from training_wizard.errors import UserError
from training_wizard.spec import Spec, load_spec
from training_wizard.specs import data_files as files_mod
from training_wizard.specs.dataset import (
    DataSourceSpec,
    MultiDataSourceSpec,
    SimpleDataSourceSpec,
    TemplateInstructDatasourceSpec,
    filter_long_prompts,
    prompt_token_counts,
    validate_prompt_row,
    validate_prompts,
)
from training_wizard.testing import build_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SENTENCES = [
    "The cat sat on the mat.",
    "It is raining in the city today.",
    "She bought three red apples.",
    "The train leaves at noon.",
    "He plays the piano every evening.",
    "Our team won the final match.",
]
TEMPLATE = [
    {"role": "system", "content": "You rewrite sentences."},
    {"role": "user", "content": "Paraphrase: {text}"},
]


class Holder(Spec):
    """A stand-in recipe with one [dataset] table, to check spec_class dispatch and defaults."""

    dataset: DataSourceSpec


def source(**keys) -> DataSourceSpec:
    return Holder.model_validate({"dataset": keys}).dataset


def fixture(name: str) -> str:
    return str(FIXTURES / name)


# --------------------------------------------------------------------------------------------------------------
# File formats


@pytest.mark.parametrize("name", ["sentences.jsonl", "sentences.json", "sentences.csv"])
def test_structured_formats_load_the_same_rows(name):
    ds = source(data_files=fixture(name)).load()
    assert isinstance(ds, datasets.Dataset)
    assert ds["text"][:] == SENTENCES
    assert list(ds["id"]) == list(range(6))


def test_text_file_gives_one_row_per_line():
    ds = source(data_files=fixture("sentences.txt")).load()
    assert ds.column_names == ["text"]
    assert list(ds["text"]) == SENTENCES


def test_parquet(tmp_path):
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list([{"text": s, "id": i} for i, s in enumerate(SENTENCES[:4])]).to_parquet(str(path))
    ds = source(data_files=str(path)).load()
    assert list(ds["text"]) == SENTENCES[:4]


def test_default_spec_class_is_simple_source():
    spec = source(data_files=fixture("sentences.jsonl"))
    assert type(spec) is SimpleDataSourceSpec


def test_glob_and_list_of_files():
    globbed = source(data_files=fixture("shards/part-*.jsonl")).load()
    assert list(globbed["text"]) == SENTENCES  # sorted shards: part-0 then part-1
    listed = source(data_files=[fixture("shards/part-1.jsonl"), fixture("shards/part-0.jsonl")]).load()
    assert list(listed["text"]) == SENTENCES[3:] + SENTENCES[:3]  # a list keeps the order written


def test_relative_paths_resolve_against_the_recipe_folder(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text(json.dumps({"text": "x y"}) + "\n")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[dataset]\ndata_files = "data/*.jsonl"\n')
    monkeypatch.chdir(FIXTURES)  # somewhere else: only the recipe folder has data/
    spec = load_spec(Holder, recipe)  # load() runs later, outside the loader's context, as in a recipe
    assert list(spec.dataset.load()["text"]) == ["x y"]
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "b"}) + "\n")
    recipe.write_text('[dataset]\ndata_files = ["b.jsonl", "data/a.jsonl"]\n')
    assert list(load_spec(Holder, recipe).dataset.load()["text"]) == ["b", "x y"]


# --------------------------------------------------------------------------------------------------------------
# Preprocessing


def test_columns_and_rename():
    ds = source(data_files=fixture("sentences.jsonl"), columns=["text"], rename_columns={"text": "sentence"}).load()
    assert ds.column_names == ["sentence"]
    assert ds[0] == {"sentence": SENTENCES[0]}


def test_shuffle_is_seeded_deterministic_and_changes_order():
    plain = list(source(data_files=fixture("sentences.jsonl")).load()["id"])
    first = list(source(data_files=fixture("sentences.jsonl"), shuffle=True, shuffle_seed=3).load()["id"])
    again = list(source(data_files=fixture("sentences.jsonl"), shuffle=True, shuffle_seed=3).load()["id"])
    other = list(source(data_files=fixture("sentences.jsonl"), shuffle=True, shuffle_seed=4).load()["id"])
    assert first == again
    assert first != plain and sorted(first) == plain
    assert other != first


def test_take_after_shuffle():
    shuffled = list(source(data_files=fixture("sentences.jsonl"), shuffle=True, shuffle_seed=3).load()["id"])
    taken = source(data_files=fixture("sentences.jsonl"), shuffle=True, shuffle_seed=3, take=2).load()
    assert list(taken["id"]) == shuffled[:2]
    assert len(source(data_files=fixture("sentences.jsonl"), take=100).load()) == 6


def test_missing_column_in_columns_names_key():
    with pytest.raises(UserError, match=r"dataset\.columns: column 'nope' not found \(columns: id, text\)"):
        source(data_files=fixture("sentences.jsonl"), columns=["nope"]).load()


def test_missing_column_in_rename_names_key():
    with pytest.raises(UserError, match=r"dataset\.rename_columns: column 'nope' not found"):
        source(data_files=fixture("sentences.jsonl"), rename_columns={"nope": "x"}).load()


# --------------------------------------------------------------------------------------------------------------
# File errors


def test_missing_file_names_key_and_path():
    with pytest.raises(UserError) as err:
        source(data_files="no/such/file.jsonl").load()
    assert str(err.value) == "dataset.data_files: file not found: no/such/file.jsonl"


def test_glob_without_match():
    with pytest.raises(UserError, match=r"dataset\.data_files: no file matches the glob '.*nothing-\*\.jsonl'"):
        source(data_files=fixture("nothing-*.jsonl")).load()


def test_unknown_extension(tmp_path):
    path = tmp_path / "rows.xml"
    path.write_text("<rows/>")
    with pytest.raises(UserError, match=r"dataset\.data_files: unsupported file type 'rows\.xml' \(expected one of"):
        source(data_files=str(path)).load()


def test_malformed_json_line_names_file_and_line():
    with pytest.raises(UserError) as err:
        source(data_files=[fixture("sentences.jsonl"), fixture("malformed.jsonl")]).load()
    message = str(err.value)
    assert message.startswith("dataset.data_files: could not read ")
    assert "malformed.jsonl: invalid JSON at line 3" in message
    assert "\n" not in message


def test_data_files_and_name_are_exclusive():
    with pytest.raises(Exception, match="set exactly one of data_files"):
        source(data_files=fixture("sentences.jsonl"), name="someone/data")
    with pytest.raises(Exception, match="set exactly one of data_files"):
        source()


def test_unknown_key_is_refused():
    with pytest.raises(Exception, match="extra"):
        source(data_files=fixture("sentences.jsonl"), shufle=True)


# --------------------------------------------------------------------------------------------------------------
# Hub datasets offline


def test_hub_name_offline_env_gives_one_line_error(monkeypatch):
    import datasets.config

    before = datasets.config.HF_HUB_OFFLINE
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(files_mod, "hub_reachable", lambda timeout=3.0: pytest.fail("no probe when offline is set"))
    with pytest.raises(UserError) as err:
        source(name="someone/not-cached-dataset", split="train").load()
    assert str(err.value).startswith(
        "dataset.name: could not load hub dataset 'someone/not-cached-dataset' (split 'train'): offline and not in "
        "the local datasets cache"
    )
    assert datasets.config.HF_HUB_OFFLINE == before  # the offline switch is restored after the call


def test_hub_name_unreachable_hub_is_treated_as_offline(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(files_mod, "hub_reachable", lambda timeout=3.0: False)
    import datasets.config

    before = datasets.config.HF_HUB_OFFLINE
    with pytest.raises(UserError, match=r"^dataset\.parent\.name: could not load hub dataset 'a/b' .*offline"):
        TemplateInstructDatasourceSpec(parent=SimpleDataSourceSpec(name="a/b"), messages_template=TEMPLATE).load()
    assert datasets.config.HF_HUB_OFFLINE == before


# --------------------------------------------------------------------------------------------------------------
# Template source


def test_template_fills_columns_and_keeps_parent_columns():
    spec = source(
        spec_class="training_wizard.specs.dataset.TemplateInstructDatasourceSpec",
        messages_template=TEMPLATE,
        parent={"data_files": fixture("sentences.jsonl"), "take": 2},
    )
    ds = spec.load()
    assert sorted(ds.column_names) == ["id", "prompt", "text"]
    assert ds[1]["prompt"] == [
        {"role": "system", "content": "You rewrite sentences."},
        {"role": "user", "content": "Paraphrase: It is raining in the city today."},
    ]
    assert ds[1]["text"] == SENTENCES[1]
    validate_prompts(ds, "dataset")


def test_template_with_literal_braces_and_several_fields():
    spec = TemplateInstructDatasourceSpec(
        parent=SimpleDataSourceSpec(data_files=fixture("sentences.jsonl"), take=1),
        messages_template=[{"role": "user", "content": "{{json}} #{id}: {text}"}],
    )
    assert spec.load()[0]["prompt"][0]["content"] == "{json} #0: The cat sat on the mat."


def test_template_replaces_a_parent_prompt_column():
    spec = TemplateInstructDatasourceSpec(
        parent=SimpleDataSourceSpec(data_files=fixture("prompts.jsonl")),
        messages_template=[{"role": "user", "content": "Again: {prompt}"}],
    )
    ds = spec.load()
    assert ds[0]["prompt"] == [{"role": "user", "content": "Again: Paraphrase: The cat sat on the mat."}]


def test_template_missing_column_names_field_and_row():
    spec = TemplateInstructDatasourceSpec(
        parent=SimpleDataSourceSpec(data_files=fixture("sentences.jsonl")),
        messages_template=[{"role": "user", "content": "Paraphrase: {sentence}"}],
    )
    with pytest.raises(UserError) as err:
        spec.load()
    assert str(err.value) == (
        "dataset.messages_template[0].content: field {sentence} is not a column of the parent dataset "
        "(row 0 has: id, text)"
    )


def test_template_null_value_names_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": None}) + "\n")
    spec = TemplateInstructDatasourceSpec(
        parent=SimpleDataSourceSpec(data_files=str(path)), messages_template=TEMPLATE
    )
    with pytest.raises(UserError, match=r"^dataset row 1: column 'text' used by messages_template\[1\]\.content"):
        spec.load()


def test_template_must_end_with_user_and_use_named_fields():
    with pytest.raises(Exception, match="last message must have role 'user'"):
        TemplateInstructDatasourceSpec(
            parent=SimpleDataSourceSpec(data_files="x.jsonl"), messages_template=[{"role": "system", "content": "x"}]
        )
    with pytest.raises(Exception, match="use named fields"):
        TemplateInstructDatasourceSpec(
            parent=SimpleDataSourceSpec(data_files="x.jsonl"), messages_template=[{"role": "user", "content": "{}"}]
        )
    with pytest.raises(Exception, match="role"):
        TemplateInstructDatasourceSpec(
            parent=SimpleDataSourceSpec(data_files="x.jsonl"), messages_template=[{"role": "bot", "content": "x"}]
        )


def test_template_preprocessing_applies_after_filling():
    spec = TemplateInstructDatasourceSpec(
        parent=SimpleDataSourceSpec(data_files=fixture("sentences.jsonl")),
        messages_template=TEMPLATE, columns=["prompt", "text"], take=3, shuffle=True, shuffle_seed=1,
    )
    ds = spec.load()
    assert ds.column_names == ["prompt", "text"] and len(ds) == 3
    for row in ds:
        assert row["prompt"][1]["content"] == f"Paraphrase: {row['text']}"


# --------------------------------------------------------------------------------------------------------------
# Several sources


def test_multi_source_concatenates_and_aligns_columns():
    spec = source(
        spec_class="training_wizard.specs.dataset.MultiDataSourceSpec",
        sources=[
            {"data_files": fixture("prompts.jsonl")},
            {"data_files": fixture("prompts.jsonl"), "rename_columns": {"text": "source"}, "take": 1},
        ],
    )
    ds = spec.load()
    assert len(ds) == 4
    assert ds.column_names == ["prompt", "text", "source"]
    assert ds[0]["text"] == SENTENCES[0] and ds[0]["source"] is None
    assert ds[3]["source"] == SENTENCES[0] and ds[3]["text"] is None


def test_multi_source_of_templates_and_conversations():
    spec = MultiDataSourceSpec(sources=[
        TemplateInstructDatasourceSpec(
            parent=SimpleDataSourceSpec(data_files=fixture("sentences.jsonl"), take=2, columns=["text"]),
            messages_template=TEMPLATE,
        ),
        SimpleDataSourceSpec(data_files=fixture("prompts_chat.jsonl")),
    ])
    ds = spec.load()
    assert len(ds) == 5
    assert ds[4]["prompt"][1]["content"] == "Paraphrase: Our team won the final match."
    validate_prompts(ds)


def test_multi_source_prompt_format_conflict():
    spec = MultiDataSourceSpec(sources=[
        SimpleDataSourceSpec(data_files=fixture("prompts.jsonl")),
        SimpleDataSourceSpec(data_files=fixture("prompts_chat.jsonl")),
    ])
    with pytest.raises(UserError, match=r"^dataset\.sources\[1\]: prompts are conversational \(list of messages\) "
                                        r"but sources\[0\] has standard \(string\) prompts"):
        spec.load()


def test_multi_source_errors_name_the_source():
    spec = MultiDataSourceSpec(sources=[
        SimpleDataSourceSpec(data_files=fixture("prompts.jsonl")),
        SimpleDataSourceSpec(data_files="missing.jsonl"),
    ])
    with pytest.raises(UserError, match=r"^dataset\.sources\[1\]\.data_files: file not found: missing\.jsonl$"):
        spec.load()


def test_to_dict_round_trip():
    spec = source(
        spec_class="training_wizard.specs.dataset.TemplateInstructDatasourceSpec",
        messages_template=TEMPLATE, filter_length=True,
        parent={"data_files": fixture("sentences.jsonl"), "take": 2},
    )
    again = source(**spec.to_dict())
    assert again == spec and again.filter_length is True


# --------------------------------------------------------------------------------------------------------------
# Validation


def test_validate_prompts_accepts_both_formats(tmp_path):
    for name in ("prompts.jsonl", "prompts_chat.jsonl"):
        rows = [json.loads(line) for line in Path(fixture(name)).read_text().splitlines()]
        loaded = source(data_files=fixture(name)).load()
        assert loaded["prompt"] == [row["prompt"] for row in rows]  # strings, or lists of messages
        assert validate_prompts(loaded, "dataset") is None
        # the same file with one bad row after the good ones: every row was checked, not only the first
        bad = tmp_path / name
        bad.write_text("".join(json.dumps(row) + "\n" for row in [*rows, {"prompt": rows[0]["prompt"][:0]}]))
        with pytest.raises(UserError, match=f"^dataset row {len(rows)}: prompt: "):
            validate_prompts(source(data_files=str(bad)).load(), "dataset")


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("   ", "dataset row 1: prompt: empty string"),
        (None, "dataset row 1: prompt: expected a string or a list of messages, got None"),
        ([], "dataset row 1: prompt: expected a string or a list of messages, got []"),
        ([{"role": "robot", "content": "hi"}], "dataset row 1: prompt[0].role: expected system, user, assistant or tool"),
        ([{"role": "user", "content": 3}], "dataset row 1: prompt[0].content: expected a string"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
            "dataset row 1: prompt: the last message must be from the user",
        ),
    ],
)
def test_validate_prompt_row_errors(prompt, expected):
    validate_prompt_row({"prompt": "fine"}, 0)
    with pytest.raises(UserError) as err:
        validate_prompt_row({"prompt": prompt}, 1)
    assert str(err.value) == expected


def test_validate_prompts_names_source_row_and_field():
    rows = datasets.Dataset.from_list([
        {"prompt": [{"role": "user", "content": "ok"}]},
        {"prompt": [{"role": "user", "content": "ok"}]},
        {"prompt": [{"role": "system", "content": "only a system message"}]},
    ])
    with pytest.raises(UserError) as err:
        validate_prompts(rows, "dataset.sources[0]")
    assert str(err.value) == "dataset.sources[0] row 2: prompt: the last message must be from the user"


def test_validate_prompts_without_prompt_column():
    with pytest.raises(UserError, match=r"^dataset: no 'prompt' column \(columns: id, text\); use rename_columns"):
        validate_prompts(source(data_files=fixture("sentences.jsonl")).load(), "dataset")


def test_validate_prompts_rejects_empty_dataset():
    with pytest.raises(UserError, match="dataset: the dataset has no rows"):
        validate_prompts(datasets.Dataset.from_dict({"prompt": []}))


# --------------------------------------------------------------------------------------------------------------
# Length filtering


def test_prompt_token_counts_apply_the_chat_template(tokenizer):
    chat = [{"role": "user", "content": "hello there"}]
    text = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    expected_chat = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    expected_plain = len(tokenizer("hello there")["input_ids"])
    assert prompt_token_counts([chat, "hello there"], tokenizer) == [expected_chat, expected_plain]
    assert expected_chat > expected_plain


def test_filter_long_prompts_drops_over_ninety_percent(tokenizer):
    prompts = ["a", "a b c d e f g h", "The quick brown fox jumps over the lazy dog. " * 4]
    counts = prompt_token_counts(prompts, tokenizer)
    assert counts[0] < counts[1] < counts[2]
    response_length = counts[1] * 10 // 9 + 1  # 0.9 * response_length >= counts[1] > ... but < counts[2]
    assert counts[1] <= 0.9 * response_length < counts[2]
    ds = datasets.Dataset.from_dict({"prompt": prompts, "id": [0, 1, 2]})
    kept, dropped = filter_long_prompts(ds, tokenizer, response_length)
    assert dropped == 1 and list(kept["id"]) == [0, 1]
    kept, dropped = filter_long_prompts(ds, tokenizer, 10_000)
    assert dropped == 0 and len(kept) == 3


def test_filter_long_prompts_boundary_is_inclusive(tokenizer):
    prompts = ["a b c d e f g h"]
    (count,) = prompt_token_counts(prompts, tokenizer)
    ds = datasets.Dataset.from_dict({"prompt": prompts})
    # exactly at the limit is kept, one token over is dropped: 0.9 * 10 * count / 9 == count
    assert filter_long_prompts(ds, tokenizer, 10 * count / 9)[1] == 0
    assert filter_long_prompts(ds, tokenizer, 10 * (count - 1) / 9)[1] == 1


def test_filter_long_prompts_on_template_dataset(tokenizer):
    ds = TemplateInstructDatasourceSpec(
        parent=SimpleDataSourceSpec(data_files=fixture("sentences.jsonl")), messages_template=TEMPLATE
    ).load()
    counts = prompt_token_counts(list(ds["prompt"]), tokenizer)
    limit_tokens = sorted(counts)[2]  # keep the three shortest (ties aside)
    kept, dropped = filter_long_prompts(ds, tokenizer, limit_tokens / 0.9)
    assert dropped == sum(c > limit_tokens for c in counts)
    assert list(kept["text"]) == [t for t, c in zip(ds["text"], counts) if c <= limit_tokens]


def test_conversational_prompts_need_a_chat_template(tokenizer):
    plain = build_tokenizer()
    plain.chat_template = None
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(UserError, match="chat template"):
        filter_long_prompts(ds, plain, 64)
