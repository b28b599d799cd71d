"""Two processes, each with its own colocated vLLM engine (vLLM's external launcher in the gloo world accelerate
made), end where one process with the same global batch ends: the per-row seeds make each prompt's completions
independent of which process samples it. Under FSDP2 each push gathers the sharded weights one tensor at a time."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.smoke.test_distributed import launch, read_jsonl
from tests.smoke.test_sharded import DEEPSPEED_CACHE, FSDP2, ZERO, launch_sharded, max_difference

pytestmark = pytest.mark.vllm


def test_two_processes_with_colocated_engines_match_one_process(tmp_path, vllm_model_dir):
    overrides = ("training.use_vllm=true",)
    single = launch(tmp_path, vllm_model_dir, "single", 1, overrides=overrides, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    double = launch(tmp_path, vllm_model_dir, "double", 2, overrides=overrides, timeout=600)
    assert double.returncode == 0, double.stderr[-3000:]
    a = load_file(str(tmp_path / "single" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "double" / "model" / "model.safetensors"))
    start = load_file(str(Path(vllm_model_dir) / "model.safetensors"))
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - start[k]).abs().max().item() for k in a)
    assert worst < 1e-5, worst  # seen 3.5e-6
    assert moved > 2e-4, "training did not move the weights, so the comparison proves nothing"
    m1, m2 = read_jsonl(tmp_path / "single" / "metrics.jsonl"), read_jsonl(tmp_path / "double" / "metrics.jsonl")
    assert len(m1) == len(m2) == 3
    for r1, r2 in zip(m1, m2):
        assert r1["objective/scores"] == r2["objective/scores"]  # the same completions were sampled
        for key in ("objective/kl", "loss/policy_avg", "val/ratio"):
            assert r1[key] == pytest.approx(r2[key], abs=1e-5), key
        assert r2["sampling/sampling_logp_difference/max"] < 1e-3  # both engines got every push
    assert torch.equal(torch.tensor([m["episode"] for m in m1]), torch.tensor([m["episode"] for m in m2]))


def test_fsdp2_gathers_the_weights_it_pushes_and_matches_one_process(tmp_path, vllm_model_dir):
    overrides = ("training.use_vllm=true",)
    single = launch(tmp_path, vllm_model_dir, "single", 1, overrides=overrides, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    sharded = launch_sharded(tmp_path, vllm_model_dir, "fsdp2", FSDP2, overrides=overrides, timeout=600)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert max_difference(tmp_path / "single", tmp_path / "fsdp2") < 1e-5
    assert max_difference(tmp_path / "single", Path(vllm_model_dir), start=True) > 2e-4
    metrics = read_jsonl(tmp_path / "fsdp2" / "metrics.jsonl")
    assert [m["objective/scores"] for m in metrics] == [m["objective/scores"] for m in read_jsonl(
        tmp_path / "single" / "metrics.jsonl")]
    assert all(m["sampling/sampling_logp_difference/max"] < 1e-3 for m in metrics)


def test_deepspeed_is_refused_in_one_line(tmp_path, vllm_model_dir):
    refused = launch_sharded(tmp_path, vllm_model_dir, "zero3", ZERO.format(stage=3), overrides=("training.use_vllm=true",),
                             env_extra=DEEPSPEED_CACHE, timeout=600)
    assert refused.returncode != 0
    assert "training.use_vllm: not supported under DeepSpeed here; use FSDP2" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "zero3" / "metrics.jsonl").exists()
