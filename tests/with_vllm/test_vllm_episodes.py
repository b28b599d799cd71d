"""Episodes of several turns sampled by vLLM (use_vllm = true, colocated): each turn goes to the engine as token
ids and comes back as token ids, so the spliced episode is the sampled replies plus the template's ids for the
environment's answers, and the training pass's logprobs of the model's tokens match vLLM's within 1e-4 (as the
single-turn vLLM tests)."""

import pytest
import torch

from training_wizard import GRPOConfig, GRPOTrainer
from training_wizard.rollout.chat_turns import TurnRenderer
from training_wizard.specs.episode import EpisodeSettings
from training_wizard.rollout.trajectory import StopReason

from conftest import vllm_sized_model

pytestmark = pytest.mark.vllm

STOPS = list(range(40, 300, 2))  # half the vocabulary stops a reply: replies are short, episodes reach turn 3


class Echo:
    def reset(self, prompt=None, **row):
        return "Count the letters."

    def step(self, reply):
        return f"You wrote {len(reply)} letters.", 1.0, False


def reply_length(prompts, completions, **columns):
    return [len(text) / 10 for text in completions]


def test_vllm_episodes_splice_the_sampled_ids_and_match_the_training_logprobs(tokenizer, tmp_path):
    config = GRPOConfig(output_dir=str(tmp_path), use_vllm=True, num_generations=2, per_device_train_batch_size=8,
                        total_episodes=8, response_length=128, stop_token_ids=STOPS, max_turns=3, seed=5,
                        num_sample_generations=0, logprobs_from_sampling=False)
    prompts = [{"prompt": [{"role": "user", "content": f"Say something {i}."}]} for i in range(4)]
    trainer = GRPOTrainer(config=config, tokenizer=tokenizer, policy=vllm_sized_model(tokenizer),
                          reward_model=reply_length, train_dataset=prompts, environment_factory=Echo,
                          episode_settings=EpisodeSettings(protocol="text"))
    batch = trainer.collect_rollout()
    renderer = TurnRenderer(tokenizer)
    answers = 0
    for row in range(batch.num_rows):
        real = batch.completion_mask[row]
        ids, model = batch.completion_ids[row][real].tolist(), batch.loss_mask[row][real].tolist()
        start, reply = 0, []
        while start < len(ids):
            end = start
            while end < len(ids) and model[end] == model[start]:
                end += 1
            if model[start]:
                reply = ids[start:end]
            else:  # the environment's part: exactly the template's ids for Echo's text on the reply before it
                text = f"You wrote {len(tokenizer.decode(reply, skip_special_tokens=True))} letters."
                expected = renderer.observation_ids(text, reply[-1])
                assert ids[start:end] == expected[: end - start], row
                answers += 1
            start = end
    assert answers >= batch.num_rows  # most episodes read an answer or two
    assert set(batch.stop_reason.tolist()) <= {int(StopReason.TURNS), int(StopReason.LENGTH)}
    mask = batch.loss_mask
    assert batch.sampling_logprobs is not None and (batch.sampling_logprobs[~mask] == 0).all()
    assert (batch.logprobs - batch.sampling_logprobs)[mask].abs().max() < 1e-4
    assert torch.isfinite(batch.scores).all()
