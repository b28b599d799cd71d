"""The rule that bounds a stale batch's importance weights (`async_correction`, docs/async.md): per token by default,
the earlier whole-sequence product still selectable, and the synchronous runs' vLLM mode untouched."""

from __future__ import annotations

import math

import pytest
import torch

from training_wizard import RLOOConfig
from training_wizard.trainers.loop.update import UpdateLoop

# Proximal minus behaviour logprobs: row 0 (0.5, -1.0), row 1 (0.0, 1.5); the third column is padding.
PROXIMAL = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, 0.0]])
BEHAVIOUR = torch.tensor([[-1.5, -1.0, -7.0], [-0.3, -1.7, 0.0]])
MASK = torch.tensor([[True, True, False], [True, True, False]])
E = math.e


class ConfiguredLoop(UpdateLoop):
    """The update loop's correction, with nothing but a config."""

    def __init__(self, config):
        self.config = config


def weights(**options):
    return ConfiguredLoop(RLOOConfig(**options)).correction_weights(PROXIMAL, BEHAVIOUR, MASK)


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_the_default_clamps_each_stale_tokens_weight_at_trls_cap_of_three():
    assert RLOOConfig().async_correction == "token_truncate"
    out = weights(async_rollouts=True)
    # e^1.5 = 4.48 is lowered to 3; every other token keeps its ratio; padding weighs 0
    close(out.token, [[E**0.5, E**-1, 0.0], [1.0, 3.0, 0.0]])
    # a sequence loss (RLOO) weighs a completion by the product of its bounded token weights, bounded again
    close(out.sequence, [E**-0.5, 3.0])


def test_the_earlier_whole_sequence_rule_stays_selectable_and_drops_the_completion_the_default_keeps():
    out = weights(async_rollouts=True, async_correction="sequence_mask")
    close(out.sequence, [E**-0.5, 0.0])  # the product e^1.5 = 4.48 is above 3: masked whole
    close(out.token, [[E**-0.5, E**-0.5, 0.0], [0.0, 0.0, 0.0]])


def test_the_per_token_mask_at_areals_bound_of_five_keeps_every_token_here():
    out = weights(async_rollouts=True, async_correction="token_mask", vllm_importance_sampling_clip_max=5.0)
    close(out.token, [[E**0.5, E**-1, 0.0], [1.0, E**1.5, 0.0]])
    close(weights(async_rollouts=True, async_correction="token_mask").token,  # at 3 the 4.48 token is masked
          [[E**0.5, E**-1, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize("options", [{}, {"async_rollouts": True, "max_staleness": 0}],
                         ids=["synchronous", "bound-0"])
def test_runs_that_sample_nothing_ahead_keep_the_vllm_mode(options):
    """max_staleness = 0 is the synchronous loop, bit for bit: its (vLLM) correction keeps its own mode."""
    loop = ConfiguredLoop(RLOOConfig(**options, vllm_importance_sampling_mode="sequence_truncate"))
    assert loop.correction_mode == "sequence_truncate"
    close(loop.correction_weights(PROXIMAL, BEHAVIOUR, MASK).sequence, [E**-0.5, 3.0])


def test_async_correction_without_async_rollouts_is_refused_with_one_line():
    with pytest.raises(ValueError, match=r"^RLOOConfig: async_correction: \"sequence_mask\" takes effect only with async_rollouts "
                                         r"= true \(sampling ahead of the update\); set async_rollouts = true, or remove async_correction"):
        RLOOConfig(async_correction="sequence_mask")
    assert RLOOConfig(async_correction="token_truncate").async_correction == "token_truncate"  # its default: passes


@pytest.mark.parametrize("correction, per_sequence", [("token_truncate", False), ("sequence_mask", True)])
def test_the_sampling_metrics_read_the_weights_the_async_rule_makes(tokenizer, tmp_path, monkeypatch, correction,
                                                                    per_sequence):
    """An async run's correction metrics are per token or per completion as async_correction says, not as the
    (synchronous) vllm_importance_sampling_mode does."""
    from tests.helpers import make_rloo_trainer
    from training_wizard.trainers.loop import iteration_metrics

    seen, measure = [], iteration_metrics.sampling_metrics
    monkeypatch.setattr(iteration_metrics, "sampling_metrics", lambda *args: seen.append(args[-1]) or measure(*args))
    make_rloo_trainer(tokenizer, tmp_path, total_episodes=32, async_rollouts=True, async_correction=correction,
                      vllm_importance_sampling_mode="sequence_mask").train()
    assert seen and set(seen) == {per_sequence}


def test_a_vllm_mode_the_user_chose_holds_for_batches_sampled_ahead_unless_async_correction_is_chosen_too():
    """Async runs used vllm_importance_sampling_mode before async_correction existed: a config that sets it, and
    not the new key, keeps its rule rather than change rule without a word."""
    chosen = ConfiguredLoop(RLOOConfig(async_rollouts=True, vllm_importance_sampling_mode="sequence_truncate"))
    assert chosen.correction_mode == "sequence_truncate"
    both = ConfiguredLoop(RLOOConfig(async_rollouts=True, vllm_importance_sampling_mode="sequence_truncate",
                                     async_correction="token_mask"))
    assert both.correction_mode == "token_mask"
    assert ConfiguredLoop(RLOOConfig(async_rollouts=True)).correction_mode == "token_truncate"


def test_async_correction_at_a_bound_of_zero_is_refused():
    with pytest.raises(ValueError, match=r"max_staleness = 0 is the synchronous loop.*leave async_correction at "
                                         r"\"token_truncate\""):
        RLOOConfig(async_rollouts=True, max_staleness=0, async_correction="sequence_mask")
