"""A checkpoint write that fails on the user's disk is one line on every path (plain or sharded); anything else the
writers raise (a device error, a bug) keeps its type and traceback."""

from __future__ import annotations

import errno

import pytest
import torch

from training_wizard import checkpoint
from training_wizard.checkpoint import find_checkpoint, save_checkpoint
from training_wizard.checkpoint_writes import save_plain
from training_wizard.errors import UserError

from tests.helpers import make_rloo_trainer

# The messages torch's zip writer (caffe2/serialize/inline_container.cc) gives a failed write.
ZIP_WRITER_FULL = ("[enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing file data/3: "
                   "file write failed")
DEVICE_ERROR = "CUDA error: an illegal memory access was encountered"


def _checkpoint_exception(inner: BaseException) -> BaseException:
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    return CheckpointException("save failed", {0: _wrap_exception(inner)})


def _trainer_with_a_checkpoint(tokenizer, out):
    trainer = make_rloo_trainer(tokenizer, out)
    save_checkpoint(trainer)  # step-0, written the plain way
    trainer.state.iteration = 1
    return trainer


def _sharded_save_raising(monkeypatch, trainer, error):
    monkeypatch.setattr(checkpoint, "engine_kind", lambda accelerator: "deepspeed")

    def save_sharded_state(models, optimizer, folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "partial").write_bytes(b"half a shard")
        raise error

    monkeypatch.setattr(trainer.collectives, "save_sharded_state", save_sharded_state)


@pytest.mark.parametrize("error, reason", [
    (RuntimeError(ZIP_WRITER_FULL), "RuntimeError: [enforce fail at inline_container.cc:595] . PytorchStreamWriter"),
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (_checkpoint_exception(OSError(errno.ENOSPC, "No space left on device")), "No space left on device"),
], ids=["deepspeed zip writer", "OSError", "torch DCP CheckpointException"])
def test_a_failed_sharded_write_is_one_line_and_keeps_the_previous_checkpoint(tokenizer, tmp_path, monkeypatch,
                                                                               error, reason):
    trainer = _trainer_with_a_checkpoint(tokenizer, tmp_path)
    _sharded_save_raising(monkeypatch, trainer, error)
    with pytest.raises(UserError) as failure:
        save_checkpoint(trainer)
    message = str(failure.value)
    assert "\n" not in message and message.startswith("checkpoint step-1 could not be written (")
    assert reason in message and "checkpoints/step-0 is kept" in message
    root = tmp_path / "checkpoints"
    assert not (root / ".staging-step-1").exists() and find_checkpoint(tmp_path, "latest") == root / "step-0"


def test_a_sharded_save_that_fails_otherwise_keeps_its_error(tokenizer, tmp_path, monkeypatch):
    trainer = _trainer_with_a_checkpoint(tokenizer, tmp_path)
    _sharded_save_raising(monkeypatch, trainer, RuntimeError(DEVICE_ERROR))
    with pytest.raises(RuntimeError, match="CUDA error"):
        save_checkpoint(trainer)
    assert find_checkpoint(tmp_path, "latest") == tmp_path / "checkpoints" / "step-0"


def test_a_device_error_in_torch_save_is_not_reported_as_a_full_disk(tokenizer, tmp_path, monkeypatch):
    trainer = _trainer_with_a_checkpoint(tokenizer, tmp_path)
    real_save = torch.save

    def failing(obj, path, *args, **kwargs):
        if str(path).endswith("scheduler.pt"):
            raise RuntimeError(DEVICE_ERROR)
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(RuntimeError, match="CUDA error"):
        save_checkpoint(trainer)
    root = tmp_path / "checkpoints"
    assert not (root / ".staging-step-1").exists() and (root / "latest").read_text() == "step-0"


@pytest.mark.parametrize("message", [ZIP_WRITER_FULL, "[enforce fail at inline_container.cc:603] . unexpected pos "
                                     "4160 vs 4054"])
def test_save_plain_names_the_file_of_a_zip_writer_failure(tmp_path, monkeypatch, message):
    def full(obj, path, *args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError) as failure:
        save_plain({}, tmp_path / "optimizer.pt")
    assert failure.value.errno == errno.EIO and failure.value.filename == str(tmp_path / "optimizer.pt")


def test_save_plain_reraises_other_runtime_errors(tmp_path, monkeypatch):
    def broken(obj, path, *args, **kwargs):
        raise RuntimeError(DEVICE_ERROR)

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="CUDA error"):
        save_plain({}, tmp_path / "optimizer.pt")
