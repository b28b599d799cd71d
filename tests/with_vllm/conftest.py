"""vLLM tests: run in the .venv-vllm environment (scripts/setup_vllm.sh) with `pytest -m vllm tests/with_vllm`.

They use vLLM's CPU build with an in-process engine core, float32, and tiny models whose attention head size is 32
(hidden 64, 2 heads), the smallest the CPU kernels take.
"""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import pytest  # noqa: E402

from training_wizard.testing import build_causal_lm, build_tokenizer  # noqa: E402


def vllm_sized_model(tokenizer, seed: int = 0):
    """A tiny random Qwen2 with attention head size 32."""
    return build_causal_lm(tokenizer, arch="qwen2", hidden_size=64, seed=seed, num_attention_heads=2,
                           num_key_value_heads=2)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("vllm-qwen2")
    vllm_sized_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
