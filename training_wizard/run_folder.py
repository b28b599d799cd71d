"""A run owns its `output_dir`: it never appends to, overwrites or prunes another run's files, nor a user's.

What a run writes there (`RUN_FILES`) is known; anything else in the folder is the user's and is never touched.
A file of a run-file name is a run's only when something shows a run wrote it (`written_by_a_run`):
  - run.json, written before any other file, lists the run-file names the run owns (`files`: all of them, since
    a run starts only where no user's file bears one of those names);
  - without that list (no run.json, or one written before the list existed), the content shows it: run.json
    records a trainer, each JSONL log holds only its own records (prompts.jsonl: `{"step", "prompts",
    "reissued"}` lines, not a prompt dataset), checkpoints/ holds only checkpoint folders; an older run.json
    also vouches for the names it knew (all but prompts.jsonl, which came later).
A file of a run-file name that no run wrote is the user's (`user_files`): a run that would overwrite or append
to it stops in one line, and overwrite_output_dir never deletes it.
A run takes the folder once, before it writes anything (lifecycle.py: `RunLifecycle.open`):
  - a new run (no `resume_from_checkpoint`) refuses a folder that holds another run's files, unless the user
    said `overwrite_output_dir = true`, which deletes those files (and only those) first;
  - a resumed run checks that the checkpoint was written by the same trainer on the same model architecture
    (`run_identity`, recorded in every checkpoint's manifest and in `run.json`) before it loads or prunes
    anything; `latest` with no checkpoint yet restarts only a run of the same identity that never finished.
The identity is what decides a checkpoint's shape: the trainer class and, for each saved model, its name and
architecture (and LoRA settings). Settings that may change on resume (episodes, learning rate, ...) are not
part of it: `changed_settings` lists them for the note the resume prints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from training_wizard.errors import UserError

# Every file or folder a training run writes into its output_dir (tracking/, checkpoint.py, recipes/).
RUN_FILES = ("run.json", "resolved_config.toml", "metrics.jsonl", "samples.jsonl", "prompts.jsonl", "checkpoints",
             "model", "report.html", "metrics.png", "tensorboard",
             # what TRL's post-train calls write (trl/results.py: save_state, save_metrics for its splits)
             "trainer_state.json", "all_results.json", "train_results.json", "eval_results.json", "test_results.json")
# What a run that never finished may leave: `latest` with no checkpoint yet restarts it from the beginning.
UNFINISHED_RUN_FILES = ("run.json", "resolved_config.toml", "metrics.jsonl", "samples.jsonl", "prompts.jsonl",
                        "checkpoints", "tensorboard")
RUN_IDENTITY_FILE = "run.json"
# The run files of the versions whose run.json had no `files` list: such a run.json vouches for these names only.
_KNOWN_BEFORE_THE_LIST = ("run.json", "resolved_config.toml", "metrics.jsonl", "samples.jsonl", "checkpoints", "model",
                          "report.html", "metrics.png", "tensorboard")
# The config keys of a model's architecture: a checkpoint whose weights have other shapes cannot be loaded.
_ARCHITECTURE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "intermediate_size", "num_labels")
_ADAPTER_KEYS = ("r", "lora_alpha", "target_modules", "modules_to_save")


def run_files(folder: str | Path) -> list[str]:
    """The names of `RUN_FILES` present in `folder`, whoever wrote them."""
    folder = Path(folder)
    return [name for name in RUN_FILES if (folder / name).exists()]


def written_by_a_run(folder: str | Path) -> list[str]:
    """The names of `RUN_FILES` present in `folder` that a run wrote: listed in a run's run.json, or shown by
    their content (the module docstring gives the rule)."""
    folder, present = Path(folder), run_files(folder)
    record = read_run_identity(folder)
    if not _is_run_record(record):
        return [name for name in present if _content_shows_a_run(folder / name)]
    listed = record.get("files")
    if isinstance(listed, list):
        return [name for name in present if name == RUN_IDENTITY_FILE or name in listed]
    return [name for name in present if name in _KNOWN_BEFORE_THE_LIST or _content_shows_a_run(folder / name)]


def user_files(folder: str | Path) -> list[str]:
    """Files and folders of a run-file name in `folder` that no run wrote: the user's."""
    written = written_by_a_run(folder)
    return [name for name in run_files(folder) if name not in written]


def refuse_user_files(folder: str | Path) -> None:
    """One line naming the user's files a run would overwrite, truncate or append to, if `folder` holds any."""
    found = user_files(folder)
    if found:
        them = "it" if len(found) == 1 else "them"
        raise UserError(
            f"output_dir: '{folder}' holds {', '.join(found)}, which no run wrote, and a run writes files of that "
            f"name there (it would overwrite or append to {them}); move {them} elsewhere or choose another output_dir"
        )


# A JSONL log is a run's when every complete line is one of its records: an object with these keys.
_LOG_KEYS = {"metrics.jsonl": {"episode"}, "samples.jsonl": {"step", "query", "response"},
             "prompts.jsonl": {"step", "prompts", "reissued"}}


def _content_shows_a_run(path: Path) -> bool:
    """Whether `path` (named as a run file) holds what only a run writes there. Names a run writes only after
    run.json (model/, the report, ...) show nothing by themselves."""
    if path.name == RUN_IDENTITY_FILE:
        return _is_run_record(read_run_identity(path.parent))
    if path.name in _LOG_KEYS:
        return path.is_file() and _only_records(path, _LOG_KEYS[path.name])
    if path.name == "checkpoints":
        return path.is_dir() and all(_is_checkpoint_entry(entry.name) for entry in path.iterdir())
    return False


def _only_records(path: Path, keys: set[str]) -> bool:
    """Every complete line of `path` is a JSON object with `keys`, and there is at least one (an unfinished last
    line, cut short by a crash, is no evidence either way)."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # the text after the last newline is unfinished
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError):
        return False
    return bool(records) and all(isinstance(record, dict) and keys <= record.keys() for record in records)


def _is_checkpoint_entry(name: str) -> bool:
    for prefix in ("step-", ".staging-step-", ".replaced-step-"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return True
    return name in ("latest", ".latest.tmp")


def _is_run_record(record: Any) -> bool:
    return isinstance(record, dict) and "trainer" in record


def continues_the_run_in(output_dir: str | Path, resume_from: str | None) -> bool:
    """Whether `resume_from_checkpoint` continues the run that output_dir holds: "latest", or one of its own
    checkpoints. A checkpoint of another folder starts a new run here (from those weights), which takes
    output_dir as any new run does."""
    if not resume_from:
        return False
    if resume_from == "latest":
        return True
    own = (Path(output_dir) / "checkpoints").resolve()
    return Path(resume_from).resolve().parent == own


def claim_new_run(folder: str | Path, overwrite: bool) -> list[str]:
    """A run that does not resume: refuse a folder with the user's files of a run-file name, or with another
    run's files (one line naming the folder and the two ways on), or with `overwrite` delete the run's files
    (only those) first. Returns the names deleted."""
    refuse_user_files(folder)
    found = written_by_a_run(folder)
    if found and not overwrite:
        raise _used_folder_error(folder, found)
    for name in found:
        path = Path(folder) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return found


def refuse_used_folder(folder: str | Path) -> None:
    """One line naming the folder, the run files in it and the two ways on, if it holds any (or one naming the
    user's files a run would write over)."""
    refuse_user_files(folder)
    found = written_by_a_run(folder)
    if found:
        raise _used_folder_error(folder, found)


def _used_folder_error(folder: str | Path, found: list[str]) -> UserError:
    return UserError(
        f"output_dir: '{folder}' holds another run's files ({', '.join(found)}); continue that run with "
        "resume_from_checkpoint = \"latest\", or choose another output_dir (overwrite_output_dir = true "
        "deletes them first)"
    )


def check_restart(folder: str | Path, identity: dict[str, Any]) -> None:
    """`resume_from_checkpoint = "latest"` found no checkpoint: the run starts from the beginning, which is only
    right for an unfinished run of the same identity (killed before its first checkpoint)."""
    refuse_finished_run(folder)
    recorded = read_run_identity(folder)
    if recorded is not None:
        problem = identity_difference(recorded, identity)
        if problem:
            raise UserError(f"resume_from_checkpoint = \"latest\": '{folder}' belongs to another run ({problem}); "
                            "choose another output_dir")


def refuse_finished_run(folder: str | Path) -> None:
    """`latest` with no checkpoint restarts the run: one line if `folder` holds a finished run's files (a final
    model, a report), which starting over would write over."""
    finished = [name for name in written_by_a_run(folder) if name not in UNFINISHED_RUN_FILES]
    if finished:
        raise UserError(
            f"resume_from_checkpoint = \"latest\": '{folder}' has no checkpoint to resume but holds a finished "
            f"run's files ({', '.join(finished)}); choose another output_dir (overwrite_output_dir = true with no "
            "resume_from_checkpoint deletes them first)"
        )


def read_run_identity(folder: str | Path) -> dict[str, Any] | None:
    """run.json as recorded (None if absent or not JSON)."""
    try:
        return json.loads((Path(folder) / RUN_IDENTITY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_run_identity(folder: str | Path, identity: dict[str, Any]) -> None:
    """run.json: the run's identity and the run-file names it owns (every one: a run starts only where none of
    them is the user's, `refuse_user_files`), written before any other file of the run."""
    path = Path(folder) / RUN_IDENTITY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**identity, "files": list(RUN_FILES)}
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------- identity
def run_identity(trainer) -> dict[str, Any]:
    """What made a run's checkpoints: the trainer class and each saved model's name and architecture."""
    from training_wizard.sharding import unwrap_model

    models = {}
    for folder, model in trainer.checkpoint_models().items():
        models[folder] = model_identity(unwrap_model(trainer.accelerator, model))
    kind = algorithm_class(type(trainer))
    return {"trainer": f"{kind.__module__}.{kind.__qualname__}", "models": models}


def algorithm_class(kind: type) -> type:
    """The package's own trainer class a trainer is (its algorithm): the same for a recipe's run and for the class
    `training_wizard` exports (which adds TRL's constructor to it), so either resumes the other's checkpoints."""
    return next((base for base in kind.__mro__ if base.__module__.startswith("training_wizard.trainers.")), kind)


def model_identity(model) -> dict[str, Any]:
    """A model's name (`config._name_or_path`), the architecture keys of its config, and its LoRA settings."""
    config = getattr(model, "config", None)
    architecture = {key: _plain(getattr(config, key)) for key in _ARCHITECTURE_KEYS
                    if config is not None and getattr(config, key, None) is not None}
    adapter = None
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict) and peft_config:
        settings = next(iter(peft_config.values()))
        adapter = {key: _plain(getattr(settings, key, None)) for key in _ADAPTER_KEYS}
    return {"name": str(getattr(config, "_name_or_path", "") or ""), "architecture": architecture,
            "adapter": adapter}


def _plain(value: Any) -> Any:
    """JSON-comparable: sets and tuples become sorted lists (peft keeps target_modules as a set)."""
    if isinstance(value, (set, frozenset)):
        return sorted(str(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _short(trainer_path: str) -> str:
    return trainer_path.rsplit(".", 1)[-1]


def identity_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """None when `recorded` (a checkpoint's or run.json's) matches `current`; else what differs, naming both."""
    # by class name: a checkpoint names the module its trainer class lived in then, which a later version may move
    if _short(str(recorded.get("trainer"))) != _short(str(current.get("trainer"))):
        return (f"written by {_short(str(recorded.get('trainer')))}, this run is "
                f"{_short(str(current.get('trainer')))}")
    old_models, new_models = recorded.get("models", {}), current.get("models", {})
    if set(old_models) != set(new_models):
        return f"it saved the models {sorted(old_models)}, this run trains {sorted(new_models)}"
    for folder, old in old_models.items():
        new = new_models[folder]
        if old.get("name") != new.get("name"):
            return f"its {folder} is '{old.get('name')}', this run's is '{new.get('name')}'"
        for part in ("architecture", "adapter"):
            if old.get(part) != new.get(part):
                return (f"its {folder} has {part} {_settings(old.get(part))}, this run's has "
                        f"{_settings(new.get(part))}")
    return None


def _settings(values: dict[str, Any] | None) -> str:
    if not values:
        return "none"
    return ", ".join(f"{key}={value}" for key, value in sorted(values.items()))


def training_settings(config) -> dict[str, Any]:
    """A [training] config as a checkpoint records it (plain JSON, secrets redacted), for `changed_settings`."""
    from training_wizard.spec import redact_secrets

    return redact_secrets(config.model_dump(mode="json"))


def changed_settings(recorded: dict[str, Any] | None, current: dict[str, Any], limit: int = 8) -> list[str]:
    """`key old -> new` for each [training] setting the checkpoint recorded that differs now (output_dir aside;
    keys added since it was written are not changes)."""
    if not recorded:
        return []
    keys = sorted(set(recorded) - {"output_dir", "overwrite_output_dir"})
    changes = [f"{key} {recorded[key]!r} -> {current.get(key)!r}" for key in keys if recorded[key] != current.get(key)]
    if len(changes) > limit:
        changes = [*changes[:limit], f"and {len(changes) - limit} more"]
    return changes
