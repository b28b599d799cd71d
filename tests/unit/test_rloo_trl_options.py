"""TRL 1.x RLOO options on our RLOO: epsilon_high, mask_truncated_completions, reward_clip_range as a pair,
normalize_advantages, steps_per_generation and generation_batch_size; numbers worked by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from training_wizard.core.groups import repeated_layout_ids
from training_wizard.core.advantages import RLOOShaping, rloo_shaped_rewards, whiten
from training_wizard.core.losses import clipped_surrogate_sequence, clipped_surrogate_token
from training_wizard.errors import UserError
from training_wizard.recipes.base import load_recipe
from training_wizard.trl.configs import GRPOConfig, PPOConfig, RLOOConfig
from training_wizard.trainers.algorithms.rloo import rloo_loss
from training_wizard.trainers.loop.update import PolicyForward


def _ratios(values):
    """(B, 1) logprobs whose ratio to old logprobs 0 is `values`, with gradient."""
    return torch.tensor([[math.log(v)] for v in values], dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("surrogate", [clipped_surrogate_sequence, clipped_surrogate_token])
@pytest.mark.parametrize("high, loss, grad", [(None, -0.2, [0.0, 0.0]), (0.4, -0.25, [-0.65, 0.0])])
def test_epsilon_high_widens_the_upper_clip_only(surrogate, high, loss, grad):
    # ratio 1.3 with A = +1: clipped at 1.2 by cliprange 0.2 (loss -1.2, no gradient), inside 1 + 0.4 (loss -1.3,
    # d/dlogp = -A * ratio / B = -0.65). ratio 0.5 with A = -1: clipped at 0.8 either way (loss +0.8, no gradient)
    logprobs = _ratios([1.3, 0.5])
    old = torch.zeros(2, 1, dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    if surrogate is clipped_surrogate_token:
        advantages = advantages.unsqueeze(-1)
    out = surrogate(logprobs, old, advantages, torch.ones(2, 1, dtype=torch.bool), 0.2, cliprange_high=high)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss)
    assert logprobs.grad.squeeze(-1).tolist() == pytest.approx(grad)


def _shaped(**options):
    # two prompts, k = 2: rows (completion j of prompt p at j * 2 + p); T = 1; KL per row 1 (k1: 0 - (-1))
    scores = torch.tensor([-3.0, 0.5, 2.0, 5.0])
    logprobs, ref = torch.zeros(4, 1), torch.full((4, 1), -1.0)
    has_stop = torch.tensor([True, True, True, False])
    shaping = RLOOShaping(rloo_k=2, **options)
    return rloo_shaped_rewards(scores, logprobs, ref, torch.ones(4, 1, dtype=torch.bool), shaping,
                               repeated_layout_ids(2, 2), has_stop=has_stop)


def test_reward_clip_range_pair_clamps_raw_scores_before_the_kl_penalty():
    shaped = _shaped(kl_coef=0.5, reward_clip_range=(-1.0, 2.0))
    # clamp: [-1, 0.5, 2, 2]; minus 0.5 * KL 1: [-1.5, 0, 1.5, 1.5] (clamping after the penalty would give 2 for 5)
    assert shaped.rlhf_reward.tolist() == pytest.approx([-1.5, 0.0, 1.5, 1.5])
    # leave-one-out with k = 2: each minus its sibling (row p and row 2 + p)
    assert shaped.advantages.tolist() == pytest.approx([-3.0, -1.5, 3.0, 1.5])
    # one number keeps its meaning: it clamps only standardised scores, so without normalize_reward nothing moves
    assert _shaped(kl_coef=0.0, reward_clip_range=1.0).rlhf_reward.tolist() == [-3.0, 0.5, 2.0, 5.0]
    # a pair with normalize_reward: clamp first, then standardise (no second clamp)
    both = _shaped(kl_coef=0.0, reward_clip_range=(-1.0, 2.0), normalize_reward=True)
    assert torch.allclose(both.rlhf_reward, whiten(torch.tensor([-1.0, 0.5, 2.0, 2.0])))


def test_mask_truncated_completions_takes_the_loss_away_from_truncated_rows_only():
    shaped = _shaped(kl_coef=0.0, mask_truncated_completions=True)
    assert shaped.loss_mask.squeeze(-1).tolist() == [True, True, True, False]
    # the truncated row's reward still sets its sibling's baseline: row 1's advantage is 0.5 - 5
    assert shaped.advantages.tolist() == pytest.approx([-5.0, -4.5, 5.0, 4.5])
    assert _shaped(kl_coef=0.0).loss_mask is None  # off: the default path is unchanged


def test_rloo_trainer_loss_uses_the_loss_mask_and_epsilon_high():
    """rloo_loss on two rows of two tokens at ratio 1: A = [1, -1], the second truncated."""
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]], requires_grad=True)
    rows = {"loss_mask": torch.ones(2, 2, dtype=torch.bool)}
    shaped = {"advantages": torch.tensor([1.0, -1.0]), "loss_mask": torch.tensor([[True, True], [False, False]])}

    def loss_of(config, shaped):
        logprobs.grad = None
        token = SimpleNamespace(logprobs=logprobs, entropy=torch.zeros(2, 2))
        out = rloo_loss(rows, shaped, PolicyForward(token, logprobs.detach(), None), config)
        out.loss.backward()
        return out.loss.item(), logprobs.grad.tolist()

    # loss = mean(-A * ratio) = (-1 + 1) / 2 = 0; d/dlogp = -A / 2 per token of the rows that carry loss
    config = RLOOConfig(mask_truncated_completions=True, epsilon_high=0.28)
    assert loss_of(config, shaped) == (0.0, [[-0.5, -0.5], [0.0, 0.0]])
    unmasked = {"advantages": shaped["advantages"]}
    assert loss_of(config, unmasked) == (0.0, [[-0.5, -0.5], [0.5, 0.5]])


def _recipe(tmp_path, tiny_model_dir, training: str):
    """An RLOO recipe whose [training] table is `training` (the rest as small as a recipe gets)."""
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "r.toml"
    path.write_text(f'recipe_class = "rloo"\noutput_dir = "{tmp_path / "out"}"\n[model]\npretrained_name = '
                    f'"{tiny_model_dir}"\n[dataset]\ndata_files = "{tmp_path / "p.jsonl"}"\n[reward]\n'
                    'spec_class = "training_wizard.specs.reward.FunctionRewardSpec"\nfunction = "os.path:join"\n'
                    f"[training]\n{training}\n")
    return path


def test_trl_rloo_names_load_from_a_recipe(tmp_path, tiny_model_dir):
    path = _recipe(tmp_path, tiny_model_dir, "num_generations = 4\nbeta = 0.1\nepsilon = 0.3\nepsilon_high = 0.28\n"
                   "normalize_advantages = true\nreward_clip_range = [-1.0, 1.5]\nmask_truncated_completions = true\n"
                   "num_iterations = 2\ngradient_accumulation_steps = 2\nsteps_per_generation = 4\n")
    training = load_recipe(path).training
    assert (training.rloo_k, training.kl_coef, training.cliprange, training.epsilon_high) == (4, 0.1, 0.3, 0.28)
    assert training.normalize_advantage and training.mask_truncated_completions
    assert training.reward_clip_range == (-1.0, 1.5) and training.num_ppo_epochs == 2
    assert training.num_mini_batches == 2  # 4 forward/backward passes, 2 per optimizer step
    assert load_recipe(_recipe(tmp_path, tiny_model_dir, "reward_clip_range = 3")).training.reward_clip_range == 3.0


@pytest.mark.parametrize("training, message", [
    ("reward_clip_range = [2.0, -2.0]",
     r"training.reward_clip_range \(line 11\): expected \[min, max\] with min < max, got \[2.0, -2.0\]"),
    ("steps_per_generation = 3\ngradient_accumulation_steps = 2",
     r"steps_per_generation \(3\) must be a multiple of gradient_accumulation_steps \(2\).*num_mini_batches = 3"),
    ("steps_per_generation = 2\ngeneration_batch_size = 16", "generation_batch_size or steps_per_generation, not both"),
    ("steps_per_generation = 4\nnum_mini_batches = 3", r"means num_mini_batches = 4, but num_mini_batches is 3"),
])
def test_inconsistent_values_stop_with_one_line(tmp_path, tiny_model_dir, training, message):
    with pytest.raises(UserError, match=message) as caught:
        load_recipe(_recipe(tmp_path, tiny_model_dir, training))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("config_class", [RLOOConfig, PPOConfig, GRPOConfig])
def test_steps_per_generation_and_generation_batch_size_plan_one_and_two_processes(config_class):
    group = {RLOOConfig: {"rloo_k": 2}, GRPOConfig: {"num_generations": 2}, PPOConfig: {}}[config_class]
    common = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, total_episodes=64, **group)
    # steps_per_generation 4 = 4 passes of 4 completions per process, 2 per optimizer step: 2 mini-batches
    by_steps = config_class(steps_per_generation=4, **common)
    one, two = by_steps.batch_plan(1), by_steps.batch_plan(2)
    assert (one.local_batch_size, one.local_mini_batch_size, one.batch_size, one.num_iterations) == (16, 8, 16, 4)
    assert (two.local_batch_size, two.local_mini_batch_size, two.batch_size, two.num_iterations) == (16, 8, 32, 2)
    # generation_batch_size 32 over all processes: 4 passes per process on one, 2 on two processes
    by_size = config_class(generation_batch_size=32, **common)
    one, two = by_size.batch_plan(1), by_size.batch_plan(2)
    assert (one.local_batch_size, one.local_mini_batch_size, one.batch_size) == (32, 8, 32)
    assert (two.local_batch_size, two.local_mini_batch_size, two.batch_size) == (16, 8, 32)
    assert by_size.for_processes(2).num_mini_batches == 2 and by_size.for_processes(1).num_mini_batches == 4
    with pytest.raises(UserError, match=r"generation_batch_size \(24\) must be a multiple of .* \(16\)"):
        config_class(generation_batch_size=24, **common).batch_plan(2)
    # without either, one optimizer step per rollout, as TRL's default (steps_per_generation = accumulation)
    assert config_class(**common).num_mini_batches == 1


# Every field TRL 1.16.0's GRPOConfig and RLOOConfig add to TrainingArguments (read from grpo_config.py and
# rloo_config.py); docs/trl_options.md must name each one with ours or why not.
TRL_1_16_FIELDS = """
learning_rate model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout cast_lm_head_to_fp32
remove_unused_columns num_generations num_generations_eval max_completion_length ds3_gather_for_generation
shuffle_dataset pad_to_multiple_of generation_batch_size steps_per_generation temperature top_p top_k min_p
generation_kwargs chat_template_kwargs repetition_penalty cache_implementation use_vllm vllm_mode vllm_model_impl
vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url vllm_server_host vllm_server_port
vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size beta
num_iterations epsilon delta epsilon_high sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos
vespo_k_neg vespo_lambda_neg importance_sampling_level reward_weights multi_objective_aggregation scale_rewards
loss_type mask_truncated_completions sync_ref_model ref_model_mixup_alpha ref_model_sync_steps top_entropy_quantile
entropy_coef use_adaptive_entropy entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target
max_tool_calling_iterations vllm_importance_sampling_correction vllm_importance_sampling_mode
vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min off_policy_mask_threshold use_bias_correction_kl
log_completions log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo
use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged
vllm_importance_sampling_cap normalize_advantages reward_clip_range
""".split()


def test_trl_options_table_names_every_field_of_trl_1_16():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "trl_options.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    missing = [name for name in TRL_1_16_FIELDS if not any(row.startswith("| ") and f"`{name}`" in
                                                            row.split(" | ")[0] for row in rows)]
    assert missing == []


@pytest.mark.parametrize("config_class", [RLOOConfig, GRPOConfig])
def test_mask_truncated_completions_needs_a_stop_token(config_class):
    """Without a stop token every completion counts as truncated: all would be masked and nothing trained."""
    with pytest.raises(ValueError, match="mask_truncated_completions needs a stop token"):
        config_class(mask_truncated_completions=True, stop_token=None)
    assert config_class(mask_truncated_completions=True, stop_token=None, stop_token_id=7).stop_token_id == 7
    assert config_class(stop_token=None).stop_token is None  # without the masking, no stop token is fine
