"""Losses of the supervised stages before online RL: next-token cross-entropy on chosen tokens (SFT) and the
Bradley-Terry pairwise loss of a reward model. Pure torch, no normalisation hidden inside: callers decide what a
loss is divided by, so that gradient accumulation, packing and several processes give the same number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TokenLossSums:
    """Sums over the counted tokens of a batch (no means: see `token_loss_sums`).

    loss: 0-dim, sum of cross-entropies (with gradient); correct: 0-dim, tokens whose argmax is the target;
    tokens: 0-dim, how many tokens were counted.
    """

    loss: torch.Tensor
    correct: torch.Tensor
    tokens: torch.Tensor


def token_loss_sums(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> TokenLossSums:
    """Next-token cross-entropy summed over the tokens `loss_mask` selects, with the number of them.

    logits: (B, T, V), position t predicting token t + 1; input_ids: (B, T); loss_mask: (B, T) bool, True where
    token t is a target (a completion token, as TRL's SFTTrainer's completion_mask). Position 0 is never a target
    (nothing predicts it). Returns sums so that the caller divides by the tokens of the whole optimizer step:
    a token then weighs the same whatever micro-batch, packed row or process it lands in.
    Also counts TRL's `mean_token_accuracy` numerator: targets the argmax of the logits gets right.
    """
    targets = input_ids[:, 1:]
    counted = loss_mask[:, 1:].bool()
    shifted = logits[:, :-1].float()
    losses = F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1), reduction="none")
    losses = losses.view_as(targets) * counted
    with torch.no_grad():
        correct = ((shifted.argmax(-1) == targets) & counted).sum()
    return TokenLossSums(loss=losses.sum(), correct=correct, tokens=counted.sum())


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_rewards_coefficient: float | None = None) -> torch.Tensor:
    """Mean pairwise loss of a reward model: -log sigmoid(r_chosen - r_rejected - margin), averaged over pairs,
    plus `center_rewards_coefficient * mean((r_chosen + r_rejected)^2)` when set.

    chosen, rejected: (B,) scalar rewards of each pair's two texts; margin: (B,) or None (0).
    The margin term is Llama 2's ("Llama 2: Open Foundation and Fine-Tuned Chat Models", eq. 2); the centering
    term is the auxiliary loss of Eisenstein et al. ("Helping or Herding? Reward Model Ensembles Mitigate but do
    not Eliminate Reward Hacking"), as TRL's RewardTrainer adds it: it pulls the rewards towards mean zero.
    """
    difference = chosen - rejected
    if margin is not None:
        difference = difference - margin
    loss = -F.logsigmoid(difference).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * ((chosen + rejected) ** 2).mean()
    return loss


def classification_loss_sums(logits: torch.Tensor, labels: torch.Tensor, loss_type: str = "cross_entropy",
                             label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss, number of correct predictions) of a sequence classifier's batch.

    logits: (B, C); labels: (B,) class ids. "cross_entropy": softmax cross-entropy over the C classes, with
    `label_smoothing` as torch's cross_entropy takes it; correct = argmax equals the label.
    "binary_cross_entropy": C = 1, labels 0/1, sigmoid cross-entropy against labels smoothed towards 0.5
    (y (1 - s) + s / 2, training-wizard 1.0's rule); correct = the logit's sign agrees with the label.
    """
    if loss_type == "cross_entropy":
        loss = F.cross_entropy(logits.float(), labels.long(), reduction="sum", label_smoothing=label_smoothing)
        correct = (logits.argmax(-1) == labels).sum()
        return loss, correct
    target = labels.float() * (1 - label_smoothing) + 0.5 * label_smoothing
    scores = logits.float()[:, 0]
    loss = F.binary_cross_entropy_with_logits(scores, target, reduction="sum")
    correct = ((scores > 0).long() == labels.long()).sum()
    return loss, correct
