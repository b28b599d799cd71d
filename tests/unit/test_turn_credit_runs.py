"""Credit per turn (training.turn_credit) in tiny GRPO, RLOO and PPO runs on a text environment of three turns: with
one reward at the end and turn_gamma = 1 every mode trains on the episode mode's advantages; with step rewards
the turn modes differ from it by the hand-computed amount; the combinations no algorithm can honour are refused.
A scripted backend makes the replies a function of each turn's sampling key, so every run samples the same."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import with_logprobs
from training_wizard import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer
from training_wizard.errors import UserError
from training_wizard.specs.episode import EpisodeSettings
from training_wizard.testing import build_causal_lm, scripted_backend
from training_wizard.tracking.metrics import read_metrics

STOP = 40


class Quiet:
    """No step reward; never done: every episode lasts max_turns replies."""

    def reset(self, prompt=None, **columns):
        return "Talk."

    def step(self, reply):
        return "Go on.", 0.0, False


class Paying(Quiet):
    """A step reward that depends on the reply, so that rows differ in their rewards before the last turn."""

    def step(self, reply):
        return "Go on.", float(sum(map(ord, reply)) % 3), False


def final_reward(prompts, completions, **columns):
    """The last reply's reward, different within a group."""
    return [float(sum(map(ord, text)) % 7) / 7 for text in completions]


def replies(tokenizer):
    """Two content tokens chosen by the turn's sampling key, then the stop token."""

    def sample(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        tokens = torch.full((len(seeds), 3), tokenizer.pad_token_id, dtype=torch.long)
        for row, seed in enumerate(seeds):
            tokens[row] = torch.tensor([97 + 2 * (seed % 5), 97 + 2 * ((seed // 5) % 5), STOP])
        return with_logprobs(tokens)

    return scripted_backend(sample)


ALGORITHMS = {
    "rloo": (RLOOTrainer, RLOOConfig, {"rloo_k": 2}),
    "grpo": (GRPOTrainer, GRPOConfig, {"num_generations": 2, "beta": 0.05}),
    "ppo": (PPOTrainer, PPOConfig, {}),
}


def first_shaping(tokenizer, tmp_path, algorithm, environment=Quiet, **options):
    """(the first iteration's rollout, its shaped rewards) of a one-iteration run, and the run's metrics."""
    trainer_class, config_class, defaults = ALGORITHMS[algorithm]
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=4, response_length=96,
                    num_sample_generations=0, stop_token_ids=[STOP], max_turns=3, seed=5, learning_rate=1e-3)
    config = config_class(**{**settings, **defaults, **options})
    prompts = [{"prompt": [{"role": "user", "content": f"Say something {i}."}]} for i in range(4)]
    trainer = trainer_class(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer, seed=1),
                            reward_model=final_reward, train_dataset=prompts, environment_factory=environment,
                            episode_settings=EpisodeSettings(protocol="text"), generation_backend=replies(tokenizer))
    seen = []
    shape = trainer.shape_rewards

    def recorded(rollout):
        shaped = shape(rollout)
        seen.append((rollout, shaped))
        return shaped

    trainer.shape_rewards = recorded
    trainer.train()
    return seen[0][0], seen[0][1], read_metrics(tmp_path)


def per_token(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages) * mask


@pytest.mark.parametrize("algorithm,modes", [("rloo", ["discounted_return", "turn_baseline"]),
                                             ("grpo", ["discounted_return", "turn_baseline"]), ("ppo", ["gae"])])
def test_with_one_reward_at_the_end_every_mode_is_the_episode_mode(tokenizer, tmp_path, algorithm, modes):
    rollout, episode, _ = first_shaping(tokenizer, tmp_path / "episode", algorithm)
    assert bool((rollout.turn_counts == 3).all())  # equal lengths: turn_baseline's baselines are whole returns
    assert torch.allclose(rollout.turn_rewards.sum(-1), rollout.scores, atol=1e-6)
    assert bool((rollout.turn_rewards[:, :2] == 0).all())
    mask = rollout.loss_mask
    for mode in modes:
        other, shaped, records = first_shaping(tokenizer, tmp_path / mode, algorithm, turn_credit=mode)
        assert torch.equal(other.completion_ids, rollout.completion_ids)
        assert torch.allclose(per_token(shaped.advantages, mask), per_token(episode.advantages, mask), atol=1e-6)
        assert records[0]["turns/episode_share_3"] == 1.0 and "turns/advantage_mean_3" in records[0]


def prefix_sums(turn_rewards: torch.Tensor) -> torch.Tensor:
    """(B, K): the rewards of the turns before each turn."""
    return turn_rewards.cumsum(-1) - turn_rewards


@pytest.mark.parametrize("algorithm", ["rloo", "grpo"])
def test_step_rewards_move_the_turn_advantages_by_the_rewards_before_them(tokenizer, tmp_path, algorithm):
    rollout, episode, _ = first_shaping(tokenizer, tmp_path / "episode", algorithm, environment=Paying)
    before = prefix_sums(rollout.turn_rewards)
    assert bool((rollout.turn_rewards[:, :2] != 0).any())  # the steps paid something
    row = 0
    partner = [i for i in range(rollout.num_rows) if i != row and rollout.group_ids[i] == rollout.group_ids[row]][0]
    scale = 1.0
    if algorithm == "grpo":  # the group's score std (two rows: |difference| / sqrt(2)), + STD_EPSILON
        scale = float((rollout.scores[row] - rollout.scores[partner]).abs() / 2**0.5) + 1e-4
    expected_shift = {
        # G_{i,k} - G_{i,0}: the rewards before turn k
        "discounted_return": -before[row],
        # and the baseline moves by the others' (RLOO) or the group's (GRPO, row included) rewards before k
        "turn_baseline": -(before[row] - (before[partner] if algorithm == "rloo"
                                          else (before[row] + before[partner]) / 2)),
    }
    base = episode.advantages[row]
    for mode, shift in expected_shift.items():
        _, shaped, records = first_shaping(tokenizer, tmp_path / mode, algorithm, environment=Paying,
                                           turn_credit=mode)
        for turn in range(3):
            tokens = rollout.turn_index[row] == turn
            expected = base + shift[turn] / scale
            assert torch.allclose(shaped.advantages[row][tokens], expected.expand(int(tokens.sum())), atol=1e-5)
        assert "turns/advantage_mean_1" in records[0]


@pytest.mark.parametrize("config_class,options,message", [
    (RLOOConfig, {"turn_credit": "gae"}, '"gae" needs a critic'),
    (GRPOConfig, {"turn_credit": "gae"}, '"gae" needs a critic'),
    (PPOConfig, {"turn_credit": "discounted_return"}, 'use "gae"'),
    (PPOConfig, {"turn_credit": "turn_baseline"}, 'use "gae"'),
    (RLOOConfig, {"turn_credit": "turn_baseline", "token_level_kl": True}, "cannot honour token_level_kl"),
    (RLOOConfig, {"turn_credit": "discounted_return", "normalize_reward": True}, "cannot honour normalize_reward"),
    (GRPOConfig, {"turn_gamma": 0.9}, "turn_gamma discounts"),
    (PPOConfig, {"turn_credit": "gae", "turn_gamma": 0.9}, "turn_gamma discounts"),
])
def test_what_an_algorithm_cannot_honour_is_refused_in_one_line(tmp_path, config_class, options, message):
    with pytest.raises(UserError) as error:
        config_class(output_dir=str(tmp_path), **options)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_single_replies_are_one_turn_worth_the_score(tokenizer, tmp_path):
    from tests.helpers import make_rloo_trainer

    trainer = make_rloo_trainer(tokenizer, tmp_path)
    rollout = trainer.rollout_source.take(0, trainer.iteration_prompts.next_request).batch
    assert bool((rollout.turn_counts == 1).all()) and torch.equal(rollout.turn_rewards[:, 0], rollout.scores)
    assert torch.equal(rollout.turn_index >= 0, rollout.loss_mask)


# -- slow: resume exactness and 1 vs 2 processes, each mode with an algorithm that computes it (.ci/run) ----------
SLOW_MODES = [pytest.param("rloo", "discounted_return", id="rloo_discounted_return", marks=pytest.mark.slow),
              pytest.param("grpo", "turn_baseline", id="grpo_turn_baseline", marks=pytest.mark.slow),
              pytest.param("ppo", "gae", id="ppo_gae", marks=pytest.mark.slow)]


def as_algorithm(text: str, algorithm: str) -> str:
    """A GRPO episode recipe's text (the reliability and distributed tests' "grpo-episodes") as `algorithm`'s."""
    if algorithm == "grpo":
        return text
    text = text.replace('recipe_class = "grpo"', f'recipe_class = "{algorithm}"')
    group = "rloo_k = 2\n" if algorithm == "rloo" else ""
    for grpo_only in ("num_generations = 2\n", "epsilon_high = 0.28\n", "mask_truncated_completions = true\n",
                      'scale_rewards = "batch"\n'):
        text = text.replace(grpo_only, "")
    return text.replace("beta = 0.1\n", group + "kl_coef = 0.1\n")


@pytest.mark.parametrize("algorithm,mode", SLOW_MODES)
def test_kill_then_resume_is_exact(tmp_path, tiny_model_dir, algorithm, mode):
    import signal

    from tests.reliability.reliability_helpers import assert_same_run, make_recipe, read_jsonl, run_cli

    def recipe(name):
        path = make_recipe(tmp_path, tiny_model_dir, name, extra=f'turn_credit = "{mode}"\n', algorithm="grpo-episodes")
        path.write_text(as_algorithm(path.read_text(), algorithm))
        return path

    child = run_cli([recipe("reference")], tmp_path / "logs" / "reference")
    assert child.code == 0, child.stderr()[-3000:]
    argv = [recipe("killed"), "resume_from_checkpoint=latest"]
    for life, point in enumerate(["generation@1", "update@3", "save:latest@6"]):
        child = run_cli(argv, tmp_path / "logs" / f"life{life}", env={"TRAINING_WIZARD_FAULT_INJECT": point})
        assert child.code == -signal.SIGKILL, (point, child.code, child.stderr()[-2000:])
    child = run_cli(argv, tmp_path / "logs" / "last")
    assert child.code == 0, child.stderr()[-3000:]
    assert_same_run(tmp_path / "killed", tmp_path / "reference")
    records = read_jsonl(tmp_path / "reference" / "metrics.jsonl")
    assert max(len([k for k in r if k.startswith("turns/episode_share_")]) for r in records) >= 2


@pytest.mark.parametrize("algorithm,mode", SLOW_MODES)
def test_two_processes_match_one_process(tmp_path, tiny_model_dir, algorithm, mode):
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from tests.smoke.test_distributed import free_port, read_jsonl, write_recipe

    def run(name, processes):
        recipe = write_recipe(tmp_path, tiny_model_dir, name, processes, algorithm="grpo-episodes")
        recipe.write_text(as_algorithm(recipe.read_text(), algorithm) + f'turn_credit = "{mode}"\n')
        env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
        launcher = [] if processes == 1 else [
            "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines",
            "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
        child = subprocess.run([sys.executable, *launcher, "-m", "training_wizard", str(recipe)], capture_output=True,
                               text=True, timeout=300, env=env, cwd=tmp_path)
        assert child.returncode == 0, child.stderr[-3000:]
        return load_file(str(tmp_path / name / "model" / "model.safetensors")), read_jsonl(
            tmp_path / name / "metrics.jsonl")

    (a, m1), (b, m2) = run("single", 1), run("double", 2)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert len(m1) == len(m2) == 3
    for r1, r2 in zip(m1, m2):
        turn_keys = sorted(k for k in r1 if k.startswith("turns/"))
        assert turn_keys and turn_keys == sorted(k for k in r2 if k.startswith("turns/"))
        for key in ["objective/scores", "loss/policy_avg", "episodes/replies_mean", *turn_keys]:
            assert r1[key] == pytest.approx(r2[key], abs=1e-5), key
