"""Docs generated from code stay in step with it."""

from pathlib import Path

from training_wizard.docgen import render

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current():
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current == render(), "run: python -m training_wizard.docgen > docs/configuration.md"


def test_every_training_option_is_documented_with_a_description():
    from training_wizard.trainers.config import RLOORecipeConfig

    missing = [name for name, field in RLOORecipeConfig.model_fields.items() if not field.description]
    assert missing == []
