"""core/grpo.py: worked examples computed by hand, and the identities the update relies on.

The running example (two completions, three token positions, the second completion two tokens long):
  logprobs      [[-1.0, -0.5, -2.0], [-0.3, -1.2, 0]]
  old logprobs  [[-1.0, -0.7, -1.8], [-0.3, -0.9, 0]]
  log-ratios    [[0, 0.2, -0.2], [0, -0.3, -]]   ratios [[1, e^0.2 = 1.221403, e^-0.2 = 0.818731], [1, e^-0.3 = 0.740818, -]]
  advantages    [1, -1]; epsilon 0.2 (clip range [0.8, 1.2])
Per-token loss -min(r A, clip(r) A): row 0 [-1, -1.2 (clipped high), -0.818731], row 1 [1, 0.8 (clipped low)];
d loss / d logprob = -A r where unclipped: row 0 [-1, 0, -0.818731], row 1 [1, 0].
"""

import math

import pytest
import torch

from training_wizard.core.groups import repeated_layout_ids
from training_wizard.core.grpo import (
    GRPOLossOptions, StepTokens, aggregate_loss, group_advantages, grpo_shaped_rewards, high_entropy_mask,
    importance_log_weights, per_token_loss, truncation_mask,
)

MASK = torch.tensor([[True, True, True], [True, True, False]])
OLD = torch.tensor([[-1.0, -0.7, -1.8], [-0.3, -0.9, 0.0]])
ADVANTAGES = torch.tensor([1.0, -1.0])
ONE_STEP = StepTokens(local=5.0, world=5.0, accumulation_steps=1, processes=1)


PAIRS = repeated_layout_ids(2, 2)  # 2 completions of each of 2 prompts, completion j of prompt p at row 2 j + p

def logprobs():
    return torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]], requires_grad=True)


def loss_and_grad(options: GRPOLossOptions, max_completion_length=4, mask=MASK, step=ONE_STEP, **kwargs):
    lp = logprobs()
    out = per_token_loss(lp, OLD, ADVANTAGES, mask, options, **kwargs)
    loss = aggregate_loss(out.per_token, mask, options.loss_type, step, max_completion_length)
    loss.backward()
    return out, float(loss.detach()), lp.grad


def test_group_advantages_by_hand():
    # layout (group, prompt): prompt 0 got rewards {1, 3}, prompt 1 got {0, 4}
    rewards = torch.tensor([1.0, 0.0, 3.0, 4.0])
    group, zero = group_advantages(rewards, repeated_layout_ids(2, 2), "group")
    # (r - group mean) / (unbiased group std + 1e-4): std sqrt(2) and 2 sqrt(2)
    torch.testing.assert_close(group, torch.tensor([-0.7070568, -0.7070818, 0.7070568, 0.7070818]))
    assert not zero.any()
    batch, _ = group_advantages(rewards, repeated_layout_ids(2, 2), "batch")  # batch std sqrt(10 / 3) = 1.825742
    torch.testing.assert_close(batch, torch.tensor([-0.5476926, -1.0953851, 0.5476926, 1.0953851]))
    none, _ = group_advantages(rewards, repeated_layout_ids(2, 2), "none")
    torch.testing.assert_close(none, torch.tensor([-1.0, -2.0, 1.0, 2.0]))


def test_group_with_equal_rewards_has_zero_advantage_and_is_flagged():
    rewards = torch.tensor([1.0, 5.0, 3.0, 5.0, 2.0, 5.0])  # prompt 1 always scores 5
    advantages, zero = group_advantages(rewards, repeated_layout_ids(3, 2), "group")
    assert torch.equal(zero, torch.tensor([False, True, False, True, False, True]))
    assert torch.equal(advantages[1::2], torch.zeros(3))
    torch.testing.assert_close(advantages.reshape(3, 2).sum(0), torch.zeros(2), atol=1e-6, rtol=0)


def test_grpo_loss_by_hand():
    out, loss, grad = loss_and_grad(GRPOLossOptions(loss_type="grpo"))
    torch.testing.assert_close(out.per_token * MASK, torch.tensor([[-1.0, -1.2, -0.8187308], [1.0, 0.8, 0.0]]))
    # mean of the sequences' token means: ((-1 - 1.2 - 0.818731) / 3 + (1 + 0.8) / 2) / 2
    assert abs(loss - -0.0531218) < 1e-6
    torch.testing.assert_close(grad, torch.tensor([[-1 / 6, 0.0, -0.8187308 / 6], [1 / 4, 0.0, 0.0]]))
    assert out.high_clipped.tolist() == [[False, True, False], [False, False, False]]
    assert out.low_clipped.tolist() == [[False, False, False], [False, True, False]]


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_token_level_losses_by_hand(loss_type):
    _, loss, grad = loss_and_grad(GRPOLossOptions(loss_type=loss_type))
    # the sum over the 5 real tokens, divided by 5
    assert abs(loss - -0.2437462) < 1e-6
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0, -0.8187308], [1.0, 0.0, 0.0]]) / 5)


def test_dr_grpo_divides_by_a_constant():
    _, loss, grad = loss_and_grad(GRPOLossOptions(loss_type="dr_grpo"), max_completion_length=4)
    # the sum over real tokens / (2 sequences x max_completion_length 4)
    assert abs(loss - -0.1523413) < 1e-6
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0, -0.8187308], [1.0, 0.0, 0.0]]) / 8)


def test_epsilon_high_lets_a_positive_advantage_ratio_rise_further():
    out, _, grad = loss_and_grad(GRPOLossOptions(loss_type="dapo", epsilon_high=0.28))
    # e^0.2 = 1.221403 < 1.28: no longer clipped, so it keeps its gradient -A r
    assert abs(float(out.per_token[0, 1].detach()) - -1.2214028) < 1e-6
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.2214028, -0.8187308], [1.0, 0.0, 0.0]]) / 5)
    assert not out.high_clipped.any() and out.low_clipped[1, 1]


def test_cispo_caps_the_weight_and_keeps_every_gradient():
    out, loss, grad = loss_and_grad(GRPOLossOptions(loss_type="cispo", epsilon_high=1.1))
    # -sg[min(r, 1.1)] A logp: row 0 weights [1, 1.1, 0.818731] (A = 1), row 1 [1, 0.740818] (A = -1)
    torch.testing.assert_close(out.per_token * MASK, torch.tensor([[1.0, 0.55, 1.6374615], [-0.3, -0.8889819, 0.0]]))
    assert abs(loss - (3.1874615 - 0.3 - 0.8889819) / 5) < 1e-6
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.1, -0.8187308], [1.0, 0.7408182, 0.0]]) / 5)
    assert out.high_clipped.tolist() == [[False, True, False], [False, False, False]]


def test_delta_caps_the_ratio_of_a_negative_advantage():
    lp = torch.tensor([[-0.5]], requires_grad=True)
    old, mask, advantage = torch.tensor([[-1.0]]), torch.tensor([[True]]), torch.tensor([-1.0])
    # r = e^0.5 = 1.648721 with A = -1: max(r, clip(r)) = r without delta, gradient r
    plain = per_token_loss(lp, old, advantage, mask, GRPOLossOptions())
    plain.per_token.sum().backward()
    assert abs(float(plain.per_token.detach()) - 1.6487213) < 1e-6 and abs(float(lp.grad) - 1.6487213) < 1e-6
    lp.grad = None
    capped = per_token_loss(lp, old, advantage, mask, GRPOLossOptions(delta=1.5))
    capped.per_token.sum().backward()
    assert abs(float(capped.per_token.detach()) - 1.5) < 1e-6 and float(lp.grad) == 0.0


def test_upper_clip_share_is_measured_after_the_delta_cap():
    """r = e^0.5 = 1.6487 with A = +1 and epsilon_high 0.2: clipped above 1.2. A delta of 1.1 caps r first (TRL
    takes clip_ratio/high_mean on the capped ratio), and 1.1 is inside the bound: not counted as clipped."""
    lp, old, mask, advantage = torch.tensor([[-0.5]]), torch.tensor([[-1.0]]), torch.tensor([[True]]), torch.tensor([1.0])
    assert per_token_loss(lp, old, advantage, mask, GRPOLossOptions()).high_clipped.tolist() == [[True]]
    assert per_token_loss(lp, old, advantage, mask, GRPOLossOptions(delta=1.5)).high_clipped.tolist() == [[True]]
    assert per_token_loss(lp, old, advantage, mask, GRPOLossOptions(delta=1.1)).high_clipped.tolist() == [[False]]


def test_sequence_level_ratio_by_hand():
    out, loss, grad = loss_and_grad(GRPOLossOptions(loss_type="grpo", importance_sampling_level="sequence"))
    # s_0 = exp(mean(0, 0.2, -0.2)) = 1, s_1 = exp(mean(0, -0.3)) = e^-0.15 = 0.860708, both inside [0.8, 1.2]
    torch.testing.assert_close(out.ratio * MASK, torch.tensor([[1.0, 1.0, 1.0], [0.8607080, 0.8607080, 0.0]]))
    assert abs(loss - -0.0696460) < 1e-6
    # the gradient of exp(s_i) A / |y_i| per token: s_i A / |y_i| / 2 sequences
    torch.testing.assert_close(grad, torch.tensor([[-1 / 6, -1 / 6, -1 / 6], [0.860708 / 4, 0.860708 / 4, 0.0]]))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_sequence_level_equals_gspo_broadcast_form(loss_type):
    """GSPO-token's per-token form gives the same loss and gradient as the (B, 1) sequence weight broadcast over
    the tokens (TRL's form), under each aggregation."""
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(4, 6, generator=gen) > 0.3
    mask[:, 0] = True
    old = -torch.rand(4, 6, generator=gen) * 2
    start = old + 0.2 * torch.randn(4, 6, generator=gen)
    advantages = torch.randn(4, generator=gen)
    step = StepTokens(local=float(mask.sum()), world=float(mask.sum()), accumulation_steps=1, processes=1)
    options = GRPOLossOptions(loss_type=loss_type, importance_sampling_level="sequence", epsilon=0.05)
    ours = start.clone().requires_grad_(True)
    out = per_token_loss(ours, old, advantages, mask, options)
    loss = aggregate_loss(out.per_token, mask, loss_type, step, 6)
    loss.backward()
    theirs = start.clone().requires_grad_(True)
    weight = torch.exp(((theirs - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
    broadcast = -torch.min(weight * advantages[:, None], weight.clamp(0.95, 1.05) * advantages[:, None])
    reference = aggregate_loss(broadcast.expand(4, 6), mask, loss_type, step, 6)
    reference.backward()
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(ours.grad, theirs.grad)


def test_importance_log_weights_value_is_the_sequence_mean():
    lp = logprobs()
    weights = importance_log_weights(lp, OLD, MASK, "sequence")
    torch.testing.assert_close(weights.detach() * MASK, torch.tensor([[0.0, 0.0, 0.0], [-0.15, -0.15, 0.0]]))


def test_beta_adds_the_k3_kl_per_token():
    lp = torch.tensor([[-1.0]], requires_grad=True)
    ref, mask = torch.tensor([[-1.5]]), torch.tensor([[True]])
    # advantage 0: only the KL term; k3 = e^(ref - lp) - (ref - lp) - 1 = e^-0.5 + 0.5 - 1; gradient 1 - e^-0.5
    out = per_token_loss(lp, lp.detach(), torch.tensor([0.0]), mask, GRPOLossOptions(beta=0.1), ref_logprobs=ref)
    out.per_token.sum().backward()
    assert abs(float(out.per_token.detach()) - 0.1 * 0.1065307) < 1e-7
    assert abs(float(out.kl) - 0.1065307) < 1e-6
    assert abs(float(lp.grad) - 0.1 * 0.3934693) < 1e-7


def test_mask_truncated_completions_leaves_them_out():
    loss_mask = truncation_mask(MASK, torch.tensor([True, False]))
    step = StepTokens(local=3.0, world=3.0, accumulation_steps=1, processes=1)
    _, loss, grad = loss_and_grad(GRPOLossOptions(loss_type="dapo"), mask=loss_mask, step=step)
    # only row 0's three tokens: (-1 - 1.2 - 0.818731) / 3
    assert abs(loss - -1.0062436) < 1e-6
    torch.testing.assert_close(grad, torch.tensor([[-1 / 3, 0.0, -0.8187308 / 3], [0.0, 0.0, 0.0]]))


def test_high_entropy_mask_keeps_the_top_share():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 0.8, 9.0]])
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    pool = entropy[mask]  # 0.1 0.2 0.3 0.5 0.7 0.8 0.9: the 0.6 quantile is 0.7 (linear, exactly at a value)
    kept = high_entropy_mask(entropy, mask, 0.4, pool)
    assert kept.tolist() == [[False, True, False, True], [False, False, True, False]]
    assert torch.equal(high_entropy_mask(entropy, mask, 1.0, pool), mask)


def _random_batch(rows=8, width=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, width, generator=gen) > 0.35
    mask[:, 0] = True
    old = -torch.rand(rows, width, generator=gen) * 3
    start = old + 0.3 * torch.randn(rows, width, generator=gen)
    return start, old, torch.randn(rows, generator=gen), mask


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "bnpo", "grpo", "dr_grpo"])
def test_gradient_accumulation_gives_the_full_batch_gradient(loss_type):
    """4 micro-batches of 2 rows, each loss divided by 4 (as accelerate's accumulation does), sum to the one
    8-row batch's gradient, although the micro-batches hold different numbers of tokens."""
    start, old, advantages, mask = _random_batch()
    options = GRPOLossOptions(loss_type=loss_type, epsilon_high=0.28, epsilon=0.1)
    tokens = float(mask.sum())
    full_lp = start.clone().requires_grad_(True)
    out = per_token_loss(full_lp, old, advantages, mask, options)
    aggregate_loss(out.per_token, mask, loss_type, StepTokens(tokens, tokens, 1, 1), 7).backward()
    split_lp = start.clone().requires_grad_(True)
    step = StepTokens(tokens, tokens, accumulation_steps=4, processes=1)
    for rows in torch.arange(8).split(2):
        out = per_token_loss(split_lp[rows], old[rows], advantages[rows], mask[rows], options)
        (aggregate_loss(out.per_token, mask[rows], loss_type, step, 7) / 4).backward()
    assert len({int(mask[rows].sum()) for rows in torch.arange(8).split(2)}) > 1  # unequal token counts
    torch.testing.assert_close(split_lp.grad, full_lp.grad, atol=1e-7, rtol=1e-6)


def test_dapo_over_processes_and_accumulation_gives_the_full_batch_gradient():
    """2 processes x 2 micro-batches of 2 rows: each process divides its micro-batch losses by 2 (accumulation),
    data parallel averages the two processes' gradients; the result is the 8-row batch's dapo gradient."""
    start, old, advantages, mask = _random_batch(seed=1)
    options = GRPOLossOptions(loss_type="dapo")
    tokens = float(mask.sum())
    full_lp = start.clone().requires_grad_(True)
    out = per_token_loss(full_lp, old, advantages, mask, options)
    aggregate_loss(out.per_token, mask, "dapo", StepTokens(tokens, tokens, 1, 1), 7).backward()
    grads = []
    for process_rows in (torch.arange(0, 4), torch.arange(4, 8)):
        lp = start.clone().requires_grad_(True)
        step = StepTokens(float(mask[process_rows].sum()), tokens, accumulation_steps=2, processes=2)
        for rows in process_rows.split(2):
            out = per_token_loss(lp[rows], old[rows], advantages[rows], mask[rows], options)
            (aggregate_loss(out.per_token, mask[rows], "dapo", step, 7) / 2).backward()
        grads.append(lp.grad)
    assert float(mask[:4].sum()) != float(mask[4:].sum())
    torch.testing.assert_close((grads[0] + grads[1]) / 2, full_lp.grad, atol=1e-7, rtol=1e-6)


def test_shaped_rewards_without_reference_have_zero_kl():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    lp = -torch.rand(4, 3)
    mask = torch.ones(4, 3, dtype=torch.bool)
    shaped = grpo_shaped_rewards(scores, lp, lp, mask, torch.tensor([True, True, False, True]), PAIRS,
                                 mask_truncated_completions=True)
    assert torch.equal(shaped.kl, torch.zeros(4)) and torch.equal(shaped.rlhf_reward, scores)
    assert shaped.loss_mask.sum(-1).tolist() == [3, 3, 0, 3]
    expected = 0.5 / (math.sqrt(0.5) + 1e-4)  # group {1, 0}: mean 0.5, unbiased std sqrt(0.5)
    torch.testing.assert_close(shaped.advantages, torch.tensor([expected, -expected, -expected, expected]))


def test_dynamic_sampling_leaves_constant_groups_out_of_the_loss_and_the_token_count():
    # prompt 0 scored {1, 0}, prompt 1 scored {2, 2}: prompt 1's group carries no signal
    scores = torch.tensor([1.0, 2.0, 0.0, 2.0])
    lp = -torch.rand(4, 3)
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, True]])
    has_stop = torch.ones(4, dtype=torch.bool)
    shaped = grpo_shaped_rewards(scores, lp, lp, mask, has_stop, PAIRS, drop_constant_groups=True)
    assert shaped.loss_mask.sum(-1).tolist() == [2, 0, 1, 0]
    assert shaped.std_is_zero.tolist() == [False, True, False, True]
    kept = grpo_shaped_rewards(scores, lp, lp, mask, has_stop, PAIRS)
    assert torch.equal(kept.loss_mask, mask) and torch.equal(kept.advantages, shaped.advantages)
    # the token count a dapo step divides by is the loss mask's: prompt 0's 3 tokens, not all 9 real ones
    assert int(shaped.loss_mask.sum()) == 3 and int(mask.sum()) == 9


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_dynamic_sampling_drops_constant_groups_from_every_loss_types_divisor(loss_type):
    """Prompt 1's group {2, 2} is dropped: the step's loss must equal the loss of prompt 0's group alone. Before,
    grpo and dr_grpo still divided by all 4 sequences (the dropped ones counted as zero-loss sequences)."""
    scores = torch.tensor([1.0, 2.0, 0.0, 2.0])
    per_token = torch.tensor([[0.3, -0.2, 9.0], [0.5, 0.1, 0.4], [0.7, 9.0, 9.0], [0.2, -0.6, 0.1]])
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, True]])
    lp = torch.zeros(4, 3)
    shaped = grpo_shaped_rewards(scores, lp, lp, mask, torch.ones(4, dtype=torch.bool), PAIRS, drop_constant_groups=True)
    kept = shaped.kept_rows
    assert kept.tolist() == [True, False, True, False]
    tokens = float(shaped.loss_mask.sum())
    step = StepTokens(tokens, tokens, 1, 1, world_rows=float(kept.sum()))
    dropped = aggregate_loss(per_token, shaped.loss_mask, loss_type, step, 3)
    alone = aggregate_loss(per_token[kept], mask[kept], loss_type, StepTokens(tokens, tokens, 1, 1), 3)
    torch.testing.assert_close(dropped, alone)
