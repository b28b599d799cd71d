"""Pieces several test files share: reward functions a tiny model can learn, prompt lists, one trainer factory per
online algorithm, and the small CLI run the smoke tests start from.

The factories hold the settings most trainer tests start from; a test file whose trainers differ passes its own
numbers as keyword arguments, which replace these.
"""

from __future__ import annotations

import json
from pathlib import Path

from training_wizard import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer
from training_wizard.testing import build_causal_lm

# --------------------------------------------------------------------------------------------------------------
# Rewards and prompts


def x_share(prompts, completions, **columns):
    """Share of characters that are 'x': a reward a tiny model can learn in seconds."""
    return [sum(ch == "x" for ch in c) / max(1, len(c)) for c in completions]


def offset_x_share(prompts, completions, **columns):
    """x_share plus 1: PPO's value model (its head starts at zero) has a baseline of 1 to learn."""
    return [1.0 + share for share in x_share(prompts, completions)]


def distinct(prompts, completions, **columns):
    """Number of distinct characters: scores that differ between completions from the first iteration on."""
    return [float(len(set(c))) for c in completions]


def prompts(n: int = 16, text: str = "Write something {i}.") -> list[dict]:
    return [{"prompt": text.format(i=i)} for i in range(n)]


# --------------------------------------------------------------------------------------------------------------
# Trainers

# The run most trainer tests start from: two iterations of one batch of 8, short completions, no sample tables.
TRAINER_DEFAULTS = dict(per_device_train_batch_size=8, total_episodes=16, response_length=6,
                        num_sample_generations=0, learning_rate=1e-3)
GRPO_DEFAULTS = dict(
    num_generations=4,
    # the separate old-logprob pass: the tests' stand-in samplers give no real logprobs, and a first KL of
    # exactly 0 needs the policy's and the reference's numbers from one kind of pass
    logprobs_from_sampling=False,
)


def _make(trainer_class, config_class, defaults, tokenizer, output_dir, reward, policy, dataset, trainer_args,
          options):
    config = config_class(**{"output_dir": str(output_dir), **TRAINER_DEFAULTS, **defaults, **options})
    # The policy is built after the config, as the tests built it before they shared this factory.
    policy = policy if policy is not None else build_causal_lm(tokenizer)
    return trainer_class(config=config, tokenizer=tokenizer, policy=policy, reward_model=reward,
                         train_dataset=dataset if dataset is not None else prompts(), **trainer_args)


def make_rloo_trainer(tokenizer, output_dir, reward=x_share, policy=None, dataset=None, backend=None,
                      accelerator=None, **options):
    """An RLOOTrainer on `dataset` (16 prompts by default) with a fresh tiny policy unless one is given; `options`
    are RLOOConfig settings."""
    return _make(RLOOTrainer, RLOOConfig, {}, tokenizer, output_dir, reward, policy, dataset,
                 dict(generation_backend=backend, accelerator=accelerator), options)


def make_ppo_trainer(tokenizer, output_dir, reward=offset_x_share, policy=None, dataset=None, backend=None,
                     value_model=None, **options):
    """A PPOTrainer as make_rloo_trainer; without `value_model` PPO starts its own."""
    return _make(PPOTrainer, PPOConfig, {}, tokenizer, output_dir, reward, policy, dataset,
                 dict(generation_backend=backend, value_model=value_model), options)


def make_grpo_trainer(tokenizer, output_dir, reward=distinct, policy=None, dataset=None, backend=None, **options):
    """A GRPOTrainer as make_rloo_trainer, 4 completions per prompt and the separate old-logprob pass."""
    return _make(GRPOTrainer, GRPOConfig, GRPO_DEFAULTS, tokenizer, output_dir, reward, policy, dataset,
                 dict(generation_backend=backend), options)


def with_logprobs(tokens):
    """A sampler's output for fixed tokens, for scripted_backend (the zero logprobs are unused unless
    logprobs_from_sampling is set)."""
    import torch

    from training_wizard.rollout.generation import Generated

    return Generated(tokens, torch.zeros(tokens.shape))


# --------------------------------------------------------------------------------------------------------------
# A whole run through the CLI

RUN_RECIPE = """\
recipe_class = "rloo"
output_dir = "{out}"

[model]
pretrained_name = "{model}"
{lora}

[dataset]
data_files = "prompts.jsonl"

[eval_dataset]
data_files = "prompts.jsonl"
take = 2

[reward]
spec_class = "training_wizard.specs.reward.MultiRewardSpec"
[reward.components.length]
spec = {{ spec_class = "training_wizard.specs.reward.FunctionRewardSpec", function = "run_rewards:length" }}
[reward.components.vowels]
weight = 2.0
spec = {{ spec_class = "training_wizard.specs.reward.FunctionRewardSpec", function = "run_rewards:vowels" }}

[training]
per_device_train_batch_size = 4
total_episodes = 16
response_length = 6
num_ppo_epochs = 1
num_sample_generations = 2
eval_steps = 2
learning_rate = 1e-3
"""

RUN_REWARDS = """
def length(prompts, completions, **columns):
    return [float(len(c)) / 10 for c in completions]

def vowels(prompts, completions, topic, **columns):
    assert len(topic) == len(completions)  # row columns reach the reward
    return [float(sum(ch in "aeiou" for ch in c)) for c in completions]
"""


def write_run_recipe(folder: Path, model_dir: Path, lora: str = "") -> Path:
    """Write an RLOO recipe with two function rewards, its 4 prompts and its reward module into `folder`; the run
    writes to folder/out. `lora`: a line for the [model] table."""
    (folder / "prompts.jsonl").write_text(
        "\n".join(json.dumps({"prompt": f"Tell me about {t}.", "topic": t}) for t in ["owls", "ice", "sand", "oak"])
    )
    (folder / "run_rewards.py").write_text(RUN_REWARDS)
    recipe = folder / "recipe.toml"
    recipe.write_text(RUN_RECIPE.format(out=folder / "out", model=model_dir, lora=lora))
    return recipe


def run_recipe(folder: Path, model_dir: Path, lora: str = "", extra=()) -> int:
    """Write write_run_recipe's files and run the recipe through the CLI with the `extra` arguments; the exit code."""
    from training_wizard.cli import main

    return main([str(write_run_recipe(folder, model_dir, lora)), *extra])


# --------------------------------------------------------------------------------------------------------------
# A GRPO run with an [environment] table

GRPO_RECIPE_HEAD = """\
recipe_class = "grpo"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
"""

EPISODE_RECIPE = GRPO_RECIPE_HEAD + """
{tables}

[training]
num_generations = 2
per_device_train_batch_size = 4
total_episodes = 8
num_sample_generations = 0
{training}
"""


def write_episode_recipe(folder: Path, model_dir: Path, prompts: list[str], tables: str, training: str = "") -> Path:
    """A GRPO recipe of 2 iterations over conversational `prompts` (written beside it) with the given tables (an
    [environment], a [reward]) and more [training] lines; the run writes to folder/out."""
    data = folder / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": text}]}) for text in prompts))
    recipe = folder / "recipe.toml"
    recipe.write_text(EPISODE_RECIPE.format(out=folder / "out", model=model_dir, data=data, tables=tables,
                                            training=training))
    return recipe
