"""Prompt encoding, the shared prompt order, and each iteration's requests.

Every process walks the same seeded permutation of the dataset (epoch by epoch) and takes its own slice of each
iteration's prompts, so the order is shared and resumable from (epoch, position) alone. `IterationPrompts` turns
that slice into the `RolloutRequest` a trainer hands its rollout source: the rows, their sampling seeds and group ids.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from training_wizard.errors import UserError
from training_wizard.specs.chat_rendering import chat_ids


def render_prompt(tokenizer, prompt: str | list[dict[str, str]]) -> list[int]:
    """Token ids of a standard (plain text) or conversational (chat template + generation prompt) prompt."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("dataset: conversational prompts need a tokenizer with a chat template (model.tokenizer_name)")
    return chat_ids(tokenizer, prompt, add_generation_prompt=True)


def prompt_text(prompt: str | list[dict[str, str]]) -> str:
    """What reward functions and sample tables see as the query: the text, or the last user message."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


@dataclass
class EncodedPrompts:
    """The dataset prepared once: token ids, the query text, the other columns for the reward, and each row's
    `prompt` as the dataset holds it (a string or a message list; None for a pre-tokenised row), which rewards in
    TRL's form receive."""

    input_ids: list[list[int]]
    queries: list[str]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    prompts: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    @classmethod
    def from_rows(cls, rows, tokenizer) -> EncodedPrompts:
        """rows: a datasets.Dataset or a list of dicts with `prompt` (or pre-tokenised `input_ids`)."""
        rows = list(rows) if not isinstance(rows, list) else rows
        if not rows:
            raise UserError("dataset: no rows to train on")
        ids, queries, originals = [], [], []
        extra = [k for k in rows[0] if k not in ("prompt", "input_ids")]
        columns: dict[str, list[Any]] = {k: [] for k in extra}
        for index, row in enumerate(rows):
            if "input_ids" in row and "prompt" not in row:
                ids.append(list(row["input_ids"]))
                queries.append(tokenizer.decode(row["input_ids"], skip_special_tokens=True))
            else:
                from training_wizard.specs.dataset import validate_prompt_row

                validate_prompt_row(row, index)
                ids.append(render_prompt(tokenizer, row["prompt"]))
                queries.append(prompt_text(row["prompt"]))
            originals.append(row.get("prompt"))
            for key in extra:
                columns[key].append(row.get(key))
        return cls(ids, queries, columns, originals)

    def left_pad(self, indices: list[int], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask), each (len(indices), longest), padded on the left."""
        return left_pad([self.input_ids[i] for i in indices], pad_token_id)


def longest_prompt(*datasets: EncodedPrompts | None) -> int:
    """Tokens in the longest prompt of the datasets given (None: no dataset)."""
    return max(len(ids) for prompts in datasets if prompts is not None for ids in prompts.input_ids)


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of token lists, each (len(sequences), longest), padded on the left."""
    width = max(len(tokens) for tokens in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, tokens in enumerate(sequences):
        ids[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
        mask[row, width - len(tokens):] = True
    return ids, mask


@dataclass
class PromptOrder:
    """Shared, seeded, resumable order over dataset indices."""

    num_rows: int
    seed: int
    epoch: int = 0
    position: int = 0

    def permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.num_rows, generator=generator).tolist()

    def take(self, count: int) -> list[int]:
        """The next `count` indices of the global order, moving into the next epoch's permutation as needed."""
        taken: list[int] = []
        while len(taken) < count:
            order = self.permutation(self.epoch)
            need = count - len(taken)
            chunk = order[self.position : self.position + need]
            taken.extend(chunk)
            self.position += len(chunk)
            if self.position >= self.num_rows:
                self.epoch, self.position = self.epoch + 1, 0
        return taken

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_rows": self.num_rows, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_rows"] != self.num_rows:
            raise UserError(
                f"resume_from_checkpoint: the checkpoint was trained on {state['num_rows']} prompts, "
                f"the dataset now has {self.num_rows}"
            )
        self.epoch, self.position = state["epoch"], state["position"]


def row_seed(seed: int, iteration: int, slot: int) -> int:
    """Sampling seed of one completion, keyed by (run seed, iteration, slot in the iteration's global batch)."""
    mixed = (seed * 0x9E3779B1 + iteration * 0x85EBCA77 + slot * 0xC2B2AE3D) & 0x7FFF_FFFF_FFFF_FFFF
    return mixed ^ (mixed >> 29)



@dataclass(frozen=True)
class RolloutRequest:
    """What a trainer asks its rollout source for: dataset rows `rows` of `prompts` (each repeated once per
    completion it wants), their sampling seeds, the group id of each row, and the step (numbered as metrics and
    checkpoints are: a training rollout of iteration i is step i + 1; evaluation after step N is step N; reward
    messages name it). `policy_version`: the optimizer updates the sampling weights have seen. `prompt_ids`: a
    training iteration's dataset indices over all processes (logged to prompts.jsonl)."""

    prompts: EncodedPrompts
    rows: list[int]
    seeds: list[int]
    group_ids: list[int]
    step: int
    policy_version: int
    prompt_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class PromptBatch:
    """This process's dataset rows for one iteration, in the (group_size, prompts) layout, their seeds and group
    ids (the prompt's slot in the iteration's global order: unique over processes); all processes' prompts."""

    rows: list[int]
    seeds: list[int]
    group_ids: list[int]
    global_indices: list[int]


class RunPosition(Protocol):
    """Where a run stands (the trainer's RunState): its shared prompt order and the iterations done."""

    prompt_order: PromptOrder
    iteration: int


@dataclass
class IterationPrompts:
    """The requests of a run's rollouts: each iteration's share of the shared prompt order for process
    `process_index` (`local_prompts` of the iteration's `prompts_per_iteration`), each prompt repeated
    `group_size` times, and any other rows (the sample probes, evaluation) asked of the current weights.
    `run` is read at every call, so a resumed order and the iterations done are always the current ones."""

    prompts: EncodedPrompts
    run: RunPosition
    seed: int
    group_size: int
    prompts_per_iteration: int
    local_prompts: int
    process_index: int

    def next_request(self, iteration: int | None = None) -> RolloutRequest:
        """The next prompts of the shared order, as the request of iteration `iteration` (default: the current)."""
        iteration = self.run.iteration if iteration is None else iteration
        batch = self.next_batch(iteration)
        request = self.request(self.prompts, batch.rows, batch.seeds, iteration + 1, batch.group_ids)
        return dataclasses.replace(request, prompt_ids=tuple(batch.global_indices))

    def next_batch(self, iteration: int | None = None) -> PromptBatch:
        """This process's dataset indices, repeated group_size times in the (k, prompts) layout, and their
        sampling seeds keyed by (seed, iteration (default: the current one), global slot)."""
        iteration = self.run.iteration if iteration is None else iteration
        k, local_prompts = self.group_size, self.local_prompts
        global_indices = self.run.prompt_order.take(self.prompts_per_iteration)
        first = self.process_index * local_prompts
        local = global_indices[first : first + local_prompts]
        rows = [local[i] for j in range(k) for i in range(local_prompts)]
        seeds = [row_seed(self.seed, iteration, (first + i) * k + j) for j in range(k) for i in range(local_prompts)]
        group_ids = [first + i for _ in range(k) for i in range(local_prompts)]
        return PromptBatch(rows, seeds, group_ids, global_indices)

    def request(self, prompts: EncodedPrompts, rows: list[int], seeds: list[int], step: int,
                group_ids: list[int] | None = None) -> RolloutRequest:
        """A request of the current weights (policy version: the iterations done); by default each row its own
        group (the sample probes and evaluation sample one completion per prompt)."""
        return RolloutRequest(prompts, rows, seeds, group_ids if group_ids is not None else list(range(len(rows))),
                              step, self.run.iteration)
