"""`requires(...)`: skip a test, with the reason, when an optional extra it needs is not installed, so that
`pip install -e .` plus pytest runs; `pip install -r requirements.txt` brings them all."""

import importlib.util

import pytest


def requires(*modules: str):
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (pip install -r requirements.txt)")
