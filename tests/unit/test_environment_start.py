"""The check a run makes before it loads a model (rollout/environment_check.py, OnPolicyRecipe.check_can_start):
factories given as a functools.partial, the environment it builds closed again, every process stopping on an error
any process found, and `training-wizard eval` taking the prompt-less rows training takes."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

from tests.helpers import write_episode_recipe
from tests.unit.test_environment_contracts import write_eval_recipe
from training_wizard.errors import UserError
from training_wizard.rollout.environments import new_environment
from training_wizard.rollout.environment_check import check_episodes_can_start
from training_wizard.specs.episode import EpisodeSettings

HERE = "tests.unit.test_environment_start"
CLOSED: list[str] = []


class Sized:
    def __init__(self, size):
        self.size = size


class Pair:
    def __init__(self, size, colour):
        self.size = size


class Closing:
    """A text environment that records its close (OpenEnv's client frees its server session there)."""

    def reset(self, prompt=None, **row):
        return "Guess."

    def step(self, reply):
        return None, 1.0, True

    def close(self):
        CLOSED.append(type(self).__name__)


class ClosingResetRaises(Closing):
    def reset(self, prompt=None, **row):
        raise KeyError("answer")


class CloseRaises(Closing):
    def close(self):
        raise RuntimeError("already closed")


ROWS = [{"prompt": [{"role": "user", "content": "Hi."}]}]


def test_a_partial_with_positional_arguments_builds_its_environment():
    assert new_environment(functools.partial(Sized, 3)).size == 3
    assert new_environment(functools.partial(Pair, 3, colour="red")).size == 3


def test_a_partial_missing_an_argument_is_named_after_its_function():
    with pytest.raises(UserError) as raised:
        new_environment(functools.partial(Pair, 3))
    assert str(raised.value).startswith(f"environment: {Pair.__module__}:Pair cannot be called as its functools.partial binds "
                                        "it (3) (missing a required argument: 'colour')")


@pytest.mark.parametrize("factory", [Closing, CloseRaises])
def test_the_start_check_closes_the_environment_it_built(factory):
    CLOSED.clear()
    check_episodes_can_start(factory, EpisodeSettings(protocol="text"), True, ROWS)
    assert CLOSED == (["Closing"] if factory is Closing else [])  # a close that raises is no error of the run's


def test_the_start_check_closes_the_environment_whose_reset_failed():
    CLOSED.clear()
    with pytest.raises(UserError, match=f"{Closing.__module__}:ClosingResetRaises.reset raised KeyError"):
        check_episodes_can_start(ClosingResetRaises, EpisodeSettings(protocol="text"), True, ROWS)
    assert CLOSED == ["ClosingResetRaises"]


def recipe_and_accelerator(tmp_path, tiny_model_dir, factory: str, processes: int):
    from training_wizard.recipes.base import load_recipe

    tables = f'[environment]\nfactory = "{HERE}:{factory}"\nprotocol = "text"\n'
    recipe = load_recipe(str(write_episode_recipe(tmp_path, tiny_model_dir, ["Hi."], tables)), [])
    accelerator = SimpleNamespace(num_processes=processes, process_index=0, is_main_process=True, device="cpu")
    return recipe, accelerator


def test_every_process_stops_with_the_start_error_another_process_found(tiny_model_dir, tmp_path, monkeypatch):
    """This process's environment resets; the other's did not: both stop with that one line rather than this one
    going on to load models and wait for a process that has left."""
    import accelerate.utils

    other = "environment: dataset row 0: Closing.reset raised KeyError: 'answer'"
    gathered = []
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda errors: gathered.extend(errors) or [None, other])
    recipe, accelerator = recipe_and_accelerator(tmp_path, tiny_model_dir, "Closing", 2)
    with pytest.raises(UserError) as raised:
        recipe.check_episodes_can_start_everywhere(accelerator, ROWS)
    assert str(raised.value) == other and gathered == [None]


def test_a_start_error_on_this_process_is_shared_with_the_others(tiny_model_dir, tmp_path, monkeypatch):
    import accelerate.utils

    gathered = []
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda errors: gathered.extend(errors) or [*errors, None])
    recipe, accelerator = recipe_and_accelerator(tmp_path, tiny_model_dir, "ClosingResetRaises", 2)
    with pytest.raises(UserError, match="ClosingResetRaises.reset raised KeyError"):
        recipe.check_episodes_can_start_everywhere(accelerator, ROWS)
    assert len(gathered) == 1 and "ClosingResetRaises.reset raised KeyError" in gathered[0]


def test_eval_takes_rows_with_only_an_environment_column(tiny_model_dir, tmp_path, capsys):
    """As training does (TRL's mode): each row names its factory, whose reset supplies the prompt."""
    from training_wizard.cli import main

    recipe = write_eval_recipe(tmp_path, tiny_model_dir, [{"environment": "a"}, {"environment": "b"}],
                               f'[environment]\nfactory = {{ a = "{HERE}:Closing", b = "{HERE}:Closing" }}\n'
                               'protocol = "text"\n')
    assert main([str(recipe), "--dry-run"]) == 0, capsys.readouterr().err
    assert "2 prompts" in capsys.readouterr().out
