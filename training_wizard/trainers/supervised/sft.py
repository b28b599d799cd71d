"""Supervised fine-tuning on the supervised loop (trainers/supervised/loop.py): rows in TRL's SFT formats become token
ids with a loss mask, optionally packed, and the loss is next-token cross-entropy on the masked-in tokens.

Row formats (as TRL's SFTTrainer reads them):
  language modelling     {"text": "..."}                                              every token trains
  prompt/completion      {"prompt": "...", "completion": "..."}                       the completion trains
  conversational p/c     {"prompt": [messages], "completion": [assistant messages]}   the completion trains
  conversational         {"messages": [{"role": ..., "content": ...}, ...]}           the assistant turns train
A conversational row may also carry a `tools` column, the JSON schemas of the tools its conversation may call
(TRL's tool-calling SFT format); the chat template renders them (e.g. into the system message).
With `completion_only_loss = false` every token trains in every format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from training_wizard.core.supervised import token_loss_sums
from training_wizard.errors import UserError
from training_wizard.specs.chat_rendering import bind_chat_template_kwargs, chat_ids
from training_wizard.specs.dataset import check_roles
from training_wizard.trainers.supervised.config import SFTConfig
from training_wizard.trainers.supervised.loop import SupervisedTrainer


@dataclass
class SFTExample:
    """One training row: token ids, the loss mask (True = a target token), and the position ids, which restart
    at 0 at each example a packed row holds."""

    input_ids: list[int]
    loss_mask: list[bool]
    position_ids: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


# ------------------------------------------------------------------------------------------------------------
# Encoding rows


class RowName:
    """`where(index)`, worked out only when a message is written: naming a row's file and line reads the file
    again, which a run whose rows are all good never needs."""

    def __init__(self, where: Callable[[int], str], index: int):
        self.where, self.index = where, index

    def __str__(self) -> str:
        return self.where(self.index)


def _chat_ids(tokenizer, messages: list[dict[str, str]], generation_prompt: bool,
              tools: list[dict] | None = None) -> list[int]:
    return chat_ids(tokenizer, messages, tools=tools or None, add_generation_prompt=generation_prompt)


def _text_ids(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _messages_segments(tokenizer, messages: list[dict[str, str]], where: str,
                       tools: list[dict] | None = None) -> list[tuple[list[int], bool]]:
    """(token ids, trains) pieces of a conversation: each assistant turn is what rendering it adds to the
    conversation before it with the generation prompt; everything else is context. Needs a template whose
    rendering of a conversation starts with the rendering of each of its prefixes (ChatML-style ones do)."""
    segments: list[tuple[list[int], bool]] = []
    done: list[int] = []
    for turn, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _chat_ids(tokenizer, messages[:turn], generation_prompt=True, tools=tools) if turn else []
        upto = _chat_ids(tokenizer, messages[: turn + 1], generation_prompt=False, tools=tools)
        if before[: len(done)] != done or upto[: len(before)] != before:
            raise UserError(f"{where}: the chat template does not render this conversation turn by turn (a prefix "
                            "renders differently), so assistant tokens cannot be found; set "
                            "training.completion_only_loss = false to train on every token")
        segments += [(before[len(done):], False), (upto[len(before):], True)]
        done = upto
    everything = _chat_ids(tokenizer, messages, generation_prompt=False, tools=tools)
    if everything[: len(done)] != done:
        raise UserError(f"{where}: the chat template renders the whole conversation differently from its turns")
    segments.append((everything[len(done):], False))
    return segments


# The row formats, for messages about a row that fits none of them.
EXPECTED_COLUMNS = "expected 'text', 'prompt' + 'completion', or 'messages'"


def _row_segments(row: dict[str, Any], tokenizer, config: SFTConfig, where: str) -> list[tuple[list[int], bool]]:
    """The row as (token ids, trains) pieces, before `completion_only_loss` and truncation (`row` without nulls)."""
    if "messages" in row:
        messages = row["messages"]
        if not _is_conversation(messages):
            raise UserError(f"{where}: 'messages' must be a list of {{role, content}} messages")
        check_roles(messages, config.extra_roles, where)
        _need_template(tokenizer, where)
        return _messages_segments(tokenizer, messages, where, _row_tools(row, where))
    if "prompt" in row and "completion" in row:
        return _prompt_completion_segments(row["prompt"], row["completion"], tokenizer, config, where,
                                           _row_tools(row, where))
    if "text" in row and isinstance(row["text"], str):
        return [(with_eos(_text_ids(tokenizer, row["text"], special=True), tokenizer, config), True)]
    if "prompt" in row or "completion" in row:
        has, lacks = ("prompt", "completion") if "prompt" in row else ("completion", "prompt")
        raise UserError(f"{where}: column '{lacks}' missing (the row has '{has}'); {EXPECTED_COLUMNS}")
    raise UserError(f"{where}: expected a 'text', 'prompt' + 'completion', or 'messages' column "
                    f"(found: {', '.join(row) or 'none'})")


def _prompt_completion_segments(prompt: Any, completion: Any, tokenizer, config: SFTConfig, where: str,
                                tools: list[dict] | None = None) -> list[tuple[list[int], bool]]:
    """A prompt/completion row (both strings, or both conversations) as (token ids, trains) pieces."""
    if isinstance(prompt, str) and isinstance(completion, str):
        ids = with_eos(_text_ids(tokenizer, completion, special=False), tokenizer, config)
        return [(_text_ids(tokenizer, prompt, special=True), False), (ids, True)]
    if _is_conversation(prompt) and _is_conversation(completion):
        check_roles(prompt, config.extra_roles, where, "prompt")
        check_roles(completion, config.extra_roles, where, "completion")
        _need_template(tokenizer, where)
        before = _chat_ids(tokenizer, prompt, generation_prompt=True, tools=tools)
        whole = _chat_ids(tokenizer, prompt + completion, generation_prompt=False, tools=tools)
        if whole[: len(before)] != before:
            raise UserError(f"{where}: the chat template renders prompt + completion so that the prompt is not a "
                            "prefix of it; the completion tokens cannot be found")
        return [(before, False), (whole[len(before):], True)]
    raise UserError(f"{where}: 'prompt' and 'completion' must both be strings or both lists of messages")


def with_eos(ids: list[int], tokenizer, config: SFTConfig) -> list[int]:
    """`ids` ending with the EOS token under add_eos_token, as TRL's SFTTrainer ends plain-text rows (a `text` row
    and a string completion): the model learns to stop. Conversational rows end as their chat template ends them."""
    eos = tokenizer.eos_token_id
    if config.add_eos_token and eos is not None and (not ids or ids[-1] != eos):
        return [*ids, eos]
    return ids


def _row_tools(row: dict[str, Any], where: str) -> list[dict] | None:
    """The row's `tools` column: a list of JSON schemas, or that list as a JSON string (as some datasets keep it)."""
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as error:
            raise UserError(f"{where}: 'tools' is a string but not JSON ({error.msg}); expected a list of JSON "
                            "schemas") from None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        raise UserError(f"{where}: 'tools' must be a list of JSON schemas (objects), or that list as a JSON string")
    return tools or None


def _is_conversation(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value))


def _need_template(tokenizer, where: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"{where}: conversational rows need a tokenizer with a chat template (model.tokenizer_name)")


def encode_sft_row(row: dict[str, Any], tokenizer, config: SFTConfig,
                   where: str | RowName = "dataset row 0") -> SFTExample:
    """One row as token ids and loss mask, cut to `max_length` tokens. A null value counts as an absent column: the
    datasets library gives every row of a file every key any row has, null where the row had none."""
    row = {key: value for key, value in row.items() if value is not None}
    ids: list[int] = []
    mask: list[bool] = []
    text_row = "text" in row and "messages" not in row and "completion" not in row
    for piece, trains in _row_segments(row, tokenizer, config, where):
        ids += piece
        mask += [trains or text_row or not config.completion_only_loss] * len(piece)
    if config.max_length is not None:
        ids, mask = ids[: config.max_length], mask[: config.max_length]
    if mask:
        mask[0] = False  # nothing predicts an example's first token (in a packed row: not the previous example)
    return SFTExample(ids, mask, list(range(len(ids))))


def encode_sft_rows(rows, tokenizer, config: SFTConfig, label: str = "dataset",
                    where: Callable[[int], str] | None = None) -> tuple[list[SFTExample], int]:
    """Every row encoded; rows left with no target token (after truncation, a completion cut off entirely, or
    the first token alone) are dropped. Returns (examples, how many were dropped). `where(i)` names row i in
    messages (with its file and line: `DataSourceSpec.row_name`); by default 'dataset row i'."""
    where = where or (lambda index: f"{label} row {index}")
    bind_chat_template_kwargs(tokenizer, config.chat_template_kwargs)
    examples, dropped = [], 0
    for index, row in enumerate(rows):
        example = encode_sft_row(dict(row), tokenizer, config, RowName(where, index))
        if any(example.loss_mask):
            examples.append(example)
        else:
            dropped += 1
    if not examples:
        raise UserError(f"{label}: no row has a token to train on (completions empty or cut off by "
                        "training.max_length)")
    return examples, dropped


def pack_examples(examples: list[SFTExample], max_length: int) -> list[SFTExample]:
    """Examples packed into rows of at most `max_length` tokens: longest first, each into the first row with
    room (first-fit decreasing; ties keep the data order, so packing is deterministic). Position ids restart at 0
    at each example, which is what keeps the examples apart in attention (transformers builds a block-diagonal
    causal mask from them when no attention mask is given)."""
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]))
    rows: list[list[int]] = []
    room: list[int] = []
    for index in order:
        size = len(examples[index])
        slot = next((r for r, left in enumerate(room) if left >= size), None)
        if slot is None:
            rows.append([]), room.append(max_length)
            slot = len(rows) - 1
        rows[slot].append(index)
        room[slot] -= size
    packed = []
    for members in rows:
        parts = [examples[i] for i in sorted(members)]
        packed.append(SFTExample([t for p in parts for t in p.input_ids], [m for p in parts for m in p.loss_mask],
                                 [q for p in parts for q in p.position_ids]))
    return packed


# ------------------------------------------------------------------------------------------------------------
# Batches and the loss


def collate(examples: list[SFTExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, T) input_ids, loss_mask and position_ids. Padding gets positions that restart at 0 and
    no loss: under causal attention it sits after every real token, so no real token attends to it."""
    width = max(len(e) for e in examples)
    ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.bool)
    positions = torch.arange(width).repeat(len(examples), 1)
    for row, example in enumerate(examples):
        n = len(example)
        ids[row, :n] = torch.tensor(example.input_ids)
        mask[row, :n] = torch.tensor(example.loss_mask)
        positions[row, :n] = torch.tensor(example.position_ids)
        positions[row, n:] = torch.arange(width - n)
    return {"input_ids": ids, "loss_mask": mask, "position_ids": positions}


class SFTTrainer(SupervisedTrainer):
    """Next-token cross-entropy on the completion tokens, divided by the step's completion tokens over every
    process and micro-batch (so packing, batch split and process count leave it unchanged). Metrics: `loss`,
    `mean_token_accuracy` (TRL's: share of target tokens the argmax predicts), `num_tokens` (targets per step)."""

    config: SFTConfig
    weight_metric = "num_tokens"
    metric_names = ("mean_token_accuracy",)

    def example_weight(self, rows: list[SFTExample]) -> int:
        return sum(sum(e.loss_mask) for e in rows)

    def example_sums(self, rows: list[SFTExample]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = {k: v.to(self.accelerator.device) for k, v in collate(rows, self.tokenizer.pad_token_id).items()}
        # No attention mask: the position ids say where each example starts (see `collate` and `pack_examples`).
        out = self.forward_model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        sums = token_loss_sums(out.logits, batch["input_ids"], batch["loss_mask"])
        return sums.loss, {"mean_token_accuracy": sums.correct.float()}
