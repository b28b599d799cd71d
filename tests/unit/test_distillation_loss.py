"""The on-policy distillation loss (training_wizard.core.distillation) equals TRL 1.16 DistillationTrainer's.

tests/fixtures/trl_distill.json holds what TRL's own `_chunked_divergence_loss` gave, with its gradients, on seeded
tensors (written by scripts/trl_distill_fixture.py with TRL installed); TRL itself is not needed here. The tests
also check the loss against the formula written out, the sampled-token estimates against the closed-form KL by
exact enumeration of a toy vocabulary, the mask, and the chunked computation.
"""

import json
from pathlib import Path

import pytest
import torch

from training_wizard.core.distillation import (
    agreement,
    generalized_jsd,
    sampled_token_reverse_kl,
    top_k_teacher_logprobs,
)

FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "trl_distill.json").read_text())
INPUTS = {name: torch.tensor(values) for name, values in FIXTURE["inputs"].items()}
TOLERANCE = 1e-6


def case_id(case: dict) -> str:
    return f"beta{case['beta']}-temperature{case['temperature']}"


def assert_close(actual: torch.Tensor, expected, atol: float = TOLERANCE) -> None:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert (actual - expected).abs().max().item() <= atol


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=case_id)
def test_loss_and_gradients_equal_trl(case):
    student_hidden = INPUTS["student_hidden"].clone().requires_grad_(True)
    student_weight = INPUTS["student_weight"].clone().requires_grad_(True)
    student_logits = student_hidden @ student_weight.T
    teacher_logits = INPUTS["teacher_hidden"] @ INPUTS["teacher_weight"].T
    mask = INPUTS["mask"].bool()
    terms = generalized_jsd(student_logits, teacher_logits, mask, case["beta"], case["temperature"])
    loss = terms.loss()
    loss.backward()
    assert_close(loss.detach(), case["loss"])
    assert_close(terms.loss(FIXTURE["num_items_in_batch"]).detach(), case["loss_num_items"])
    # A metric summed over the tokens, each within float32 rounding of TRL's (which folds it from running sums).
    assert_close(terms.entropy.sum(), case["entropy_sum"], atol=TOLERANCE * case["n_valid"])
    assert terms.num_tokens.item() == case["n_valid"]
    assert_close(student_hidden.grad, case["grad_student_hidden"])
    assert_close(student_weight.grad, case["grad_student_weight"])

    leaf_logits = student_logits.detach().requires_grad_(True)
    generalized_jsd(leaf_logits, teacher_logits, mask, case["beta"], case["temperature"]).loss().backward()
    assert_close(leaf_logits.grad, case["grad_student_logits"])


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) summed over the vocabulary (last dimension)."""
    return (p * (p.log() - q.log())).sum(-1)


def written_out_loss(student_logits, teacher_logits, beta, temperature):
    """TRL's generalized JSD from its definition, in float64: mixture m = beta * p_t + (1 - beta) * p_s."""
    p_student = torch.softmax(student_logits.double() / temperature, dim=-1)
    p_teacher = torch.softmax(teacher_logits.double() / temperature, dim=-1)
    if beta == 0:
        return kl(p_teacher, p_student)
    if beta == 1:
        return kl(p_student, p_teacher)
    mixture = beta * p_teacher + (1 - beta) * p_student
    return beta * kl(p_teacher, mixture) + (1 - beta) * kl(p_student, mixture)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_equals_the_formula_written_out(beta, temperature):
    generator = torch.Generator().manual_seed(7)
    student_logits = (torch.randn(3, 4, 9, generator=generator) * 2).requires_grad_(True)
    teacher_logits = torch.randn(3, 4, 9, generator=generator) * 2
    mask = torch.rand(3, 4, generator=generator) > 0.3
    terms = generalized_jsd(student_logits, teacher_logits, mask, beta, temperature)
    expected = written_out_loss(student_logits, teacher_logits, beta, temperature)
    assert_close(terms.per_token.detach().double(), torch.where(mask, expected, 0.0).detach())
    (grad,) = torch.autograd.grad(terms.loss(), student_logits)
    expected_loss = (expected * mask).sum() / mask.sum()
    (expected_grad,) = torch.autograd.grad(expected_loss, student_logits)
    assert_close(grad.double(), expected_grad)
    p_student = torch.softmax(student_logits.detach().double() / temperature, dim=-1)
    entropy = -(p_student * p_student.log()).sum(-1)
    assert_close(terms.entropy.double(), torch.where(mask, entropy, 0.0))


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_sampled_token_form_has_the_closed_form_kl_as_its_expectation(estimator):
    """Every token of a toy vocabulary as the sampled token, weighted by the student's probability of sampling it:
    the exact expectation under y ~ p_s, without Monte-Carlo noise."""
    student_logits = torch.tensor([2.0, 0.5, -1.0, 0.0, 1.5, -3.0], dtype=torch.float64)
    teacher_logits = torch.tensor([0.5, 1.0, 0.0, -2.0, 2.5, 1.0], dtype=torch.float64)
    student_logprobs = torch.log_softmax(student_logits, dim=-1)
    teacher_logprobs = torch.log_softmax(teacher_logits, dim=-1)
    every_token = torch.ones(1, 6, dtype=torch.bool)
    estimates = sampled_token_reverse_kl(student_logprobs[None], teacher_logprobs[None], every_token, estimator)
    expectation = (student_logprobs.exp() * estimates[0]).sum()
    closed_form = kl(student_logprobs.exp(), teacher_logprobs.exp())
    assert abs(expectation.item() - closed_form.item()) < 1e-12
    reverse_kl = generalized_jsd(student_logits[None, None], teacher_logits[None, None], every_token[:, :1], beta=1.0)
    assert abs(reverse_kl.per_token.item() - closed_form.item()) < TOLERANCE
    if estimator == "k3":
        assert (estimates >= 0).all()


def test_sampled_token_form_is_zero_outside_the_mask_and_rejects_unknown_estimators():
    student_logprobs = torch.tensor([[-1.0, -2.0, -0.5]])
    teacher_logprobs = torch.tensor([[-1.5, -0.5, -3.0]])
    mask = torch.tensor([[True, False, True]])
    k1 = sampled_token_reverse_kl(student_logprobs, teacher_logprobs, mask)
    assert torch.equal(k1, torch.tensor([[0.5, 0.0, 2.5]]))
    k3 = sampled_token_reverse_kl(student_logprobs, teacher_logprobs, mask, estimator="k3")
    assert torch.allclose(k3, torch.tensor([[torch.tensor(-0.5).exp() - 1 + 0.5, 0.0, torch.tensor(-2.5).exp() + 1.5]]))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        sampled_token_reverse_kl(student_logprobs, teacher_logprobs, mask, estimator="k2")


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_tokens_outside_the_mask_carry_no_loss_and_no_gradient(beta):
    """Environment tokens inserted between the completion's tokens change neither the loss nor its gradient."""
    generator = torch.Generator().manual_seed(3)
    student_logits = torch.randn(2, 4, 11, generator=generator)
    teacher_logits = torch.randn(2, 4, 11, generator=generator)
    mask = torch.tensor([[True, True, False, True], [True, True, True, True]])
    inserted_at = [1, 3, 4]  # positions of the environment tokens in the longer sequence
    kept_at = [0, 2, 5, 6]
    longer_student = torch.randn(2, 7, 11, generator=generator) * 1e4
    longer_teacher = torch.randn(2, 7, 11, generator=generator) * 1e4
    longer_student[:, kept_at], longer_teacher[:, kept_at] = student_logits, teacher_logits
    longer_mask = torch.zeros(2, 7, dtype=torch.bool)
    longer_mask[:, kept_at] = mask

    student_logits.requires_grad_(True)
    longer_student.requires_grad_(True)
    loss = generalized_jsd(student_logits, teacher_logits, mask, beta).loss()
    longer_loss = generalized_jsd(longer_student, longer_teacher, longer_mask, beta).loss()
    loss.backward()
    longer_loss.backward()
    assert torch.equal(loss, longer_loss)
    assert torch.equal(longer_student.grad[:, inserted_at], torch.zeros(2, 3, 11))
    assert torch.equal(longer_student.grad[:, kept_at], student_logits.grad)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("chunk_rows", [1, 2, 5, 100])
def test_chunked_equals_unchunked_exactly(beta, chunk_rows):
    generator = torch.Generator().manual_seed(11)
    teacher_logits = torch.randn(3, 4, 13, generator=generator)
    mask = torch.rand(3, 4, generator=generator) > 0.25
    results = []
    for rows in (None, chunk_rows):
        student_logits = torch.randn(3, 4, 13, generator=torch.Generator().manual_seed(5)).requires_grad_(True)
        terms = generalized_jsd(student_logits, teacher_logits, mask, beta, temperature=0.8, chunk_rows=rows)
        terms.loss().backward()
        results.append((terms.per_token.detach(), terms.entropy, student_logits.grad))
    for unchunked, chunked in zip(*results):
        assert torch.equal(unchunked, chunked)


def test_an_empty_mask_gives_zero_loss_and_zero_gradient():
    student_logits = torch.randn(2, 3, 5).requires_grad_(True)
    terms = generalized_jsd(student_logits, torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.bool), beta=0.5)
    loss = terms.loss()
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(student_logits.grad, torch.zeros(2, 3, 5))


def test_teacher_gets_no_gradient_and_beta_is_checked():
    teacher_logits = torch.randn(1, 2, 5).requires_grad_(True)
    generalized_jsd(torch.randn(1, 2, 5, requires_grad=True), teacher_logits, torch.ones(1, 2, dtype=torch.bool),
                    beta=0.5).loss().backward()
    assert teacher_logits.grad is None
    with pytest.raises(ValueError, match="beta must be in"):
        generalized_jsd(torch.randn(1, 2, 5), torch.randn(1, 2, 5), torch.ones(1, 2, dtype=torch.bool), beta=1.5)


def test_agreement_counts_masked_tokens_with_the_same_argmax():
    student_logits = torch.tensor([[[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]]])
    teacher_logits = torch.tensor([[[0.0, 2.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]])
    mask = torch.tensor([[True, True, True, False]])
    assert agreement(student_logits, teacher_logits, mask).item() == pytest.approx(2 / 3)
    assert agreement(student_logits, teacher_logits, torch.zeros(1, 4, dtype=torch.bool)).item() == 0.0


def test_top_k_teacher_logprobs_are_the_full_softmax_highest_first():
    teacher_logits = torch.tensor([[[1.0, 3.0, 2.0, 0.0]]])
    logprobs, token_ids = top_k_teacher_logprobs(teacher_logits, k=2, temperature=0.5)
    assert token_ids.tolist() == [[[1, 2]]]
    assert torch.allclose(logprobs, torch.log_softmax(teacher_logits / 0.5, dim=-1)[..., [1, 2]])
