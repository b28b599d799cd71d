"""TRL 1.16's script dataclasses and model helpers under their names (`from training_wizard import ScriptArguments,
ModelConfig, get_peft_config, ...` where a TRL script imports them from trl), with the same fields and defaults, so
that `TrlParser((ScriptArguments, GRPOConfig, ModelConfig))` reads the same command lines and YAML files.

Differences, each one line at use: quantized loading is refused (no bitsandbytes here), and a contradiction TRL
raises as a ValueError is a UserError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from training_wizard.errors import UserError


@dataclass
class ScriptArguments:
    """The dataset arguments of TRL's scripts: `dataset_name` is what `datasets.load_dataset` opens (a local dataset
    folder, a data file, or a cached Hub name), `dataset_config` its configuration name, and the splits to train and
    evaluate on."""

    dataset_name: str | None = field(default=None, metadata={"help": "Dataset folder, data file or cached Hub name."})
    dataset_config: str | None = field(default=None, metadata={"help": "The dataset's configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(default="test", metadata={"help": "Split to evaluate on."})
    dataset_streaming: bool = field(default=False, metadata={"help": "Open the dataset as a stream."})
    ignore_bias_buffers: bool = field(default=False, metadata={"help": "Kept for TRL's scripts; unused here."})


@dataclass
class ModelConfig:
    """How TRL's scripts name and load the model, and the LoRA adapter `get_peft_config` makes of these fields."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "Model folder or cached Hub id."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of a Hub model."})
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = field(
        default="float32", metadata={"help": "dtype of the loaded weights ('auto': the checkpoint's)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Run the model folder's own code."})
    attn_implementation: str | None = field(default=None, metadata={"help": "Attention implementation (sdpa, ...)."})
    use_peft: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of every weight."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(default=None, metadata={"help": "Modules that get an adapter."})
    lora_target_parameters: list[str] | None = field(default=None, metadata={"help": "Parameters that get one."})
    lora_modules_to_save: list[str] | None = field(default=None, metadata={"help": "Modules trained in full."})
    lora_task_type: str = field(default="CAUSAL_LM", metadata={"help": "peft task type (SEQ_CLS: reward models)."})
    use_rslora: bool = field(default=False, metadata={"help": "Rank-stabilized scaling alpha/sqrt(r)."})
    use_dora: bool = field(default=False, metadata={"help": "Weight-decomposed LoRA (DoRA)."})
    load_in_8bit: bool = field(default=False, metadata={"help": "8-bit weights: not supported here."})
    load_in_4bit: bool = field(default=False, metadata={"help": "4-bit weights: not supported here."})
    bnb_4bit_quant_type: Literal["fp4", "nf4"] = field(default="nf4", metadata={"help": "4-bit quantization type."})
    use_bnb_nested_quant: bool = field(default=False, metadata={"help": "Nested 4-bit quantization."})
    bnb_4bit_quant_storage: str | None = field(default=None, metadata={"help": "4-bit storage dtype."})

    def __post_init__(self):
        if self.load_in_8bit and self.load_in_4bit:
            raise UserError("ModelConfig: load_in_8bit and load_in_4bit are both true; choose one")
        # TRL's reading of a one-name list: the name itself, so peft matches it as a pattern ("all-linear")
        if isinstance(self.lora_target_modules, list) and len(self.lora_target_modules) == 1:
            self.lora_target_modules = self.lora_target_modules[0]


def get_peft_config(model_args: ModelConfig) -> Any:
    """A peft LoraConfig of `model_args`' lora_* fields, or None when `use_peft` is false (TRL's get_peft_config)."""
    if not model_args.use_peft:
        return None
    from peft import LoraConfig

    extra = {}
    if model_args.lora_target_parameters is not None:  # a newer peft argument: passed only when asked for
        extra["target_parameters"] = model_args.lora_target_parameters
    return LoraConfig(task_type=model_args.lora_task_type, r=model_args.lora_r,
                      target_modules=model_args.lora_target_modules, lora_alpha=model_args.lora_alpha,
                      lora_dropout=model_args.lora_dropout, bias="none", use_rslora=model_args.use_rslora,
                      use_dora=model_args.use_dora, modules_to_save=model_args.lora_modules_to_save, **extra)


def get_quantization_config(model_args: ModelConfig) -> None:
    """None without load_in_4bit or load_in_8bit, as TRL's; with either, one line: the quantized loading TRL does
    through bitsandbytes is not supported here."""
    asked = [name for name in ("load_in_4bit", "load_in_8bit") if getattr(model_args, name)]
    if asked:
        raise UserError(f"ModelConfig.{asked[0]}: quantized models are not supported (bitsandbytes is not used "
                        "here); remove it, load the model in bfloat16 (dtype: bfloat16) and train a LoRA adapter "
                        "(use_peft: true)")
    return None


def get_kbit_device_map() -> dict[str, int] | None:
    """Where a quantized model's weights go, as older TRL versions named it: this process's GPU, or None without
    one (on CPU, and accelerate places an unquantized model itself)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from accelerate import PartialState

    return {"": PartialState().local_process_index}
