"""Stop tokens are a list: the tokenizer's EOS and every id of the model's generation_config.eos_token_id (TRL's
default), or `stop_token_ids`. A completion ends at the first of any of them, in the decode loop, in truncation
and in every stop metric (tests/with_vllm checks vLLM the same way)."""

import torch

from training_wizard import RLOOConfig, RLOOTrainer
from training_wizard.core.masking import truncate_after_stop
from training_wizard.rollout.backends import DecodeLoopBackend, sample_completions
from training_wizard.rollout.generation import GenerationParams, default_stop_token_ids
from training_wizard.testing import build_causal_lm


def test_a_completion_ends_at_the_second_stop_id():
    # generation config eos [3, 1], tokenizer eos 3: [10, 11, 1, 12, 13] ends at the 1 (before: all five kept)
    responses = torch.tensor([[10, 11, 1, 12, 13], [10, 3, 1, 12, 13], [10, 11, 12, 13, 14]])
    kept, mask, has_stop = truncate_after_stop(responses, (3, 1), pad_token_id=0)
    assert mask.tolist() == [[True, True, True, False, False], [True, True, False, False, False], [True] * 5]
    assert has_stop.tolist() == [True, True, False]
    assert kept[0].tolist() == [10, 11, 1, 0, 0]


def test_default_stop_ids_are_the_tokenizers_eos_then_the_generation_configs(tokenizer):
    eos = tokenizer.eos_token_id
    model = build_causal_lm(tokenizer)
    model.generation_config.eos_token_id = [eos, 7, 9]
    assert default_stop_token_ids(tokenizer, model) == (eos, 7, 9)
    model.generation_config.eos_token_id = 7
    assert default_stop_token_ids(tokenizer, model) == (eos, 7)
    model.generation_config.eos_token_id = None
    assert default_stop_token_ids(tokenizer, model) == (eos,)


def test_default_stop_ids_read_a_lora_models_base_config(tokenizer):
    from peft import LoraConfig, get_peft_model

    model = build_causal_lm(tokenizer)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, 7]
    adapted = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert default_stop_token_ids(tokenizer, adapted) == (tokenizer.eos_token_id, 7)


def test_the_decode_loop_stops_at_any_stop_id(tokenizer):
    """Sampled with EOS alone, then again with the same keys and a token that appears mid-completion as a second
    stop id: every row is the same up to that token's first appearance, and ends there."""
    model = build_causal_lm(tokenizer, seed=2).eval()
    texts = ["Write something", "Paraphrase the sentence now", "Hello", "Numbers 1 2 3"]
    rows = [tokenizer(text)["input_ids"] for text in texts]
    width, pad = max(map(len, rows)), tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    seeds = [11, 12, 13, 14]

    def completions(stop_ids):
        params = GenerationParams(max_new_tokens=10, temperature=1.0, stop_token_ids=stop_ids, pad_token_id=pad)
        return sample_completions(DecodeLoopBackend(8), model, ids, ids != pad, params, seeds)

    alone = completions((tokenizer.eos_token_id,))
    first_row = alone.responses[0][alone.mask[0]].tolist()
    assert len(first_row) >= 4
    second = first_row[2]  # a token the first row draws at position 2 (its first appearance is at most there)
    ends = first_row.index(second)
    both = completions((tokenizer.eos_token_id, second))
    assert both.responses[0][both.mask[0]].tolist() == first_row[: ends + 1]
    assert bool(both.has_stop[0])
    for row in range(len(texts)):  # every row: the same tokens up to its first stop of either kind
        kept = alone.responses[row][alone.mask[row]].tolist()
        cut = next((i for i, t in enumerate(kept) if t in (tokenizer.eos_token_id, second)), len(kept) - 1)
        assert both.responses[row][both.mask[row]].tolist() == kept[: cut + 1]


def test_the_trainer_stops_on_the_models_generation_config_ids(tokenizer, tmp_path):
    policy = build_causal_lm(tokenizer)
    policy.generation_config.eos_token_id = [tokenizer.eos_token_id, 7]

    def settings(**options):
        config = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=8,
                            response_length=5, num_sample_generations=0, rloo_k=2, **options)
        trainer = RLOOTrainer(config=config, tokenizer=tokenizer, policy=policy,
                              reward_model=lambda prompts, completions, **columns: [0.0] * len(completions),
                              train_dataset=[{"prompt": f"Say {i}."} for i in range(4)])
        return trainer.collector.settings.stop_token_ids

    assert settings() == (tokenizer.eos_token_id, 7)
    assert settings(stop_token_id=5) == (5,)
    assert settings(stop_token_ids=[5, 6], stop_token_id=4) == (5, 6)
    assert settings(stop_token=None) == ()
