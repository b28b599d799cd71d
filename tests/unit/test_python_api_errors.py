"""Mistakes made through the Python API end in one exception whose one-line message names the argument as the
caller wrote it (`GRPOConfig: learning_rate`, `args.max_inflight_tasks`, `train_dataset[1]`, `model`,
`reward_funcs[0]`) and what was expected: never a recipe key the caller did not write, pydantic's decoration or an
error from inside the library."""

import pytest
from pydantic import ValidationError

from tests.helpers import make_rloo_trainer
from training_wizard import GRPOConfig, GRPOTrainer, RLOOConfig, SFTConfig
from training_wizard.errors import UserError

NOISE = ("validation error", "input_value", "input_type", "errors.pydantic.dev", "[type=", "\n")


def clean_line(exc: BaseException) -> str:
    message = str(exc)
    assert not any(part in message for part in NOISE), message
    return message


@pytest.mark.parametrize("make, expected", [
    (lambda: GRPOConfig(learning_rate="fast"), "GRPOConfig: learning_rate: Input should be a valid number, unable "
     "to parse string as a number (got 'fast')"),
    (lambda: RLOOConfig(per_device_train_batch_size=0), "RLOOConfig: per_device_train_batch_size: Input should be "
     "greater than 0 (got 0)"),
    (lambda: GRPOConfig(learnin_rate=1e-3), "GRPOConfig: learnin_rate: Extra inputs are not permitted (an unknown "
     "keyword argument: check the spelling; docs/configuration.md lists the options)"),
    (lambda: GRPOConfig(hub_token="t"), 'GRPOConfig: hub_token: "t" is not supported: push_to_hub reads the token '
     "of HF_TOKEN or `hf auth login`; remove it"),
    (lambda: SFTConfig(learning_rate="fast"), "SFTConfig: learning_rate: Input should be a valid number, unable to "
     "parse string as a number (got 'fast')"),
    (lambda: setattr(GRPOConfig(), "temperature", "hot"), "GRPOConfig: temperature: Input should be a valid number, "
     "unable to parse string as a number (got 'hot')"),
    (lambda: RLOOConfig(async_rollouts=True, max_inflight_tasks=0), "RLOOConfig: max_inflight_tasks = 0: expected "
     "-1 (automatic) or a positive number of completions"),
])
def test_a_config_keyword_error_is_one_line_naming_the_class_and_keyword(make, expected):
    with pytest.raises(ValidationError) as caught:  # still pydantic's error, with its errors(), and a UserError
        make()
    assert isinstance(caught.value, UserError) and clean_line(caught.value) == expected


@pytest.mark.parametrize("key, value", [("max_staleness", 3), ("max_inflight_tasks", 32), ("weight_sync_steps", 2),
                                        ("async_producer", "inline"), ("async_producer_timeout", 5.0)])
def test_an_async_key_without_async_rollouts_is_refused(key, value):
    with pytest.raises(ValueError) as caught:
        GRPOConfig(**{key: value})
    message = clean_line(caught.value)
    assert message.startswith(f"GRPOConfig: {key}: ") and "takes effect only with async_rollouts = true" in message
    GRPOConfig(max_staleness=1, max_inflight_tasks=-1, async_producer="thread")  # at their defaults: nothing asked


def test_a_batch_error_names_the_config_argument_not_a_recipe_table(tokenizer, tmp_path):
    with pytest.raises(UserError) as caught:
        make_rloo_trainer(tokenizer, tmp_path, async_rollouts=True, max_inflight_tasks=12)
    assert clean_line(caught.value).startswith("args.max_inflight_tasks: 12 is not a multiple of the 8 completions "
                                               "of one iteration")


def reward(completions, **columns):
    return [0.0] * len(completions)


@pytest.mark.parametrize("dataset, expected", [
    (["a", "b"], "train_dataset[0]: expected a row like {'prompt': 'a'}, got the str 'a'"),
    ([{"prompt": "a"}, {"text": "b"}], "train_dataset[1]: no 'prompt' (the row has 'text'); expected a 'prompt' "
     "string or list of messages"),
    ([{"prompt": "a"}, {"prompt": 3}], "train_dataset[1]: prompt: expected a string or a list of messages, got 3"),
    ({"prompt": ["a"]}, "train_dataset: got a dict (keys 'prompt'), not rows; for columns use "
     "datasets.Dataset.from_dict(...), or pass a datasets.Dataset with a 'prompt' column or a list of rows like "
     "{'prompt': ...}"),
    ("prompts.jsonl", "train_dataset: got the str 'prompts.jsonl', not rows; load a file with "
     "datasets.load_dataset('json', data_files=...)['train'], or pass a datasets.Dataset"),
    ([], "train_dataset: no rows (an empty list)"),
    (7, "train_dataset: expected a datasets.Dataset or a list of rows, got int"),
])
def test_a_bad_train_dataset_names_the_argument_and_row(tiny_model_dir, tmp_path, dataset, expected):
    with pytest.raises(UserError) as caught:
        GRPOTrainer(model=str(tiny_model_dir), reward_funcs=reward, args=GRPOConfig(output_dir=str(tmp_path)),
                    train_dataset=dataset)
    assert clean_line(caught.value).startswith(expected)


def test_a_datasets_dataset_without_prompts_names_the_argument(tiny_model_dir, tmp_path):
    import datasets

    rows = datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": ""}])
    with pytest.raises(UserError, match=r"^eval_dataset\[1\]: prompt: empty string$"):
        GRPOTrainer(model=str(tiny_model_dir), reward_funcs=reward, args=GRPOConfig(output_dir=str(tmp_path)),
                    train_dataset=[{"prompt": "a"}], eval_dataset=rows)
    with pytest.raises(UserError, match=r"^train_dataset: no 'prompt' column \(columns: text\)"):
        GRPOTrainer(model=str(tiny_model_dir), reward_funcs=reward, args=GRPOConfig(output_dir=str(tmp_path)),
                    train_dataset=datasets.Dataset.from_list([{"text": "a"}]))


@pytest.mark.parametrize("arguments, expected", [
    (dict(reward_funcs=[reward, 3]), "reward_funcs[1]: expected a callable, got int"),
    (dict(reward_funcs=[reward], args=GRPOConfig(reward_weights=[1.0, 2.0])),
     "args.reward_weights: 2 weights for 1 reward_funcs (one weight per function)"),
    (dict(model=3), "model: expected a model folder, a cached Hub id or a transformers model, got int"),
    (dict(model="nobody/no-such-model"), "model: 'nobody/no-such-model' is neither a local folder nor in the local "
     "Hugging Face cache"),
])
def test_a_bad_model_or_reward_names_the_argument(tiny_model_dir, tmp_path, arguments, expected):
    passed = dict(model=str(tiny_model_dir), reward_funcs=reward, args=GRPOConfig(), train_dataset=[{"prompt": "a"}])
    passed.update(arguments)
    passed["args"] = passed["args"].model_copy(update={"output_dir": str(tmp_path / "run")})
    with pytest.raises(UserError) as caught:
        GRPOTrainer(**passed)
    assert clean_line(caught.value).startswith(expected)


@pytest.mark.parametrize("dataset, expected", [
    (["a", "b"], "train_dataset[0]: expected a row like {'prompt': 'a'}, got the str 'a'"),
    ([{"prompt": "a"}, {"text": "b"}], "train_dataset[1]: no 'prompt' (the row has 'text')"),
])
def test_ppo_s_python_rows_are_checked_as_grpo_s(tokenizer, tmp_path, dataset, expected):
    from tests.helpers import make_ppo_trainer

    with pytest.raises(UserError) as caught:
        make_ppo_trainer(tokenizer, tmp_path, dataset=dataset)
    assert clean_line(caught.value).startswith(expected)


class PromptingGame:
    """An environment whose reset supplies the prompt (TRL's mode without a dataset)."""

    def reset(self, **kwargs) -> str:
        return "Say hi."

    def get_reward(self) -> float:
        return 1.0


def test_an_environment_supplying_the_prompt_needs_max_steps(tiny_model_dir, tmp_path):
    with pytest.raises(UserError, match=r"^train_dataset: not given, so the environment's reset supplies each prompt "
                                        r"and max_steps sets the run's length \(as in TRL\); set args.max_steps$"):
        GRPOTrainer(model=str(tiny_model_dir), args=GRPOConfig(output_dir=str(tmp_path)),
                    environment_factory=PromptingGame)


def test_a_config_from_keywords_equals_one_from_a_table():
    """Where a config came from changes how its errors name keys, not what it is."""
    assert GRPOConfig(learning_rate=1e-5) == GRPOConfig.model_validate({"learning_rate": 1e-5})
    assert GRPOConfig(learning_rate=1e-5) != GRPOConfig.model_validate({"learning_rate": 2e-5})


def test_every_config_reads_trls_forms_of_report_to():
    """TRL's scripts pass report_to="none" (or one name) to SFTConfig and RewardConfig as to GRPOConfig."""
    from training_wizard import RewardConfig

    for config_class in (SFTConfig, RewardConfig, GRPOConfig):
        assert config_class(report_to="none").report_to == []
        assert config_class(report_to="tensorboard").report_to == ["tensorboard"]
