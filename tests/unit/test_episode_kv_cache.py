"""`[environment] keep_kv_cache` (rollout/kept_cache.py): episodes that keep the decode loop's KV cache across
their turns sample the same tokens, with the same sampling logprobs up to float rounding, as episodes that re-encode
their whole context every turn, for a text environment and a tools episode, greedy and sampled, Llama and Qwen2;
and they run only the new tokens through the model."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from training_wizard.rollout.backends import DecodeLoopBackend
from training_wizard.rollout.collector import SamplingSettings
from training_wizard.rollout.episodes import EpisodePlayer, use_episode_chat_template
from training_wizard.rollout.prompts import EncodedPrompts
from training_wizard.specs.episode import EpisodeSettings
from training_wizard.testing import build_causal_lm

STOPS = tuple(range(40, 300, 2))  # every even id from 40: replies are a few tokens long, episodes reach later turns


class Echo:
    """Answers each reply with its length; done after the row's `turns` replies, so rows end at different turns."""

    def reset(self, prompt=None, turns=4, **columns):
        self.left = turns
        return "Count the letters."

    def step(self, reply):
        self.left -= 1
        return f"You wrote {len(reply)} letters.", 1.0, self.left == 0


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def always_calls(text: str) -> list[dict]:
    """Every reply calls the tool (a random model writes no Hermes calls), so every episode goes on to its limit."""
    return [{"name": "multiply", "arguments": {"a": 3, "b": len(text)}}]


TEXT = EpisodeSettings(protocol="text", max_turns=4)
TOOLS = EpisodeSettings(protocol="tools", tools=(multiply,), tool_parser=always_calls, chat_template="hermes",
                        max_tool_calling_iterations=3)


def play(tokenizer, model, settings: EpisodeSettings, keep: bool, temperature: float, chunk_rows: int = 3,
         response_length: int = 160, calls: list[int] | None = None, filters=None):
    """Six episodes (three prompts, two rows each) played with the decode loop; `calls` collects the number of
    token positions of every forward pass."""
    tokenizer = copy.deepcopy(tokenizer)
    use_episode_chat_template(tokenizer, settings.chat_template)
    sampling = SamplingSettings(response_length, temperature, STOPS, tokenizer.pad_token_id, chunk_rows,
                                filters=filters)
    factory = Echo if settings.protocol == "text" else None
    player = EpisodePlayer(tokenizer, DecodeLoopBackend(chunk_rows), sampling, factory,
                           dataclasses.replace(settings, keep_kv_cache=keep))
    rows = [{"prompt": [{"role": "user", "content": f"Say something {i}."}], "turns": 2 + i} for i in range(3)]
    prompts = EncodedPrompts.from_rows(rows, tokenizer)
    hook = None
    if calls is not None:
        hook = model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].numel()),
                                               with_kwargs=True)
    try:
        return player.play(model, prompts, [0, 0, 1, 1, 2, 2], [11, 12, 13, 14, 15, 16], torch.device("cpu"))
    finally:
        if hook is not None:
            hook.remove()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("settings", [TEXT, TOOLS], ids=["text", "tools"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_kept_cache_samples_what_re_encoding_samples(arch, settings, temperature, tokenizer):
    model = build_causal_lm(tokenizer, arch=arch, seed=2).eval()
    again = play(tokenizer, model, settings, keep=False, temperature=temperature)
    kept = play(tokenizer, model, settings, keep=True, temperature=temperature)
    assert max(len(episode.replies) for episode in again) >= 3  # the comparison covers later turns
    assert len({len(episode.replies) for episode in again}) > 1 or settings is TOOLS  # rows end at different turns
    for one, other in zip(again, kept):
        assert other.ids == one.ids
        assert other.sampled == one.sampled
        assert other.stop == one.stop
        torch.testing.assert_close(torch.tensor(other.logprobs), torch.tensor(one.logprobs), rtol=0, atol=1e-5)


def test_filters_and_repetition_penalty_see_the_whole_context_with_a_kept_cache(tokenizer):
    """The repetition penalty reads every earlier token of the episode, which the kept path no longer encodes."""
    from training_wizard.rollout.sampling import SamplingFilters

    model = build_causal_lm(tokenizer, seed=3).eval()
    filters = SamplingFilters(top_k=40, repetition_penalty=1.5)
    again = play(tokenizer, model, TEXT, keep=False, temperature=0.9, filters=filters)
    kept = play(tokenizer, model, TEXT, keep=True, temperature=0.9, filters=filters)
    for one, other in zip(again, kept):
        assert other.ids == one.ids
        torch.testing.assert_close(torch.tensor(other.logprobs), torch.tensor(one.logprobs), rtol=0, atol=1e-5)


@pytest.mark.parametrize("settings", [TEXT, TOOLS], ids=["text", "tools"])
def test_a_kept_cache_runs_only_the_new_tokens_through_the_model(settings, tokenizer):
    """Re-encoding runs every turn's whole context; the kept cache each token about once (plus left padding)."""
    model = build_causal_lm(tokenizer, seed=2).eval()
    again: list[int] = []
    kept: list[int] = []
    play(tokenizer, model, settings, keep=False, temperature=1.0, calls=again)
    play(tokenizer, model, settings, keep=True, temperature=1.0, calls=kept)
    assert len(kept) == len(again)  # as many forward passes: one prefill per chunk and turn, one per token step
    assert sum(kept) < 0.5 * sum(again)


def test_a_kept_cache_with_lora_folded_for_sampling_samples_what_re_encoding_samples(tokenizer):
    """The decode loop folds LoRA into its base weights while it samples: the kept cache is made under the fold of
    every turn and read under the next one's."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(build_causal_lm(tokenizer, seed=2),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)).eval()
    again = play(tokenizer, model, TEXT, keep=False, temperature=1.0)
    kept = play(tokenizer, model, TEXT, keep=True, temperature=1.0)
    for one, other in zip(again, kept):
        assert other.ids == one.ids
        torch.testing.assert_close(torch.tensor(other.logprobs), torch.tensor(one.logprobs), rtol=0, atol=1e-5)
