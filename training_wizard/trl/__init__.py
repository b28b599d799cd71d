"""TRL's script helpers under their names: TrlParser, ScriptArguments, ModelConfig, get_peft_config,
get_quantization_config, get_kbit_device_map (also importable from `training_wizard`, as from `trl`), and the
`training-wizard grpo|rloo|sft|reward --config x.yaml` commands built on them (trl/commands.py)."""

from training_wizard.trl.parser import TrlParser
from training_wizard.trl.script_arguments import (
    ModelConfig,
    ScriptArguments,
    get_kbit_device_map,
    get_peft_config,
    get_quantization_config,
)

__all__ = ["ModelConfig", "ScriptArguments", "TrlParser", "get_kbit_device_map", "get_peft_config",
           "get_quantization_config"]
