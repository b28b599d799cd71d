"""training-wizard: online RL (RLOO, PPO, GRPO) for Hugging Face causal language models from one TOML recipe.

Heavy imports (torch, transformers) happen on first use, so `training-wizard --help` stays fast.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "RLOOConfig": "training_wizard.trl.configs",
    "RLOOTrainer": "training_wizard.trl.trainers",
    "PPOConfig": "training_wizard.trl.configs",
    "PPOTrainer": "training_wizard.trl.trainers",
    "GRPOConfig": "training_wizard.trl.configs",
    "GRPOTrainer": "training_wizard.trl.trainers",
    "DistillationConfig": "training_wizard.trl.configs",
    "DistillationTrainer": "training_wizard.trl.trainers",
    "SFTConfig": "training_wizard.trainers.supervised.config",
    "SFTTrainer": "training_wizard.trainers.supervised.sft",
    "RewardConfig": "training_wizard.trainers.supervised.config",
    "RewardModelTrainer": "training_wizard.trainers.supervised.reward_model",
    "load_recipe": "training_wizard.recipes.base",
    "TrlParser": "training_wizard.trl.parser",
    "ScriptArguments": "training_wizard.trl.script_arguments",
    "ModelConfig": "training_wizard.trl.script_arguments",
    "get_peft_config": "training_wizard.trl.script_arguments",
    "get_quantization_config": "training_wizard.trl.script_arguments",
    "get_kbit_device_map": "training_wizard.trl.script_arguments",
}

__all__ = ["RLOOConfig", "RLOOTrainer", "PPOConfig", "PPOTrainer", "GRPOConfig", "GRPOTrainer", "DistillationConfig",
           "DistillationTrainer", "SFTConfig", "SFTTrainer", "RewardConfig", "RewardModelTrainer", "load_recipe", "TrlParser", "ScriptArguments",
           "ModelConfig", "get_peft_config", "get_quantization_config", "get_kbit_device_map", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'training_wizard' has no attribute {name!r}")
