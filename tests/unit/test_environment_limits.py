"""The episode's limits belong to `[environment]`; TRL's names in `[training]` (the eval recipe's top-level keys)
stay accepted as their aliases, and a limit set in both places with different values is one line."""

import json

import pytest

from tests.helpers import write_episode_recipe
from tests.unit.test_environment_contracts import write_eval_recipe
from tests.unit.test_episodes import STOPS
from training_wizard.errors import UserError
from training_wizard.recipes.base import load_recipe
from training_wizard.specs.episode import EpisodeSettings

GAME = 'factory = "tests.unit.test_environment_contracts:Game"\nprotocol = "text"\n'  # never ends an episode


def recipe(tmp_path, tiny_model_dir, environment: str = "", training: str = ""):
    tables = f"[environment]\n{GAME}{environment}"
    return write_episode_recipe(tmp_path, tiny_model_dir, ["Hi.", "Hello."], tables,
                                f"response_length = 24\nstop_token_ids = {STOPS}\n{training}")


def test_environment_limits_reach_the_episodes(tiny_model_dir, tmp_path):
    from training_wizard.cli import main

    path = recipe(tmp_path, tiny_model_dir, "max_turns = 1\nenvironment_timeout = 5.0\n")
    loaded = load_recipe(path)
    settings = EpisodeSettings().with_limits(loaded.training)
    assert (settings.max_turns, settings.environment_timeout) == (1, 5.0)
    assert main([str(path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert records and all(record["turns/episode_share_1"] == 1.0 for record in records)  # Game never ends itself


def test_trl_names_in_training_stay_aliases(tiny_model_dir, tmp_path):
    assert load_recipe(recipe(tmp_path, tiny_model_dir, training="max_turns = 3")).training.max_turns == 3
    both = load_recipe(recipe(tmp_path, tiny_model_dir, "max_turns = 3\n", "max_turns = 3"))
    assert both.training.max_turns == 3


def test_a_limit_set_twice_differently_is_one_line(tiny_model_dir, tmp_path):
    with pytest.raises(UserError, match=r"environment\.max_turns = 2 and training\.max_turns = 3 set one limit "
                                        r"twice; keep environment\.max_turns"):
        load_recipe(recipe(tmp_path, tiny_model_dir, "max_turns = 2\n", "max_turns = 3"))


def test_the_eval_recipe_reads_them_from_environment_too(tiny_model_dir, tmp_path):
    path = write_eval_recipe(tmp_path, tiny_model_dir, [{"prompt": "Hi."}], f"[environment]\n{GAME}max_turns = 2\n")
    assert load_recipe(path).max_turns == 2
    conflict = path.read_text().replace('recipe_class = "evaluate"\n', 'recipe_class = "evaluate"\nmax_turns = 3\n')
    path.write_text(conflict)
    with pytest.raises(UserError, match=r"environment\.max_turns = 2 and max_turns = 3 set one limit twice"):
        load_recipe(path)
