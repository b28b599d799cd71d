"""GRPOTrainer and RLOOTrainer built with TRL 1.16's constructor arguments (trl/arguments.py).

The two quick-starts are TRL's documented scripts with the import line changed; the Hub model and dataset are
replaced by a tiny local model folder and a local datasets.Dataset, and `args` keeps each run to two iterations.
"""

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback

from training_wizard import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from training_wizard.errors import UserError
from training_wizard.testing import build_sequence_classifier
from training_wizard.tracking.metrics import read_metrics

SMALL_GRPO = dict(max_steps=2, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                  num_sample_generations=0)


def math_dataset(rows: int = 8) -> Dataset:
    """Rows as trl-lib/DeepMath-103K holds them: a conversational prompt and the gold `solution`."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": str(2 * i)}
                              for i in range(rows)])


def test_trl_grpo_quick_start(tiny_model_dir, tmp_path):
    # TRL 1.16's GRPOTrainer example; only the import lines differ
    from training_wizard import GRPOTrainer
    from training_wizard.rewards import accuracy_reward

    dataset = math_dataset()  # load_dataset("trl-lib/DeepMath-103K", split="train")

    trainer = GRPOTrainer(
        model=str(tiny_model_dir),  # "Qwen/Qwen2.5-0.5B-Instruct"
        reward_funcs=accuracy_reward,
        train_dataset=dataset,
        args=GRPOConfig(output_dir=str(tmp_path), **SMALL_GRPO),  # two iterations instead of TRL's defaults
    )
    trainer.train()

    records = read_metrics(tmp_path)
    assert [r["episode"] for r in records] == [4, 8]  # max_steps 2: one optimizer step per iteration of 4
    # a random model answers no sum: accuracy_reward scored every completion 0 (None would have been left out)
    assert [r["rewards/accuracy_reward"] for r in records] == [0.0, 0.0]
    assert trainer.tokenizer.padding_side == "left" and trainer.tokenizer.pad_token != trainer.tokenizer.eos_token


def reward_num_unique_letters(completions, **kwargs):
    """Reward function that rewards completions with more unique letters."""
    completion_contents = [completion[0]["content"] for completion in completions]
    return [float(len(set(content))) for content in completion_contents]


def test_trl_rloo_quick_start(tiny_model_dir, tmp_path):
    # TRL 1.16's RLOO quick start (docs/source/rloo_trainer.md); only the import line differs
    from training_wizard import RLOOTrainer

    dataset = Dataset.from_list(  # load_dataset("trl-lib/ultrafeedback-prompt", split="train")
        [{"prompt": [{"role": "user", "content": f"Describe a {word}."}]} for word in ["cat", "tree", "boat", "moon"]])

    trainer = RLOOTrainer(
        model=str(tiny_model_dir),  # "Qwen/Qwen2-0.5B-Instruct"
        reward_funcs=reward_num_unique_letters,
        train_dataset=dataset,
        args=RLOOConfig(output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=4,
                        max_completion_length=6, num_sample_generations=0),  # 2 iterations of 4 optimizer steps
    )
    trainer.train()

    records = read_metrics(tmp_path)
    assert len(records) == 2
    for record in records:
        # the function saw TRL's conversational completions ([{"role": "assistant", "content": ...}]), so it
        # returned whole numbers of distinct characters, at least one each
        assert record["rewards/reward_num_unique_letters"] >= 1.0
        assert record["objective/scores"] == pytest.approx(record["rewards/reward_num_unique_letters"], abs=1e-5)
    trainer.save_model(str(tmp_path / "saved"))  # as TRL's example scripts end
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    trained = trainer.unwrapped_policy.state_dict()
    assert all(torch.equal(value, trained[name]) for name, value in saved.state_dict().items())


def test_default_args_name_the_output_dir_after_the_model(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grpo = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=reward_num_unique_letters, train_dataset=math_dataset())
    rloo = RLOOTrainer(model=str(tiny_model_dir) + "/", reward_funcs=reward_num_unique_letters,
                       train_dataset=math_dataset())
    assert grpo.config.output_dir == f"{tiny_model_dir.name}-GRPO"
    assert rloo.config.output_dir == f"{tiny_model_dir.name}-RLOO"
    assert (grpo.config.num_generations, grpo.config.response_length) == (8, 512)  # GRPOConfig's (TRL's) defaults


class Recorder(TrainerCallback):
    """Records each event with the state's global step, and the logged metric names."""

    def __init__(self, stop_at_step: int | None = None):
        self.events, self.logs, self.stop_at_step = [], [], stop_at_step

    def on_init_end(self, args, state, control, **kwargs):
        self.events.append(("on_init_end", state.global_step))

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("on_train_begin", state.global_step))

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append(("on_step_begin", state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("on_log", state.global_step))
        self.logs.append(dict(logs))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("on_step_end", state.global_step))
        if state.global_step == self.stop_at_step:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("on_train_end", state.global_step))
        self.final = (state.global_step, state.max_steps, len(state.log_history), state.is_world_process_zero)


def test_callbacks_see_the_loop_and_the_logged_metrics(tiny_model_dir, tmp_path):
    recorder = Recorder()
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=reward_num_unique_letters,
                          train_dataset=math_dataset(), callbacks=[recorder],
                          args=GRPOConfig(output_dir=str(tmp_path), **SMALL_GRPO))
    trainer.train()
    assert recorder.events == [
        ("on_init_end", 0), ("on_train_begin", 0),
        ("on_step_begin", 0), ("on_log", 1), ("on_step_end", 1),
        ("on_step_begin", 1), ("on_log", 2), ("on_step_end", 2),
        ("on_train_end", 2),
    ]
    assert recorder.final == (2, 2, 2, True)
    written = read_metrics(tmp_path)
    for logs, record in zip(recorder.logs, written):
        assert {"objective/scores", "reward", "loss/policy_avg", "rewards/reward_num_unique_letters"} <= set(logs)
        assert logs["reward"] == record["reward"]  # what metrics.jsonl holds, plus the epoch
    # one prompt (4 completions) per iteration, of 8: an eighth of an epoch each
    assert [logs["epoch"] for logs in recorder.logs] == [0.125, 0.25]


def test_a_callback_stops_training(tiny_model_dir, tmp_path):
    recorder = Recorder(stop_at_step=1)
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=reward_num_unique_letters,
                          train_dataset=math_dataset(), callbacks=[recorder],
                          args=GRPOConfig(output_dir=str(tmp_path), **{**SMALL_GRPO, "max_steps": 3}))
    trainer.train()
    assert len(read_metrics(tmp_path)) == 1
    assert recorder.events[-2:] == [("on_step_end", 1), ("on_train_end", 1)]


def test_peft_config_trains_a_lora_adapter_against_the_base(tiny_model_dir, tmp_path):
    from peft import LoraConfig, PeftModel

    trainer = RLOOTrainer(model=str(tiny_model_dir), reward_funcs=reward_num_unique_letters,
                          train_dataset=math_dataset(4),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"),
                          args=RLOOConfig(output_dir=str(tmp_path), max_steps=1, num_ppo_epochs=1,
                                          per_device_train_batch_size=4, max_completion_length=6,
                                          num_sample_generations=0, learning_rate=1e-2))
    policy = trainer.unwrapped_policy
    assert isinstance(policy, PeftModel)
    assert trainer.ref_policy is None and trainer.uses_adapter_as_reference  # the base is the reference
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainer.train()
    after = dict(policy.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before if n not in trainable)  # the base stays
    assert any(not torch.equal(before[n], after[n]) for n in trainable if "lora_B" in n)  # B starts at zero


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from training_wizard.testing import build_tokenizer

    folder = tmp_path_factory.mktemp("tiny-reward-model")
    tokenizer = build_tokenizer()
    build_sequence_classifier(tokenizer, seed=3).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_reward_funcs_mix_a_function_and_a_reward_model_with_weights(tiny_model_dir, reward_model_dir, tmp_path):
    dataset = Dataset.from_list([{"prompt": f"Say something {i}."} for i in range(4)])
    config = GRPOConfig(output_dir=str(tmp_path), reward_weights=[1.0, 2.0],
                                **{**SMALL_GRPO, "max_steps": 1})
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[reward_length, str(reward_model_dir)],
                          args=config, train_dataset=dataset)
    model_reward = trainer.reward.functions()[reward_model_dir.name]
    # the reward model reads prompt + completion, as TRL's trainer gives it plain rows
    tokenizer = model_reward.spec.load()[1]
    ids = torch.tensor([tokenizer("Say something 0.abc")["input_ids"]])
    with torch.no_grad():
        expected = model_reward.spec.load()[0](input_ids=ids).logits[0, 0].item()
    assert model_reward(prompts=["Say something 0."], completions=["abc"]) == [pytest.approx(expected, abs=1e-5)]
    trainer.train()
    record = read_metrics(tmp_path)[0]
    by_model = record[f"rewards/{reward_model_dir.name}"]
    assert by_model != 0.0
    assert record["objective/scores"] == pytest.approx(record["rewards/reward_length"] + 2.0 * by_model, abs=1e-5)


def reward_length(completions, **kwargs):
    return [float(len(completion)) for completion in completions]


def test_model_object_and_model_init_kwargs(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # the tokenizer comes from its folder
    trainer = GRPOTrainer(model=model, reward_funcs=reward_length, train_dataset=math_dataset(),
                          args=GRPOConfig(output_dir=str(tmp_path), **SMALL_GRPO))
    assert trainer.unwrapped_policy is model and trainer.tokenizer.pad_token_id is not None
    config = GRPOConfig(output_dir=str(tmp_path), model_init_kwargs={"dtype": "bfloat16"}, **SMALL_GRPO)
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=reward_length, train_dataset=math_dataset(),
                          args=config)
    assert {p.dtype for p in trainer.unwrapped_policy.parameters()} == {torch.bfloat16}


REFUSED = {
    "optimizers": dict(optimizers=(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), None)),
    "quantization_config": dict(quantization_config=object()),
    "rollout_func": dict(rollout_func=lambda prompts, trainer: {}),
    "eval_dataset": dict(eval_dataset={"a": [{"prompt": "x"}]}),
    "model_init_kwargs": dict(args=GRPOConfig(model_init_kwargs={"quantization_config": {"load_in_4bit": 1}})),
    "args": dict(args=RLOOConfig()),
    "model and policy": dict(policy=torch.nn.Linear(1, 1)),
    "reward_funcs": dict(reward_funcs=None),
}


@pytest.mark.parametrize("name", REFUSED)
def test_unsupported_arguments_are_refused_in_one_line(tiny_model_dir, name):
    with pytest.raises(UserError) as raised:
        GRPOTrainer(**{"model": str(tiny_model_dir), "reward_funcs": reward_length, "train_dataset": math_dataset(),
                       **REFUSED[name]})
    message = str(raised.value)
    assert "\n" not in message
    expected_start = "quantization_config" if name == "model_init_kwargs" else name
    assert message.startswith(expected_start), message


def test_environment_factory_plays_episodes_scored_by_trl_form_rewards(tiny_model_dir, tokenizer, tmp_path):
    """TRL's environment_factory (public methods are tools, get_reward scores) with a TRL-form reward function
    that checks it gets the episode as TRL gives it (tests/unit/test_tool_episodes.py's scripted replies)."""
    from tests.unit.test_tool_episodes import Calculator, episode_shape, questions, scripted_replies
    from training_wizard.specs.episode import EpisodeSettings

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=episode_shape, environment_factory=Calculator,
                          train_dataset=Dataset.from_list(questions("good")),
                          args=GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                                          max_steps=1, max_completion_length=320, num_sample_generations=0,
                                          stop_token_ids=[end]),
                          episode_settings=EpisodeSettings(chat_template="hermes"),
                          generation_backend=scripted_replies(tokenizer))
    batch = trainer.collect_rollout()
    assert batch.components["episode_shape"] == [1.0, 1.0]


def test_the_older_arguments_build_the_same_trainer(tokenizer, tmp_path):
    """config=, tokenizer=, policy=, reward_model= still work, through the same constructor."""
    from training_wizard.testing import build_causal_lm

    policy = build_causal_lm(tokenizer)
    trainer = GRPOTrainer(config=GRPOConfig(output_dir=str(tmp_path), **SMALL_GRPO), tokenizer=tokenizer,
                          policy=policy, reward_model=lambda prompts, completions, **c: [1.0] * len(completions),
                          train_dataset=[{"prompt": "hi"}] * 4)
    assert trainer.unwrapped_policy is policy and trainer.callback_runner is None
    assert trainer.reward.compute_reward(["hi"], ["a"]) == [1.0]  # the seed-form callable, called positionally


def test_older_and_trl_arguments_mix_where_they_name_different_things(tokenizer, tmp_path):
    """policy= and tokenizer= with TRL's reward_funcs and peft_config: the policy set up as TRL's model would be."""
    from peft import LoraConfig, PeftModel

    from training_wizard.testing import build_causal_lm

    trainer = GRPOTrainer(config=GRPOConfig(output_dir=str(tmp_path), **SMALL_GRPO), tokenizer=tokenizer,
                          policy=build_causal_lm(tokenizer), reward_funcs=[reward_length],
                          peft_config=LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"),
                          train_dataset=math_dataset())
    assert isinstance(trainer.unwrapped_policy, PeftModel)
    assert list(trainer.reward.functions()) == ["reward_length"]


def test_a_reward_model_object_reads_conversations_through_its_tokenizers_template(reward_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from training_wizard.specs.reward_model_function import model_reward_function

    classifier = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    function = model_reward_function(classifier, tokenizer, None, False)  # reward_processing_classes' tokenizer
    prompt, completion = [{"role": "user", "content": "Hi"}], [{"role": "assistant", "content": "abc"}]
    text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    assert "<|im_start|>assistant" in text
    with torch.no_grad():
        expected = classifier(input_ids=torch.tensor([tokenizer(text)["input_ids"]])).logits[0, 0].item()
    assert function(prompts=[prompt], completions=[completion]) == [pytest.approx(expected, abs=1e-5)]
    assert function.__name__ == reward_model_dir.name


QUICK_START_RECIPES = {
    "grpo": """recipe_class = "grpo"
output_dir = "{out}"

[model]
pretrained_name = "{model}"      # "Qwen/Qwen2.5-0.5B-Instruct"

[dataset]
data_files = "{data}"            # trl-lib/DeepMath-103K's columns: prompt (conversational), solution

[reward]
reward_funcs = ["training_wizard.rewards:accuracy_reward"]

[training]
max_steps = 2
per_device_train_batch_size = 4
num_generations = 4
max_completion_length = 6
num_sample_generations = 0
""",
    "rloo": """recipe_class = "rloo"
output_dir = "{out}"

[model]
pretrained_name = "{model}"      # "Qwen/Qwen2-0.5B-Instruct"

[dataset]
data_files = "{data}"

[reward]
reward_funcs = ["tests.unit.test_trl_constructor:reward_num_unique_letters"]

[training]
max_steps = 8
per_device_train_batch_size = 4
max_completion_length = 6
num_sample_generations = 0
""",
}


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_the_quick_starts_as_recipes(algorithm, tiny_model_dir, tmp_path):
    """The same two quick starts as TOML recipes run by the CLI: the reward functions named in [reward], TRL's
    config keys in [training]; the same metrics as the Python scripts log."""
    import json

    from training_wizard.cli import main

    data = tmp_path / "data.jsonl"
    rows = math_dataset() if algorithm == "grpo" else [
        {"prompt": [{"role": "user", "content": f"Describe a {word}."}]} for word in ["cat", "tree", "boat", "moon"]]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = tmp_path / "quick_start.toml"
    recipe.write_text(QUICK_START_RECIPES[algorithm].format(out=tmp_path / "out", model=tiny_model_dir, data=data))
    assert main([str(recipe)]) == 0
    records = read_metrics(tmp_path / "out")
    assert len(records) == 2  # max_steps: 2 iterations (GRPO: 1 optimizer step each; RLOO: 4 each)
    if algorithm == "grpo":
        assert [r["rewards/accuracy_reward"] for r in records] == [0.0, 0.0]
    else:
        assert all(r["rewards/reward_num_unique_letters"] >= 1.0 for r in records)
    assert (tmp_path / "out" / "model" / "model.safetensors").is_file()


def test_a_recipe_s_reward_funcs_may_name_reward_models(tiny_model_dir, reward_model_dir, tmp_path, capsys):
    """As TRL's reward_funcs list takes a model id: an entry without ':' is a reward model folder, weighed and
    logged beside the functions; a name that is neither stops --dry-run with one line."""
    import json

    from training_wizard.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say something {i}."}) + "\n" for i in range(4)))
    text = QUICK_START_RECIPES["grpo"].format(out=tmp_path / "out", model=tiny_model_dir, data=data)
    text = text.replace('reward_funcs = ["training_wizard.rewards:accuracy_reward"]',
                        f'reward_funcs = ["tests.unit.test_trl_constructor:reward_length", "{reward_model_dir}"]\n'
                        "reward_weights = [1.0, 2.0]").replace("max_steps = 2", "max_steps = 1")
    recipe = tmp_path / "rm.toml"
    recipe.write_text(text)
    assert main([str(recipe)]) == 0
    record = read_metrics(tmp_path / "out")[0]
    by_model = record[f"rewards/{reward_model_dir.name}"]
    assert by_model != 0.0
    assert record["objective/scores"] == pytest.approx(record["rewards/reward_length"] + 2.0 * by_model, abs=1e-5)
    recipe.write_text(text.replace(str(reward_model_dir), str(tmp_path / "no-such-model")))
    capsys.readouterr()
    assert main([str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is neither 'package.module:function' nor a reward model folder" in err
