"""Docs generated from code stay in step with it."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_docgen():
    """scripts/docgen.py is a script, not part of the package: loaded from its file."""
    spec = importlib.util.spec_from_file_location("docgen", ROOT / "scripts" / "docgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_is_current():
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current == load_docgen().render(), "run: .venv/bin/python scripts/docgen.py > docs/configuration.md"


def test_every_training_option_is_documented_with_a_description():
    from training_wizard.trl.configs import RLOORecipeConfig

    missing = [name for name, field in RLOORecipeConfig.model_fields.items() if not field.description]
    assert missing == []
