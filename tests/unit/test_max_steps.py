"""max_steps (TRL's count of optimizer steps). On-policy trainers: the run ends at the iteration that reaches it,
and the plan's episodes are that many iterations' worth. SFT and reward models: exactly that many steps."""

import pytest

from tests.helpers import make_grpo_trainer, make_ppo_trainer, make_rloo_trainer
from training_wizard.errors import UserError
from training_wizard.trl.configs import GRPOConfig, PPOConfig, RLOOConfig


def count_steps(trainer) -> list[int]:
    steps = []
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # under accelerate's wrapper
    optimizer.register_step_pre_hook(lambda *_: steps.append(1))
    return steps


@pytest.mark.parametrize("make, options, steps_per_iteration", [
    (make_rloo_trainer, dict(num_ppo_epochs=2, num_mini_batches=2, per_device_train_batch_size=4), 4),
    (make_ppo_trainer, dict(num_ppo_epochs=1, num_mini_batches=2, per_device_train_batch_size=4), 2),
    (make_grpo_trainer, dict(num_ppo_epochs=1, steps_per_generation=2, per_device_train_batch_size=4), 2),
], ids=["rloo", "ppo", "grpo"])
def test_max_steps_runs_exactly_that_many_optimizer_steps(make, options, steps_per_iteration, tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, max_steps=3 * steps_per_iteration, total_episodes=None, **options)
    assert trainer.plan.num_iterations == 3
    assert trainer.plan.total_episodes == 3 * trainer.plan.batch_size
    steps = count_steps(trainer)
    trainer.train()
    assert len(steps) == 3 * steps_per_iteration


def test_max_steps_rounds_up_to_whole_iterations_and_refuses_total_episodes():
    config = RLOOConfig(output_dir="x", max_steps=5, num_ppo_epochs=2, num_mini_batches=1,
                        per_device_train_batch_size=4, rloo_k=2)
    plan = config.batch_plan(1, 100)
    assert plan.num_iterations == 3 and plan.total_episodes == 12  # ceil(5 / 2) iterations of 4 completions
    assert PPOConfig(output_dir="x", max_steps=8, num_ppo_epochs=4).batch_plan(1, 100).num_iterations == 2
    grpo = GRPOConfig(output_dir="x", max_steps=6, num_iterations=2, steps_per_generation=3, num_generations=2,
                      per_device_train_batch_size=2)
    assert grpo.batch_plan(1, 100).num_iterations == 1  # TRL's names: 2 passes x 3 steps per generation
    with pytest.raises(UserError, match="set max_steps .* or total_episodes .*, not both"):
        RLOOConfig(output_dir="x", max_steps=5, total_episodes=64).batch_plan(1, 100)


def make_sft_trainer(tokenizer, tmp_path, **options):
    from training_wizard.testing import build_causal_lm
    from training_wizard.trainers.supervised.config import SFTConfig
    from training_wizard.trainers.supervised.sft import SFTTrainer, encode_sft_row

    config = SFTConfig(output_dir=str(tmp_path), **options)
    rows = [encode_sft_row({"prompt": f"Say {i}:", "completion": "a b"}, tokenizer, config) for i in range(10)]
    return SFTTrainer(config=config, tokenizer=tokenizer, model=build_causal_lm(tokenizer), train_rows=rows)


def make_reward_trainer(tokenizer, tmp_path, **options):
    from training_wizard.testing import build_sequence_classifier
    from training_wizard.trainers.supervised.config import RewardConfig
    from training_wizard.trainers.supervised.reward_model import RewardModelTrainer, encode_pairs

    config = RewardConfig(output_dir=str(tmp_path), **options)
    pairs, _ = encode_pairs([{"prompt": f"Say {i}:", "chosen": "yes", "rejected": "no"} for i in range(10)],
                            tokenizer, config)
    return RewardModelTrainer(config=config, tokenizer=tokenizer, model=build_sequence_classifier(tokenizer),
                              train_rows=pairs)


@pytest.mark.parametrize("make", [make_sft_trainer, make_reward_trainer], ids=["sft", "reward_model"])
def test_supervised_max_steps_runs_exactly_that_many_optimizer_steps(make, tokenizer, tmp_path):
    # 10 rows, 4 per step (2 x 2 accumulated): 3 epochs would be 8 steps; max_steps = 5 overrides the epochs and
    # crosses an epoch boundary
    trainer = make(tokenizer, tmp_path, max_steps=5, num_train_epochs=3.0, per_device_train_batch_size=2,
                   gradient_accumulation_steps=2)
    assert trainer.plan.num_steps == 5
    steps = count_steps(trainer)
    trainer.train()
    assert len(steps) == 5 and trainer.state.iteration == 5
    # TRL's -1 (not set) leaves the epochs to decide, on the on-policy configs as in TRL
    assert RLOOConfig(output_dir="x", max_steps=-1).max_steps is None


def test_num_train_epochs_counts_passes_over_the_prompts_as_trl_does():
    """Without total_episodes or max_steps: each epoch gives every prompt its group of completions (TRL 1.x)."""
    rloo = RLOOConfig(output_dir="x", rloo_k=2, per_device_train_batch_size=4, num_train_epochs=2.0)
    plan = rloo.batch_plan(1, 6)
    assert plan.total_episodes == 2 * 6 * 2 and plan.num_iterations * plan.prompts_per_iteration == 12
    grpo = GRPOConfig(output_dir="x", num_generations=4, per_device_train_batch_size=4, num_train_epochs=1.0)
    assert grpo.batch_plan(1, 5).num_iterations == 5  # one prompt per iteration, each prompt once
    assert PPOConfig(output_dir="x", per_device_train_batch_size=3).batch_plan(1, 6).num_iterations == 2
