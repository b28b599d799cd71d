"""The token ids an environment's messages add between two model replies, as the chat template renders them.

Token-in/token-out: an episode's ids are the prompt's, then each reply exactly as sampled, then the ids this
module gives for the environment's answer, then the next reply. Sampled text is never encoded again (BPE is not
a bijection: decoding a sample and encoding it back changes the ids, and the trainer would score tokens the model
never sampled). Only the environment's own text is encoded.

The ids come from the template itself: a probe conversation is rendered without and with the new messages, and
the difference is what the template writes after a finished reply. The template must be prefix-preserving
(rendering a conversation with one more message only appends); one that rewrites earlier turns (as Qwen3's drops
earlier <think> blocks) cannot be spliced. With tools it must also render the tools and a tool's result. Both are
checked at start; a template that fails is replaced by a training template the recipe names (`chat_template`).
"""

from __future__ import annotations

from typing import Any

from training_wizard.errors import UserError
from training_wizard.specs.chat_rendering import render_chat

_PROBE_QUESTION = "Probe question 7"
_PROBE_REPLY = "Probe reply 7"
_PROBE_RESULT = "Probe result 7"
_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_tool_7", "description": "Probe description 7.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string", "description": "x"}}, "required": ["x"]},
}}
_FIX = "name a training template with chat_template (\"hermes\", a Jinja file or the template itself)"


class TurnRenderer:
    """Renders an episode's conversation for the model: `prompt_ids(messages, tools)` for its start, and
    `message_ids(messages, reply_end_id, tools)` for the ids that follow a reply which ended with the token
    `reply_end_id` (its stop token): the environment's messages through the next reply's generation prompt.

    The template's text after a finished reply is split in two: the stop token the model sampled itself (kept as
    sampled, so not added again) and the rest (e.g. ChatML's newline after <|im_end|>), which belongs to the
    environment's part. A missing separator or a doubled stop token at a turn boundary is the error this avoids.
    """

    def __init__(self, tokenizer, role: str = "user", with_tools: bool = False):
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("environment: episodes of several turns need a tokenizer with a chat template "
                            f"(model.tokenizer_name), or {_FIX}")
        self.tokenizer, self.role = tokenizer, role
        self._probe = [{"role": "user", "content": _PROBE_QUESTION}, {"role": "assistant", "content": _PROBE_REPLY}]
        tools = [_PROBE_TOOL] if with_tools else None
        before = self.render(self._probe, False, tools)
        answers = [{"role": role, "content": "Probe answer 7"}]
        if with_tools:
            answers.append({"role": "tool", "name": "probe_tool_7", "content": _PROBE_RESULT})
        for answer in answers:
            if not self.render(self._probe + [answer], True, tools).startswith(before):
                raise UserError(f"environment: the chat template is not prefix-preserving (rendering one more "
                                f"{answer['role']} message changes the earlier ones), so turns cannot be spliced "
                                f"token by token; {_FIX}")
        if with_tools:
            self._check_renders_tools()
        self._after_reply = before[before.rindex(_PROBE_REPLY) + len(_PROBE_REPLY):]
        # what message_text renders its messages after, every turn: rendered once here
        self._before_plain = self.render(self._probe, False) if with_tools else before

    def _check_renders_tools(self) -> None:
        opening = self.render([{"role": "user", "content": _PROBE_QUESTION}], True, [_PROBE_TOOL])
        result = self.render(self._probe + [{"role": "tool", "name": "probe_tool_7", "content": _PROBE_RESULT}],
                             True, [_PROBE_TOOL])
        if "probe_tool_7" not in opening or "Probe description 7." not in opening or _PROBE_RESULT not in result:
            raise UserError(f"environment: the model's chat template cannot render tools (the tools' schemas or a "
                            f"tool's result do not appear in what it renders); {_FIX}")

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict] | None = None) -> str:
        return render_chat(self.tokenizer, messages, tools=tools or None, tokenize=False,
                           add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.render(messages, True, tools))

    def message_text(self, messages: list[dict[str, Any]], reply_end: str) -> str:
        """The text the template writes after a reply that ended with `reply_end`, for `messages`."""
        before = self._before_plain
        rendered = self.render(self._probe + messages, True)
        after_reply = self._after_reply
        if reply_end and after_reply.startswith(reply_end):
            after_reply = after_reply[len(reply_end):]  # the model sampled it; the template's copy is not added
        return after_reply + rendered[len(before):]

    def message_ids(self, messages: list[dict[str, Any]], reply_end_id: int | None) -> list[int]:
        reply_end = self.tokenizer.decode([reply_end_id]) if reply_end_id is not None else ""
        return self.encode(self.message_text(messages, reply_end))

    def observation_ids(self, text: str, reply_end_id: int | None) -> list[int]:
        """The ids of one environment message of this renderer's role holding `text`."""
        return self.message_ids([{"role": self.role, "content": text}], reply_end_id)

    def drift(self, prompt_ids: list[int], ids: list[int], sampled: list[bool], prompt: list[dict[str, Any]],
              messages: list[dict[str, Any]], tools: list[dict] | None) -> bool:
        """Whether an episode's spliced ids differ from the chat template's own rendering of its conversation
        (`prompt`'s messages, then `messages`, which end with the model's last reply), outside the model's
        replies: the prompt, and each environment
        part between two replies. The replies are rendered as markers and their ids are not compared: encoding the
        sampled text again would not give the sampled ids back (BPE is not a bijection), and a random sample need
        not even be valid UTF-8 on its own."""
        markers = [f"@@reply {n}@@" for n in range(len(messages))]
        replaced = [{**message, "content": markers[n]} if message["role"] == "assistant" else message
                    for n, message in enumerate(messages)]
        rendered = self.render(prompt + replaced, False, tools)
        pieces, rest = [], rendered
        for n, message in enumerate(messages):
            if message["role"] == "assistant":
                before, _, rest = rest.partition(markers[n])
                pieces.append(before)
        expected = [self.encode(pieces[0])]
        runs = _runs(ids, sampled)
        replies = [run for is_model, run in runs if is_model]
        for reply, piece in zip(replies, pieces[1:]):
            reply_end = self.tokenizer.decode(reply[-1:])
            expected.append(self.encode(piece[len(reply_end):] if piece.startswith(reply_end) else piece))
        found = [prompt_ids] + [run for is_model, run in runs if not is_model][: len(expected) - 1]
        return found != expected


def _runs(ids: list[int], sampled: list[bool]) -> list[tuple[bool, list[int]]]:
    """(is the model's, ids) runs of an episode's ids."""
    runs: list[tuple[bool, list[int]]] = []
    for token, is_model in zip(ids, sampled):
        if runs and runs[-1][0] == is_model:
            runs[-1][1].append(token)
        else:
            runs.append((is_model, [token]))
    return runs
