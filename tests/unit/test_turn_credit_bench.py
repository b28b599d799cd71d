"""bench/turn_credit.py: its hidden-rule environment pays +1 per fixed turn and ends on a wrong reply, and a short
GRPO and PPO run of the bench records a reward per turn that respects those rules (timing is not checked)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    """bench/turn_credit.py is a script, not part of the package: loaded from its file."""
    spec = importlib.util.spec_from_file_location("turn_credit_bench", ROOT / "bench" / "turn_credit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fix_for(error: int) -> str:
    """A reply that fixes `error`: a first character whose code point is the error's index modulo 3."""
    return next(chr(code) for code in range(ord("a"), ord("z")) if code % 3 == error)


def test_the_hidden_rule_is_the_first_characters_code_point_modulo_three(bench):
    assert [bench.fixes(error, reply) for error, reply in [(0, "c"), (1, "a"), (2, "b"), (0, "  cat")]] == [True] * 4
    assert [bench.fixes(error, reply) for error, reply in [(0, "a"), (1, "b"), (2, "c"), (0, ""), (0, "   ")]] == [
        False] * 5


def test_each_fixed_turn_pays_one_and_names_the_next_error_until_three_turns(bench):
    environment = bench.HiddenRule()
    assert environment.reset(prompt=None, errors="2,0,1") == "Error: violet."
    assert environment.step(fix_for(2)) == ("Error: amber.", 1.0, False)
    assert environment.step(fix_for(0)) == ("Error: cobalt.", 1.0, False)
    assert environment.step(fix_for(1)) == (None, 1.0, True)


def test_a_wrong_reply_earns_nothing_and_ends_the_episode(bench):
    environment = bench.HiddenRule()
    environment.reset(errors="1,1,1")
    assert environment.step(fix_for(1)) == ("Error: cobalt.", 1.0, False)
    assert environment.step(fix_for(2)) == (None, 0.0, True)


def test_the_rows_hold_every_sequence_of_three_errors_once(bench):
    sequences = [row["errors"] for row in bench.rows()]
    assert len(sequences) == len(set(sequences)) == 27


def test_the_token_budget_fits_three_replies_and_two_namings(bench):
    from training_wizard.testing import build_tokenizer

    tokenizer = build_tokenizer()
    before = [{"role": "user", "content": "Fix each error I name."}, {"role": "assistant", "content": "x"}]
    longest = max(bench.ERRORS, key=len)
    start = tokenizer.apply_chat_template(before, tokenize=False)
    rendered = tokenizer.apply_chat_template(before + [{"role": "user", "content": f"Error: {longest}."}],
                                             tokenize=False, add_generation_prompt=True)
    naming = len(tokenizer(rendered[len(start):])["input_ids"]) + 2  # and the end of the reply before it
    assert bench.TURNS + (bench.TURNS - 1) * naming <= bench.RESPONSE_LENGTH


@pytest.mark.parametrize("algorithm,mode", [("grpo", "turn_baseline"), ("ppo", "gae")])
def test_a_short_run_records_rewards_per_turn_that_follow_the_rules(bench, tmp_path, algorithm, mode):
    run = bench.worker(algorithm, mode, seed=1, iterations=2, output_dir=tmp_path)
    assert len(run["per_turn"]) == 2
    for turns in run["per_turn"]:
        assert len(turns) == 3 and all(0.0 <= value <= 1.0 for value in turns)
        # a turn is reached only by fixing the one before it
        assert turns[0] >= turns[1] >= turns[2]
        assert all((value * bench.BATCH).is_integer() for value in turns)
    figures = bench.summary(run, threshold=0.0)
    assert figures["iterations_to_threshold"] is None  # fewer iterations than the window of 5
    assert figures["last_quarter_return"] == pytest.approx(sum(figures["last_quarter_per_turn"]))
