"""A conversation rendered through a tokenizer's chat template with the run's template variables
(chat_template_kwargs, TRL's name: e.g. {"enable_thinking": False} for Qwen3's template)."""

from __future__ import annotations

from typing import Any


# The tokenizer travels to every place that renders a conversation (prompt encoding, episode turns, evaluation,
# SFT rows, reward models), so the template's extra variables travel with it rather than through each caller.
_KWARGS_ATTRIBUTE = "training_wizard_chat_template_kwargs"


def bind_chat_template_kwargs(tokenizer: Any, kwargs: dict[str, Any] | None) -> None:
    """Every later rendering through `render_chat` with this tokenizer passes `kwargs` (chat_template_kwargs, e.g.
    {"enable_thinking": False}) to its template; None or {} leaves what is bound."""
    if kwargs:
        setattr(tokenizer, _KWARGS_ATTRIBUTE, dict(kwargs))


def chat_template_kwargs(tokenizer: Any) -> dict[str, Any]:
    """The template variables bound to `tokenizer` ({} when none)."""
    return dict(getattr(tokenizer, _KWARGS_ATTRIBUTE, None) or {})


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], **options: Any) -> Any:
    """tokenizer.apply_chat_template(messages, **options) with the bound template variables."""
    return tokenizer.apply_chat_template(messages, **options, **chat_template_kwargs(tokenizer))


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], **options: Any) -> list[int]:
    """The token ids of `messages` rendered by `render_chat` (tokenize=True)."""
    encoded = render_chat(tokenizer, messages, tokenize=True, **options)
    if hasattr(encoded, "keys") and "input_ids" in encoded:  # transformers 5 returns a BatchEncoding
        encoded = encoded["input_ids"]
    return list(encoded)
