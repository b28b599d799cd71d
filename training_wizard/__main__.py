"""`python -m training_wizard RECIPE.toml`, so that `accelerate launch -m training_wizard` works."""

from training_wizard.cli import run

run()
