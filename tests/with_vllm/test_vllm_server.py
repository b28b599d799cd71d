"""vllm_mode = "server": a `training-wizard vllm-serve` process on 127.0.0.1 samples for the trainer and takes its
weights after every update; an unreachable, silent or mismatched server ends in one line."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from training_wizard import RLOOConfig, RLOOTrainer
from training_wizard.errors import UserError
from training_wizard.rollout.backends import sample_completions
from training_wizard.rollout.generation import GenerationParams
from training_wizard.rollout.prompts import EncodedPrompts, row_seed
from training_wizard.rollout.vllm import VLLMColocateBackend, VLLMServerBackend
from training_wizard.testing import build_causal_lm
from training_wizard.tracking.metrics import read_metrics

from conftest import vllm_sized_model

pytestmark = pytest.mark.vllm


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(vllm_model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "training_wizard", "vllm-serve", "--model",
                                    str(vllm_model_dir), "--host", "127.0.0.1", "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            break
        except OSError:
            assert process.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
    else:
        process.kill()
        pytest.fail("the vLLM server did not start: " + log.read_text()[-3000:])
    yield url
    process.terminate()
    process.wait(timeout=30)


def server_config(tmp_path, url, **options):
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, rloo_k=2, response_length=8,
                    total_episodes=24, num_sample_generations=0, learning_rate=1e-2, kl_coef=0.05, temperature=1.0,
                    use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=30)
    settings.update(options)
    return RLOOConfig(**settings)


def lengths(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def dataset():
    return [{"prompt": f"Write something {i}."} for i in range(8)]


def test_the_server_samples_what_the_colocated_engine_samples(server, tokenizer):
    model = vllm_sized_model(tokenizer).eval()
    ids, mask = EncodedPrompts.from_rows(dataset(), tokenizer).left_pad(list(range(8)), tokenizer.pad_token_id)
    params = GenerationParams(8, 0.8, (tokenizer.eos_token_id,), tokenizer.pad_token_id)
    seeds = [row_seed(1, 0, i) for i in range(8)]
    remote = VLLMServerBackend(model, base_url=server, timeout=30, push=True, barrier=lambda: None,
                               sampling_options={})
    local = VLLMColocateBackend(model, max_model_len=128, seed=0, gpu_memory_utilization=0.3, tensor_parallel_size=1,
                                sleep_mode=False, world_size=1, sampling_options={})
    by_server = sample_completions(remote, model, ids, mask, params, seeds)
    in_process = sample_completions(local, model, ids, mask, params, seeds)
    assert int(by_server.mask.sum()) >= 8 * 4
    assert (by_server.responses == in_process.responses).all()
    assert (by_server.sampling_logprobs - in_process.sampling_logprobs).abs().max() < 1e-5


def test_a_run_against_the_server_pushes_its_weights_after_every_update(server, tokenizer, tmp_path):
    RLOOTrainer(config=server_config(tmp_path, server), tokenizer=tokenizer, policy=vllm_sized_model(tokenizer),
                reward_model=lengths, train_dataset=dataset()).train()
    metrics = read_metrics(tmp_path)
    assert len(metrics) == 3
    assert all(m["sampling/sampling_logp_difference/max"] < 1e-3 for m in metrics), metrics
    assert metrics[-1]["objective/kl"] > 0.05  # the weights moved, and the server sampled from the moved ones


def test_a_server_of_another_model_is_refused(server, tokenizer, tmp_path):
    other = build_causal_lm(tokenizer, arch="qwen2", hidden_size=128, num_attention_heads=4)
    with pytest.raises(UserError, match="serves another model.*hidden_size 64 \\(server\\) vs 128 \\(policy\\)"):
        RLOOTrainer(config=server_config(tmp_path, server), tokenizer=tokenizer, policy=other,
                    reward_model=lengths, train_dataset=dataset())


def test_no_server_at_the_url_is_one_line(tokenizer, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match=f"no vLLM server answered at {url} within 2 s"):
        RLOOTrainer(config=server_config(tmp_path, url, vllm_server_timeout=2), tokenizer=tokenizer,
                    policy=vllm_sized_model(tokenizer), reward_model=lengths, train_dataset=dataset())


def test_a_server_that_never_answers_times_out(tokenizer, tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(UserError, match="no vLLM server answered .* within 2 s"):
            RLOOTrainer(config=server_config(tmp_path, url, vllm_server_timeout=2), tokenizer=tokenizer,
                        policy=vllm_sized_model(tokenizer), reward_model=lengths, train_dataset=dataset())


def test_a_url_that_is_not_http_is_refused(tokenizer, tmp_path):
    with pytest.raises(UserError, match="vllm_server_base_url: expected an http:// or https:// URL"):
        RLOOTrainer(config=server_config(tmp_path, "localhost:8000"), tokenizer=tokenizer,
                    policy=vllm_sized_model(tokenizer), reward_model=lengths, train_dataset=dataset())
