"""Data parallel on CPU (gloo): 2 processes and 1 process with the same global batch end in the same place."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

RECIPE = """\
recipe_class = "rloo"
output_dir = "{out}"
seed = 5

[model]
pretrained_name = "{model}"
{lora}

[dataset]
data_files = "{data}"

[reward]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "dp_rewards:{reward}"

[training]
rloo_k = 2
per_device_train_batch_size = 4
gradient_accumulation_steps = {accumulation}
num_mini_batches = 1
num_ppo_epochs = 2
total_episodes = 24
response_length = 6
learning_rate = 2e-4
kl_coef = 0.1
normalize_advantage = true
num_sample_generations = 3
logprobs_from_sampling = false
token_level_kl = {token_level}
"""

REWARDS = '''
import os

def distinct(prompts, completions, **columns):
    return [float(len(set(c))) for c in completions]

def broken_on_rank_1(prompts, completions, **columns):
    if os.environ.get("RANK") == "1":
        return [float("nan")] * len(completions)
    return [1.0] * len(completions)

class Echo:
    def reset(self, prompt=None, **row):
        return None

    def step(self, reply):
        return f"{len(reply)} letters.", float(len(reply) % 3), False
'''

# episodes of up to 2 replies with Echo (a text environment); half the vocabulary stops a reply, so replies are
# short, episodes end at different turns and lengths on each process
EPISODES = '''[environment]
factory = "dp_rewards:Echo"
protocol = "text"

'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_recipe(tmp_path, model_dir, name, processes, reward="distinct", token_level="false", algorithm="rloo",
                 lora=""):
    """The test recipe for `processes` processes (same global batch: 2 x 4 x 1 == 1 x 4 x 2); returns its path."""
    data = tmp_path / "prompts.jsonl"
    if not data.exists():
        data.write_text("\n".join(json.dumps({"prompt": f"Tell me about item {i}."}) for i in range(12)))
        (tmp_path / "dp_rewards.py").write_text(REWARDS)
    accumulation = 2 // processes
    recipe = tmp_path / f"{name}.toml"
    text = RECIPE.format(
        out=tmp_path / name, model=model_dir, data=data, reward=reward, accumulation=accumulation,
        token_level=token_level, lora=lora,
    )
    if algorithm == "ppo":  # one completion per prompt; advantages are always whitened, per token
        text = text.replace('"rloo"', '"ppo"').replace("rloo_k = 2\n", "").replace("normalize_advantage = true\n", "")
        text = text.replace(f"token_level_kl = {token_level}\n", "")
    if algorithm.startswith("grpo"):  # TRL 1.x names; the token-level dapo loss normalised over both processes' tokens
        text = text.replace('"rloo"', '"grpo"').replace("rloo_k = 2\n", "num_generations = 2\n")
        text = text.replace("normalize_advantage = true\n", "").replace(f"token_level_kl = {token_level}\n", "")
        text = text.replace("kl_coef = 0.1\n", "beta = 0.1\nepsilon_high = 0.28\nmask_truncated_completions = true\n"
                            "scale_rewards = \"batch\"\n")
    if algorithm == "grpo-episodes":
        stops = list(range(40, 300, 2))
        budget = f"response_length = 40\nmax_turns = 2\nstop_token_ids = {stops}\n"
        text = text.replace("response_length = 6\n", budget)
        text = text.replace("[training]", EPISODES + "[training]")
    recipe.write_text(text)
    return recipe


def launch(tmp_path, model_dir, name, processes, reward="distinct", timeout=300, token_level="false", overrides=(),
           env_extra=None, algorithm="rloo", lora=""):
    recipe = write_recipe(tmp_path, model_dir, name, processes, reward, token_level, algorithm, lora)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
           **(env_extra or {})}  # the caller's PYTHONPATH kept: a source tree put first is the one tested
    if processes == 1:
        command = [sys.executable, "-m", "training_wizard", str(recipe), *overrides]
    else:
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()), "-m", "training_wizard", str(recipe), *overrides,
        ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# Truncated sampling: a completion must still be the same whichever process draws it.
SAMPLING_FILTERS = ("training.top_k=50", "training.top_p=0.9", "training.min_p=0.01", "training.repetition_penalty=1.2")
# Every fast-path option on: logprobs from the sampling pass and the single-pass update (shared prefill and
# cutting padding are always on).
FAST_PATH = ("training.logprobs_from_sampling=true", "training.num_ppo_epochs=1")
# ... and the compiled update: slow (each process compiles for about a minute on a 2-core machine).
COMPILED_FAST_PATH = (*FAST_PATH, "training.torch_compile=true")
# Batches sampled two iterations ahead: by the producer thread with one process, inline with two.
ASYNC_BOUND_2 = ("training.async_rollouts=true", "training.max_staleness=2")
# Micro-batches by tokens: rows of different lengths, split unevenly and differently on each process (which then
# agree on a number of micro-batches per step and pad with passes of weight 0).
TOKEN_BUDGET = ("training.max_tokens_per_micro_batch=60",)
# Padding-free packed forwards, with the policy's own logprob pass (the sampler's would leave the update and the
# reference as the only packed passes), under eager attention: there a packed row's numbers are bitwise the padded
# row's (tests/unit/test_padding_free.py), and two processes end 7.5e-7 from one (padded under SDPA: 4.9e-7). Under
# SDPA on a CPU the packed mask's attention rounds a row by the rows packed with it, which differ with the process
# count, and Adam carries that into the weights: 2.7e-5 apart after three iterations, past this test's 1e-5.
PADDING_FREE = ("training.padding_free=true", "training.logprobs_from_sampling=false",
                "model.attn_implementation=eager")


# Every case starts two processes twice (about 25-55 s on a 2-core machine): all run with -m slow, which .ci/run
# runs for this file, keeping the default suite short.
@pytest.mark.parametrize("algorithm, token_level, overrides",
                         [pytest.param("rloo", "false", (), id="sequence_kl", marks=pytest.mark.slow),
                          pytest.param("rloo", "true", (), id="token_level_kl", marks=pytest.mark.slow),
                          pytest.param("ppo", "false", (), id="ppo", marks=pytest.mark.slow),
                          pytest.param("grpo", "false", SAMPLING_FILTERS, id="grpo", marks=pytest.mark.slow),
                          pytest.param("grpo", "false", ("training.importance_sampling_level=sequence",
                                                         "training.loss_type=grpo", "training.beta=0.0"),
                                       id="grpo_sequence_no_reference", marks=pytest.mark.slow),
                          pytest.param("grpo-episodes", "false", (), id="grpo_episodes", marks=pytest.mark.slow),
                          pytest.param("rloo", "false", FAST_PATH, id="fast_path", marks=pytest.mark.slow),
                          pytest.param("rloo", "false", COMPILED_FAST_PATH, id="fast_path_compiled",
                                       marks=pytest.mark.slow),
                          pytest.param("rloo", "false", ASYNC_BOUND_2, id="async_bound_2", marks=pytest.mark.slow),
                          pytest.param("grpo", "false", TOKEN_BUDGET, id="grpo_token_budget", marks=pytest.mark.slow),
                          pytest.param("grpo-episodes", "false", TOKEN_BUDGET, id="grpo_episodes_token_budget",
                                       marks=pytest.mark.slow),
                          pytest.param("rloo", "false", (*TOKEN_BUDGET, *PADDING_FREE), id="rloo_both_keys",
                                       marks=pytest.mark.slow),
                          pytest.param("rloo", "false", PADDING_FREE, id="padding_free", marks=pytest.mark.slow),
                          pytest.param("ppo", "false", PADDING_FREE, id="ppo_padding_free", marks=pytest.mark.slow),
                          pytest.param("grpo-episodes", "false", PADDING_FREE, id="grpo_episodes_padding_free",
                                       marks=pytest.mark.slow)])
def test_two_processes_match_one_process(tmp_path, tiny_model_dir, algorithm, token_level, overrides):
    if algorithm == "grpo":  # completions of different lengths, some cut off: the token counts differ by process
        tiny_model_dir = eos_prone_copy(tiny_model_dir, tmp_path / "eos-prone")
    # token_level_kl and PPO gather (B, T) tensors and token-count-dependent statistics across processes
    single = launch(tmp_path, tiny_model_dir, "single", 1, token_level=token_level, algorithm=algorithm,
                    overrides=overrides)
    assert single.returncode == 0, single.stderr[-3000:]
    double = launch(tmp_path, tiny_model_dir, "double", 2, token_level=token_level, algorithm=algorithm,
                    overrides=overrides)
    assert double.returncode == 0, double.stderr[-3000:]

    a = load_file(str(tmp_path / "single" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "double" / "model" / "model.safetensors"))
    start = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - start[k]).abs().max().item() for k in a)
    assert worst < 1e-5, worst
    assert moved > 2e-4, "training did not move the weights, so the comparison proves nothing"

    m1, m2 = read_jsonl(tmp_path / "single" / "metrics.jsonl"), read_jsonl(tmp_path / "double" / "metrics.jsonl")
    assert len(m1) == len(m2) == 3  # 24 episodes / 8 per iteration; rank 1 wrote nothing extra
    keys = ["objective/scores", "objective/kl", "objective/rlhf_reward", "loss/policy_avg", "val/ratio",
            "policy/approxkl_avg", "val/num_eos_tokens", "episode", "lr"]
    if algorithm == "ppo":
        keys += ["loss/value_avg", "val/clipfrac_avg"]
    if algorithm == "grpo-episodes":
        keys += ["episodes/replies_mean", "episodes/environment_tokens_mean", "rewards/Echo", "entropy"]
        assert min(m["episodes/replies_mean"] for m in m1) > 1.2  # the environment answered: several turns
    if algorithm == "grpo":
        keys += ["reward", "reward_std", "frac_reward_zero_std", "completions/clipped_ratio", "entropy",
                 "clip_ratio/region_mean", "policy/clipfrac_avg"]
    if overrides == ASYNC_BOUND_2:
        keys += ["sample/staleness_max"]
        assert [m["sample/staleness_max"] for m in m2] == [0.0, 1.0, 2.0]
        for r1, r2 in zip(m1[1:], m2[1:]):  # the stale batches' correction (the first batch is fresh)
            ratio = "sampling/importance_sampling_ratio/mean"
            assert r1[ratio] == pytest.approx(r2[ratio], abs=1e-5) and r1[ratio] != 1.0
    for r1, r2 in zip(m1, m2):
        for key in keys:
            assert r1[key] == pytest.approx(r2[key], abs=1e-5), key
    samples = read_jsonl(tmp_path / "double" / "samples.jsonl")
    assert len(samples) == 3 * (4 + 4)  # three tables of four rows and four probe rows, from rank 0 only
    # each iteration's prompts over both processes, written once by rank 0
    assert read_jsonl(tmp_path / "double" / "prompts.jsonl") == read_jsonl(tmp_path / "single" / "prompts.jsonl")
    per_iteration = 8 if algorithm == "ppo" else 4  # 8 completions: one per prompt for PPO, two otherwise
    assert [len(r["prompts"]) for r in read_jsonl(tmp_path / "double" / "prompts.jsonl")] == [per_iteration] * 3


def eos_prone_copy(model_dir, folder: Path) -> Path:
    """The tiny model with its EOS output row scaled 20x: about half of 6-token completions stop, after 2 to 6
    tokens (the random model alone almost never emits EOS)."""
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    shutil.copytree(model_dir, folder)
    weights = load_file(str(folder / "model.safetensors"))
    eos = AutoTokenizer.from_pretrained(str(folder)).eos_token_id
    weights["lm_head.weight"][eos] *= 20
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_user_error_on_one_rank_stops_all_ranks(tmp_path, tiny_model_dir):
    done = launch(tmp_path, tiny_model_dir, "broken", 2, reward="broken_on_rank_1", timeout=180)
    assert done.returncode != 0
    # both ranks stop with the failing rank's message and exit code 2; the only traceback is the launcher's own
    # report that its children failed, none comes from training-wizard code
    assert done.stderr.count("row 0: value is nan") == 2, done.stderr[-3000:]
    # the launcher may stop the second rank (SIGTERM, -15) once the first has exited with 2
    assert done.stderr.count("exitcode  : 2") >= 1
    assert done.stderr.count("exitcode  : 2") + done.stderr.count("exitcode  : -15") == 2
    assert "training_wizard/" not in done.stderr.split("ChildFailedError")[0]
    assert not (tmp_path / "broken" / "model").exists()


@pytest.mark.parametrize("options", [pytest.param((), id="default", marks=pytest.mark.slow),
                                     pytest.param(FAST_PATH, id="fast_path", marks=pytest.mark.slow),
                                     pytest.param(COMPILED_FAST_PATH, id="fast_path_compiled", marks=pytest.mark.slow),
                                     pytest.param(TOKEN_BUDGET, id="token_budget", marks=pytest.mark.slow),
                                     pytest.param(PADDING_FREE, id="padding_free", marks=pytest.mark.slow),
                                     pytest.param((*TOKEN_BUDGET, *PADDING_FREE), id="both_keys",
                                                  marks=pytest.mark.slow)])
def test_two_process_run_resumes_exactly(tmp_path, tiny_model_dir, options):
    """SIGTERM one rank of a 2-process run after its second iteration: both ranks stop at the same point with a
    checkpoint; the resumed run ends with the same weights as a run that never stopped. The main process picks
    the checkpoint and every process loads it."""
    full = launch(tmp_path, tiny_model_dir, "full", 2, overrides=options)
    assert full.returncode == 0, full.stderr[-3000:]
    stop_rank_1 = {"TRAINING_WIZARD_FAULT_INJECT": "iteration@2#1=term"}
    first = launch(tmp_path, tiny_model_dir, "parts", 2, env_extra=stop_rank_1, overrides=options)
    assert first.returncode != 0 and first.stderr.count("exitcode  : 143") >= 1, first.stderr[-3000:]
    rest = launch(tmp_path, tiny_model_dir, "parts", 2, overrides=[*options, "resume_from_checkpoint=latest"])
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert "resumed from" in rest.stdout and "iteration 2" in rest.stdout
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "parts" / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    episodes = [r["episode"] for r in read_jsonl(tmp_path / "parts" / "metrics.jsonl")]
    assert episodes == [8, 16, 24]
