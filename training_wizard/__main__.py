"""`python -m training_wizard RECIPE.toml`, so that `accelerate launch -m training_wizard` works."""

import sys

from training_wizard.cli import main

sys.exit(main())
