"""scripts/trace_iteration.py counts the package functions of one GRPO iteration as its docstring defines them:
checked on a real single-turn run, and its switch counter on a hand-made list."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace_script():
    """scripts/trace_iteration.py is a script, not part of the package: loaded from its file."""
    spec = importlib.util.spec_from_file_location("trace_iteration", ROOT / "scripts" / "trace_iteration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_switches_count_the_neighbours_in_different_files(trace_script):
    stops = [("a.py", "f"), ("a.py", "g"), ("b.py", "h"), ("a.py", "k"), ("c.py", "m"), ("c.py", "n")]
    assert trace_script.count_switches(stops) == 3
    assert trace_script.count_switches(stops[:2]) == 0 and trace_script.count_switches([]) == 0
    assert trace_script.summary("x", stops) == {"case": "x", "stops": 6, "files": 3, "switches": 3}


def test_a_single_turn_iteration_is_traced_as_defined(trace_script):
    result = trace_script.trace_iteration("single")
    stops = [tuple(entry.split(":", 1)) for entry in result["list"]]
    assert result == {**trace_script.summary("single", stops), "list": result["list"]}
    assert result["stops"] >= result["files"] > 1 and result["switches"] < result["stops"]
    assert len(set(stops)) == len(stops)  # each function once, at its first call
    assert stops[0][1].split(".")[-1] == "train"  # the reading order starts at train()
    for file, qualname in stops:
        assert file.startswith("training_wizard/") and (ROOT / file).is_file(), file
        assert qualname.split(".")[-1] not in trace_script.SKIPPED_NAMES, qualname
    qualnames = {qualname for _, qualname in stops}
    assert {"GRPOTrainer.shape_rewards", "GRPOTrainer.micro_batch_loss"} <= qualnames  # the iteration ran
