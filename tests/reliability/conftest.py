import pytest

from reliability_helpers import make_recipe, run_cli


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, tiny_model_dir):
    """The uninterrupted run every interrupted-and-resumed run must match bit for bit."""
    folder = tmp_path_factory.mktemp("reference")
    recipe = make_recipe(folder, tiny_model_dir, "reference")
    child = run_cli([recipe, "resume_from_checkpoint=latest"], folder / "logs" / "reference")
    assert child.code == 0, child.stderr()[-3000:]
    return folder / "reference"
