"""An environment, a tool or a tool parser that breaks its contract stops the run in one line naming the class or
function, the rule and what it returned or raised (exit code 2, no traceback), checked where it is called; what
can be checked before a run writes anything (the constructor, reset on the first row, the tools, a reward) is
checked then, by --dry-run and the real run alike (OnPolicyRecipe.check_can_start), so output_dir stays free for
the corrected recipe."""

from __future__ import annotations

import json
import math

import numpy
import pytest

from tests.helpers import write_episode_recipe
from tests.unit.test_episodes import STOPS
from training_wizard.errors import UserError
from training_wizard.rollout.environments import checked_step


class Game:
    """A text environment that keeps its contract: the base of the broken ones below."""

    def reset(self, prompt=None, **row):
        return "Guess a number."

    def step(self, reply):
        return "Try again.", 1.0, False


class NeedsSize(Game):
    def __init__(self, size):
        self.size = size


class BrokenInit(Game):
    def __init__(self):
        raise RuntimeError("no board")


class ResetDict(Game):
    def reset(self, prompt=None, **row):
        return {"board": 1}


class ResetRaises(Game):
    def reset(self, prompt=None, **row):
        return row["answer"]  # the dataset has no answer column


def stepping(value):
    """A Game whose step returns `value`."""
    return type("Stepping", (Game,), {"step": lambda self, reply: value})


StepTwo = stepping(("Try again.", 1.0))
StepGym = stepping(("Try again.", 1.0, False, {}))
StepGymnasium = stepping(("Try again.", 1.0, False, False, {}))
StepNone = stepping(None)
StepRewardText = stepping(("Try again.", "1.0", False))
StepNanReward = stepping(("Try again.", math.nan, False))
StepDoneText = stepping(("Try again.", 1.0, "no"))
StepDictObservation = stepping(({"board": 1}, 1.0, False))


class NanScore:
    """A tools environment (no tools of its own) whose get_reward is not a number."""

    def reset(self, prompt=None, **row):
        return None

    def get_reward(self):
        return math.nan


class ScoreRaises(NanScore):
    def get_reward(self):
        return 1 / 0


def undocumented(a, b):
    return a * b


def parser_with_a_bug(text):
    return len(text) + "calls"  # TypeError


def text_tables(factory: str, extra: str = "") -> str:
    return f'[environment]\nfactory = "tests.unit.test_environment_contracts:{factory}"\nprotocol = "text"\n{extra}'


TOOL_TABLES = """\
[environment]
{environment}
chat_template = "hermes"
{reward}"""
REWARD = '[reward]\nreward_funcs = ["tests.unit.test_episodes:reply_length"]\n'
HERE = "tests.unit.test_environment_contracts"
TOOLS = "tests.unit.test_tool_episodes"  # Multiplier (a multiply tool, no get_reward) and multiply


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def run(tmp_path, tiny_model_dir, capsys, tables: str, *extra: str) -> str:
    """The recipe run through the CLI: exit code 2 and its one line."""
    from training_wizard.cli import main

    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Hi.", "Hello."], tables,
                                  f"response_length = 16\nmax_turns = 2\nstop_token_ids = {STOPS}")
    capsys.readouterr()
    assert main([str(recipe), *extra]) == 2
    return one_line_error(capsys)


# what breaks at the start (the constructor, reset on the first row): refused before output_dir holds anything
START_CASES = {
    "a constructor that needs an argument": (
        text_tables("NeedsSize"), f"{HERE}:NeedsSize cannot be called without arguments (missing a required "
                                  "argument: 'size')"),
    "a constructor that raises": (text_tables("BrokenInit"), f"{HERE}:BrokenInit() raised RuntimeError: no board"),
    "factory_kwargs the constructor does not take": (
        text_tables("Game", 'factory_kwargs = { colour = "red" }'),
        f"{HERE}:Game cannot be called with factory_kwargs {{'colour': 'red'}} (got an unexpected keyword argument "
        "'colour')"),
    "reset returning a dict": (
        text_tables("ResetDict"), f"dataset row 0: {HERE}:ResetDict.reset must return the text to append to the "
                                  "prompt (a str) or None; it returned the dict {'board': 1}"),
    "reset raising": (text_tables("ResetRaises"), f"dataset row 0: {HERE}:ResetRaises.reset raised KeyError: "
                                                  "'answer'"),
}


@pytest.mark.parametrize("case", START_CASES)
def test_an_environment_broken_at_start_is_one_line_and_writes_nothing(case, tiny_model_dir, tmp_path, capsys):
    tables, expected = START_CASES[case]
    for extra in ((), ("--dry-run",)):
        assert expected in run(tmp_path, tiny_model_dir, capsys, tables, *extra)
        assert not (tmp_path / "out").exists()  # no run.json: the corrected recipe is not refused


def test_the_corrected_recipe_runs_in_the_same_output_dir(tiny_model_dir, tmp_path, capsys):
    from training_wizard.cli import main

    run(tmp_path, tiny_model_dir, capsys, text_tables("BrokenInit"))
    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Hi.", "Hello."], text_tables("Game"),
                                  f"response_length = 16\nmax_turns = 2\nstop_token_ids = {STOPS}")
    assert main([str(recipe)]) == 0
    assert (tmp_path / "out" / "run.json").exists()


@pytest.mark.parametrize("broken", ["StepTwo", "StepNone"])
def test_a_run_stopped_by_its_first_episodes_leaves_no_run_files_and_a_user_file_kept(tiny_model_dir, tmp_path,
                                                                                       capsys, broken):
    """A step that breaks its contract stops the run after run.json and resolved_config.toml were written: they
    are removed again (nothing was trained), so the corrected recipe starts in the same folder as it is."""
    from training_wizard.cli import main

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine", encoding="utf-8")
    run(tmp_path, tiny_model_dir, capsys, text_tables(broken))
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["notes.txt"]
    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Hi.", "Hello."], text_tables("Game"),
                                  f"response_length = 16\nmax_turns = 2\nstop_token_ids = {STOPS}")
    assert main([str(recipe)]) == 0
    assert (tmp_path / "out" / "notes.txt").read_text(encoding="utf-8") == "mine"


# what breaks at a step or a reply: the first rollout stops the run
STEP = f"{HERE}:Stepping.step"
RUN_CASES = {
    "a step of 2 values": (text_tables("StepTwo"), f"{STEP} must return (observation, reward, done); it returned "
                                                   "a tuple of 2 values"),
    "a step of gym's 4 values": (
        text_tables("StepGym"), "it returned a tuple of 4 values (gym's (observation, reward, done, info)? return "
                                "(observation, reward, done))"),
    "a step of gymnasium's 5 values": (
        text_tables("StepGymnasium"), "it returned a tuple of 5 values (gymnasium's (observation, reward, "
                                      "terminated, truncated, info)? return (observation, reward, terminated or "
                                      "truncated))"),
    "a step returning None": (text_tables("StepNone"), "must return (observation, reward, done); it returned None"),
    "a reward that is not a number": (
        text_tables("StepRewardText"), f"{STEP} must return its reward as a finite number or None; it returned "
                                       "the str '1.0'"),
    "a NaN reward": (text_tables("StepNanReward"), f"{STEP} must return its reward as a finite number or None; it "
                                                   "returned the float nan"),
    "done as text": (text_tables("StepDoneText"), f"{STEP} must return done as True or False; it returned the str "
                                                  "'no'"),
    "a dict observation": (
        text_tables("StepDictObservation"), f"{STEP} must return the observation as text (a str) or None; it "
                                            "returned the dict {'board': 1} (json.dumps it"),
    "a tool parser raising TypeError": (
        TOOL_TABLES.format(environment=f'tools = ["{TOOLS}:multiply"]\ntool_parser = "{HERE}:parser_with_a_bug"',
                           reward=REWARD),
        f"environment.tool_parser: {HERE}:parser_with_a_bug raised TypeError: unsupported operand"),
    "get_reward returning NaN": (
        TOOL_TABLES.format(environment=f'factory = "{HERE}:NanScore"', reward=""),
        f"{HERE}:NanScore.get_reward must return a finite number or None; it returned the float nan"),
    "get_reward raising": (TOOL_TABLES.format(environment=f'factory = "{HERE}:ScoreRaises"', reward=""),
                           f"{HERE}:ScoreRaises.get_reward raised ZeroDivisionError: division by zero"),
}


@pytest.mark.parametrize("case", RUN_CASES)
def test_an_environment_broken_in_an_episode_is_one_line(case, tiny_model_dir, tmp_path, capsys):
    tables, expected = RUN_CASES[case]
    line = run(tmp_path, tiny_model_dir, capsys, tables)
    assert expected in line and ("tool_parser" in line or "environment: dataset row " in line)


# what --dry-run now refuses as the real run's start does
DRY_RUN_CASES = {
    "a tool without a docstring or types": (
        TOOL_TABLES.format(environment=f'tools = ["{HERE}:undocumented"]', reward=REWARD),
        "tool undocumented: cannot describe it to the model"),
    "no reward and no get_reward": (
        TOOL_TABLES.format(environment=f'factory = "{TOOLS}:Multiplier"', reward=""),
        "reward: none is given and the environment has no get_reward method"),
    "two tools of one name": (
        TOOL_TABLES.format(environment=f'factory = "{TOOLS}:Multiplier"\ntools = ["{TOOLS}:multiply"]',
                           reward=REWARD),
        f"environment: two tools are named 'multiply' ({TOOLS}:Multiplier.multiply and {TOOLS}:multiply)"),
    "tools with the text protocol": (
        text_tables("Game", f'tools = ["{TOOLS}:multiply"]'), "tools: the text protocol shows the model no tools"),
    "a retry environment of max_attempts 0": (
        '[environment]\nfactory = "training_wizard.envs.reasoning_gym:RetryWithFeedback"\nprotocol = "text"\n'
        'factory_kwargs = { max_attempts = 0 }\n', "expected max_attempts >= 1"),
    "an OpenEnv table with environment and url": (
        '[environment]\nfactory = "training_wizard.envs.openenv:OpenEnvEnvironment"\nprotocol = "text"\n'
        f'factory_kwargs = {{ environment = "{HERE}:Game", url = "http://localhost:1" }}\n',
        "give exactly one of environment"),
}


@pytest.mark.parametrize("case", DRY_RUN_CASES)
def test_dry_run_refuses_what_the_run_would_refuse_at_start(case, tiny_model_dir, tmp_path, capsys):
    tables, expected = DRY_RUN_CASES[case]
    assert expected in run(tmp_path, tiny_model_dir, capsys, tables, "--dry-run")
    assert not (tmp_path / "out").exists()


def test_steps_keeping_the_contract_are_read_as_given():
    game = Game()
    assert checked_step(game, ("Again.", numpy.float32(0.5), numpy.bool_(True)), 0) == ("Again.", 0.5, True)
    assert checked_step(game, [None, None, False], 0) == (None, 0.0, False)
    with pytest.raises(UserError, match="done as True or False; it returned the int 1"):
        checked_step(game, ("Again.", 1.0, 1), 0)


def test_a_recipe_with_tools_and_no_factory_plays_episodes(tiny_model_dir, tmp_path):
    """`tools` alone gives the model stateless tools (the recipe's tools travel in the episode settings)."""
    from training_wizard.cli import main
    from training_wizard.tracking.metrics import read_metrics

    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Hi.", "Hello."],
                                  TOOL_TABLES.format(environment=f'tools = ["{TOOLS}:multiply"]', reward=REWARD),
                                  f"response_length = 16\nstop_token_ids = {STOPS}")
    assert main([str(recipe)]) == 0
    assert "tools/call_frequency" in read_metrics(tmp_path / "out")[0]


def write_eval_recipe(folder, model_dir, rows: list[dict], environment: str):
    """An eval recipe (one metric, no judge) over `rows`, with the [environment] table `environment`."""
    data = folder / "held_out.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    recipe = folder / "eval.toml"
    recipe.write_text(f"""\
recipe_class = "evaluate"
output_dir = "{folder / 'eval'}"

[prompts]
data_files = "{data}"

[candidate]
pretrained_name = "{model_dir}"

[metrics.ends]
spec_class = "training_wizard.specs.text_metrics.EosRewardSpec"

{environment}""", encoding="utf-8")
    return recipe


def test_eval_builds_and_resets_the_environment_before_it_generates(tiny_model_dir, tmp_path, capsys):
    """`training-wizard eval` plays episodes as training does: a reset that breaks its contract is its one line at
    --dry-run too, before any model loads."""
    from training_wizard.cli import main

    recipe = write_eval_recipe(tmp_path, tiny_model_dir, [{"prompt": [{"role": "user", "content": "Hi."}]}],
                               f'[environment]\nfactory = "{HERE}:ResetDict"\nprotocol = "text"\n')
    assert main([str(recipe), "--dry-run"]) == 2
    assert f"{HERE}:ResetDict.reset must return the text to append to the prompt" in one_line_error(capsys)
