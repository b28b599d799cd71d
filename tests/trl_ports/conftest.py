"""The runner every port test shares: a script of this folder run as `python <script> MODEL OUTPUT`."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture
def run_trl_script():
    """`run(script, model_dir, output_dir)` runs tests/trl_ports/<script> as its own main module, with those two
    arguments, and returns its globals (the script's trainer, for the test to read)."""

    def run(script: str, model_dir: Path, output_dir: Path) -> dict:
        argv, sys.argv = sys.argv, [script, str(model_dir), str(output_dir)]
        try:
            return runpy.run_path(str(HERE / script), run_name="__main__")
        finally:
            sys.argv = argv

    return run
