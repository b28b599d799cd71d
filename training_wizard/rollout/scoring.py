"""No-grad passes over prompt + response: logprobs of policy or reference, and sequence-classifier scores."""

from __future__ import annotations

import torch

from training_wizard.core.logprobs import selective_logprobs
from training_wizard.rollout.generation import last_positions, position_ids_from_mask


def response_logits(model: torch.nn.Module, prompt_ids, prompt_mask, responses) -> torch.Tensor:
    """Training-style forward pass; returns the logits that predict each response token. -> (B, T, V).

    The attention mask covers the prompt's real tokens and every response position, exactly as during
    generation, so positions and attention match the sampling pass (tokens after the stop token are masked
    out of every loss and never influence earlier positions).
    """
    ids = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask.long(), torch.ones_like(responses)], dim=1)
    width, length = responses.shape[1], ids.shape[1]
    return model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
        logits_to_keep=last_positions(length - 1, width, ids.device),  # the T positions predicting the response
        use_cache=False,  # one pass, no decoding after it (and no warning under activation checkpointing)
    ).logits


def content_columns(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> tuple[int, int]:
    """(first prompt column holding a real token in any row, response columns up to the last real token of any
    row). Columns outside are padding in every row: attention masks them out, so cutting them changes nothing but
    the work. At least one response column is kept."""
    real_prompt = prompt_mask.any(0).nonzero()
    start = int(real_prompt[0]) if real_prompt.numel() else 0
    real_response = response_mask.any(0).nonzero()
    end = int(real_response[-1]) + 1 if real_response.numel() else 1
    return start, end


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module, prompt_ids, prompt_mask, responses, response_mask, temperature: float, batch_size: int
) -> torch.Tensor:
    """Per-token logprobs of the responses under `model`, `batch_size` rows at a time, each chunk cut to its
    content (`content_columns`). -> (B, T) float32, 0 after every row's last real token of the chunk."""
    out = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
    for start in range(0, responses.shape[0], batch_size):
        part = slice(start, start + batch_size)
        first, end = content_columns(prompt_mask[part], response_mask[part])
        logits = response_logits(model, prompt_ids[part, first:], prompt_mask[part, first:], responses[part, :end])
        out[part, :end] = selective_logprobs(logits, responses[part, :end], temperature)
        del logits
    return out


@torch.no_grad()
def classifier_scores(
    model: torch.nn.Module, prompt_ids, prompt_mask, responses, response_mask, pad_token_id: int, batch_size: int
) -> torch.Tensor:
    """Scores of a sequence classifier that shares the policy's tokenizer, read at the last real token. -> (B,)."""
    ids = torch.cat([prompt_ids, torch.where(response_mask, responses, torch.full_like(responses, pad_token_id))], 1)
    mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
    scores = []
    for start in range(0, ids.shape[0], batch_size):
        part = slice(start, start + batch_size)
        logits = model(input_ids=ids[part], attention_mask=mask[part], position_ids=position_ids_from_mask(mask[part])).logits
        scores.append(logits[:, 0].float())
    return torch.cat(scores)
