"""Structural rules of the package that review relies on: collectives in one module, core/ on torch alone,
checkpoints through the trainer's public attributes."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "training_wizard"
COLLECTIVE = re.compile(
    r"accelerator\.(reduce|gather|broadcast|wait_for_everyone|get_state_dict)\(|gather_object|broadcast_object_list"
    r"|torch\.distributed|all_reduce|all_gather"
)
# Sharding a model is not a collective in itself (like accelerator.prepare); its forward passes are.
WRAPPING = re.compile(r"from torch\.distributed\.fsdp import fully_shard$")


def test_collectives_are_called_only_from_the_collectives_module():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "collectives.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if COLLECTIVE.search(code) and not WRAPPING.search(code):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "collectives outside collectives.py:\n" + "\n".join(offenders)


def test_core_imports_only_torch():
    for path in sorted((PACKAGE / "core").glob("*.py")):
        imports = re.findall(r"^\s*(?:from|import) ([\w.]+)", path.read_text(), flags=re.M)
        foreign = [name for name in imports if not name.startswith(("torch", "training_wizard.core", "__future__",
                                                                    "dataclasses", "typing", "math"))]
        assert not foreign, f"{path.name} imports {foreign}"


def test_checkpoint_uses_no_private_trainer_attributes():
    text = (PACKAGE / "checkpoint.py").read_text()
    assert not re.search(r"trainer\._", text)
