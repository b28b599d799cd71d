"""Training-wizard 1.0's GRPO recipe (`training_wizard.recipes.grpo.GRPOTrainingSpec`), read as today's "grpo".

1.0 ran TRL's GRPOTrainer with TRL's GRPOConfig as `training_args_spec`, a list of 1.0 reward classes in
`reward_specs` and an optional `sample_rate`; translators.py does the models, data and shared training
keys, and docs/migrating.md lists what each key becomes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training_wizard.errors import UserError
from training_wizard.legacy.translation import Translation, check_top_keys
from training_wizard.legacy.translators import (
    IGNORED_TRAINING_ARGS, translate_dataset, translate_model, translate_reward, translate_training,
    translate_validation,
)

_GRPO_TOP = ("transformer_spec", "dataset_spec", "reward_specs", "training_args_spec", "validation", "callbacks_spec",
             "sample_rate", "mlflow_experiment_name")
_GRPO_IGNORED = {
    **IGNORED_TRAINING_ARGS,
    "max_prompt_length": "prompts are not truncated (use dataset.filter_length to drop long ones)",
    "log_completions": "a sample table is printed num_sample_generations times per run",
    "num_completions_to_print": "a 1.0 recipe keeps today's sample tables (set training.num_completions_to_print "
                                "in a recipe of today's form to choose their rows)",
    "disable_dropout": "dropout is always off in policy and reference",
    "shuffle_dataset": "prompts are always shuffled",
}


def _grpo_same() -> set[str]:
    """The TRL GRPOConfig keys our GRPOConfig reads as they are: its field names and their TRL aliases (report_to
    and the run's folder and seed are translated by `translate_training`)."""
    from pydantic import AliasChoices

    from training_wizard.trl.configs import GRPOConfig

    names = set()
    for name, info in GRPOConfig.model_fields.items():
        names.add(name)
        if isinstance(info.validation_alias, AliasChoices):
            names.update(a for a in info.validation_alias.choices if isinstance(a, str))
    # bf16 / fp16 kept their 1.0 translation (the weights' dtype), so a 1.0 recipe trains as it did; the Python
    # constructor's model_init_kwargs and reward_weights have [model] and [reward] counterparts in a recipe
    return names - {"report_to", "output_dir", "seed", "bf16", "fp16", "model_init_kwargs", "reward_weights"}


def translate_grpo(data: dict[str, Any], path: Path | str, out: Translation) -> Translation:
    """1.0's GRPO recipe -> "grpo": TRL's GRPOConfig keys go to [training] (our GRPOConfig takes TRL's names), the
    `reward_specs` list to one reward (several: a MultiRewardSpec summing them, as TRL sums its reward functions)."""
    out.note("spec_class", "recipe_class", "the GRPO recipe")
    check_top_keys(data, path, "GRPO", _GRPO_TOP, ("transformer_spec", "dataset_spec", "reward_specs"))
    out.recipe["model"] = translate_model(data["transformer_spec"], "transformer_spec", "model", out)
    out.recipe["dataset"] = translate_dataset(data["dataset_spec"], "dataset_spec", "dataset", out)
    training_args = dict(data.get("training_args_spec", {}))
    weights = training_args.pop("reward_weights", None)
    # max_steps: TRL's optimizer steps, which training.max_steps reads with TRL's meaning
    translate_training(training_args, out, _grpo_same(), _GRPO_IGNORED, reads_max_steps=True)
    out.recipe["reward"] = _grpo_rewards(data["reward_specs"], weights, path, out)
    sample_rate = data.get("sample_rate", 100)
    if "sample_rate" in data and sample_rate == 0:
        out.recipe["training"]["num_sample_generations"] = 0
        out.note("sample_rate", "training.num_sample_generations", "0: no sample tables")
    elif "sample_rate" in data:
        out.note("sample_rate", None, "a sample table is printed num_sample_generations times per run, not every "
                 "sample_rate steps")
    if "mlflow_experiment_name" in data:
        out.note("mlflow_experiment_name", None, "no MLflow tracker: metrics.jsonl always, training.report_to for "
                 "TensorBoard, W&B or trackio")
    if "callbacks_spec" in data:
        out.note("callbacks_spec", None, "no early stopping: the run trains its full length")
    if "validation" in data:
        translate_validation(data["validation"], out)
    return out


def _grpo_rewards(specs: Any, weights: Any, path: Path | str, out: Translation) -> dict[str, Any]:
    if not isinstance(specs, list) or not specs or not all(isinstance(spec, dict) for spec in specs):
        raise UserError(f"{path}: reward_specs: expected a list of reward tables ([[reward_specs]])")
    if weights is not None and len(weights) != len(specs):
        raise UserError(f"{path}: training_args_spec.reward_weights: {len(weights)} weights for {len(specs)} "
                        "reward_specs")
    rewards = [translate_reward(spec, f"reward_specs[{i}]", out, raw_text=False) for i, spec in enumerate(specs)]
    if len(rewards) == 1 and weights in (None, [1], [1.0]):
        if weights is not None:
            out.note("training_args_spec.reward_weights", None, "one reward of weight 1")
        return rewards[0]
    if weights is not None:
        out.note("training_args_spec.reward_weights", "reward.components.*.weight")
    components = {f"{i}_{spec['spec_class'].rsplit('.', 1)[-1]}": {"spec": reward, "weight": weight}
                  for i, (spec, reward, weight) in enumerate(zip(specs, rewards, weights or [1.0] * len(rewards)))}
    out.note("reward_specs", "reward.components", "summed with their weights, as TRL sums its reward functions")
    return {"spec_class": "training_wizard.specs.reward.MultiRewardSpec", "components": components, "strategy": "sum"}
