"""The TRL port: what lets code and files written for TRL 1.x run here, over the native trainers and configs, which
never import it.

- trl/trainers.py: `GRPOTrainer`, `RLOOTrainer` and `DistillationTrainer` with TRL's constructors (and the older arguments), building
  the native trainers of trainers/algorithms/grpo.py and trainers/algorithms/rloo.py (trl/arguments.py translates the arguments);
- trl/configs.py: the public `GRPOConfig`, `RLOOConfig`, `PPOConfig`, `DistillationConfig` (and the RLOO recipe's), which read TRL's
  keys through trl/keys.py's table; recipes use them for their [training] tables;
- trl/callbacks.py, trl/results.py: transformers' callbacks and the Trainer methods scripts call after train();
- TRL's script helpers under their names: TrlParser, ScriptArguments, ModelConfig, get_peft_config,
  get_quantization_config, get_kbit_device_map (also importable from `training_wizard`, as from `trl`), and the
  `training-wizard grpo|rloo|sft|reward --config x.yaml` commands built on them (trl/commands.py).
"""

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
