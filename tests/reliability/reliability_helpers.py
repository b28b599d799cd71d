"""Shared pieces of the reliability tests: a tiny recipe, a forked CLI runner, and bitwise comparisons.

Runs go through `training_wizard.cli.main` in a forked child of the test process: the child starts with torch and
transformers already imported (a fresh interpreter costs ~5 s), can be SIGKILLed or signalled like any process,
and takes its exit status with it. Its stdout and stderr go to files the test reads.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
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

[dataset]
data_files = "{data}"

[reward]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "rel_rewards:distinct"

[training]
rloo_k = 2
per_device_train_batch_size = 2
gradient_accumulation_steps = 2
num_mini_batches = 2
num_ppo_epochs = 2
total_episodes = 96
response_length = 6
learning_rate = 2e-3
lr_scheduler_type = "linear"
warmup_steps = 2
max_grad_norm = 1.0
num_sample_generations = 3
save_steps = 1
"""
# 8 completions (4 prompts) per iteration, 12 iterations, a 6-prompt dataset: epoch boundaries fall inside
# iterations 1, 4, 7, 10 and exactly between iterations 2|3, 5|6, 8|9. Two mini-batches of two micro-batches,
# two PPO epochs: 4 optimizer steps per iteration, accelerate's accumulation counter matters.
ITERATIONS = 12

REWARDS = '''
def distinct(prompts, completions, **columns):
    return [float(len(set(c))) for c in completions]


class Echo:
    """A text environment for episodes: answers each reply with its length, pays 1 per reply."""

    def reset(self, prompt=None, **row):
        return None

    def step(self, reply):
        return f"{len(reply)} letters.", 1.0, False
'''

# episodes: GRPO whose rollouts are episodes of up to 2 replies with Echo; half the vocabulary stops a reply, so
# replies are short and most episodes reach their second turn
EPISODES = '''
[environment]
factory = "rel_rewards:Echo"
protocol = "text"
'''


def make_recipe(folder: Path, model_dir: Path, name: str, extra: str = "", algorithm: str = "rloo") -> Path:
    """The reliability recipe for `algorithm` "rloo", "grpo", "ppo" (PPO: one completion per prompt, so 8 prompts per
    iteration from the 6-prompt dataset, and a value model that starts from the policy) or "grpo-episodes" (GRPO on
    episodes of a text environment: EPISODES)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "prompts.jsonl"
    if not data.exists():
        data.write_text("\n".join(json.dumps({"prompt": f"Tell me about item {i}."}) for i in range(6)) + "\n")
        (folder / "rel_rewards.py").write_text(REWARDS)
    recipe = folder / f"{name}.toml"
    text = RECIPE.format(out=folder / name, model=model_dir, data=data)
    if algorithm == "ppo":
        text = text.replace('recipe_class = "rloo"', 'recipe_class = "ppo"').replace("rloo_k = 2\n", "")
    if algorithm.startswith("grpo"):  # GRPO with a reference (beta) and the dapo token normalisation over each step
        text = text.replace('recipe_class = "rloo"', 'recipe_class = "grpo"')
        text = text.replace("rloo_k = 2\n", "num_generations = 2\nbeta = 0.1\nepsilon_high = 0.28\n")
    if algorithm == "grpo-episodes":
        stops = list(range(40, 300, 2))
        budget = f"response_length = 40\nmax_turns = 2\nstop_token_ids = {stops}\n"
        text = text.replace("response_length = 6\n", budget)
        text = text.replace("[training]", EPISODES.strip() + "\n\n[training]")
    recipe.write_text(text + extra)
    return recipe


class Child:
    def __init__(self, pid: int, log: Path):
        self.pid, self.log = pid, log
        self._exit_code: int | None = None

    def poll(self) -> int | None:
        """The exit code (as `wait` gives it) once the child has ended, else None; never blocks."""
        if self._exit_code is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self._exit_code = os.waitstatus_to_exitcode(status)
        return self._exit_code

    def wait(self, timeout: float = 240.0) -> int:
        """Exit code as the shell would see it: n for exit(n), -signal for a signal death."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise TimeoutError(f"child {self.pid} still running after {timeout}s; log: {self.stderr()[-2000:]}")
            time.sleep(0.02)
        return self._exit_code

    def stdout(self) -> str:
        return (self.log.with_suffix(".out")).read_text(errors="replace")

    def stderr(self) -> str:
        return (self.log.with_suffix(".err")).read_text(errors="replace")


def fork_cli(argv: list[str], log: Path, env: dict[str, str] | None = None, prepare=None) -> Child:
    """Start `training_wizard.cli.main(argv)` in a forked child; `prepare()` runs in the child first."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Child(pid, log)
    code = 70
    try:  # the child: never return into pytest
        out = os.open(log.with_suffix(".out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(log.with_suffix(".err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler)
        os.environ.pop("TRAINING_WIZARD_FAULT_INJECT", None)
        os.environ.update(env or {})
        from training_wizard import signals

        signals._fired.clear()
        if prepare is not None:
            prepare()
        from training_wizard.cli import main

        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 71
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_cli(argv: list[str], log: Path, env: dict[str, str] | None = None, prepare=None, timeout=240) -> Child:
    child = fork_cli(argv, log, env, prepare)
    child.code = child.wait(timeout)
    return child


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model" / "model.safetensors"))


def checkpoint_payload(folder: Path) -> dict:
    """Weights (the policy's, and PPO's value model's), optimizer, scheduler and run state of a checkpoint."""
    models = {name: load_file(str(folder / name / "model.safetensors"))
              for name in ("model", "value_model") if (folder / name).is_dir()}
    return {
        **models,
        "optimizer": torch.load(folder / "optimizer.pt", weights_only=True),
        "scheduler": torch.load(folder / "scheduler.pt", weights_only=True),
        "state": torch.load(folder / "trainer_state.pt", weights_only=True)["trainer"],
    }


def assert_bitwise_equal(a, b, path: str = "") -> None:
    """Exact equality of nested dicts/lists of tensors and scalars: tensors compared bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        as_bytes = lambda t: t.reshape(-1).contiguous().view(torch.uint8) if t.dtype != torch.bool else t  # noqa: E731
        assert torch.equal(as_bytes(a), as_bytes(b)), f"{path} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(set(a) ^ set(b))}"
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bitwise_equal(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


DETERMINISTIC_METRICS = ("episode", "lr", "objective/scores", "objective/kl", "objective/rlhf_reward",
                         "loss/policy_avg", "policy/approxkl_avg", "val/ratio", "val/num_eos_tokens")


def assert_same_run(run: Path, reference: Path) -> None:
    """Final weights, last checkpoint (weights, Adam state, scheduler, run state), metrics and samples of `run`
    equal those of the uninterrupted `reference`, bit for bit (timings excepted)."""
    assert_bitwise_equal(final_weights(run), final_weights(reference), "final model")
    last = f"step-{ITERATIONS}"
    assert_bitwise_equal(checkpoint_payload(run / "checkpoints" / last),
                         checkpoint_payload(reference / "checkpoints" / last), last)
    ours, theirs = read_jsonl(run / "metrics.jsonl"), read_jsonl(reference / "metrics.jsonl")
    assert [m["episode"] for m in ours] == [8 * i for i in range(1, ITERATIONS + 1)]  # each iteration once
    for a, b in zip(ours, theirs):
        assert {k: a[k] for k in DETERMINISTIC_METRICS} == {k: b[k] for k in DETERMINISTIC_METRICS}
    assert read_jsonl(run / "samples.jsonl") == read_jsonl(reference / "samples.jsonl")


HANG_GUARD_S = 600.0  # far above any of these runs' time on a busy machine: only a hang reaches it


def wait_for(condition, exited, describe: str, output) -> None:
    """Poll `condition()` until it holds. Fails with the child's output when `exited()` says the child ended
    first, and, as a guard against a hang (not a timing check), after HANG_GUARD_S seconds."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if exited():
            pytest.fail(f"the child exited before {describe}:\n{output()[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {describe} after {HANG_GUARD_S:.0f} s (a hang):\n{output()[-2000:]}")
        time.sleep(0.05)

