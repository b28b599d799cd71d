"""The layer order of docs/architecture.md, checked folder by folder: a module may import its own folder and the
folders of lower layers, never a higher one. There is no allow-list: an import that has to go up means the code
sits in the wrong room, and the fix is to move it."""

import re
from pathlib import Path

from test_architecture import PACKAGE, imported_modules, package_modules

# Low to high. A top-level module (training_wizard/x.py) is a room of its own; trainers/ has rooms of its own too.
LAYERS: list[set[str]] = [
    {"errors", "spec", "signals", "timeouts", "http_client", "memory", "memory_plan", "core", "tracking"},
    {"collectives", "guards", "sharding"},
    {"specs", "rewards", "evaluation"},
    {"rollout", "envs", "testing"},
    {"checkpoint_writes", "run_folder", "checkpoint", "run_start", "lifecycle"},
    {"trainers", "trainers.config"},  # "trainers": the package's __init__ (a docstring)
    {"trainers.loop", "trainers.supervised"},
    {"trainers.algorithms"},
    {"legacy", "recipes", "trl"},
    {"cli", "__main__", "__init__"},
]


def room(module: str) -> str:
    """The folder (or top-level module) a module lives in: training_wizard.rollout.collector -> rollout,
    training_wizard.trainers.loop.update -> trainers.loop, training_wizard.cli -> cli."""
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] == "trainers" and len(parts) > 1:
        return f"trainers.{parts[1]}"
    return parts[0]


def layer_of(module: str) -> int:
    name = room(module)
    for rank, rooms in enumerate(LAYERS):
        if name in rooms:
            return rank
    raise AssertionError(f"{module}: {name!r} has no layer; add it to LAYERS and to docs/architecture.md")


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import (module -> imported module) that goes to a higher layer."""
    return [f"{name} ({room(name)}) imports {target} ({room(target)})"
            for name, targets in sorted(graph.items()) for target in sorted(targets)
            if layer_of(target) > layer_of(name)]


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(path, modules) for name, path in modules.items()}


def test_no_module_imports_a_higher_layer():
    offenders = upward(import_graph())
    assert not offenders, "imports that go up the layers of docs/architecture.md:\n" + "\n".join(offenders)


def test_the_check_finds_an_import_that_goes_up():
    graph = {"training_wizard.specs.a": {"training_wizard.rollout.b"}, "training_wizard.rollout.b": set(),
             "training_wizard.trainers.loop.c": {"training_wizard.trainers.config.d", "training_wizard.core.e"},
             "training_wizard.trainers.config.d": {"training_wizard.trainers.algorithms.f"},
             "training_wizard.trainers.algorithms.f": set(), "training_wizard.core.e": set()}
    assert upward(graph) == [
        "training_wizard.specs.a (specs) imports training_wizard.rollout.b (rollout)",
        "training_wizard.trainers.config.d (trainers.config) imports training_wizard.trainers.algorithms.f "
        "(trainers.algorithms)",
    ]


def test_every_room_of_the_package_has_a_layer():
    for name in package_modules():
        layer_of(name)


def test_the_trainers_know_neither_async_nor_the_trl_wing():
    """The loop asks its source for batches and knows nothing of the asynchronous schedule; the native trainers
    and configs know nothing of TRL's names (the wing translates them)."""
    offenders = [f"{name} imports {target}" for name, targets in sorted(import_graph().items())
                 if name.startswith("training_wizard.trainers.")
                 for target in sorted(targets)
                 if target.startswith(("training_wizard.rollout.async", "training_wizard.trl"))]
    assert not offenders, "\n".join(offenders)


def test_the_docs_table_lists_the_layers_in_this_order():
    """docs/architecture.md's layer table names the same rooms, low to high, so the docs cannot drift."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, flags=re.M)
    documented = [{name.strip(" `/") .replace("/", ".") for name in cell.split(",")} for _, cell in rows]
    assert documented == [rooms - {"trainers"} for rooms in LAYERS]
