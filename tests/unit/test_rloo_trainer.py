"""RLOOTrainer through the Python API on a tiny random model."""

import copy
import math

import pytest
import torch

from training_wizard import RLOOConfig
from training_wizard.errors import UserError
from training_wizard.rollout.generation import GenerationParams, generate
from training_wizard.testing import build_causal_lm, build_sequence_classifier, scripted_backend
from training_wizard.tracking.metrics import read_metrics

from tests.helpers import distinct, make_rloo_trainer, with_logprobs

TRL_METRIC_NAMES = [
    "eps", "objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
    "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "val/clipfrac_avg",
    "policy/entropy_avg", "val/ratio", "val/ratio_var", "val/num_eos_tokens", "lr", "episode",
    "time/generation", "time/scoring", "time/update", "tokens_per_s",
]


@pytest.mark.parametrize("options", [{"num_ppo_epochs": 2},
                                     {"num_ppo_epochs": 1, "logprobs_from_sampling": True, "learning_rate": 6e-3}],
                         ids=["two_epochs", "fast_path"])
def test_learns_a_learnable_reward(tokenizer, tmp_path, options):
    # the fast path takes one optimizer step per rollout instead of two: twice the rate for the same distance
    trainer = make_rloo_trainer(
        tokenizer, tmp_path, rloo_k=4, per_device_train_batch_size=16, total_episodes=16 * 40, response_length=8,
        **{"learning_rate": 3e-3, **options}, temperature=1.0, kl_coef=0.0,
    )
    trainer.train()
    scores = [m["objective/scores"] for m in read_metrics(tmp_path)]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    # random init emits 'x' in ~2% of characters; 40 iterations take it past 40% (seen: ~0.7-0.9)
    assert last > first + 0.3, (first, last)


def test_first_iteration_ratio_is_one_clipfrac_zero_kl_zero(tokenizer, tmp_path):
    trainer = make_rloo_trainer(
        tokenizer, tmp_path, num_ppo_epochs=1, num_mini_batches=1, gradient_accumulation_steps=2,
        per_device_train_batch_size=4, total_episodes=8,
        logprobs_from_sampling=False,  # policy and reference by one computation: a KL of exactly 0
    )
    trainer.train()
    first = read_metrics(tmp_path)[0]
    assert abs(first["val/ratio"] - 1.0) < 1e-6
    assert first["val/ratio_var"] < 1e-10
    assert first["policy/clipfrac_avg"] == 0.0
    assert first["objective/kl"] == 0.0 and first["objective/non_score_reward"] == 0.0
    assert first["lr"] == 1e-3  # the rate the first update used, not the next one (linear decay, no warmup)
    assert set(TRL_METRIC_NAMES) <= set(first)


def test_equal_rewards_leave_weights_unchanged_and_finite(tokenizer, tmp_path):
    policy = build_causal_lm(tokenizer)
    before = copy.deepcopy(policy.state_dict())
    trainer = make_rloo_trainer(tokenizer, tmp_path, reward=lambda p, c, **k: [0.5] * len(c), policy=policy,
                                kl_coef=0.0)
    trainer.train()
    record = read_metrics(tmp_path)[-1]
    assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))
    assert record["loss/policy_avg"] == 0.0
    after = trainer.unwrapped_policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_sampling_is_keyed_per_row_not_per_batch(tokenizer):
    model = build_causal_lm(tokenizer).eval()
    params = GenerationParams(max_new_tokens=6, temperature=1.0, stop_token_ids=(), pad_token_id=tokenizer.pad_token_id)
    a = tokenizer("Write something", return_tensors="pt")["input_ids"]
    b = tokenizer("Paraphrase the sentence now", return_tensors="pt")["input_ids"]
    pad = tokenizer.pad_token_id
    both = torch.full((2, b.shape[1]), pad)
    both[0, -a.shape[1]:], both[1] = a[0], b[0]
    mask = both != pad
    together = generate(model, both, mask, params, row_seeds=[11, 22])
    alone = generate(model, a, torch.ones_like(a, dtype=torch.bool), params, row_seeds=[11])
    assert torch.equal(together[0], alone[0])
    other_seed = generate(model, a, torch.ones_like(a, dtype=torch.bool), params, row_seeds=[12])
    assert not torch.equal(alone[0], other_seed[0])


def test_config_accepts_newer_trl_names_and_checks_divisibility():
    config = RLOOConfig(num_generations=4, beta=0.1, epsilon=0.3, max_completion_length=9, num_iterations=2)
    assert (config.rloo_k, config.kl_coef, config.cliprange, config.response_length, config.num_ppo_epochs) == (
        4, 0.1, 0.3, 9, 2,
    )
    with pytest.raises(UserError, match=r"local_batch_size \(6 .*rloo_k \(4\)"):
        RLOOConfig(rloo_k=4, per_device_train_batch_size=6, total_episodes=10).batch_plan()
    plan = RLOOConfig(rloo_k=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, num_mini_batches=2,
                      total_episodes=100).batch_plan(world_size=2)
    assert (plan.local_batch_size, plan.batch_size, plan.local_prompts, plan.prompts_per_iteration) == (16, 32, 4, 8)
    assert plan.num_iterations == 4  # ceil(100 / 32)


def test_lora_policy_uses_disabled_adapter_as_reference(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(build_causal_lm(tokenizer), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    trainer = make_rloo_trainer(tokenizer, tmp_path, reward=distinct, policy=policy, total_episodes=16,
                                learning_rate=1e-2, logprobs_from_sampling=False)  # exact KL 0 at the start
    assert trainer.ref_policy is None and trainer.uses_adapter_as_reference
    trainer.train()
    metrics = read_metrics(tmp_path)
    assert metrics[0]["objective/kl"] == 0.0  # adapter B starts at zero: policy == reference
    rollout = trainer.collect_rollout()
    assert not torch.allclose(rollout.logprobs, rollout.ref_logprobs)  # trained adapter moved the policy


def test_token_level_kl_first_ratio_is_one(tokenizer, tmp_path):
    trainer = make_rloo_trainer(tokenizer, tmp_path, token_level_kl=True, num_ppo_epochs=1, kl_coef=0.1,
                                normalize_advantage=True, normalize_reward=True, whiten_rewards=True)
    rollout = trainer.collect_rollout()
    shaped = trainer.shape_rewards(rollout)
    assert shaped.advantages.shape == rollout.completion_ids.shape
    assert torch.isfinite(shaped.advantages).all()
    assert (shaped.advantages[~rollout.completion_mask] == 0).all()
    trainer.state.prompt_order.epoch = 0
    trainer.train()
    assert abs(read_metrics(tmp_path)[0]["val/ratio"] - 1.0) < 1e-6


def test_gradient_checkpointing_gives_the_same_update(tokenizer, tmp_path):
    finals = []
    for checkpointing in (False, True):
        trainer = make_rloo_trainer(tokenizer, tmp_path / str(checkpointing), gradient_checkpointing=checkpointing,
                                    reward=distinct, num_ppo_epochs=2)
        trainer.share_prompts_in_update = False  # the same passes on both sides (checkpointing disables sharing)
        trainer.train()
        finals.append({k: v.clone() for k, v in trainer.unwrapped_policy.state_dict().items()})
    start = build_causal_lm(tokenizer).state_dict()
    assert max((finals[0][k] - start[k]).abs().max().item() for k in start) > 1e-4  # the update did something
    assert max((finals[0][k] - finals[1][k]).abs().max().item() for k in start) < 1e-6


def test_bfloat16_policy_trains_with_float32_logprobs(tokenizer, tmp_path):
    policy = build_causal_lm(tokenizer).to(torch.bfloat16)
    trainer = make_rloo_trainer(tokenizer, tmp_path, policy=policy,
                                reward=lambda p, c, **k: [float(len(x)) for x in c])
    rollout = trainer.collect_rollout()
    assert rollout.logprobs.dtype == torch.float32 and rollout.ref_logprobs.dtype == torch.float32
    trainer.train()
    assert all(math.isfinite(v) for v in read_metrics(tmp_path)[-1].values() if isinstance(v, float))
    assert next(trainer.unwrapped_policy.parameters()).dtype == torch.bfloat16


def test_attention_dropout_copied_into_modules_is_off_during_the_update(tokenizer, tmp_path):
    # Llama attention copies config.attention_dropout when it is built; only turning it off on the modules
    # makes the update's forward pass match the rollout's, so the first ratio is exactly 1.
    policy = build_causal_lm(tokenizer, attention_dropout=0.5)
    trainer = make_rloo_trainer(tokenizer, tmp_path, policy=policy, num_ppo_epochs=1, total_episodes=8,
                                reward=distinct)
    trainer.train()
    first = read_metrics(tmp_path)[0]
    assert first["val/ratio"] == 1.0 and first["val/ratio_var"] == 0.0
    assert first["policy/approxkl_avg"] == 0.0


def test_missing_eos_penalty_applies_only_to_completions_without_the_stop_token(tokenizer, tmp_path, monkeypatch):

    eos, other = tokenizer.eos_token_id, tokenizer.eos_token_id + 5

    def fixed_responses(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        rows = prompt_ids.shape[0]  # even rows stop after two tokens, odd rows never stop
        return torch.tensor([[other, eos, other] if row % 2 == 0 else [other, other, other] for row in range(rows)])

    backend = scripted_backend(lambda *args, **kwargs: with_logprobs(fixed_responses(*args, **kwargs)))
    classifier = build_sequence_classifier(tokenizer)
    trainer = make_rloo_trainer(tokenizer, tmp_path, reward=classifier, missing_eos_penalty=5.0, total_episodes=8,
                                backend=backend)
    rollout = trainer.collect_rollout()
    assert rollout.has_stop.tolist() == [True, False] * 4
    assert rollout.completion_mask[0].tolist() == [True, True, False]
    from training_wizard.rollout.scoring import classifier_scores

    raw = classifier_scores(classifier, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                            rollout.completion_mask, tokenizer.pad_token_id, 3)
    torch.testing.assert_close(rollout.scores - raw, torch.tensor([0.0, -5.0] * 4))


def test_progress_counts_the_episodes_whole_iterations_make(tokenizer, tmp_path, capsys):
    """total_episodes 12 at 8 per iteration runs 2 iterations, 16 episodes: the progress line says 16/16 (it said
    16/12 with a negative ETA)."""
    trainer = make_rloo_trainer(tokenizer, tmp_path, total_episodes=12)
    trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("episode ")]
    assert [line.split()[1] for line in lines] == ["8/16", "16/16"]
    assert "ETA 0s" in lines[-1]
