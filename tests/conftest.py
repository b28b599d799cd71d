import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny byte-level BPE tokenizer: build_tokenizer is deterministic, so one for the session gives every test
    the tokens its own would give. Tests must not change it (a changed one would leak into the next test)."""
    from training_wizard.testing import build_tokenizer

    return build_tokenizer()


@pytest.fixture(autouse=True)
def session_tokenizer_kept(request):
    """A test that changes the session's tokenizer (its chat template) fails itself, instead of a later test that
    renders with it."""
    yield
    if "tokenizer" in request.fixturenames:
        from training_wizard.testing import CHAT_TEMPLATE

        changed = request.getfixturevalue("tokenizer").chat_template != CHAT_TEMPLATE
        assert not changed, "this test changed the session tokenizer's chat_template: work on a copy.deepcopy of it"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama + byte-level BPE tokenizer saved as a Hugging Face folder, built once per session."""
    from training_wizard.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(autouse=True)
def _snapshot_metrics(request):
    """With METRICS_SNAPSHOT_DIR set, copy every metrics.jsonl a test wrote under its tmp_path there, named by the
    test, so a refactor can be checked to log the same numbers (scripts/compare_metrics.py)."""
    target = os.environ.get("METRICS_SNAPSHOT_DIR")
    tmp = request.getfixturevalue("tmp_path") if target and "tmp_path" in request.fixturenames else None
    yield
    if tmp is None:
        return
    import re
    import shutil
    from pathlib import Path

    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
    for found in sorted(Path(tmp).rglob("metrics.jsonl")):
        relative = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(found.parent.relative_to(tmp)))
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, Path(target) / f"{name}__{relative}.jsonl")
