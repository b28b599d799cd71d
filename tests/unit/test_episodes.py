"""Episodes of several turns with a text environment (rollout/episodes.py, protocol "text"): token-in/token-out
splicing, the loss mask, stop reasons, environment rewards, a hung environment, and training with RLOO, PPO and GRPO.

The tiny tokenizer's decode then encode changes the ids of nearly every random sample, so a re-tokenised reply
would fail the splicing checks. Half the vocabulary stops a reply, so replies are a few tokens long and an
episode reaches its third turn."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.helpers import write_episode_recipe
from training_wizard import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer
from training_wizard.rollout.chat_turns import TurnRenderer
from training_wizard.rollout.episodes import turn_seed
from training_wizard.rollout.generation import GenerationParams, sample
from training_wizard.rollout.trajectory import StopReason
from training_wizard.specs.episode import EpisodeSettings
from training_wizard.testing import build_causal_lm
from training_wizard.tracking.metrics import read_metrics

STOPS = list(range(40, 300, 2))  # every even id from 40: a reply ends after a few tokens


class Echo:
    """Answers each reply with its length; reward 1 per reply; never done (the turn limit ends it)."""

    def reset(self, prompt=None, **columns):
        return "Count the letters."

    def step(self, reply):
        return f"You wrote {len(reply)} letters.", 1.0, False


SLEEPY_RELEASE = threading.Event()  # set when the test that uses Sleepy ends


class Sleepy(Echo):
    """Answers only once its test has ended: every step is late, however slowly the machine runs."""

    def step(self, reply):
        SLEEPY_RELEASE.wait(600)
        return "late", 5.0, False


def reply_length(prompts, completions, **columns):
    """The last reply's length: it differs within a group, so every algorithm has advantages to train on."""
    return [len(text) / 10 for text in completions]


def chat_prompts(n=8):
    return [{"prompt": [{"role": "user", "content": f"Say something {i}."}]} for i in range(n)]


def make(trainer_class, config_class, tokenizer, tmp_path, environment=Echo, **options):
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=8, response_length=128,
                    num_sample_generations=0, stop_token_ids=STOPS, max_turns=3, seed=5, learning_rate=1e-3)
    config = config_class(**{**settings, **options})
    return trainer_class(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer, seed=1),
                         reward_model=reply_length, train_dataset=chat_prompts(), environment_factory=environment,
                         episode_settings=EpisodeSettings(protocol="text"))


def segments(mask_row: torch.Tensor) -> list[tuple[bool, int, int]]:
    """(is_model, start, end) runs of a row's loss mask over its real tokens."""
    runs, start = [], 0
    values = mask_row.tolist()
    for position in range(1, len(values) + 1):
        if position == len(values) or values[position] != values[start]:
            runs.append((values[start], start, position))
            start = position
    return runs


def test_spliced_ids_are_the_sampled_replies_and_the_rendered_answers(tokenizer, tmp_path):
    """Each reply is what the decode loop samples from the spliced context with that turn's key, and each answer
    is exactly the template's ids for the environment's text: nothing was decoded and encoded again."""
    trainer = make(RLOOTrainer, RLOOConfig, tokenizer, tmp_path, rloo_k=2)
    seeds = trainer.iteration_prompts.next_batch().seeds
    trainer.state.prompt_order.position = 0  # the same prompts again for the rollout
    batch = trainer.collect_rollout()
    renderer, policy = TurnRenderer(tokenizer), trainer.unwrapped_policy.eval()
    three_replies = 0
    for row in range(batch.num_rows):
        real = batch.completion_mask[row]
        ids = batch.completion_ids[row][real].tolist()
        context = batch.prompt_ids[row][batch.prompt_mask[row]].tolist()
        reply: list[int] = []
        turn = 0
        for is_model, start, end in segments(batch.loss_mask[row][real]):
            piece = ids[start:end]
            if is_model:
                params = GenerationParams(128, trainer.config.temperature, tuple(STOPS), tokenizer.pad_token_id)
                with torch.no_grad():
                    drawn = sample(policy, torch.tensor([context]), torch.ones(1, len(context), dtype=torch.bool),
                                   params, [turn_seed(seeds[row], turn)])
                assert drawn.tokens[0, : len(piece)].tolist() == piece, (row, turn)
                reply, turn = piece, turn + 1
            else:
                text = f"You wrote {len(tokenizer.decode(reply, skip_special_tokens=True))} letters."
                expected = renderer.observation_ids(text, reply[-1])
                assert piece == expected[: len(piece)], (row, turn)
            context += piece
        three_replies += turn == 3
    assert three_replies >= batch.num_rows // 2
    assert set(batch.stop_reason.tolist()) <= {int(StopReason.TURNS), int(StopReason.LENGTH)}


def test_environment_tokens_carry_no_loss_and_its_reward_is_a_component(tokenizer, tmp_path):
    trainer = make(GRPOTrainer, GRPOConfig, tokenizer, tmp_path, num_generations=2)
    batch = trainer.collect_rollout()
    assert (batch.loss_mask <= batch.completion_mask).all()
    assert (batch.completion_mask & ~batch.loss_mask).any(-1).float().mean() >= 0.5  # most rows read an answer
    # Echo pays 1 for every reply it answered: each one that ended with a stop token (a cut one is not stepped)
    replies = [sum(run[0] for run in segments(batch.loss_mask[r][batch.completion_mask[r]]))
               for r in range(batch.num_rows)]
    cut = [reason == int(StopReason.LENGTH) for reason in batch.stop_reason.tolist()]
    assert batch.components["Echo"] == [float(n - c) for n, c in zip(replies, cut)]
    own = torch.tensor(reply_length(None, batch.completions))
    torch.testing.assert_close(batch.scores, own + torch.tensor(batch.components["Echo"]))


def test_training_logprobs_of_the_models_tokens_equal_the_sampling_logprobs(tokenizer, tmp_path):
    forward = make(RLOOTrainer, RLOOConfig, tokenizer, tmp_path / "a", rloo_k=2,
                   logprobs_from_sampling=False).collect_rollout()
    sampled = make(RLOOTrainer, RLOOConfig, tokenizer, tmp_path / "b", rloo_k=2,
                   logprobs_from_sampling=True).collect_rollout()
    assert torch.equal(forward.completion_ids, sampled.completion_ids)
    mask = forward.loss_mask
    assert (forward.logprobs - sampled.logprobs)[mask].abs().max() < 1e-5
    assert (sampled.logprobs[~mask] == 0).all()


def test_a_hung_environment_step_is_an_error_message_and_the_episode_goes_on(tokenizer, tmp_path):
    trainer = make(RLOOTrainer, RLOOConfig, tokenizer, tmp_path, environment=Sleepy, rloo_k=2,
                   environment_timeout=0.3, response_length=256)
    SLEEPY_RELEASE.clear()
    try:
        batch = trainer.collect_rollout()
    finally:
        SLEEPY_RELEASE.set()  # the steps left behind return, so their threads end
    stopped = batch.stop_reason.tolist()
    assert int(StopReason.TURNS) in stopped
    assert all(reason in (int(StopReason.TURNS), int(StopReason.LENGTH)) for reason in stopped)
    assert batch.components["Sleepy"] == [0.0] * batch.num_rows  # the late answers never counted
    answered = [row for row in range(batch.num_rows) if (batch.completion_mask[row] & ~batch.loss_mask[row]).any()]
    assert answered and batch.episode_stats["errors"][answered].min() >= 1
    assert batch.episode_stats["failures"].sum() == 0  # no tool was called
    from training_wizard.trainers.loop.iteration_metrics import episode_metrics

    metrics = episode_metrics(trainer.collectives, "cpu", batch)
    assert metrics["episodes/environment_errors_mean"] >= 1 and metrics["tools/failure_frequency"] == 0
    for row in answered:
        answer = batch.completion_ids[row][batch.completion_mask[row] & ~batch.loss_mask[row]]
        assert "no answer within environment_timeout (0.3 s)" in tokenizer.decode(answer)


@pytest.mark.parametrize("trainer_class,config_class,options", [
    (RLOOTrainer, RLOOConfig, {"rloo_k": 2}), (PPOTrainer, PPOConfig, {}),
    (GRPOTrainer, GRPOConfig, {"num_generations": 2, "beta": 0.05})], ids=["rloo", "ppo", "grpo"])
def test_each_algorithm_trains_on_episodes(trainer_class, config_class, options, tokenizer, tmp_path):
    trainer = make(trainer_class, config_class, tokenizer, tmp_path, **options)
    before = {k: v.clone() for k, v in trainer.unwrapped_policy.state_dict().items()}
    trainer.train()
    records = read_metrics(tmp_path)
    assert len(records) == 2 and all(torch.isfinite(torch.tensor(v)) for r in records for k, v in r.items()
                                     if isinstance(v, float))
    assert records[0]["rewards/Echo"] >= 1.0  # every episode had at least one answered reply
    first = records[0]
    assert 1.0 <= first["episodes/replies_mean"] <= 3.0 and first["episodes/environment_tokens_mean"] > 0
    shares = [first[f"episodes/stopped_by_{name}"] for name in ("length", "turns", "environment")]
    assert sum(shares) == pytest.approx(1.0) and shares[2] == 0.0  # Echo never ends an episode itself
    assert first["tools/call_frequency"] == 0.0 and first["episodes/tokenization_drift"] == 0.0
    after = trainer.unwrapped_policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


TEXT_TABLES = """\
[environment]
factory = "tests.unit.test_episodes:Echo"
protocol = "text"

[reward]
reward_funcs = ["tests.unit.test_episodes:reply_length"]
"""


def test_a_recipe_with_an_environment_table_runs_episodes(tiny_model_dir, tmp_path):
    from training_wizard.cli import main

    recipe = write_episode_recipe(tmp_path, tiny_model_dir, [f"Say something {i}." for i in range(4)], TEXT_TABLES,
                                  f"response_length = 128\nmax_turns = 2\nstop_token_ids = {STOPS}")
    assert main([str(recipe)]) == 0
    records = read_metrics(tmp_path / "out")
    assert len(records) == 2 and records[0]["rewards/Echo"] >= 1.0


def test_an_environment_that_cannot_be_imported_is_one_line(tiny_model_dir, tmp_path, capsys):
    from training_wizard.cli import main

    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Hi."],
                                  TEXT_TABLES.replace("test_episodes:Echo", "test_episodes:Missing"))
    assert main([str(recipe)]) == 2
    error = capsys.readouterr().err.strip()
    assert "environment.factory" in error and "test_episodes:Missing" in error and len(error.splitlines()) == 1


EVAL_EPISODES = """\
output_dir = "{out}"
response_length = 64
max_turns = 2

[prompts]
data_files = "{data}"

[candidate]
pretrained_name = "{model}"

[environment]
factory = "tests.unit.test_episodes:Echo"
protocol = "text"

[metrics.answered]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "tests.unit.test_episodes:answers_read"
"""


def answers_read(prompts, completions, transcript, **columns):
    """How many of Echo's answers the episode holds."""
    return [float(text.count("You wrote 0 letters.")) for text in transcript]


def test_eval_plays_episodes_as_training_does(tmp_path, capsys):
    """A model that ends every reply at once (its head always picks the stop token): each episode is an empty reply,
    Echo's answer, another empty reply, and the turn limit; Echo pays 1 per reply it stepped."""
    import json

    from training_wizard.cli import main
    from training_wizard.testing import build_tokenizer, save_tiny_model

    folder = save_tiny_model(tmp_path / "model", arch="qwen2")
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():  # a large value bias in the last layer swamps the residual: one direction wins always
        last = model.model.layers[-1].self_attn
        last.v_proj.bias.fill_(100.0)
        direction = last.o_proj.weight @ torch.full((last.o_proj.in_features,), 100.0)  # every head's value
        model.lm_head.weight.zero_()
        model.lm_head.weight[build_tokenizer().eos_token_id] = direction * model.model.norm.weight / direction.norm()
    model.save_pretrained(folder)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in chat_prompts(3)))
    recipe = tmp_path / "eval.toml"
    recipe.write_text(EVAL_EPISODES.format(out=tmp_path / "eval", data=data, model=folder))
    assert main(["eval", str(recipe)]) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "eval" / "metrics.json").read_text())["candidate"]
    assert summary["answered"]["mean"] == 1.0 and summary["answered"]["n"] == 3
    assert summary["rewards/Echo"]["mean"] == 2.0 and summary["tools/episodes_with_call"]["mean"] == 0.0
