"""On-policy distillation on the shared loop (trainers/algorithms/distill.py): environment tokens carry no loss, a
teacher equal to the student gives zero divergence and full agreement, the step's reduction is independent of
the accumulation split, and training moves the student toward the teacher."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from training_wizard.core.logprobs import logprobs_and_entropy
from training_wizard.errors import UserError
from training_wizard.testing import build_causal_lm, build_tokenizer
from training_wizard.trainers.algorithms.distill import (
    TEACHER_LOGPROBS, DistillationTrainer, TeacherForward, distillation_loss,
)
from training_wizard.trainers.config.distill import DistillationConfig
from training_wizard.trainers.loop.iteration_metrics import IterationMetrics
from training_wizard.trainers.loop.update import PolicyForward, UpdateResult

from tests.helpers import prompts
from tests.unit.test_loss_mask import AT, INSERTED, WALL_CLOCK, drop_inserted, on_a_grid, with_environment_tokens

FORMS = ["jsd", "sampled_k1", "sampled_k3"]


def make(tokenizer, tmp_path, teacher=None, policy=None, **overrides) -> DistillationTrainer:
    options = {**dict(output_dir=str(tmp_path), per_device_train_batch_size=8, total_episodes=8, response_length=6,
                      num_sample_generations=0, seed=3, learning_rate=1e-3), **overrides}
    policy = policy if policy is not None else build_causal_lm(tokenizer, seed=1)
    teacher = teacher if teacher is not None else build_causal_lm(tokenizer, seed=2)
    return DistillationTrainer(config=DistillationConfig(**options), tokenizer=tokenizer, policy=policy,
                               teacher_model=teacher, train_dataset=prompts(8))


def insert_columns(values: torch.Tensor, filler: float) -> torch.Tensor:
    """(B, T, V) -> (B, T + INSERTED, V): `filler` positions at AT, as `insert` does for (B, T)."""
    middle = torch.full((values.shape[0], INSERTED, values.shape[2]), filler, dtype=values.dtype)
    return torch.cat([values[:, :AT], middle, values[:, AT:]], dim=1)


def rows_and_shaped(batch, shaped):
    index = torch.arange(batch.num_rows)
    rows = batch.rows(index)
    width = rows.pop("width")
    shaped_rows = {name: value[index, :width] if value.dim() == 2 else value[index]
                   for name, value in vars(shaped).items() if isinstance(value, torch.Tensor)}
    return rows, shaped_rows


@pytest.mark.parametrize("form", FORMS)
def test_environment_tokens_carry_no_distillation_loss(form, tokenizer, tmp_path):
    """The loss-mask test of RLOO, PPO and GRPO (tests/unit/test_loss_mask.py) for distillation: two environment
    tokens in the middle of every completion, with garbage logprobs and logits, change no advantage, metric, loss
    or statistic, and get no gradient."""
    trainer = make(tokenizer, tmp_path, distillation_loss=form, beta=0.5)
    compact = on_a_grid(trainer.collect_rollout())
    assert compact.loss_mask[:, :AT + 1].all()
    if form != "jsd":
        assert TEACHER_LOGPROBS in compact.extras
    mixed = with_environment_tokens(compact)

    compact_shaped, mixed_shaped = trainer.shape_rewards(compact), trainer.shape_rewards(mixed)
    for name, value in vars(compact_shaped).items():
        other = getattr(mixed_shaped, name)
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            assert not other[:, AT:AT + INSERTED].any(), name
            other = drop_inserted(other)
        if isinstance(value, torch.Tensor):
            assert torch.equal(other, value), name

    def metrics(batch, shaped):
        logged = IterationMetrics.of(trainer, batch, shaped, UpdateResult(), eps=1.0, lr=0.0, update_seconds=0.0)
        return {k: v for k, v in logged.values.items() if not k.startswith(WALL_CLOCK)}

    assert metrics(mixed, mixed_shaped) == metrics(compact, compact_shaped)

    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    student = torch.randn(compact.num_rows, compact.completion_ids.shape[1], vocab, generator=generator)
    teacher = torch.randn(student.shape, generator=generator)
    results = []
    for batch, shaped in ((compact, compact_shaped), (mixed, mixed_shaped)):
        rows, shaped_rows = rows_and_shaped(batch, shaped)
        width = rows["loss_mask"].shape[1]
        spread = insert_columns if batch is mixed else (lambda values, _: values)
        logits = spread(student, 1e3)[:, :width].clone().requires_grad_()  # garbage logits in the new columns
        teacher_logits = spread(teacher, -1e3)[:, :width]
        token = logprobs_and_entropy(logits, rows["completion_ids"], trainer.config.temperature)
        if form == "jsd":
            forward = TeacherForward(token, token.logprobs.detach(), None, student_logits=logits,
                                     teacher_logits=teacher_logits)
        else:
            forward = PolicyForward(token, rows["logprobs"], None)
        step = trainer.optimizer_step_totals(SimpleNamespace(loss_mask=shaped_rows["loss_mask"]),
                                             torch.arange(batch.num_rows))[0]
        out = distillation_loss(rows, shaped_rows, forward, step, trainer.config)
        out.loss.backward()
        results.append((float(out.loss.detach()), {k: float(v) for k, v in out.stats.items()}, logits.grad))
    (loss, stats, grad), (mixed_loss, mixed_stats, mixed_grad) = results
    assert mixed_loss == loss and mixed_stats == stats
    assert (mixed_grad[:, AT:AT + INSERTED] == 0).all()
    assert torch.equal(torch.cat([mixed_grad[:, :AT], mixed_grad[:, AT + INSERTED:]], 1), grad)
    assert grad.abs().sum() > 0
    assert {"distill/divergence", "distill/teacher_logprob", "distill/student_logprob"} <= set(stats)
    assert ("distill/agreement" in stats) == (form == "jsd")


@pytest.mark.parametrize("form", FORMS)
def test_a_teacher_equal_to_the_student_gives_zero_divergence(form, tokenizer, tmp_path):
    """Teacher = the student's own weights: the divergence is 0, the teacher's logprobs are the student's and the
    argmax always agrees (the first iteration, before the update: AdamW turns the rounding-sized gradient of an
    exact 0 into a step of the learning rate's size)."""
    policy = build_causal_lm(tokenizer, seed=1)
    trainer = make(tokenizer, tmp_path, teacher=copy.deepcopy(policy), policy=policy, distillation_loss=form,
                   logprobs_from_sampling=False)
    trainer.train()
    (record,) = trainer_metrics(tmp_path)
    assert record["distill/divergence"] == pytest.approx(0.0, abs=1e-7)
    assert record["distill/teacher_logprob"] == pytest.approx(record["distill/student_logprob"], abs=1e-6)
    assert record["distill/student_logprob"] < -1.0  # a random model's sampled tokens: far from certain
    if form == "jsd":
        assert record["distill/agreement"] == 1.0
    else:
        assert record["objective/non_score_reward"] == 0.0  # the same pass twice: every estimate exactly 0


def trainer_metrics(folder) -> list[dict]:
    import json

    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("form", ["jsd", "sampled_k3"])
def test_the_step_gradient_is_independent_of_the_accumulation_split(form, tokenizer, tmp_path):
    """TRL's reduction: the step's token sum over its token count. One micro-batch of 8 and two of 4 accumulated
    train the same weights."""
    weights = []
    for index, (batch, accumulation) in enumerate(((8, 1), (4, 2))):
        trainer = make(tokenizer, tmp_path / str(index), distillation_loss=form, beta=0.5,
                       per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, response_length=8)
        trainer.train()
        weights.append(trainer.unwrapped_policy.state_dict())
    moved = 0.0
    start = build_causal_lm(tokenizer, seed=1).state_dict()
    for name, value in weights[0].items():
        assert torch.allclose(value, weights[1][name], atol=1e-6), name
        moved = max(moved, float((value - start[name]).abs().max()))
    assert moved > 1e-4  # the update did train


def test_training_moves_the_student_toward_the_teacher(tokenizer, tmp_path):
    """Ten iterations of the JSD at a high learning rate lower the divergence on the same prompts."""
    trainer = make(tokenizer, tmp_path, total_episodes=80, learning_rate=3e-3, beta=0.5)
    trainer.train()
    divergences = [record["distill/divergence"] for record in trainer_metrics(tmp_path)]
    assert len(divergences) == 10
    assert divergences[-1] < 0.5 * divergences[0] and max(divergences[-3:]) < min(divergences[:3])


def test_a_teacher_of_another_vocabulary_is_refused_in_one_line(tmp_path):
    student_tokenizer = build_tokenizer()
    teacher = build_causal_lm(build_tokenizer(300))
    with pytest.raises(UserError, match=r"teacher_model: its vocabulary has \d+ tokens, the student's \(model\)"):
        make(student_tokenizer, tmp_path, teacher=teacher)


def test_config_reads_trl_names_and_refuses_a_reference_kl():
    from training_wizard.trl.configs import DistillationConfig as TRLDistillationConfig

    config = TRLDistillationConfig(beta=0.0, max_completion_length=32, temperature=0.9, report_to="none")
    assert (config.beta, config.kl_coef, config.response_length, config.temperature) == (0.0, 0.0, 32, 0.9)
    assert config.group_size() == 1 and not config.uses_reference and config.sampled_estimator is None
    assert DistillationConfig(distillation_loss="sampled_k3").sampled_estimator == "k3"
    with pytest.raises(ValueError, match="beta"):
        DistillationConfig(beta=1.5)
    with pytest.raises(ValueError, match="kl_coef"):
        DistillationConfig(kl_coef=0.1)
