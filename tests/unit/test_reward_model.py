"""Reward-model training: pair formats, the recipe end to end on a learnable preference set, and its output as
a [reward] spec and as PPO's value model start."""

import json
import random

import pytest
import torch

from training_wizard.cli import main
from training_wizard.errors import UserError
from training_wizard.trainers.supervised.config import RewardConfig
from training_wizard.trainers.supervised.reward_model import collate_pairs, encode_pair


def ids(tokenizer, text):
    return tokenizer(text)["input_ids"]


def test_pair_formats(tokenizer):
    explicit = encode_pair({"prompt": "Say: ", "chosen": "the sun", "rejected": "a dog", "margin": 2}, tokenizer,
                           RewardConfig())
    assert explicit.chosen == ids(tokenizer, "Say: the sun") and explicit.rejected == ids(tokenizer, "Say: a dog")
    assert explicit.margin == 2.0
    implicit = encode_pair({"chosen": "Say: the sun", "rejected": "Say: a dog"}, tokenizer, RewardConfig())
    assert (implicit.chosen, implicit.rejected, implicit.margin) == (explicit.chosen, explicit.rejected, 0.0)
    chat = encode_pair({"prompt": [{"role": "user", "content": "hi"}],
                        "chosen": [{"role": "assistant", "content": "hello"}],
                        "rejected": [{"role": "assistant", "content": "go"}]}, tokenizer, RewardConfig())
    assert chat.chosen == ids(tokenizer, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n")
    batch = collate_pairs([explicit, implicit], pad_token_id=0)
    assert batch["input_ids"].shape[0] == 4 and batch["margin"].tolist() == [2.0, 0.0]
    assert batch["attention_mask"][2].sum().item() == len(explicit.rejected)  # chosen rows first, then rejected
    with pytest.raises(UserError, match="row 7: column 'rejected' missing"):
        encode_pair({"chosen": "x"}, tokenizer, RewardConfig(), "dataset row 7")
    with pytest.raises(UserError, match="'margin' must be a number"):
        encode_pair({"chosen": "x", "rejected": "y", "margin": "big"}, tokenizer, RewardConfig())


GOOD, BAD = ["sun", "tree", "moon", "cat"], ["dog", "red", "blue", "green"]

RECIPE = """\
recipe_class = "reward_model"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
{lora}
[dataset]
data_files = "{data}"
hold_out = 40
[training]
per_device_train_batch_size = 8
num_train_epochs = 2
learning_rate = 3e-3
max_length = 64
center_rewards_coefficient = 0.01
"""


def preference_rows(count, seed):
    """The preferred completion is three words of one set, the other three of the other: a rule a tiny model can
    learn. The held-out rows are the last 40 of the file."""
    rng = random.Random(seed)
    return [{"prompt": f"Say {rng.choice('abc')}: ", "chosen": " ".join(rng.choice(GOOD) for _ in range(3)),
             "rejected": " ".join(rng.choice(BAD) for _ in range(3))} for _ in range(count)]


@pytest.mark.parametrize("lora", ["", "lora = { r = 8, alpha = 16 }"], ids=["full", "lora"])
def test_recipe_learns_a_preference_and_its_model_is_a_reward_spec_and_a_value_model(tmp_path, tiny_model_dir,
                                                                                     capsys, lora):
    rows = preference_rows(160, seed=1)
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    recipe = tmp_path / "rm.toml"
    recipe.write_text(RECIPE.format(out=tmp_path / "out", model=tiny_model_dir, data=data, lora=lora))
    assert main([str(recipe)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    first = records[0]
    assert {"loss", "accuracy", "margin", "rewards/chosen", "rewards/rejected", "lr", "episode"} <= set(first)
    assert first["loss"] == pytest.approx(0.6931472, abs=1e-6)  # the new head starts at zero: log 2
    held_out = [r for r in records if "eval/accuracy" in r][-1]
    assert held_out["eval/accuracy"] > 0.9, held_out  # seen: 1.0, eval/margin 5.18 (LoRA: 4.88)
    assert not (tmp_path / "out" / "model" / "adapter_config.json").exists()  # LoRA: merged by default
    # model/ is a [reward] ModelRewardSpec as it is: it ranks the 40 held-out pairs the same way
    from training_wizard.specs.reward import ModelRewardSpec

    spec = ModelRewardSpec(pretrained_name=str(tmp_path / "out" / "model"))
    tests = rows[-40:]
    chosen = spec.compute_reward([r["prompt"] for r in tests], [r["chosen"] for r in tests])
    rejected = spec.compute_reward([r["prompt"] for r in tests], [r["rejected"] for r in tests])
    accuracy = sum(c > r for c, r in zip(chosen, rejected)) / len(tests)
    assert accuracy == pytest.approx(held_out["eval/accuracy"])
    # ... and PPO's value model starts from it (same vocabulary as the policy: the default when [reward] is it)
    from training_wizard.specs.model import TransformerSpec
    from training_wizard.specs.value_model import load_value_model

    policy_tokenizer = TransformerSpec(pretrained_name=str(tiny_model_dir)).load_tokenizer()
    assert spec.shares_vocabulary(policy_tokenizer)
    value = load_value_model(TransformerSpec(pretrained_name=str(tmp_path / "out" / "model")), "float32",
                             policy_tokenizer)
    reward_model, _ = spec.load()
    assert torch.equal(value.score.weight, reward_model.score.weight) and value.score.weight.abs().sum() > 0


def test_pairs_longer_than_max_length_are_left_out_not_cut(tokenizer):
    """TRL's RewardTrainer filters pairs over max_length. Cutting them instead made a long prompt's chosen and
    rejected the same tokens (no signal, still averaged in)."""
    from training_wizard.trainers.supervised.reward_model import encode_pairs

    long_prompt = "word " * 40
    rows = [{"prompt": "Say: ", "chosen": "the sun", "rejected": "a dog"},
            {"prompt": long_prompt, "chosen": "the sun", "rejected": "a dog"},
            {"prompt": "Hi ", "chosen": "yes", "rejected": "no"}]
    config = RewardConfig(max_length=16)
    pairs, too_long = encode_pairs(rows, tokenizer, config)
    assert too_long == [1] and len(pairs) == 2
    assert pairs[1].chosen == encode_pair(rows[2], tokenizer, config).chosen
    assert all(max(len(p.chosen), len(p.rejected)) <= 16 for p in pairs)
    kept, none_dropped = encode_pairs(rows, tokenizer, RewardConfig(max_length=None))
    assert none_dropped == [] and len(kept[1].chosen) > 16 and kept[1].chosen != kept[1].rejected
    with pytest.raises(UserError, match="all 1 are longer than training.max_length"):
        encode_pairs(rows[1:2], tokenizer, config)
