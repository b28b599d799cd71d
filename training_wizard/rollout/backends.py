"""Generation backends: one interface, two implementations, chosen once at set-up (`trainers/loop/setup.py`).

A backend turns left-padded prompts and one sampling key per row into tokens and the sampling logprob of each
token (`Generated`). The built-in decode loop (rollout/generation.py) samples with the policy module itself;
vLLM (rollout/vllm.py) samples with an engine of its own that holds a copy of the policy's weights, which the
trainer refreshes through `sync_weights` after every update. The rollout collector and `training-wizard eval`
call `sample_completions`; nothing else knows which backend runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from training_wizard.core.masking import truncate_after_stop
from training_wizard.rollout.adapters import adapters_folded
from training_wizard.rollout.generation import GenerationParams, Generated, sample
from training_wizard.rollout.kept_cache import KeptCaches, sample_keeping_cache


class GenerationBackend:
    """The interface. `sample` gets the model the rollout passes use (the decode loop samples with it; an engine
    holding its own weights ignores it) and whether its weights are sharded (then every forward pass is a
    collective, and `all_finished` agrees across processes when to stop).

    Weights: `weights_changed()` is called after every update; the next `sync_weights(model)`, made before
    sampling, pushes them where the backend samples from. The decode loop samples with the live module and needs
    neither.
    """

    name = "base"
    samples_with_training_forward = False  # whether `Generated.logprobs` are the training forward pass's numbers
    keeps_episode_cache = False  # whether `sample_keeping_cache` keeps an episode's KV cache across its turns

    def sample(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               params: GenerationParams, row_seeds: list[int], sharded: bool = False,
               all_finished: Callable[[bool], bool] | None = None) -> Generated:
        raise NotImplementedError

    def weights_changed(self) -> None:
        """The trained weights changed (after an update, or a checkpoint was loaded)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the weights sampled from equal to `model`'s, if they changed since the last call."""

    def close(self) -> None:
        """Release the engine (at the end of a run)."""


class DecodeLoopBackend(GenerationBackend):
    """The built-in keyed decode loop, `chunk_rows` rows at a time (local_rollout_forward_batch_size), LoRA folded
    into its base weights while it samples (rollout/adapters.py) unless `fold_lora` is False (a copy of every
    adapted weight saved, at a slower token step)."""

    name = "decode loop"
    samples_with_training_forward = True
    keeps_episode_cache = True

    def __init__(self, chunk_rows: int, fold_lora: bool = True):
        self.chunk_rows = chunk_rows
        self.fold_lora = fold_lora

    def _folded(self, model, sharded: bool = False):
        # a sharded model's weights are gathered layer by layer inside its forward, so it runs as it is
        return adapters_folded(model) if self.fold_lora and not sharded else contextlib.nullcontext()

    def sample(self, model, prompt_ids, prompt_mask, params, row_seeds, sharded=False, all_finished=None):
        with self._folded(model, sharded):
            chunks = [
                sample(model, prompt_ids[start : start + self.chunk_rows], prompt_mask[start : start + self.chunk_rows],
                       params, row_seeds[start : start + self.chunk_rows], all_finished)
                for start in range(0, prompt_ids.shape[0], self.chunk_rows)
            ]
        return join_generated(chunks, params.pad_token_id)

    def sample_keeping_cache(self, model, prompt_ids, prompt_mask, params, row_seeds, kept: KeptCaches,
                             episodes: list[int]) -> Generated:
        """`sample` for turns of episodes `episodes` (one per row) whose caches `kept` holds across their turns
        (rollout/kept_cache.py), in the same chunks of rows."""
        rows = self.chunk_rows
        with self._folded(model):
            chunks = [
                sample_keeping_cache(model, prompt_ids[start : start + rows], prompt_mask[start : start + rows],
                                     params, row_seeds[start : start + rows], kept, episodes[start : start + rows])
                for start in range(0, prompt_ids.shape[0], rows)
            ]
        return join_generated(chunks, params.pad_token_id)


def join_generated(chunks: list[Generated], pad_token_id: int, width: int | None = None) -> Generated:
    """Stack row chunks of different widths into one (B, width) Generated (default width: the widest chunk);
    tokens are padded with pad, logprobs with 0."""
    width = width if width is not None else max(chunk.tokens.shape[1] for chunk in chunks)
    pad = torch.nn.functional.pad
    return Generated(
        torch.cat([pad(c.tokens, (0, width - c.tokens.shape[1]), value=pad_token_id) for c in chunks]),
        torch.cat([pad(c.logprobs, (0, width - c.logprobs.shape[1])) for c in chunks]),
    )


@dataclass(frozen=True)
class Completions:
    """responses: (B, T) truncated after the stop token (pad after it); mask: (B, T) bool, True = real token (the
    stop token included); has_stop: (B,) bool; sampling_logprobs: (B, T) float32, 0 where mask is False."""

    responses: torch.Tensor
    mask: torch.Tensor
    has_stop: torch.Tensor
    sampling_logprobs: torch.Tensor


def sample_completions(backend: GenerationBackend, model: torch.nn.Module, prompt_ids: torch.Tensor,
                       prompt_mask: torch.Tensor, params: GenerationParams, row_seeds: list[int], *,
                       sharded: bool = False, all_finished: Callable[[bool], bool] | None = None,
                       agree_width: Callable[[int], int] | None = None,
                       kept: tuple[KeptCaches, list[int]] | None = None) -> Completions:
    """Sample with `backend` and truncate each row after its first stop token.

    agree_width(local_width) -> the width every process uses (token-level statistics gather (B, T) tensors across
    processes, so all must have one width); None keeps the local one. kept: (the caches, each row's episode) for a
    turn of episodes whose KV caches are kept across turns, where the backend can (`keeps_episode_cache`).
    """
    backend.sync_weights(model)
    if kept is not None and backend.keeps_episode_cache and not sharded:
        generated = backend.sample_keeping_cache(model, prompt_ids, prompt_mask, params, row_seeds, *kept)
    else:
        generated = backend.sample(model, prompt_ids, prompt_mask, params, row_seeds, sharded, all_finished)
    width = generated.tokens.shape[1] if agree_width is None else agree_width(generated.tokens.shape[1])
    generated = join_generated([generated], params.pad_token_id, width)
    responses, mask, has_stop = truncate_after_stop(generated.tokens, params.stop_token_ids, params.pad_token_id)
    logprobs = torch.where(mask, generated.logprobs, torch.zeros_like(generated.logprobs))
    return Completions(responses, mask, has_stop, logprobs)
