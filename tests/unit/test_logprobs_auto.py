"""`logprobs_from_sampling = "auto"`: on where the sampling pass and a training-style pass are the same computation
(float32 weights, no autocast, the decode loop), off otherwise; where it turns on, the run logs what it logs with
the separate old-logprob pass."""

import math
from types import SimpleNamespace

import pytest
import torch

from training_wizard import RLOOConfig
from training_wizard.testing import build_causal_lm
from training_wizard.tracking.metrics import read_metrics
from training_wizard.trainers.loop.setup import resolve_logprobs_from_sampling

from tests.helpers import make_rloo_trainer, prompts

TIMING = ("eps", "tokens_per_s")  # wall-clock figures differ between any two runs


def variety(prompts, completions, **columns):
    """Distinct characters per character: scores that differ between completions (a reward of 0 everywhere would
    leave only the KL's rounding-level noise in the advantages, which advantage normalisation then amplifies)."""
    return [len(set(c)) / max(1, len(c)) for c in completions]


# This file's runs: 4 iterations of 4 samples of each of 9 prompts at temperature 1, two epochs each, from a
# policy of seed 2.
AUTO_OPTIONS = dict(rloo_k=4, total_episodes=32, temperature=1.0, seed=4, num_ppo_epochs=2)


def make_trainer(tokenizer, folder, accelerator=None, dtype=torch.float32, **overrides):
    return make_rloo_trainer(tokenizer, folder, reward=variety, policy=build_causal_lm(tokenizer, seed=2).to(dtype),
                             dataset=prompts(9), accelerator=accelerator, **{**AUTO_OPTIONS, **overrides})


def test_auto_is_the_default():
    assert RLOOConfig(output_dir="x").logprobs_from_sampling == "auto"
    assert RLOOConfig(output_dir="x", logprobs_from_sampling=False).logprobs_from_sampling is False


def test_auto_turns_on_in_float32_and_logs_what_the_separate_pass_logs(tokenizer, tmp_path):
    auto = make_trainer(tokenizer, tmp_path / "auto")
    off = make_trainer(tokenizer, tmp_path / "off", logprobs_from_sampling=False)
    assert auto.logprobs_from_sampling is True and off.logprobs_from_sampling is False
    auto.train()
    off.train()
    fast, slow = read_metrics(tmp_path / "auto"), read_metrics(tmp_path / "off")
    assert len(fast) == len(slow) == 4
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys()
        for key in a:
            if key in TIMING or key.startswith("time/"):
                continue
            # float32 rounding of one logprob pass against another, carried through four updates
            assert math.isclose(a[key], b[key], rel_tol=1e-3, abs_tol=1e-5), (key, a[key], b[key])
        # the same completions every iteration: the weights never drifted apart enough to draw another token
        assert a["objective/scores"] == b["objective/scores"]


def test_auto_is_off_under_bf16_autocast(tokenizer, tmp_path):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    try:
        accelerator = Accelerator(mixed_precision="bf16", cpu=True)
        assert make_trainer(tokenizer, tmp_path / "a", accelerator).logprobs_from_sampling is False
        forced = make_trainer(tokenizer, tmp_path / "b", accelerator, logprobs_from_sampling=True)
        assert forced.logprobs_from_sampling is True  # an explicit choice is kept
    finally:
        AcceleratorState._reset_state()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_is_off_with_half_precision_weights(tokenizer, dtype):
    config = RLOOConfig(output_dir="x")
    plain = SimpleNamespace(mixed_precision="no", distributed_type=SimpleNamespace(name="NO"))
    assert resolve_logprobs_from_sampling(config, plain, build_causal_lm(tokenizer).to(dtype)) is False
    assert resolve_logprobs_from_sampling(config, plain, build_causal_lm(tokenizer)) is True
    for forced in (True, False):
        chosen = config.model_copy(update={"logprobs_from_sampling": forced})
        assert resolve_logprobs_from_sampling(chosen, plain, build_causal_lm(tokenizer).to(dtype)) is forced


@pytest.mark.parametrize("engine", ["FSDP", "DEEPSPEED"])
def test_auto_is_off_under_a_sharding_engine(tokenizer, engine):
    sharded = SimpleNamespace(mixed_precision="no", distributed_type=SimpleNamespace(name=engine))
    data_parallel = SimpleNamespace(mixed_precision="no", distributed_type=SimpleNamespace(name="MULTI_GPU"))
    config = RLOOConfig(output_dir="x")
    assert resolve_logprobs_from_sampling(config, sharded, build_causal_lm(tokenizer)) is False
    assert resolve_logprobs_from_sampling(config, data_parallel, build_causal_lm(tokenizer)) is True
