"""Micro-batches by tokens (`max_tokens_per_micro_batch`): the grouping, the gradient of a split optimizer step
(every loss normalised by its step, not its micro-batch), the no-grad passes' chunks, and a short run's metrics.

Each comparison takes one rollout with completions of different lengths and runs it twice: through fixed
micro-batches holding a whole mini-batch, and split by a token budget into unequal micro-batches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from training_wizard.core.micro_batches import chunk_tokens, micro_batches, padded_row_lengths
from training_wizard.rollout.scoring import batched_logprobs, classifier_scores
from training_wizard.testing import build_causal_lm, build_sequence_classifier
from training_wizard.trainers.config.on_policy import GRPOConfig

from tests.helpers import make_grpo_trainer, make_ppo_trainer, make_rloo_trainer

RESPONSE_LENGTH = 10
BUDGET = 40  # about two of the rows here a micro-batch: several micro-batches of unequal rows per step


# -- the grouping -----------------------------------------------------------------------------------------------
def test_groups_fit_the_budget_shortest_first_and_a_long_row_goes_alone():
    lengths = [7, 3, 12, 3, 30, 5, 9]
    groups = micro_batches(lengths, 15)
    assert groups == [[1, 3, 5], [0], [6], [2], [4]]  # by length, ties in row order; 3 x 5 = 15 fits
    assert sorted(row for group in groups for row in group) == list(range(len(lengths)))
    assert all(chunk_tokens([lengths[i] for i in group]) <= 15 or len(group) == 1 for group in groups)
    assert micro_batches(lengths, 15) == groups  # the lengths alone decide
    # packed (padding-free) chunks count real tokens: 3 + 3 + 5 + 7 = 18 > 15
    assert micro_batches(lengths, 15, padded=False) == [[1, 3, 5], [0], [6], [2], [4]]
    assert micro_batches(lengths, 25, padded=False) == [[1, 3, 5, 0], [6, 2], [4]]
    assert micro_batches(lengths, 1000) == [[1, 3, 5, 0, 6, 2, 4]]


def test_padded_chunks_are_as_wide_as_their_longest_prompt_plus_their_longest_response():
    # (prompt, response): the two rows total 5 each, but a chunk of both is 2 x (4 + 4) = 16 tokens wide
    assert chunk_tokens([(4, 1), (1, 4)]) == 16 and chunk_tokens([(4, 1), (1, 4)], padded=False) == 10
    assert micro_batches([(4, 1), (1, 4)], 15) == [[0], [1]]
    prompt_mask = torch.tensor([[False, True, True], [True, True, True]])
    response_mask = torch.tensor([[True, False, False, False], [True, True, True, False]])
    assert padded_row_lengths(prompt_mask, response_mask) == [(2, 1), (3, 3)]


def test_a_budget_below_one_token_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        micro_batches([3], 0)
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        GRPOConfig(output_dir=str(tmp_path), max_tokens_per_micro_batch=0)
    # smaller than the longest row is allowed: such a row goes alone
    assert GRPOConfig(output_dir=str(tmp_path), max_tokens_per_micro_batch=1).max_tokens_per_micro_batch == 1


# -- the update's gradient ---------------------------------------------------------------------------------------
def varied(batch, pad: int, episodes: bool = False):
    """The rollout with completions of 1 to RESPONSE_LENGTH tokens and old logprobs moved off the policy's (so
    ratios are clipped); with `episodes`, the third token of each longer completion is an environment's (real,
    outside the loss mask), as between two replies of an episode."""
    rows, width = batch.completion_ids.shape
    keep = torch.tensor([1 + (row * 7) % width for row in range(rows)])
    real = torch.arange(width)[None, :] < keep[:, None]
    loss_mask = batch.loss_mask & real
    if episodes:
        loss_mask[:, 2] &= ~(keep > 3)
    wobble = 0.3 * torch.sin(torch.arange(rows * width, dtype=torch.float32).reshape(rows, width))
    zero = torch.zeros_like(batch.logprobs)
    return dataclasses.replace(
        batch, completion_ids=torch.where(real, batch.completion_ids, torch.full_like(batch.completion_ids, pad)),
        completion_mask=batch.completion_mask & real, loss_mask=loss_mask,
        logprobs=torch.where(real, batch.logprobs + wobble, zero),
        ref_logprobs=torch.where(real, batch.ref_logprobs, zero),
        extras={name: torch.where(real, values, zero) for name, values in batch.extras.items()})


def step_gradients(trainer, rollout) -> list[dict[str, torch.Tensor]]:
    """Every trained parameter's gradient at each optimizer step of one update over `rollout` (the steps are
    not taken, so each sees the same weights), and the number of micro-batches of each step."""
    captured, passes = [], [0]
    original = trainer._micro_step

    def counted(*args, **kwargs):
        passes[0] += 1
        return original(*args, **kwargs)

    def capture(flags, where):
        captured.append(({f"{model}.{name}": p.grad.detach().clone()
                          for model, module in trainer.trained_models.items()
                          for name, p in module.named_parameters() if p.grad is not None}, passes[0]))
        passes[0] = 0
        trainer.optimizer.zero_grad(set_to_none=True)

    trainer._micro_step, trainer._optimizer_step = counted, capture
    trainer._update(rollout, trainer.shape_rewards(rollout))
    return captured


def make(kind: str, tokenizer, tmp_path, name: str, **options):
    common = dict(response_length=RESPONSE_LENGTH, num_ppo_epochs=2, num_mini_batches=2, seed=5, **options)
    if kind == "ppo":
        return make_ppo_trainer(tokenizer, tmp_path / name, value_model=build_sequence_classifier(tokenizer, seed=2),
                                **common)
    if kind == "rloo":
        return make_rloo_trainer(tokenizer, tmp_path / name, kl_coef=0.1, **common)
    return make_grpo_trainer(tokenizer, tmp_path / name, beta=0.05, **common)


CASES = [("rloo", {}), ("rloo", {"token_level_kl": True}), ("ppo", {}),
         *[("grpo", {"loss_type": loss_type}) for loss_type in ("grpo", "dapo", "bnpo", "dr_grpo")]]
IDS = ["rloo", "rloo-token", "ppo", "grpo-grpo", "grpo-dapo", "grpo-bnpo", "grpo-dr_grpo"]


@pytest.mark.parametrize("episodes", [False, True], ids=["single-turn", "episodes"])
@pytest.mark.parametrize("kind,options", CASES, ids=IDS)
def test_a_token_budget_split_gives_the_gradient_of_one_micro_batch(kind, options, episodes, tokenizer, tmp_path):
    # one micro-batch of 4 rows per optimizer step (2 steps an epoch, 2 epochs) ...
    whole = make(kind, tokenizer, tmp_path, "whole", per_device_train_batch_size=4, **options)
    rollout = varied(whole.collect_rollout(), tokenizer.pad_token_id, episodes)
    expected = step_gradients(whole, rollout)
    # ... against the same steps accumulated over 2 x 2 rows and split by tokens into unequal micro-batches
    split = make(kind, tokenizer, tmp_path, "split", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                 max_tokens_per_micro_batch=BUDGET, **options)
    got = step_gradients(split, rollout)
    assert [passes for _, passes in expected] == [1] * 4
    assert len(got) == 4 and any(passes not in (1, 2) for _, passes in got)  # not the fixed split of 2
    for (want, _), (have, _) in zip(expected, got):
        assert want.keys() == have.keys() and len(want) > 0
        for name in want:
            torch.testing.assert_close(have[name], want[name], atol=1e-5, rtol=1e-4, msg=name)


# -- the no-grad passes ------------------------------------------------------------------------------------------
def recorded_widths(model):
    """A list that each forward pass of `model` appends its (rows, columns) to."""
    shapes = []
    model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                    with_kwargs=True)
    return shapes


def ragged_batch(tokenizer, rows: int = 12):
    """Left-padded prompts of 2 to 7 tokens and right-padded responses of 1 to 9."""
    generator = torch.Generator().manual_seed(0)
    prompt_len = torch.tensor([2 + (row * 5) % 6 for row in range(rows)])
    response_len = torch.tensor([1 + (row * 4) % 9 for row in range(rows)])
    prompt_mask = torch.arange(7)[None, :] >= (7 - prompt_len)[:, None]
    response_mask = torch.arange(9)[None, :] < response_len[:, None]
    prompt_ids = torch.randint(5, 200, (rows, 7), generator=generator)
    responses = torch.randint(5, 200, (rows, 9), generator=generator)
    pad = tokenizer.pad_token_id
    return (torch.where(prompt_mask, prompt_ids, torch.full_like(prompt_ids, pad)), prompt_mask,
            torch.where(response_mask, responses, torch.full_like(responses, pad)), response_mask)


@pytest.mark.parametrize("share_prompts,head", [(False, False), (False, True), (True, True)])
def test_no_grad_passes_by_tokens_give_the_same_logprobs_in_chunks_within_the_budget(tokenizer, share_prompts,
                                                                                      head):
    model = build_causal_lm(tokenizer).eval()
    prompt_ids, prompt_mask, responses, response_mask = ragged_batch(tokenizer)
    expected = batched_logprobs(model, prompt_ids, prompt_mask, responses, response_mask, 1.0, 64,
                                share_prompts=share_prompts, from_hidden_states=head)
    shapes = recorded_widths(model)
    got = batched_logprobs(model, prompt_ids, prompt_mask, responses, response_mask, 1.0, 64,
                           share_prompts=share_prompts, from_hidden_states=head, max_tokens=30)
    torch.testing.assert_close(got * response_mask, expected * response_mask, atol=1e-5, rtol=0)
    if not share_prompts:  # one forward pass a chunk: prompt and response columns together
        assert len(shapes) > 2 and all(rows * columns <= 30 or rows == 1 for rows, columns in shapes), shapes
        assert sum(rows for rows, _ in shapes) == 12


def test_reward_model_and_extra_passes_by_tokens_score_alike_in_chunks_within_the_budget(tokenizer):
    from training_wizard.rollout.collector import RolloutCollector, SamplingSettings
    from training_wizard.rollout.value import value_logits

    classifier = build_sequence_classifier(tokenizer, seed=3).eval()
    prompt_ids, prompt_mask, responses, response_mask = ragged_batch(tokenizer)
    pad = tokenizer.pad_token_id
    expected = classifier_scores(classifier, prompt_ids, prompt_mask, responses, response_mask, pad, 64)
    shapes = recorded_widths(classifier)
    got = classifier_scores(classifier, prompt_ids, prompt_mask, responses, response_mask, pad, 64, max_tokens=30)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert len(shapes) > 2 and all(rows * columns <= 30 or rows == 1 for rows, columns in shapes), shapes

    # PPO's value pass runs as one of the collector's extra passes
    collector = RolloutCollector.__new__(RolloutCollector)
    collector.settings = SamplingSettings(RESPONSE_LENGTH, 1.0, (), pad, 64, max_tokens_per_forward=30)
    with torch.no_grad():
        expected = value_logits(classifier, prompt_ids, prompt_mask, responses)
        shapes.clear()
        got = collector._extra_pass(lambda *tensors: value_logits(classifier, *tensors), prompt_ids, prompt_mask,
                                    responses, response_mask)
    torch.testing.assert_close(got * response_mask, expected * response_mask, atol=1e-5, rtol=0)
    assert len(shapes) > 2 and all(rows * columns <= 30 or rows == 1 for rows, columns in shapes), shapes


# -- a short run -------------------------------------------------------------------------------------------------
def uneven_lengths(tokenizer):
    """A sampler whose rows stop after 1 to 8 tokens (the tiny random model never emits its EOS early)."""
    from training_wizard.rollout.generation import Generated

    eos = tokenizer.eos_token_id

    def sample(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        rows = []
        for row, seed in enumerate(seeds):
            length = 1 + (seed + 3 * row) % 8
            rows.append([10 + (seed * (t + 3)) % 200 for t in range(length)] + [eos] * (RESPONSE_LENGTH - length))
        tokens = torch.tensor(rows)
        return Generated(tokens, torch.zeros(tokens.shape))

    return sample


def record_splits(trainer) -> list[list[torch.Tensor]]:
    """A list that receives the micro-batches of every optimizer step split by tokens."""
    recorded, original = [], trainer.token_budget_splits

    def splits(*args):
        made = original(*args)
        recorded.extend(made)
        return made

    trainer.token_budget_splits = splits
    return recorded


# Token means taken within each micro-batch (RLOO with token-level KL, PPO): with fixed micro-batches they are
# averaged over micro-batches, with micro-batches by tokens weighted by rows; both only approximate the step's
# token mean, so they differ between the two splits. Every other metric is the step's value either way.
PER_MICRO_BATCH_TOKEN_MEANS = {"policy/approxkl_avg", "policy/clipfrac_avg", "val/clipfrac_avg", "clip_ratio/low_mean",
                               "clip_ratio/high_mean", "clip_ratio/region_mean"}
WALL_CLOCK = ("eps", "tokens_per_s", "time/")


@pytest.mark.parametrize("kind,options", [("rloo", {}), ("rloo", {"token_level_kl": True}), ("ppo", {}),
                                          ("grpo", {"loss_type": "dapo"}), ("grpo", {"loss_type": "grpo"})],
                         ids=["rloo", "rloo-token", "ppo", "grpo-dapo", "grpo-grpo"])
def test_a_run_by_tokens_logs_the_metrics_of_one_micro_batch_per_step(kind, options, tokenizer, tmp_path):
    from training_wizard.testing import scripted_backend
    from training_wizard.tracking.metrics import read_metrics

    backend = scripted_backend(uneven_lengths(tokenizer))
    runs = []
    for name, settings in (("whole", dict(per_device_train_batch_size=4)),
                           ("split", dict(per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                          max_tokens_per_micro_batch=BUDGET))):
        common = dict(response_length=RESPONSE_LENGTH, num_ppo_epochs=2, num_mini_batches=2, seed=5,
                      total_episodes=16, backend=backend, **settings, **options)
        if kind == "ppo":
            trainer = make_ppo_trainer(tokenizer, tmp_path / name, **common,
                                       value_model=build_sequence_classifier(tokenizer, seed=2))
        elif kind == "rloo":
            trainer = make_rloo_trainer(tokenizer, tmp_path / name, kl_coef=0.1, **common)
        else:
            trainer = make_grpo_trainer(tokenizer, tmp_path / name, beta=0.05, **common)
        splits = record_splits(trainer)
        trainer.train()
        runs.append(read_metrics(tmp_path / name))
    # the budget split the steps unevenly: not the 2 micro-batches of 2 rows the row counts say
    assert any(len(step) != 2 for step in splits) and any(len(part) != 2 for step in splits for part in step)
    whole, split = runs
    assert len(whole) == len(split) == 2
    different = PER_MICRO_BATCH_TOKEN_MEANS if kind == "ppo" or options.get("token_level_kl") else set()
    for mine, theirs in zip(split, whole):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            if not key.startswith(WALL_CLOCK) and key not in different:
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert split[-1]["loss/policy_avg"] != 0.0


@pytest.mark.parametrize("kind", ["rloo", "grpo"])
def test_padding_passes_for_a_process_with_fewer_micro_batches_change_nothing(kind, tokenizer, tmp_path):
    """Where another process needs more micro-batches for a step, this one runs passes of weight 0 up to that
    count (so both run the same forward and backward passes): the gradient and the metrics stay its own."""
    whole = make(kind, tokenizer, tmp_path, "whole", per_device_train_batch_size=4)
    rollout = varied(whole.collect_rollout(), tokenizer.pad_token_id)
    split = make(kind, tokenizer, tmp_path, "split", per_device_train_batch_size=4, max_tokens_per_micro_batch=BUDGET)
    padded = make(kind, tokenizer, tmp_path, "padded", per_device_train_batch_size=4,
                  max_tokens_per_micro_batch=BUDGET)
    padded.collectives.max = lambda counts: counts + 2  # as if another process needed two more each step
    stats = []
    for trainer in (split, padded):
        original = trainer._optimizer_step
        gradients = step_gradients(trainer, rollout)
        trainer._optimizer_step = original
        stats.append((gradients, trainer._update(rollout, trainer.shape_rewards(rollout)).stats))
    (own, own_stats), (with_padding, padded_stats) = stats
    assert [passes + 2 for _, passes in own] == [passes for _, passes in with_padding]
    for (want, _), (have, _) in zip(own, with_padding):
        for name in want:
            torch.testing.assert_close(have[name], want[name], atol=1e-6, rtol=1e-6, msg=name)
    assert padded_stats.keys() == own_stats.keys()
    for key, value in own_stats.items():
        assert padded_stats[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
