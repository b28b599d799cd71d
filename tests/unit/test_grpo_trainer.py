"""GRPOTrainer through the Python API on a tiny random model."""

import copy
import math
from pathlib import Path

import pytest
import torch

from training_wizard import GRPOConfig
from training_wizard.errors import UserError
from training_wizard.testing import build_causal_lm, scripted_backend
from training_wizard.tracking.metrics import read_metrics

from tests.helpers import make_grpo_trainer, with_logprobs, x_share

GRPO_METRIC_NAMES = [
    "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "entropy",
    # the shared names stay
    "objective/scores", "objective/kl", "loss/policy_avg", "policy/clipfrac_avg", "val/ratio", "episode", "lr",
]


def test_learns_a_learnable_reward(tokenizer, tmp_path):
    trainer = make_grpo_trainer(tokenizer, tmp_path, reward=x_share, per_device_train_batch_size=16,
                                total_episodes=16 * 40, response_length=8, learning_rate=1e-2, epsilon_high=0.28)
    trainer.train()
    rewards = [m["reward"] for m in read_metrics(tmp_path)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # random init emits "x" in ~2% of characters; 40 single-step iterations take it well past 30%
    assert last > first + 0.3, (first, last)


def test_defaults_are_trl_1x_and_load_no_reference(tokenizer, tmp_path, monkeypatch):
    config = GRPOConfig()
    assert (config.num_generations, config.kl_coef, config.cliprange, config.epsilon_high, config.loss_type,
            config.scale_rewards, config.num_ppo_epochs, config.temperature, config.mask_truncated_completions,
            config.top_entropy_quantile, config.importance_sampling_level) == (
        8, 0.0, 0.2, None, "dapo", "group", 1, 1.0, False, 1.0, "token")
    import training_wizard.rollout.collector as collector_module

    def no_reference_pass(*args, **kwargs):
        raise AssertionError("beta = 0 must not run a reference pass")

    monkeypatch.setattr(collector_module.RolloutCollector, "_reference_logprobs", no_reference_pass)
    trainer = make_grpo_trainer(tokenizer, tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=4)
    assert trainer.ref_policy is None and not trainer.uses_adapter_as_reference
    trainer.train()
    first = read_metrics(tmp_path)[0]
    assert set(GRPO_METRIC_NAMES) <= set(first)
    assert "kl" not in first  # TRL logs kl only when beta > 0
    assert first["objective/kl"] == 0.0
    assert abs(first["val/ratio"] - 1.0) < 1e-6 and first["policy/clipfrac_avg"] == 0.0
    assert first["reward"] == pytest.approx(first["objective/scores"], abs=1e-6)
    assert first["entropy"] == pytest.approx(first["policy/entropy_avg"], abs=1e-6)  # equal micro-batches here


def test_equal_rewards_give_zero_std_and_leave_weights_unchanged(tokenizer, tmp_path):
    policy = build_causal_lm(tokenizer)
    before = copy.deepcopy(policy.state_dict())
    trainer = make_grpo_trainer(tokenizer, tmp_path, reward=lambda p, c, **k: [0.5] * len(c), policy=policy)
    trainer.train()
    record = read_metrics(tmp_path)[-1]
    assert record["frac_reward_zero_std"] == 1.0 and record["reward_std"] == 0.0 and record["reward"] == 0.5
    assert record["loss/policy_avg"] == 0.0
    after = trainer.unwrapped_policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_truncated_completions_carry_no_loss_when_masked(tokenizer, tmp_path, monkeypatch):
    other = tokenizer.eos_token_id + 5

    def never_stops(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        return with_logprobs(torch.tensor([[other + row % 3, other, other] for row in range(prompt_ids.shape[0])]))

    backend = scripted_backend(never_stops)
    policy = build_causal_lm(tokenizer)
    before = copy.deepcopy(policy.state_dict())
    trainer = make_grpo_trainer(tokenizer, tmp_path, policy=policy, mask_truncated_completions=True, backend=backend)
    trainer.train()
    record = read_metrics(tmp_path)[-1]
    assert record["completions/clipped_ratio"] == 1.0 and record["frac_reward_zero_std"] < 1.0
    assert record["loss/policy_avg"] == 0.0
    after = trainer.unwrapped_policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def uneven_lengths(tokenizer):
    """A sampler whose rows stop after 1 to 5 tokens (row-dependent tokens), so micro-batches hold different
    token counts (the tiny random model never emits its EOS within a few tokens)."""
    eos = tokenizer.eos_token_id

    def sample(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        rows = []
        for row, seed in enumerate(seeds):
            length = 1 + (seed + row) % 5
            rows.append([10 + (seed * (t + 3)) % 200 for t in range(length)] + [eos] * (6 - length))
        return with_logprobs(torch.tensor(rows))

    return sample


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo"])
def test_gradient_accumulation_ends_where_the_whole_batch_does(tokenizer, tmp_path, loss_type, monkeypatch):
    """8 completions per optimizer step as one micro-batch or as 4 micro-batches of 2 (holding different token
    counts): the same weights, so the token normalisation counts the whole step before its first micro-batch."""

    backend = scripted_backend(uneven_lengths(tokenizer))
    finals = []
    for per_device, accumulation in ((8, 1), (2, 4)):
        trainer = make_grpo_trainer(tokenizer, tmp_path / f"{per_device}", per_device_train_batch_size=per_device,
                                    gradient_accumulation_steps=accumulation, num_iterations=2, loss_type=loss_type,
                                    learning_rate=3e-3, beta=0.05, total_episodes=16, backend=backend)
        trainer.share_prompts_in_update = False  # the same passes on both sides
        trainer.train()
        finals.append({k: v.clone() for k, v in trainer.unwrapped_policy.state_dict().items()})
    start = build_causal_lm(tokenizer).state_dict()
    assert max((finals[0][k] - start[k]).abs().max().item() for k in start) > 1e-3  # the update did something
    # AdamW turns rounding in near-zero gradients into steps of up to ~2e-5 here; normalising each micro-batch
    # by its own token count instead (TRL's bnpo) ends 1.7e-2 away
    assert max((finals[0][k] - finals[1][k]).abs().max().item() for k in start) < 2e-4


def test_beta_uses_the_lora_base_as_reference_and_logs_kl(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(build_causal_lm(tokenizer), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    trainer = make_grpo_trainer(tokenizer, tmp_path, policy=policy, beta=0.1, total_episodes=24, learning_rate=1e-2,
                                num_iterations=2)
    assert trainer.ref_policy is None and trainer.uses_adapter_as_reference
    trainer.train()
    metrics = read_metrics(tmp_path)
    assert metrics[0]["objective/kl"] == 0.0  # the rollout's: adapter B starts at zero, policy == reference
    assert metrics[-1]["objective/kl"] > 0.0 and metrics[-1]["kl"] > 0.0


@pytest.mark.parametrize("options", [
    {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    {"loss_type": "cispo", "epsilon_high": 5.0},
    {"loss_type": "dr_grpo", "scale_rewards": "none", "delta": 1.5, "dynamic_sampling": True},
    {"top_entropy_quantile": 0.2, "scale_rewards": "batch"},
], ids=["gspo", "cispo", "dr_grpo", "top_entropy"])
def test_loss_variants_train_with_finite_metrics(tokenizer, tmp_path, options):
    trainer = make_grpo_trainer(tokenizer, tmp_path, num_iterations=2, total_episodes=16, **options)
    trainer.train()
    for record in read_metrics(tmp_path):
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float)), record
    if options.get("importance_sampling_level") == "sequence":
        # the second pass sees moved weights; GSPO's tiny epsilon clips whole sequences
        assert read_metrics(tmp_path)[-1]["clip_ratio/region_mean"] > 0.0
    records = read_metrics(tmp_path)
    if options.get("loss_type") == "cispo":  # TRL's name for the capped share, beside ours
        assert all(r["cispo_clip_ratio"] == r["clip_ratio/high_mean"] for r in records)
    else:
        assert not any("cispo_clip_ratio" in r for r in records)


def test_config_reads_trl_names_and_checks_them():
    config = GRPOConfig(beta=0.04, num_iterations=2, steps_per_generation=4, gradient_accumulation_steps=2,
                        max_completion_length=16, epsilon=0.3, scale_rewards=False)
    assert (config.kl_coef, config.num_ppo_epochs, config.num_mini_batches, config.response_length,
            config.cliprange, config.scale_rewards) == (0.04, 2, 2, 16, 0.3, "none")
    assert GRPOConfig(scale_rewards=True).scale_rewards == "group"
    with pytest.raises(ValueError, match=r"steps_per_generation \(3\) must be a multiple of gradient_accumulation"):
        GRPOConfig(steps_per_generation=3, gradient_accumulation_steps=2)
    # a resolved config names both, consistently; an inconsistent pair is refused
    assert GRPOConfig(steps_per_generation=4, gradient_accumulation_steps=2, num_mini_batches=2).num_mini_batches == 2
    with pytest.raises(ValueError, match=r"means num_mini_batches = 2, but num_mini_batches is 3"):
        GRPOConfig(steps_per_generation=4, gradient_accumulation_steps=2, num_mini_batches=3)
    with pytest.raises(ValueError, match="whiten_rewards"):
        GRPOConfig(whiten_rewards=True)
    plan = GRPOConfig(generation_batch_size=32, per_device_train_batch_size=4, total_episodes=64).batch_plan(2)
    assert (plan.local_batch_size, plan.local_mini_batch_size, plan.prompts_per_iteration) == (16, 4, 4)
    with pytest.raises(UserError, match=r"generation_batch_size \(20\) must be a multiple"):
        GRPOConfig(generation_batch_size=20, per_device_train_batch_size=4, total_episodes=64).batch_plan(2)
    with pytest.raises(UserError, match=r"multiple of num_generations \(8\)"):
        GRPOConfig(per_device_train_batch_size=4, total_episodes=64).batch_plan(1)


def test_top_k_1_makes_every_group_identical(tokenizer, tmp_path):
    """The filters reach the sampler: with top_k 1 the k samples of a prompt are the same completion, so every
    group's rewards are equal (with top_k 0 the tiny model's groups differ)."""
    trainer = make_grpo_trainer(tokenizer, tmp_path / "k1", top_k=1, total_episodes=8)
    trainer.train()
    assert read_metrics(tmp_path / "k1")[0]["frac_reward_zero_std"] == 1.0
    trainer = make_grpo_trainer(tokenizer, tmp_path / "k0", total_episodes=8)
    trainer.train()
    assert read_metrics(tmp_path / "k0")[0]["frac_reward_zero_std"] == 0.0


def test_sampled_logprobs_are_refused_with_truncated_sampling():
    with pytest.raises(ValueError, match="logprobs_from_sampling"):
        GRPOConfig(logprobs_from_sampling=True, top_p=0.9)
    assert GRPOConfig(logprobs_from_sampling=True).logprobs_from_sampling


# TRL 1.x GRPOConfig keys docs/trl_options.md says a [training] table accepts, with TRL's defaults
TRL_GRPO_KEYS = {
    "learning_rate": 1e-6, "num_generations": 8, "max_completion_length": 512, "ds3_gather_for_generation": True,
    "generation_batch_size": None, "steps_per_generation": None, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
    "min_p": None, "repetition_penalty": 1.0, "beta": 0.0, "num_iterations": 1, "epsilon": 0.2, "delta": None,
    "epsilon_high": None, "importance_sampling_level": "token", "scale_rewards": "group", "loss_type": "dapo",
    "mask_truncated_completions": False, "top_entropy_quantile": 1.0, "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1, "num_train_epochs": 1.0, "lr_scheduler_type": "linear", "warmup_ratio": 0.0,
    "max_grad_norm": 1.0, "logging_steps": 1, "gradient_checkpointing": False,
}


def test_a_trl_grpo_config_ports_with_its_defaults():
    assert GRPOConfig.model_validate(TRL_GRPO_KEYS) == GRPOConfig()
    text = (Path(__file__).resolve().parents[2] / "docs" / "trl_options.md").read_text()
    assert all(f"`{key}`" in text for key in TRL_GRPO_KEYS)
