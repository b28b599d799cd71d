"""PPOTrainer through the Python API on a tiny random model."""

import pytest
import torch

from training_wizard import PPOConfig
from training_wizard.testing import build_causal_lm, build_sequence_classifier, scripted_backend
from training_wizard.tracking.metrics import read_metrics

from tests.helpers import make_ppo_trainer, offset_x_share, with_logprobs

PPO_METRICS = {
    "eps", "objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
    "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg",
    "val/clipfrac_avg", "policy/entropy_avg", "val/ratio", "val/ratio_var", "val/num_eos_tokens", "lr", "episode",
}


def test_ppo_learns_a_learnable_reward_and_its_value_loss_falls(tokenizer, tmp_path):
    trainer = make_ppo_trainer(tokenizer, tmp_path, reward=offset_x_share, per_device_train_batch_size=16,
                               total_episodes=16 * 40,
                               response_length=8, num_ppo_epochs=2, learning_rate=3e-3, temperature=1.0, kl_coef=0.0,
                               vf_coef=0.5)
    trainer.train()
    metrics = read_metrics(tmp_path)
    scores = [m["objective/scores"] for m in metrics]
    value_loss = [m["loss/value_avg"] for m in metrics]
    assert sum(scores[-5:]) / 5 > sum(scores[:5]) / 5 + 0.3, scores
    assert sum(value_loss[-5:]) / 5 < sum(value_loss[:5]) / 5, value_loss
    assert PPO_METRICS <= set(metrics[0])


def test_first_update_with_one_epoch_has_ratio_one(tokenizer, tmp_path):
    trainer = make_ppo_trainer(tokenizer, tmp_path, num_ppo_epochs=1, kl_coef=0.1, total_episodes=8)
    trainer.train()
    first = read_metrics(tmp_path)[0]
    assert abs(first["val/ratio"] - 1.0) < 1e-6 and first["val/ratio_var"] < 1e-10
    assert first["policy/clipfrac_avg"] == 0.0 and first["val/clipfrac_avg"] == 0.0  # nothing moved yet
    assert first["loss/value_avg"] > 0


def test_rollout_values_and_advantages_are_zero_after_the_stop(tokenizer, tmp_path, monkeypatch):

    eos, other = tokenizer.eos_token_id, tokenizer.eos_token_id + 5

    def fixed_responses(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        return torch.tensor([[other, eos, other, other] if row % 2 else [other] * 4 for row in range(len(seeds))])

    backend = scripted_backend(lambda *args, **kwargs: with_logprobs(fixed_responses(*args, **kwargs)))
    trainer = make_ppo_trainer(tokenizer, tmp_path, kl_coef=0.1, backend=backend)
    rollout = trainer.collect_rollout()
    shaped = trainer.shape_rewards(rollout)
    padding = ~rollout.completion_mask
    assert padding[1].tolist() == [False, False, True, True] and not padding[0].any()
    assert rollout.extras["values"].shape == rollout.completion_ids.shape
    assert (shaped.advantages[padding] == 0).all() and (shaped.returns[padding] == 0).all()
    assert (shaped.advantages[~padding] != 0).all()


def test_value_model_defaults_to_a_copy_of_a_reward_model(tokenizer, tmp_path):
    classifier = build_sequence_classifier(tokenizer)
    trainer = make_ppo_trainer(tokenizer, tmp_path, reward=classifier)
    value = trainer.accelerator.unwrap_model(trainer.value_model)
    assert value is not classifier
    for (name, a), b in zip(value.state_dict().items(), classifier.state_dict().values()):
        assert torch.equal(a, b), name
    assert all(p.requires_grad for p in value.parameters()) and not any(p.requires_grad for p in classifier.parameters())


def test_non_eos_penalty_replaces_the_score_of_unfinished_completions(tokenizer, tmp_path):
    trainer = make_ppo_trainer(tokenizer, tmp_path, reward=lambda p, c, **k: [5.0] * len(c), non_eos_penalty=True,
                               penalty_reward_value=-3.0)
    rollout = trainer.collect_rollout()
    expected = torch.where(rollout.has_stop, torch.tensor(5.0), torch.tensor(-3.0))
    assert (~rollout.has_stop).any()
    torch.testing.assert_close(rollout.scores, expected)


def test_both_eos_tricks_at_once_are_refused():
    with pytest.raises(ValueError, match="either non_eos_penalty"):
        PPOConfig(non_eos_penalty=True, missing_eos_penalty=1.0)


def test_lora_policy_and_value_train_only_adapters_and_head(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(build_causal_lm(tokenizer), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    trainer = make_ppo_trainer(tokenizer, tmp_path, policy=policy)
    value = trainer.accelerator.unwrap_model(trainer.value_model)
    trainable = [name for name, p in value.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name or "score" in name for name in trainable), trainable
    before = {name: p.detach().clone() for name, p in value.named_parameters() if p.requires_grad}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in value.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_value_logits_read_the_head_at_the_position_before_each_response_token(tokenizer, arch):
    from training_wizard.rollout.value import value_logits
    from training_wizard.specs.value_model import value_model_from_policy

    value = value_model_from_policy(build_causal_lm(tokenizer, arch=arch))
    torch.nn.init.normal_(value.score.weight)  # a non-zero head, so the values say something
    prompt = torch.tensor([[tokenizer.pad_token_id, 11, 12], [21, 22, 23]])
    prompt_mask = prompt != tokenizer.pad_token_id
    responses = torch.tensor([[31, 32], [41, 42]])
    values = value_logits(value, prompt, prompt_mask, responses)
    # row 1 by hand, no padding: positions 2 (last prompt token) and 3 predict the two response tokens
    hidden = value.model(input_ids=torch.tensor([[21, 22, 23, 41, 42]])).last_hidden_state
    torch.testing.assert_close(values[1], value.score(hidden[0, 2:4]).squeeze(-1))
    changed = value_logits(value, prompt, prompt_mask, torch.tensor([[31, 99], [41, 99]]))
    torch.testing.assert_close(changed, values)  # the last response token never changes a value
