"""A teacher beside RLOO, PPO and GRPO (trainers/loop/teacher.py, `distillation_coef`): each row's score carries
-coef x its summed k1 reverse KL to the teacher over its loss tokens, environment tokens never count, a teacher
equal to the policy changes nothing, and a recipe names it in [teacher_model]."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from training_wizard.cli import main
from training_wizard.errors import UserError
from training_wizard.testing import build_causal_lm
from training_wizard.trainers.loop.iteration_metrics import IterationMetrics
from training_wizard.trainers.loop.teacher import TEACHER_LOGPROBS, with_distillation_reward
from training_wizard.trainers.loop.update import UpdateResult

from tests.helpers import GRPO_DEFAULTS, TRAINER_DEFAULTS, prompts, write_episode_recipe, x_share
from tests.unit.test_loss_mask import WALL_CLOCK, on_a_grid, with_environment_tokens

TRAINERS = {"rloo": ("RLOOTrainer", "RLOOConfig", {}), "ppo": ("PPOTrainer", "PPOConfig", {}),
            "grpo": ("GRPOTrainer", "GRPOConfig", GRPO_DEFAULTS)}


def make(kind, tokenizer, output_dir, policy=None, teacher_model=None, **options):
    """A trainer of `kind` as tests/helpers.py's factories make it, with a teacher."""
    import training_wizard

    trainer_name, config_name, defaults = TRAINERS[kind]
    config = getattr(training_wizard, config_name)(**{"output_dir": str(output_dir), **TRAINER_DEFAULTS,
                                                     **defaults, **options})
    return getattr(training_wizard, trainer_name)(
        config=config, tokenizer=tokenizer, policy=policy if policy is not None else build_causal_lm(tokenizer),
        reward_model=x_share, train_dataset=prompts(), teacher_model=teacher_model)


@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_the_teacher_term_enters_each_score_over_loss_tokens_only(kind, tokenizer, tmp_path):
    trainer = make(kind, tokenizer, tmp_path, teacher_model=build_causal_lm(tokenizer, seed=9),
                           distillation_coef=0.5, total_episodes=8, per_device_train_batch_size=8)
    rollout = on_a_grid(trainer.collect_rollout())
    teacher = rollout.extras[TEACHER_LOGPROBS]
    assert teacher.shape == rollout.logprobs.shape and (teacher[rollout.loss_mask] < 0).all()
    by_hand = [float(rollout.scores[row]) - 0.5 * sum(
        float(rollout.logprobs[row, t] - teacher[row, t]) for t in range(rollout.loss_mask.shape[1])
        if rollout.loss_mask[row, t]) for row in range(rollout.num_rows)]
    assert with_distillation_reward(rollout, 0.5).scores.tolist() == pytest.approx(by_hand, abs=1e-5)
    assert with_distillation_reward(rollout, 0.0) is rollout

    mixed = with_environment_tokens(rollout)  # garbage logprobs and teacher logprobs outside the loss mask
    assert torch.equal(with_distillation_reward(mixed, 0.5).scores, with_distillation_reward(rollout, 0.5).scores)

    def metrics(batch):
        shaped = trainer.shape_rewards(with_distillation_reward(batch, 0.5))
        logged = IterationMetrics.of(trainer, batch, shaped, UpdateResult(), eps=1.0, lr=0.0, update_seconds=0.0)
        return {k: v for k, v in logged.values.items() if not k.startswith(WALL_CLOCK)}

    logged = metrics(rollout)
    assert metrics(mixed) == logged
    mask = rollout.loss_mask
    assert logged["distill/reverse_kl"] == pytest.approx(float((rollout.logprobs - teacher)[mask].mean()), abs=1e-6)
    assert logged["distill/teacher_logprob"] == pytest.approx(float(teacher[mask].mean()), abs=1e-6)
    assert logged["distill/student_logprob"] == pytest.approx(float(rollout.logprobs[mask].mean()), abs=1e-6)


def test_a_teacher_equal_to_the_policy_changes_no_number(tokenizer, tmp_path):
    """The policy's own weights as teacher: every k1 is exactly 0 (the same pass twice), so the run logs what the
    run without a teacher logs, plus distill/* (reverse KL 0)."""
    runs = []
    for name, extra in (("plain", {}), ("teacher", {"distillation_coef": 1.0})):
        policy = build_causal_lm(tokenizer, seed=1)
        if extra:
            extra["teacher_model"] = copy.deepcopy(policy)
        trainer = make("rloo", tokenizer, tmp_path / name, policy=policy, logprobs_from_sampling=False, **extra)
        trainer.train()
        runs.append([json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    for plain, taught in zip(*runs):
        assert taught.pop("distill/reverse_kl") == 0.0
        assert taught.pop("distill/teacher_logprob") == taught.pop("distill/student_logprob")
        keep = [key for key in plain if not key.startswith(WALL_CLOCK)]
        assert {key: taught[key] for key in keep} == {key: plain[key] for key in keep}
        assert set(taught) == set(plain)


def test_a_coefficient_without_a_teacher_is_refused(tokenizer, tmp_path):
    with pytest.raises(UserError, match="teacher_model: required with training.distillation_coef > 0"):
        make("grpo", tokenizer, tmp_path, distillation_coef=0.1)


TEACHER_TABLE = '[teacher_model]\npretrained_name = "{teacher}"\n\n[reward]\nspec_class = ' \
    '"training_wizard.specs.reward.FunctionRewardSpec"\nfunction = "tests.helpers:distinct"\n'


@pytest.mark.parametrize("training,message", [
    ("opd_kl_coef = 0.2", None),
    ("", "given, but training.distillation_coef is 0"),
])
def test_a_grpo_recipe_names_its_teacher(tiny_model_dir, tmp_path, capsys, training, message):
    teacher = tmp_path / "teacher"
    from training_wizard.testing import save_tiny_model

    save_tiny_model(teacher, seed=4)
    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Say hi.", "Count to three."],
                                  TEACHER_TABLE.format(teacher=teacher), training=f"response_length = 6\n{training}")
    code = main([str(recipe)])
    if message is not None:
        assert code == 2 and message in capsys.readouterr().err
        return
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert all(record["distill/reverse_kl"] != 0.0 for record in records)
    assert all(record["objective/rlhf_reward"] != record["objective/scores"] for record in records)
