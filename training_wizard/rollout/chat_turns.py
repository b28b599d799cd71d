"""The token ids an environment's message adds between two model replies, as the chat template renders them.

Token-in/token-out: an episode's ids are the prompt's, then each reply exactly as sampled, then the ids this
module gives for the environment's answer, then the next reply. Sampled text is never encoded again (BPE is not
a bijection: decoding a sample and encoding it back changes the ids, and the trainer would score tokens the model
never sampled). Only the environment's own text is encoded.

The ids come from the template itself: a probe conversation is rendered without and with the new message, and
the difference is what the template writes after a finished reply. The template must be prefix-preserving
(rendering a conversation with one more message only appends); one that rewrites earlier turns (as Qwen3's drops
earlier <think> blocks) cannot be spliced, and the check at start says so.
"""

from __future__ import annotations

from training_wizard.errors import UserError

_PROBE_QUESTION = "Probe question 7"
_PROBE_REPLY = "Probe reply 7"


def _render(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


class TurnRenderer:
    """`observation_ids(text, reply_end)`: the ids that follow a reply which ended with the token `reply_end`
    (its stop token), for an environment message of `role` holding `text`, through the next reply's generation
    prompt.

    The template's text after a finished reply is split in two: the stop token the model sampled itself (kept as
    sampled, so not added again) and the rest (e.g. ChatML's newline after <|im_end|>), which belongs to the
    environment's part. A missing separator or a doubled stop token at a turn boundary is the error this avoids.
    """

    def __init__(self, tokenizer, role: str = "user"):
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("environment: episodes of several turns need a tokenizer with a chat template "
                            "(model.tokenizer_name)")
        self.tokenizer, self.role = tokenizer, role
        probe = [{"role": "user", "content": _PROBE_QUESTION}, {"role": "assistant", "content": _PROBE_REPLY}]
        self._before = _render(tokenizer, probe, add_generation_prompt=False)
        with_message = _render(tokenizer, probe + [{"role": role, "content": "Probe answer 7"}], True)
        if not with_message.startswith(self._before):
            raise UserError("environment: the chat template is not prefix-preserving (rendering one more message "
                            "changes the earlier ones), so turns cannot be spliced token by token; give a model "
                            "whose template only appends")
        self._after_reply = self._before[self._before.rindex(_PROBE_REPLY) + len(_PROBE_REPLY):]
        self._probe = probe

    def observation_text(self, text: str, reply_end: str) -> str:
        """The text the template writes after a reply that ended with `reply_end`, for the message `text`."""
        rendered = _render(self.tokenizer, self._probe + [{"role": self.role, "content": text}], True)
        after_reply = self._after_reply
        if reply_end and after_reply.startswith(reply_end):
            after_reply = after_reply[len(reply_end):]  # the model sampled it; the template's copy is not added
        return after_reply + rendered[len(self._before):]

    def observation_ids(self, text: str, reply_end_id: int) -> list[int]:
        reply_end = self.tokenizer.decode([reply_end_id])
        encoded = self.tokenizer(self.observation_text(text, reply_end), add_special_tokens=False)
        return list(encoded["input_ids"])
