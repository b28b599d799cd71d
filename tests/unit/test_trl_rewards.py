"""training_wizard.rewards: TRL 1.16's trl.rewards under the same names and signatures, checked on the examples of
TRL's own docstrings (numeric answers where TRL's use math-verify's fractions) and on values worked by hand."""

import pickle

import pytest

from training_wizard import rewards
from training_wizard.specs import verifiable


def test_the_module_has_trl_s_names():
    assert sorted(rewards.__all__) == ["accuracy_reward", "get_cosine_scaled_reward", "get_repetition_penalty_reward",
                                       "get_soft_overlong_punishment", "reasoning_accuracy_reward",
                                       "think_format_reward"]
    assert rewards.accuracy_reward is verifiable.accuracy_reward  # one implementation, two import paths


def test_repetition_penalty_is_the_share_of_repeated_ngrams():
    penalty = rewards.get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    assert penalty([[1, 2, 3, 4], [5, 5, 5, 5, 5], [7]]) == [0.0, -0.75, 0.0]  # 1 distinct of 4 bigrams; too short
    assert penalty.__name__ == "repetition_penalty_reward" and pickle.loads(pickle.dumps(penalty))([[1, 1, 1]]) == [-0.5]
    with pytest.raises(ValueError, match="max_penalty must not be positive"):
        rewards.get_repetition_penalty_reward(max_penalty=0.5)


def test_cosine_scaled_reward_at_half_the_length_and_past_it():
    cosine = rewards.get_cosine_scaled_reward(max_len=100)
    completions = [[{"role": "assistant", "content": r"so \boxed{3}"}], [{"role": "assistant", "content": "2"}],
                   [{"role": "assistant", "content": "3"}], [{"role": "assistant", "content": "3"}]]
    ids = [[1] * 50, [1] * 50, [1] * 0, [1] * 300]
    # right at half of max_len: 0.5 + 0.5 * 0.5 * (1 + cos(pi / 2)) = 0.75; wrong: -0.75; right at 0 tokens: 1.0;
    # right past max_len: the long end, 0.5
    assert cosine(completions, solution=["3", "3", "3", "3"], completion_ids=ids) == pytest.approx([0.75, -0.75, 1.0, 0.5])
    assert cosine(completions[:1], solution=["a third"], completion_ids=ids[:1]) == [None]  # no number: skipped


def test_reasoning_accuracy_reads_only_after_the_reasoning():
    completions = [[{"role": "assistant", "content": r"<think> 2 or 3? </think> The answer is \boxed{3}"}],
                   [{"role": "assistant", "content": r"<think> hmm </think> The answer is \boxed{2}"}],
                   [{"role": "assistant", "content": r"<think> partial \boxed{3} and no end"}]]
    assert rewards.reasoning_accuracy_reward(completions, ["3", "3", "3"]) == [1.0, 0.0, 0.0]
    assert rewards.reasoning_accuracy_reward(completions[:1], ["3"], reasoning_delimiters=["Reasoning:"]) == [0.0]
