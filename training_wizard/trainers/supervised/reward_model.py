"""Reward-model training on the supervised loop (trainers/supervised/loop.py): preference pairs become two token
sequences each, a sequence classifier with one output scores both, and the loss is Bradley-Terry's.

Pair formats (as TRL's RewardTrainer reads them), each with an optional numeric `margin` column:
  implicit prompt   {"chosen": "...", "rejected": "..."}                      (or lists of messages)
  explicit prompt   {"prompt": "...", "chosen": "...", "rejected": "..."}     (or lists of messages)
A standard pair is scored on the text prompt + completion, which is what a `[reward]` ModelRewardSpec reads with
its default input_template; a conversational one on the chat template's rendering of prompt + completion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from training_wizard.core.supervised import bradley_terry_loss
from training_wizard.errors import UserError
from training_wizard.specs.chat_rendering import chat_ids
from training_wizard.specs.dataset import check_roles
from training_wizard.trainers.supervised.config import RewardConfig
from training_wizard.trainers.supervised.sft import RowName
from training_wizard.trainers.supervised.loop import SupervisedTrainer


@dataclass
class PreferencePair:
    """The token ids of the preferred and the other text, and the margin the loss asks between their rewards."""

    chosen: list[int]
    rejected: list[int]
    margin: float = 0.0


def _render(tokenizer, prompt: Any, completion: Any, where: str, key: str, extra_roles: list[str]) -> list[int]:
    if isinstance(completion, str) and (prompt is None or isinstance(prompt, str)):
        return list(tokenizer((prompt or "") + completion)["input_ids"])
    if isinstance(completion, list) and (prompt is None or isinstance(prompt, list)):
        messages = (prompt or []) + completion
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages) or not messages:
            raise UserError(f"{where}: '{key}' must be a list of {{role, content}} messages")
        check_roles(prompt or [], extra_roles, where, "prompt")
        check_roles(completion, extra_roles, where, key)
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(f"{where}: conversational pairs need a tokenizer with a chat template")
        return chat_ids(tokenizer, messages)
    raise UserError(f"{where}: 'prompt' and '{key}' must both be strings or both lists of messages")


def encode_pair(row: dict[str, Any], tokenizer, config: RewardConfig,
                where: str | RowName = "dataset row 0") -> PreferencePair:
    """One row as a PreferencePair, whole (`encode_pairs` leaves out those over max_length). A null value counts as
    an absent column
    (the datasets library gives every row of a file every key any row has, null where the row had none)."""
    row = {key: value for key, value in row.items() if value is not None}
    missing = [key for key in ("chosen", "rejected") if key not in row]
    if missing:
        raise UserError(f"{where}: column '{missing[0]}' missing; expected 'chosen' and 'rejected' (and optionally "
                        f"'prompt', 'margin'); found: {', '.join(row) or 'none'}")
    prompt = row.get("prompt")
    ids = [_render(tokenizer, prompt, row[key], where, key, config.extra_roles) for key in ("chosen", "rejected")]
    if not ids[0] or not ids[1]:
        raise UserError(f"{where}: an empty text; chosen and rejected must each have at least one token")
    margin = row.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)):
        raise UserError(f"{where}: 'margin' must be a number, got {margin!r}")
    return PreferencePair(ids[0], ids[1], float(margin))


def encode_pairs(rows, tokenizer, config: RewardConfig, label: str = "dataset",
                 where: Callable[[int], str] | None = None) -> tuple[list[PreferencePair], list[int]]:
    """Every row as a PreferencePair, in order, except those whose chosen or rejected is longer than max_length:
    TRL's RewardTrainer filters them out, where cutting both would score two texts that may no longer differ (a
    prompt longer than max_length leaves chosen == rejected). Returns (pairs, the rows left out). `where(i)` names
    row i in messages (with its file and line: `DataSourceSpec.row_name`); by default 'dataset row i'."""
    where = where or (lambda index: f"{label} row {index}")
    pairs, too_long = [], []
    for index, row in enumerate(rows):
        pair = encode_pair(dict(row), tokenizer, config, RowName(where, index))
        if config.max_length is not None and max(len(pair.chosen), len(pair.rejected)) > config.max_length:
            too_long.append(index)
        else:
            pairs.append(pair)
    if not pairs:
        more = f"; all {len(too_long)} are longer than training.max_length" if too_long else ""
        raise UserError(f"{label}: no preference pairs{more}")
    return pairs, too_long


def identical_pairs(pairs: list[PreferencePair]) -> list[int]:
    """Positions of the pairs whose chosen and rejected tokens are the same (as rendered):
    both score the same, so the loss has no preference to learn from them."""
    return [index for index, pair in enumerate(pairs) if pair.chosen == pair.rejected]


def collate_pairs(pairs: list[PreferencePair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """(2B, T) right-padded input_ids and attention_mask, chosen texts first then rejected; (B,) margins."""
    texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    width = max(len(t) for t in texts)
    ids = torch.full((len(texts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for row, tokens in enumerate(texts):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    return {"input_ids": ids, "attention_mask": mask, "margin": torch.tensor([p.margin for p in pairs])}


class RewardModelTrainer(SupervisedTrainer):
    """Bradley-Terry loss (core/supervised.py `bradley_terry_loss`) averaged over the step's pairs. Metrics:
    `loss`, `accuracy` (share of pairs whose chosen text scores higher), `margin` (mean r_chosen - r_rejected),
    `rewards/chosen` and `rewards/rejected` (mean rewards)."""

    config: RewardConfig
    metric_names = ("accuracy", "margin", "rewards/chosen", "rewards/rejected")

    def example_weight(self, rows: list[PreferencePair]) -> int:
        return len(rows)

    def rewards(self, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(chosen (B,), rejected (B,), margin (B,)) rewards of the pairs, in one forward pass."""
        batch = {k: v.to(self.accelerator.device) for k, v in collate_pairs(pairs, self.tokenizer.pad_token_id).items()}
        out = self.forward_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        scores = out.logits[:, 0].float()
        return scores[: len(pairs)], scores[len(pairs):], batch["margin"].float()

    def example_sums(self, rows: list[PreferencePair]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected, margin = self.rewards(rows)
        loss = bradley_terry_loss(chosen, rejected, margin, self.config.center_rewards_coefficient) * len(rows)
        # (times the pairs: the loop divides sums by the step's pairs)
        with torch.no_grad():
            stats = {"accuracy": (chosen > rejected).float().sum(), "margin": (chosen - rejected).sum(),
                     "rewards/chosen": chosen.sum(), "rewards/rejected": rejected.sum()}
        return loss, stats
