"""PPO's value pass: one scalar per response token from a sequence-classification model."""

from __future__ import annotations

import torch

from training_wizard.rollout.generation import position_ids_from_mask


def value_logits(value_model: torch.nn.Module, prompt_ids, prompt_mask, responses) -> torch.Tensor:
    """The value of each response token's state: (B, P) left-padded prompts, (B, T) responses -> (B, T) float32.

    The classifier's head is applied to the last hidden state at every position (not only the last token, as its
    own forward does), and the value of response token t is read where token t is predicted: the position before
    it, the same alignment as `scoring.response_logits` (TRL's PPOv2 reads `[context_length - 1 : -1]`). Padding
    after the stop token is attended like real tokens, as in the policy's passes, but masked out of every loss.
    """
    ids = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask.long(), torch.ones_like(responses)], dim=1)
    model = value_model.get_base_model() if hasattr(value_model, "get_base_model") else value_model
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                      use_cache=False).last_hidden_state
    keep = responses.shape[1] + 1
    return model.score(hidden[:, -keep:-1]).squeeze(-1).float()
