"""Resuming a run from a checkpoint (checkpoint.py) in the output_dir it holds, so that no run appends to,
overwrites or prunes another's files: pick and load the checkpoint, drop the log records of iterations that will be
redone, remove staging folders a crash left.

`resume` is called when a run takes its output_dir (lifecycle.py: `RunLifecycle.open`). Every process calls it;
the main process decides. Its `say` prints one plain line (no markup) on the main process.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from training_wizard.checkpoint import (
    MANIFEST, checkpoints_dir, config_hash, find_checkpoint, load_checkpoint, read_manifest,
)
from training_wizard.errors import UserError
from training_wizard.run_folder import changed_settings, check_restart, training_settings
from training_wizard.sharding import engine_kind


def truncate_run_logs(output_dir: str | Path, iteration: int, episode: int) -> dict[str, int]:
    """On resume, drop metrics.jsonl, samples.jsonl and prompts.jsonl records written after the checkpoint
    (iterations that will be redone) and any line cut short by a crash, so no iteration is ever logged twice.
    Rewritten atomically.

    metrics.jsonl records are kept while `episode` <= the checkpoint's episode; samples.jsonl and prompts.jsonl
    rows while `step` <= its iteration. Returns how many lines each file lost.
    """
    dropped = {}
    for name, key, limit in (("metrics.jsonl", "episode", episode), ("samples.jsonl", "step", iteration),
                             ("prompts.jsonl", "step", iteration)):
        path = Path(output_dir) / name
        if not path.is_file():
            continue
        kept, lost = [], 0
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                keep = isinstance(record, dict) and int(record.get(key, 0)) <= limit
            except (ValueError, TypeError):
                keep = False  # a torn last line
            if keep:
                kept.append(line)
            elif line.strip():
                lost += 1
        if lost:
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
            os.replace(tmp, path)
        dropped[name] = lost
    return dropped


def remove_stale_staging(output_dir: str | Path) -> None:
    """Staging folders a crash left behind are never resumed from; remove them (main process, on resume)."""
    root = checkpoints_dir(output_dir)
    for pattern in (".staging-step-*", ".replaced-step-*"):
        for folder in root.glob(pattern):
            shutil.rmtree(folder, ignore_errors=True)


def resume(trainer, which: str, identity: dict, say: Callable[[str], None]) -> None:
    """`resume_from_checkpoint`: the main process picks the checkpoint (verifying hashes once); every process loads
    that one from the shared output_dir (`load_checkpoint` first checks that the same trainer and model wrote it,
    before anything is loaded, deleted or rewritten), and metrics.jsonl and samples.jsonl lose the records of
    iterations that will be redone, so every iteration is logged exactly once. `say` prints a line on the main
    process. `identity` is this run's (run_folder.run_identity), for a restart without a checkpoint."""
    accelerator, collectives = trainer.accelerator, trainer.collectives
    output_dir = trainer.config.output_dir
    found = collectives.decide_on_main(lambda: _as_text(_checked_checkpoint(output_dir, which, identity)))
    if found is None:
        say("resume_from_checkpoint = latest: no checkpoint yet, starting fresh")
        collectives.barrier()
        return
    folder = Path(found)
    if not (folder / MANIFEST).is_file():
        raise UserError(f"resume_from_checkpoint: {folder} is not visible from every process (output_dir must be shared)")
    written_by = read_manifest(folder).get("world_size")
    if engine_kind(accelerator) == "deepspeed" and written_by not in (None, collectives.world_size):
        raise UserError(f"resume_from_checkpoint: {folder} holds DeepSpeed shards of {written_by} process(es) and "
                        f"this run has {collectives.world_size}; resume with {written_by}")
    manifest = load_checkpoint(trainer, folder)
    if collectives.is_main:
        remove_stale_staging(output_dir)
        truncate_run_logs(output_dir, trainer.state.iteration, trainer.state.episode)
    collectives.barrier()
    say(f"resumed from {folder} (iteration {trainer.state.iteration}, episode {trainer.state.episode})")
    _say_what_changed(trainer, manifest, say)


def _checked_checkpoint(output_dir, which: str, identity: dict) -> Path | None:
    """The checkpoint to resume from; with "latest" and none yet, None, after checking the folder holds nothing
    that starting over would destroy (main process: the logs of the unfinished run are emptied here)."""
    folder = find_checkpoint(output_dir, which)
    if folder is None:
        check_restart(output_dir, identity)
        truncate_run_logs(output_dir, 0, 0)
    return folder


def _say_what_changed(trainer, manifest: dict, say: Callable[[str], None]) -> None:
    """Notes on settings that differ from the checkpoint's (allowed: episodes, learning rate, ...) and on the
    number of processes. `say` prints plain text (the recipes' console takes `[training]` as text, not a style)."""
    recorded = manifest.get("training")
    if recorded is not None:  # the settings themselves: list what changed
        changes = changed_settings(recorded, training_settings(trainer.config))
        if changes:
            say(f"note: the [training] settings differ from the checkpoint's: {'; '.join(changes)}; continuing "
                "with the new ones")
    elif manifest.get("config_sha256") not in (None, config_hash(trainer.config)):  # an older checkpoint: a hash
        say("note: the [training] settings differ from the checkpoint's; continuing with the new ones")
    world_size = trainer.collectives.world_size
    if manifest.get("world_size") not in (None, world_size):
        say(f"note: the checkpoint was written by {manifest['world_size']} process(es), this run has {world_size}")


def _as_text(folder: Path | None) -> str | None:
    return str(folder) if folder is not None else None  # plain data travels between processes
