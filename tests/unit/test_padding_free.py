"""Padding-free packed forwards (training.padding_free, rollout/packing.py): every pass over completions gives the
numbers of the padded pass, on rows of very different lengths with left-padded prompts, for tiny Llama and Qwen2
models under eager and SDPA attention: the no-grad logprobs, PPO's values, a reward model's scores, one update
micro-batch's loss and every parameter's gradient (RLOO, PPO, GRPO; single replies and episodes whose environment
tokens sit inside the completion), and whole short runs' metrics."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import distinct, make_grpo_trainer, make_ppo_trainer, make_rloo_trainer
from tests.unit.test_loss_mask import with_environment_tokens
from training_wizard.errors import UserError
from training_wizard.rollout.packing import completion_prefix, pack_rows
from training_wizard.rollout.scoring import batched_logprobs, classifier_scores, response_token_logprobs
from training_wizard.rollout.value import value_logits
from training_wizard.testing import build_causal_lm, build_sequence_classifier

TOLERANCE = 1e-5
ARCHITECTURES = [("llama", "eager"), ("llama", "sdpa"), ("qwen2", "eager"), ("qwen2", "sdpa")]


def uneven_rows(tokenizer, seed=0):
    """Four rows: left-padded prompts of 7, 2, 5 and 1 tokens; completions of 12, 3, 8 and 1 real tokens, padded
    after them (pad ids, as the rollout leaves them)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_mask = torch.arange(7)[None] >= torch.tensor([0, 5, 2, 6])[:, None]
    prompt_ids = torch.where(prompt_mask, torch.randint(5, 300, (4, 7), generator=generator), tokenizer.pad_token_id)
    completion_mask = torch.arange(12)[None] < torch.tensor([12, 3, 8, 1])[:, None]
    completions = torch.where(completion_mask, torch.randint(5, 300, (4, 12), generator=generator),
                              tokenizer.pad_token_id)
    return prompt_ids, prompt_mask, completions, completion_mask


def test_packing_lays_rows_end_to_end_with_positions_restarting():
    prompt_ids = torch.tensor([[0, 0, 11, 12], [21, 22, 23, 24]])
    prompt_mask = prompt_ids != 0
    completions = torch.tensor([[13, 14, 0], [25, 0, 0]])
    completion_mask = torch.tensor([[True, True, False], [True, False, True]])  # a hole: packed, as it is attended
    kept = completion_prefix(completion_mask)
    assert kept.tolist() == [[True, True, False], [True, True, True]]
    packed = pack_rows(prompt_ids, prompt_mask, completions, kept)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 23, 24, 25, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6]]
    assert packed.rows.tolist() == [0] * 4 + [1] * 7
    assert packed.predictors.tolist() == [1, 2, 7, 8, 9] and packed.tokens.tolist() == [13, 14, 25, 0, 0]
    with pytest.raises(ValueError, match="real prompt token"):
        pack_rows(prompt_ids, torch.tensor([[False] * 4, [True] * 4]), completions, kept)


@pytest.mark.parametrize("arch,attention", ARCHITECTURES)
@pytest.mark.parametrize("from_hidden_states", [True, False], ids=["head", "logits"])
def test_packed_logprobs_equal_padded(tokenizer, arch, attention, from_hidden_states):
    model = build_causal_lm(tokenizer, arch=arch, attn_implementation=attention).eval()
    prompt_ids, prompt_mask, completions, mask = uneven_rows(tokenizer)
    padded, packed = (batched_logprobs(model, prompt_ids, prompt_mask, completions, mask, 0.7, 3, share_prompts=False,
                                       from_hidden_states=from_hidden_states, padding_free=free)
                      for free in (False, True))
    assert (packed - padded)[mask].abs().max() < TOLERANCE
    assert (packed[~mask] == 0).all() and (padded[~mask] != 0).any()  # padding: 0, not the pad tokens' logprobs
    # the update's pass: logprobs and entropy, and the gradient of every parameter
    results = []
    for free in (False, True):
        model.zero_grad()
        token = response_token_logprobs(model, prompt_ids, prompt_mask, completions, 0.7, share_prompts=False,
                                        from_hidden_states=from_hidden_states, packed_by=mask if free else None)
        (token.logprobs * mask).sum().backward()
        results.append((token, {name: p.grad.clone() for name, p in model.named_parameters()}))
    (token, grads), (packed_token, packed_grads) = results
    assert (packed_token.logprobs - token.logprobs)[mask].abs().max() < TOLERANCE
    assert (packed_token.entropy - token.entropy)[mask].abs().max() < TOLERANCE
    assert all(torch.allclose(packed_grads[name], grad, rtol=0, atol=TOLERANCE) for name, grad in grads.items())
    assert all(grad.abs().sum() > 0 for grad in grads.values())


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_values_and_reward_scores_equal_padded(tokenizer, attention):
    classifier = build_sequence_classifier(tokenizer)
    classifier.config._attn_implementation = attention
    prompt_ids, prompt_mask, completions, mask = uneven_rows(tokenizer, seed=1)
    completions[0, 11] = tokenizer.pad_token_id  # a reply ending in the pad id: pooled at the token before it
    values = value_logits(classifier, prompt_ids, prompt_mask, completions)
    packed_values = value_logits(classifier, prompt_ids, prompt_mask, completions, packed_by=mask)
    assert (packed_values - values)[mask].abs().max() < TOLERANCE and (packed_values[~mask] == 0).all()
    scores = classifier_scores(classifier, prompt_ids, prompt_mask, completions, mask, tokenizer.pad_token_id, 3)
    packed_scores = classifier_scores(classifier, prompt_ids, prompt_mask, completions, mask,
                                      tokenizer.pad_token_id, 3, padding_free=True)
    assert torch.allclose(packed_scores, scores, rtol=0, atol=TOLERANCE)
    assert scores.unique().numel() == 4  # four rows, four different scores: each read at its own row's end


def uneven_prompts(n: int = 8) -> list[dict]:
    """Prompts of 1 to 4 words before the number: left padding of different widths."""
    return [{"prompt": " ".join(["Write"] + ["something"] * (i % 4)) + f" {i}."} for i in range(n)]


# distinct's scores differ between completions from the first iteration on: every run trains
MAKERS = {"rloo": (make_rloo_trainer, {}), "ppo": (make_ppo_trainer, {}), "grpo": (make_grpo_trainer, {"beta": 0.1})}
# stop tokens among the common ids: the tiny model's completions end at different lengths
STOPS = list(range(40, 300, 3))


def trainer_pair(kind, tokenizer, tmp_path, **options):
    """The same trainer twice (same weights, same data), padded and padding-free."""
    make, defaults = MAKERS[kind]
    settings = dict(dataset=uneven_prompts(), reward=distinct, seed=3, response_length=10, stop_token_ids=STOPS,
                    **defaults, **options)
    return [make(tokenizer, tmp_path / f"free-{free}", policy=build_causal_lm(tokenizer, seed=1),
                 padding_free=free, **settings) for free in (False, True)]


def micro_batch(trainer, batch):
    """Loss of the batch as one update micro-batch, and every trained parameter's gradient."""
    shaped = trainer.shape_rewards(batch)
    index = torch.arange(batch.num_rows)
    rows = batch.rows(index)
    width = rows.pop("width")
    shaped_rows = {name: value[index, :width] if value.dim() == 2 else value[index]
                   for name, value in vars(shaped).items() if isinstance(value, torch.Tensor)}
    totals = trainer.optimizer_step_totals(shaped, index)
    for model in trainer.trained_models.values():
        model.train()
        model.zero_grad()
    out = trainer.micro_batch_loss(rows, shaped_rows, trainer.policy_forward(rows), totals[0] if totals else None)
    out.loss.backward()
    grads = {f"{key}.{name}": p.grad.clone() for key, model in trainer.trained_models.items()
             for name, p in model.named_parameters() if p.grad is not None}
    return float(out.loss.detach()), {name: float(value) for name, value in out.stats.items()}, grads


@pytest.mark.parametrize("kind", ["rloo", "ppo", "grpo"])
@pytest.mark.parametrize("episodes", [False, True], ids=["single", "environment_tokens"])
def test_update_micro_batch_loss_and_gradients_equal_padded(kind, episodes, tokenizer, tmp_path):
    padded, packed = trainer_pair(kind, tokenizer, tmp_path)
    batch = padded.collect_rollout()
    lengths = batch.completion_mask.sum(1)
    assert lengths.unique().numel() > 2 and batch.prompt_mask.sum(1).unique().numel() > 1  # uneven rows
    if episodes:  # tokens inside the completion that the model reads but is not trained on
        batch = with_environment_tokens(batch)
    loss, stats, grads = micro_batch(padded, batch)
    packed_loss, packed_stats, packed_grads = micro_batch(packed, batch)
    assert packed_loss == pytest.approx(loss, rel=TOLERANCE, abs=TOLERANCE)
    assert packed_stats == pytest.approx(stats, rel=TOLERANCE, abs=TOLERANCE)
    assert grads.keys() == packed_grads.keys() and any(name.startswith("value_model") for name in grads) == (
        kind == "ppo")
    for name, grad in grads.items():
        assert torch.allclose(packed_grads[name], grad, rtol=TOLERANCE, atol=TOLERANCE), name
    assert sum(float(grad.abs().sum()) for grad in grads.values()) > 0


# Where the two runs' float rounding differs: each per-token logprob is about -ln(vocabulary) = -5.8, whose float32
# last place is 4.8e-7, and the packed pass's products have other shapes. Metrics made of differences of such
# logprobs (KL estimates, ratios and their variance, approxkl, a loss whose advantages sum to zero) carry that
# absolute error whatever their own size, so a small one is compared absolutely (measured: at most 1.5e-6 apart);
# every other metric is far larger, and compared relatively.
ABSOLUTE = 2e-6


def assert_same_metrics(padded, packed):
    assert padded and [row.keys() for row in packed] == [row.keys() for row in padded]
    for expected, got in zip(padded, packed):
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=TOLERANCE, abs=ABSOLUTE), key


def logged(output_dir):
    wall_clock = ("eps", "tokens_per_s", "time/", "memory/")
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [{key: value for key, value in row.items() if not key.startswith(wall_clock)} for row in rows]


@pytest.mark.parametrize("kind", ["rloo", "ppo", "grpo"])
def test_short_runs_log_the_padded_runs_metrics(kind, tokenizer, tmp_path):
    """Two iterations of two epochs each, the policy's own logprob pass on: every metric of every iteration
    within 1e-5 relative of the padded run's (the passes differ only in the shapes of their products)."""
    runs = trainer_pair(kind, tokenizer, tmp_path, num_ppo_epochs=2, logprobs_from_sampling=False)
    for trainer in runs:
        trainer.train()
    padded, packed = (logged(tmp_path / f"free-{free}") for free in (False, True))
    assert len(padded) == 2
    assert_same_metrics(padded, packed)
    assert padded[0]["objective/kl"] == 0 and padded[1]["objective/kl"] != 0  # the update changed the policy


@pytest.mark.parametrize("kind", ["rloo", "ppo", "grpo"])
def test_episode_runs_log_the_padded_runs_metrics(kind, tokenizer, tmp_path):
    """Two iterations on a text environment of three turns (scripted replies): the environment's messages sit
    inside each completion, outside the loss mask, and are read by the packed passes as by the padded ones. A
    smaller learning rate than the tests' 1e-3: Adam scales every parameter's step to about the learning rate, so
    where a gradient is near 0 its rounding moves the weights by up to a whole step, and 1e-3 on these long
    episodes (ratios of 3.5 after the first update) carries that into the second iteration's ratios at 2.5e-5."""
    from tests.unit.test_turn_credit_runs import first_shaping

    for free in (False, True):
        first_shaping(tokenizer, tmp_path / f"free-{free}", kind, padding_free=free, logprobs_from_sampling=False,
                      total_episodes=8, learning_rate=1e-4)
    padded, packed = (logged(tmp_path / f"free-{free}") for free in (False, True))
    assert len(padded) == 2
    assert_same_metrics(padded, packed)


def test_models_that_cannot_pack_are_refused_at_set_up(tokenizer, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2,
                                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    with pytest.raises(UserError, match=r"^training.padding_free: model type 'gpt2' is not one known to pack"):
        make_rloo_trainer(tokenizer, tmp_path / "gpt2", policy=gpt2, padding_free=True)
    policy = build_causal_lm(tokenizer, attn_implementation="eager")
    policy.config._attn_implementation = "paged|sdpa"
    with pytest.raises(UserError, match=r"^training.padding_free: attention implementation 'paged\|sdpa'"):
        make_rloo_trainer(tokenizer, tmp_path / "paged", policy=policy, padding_free=True)
    with pytest.raises(UserError, match=r"^training.padding_free: not supported with torch_compile"):
        make_rloo_trainer(tokenizer, tmp_path / "compiled", padding_free=True, torch_compile=True)
    # packing shares no prompts; the padded default still does
    assert not make_rloo_trainer(tokenizer, tmp_path / "ok", padding_free=True).shared_prompt_passes
    assert make_rloo_trainer(tokenizer, tmp_path / "default").shared_prompt_passes
