"""The supervised losses against hand-worked numbers (core/supervised.py)."""

import math

import pytest
import torch

from training_wizard.core.supervised import bradley_terry_loss, token_loss_sums


def test_token_loss_sums_count_only_masked_targets_with_the_shift():
    # V = 3; position t predicts token t + 1. Logits chosen so each softmax is easy to write down.
    logits = torch.tensor([[[0.0, 0.0, 0.0],          # predicts token 1 (= 2): p = 1/3
                            [math.log(2.0), 0.0, 0.0],  # predicts token 2 (= 0): p = 2/4
                            [0.0, 5.0, 0.0],          # predicts token 3 (= 1): argmax right
                            [9.0, 9.0, 9.0]]])        # predicts nothing (last position)
    input_ids = torch.tensor([[1, 2, 0, 1]])
    mask = torch.tensor([[True, False, True, True]])  # token 0 is never a target, token 1 masked out
    sums = token_loss_sums(logits, input_ids, mask)
    expected = -math.log(2 / 4) - math.log(math.exp(5) / (math.exp(5) + 2))
    assert sums.loss.item() == pytest.approx(expected, abs=1e-6)
    assert sums.tokens.item() == 2
    assert sums.correct.item() == 2  # the argmax predicts both targets (0, then 1)


def test_bradley_terry_loss_and_gradient_with_margin_and_centering():
    chosen = torch.tensor([1.0, 0.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.5], requires_grad=True)
    margin = torch.tensor([0.5, 0.0])
    loss = bradley_terry_loss(chosen, rejected, margin, center_rewards_coefficient=0.1)
    # d = c - r - m = [0.5, -0.5]; -log sigmoid(0.5) = log(1 + e^-0.5) = 0.4740770,
    # -log sigmoid(-0.5) = log(1 + e^0.5) = 0.9740770; mean 0.7240770.
    # centering: 0.1 * mean([(1 + 0)^2, (0 + 0.5)^2]) = 0.1 * 0.625 = 0.0625.
    assert loss.item() == pytest.approx(0.7240770 + 0.0625, abs=1e-6)
    loss.backward()
    # d loss / d c_i = -(1 - sigmoid(d_i)) / B + 0.1 * 2 (c_i + r_i) / B; sigmoid(0.5) = 0.6224593
    assert chosen.grad.tolist() == pytest.approx([-0.3775407 / 2 + 0.1, -0.6224593 / 2 + 0.05], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx([0.3775407 / 2 + 0.1, 0.6224593 / 2 + 0.05], abs=1e-6)


def test_bradley_terry_without_margin_or_centering_is_the_plain_pairwise_loss():
    chosen, rejected = torch.tensor([2.0]), torch.tensor([2.0])
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(math.log(2.0), abs=1e-7)
    assert bradley_terry_loss(chosen, rejected, torch.zeros(1), 0.0).item() == pytest.approx(math.log(2.0), abs=1e-7)


def test_classification_loss_sums_against_hand_values():
    from training_wizard.core.supervised import classification_loss_sums

    logits, labels = torch.tensor([[2.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 1])
    loss, correct = classification_loss_sums(logits, labels)
    # log(1 + e^-2) + log 2; the tie in row 1 goes to class 0: one right
    assert (loss.item(), correct.item()) == (pytest.approx(0.126928 + 0.693147, abs=1e-6), 1)
    loss, _ = classification_loss_sums(logits, labels, label_smoothing=0.1)
    # row 0 aims at [0.95, 0.05]: 0.95 * 0.126928 + 0.05 * 2.126928; row 1 stays log 2
    assert loss.item() == pytest.approx(0.226928 + 0.693147, abs=1e-6)
    # binary: targets 1 smoothed by 0.2 to 0.9; loss = max(x, 0) - x t + log(1 + e^-|x|)
    loss, correct = classification_loss_sums(torch.tensor([[1.0], [-2.0]]), torch.tensor([1, 1]),
                                             "binary_cross_entropy", 0.2)
    assert (loss.item(), correct.item()) == (pytest.approx(0.413262 + 1.926928, abs=1e-6), 1)
