"""Which exceptions of a checkpoint's writers say that a write failed (a full disk, a read-only or vanished folder:
the user's to fix, one line) rather than a bug (kept with its traceback). One rule for every writer:

- OSError, whatever wrote;
- safetensors' SafetensorError (its Rust writer reports a full disk as "I/O error: ... (os error 28)");
- the RuntimeError of torch's zip writer (torch.save, and DeepSpeed's save_checkpoint through it), recognized by
  the messages of caffe2/serialize/inline_container.cc: "PytorchStreamWriter failed writing file ...",
  "... file write failed", "unexpected pos N vs M". Any other RuntimeError (a CUDA error, say) is not a write;
- torch distributed checkpoint's CheckpointException (a BaseException) when a rank's wrapped failure is one of
  the above.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import torch

ZIP_WRITER_FAILURES = ("PytorchStreamWriter failed", "file write failed", "unexpected pos")


def write_failure_cause(exc: BaseException) -> BaseException | None:
    """The exception that says a write failed, if `exc` is one or wraps one (the module docstring's rule); None
    for anything else."""
    if isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":
        return exc
    if isinstance(exc, RuntimeError) and any(text in str(exc) for text in ZIP_WRITER_FAILURES):
        return exc
    failures = getattr(exc, "failures", None)
    if type(exc).__name__ == "CheckpointException" and isinstance(failures, dict):
        for wrapped in failures.values():  # {rank: (exception, traceback summary)}
            inner = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
            cause = write_failure_cause(inner) if isinstance(inner, BaseException) else None
            if cause is not None:
                return cause
    return None


def is_caught_while_writing(exc: BaseException) -> bool:
    """Whether a checkpoint write may turn `exc` into an error line: any Exception, and torch DCP's
    CheckpointException (a BaseException); never KeyboardInterrupt or SystemExit, which stop the run as they are."""
    return isinstance(exc, Exception) or type(exc).__name__ == "CheckpointException"


def failure_reason(exc: BaseException) -> str:
    """The cause of a failed write for the error line: the OS's words and the file, or the writer's first line."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" while writing {Path(exc.filename).name}" if exc.filename else "")
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def save_plain(data: Any, path: Path) -> None:
    """torch.save; a failed write of its zip writer (a RuntimeError) becomes an OSError naming the file, so the error
    line says which file. Its other errors (pickling, a device's) keep their type: they are bugs."""
    try:
        torch.save(data, path)
    except RuntimeError as exc:
        if write_failure_cause(exc) is None:
            raise
        first = (str(exc).strip().splitlines() or ["RuntimeError"])[0][:200]
        raise OSError(errno.EIO, f"write error: {first}", str(path)) from exc


def raise_first_failure(collectives, error: str | None, bug: BaseException | None) -> None:
    """Every process stops with the first error line; the process that hit a bug raises the bug itself (its
    traceback is the evidence), the others the line pointing at it."""
    from training_wizard.errors import UserError

    try:
        collectives.raise_if_any_failed(error)
    except UserError:
        if bug is not None:
            raise bug from None
        raise


def fsync_tree(folder: Path) -> None:
    """Every file and folder under `folder`, and `folder` itself, on disk before the checkpoint is renamed."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
