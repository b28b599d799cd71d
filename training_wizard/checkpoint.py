"""Checkpoints: written to a staging folder with a manifest, then renamed into place; `latest` points at the
newest committed one. A folder without a valid manifest is never chosen for resume.

Layout of `output_dir/checkpoints/step-N/`: `model/` (save_pretrained, safetensors; an adapter for LoRA),
`optimizer.pt` and `scheduler.pt` (tensors and plain data only, loaded with weights_only=True),
under DeepSpeed or FSDP `sharded/` instead of `optimizer.pt` (every process's shard of the weights and optimizer
state, written and read by the engine: sharding.py),
`trainer_state.pt` (counters, data position, RNG states, accelerate's step counter), `manifest.json` (files,
sizes, sha256, step, episode, config hash, library versions, world size).

Commit order (RELIABILITY.md): refuse non-finite weights -> write every file into `.staging-step-N` -> manifest ->
fsync files and folder -> rename to `step-N` -> fsync the parent -> rewrite `latest` (temp file + rename) ->
prune older checkpoints beyond `save_total_limit`. Resuming (run_start.py) reads the manifest's `identity` and
`training` settings first. A crash at any point leaves the previous checkpoint and
`latest` intact; a failed write (disk full) removes the staging folder and stops with a one-line UserError.
What counts as a failed write, for every writer (sharded or not), is decided in checkpoint_writes.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any, Protocol

import torch

from training_wizard.checkpoint_writes import (
    failure_reason, fsync_dir, fsync_tree, is_caught_while_writing, raise_first_failure, save_plain,
    write_failure_cause,
)
from training_wizard.errors import UserError
from training_wizard.guards import first_nonfinite_parameter
from training_wizard.run_folder import identity_difference, run_identity, training_settings
from training_wizard.sharding import SHARDED_STATE, deepspeed_lookup_skipped, engine_kind, unwrap_model
from training_wizard.signals import fault_point

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT_VERSION = 1
REQUIRED_FILES = ("scheduler.pt", "trainer_state.pt")  # + optimizer.pt, or sharded/ under sharding
_LIBRARIES = ("torch", "transformers", "accelerate", "peft", "safetensors", "training_wizard")


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def config_hash(config) -> str:
    """sha256 of the training config as JSON (output_dir left out, so a moved run folder still matches)."""
    data = config.model_dump(mode="json")
    data.pop("output_dir", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            found[name] = version(name.replace("_", "-"))
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


class Checkpointable(Protocol):
    """What checkpoint.py needs from a trainer (OnPolicyTrainer provides it):

    accelerator, collectives (every process takes part in a save), config (output_dir, save_total_limit, and the
    rest for the config hash), optimizer, lr_scheduler, state (RunState: state_dict / load_state_dict),
    checkpoint_models() ({folder name: model}; the policy is "model"), last_saved_step (set here).
    """

    accelerator: Any
    collectives: Any
    config: Any
    optimizer: Any
    lr_scheduler: Any
    state: Any
    last_saved_step: int | None

    def checkpoint_models(self) -> dict[str, torch.nn.Module]: ...


def save_options(model: torch.nn.Module) -> dict[str, Any]:
    """Extra `save_pretrained` arguments for `model` (unwrapped). For a peft model, whether the adapter folder also
    holds the embedding layers, decided here rather than by peft's "auto", which looks the base model's config up
    under base_model_name_or_path: a Hub id, so on the network (or not at all, with a warning, offline). They are
    saved when our model spec grew the vocabulary (an added pad token) or when an adapter sits on an embedding
    layer (peft's own rule, applied without a lookup)."""
    if not hasattr(model, "get_base_model"):  # not a PeftModel (its base model also holds a peft_config)
        return {}
    base = model.get_base_model()
    if getattr(base, "training_wizard_resized_embeddings", False):
        return {"save_embedding_layers": True}
    adapted = any(hasattr(module, "lora_A") and name.rsplit(".", 1)[-1] in ("embed_tokens", "lm_head")
                  for name, module in base.named_modules())
    return {"save_embedding_layers": "auto" if adapted else False}


def save_checkpoint(trainer: Checkpointable, state: dict[str, Any] | None = None) -> Path:
    """Commit a checkpoint of `trainer` (main process writes; every process takes part and gets any error).

    `state`: the RunState to save (default: the current one); the loop passes the iteration's starting state when
    it stops before an update, which is exact because weights, optimizer and scheduler are unchanged there.
    Disk full or an unwritable folder ends in a one-line UserError on every process; anything else is a bug and
    keeps its traceback on the main process (the others stop with a line pointing at it).
    """
    collectives = trainer.collectives
    root = checkpoints_dir(trainer.config.output_dir)
    run_state = state if state is not None else trainer.state.state_dict()
    step = int(run_state["iteration"])
    models = trainer.checkpoint_models()
    error, bug = None, None
    for model in models.values():
        bad = first_nonfinite_parameter(unwrap_model(trainer.accelerator, model))
        if bad is not None and error is None:
            error = (f"checkpoint step-{step} not written: parameter '{bad}' has non-finite values (NaN/inf); the "
                     "previous checkpoint is kept. Lower training.learning_rate or set "
                     "training.skip_nonfinite_batches = true")
    collectives.raise_if_any_failed(error)  # under sharding a process sees only its own shard
    state_dicts = {name: collectives.full_state_dict(model) for name, model in models.items()}
    staging = root / f".staging-step-{step}"
    if collectives.is_main:
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        except OSError as exc:
            error = _write_failure(root, step, exc)
    collectives.raise_if_any_failed(error)  # also the barrier: the folder exists before anyone writes into it
    if engine_kind(trainer.accelerator):  # every process writes its own shard into the staging folder
        error, bug = _save_shards(trainer, models, root, step)
        raise_first_failure(collectives, error, bug)  # and every shard is written before the main process commits
    if collectives.is_main:
        try:
            _write_and_commit(trainer, root, step, run_state, state_dicts)
        except Exception as exc:  # noqa: BLE001 - sorted below: the user's I/O trouble, or a bug
            cause = write_failure_cause(exc)
            if cause is not None:  # disk full, permissions, a vanished folder: the user's to fix
                error = _write_failure(root, step, cause)
            else:  # a bug: keep its traceback here, stop the other processes with one line
                shutil.rmtree(root / f".staging-step-{step}", ignore_errors=True)
                bug = exc
                error = f"checkpoint step-{step}: the main process failed while writing it (see its traceback)"
    raise_first_failure(collectives, error, bug)
    trainer.last_saved_step = step
    return root / f"step-{step}"


def _save_shards(trainer: Checkpointable, models, root: Path, step: int) -> tuple[str | None, BaseException | None]:
    """Every process writes its shard (DeepSpeed's engine through torch.save, or torch DCP). Returns (error line,
    bug): a failed write is the one line of any other write (the main process drops the staging folder); anything
    else is a bug whose traceback its process keeps while the others stop with a line pointing at it."""
    collectives = trainer.collectives
    try:
        collectives.save_sharded_state(models, trainer.optimizer, root / f".staging-step-{step}" / SHARDED_STATE)
    except BaseException as exc:  # torch DCP's CheckpointException is a BaseException
        if not is_caught_while_writing(exc):
            raise
        cause = write_failure_cause(exc)
        if cause is None:
            return (f"checkpoint step-{step}: process {collectives.rank} failed while writing its shard (see its "
                    "traceback)"), exc
        return _write_failure(root, step, cause, drop_staging=collectives.is_main), None
    return None, None


def _write_failure(root: Path, step: int, exc: BaseException, drop_staging: bool = True) -> str:
    """The one-line message for a checkpoint that could not be written; the staging folder is dropped (by the main
    process: the others leave it to it)."""
    if drop_staging:
        shutil.rmtree(root / f".staging-step-{step}", ignore_errors=True)
    latest = _read_latest(root)
    kept = f"checkpoints/{latest} is kept" if latest else "no earlier checkpoint exists"
    reason = failure_reason(exc)
    return (
        f"checkpoint step-{step} could not be written ({reason}); {kept}; fix the cause (e.g. free disk "
        "space) and run again with resume_from_checkpoint=latest"
    )


def _write_and_commit(trainer: Checkpointable, root: Path, step: int, run_state: dict[str, Any], state_dicts) -> None:
    from transformers.utils import logging as hf_logging

    accelerator = trainer.accelerator
    final, staging = root / f"step-{step}", root / f".staging-step-{step}"  # staging: made by save_checkpoint
    fault_point("save:start", step)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # keep stderr for our own one-line messages
    try:
        with deepspeed_lookup_skipped(accelerator):  # save_pretrained unwraps through accelerate
            for name, model in trainer.checkpoint_models().items():
                unwrapped = unwrap_model(accelerator, model)
                unwrapped.save_pretrained(staging / name, state_dict=state_dicts[name], safe_serialization=True,
                                          **save_options(unwrapped))
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    fault_point("save:model", step)
    if not engine_kind(accelerator):  # sharded runs wrote theirs into sharded/
        save_plain(trainer.optimizer.state_dict(), staging / "optimizer.pt")
    fault_point("save:optimizer", step)
    save_plain(trainer.lr_scheduler.state_dict(), staging / "scheduler.pt")
    trainer_state = {"trainer": run_state, "accelerator_step": int(accelerator.step)}
    save_plain(trainer_state, staging / "trainer_state.pt")
    write_manifest(staging, step, {
        "format": FORMAT_VERSION,
        "episode": int(run_state["episode"]),
        "config_sha256": config_hash(trainer.config),
        "identity": run_identity(trainer),  # what made it: resuming from it with another trainer or model is refused
        "training": training_settings(trainer.config),  # for the note of changed settings
        "world_size": accelerator.num_processes,
        "versions": library_versions(),
    })
    fsync_tree(staging)
    fault_point("save:before-rename", step)
    aside = root / f".replaced-step-{step}"
    if final.exists():  # an older copy of this step (a resumed run redoing it): move it aside, drop it after
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(staging, final)
    fsync_dir(root)
    fault_point("save:renamed", step)
    _write_latest(root, final.name)
    shutil.rmtree(aside, ignore_errors=True)
    fault_point("save:latest", step)
    _prune(root, trainer.config.save_total_limit, keep=final.name)


def write_manifest(folder: Path, step: int, extra: dict[str, Any] | None = None) -> None:
    files = {
        str(path.relative_to(folder)): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    manifest = {"step": step, "files": files, "torch": torch.__version__, **(extra or {})}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def read_manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text())


def is_valid_checkpoint(folder: Path) -> bool:
    """True when the manifest exists, lists the required files and safetensors weights, and every file in it has
    the recorded size and hash."""
    return checkpoint_problem(folder) is None


# folder -> (name, size, mtime) of its files when they last verified in this process: the start checks and the
# start itself both look for the checkpoint, and hashing a large one twice would cost minutes.
_VERIFIED: dict[Path, tuple] = {}


def _file_stats(folder: Path, names) -> tuple:
    stats = [(name, (folder / name).stat()) for name in sorted({*names, MANIFEST})]
    return tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


def _verified_before(folder: Path, names) -> bool:
    try:
        return _VERIFIED.get(folder.resolve()) == _file_stats(folder, names)
    except OSError:  # a file gone since: verify again, which names it
        return False


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint (the first thing found), or None when it verifies."""
    try:
        files = read_manifest(folder)["files"]
        if _verified_before(folder, files):
            return None
        needed = [*REQUIRED_FILES]
        if not any(name.startswith(f"{SHARDED_STATE}/") for name in files):  # unsharded: the optimizer's file
            needed.append("optimizer.pt")
        missing = [name for name in needed if name not in files]
        if not any(name.startswith("model/") and name.endswith(".safetensors") for name in files):
            missing.append("model/*.safetensors")
        if missing:
            return f"{MANIFEST} does not list {missing[0]}"
        for name, entry in files.items():
            if not (folder / name).is_file():
                return f"{name} is missing"
            if (folder / name).stat().st_size != entry["size"] or _sha256(folder / name) != entry["sha256"]:
                return f"{name} differs from the size or sha256 its manifest records"
        _VERIFIED[folder.resolve()] = _file_stats(folder, files)
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{MANIFEST} missing or unreadable ({type(exc).__name__})"


def _read_latest(root: Path) -> str | None:
    try:
        return (root / LATEST).read_text().strip() or None
    except OSError:
        return None


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.tmp"
    tmp.write_text(name)
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


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
    """Resolve `resume_from_checkpoint`: "latest" (None if none was committed yet) or a folder path.

    "latest" tries the `latest` pointer first, then every `step-N` from the newest down, and takes the first
    whose manifest verifies: a folder cut short by a crash (staging never renamed, a file missing or truncated)
    is passed over. Committed checkpoints of which none verifies stop the run in one line (UserError).
    """
    if which != "latest":
        folder = Path(which)
        problem = checkpoint_problem(folder)
        if problem:
            raise UserError(f"resume_from_checkpoint: '{which}' is not a complete checkpoint ({problem})")
        return folder
    root = checkpoints_dir(output_dir)
    candidates = []
    latest = _read_latest(root)
    if latest and "/" not in latest and latest not in (".", ".."):
        candidates.append(root / latest)
    committed = sorted((p for p in root.glob("step-*") if p.is_dir()), key=_step_of, reverse=True)
    for folder in candidates + committed:
        if is_valid_checkpoint(folder):
            return folder
    if committed:  # checkpoints were committed and none verifies: starting over would be a silent loss
        count = "1 checkpoint" if len(committed) == 1 else f"{len(committed)} checkpoints"
        raise UserError(
            f"resume_from_checkpoint = \"latest\": {root} holds {count} and none verifies (the newest, "
            f"{committed[0].name}: {checkpoint_problem(committed[0])}); resume from a good copy with "
            "resume_from_checkpoint = \"<folder>\", or choose another output_dir"
        )
    return None


def _load_plain(path: Path) -> Any:
    """torch.load with weights_only=True: tensors and plain containers only; anything else is refused."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        # weights_only refusing a pickled object, or a corrupt/truncated file: the user's checkpoint, not a bug
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(
            f"resume_from_checkpoint: {path} is not plain tensor data and was not loaded "
            f"(weights_only=True refused it: {reason})"
        ) from None


def load_checkpoint(trainer: Checkpointable, folder: Path) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, counters, data position, RNG streams and accelerate's step counter
    into `trainer`. Weights come from safetensors only; the .pt files load with weights_only=True. Returns the
    manifest (for notes on a changed config or world size)."""
    folder = Path(folder)
    accelerator = trainer.accelerator
    # decided on the main process: every process then loads, or every one stops with the same line
    trainer.collectives.decide_on_main(lambda: check_identity(folder, run_identity(trainer)))
    sharded = (folder / SHARDED_STATE).is_dir()
    if sharded != bool(engine_kind(accelerator)):
        written = "under DeepSpeed or FSDP" if sharded else "without DeepSpeed or FSDP"
        this_run = {"deepspeed": "DeepSpeed", "fsdp": "FSDP"}.get(engine_kind(accelerator), "not sharded")
        raise UserError(f"resume_from_checkpoint: {folder} was written {written} and this run is {this_run}; "
                        "resume with the accelerate config that wrote it")
    scheduler_state = _load_plain(folder / "scheduler.pt")
    state = _load_plain(folder / "trainer_state.pt")
    if sharded:
        trainer.collectives.load_sharded_state(trainer.checkpoint_models(), trainer.optimizer, folder / SHARDED_STATE)
    else:
        optimizer_state = _load_plain(folder / "optimizer.pt")
        for name, model in trainer.checkpoint_models().items():
            _load_weights(unwrap_model(accelerator, model), folder / name)
        trainer.optimizer.load_state_dict(optimizer_state)
    trainer.lr_scheduler.load_state_dict(scheduler_state)
    trainer.state.load_state_dict(state["trainer"])
    trainer.accelerator.step = int(state.get("accelerator_step", 0))
    trainer.last_saved_step = trainer.state.iteration  # resumed: train() goes on in output_dir (lifecycle.py)
    return read_manifest(folder)


def check_identity(folder: Path, identity: dict[str, Any]) -> None:
    """Refuse, before anything is loaded or written, a checkpoint that another trainer or model wrote (its manifest
    records what made it: run_folder.run_identity). Checkpoints from before that record pass."""
    recorded = read_manifest(folder).get("identity")
    problem = identity_difference(recorded, identity) if recorded else None
    if problem:
        raise UserError(f"resume_from_checkpoint: {folder} was not written by this run ({problem}); resume with "
                        "the recipe and model that wrote it, or choose another output_dir")


def _load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load a saved model folder (a LoRA adapter, or full weights in one or more safetensors shards)."""
    from safetensors.torch import load_file

    adapter = folder / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    missing, unexpected = model.load_state_dict(weights, strict=False)  # tied weights are saved once
    current = model.state_dict()
    loaded = {current[name].data_ptr() for name in weights if name in current}
    untied = [name for name in missing if current[name].data_ptr() not in loaded]  # truly absent, not tied
    if unexpected or untied or not weights:
        problem = (f"unexpected weight {unexpected[0]}" if unexpected
                   else f"missing weight {untied[0]}" if untied else "no weights found")
        raise UserError(f"resume_from_checkpoint: {folder} does not match the model ({problem})")
