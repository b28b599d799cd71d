"""The update's optimizer steps with micro-batches by tokens (`max_tokens_per_micro_batch`), a part of `UpdateLoop`
(trainers/loop/update.py).

Each optimizer step still covers one mini-batch of rows; its rows are grouped by length into as many micro-batches
as the budget needs (core/micro_batches.py). The loss is then normalised by the step, not the micro-batch:
- a loss that is a mean over its micro-batch's rows (RLOO, PPO) is weighted by the micro-batch's share of the
  step's rows, so the weighted sum is the mean over the step's rows;
- a loss already normalised by the step's totals (GRPO: `optimizer_step_totals` gives token and row counts,
  `MicroBatchLoss.step_shares`) is weighted as accelerate weighs a micro-batch, 1 / gradient_accumulation_steps,
  whatever the number of micro-batches.
So a token-budget split gives the gradient of the whole mini-batch in one pass (tests/unit/test_token_budget.py).
The statistics of a step are weighted the same way (the loop's entropy, a token mean, by loss tokens), then
averaged over steps.

accelerate's `accumulate` counts a fixed number of micro-batches per step; here their number varies, so the loop
syncs itself: every micro-batch but the step's last runs under `no_sync` (no gradient all-reduce), and the
optimizer step follows the last. accelerate's step counter is never advanced (it stays 0, a multiple of the
accumulation steps, and gradients always count as synchronised: a checkpoint resumes exactly). Processes may need
different numbers of micro-batches; they agree on the largest (one all-reduce per epoch) and a process with fewer
runs padding passes of weight 0 and empty loss mask, so every process runs the same forward and backward passes
(a data-parallel wrapper may broadcast buffers at each forward; GRPO's entropy pool gathers per micro-batch).
DeepSpeed and FSDP are refused (trainers/loop/setup.py): their engines count micro-batches themselves.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass

import torch

from training_wizard.core.micro_batches import micro_batches, padded_row_lengths


@dataclass(frozen=True)
class MicroBatchShare:
    """A token-budget micro-batch's part of its optimizer step: `rows` of the step's `step_rows` and `tokens` of
    its `step_tokens` loss tokens on this process (0 rows: a padding pass), under `accumulation_steps`
    (gradient_accumulation_steps: accelerate's backward divides every loss by it)."""

    rows: int
    step_rows: int
    accumulation_steps: int
    tokens: int = 0
    step_tokens: int = 0

    @property
    def token_share(self) -> float:
        return self.tokens / max(self.step_tokens, 1)

    @property
    def row_share(self) -> float:
        return self.rows / self.step_rows

    def weight(self, step_shares: bool) -> float:
        """The weight of a micro-batch loss (and its statistics) in the step: its row share for a mean over the
        micro-batch's rows; for a loss normalised by the step's totals (`step_shares`), 1 / accumulation steps,
        as in a step of fixed micro-batches. 0 for a padding pass."""
        if self.rows == 0:
            return 0.0
        return 1.0 / self.accumulation_steps if step_shares else self.row_share


class TokenBudgetSteps:
    """The token-budget steps of `UpdateLoop`, which provides `config`, `plan`, `accelerator`, `collectives`,
    `trained_models`, `_micro_step` and `_optimizer_step`."""

    def token_budget_splits(self, rollout, order: torch.Tensor) -> list[list[torch.Tensor]]:
        """For each mini-batch of this epoch's `order`, its rows grouped into micro-batches of at most
        max_tokens_per_micro_batch tokens (rollout row indices), padded with empty groups to the largest count
        of any process (one all-reduce)."""
        size, budget = self.plan.local_mini_batch_size, self.config.max_tokens_per_micro_batch
        splits = []
        for first in range(0, self.plan.local_batch_size, size):
            index = order[first : first + size]
            lengths = padded_row_lengths(rollout.prompt_mask[index], rollout.completion_mask[index])
            packed = self.config.padding_free  # a packed micro-batch costs its real tokens, not rows x width
            splits.append([index[group] for group in micro_batches(lengths, budget, padded=not packed)])
        counts = torch.tensor([len(split) for split in splits], device=self.accelerator.device)
        agreed = self.collectives.max(counts).tolist()
        empty = order[:0]
        return [split + [empty] * (int(count) - len(split)) for split, count in zip(splits, agreed)]

    def token_budget_step(self, rollout, shaped, split: list[torch.Tensor], totals, stats, flags: torch.Tensor,
                          stale, where: str) -> list[torch.Tensor]:
        """One optimizer step over the micro-batches of `split`; the step's statistics (weighted sums of its
        micro-batches') are appended to `stats`. Returns the ratios of its micro-batches."""
        if not self.accelerator.sync_gradients:  # its optimizer would skip the step without a word
            raise RuntimeError("accelerate's gradient state is inside an accumulation; micro-batches by tokens "
                               "synchronise themselves and need it left alone")
        step_rows = sum(len(index) for index in split)
        tokens = [int(rollout.loss_mask[index].sum()) for index in split]
        accumulation = self.config.gradient_accumulation_steps
        step_stats: dict[str, list[torch.Tensor]] = defaultdict(list)
        ratios = []
        for number, index in enumerate(split):
            share = MicroBatchShare(len(index), step_rows, accumulation, tokens[number], sum(tokens))
            off_policy = stale
            if share.rows == 0:  # a padding pass: any row of the step, weighted 0, nothing trained or measured
                index, off_policy = next(part for part in split if len(part))[:1], None  # (nor its correction)
            last = number == len(split) - 1
            with contextlib.ExitStack() as unsynced:
                if not last:  # the gradient all-reduce waits for the step's last micro-batch
                    for model in self.trained_models.values():
                        unsynced.enter_context(self.accelerator.no_sync(model))
                ratio = self._micro_step(rollout, shaped, index, totals, step_stats, flags, off_policy, share)
            if share.rows:
                ratios.append(ratio)
        for name, values in step_stats.items():
            stats[name].append(torch.stack(values).sum())
        self._optimizer_step(flags, where)
        return ratios
