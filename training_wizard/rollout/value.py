"""PPO's value pass: one scalar per response token from a sequence-classification model."""

from __future__ import annotations

import torch

from training_wizard.rollout.packing import completion_prefix, pack_rows, packed_forward, score_layer, unpack
from training_wizard.rollout.scoring import position_ids_from_mask


def value_logits(value_model: torch.nn.Module, prompt_ids, prompt_mask, responses,
                 packed_by: torch.Tensor | None = None) -> torch.Tensor:
    """The value of each response token's state: (B, P) left-padded prompts, (B, T) responses -> (B, T) float32.

    The classifier's head is applied to the last hidden state at every position (not only the last token, as its
    own forward does), and the value of response token t is read where token t is predicted: the position before
    it, the same alignment as `scoring.response_logits` (TRL's PPOv2 reads `[context_length - 1 : -1]`). Padding
    after the stop token is attended like real tokens, as in the policy's passes, but masked out of every loss.
    `packed_by`: the (B, T) completion mask of a padding-free pass (`packed_values`).
    """
    if packed_by is not None:
        return packed_values(value_model, prompt_ids, prompt_mask, responses, packed_by)
    ids = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask.long(), torch.ones_like(responses)], dim=1)
    # Through the model's own forward (not its backbone directly): a data-parallel wrapper only synchronises the
    # gradients of a forward pass it ran. That forward also pools one logit per row, which goes unused.
    out = value_model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                      output_hidden_states=True, use_cache=False)
    keep = responses.shape[1] + 1
    return score_layer(value_model)(out.hidden_states[-1][:, -keep:-1]).squeeze(-1).float()


def packed_values(value_model: torch.nn.Module, prompt_ids, prompt_mask, responses, response_mask) -> torch.Tensor:
    """`value_logits` of one padding-free packed pass (rollout/packing.py): each row's real prompt tokens and its
    completion up to its last real token as one sequence, the head applied where each completion token is
    predicted. -> (B, T) float32, 0 at every position not packed."""
    packed = pack_rows(prompt_ids, prompt_mask, responses, completion_prefix(response_mask))
    out = packed_forward(value_model, packed, output_hidden_states=True)
    hidden = out.hidden_states[-1][0, packed.predictors]  # (M, H)
    return unpack(score_layer(value_model)(hidden).squeeze(-1).float(), packed.kept)
