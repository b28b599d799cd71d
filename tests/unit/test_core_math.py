"""core/: worked examples with hand-computed values, and the identities the losses rely on."""

import torch
import torch.nn.functional as F

from training_wizard.core.advantages import normalize_and_clip, reward_to_go, rloo_advantages, whiten
from training_wizard.core.kl import kl_per_token, sequence_rlhf_reward, token_rewards
from training_wizard.core.logprobs import logprobs_and_entropy, selective_logprobs
from training_wizard.core.losses import clipped_surrogate_sequence, clipped_surrogate_token
from training_wizard.core.groups import repeated_layout_ids
from training_wizard.core.masking import first_true_index, masked_mean, truncate_after_stop


def test_rloo_advantages_match_seed_loop_example():
    # TRL's RLOO docs and the RLOO blog post: 3 prompts x 4 completions, flat layout [k0 p0..p2, k1 p0..p2, ...]
    rewards = torch.tensor([1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9, 10]).float()
    rloo_k, prompts = 4, 3
    slow = torch.zeros_like(rewards)
    for i in range(0, len(rewards), prompts):
        others = [rewards[j : j + prompts] for j in range(0, len(rewards), prompts) if j != i]
        slow[i : i + prompts] = rewards[i : i + prompts] - torch.stack(others).mean(0)
    advantages = rloo_advantages(rewards, repeated_layout_ids(rloo_k, prompts))
    torch.testing.assert_close(advantages, slow)
    assert abs(advantages[0].item() - (1 - (2 + 5 + 8) / 3)) < 1e-6
    assert abs(advantages[7].item() - (6 - (3 + 2 + 9) / 3)) < 1e-6


def test_rloo_advantages_sum_to_zero_per_prompt():
    rewards = torch.randn(5 * 7, generator=torch.Generator().manual_seed(0))
    per_prompt = rloo_advantages(rewards, repeated_layout_ids(5, 7)).reshape(5, 7).sum(0)
    torch.testing.assert_close(per_prompt, torch.zeros(7), atol=1e-5, rtol=0)


def test_equal_rewards_give_zero_advantages_and_no_nan():
    rewards = torch.full((8,), 3.0)
    advantages = rloo_advantages(rewards, repeated_layout_ids(2, 4))
    assert torch.equal(advantages, torch.zeros(8))
    assert torch.isfinite(whiten(advantages)).all() and torch.equal(whiten(advantages), torch.zeros(8))
    assert torch.equal(normalize_and_clip(rewards, 10.0), torch.zeros(8))


def test_reinforce_equals_ppo_gradient_worked_example():
    # the RLOO blog post: with pi == pi_old the clipped PPO loss has REINFORCE's gradient.
    action, advantage = torch.tensor([1]), torch.tensor([1.0])
    logits = torch.tensor([[1.0, 2.0, 1.0, 1.0]], requires_grad=True)
    logprob = F.log_softmax(logits, -1).gather(1, action[:, None])  # (B=1, T=1)
    out = clipped_surrogate_sequence(logprob, logprob.detach(), advantage, torch.ones(1, 1, dtype=torch.bool), 0.2)
    (-out.loss).backward()  # the loss is -objective; the seed differentiates the objective
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.1749, 0.5246, -0.1749, -0.1749]]), atol=1e-4, rtol=0)
    assert out.ratio.item() == 1.0 and out.clipfrac.item() == 0.0 and out.approxkl.item() == 0.0


def test_kl_and_entire_completion_reward_seed_example():
    logprobs = torch.tensor([[-12.3, -8.3, -2.3]])
    ref = torch.tensor([[-11.3, -8.4, -2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    kl = kl_per_token(logprobs, ref, "k1")
    torch.testing.assert_close(kl, torch.tensor([[-1.0, 0.1, -0.3]]), atol=1e-5, rtol=0)
    # the seed's per-token reward is +kl with the score added at the last (EOS) token: kl_coef = -1 here
    per_token = token_rewards(torch.tensor([1.0]), kl, mask, kl_coef=-1.0)
    torch.testing.assert_close(per_token, torch.tensor([[-1.0, 0.1, 0.7]]), atol=1e-5, rtol=0)
    assert abs(per_token.sum().item() - (-0.2)) < 1e-5
    rlhf, non_score = sequence_rlhf_reward(torch.tensor([1.0]), kl, mask, kl_coef=-1.0)
    assert abs(rlhf.item() - (-0.2)) < 1e-5 and abs(non_score.item() - (-1.2)) < 1e-5


def test_k3_is_nonnegative_and_zero_when_equal():
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    assert (kl_per_token(a, b, "k3") >= -1e-7).all()
    assert torch.equal(kl_per_token(a, a, "k3"), torch.zeros(4, 6))
    assert torch.equal(kl_per_token(a, a, "k1"), torch.zeros(4, 6))


def test_truncate_after_stop_keeps_stop_token_and_masks_the_rest():
    responses = torch.tensor([[5, 9, 2, 7], [4, 4, 4, 4], [2, 1, 1, 1]])
    out, mask, has_stop = truncate_after_stop(responses, stop_token_ids=(2,), pad_token_id=0)
    assert out.tolist() == [[5, 9, 2, 0], [4, 4, 4, 4], [2, 0, 0, 0]]
    assert mask.tolist() == [[True, True, True, False], [True] * 4, [True, False, False, False]]
    assert has_stop.tolist() == [True, False, True]
    assert first_true_index(torch.tensor([[False, False]])).tolist() == [2]


def test_selective_logprobs_and_entropy_match_full_softmax():
    logits = torch.randn(2, 5, 11)
    tokens = torch.randint(0, 11, (2, 5))
    full = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(selective_logprobs(logits, tokens, 0.7), full)
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(logprobs_and_entropy(logits, tokens).entropy, -(probs * probs.log()).sum(-1))


def test_masked_mean_ignores_masked_and_is_zero_when_empty():
    values = torch.tensor([[1.0, 100.0], [3.0, 5.0]])
    mask = torch.tensor([[True, False], [True, True]])
    assert masked_mean(values, mask).item() == 3.0
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_clipping_takes_the_pessimistic_branch():
    old = torch.zeros(2, 1)
    new = torch.log(torch.tensor([[1.5], [0.5]]))  # ratios 1.5 and 0.5
    mask = torch.ones(2, 1, dtype=torch.bool)
    out = clipped_surrogate_sequence(new, old, torch.tensor([1.0, 1.0]), mask, 0.2)
    # advantage > 0: ratio 1.5 clipped to 1.2 (clipped branch taken); ratio 0.5 unclipped (0.5 < 0.8 is worse)
    assert abs(out.loss.item() - (-(1.2 + 0.5) / 2)) < 1e-6
    assert out.clipfrac.item() == 0.5


def test_split_batch_with_accumulation_gives_full_batch_gradient():
    torch.manual_seed(0)
    weight = torch.randn(6, 4, requires_grad=True)
    features, tokens = torch.randn(8, 3, 6), torch.randint(0, 4, (8, 3))
    old = torch.randn(8, 3) * 0.1 - 1.0
    advantages, mask = torch.randn(8), torch.rand(8, 3) > 0.3

    for loss_fn, adv in ((clipped_surrogate_sequence, advantages), (clipped_surrogate_token, advantages[:, None].expand(8, 3))):
        def loss(rows):
            logp = selective_logprobs(features[rows] @ weight, tokens[rows])
            return loss_fn(logp, old[rows], adv[rows], mask[rows], 0.2).loss

        weight.grad = None
        loss(slice(0, 8)).backward()
        full = weight.grad.clone()
        weight.grad = None
        for part in (slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)):
            (loss(part) / 4).backward()
        torch.testing.assert_close(weight.grad, full, atol=1e-6, rtol=0)


def test_reward_to_go_and_whiten():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert reward_to_go(rewards, mask).tolist() == [[6.0, 5.0, 3.0, 0.0]]
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    white = whiten(values)
    assert abs(white.mean().item()) < 1e-6 and abs(white.std().item() - 1.0) < 1e-3
    kept = whiten(values, shift_mean=False)
    assert abs(kept.mean().item() - 2.5) < 1e-6
