"""Checkpoints: written to a staging folder with a manifest, then renamed into place; `latest` points at the
newest committed one. A folder without a valid manifest is never chosen for resume.

Layout of `output_dir/checkpoints/step-N/`: `model/` (save_pretrained, safetensors; an adapter for LoRA),
`optimizer.pt` and `scheduler.pt` (tensors and plain data only, loaded with weights_only=True),
`trainer_state.pt` (counters, data position, RNG states), `manifest.json` (files, sizes, sha256, step).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from training_wizard.errors import UserError

MANIFEST = "manifest.json"
LATEST = "latest"


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(trainer) -> Path | None:
    """Write a checkpoint of `trainer` at its current iteration (main process writes; all processes wait)."""
    accelerator = trainer.accelerator
    root = checkpoints_dir(trainer.config.output_dir)
    step = trainer.state.iteration
    final = root / f"step-{step}"
    accelerator.wait_for_everyone()
    state = {"trainer": trainer.state.state_dict(), "rank_rng": torch.get_rng_state()}
    if accelerator.is_main_process:
        staging = root / f".staging-step-{step}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        accelerator.unwrap_model(trainer.policy).save_pretrained(staging / "model", safe_serialization=True)
        torch.save(trainer.optimizer.state_dict(), staging / "optimizer.pt")
        torch.save(trainer.lr_scheduler.state_dict(), staging / "scheduler.pt")
        torch.save(state, staging / "trainer_state.pt")
        write_manifest(staging, step)
        _fsync_tree(staging)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        _fsync_dir(root)
        _write_latest(root, final.name)
        _prune(root, trainer.config.save_total_limit, keep=final.name)
    accelerator.wait_for_everyone()
    return final


def write_manifest(folder: Path, step: int, extra: dict[str, Any] | None = None) -> None:
    files = {
        str(path.relative_to(folder)): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    manifest = {"step": step, "files": files, "torch": torch.__version__, **(extra or {})}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def is_valid_checkpoint(folder: Path) -> bool:
    """True when the manifest exists and every file in it has the recorded size and hash."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        for name, entry in manifest["files"].items():
            path = folder / name
            if path.stat().st_size != entry["size"] or _sha256(path) != entry["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.tmp"
    tmp.write_text(name)
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, root / LATEST)
    _fsync_dir(root)


def _step_of(folder: Path) -> int:
    try:
        return int(folder.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def _prune(root: Path, limit: int | None, keep: str) -> None:
    if not limit:
        return
    committed = sorted((p for p in root.glob("step-*") if p.is_dir()), key=_step_of)
    for folder in committed[: max(0, len(committed) - limit)]:
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)


def find_checkpoint(output_dir: str | Path, which: str) -> Path | None:
    """Resolve `resume_from_checkpoint`: "latest" (None if there is no valid one yet) or a folder path."""
    if which != "latest":
        folder = Path(which)
        if not is_valid_checkpoint(folder):
            raise UserError(f"resume_from_checkpoint: '{which}' is not a complete checkpoint (manifest missing or wrong)")
        return folder
    root = checkpoints_dir(output_dir)
    pointer = root / LATEST
    candidates = []
    if pointer.is_file():
        candidates.append(root / pointer.read_text().strip())
    candidates += sorted((p for p in root.glob("step-*") if p.is_dir()), key=_step_of, reverse=True)
    for folder in candidates:
        if is_valid_checkpoint(folder):
            return folder
    return None


def load_checkpoint(trainer, folder: Path) -> None:
    """Restore weights, optimizer, scheduler, counters, data position and RNG streams into `trainer`."""
    from safetensors.torch import load_file

    model = trainer.accelerator.unwrap_model(trainer.policy)
    weights = folder / "model" / "model.safetensors"
    if weights.exists():
        model.load_state_dict(load_file(str(weights)), strict=False)
    else:  # a LoRA adapter
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(folder / "model" / "adapter_model.safetensors")))
    trainer.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    trainer.lr_scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    state = torch.load(folder / "trainer_state.pt", weights_only=True)
    trainer.state.load_state_dict(state["trainer"])
