"""Generate docs/configuration.md from the spec classes, so each default and description lives once, on its field.

`.venv/bin/python scripts/docgen.py > docs/configuration.md`; a test checks the file is current. The last section
is docs/trl_options.md (the hand-written map of TRL's GRPO and RLOO options), included with its headings one level
down: that file stays the one place to edit it. It lives outside the package because no run needs it.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

from pydantic import AliasChoices
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
# The checkout this script sits in documents its own package, whichever checkout an editable install points at.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

INTRO = """\
# Configuration reference

Generated from the spec classes by `.venv/bin/python scripts/docgen.py > docs/configuration.md`; do not edit by
hand. Every table rejects unknown keys. `spec_class = "package.module.Class"` in a table selects a subclass of
the table's spec type. Aliases are the newer TRL names, accepted on input.
"""


def _sections() -> list[tuple[str, str, list[type]]]:
    from training_wizard.recipes.distill import DistillRecipe
    from training_wizard.recipes.grpo import GRPORecipe
    from training_wizard.recipes.classification import SequenceClassificationRecipe
    from training_wizard.recipes.ppo import PPORecipe
    from training_wizard.recipes.reward_model import RewardModelRecipe
    from training_wizard.recipes.rloo import RLOORecipe
    from training_wizard.recipes.sft import SFTRecipe
    from training_wizard.envs import reasoning_gym
    from training_wizard.specs import (
        dataset, environment, model, remote_reward, reward, reward_functions, text_metrics, verifiable,
    )
    from training_wizard.trainers.supervised.config import RewardConfig, SequenceClassificationConfig, SFTConfig
    from training_wizard.trl.configs import DistillationConfig, GRPOConfig, PPOConfig, RLOOConfig, RLOORecipeConfig

    def subclasses(module, base) -> list[type]:
        found = [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                 if issubclass(obj, base) and obj.__module__ == module.__name__]
        return sorted(found, key=lambda cls: (cls is not base, cls.__name__))

    def python_api_only_excluded(classes: list[type]) -> list[type]:
        # RewardObjectsSpec holds callables, which no recipe file can name: it is the Python API's alone
        return [cls for cls in classes if cls is not reward_functions.RewardObjectsSpec]

    return [
        ("Recipe (top level)", "The keys outside any table, plus the tables below. `recipe_class = \"rloo\"`, "
         "`\"ppo\"` or `\"grpo\"`; the PPO recipe adds `[value_model]`.", [RLOORecipe, PPORecipe, GRPORecipe]),
        ("[model], [ref_model], [value_model]", "", [model.TransformerSpec, model.LoraSpec]),
        ("[training]", "The RLOO recipe uses `RLOORecipeConfig` (the defaults of training-wizard 1.0's RLOO example "
         "README); the Python API's `RLOOConfig` has TRL's. The PPO recipe and the Python API use `PPOConfig` "
         "(TRL's PPOv2 defaults); the GRPO recipe and the Python API `GRPOConfig` (TRL 1.x's GRPO defaults). "
         "docs/trl_options.md maps every TRL 1.x GRPO and RLOO option.",
         [RLOORecipeConfig, RLOOConfig, PPOConfig, GRPOConfig]),
        ("On-policy distillation: `recipe_class = \"distill\"`", "The student (`[model]`, LoRA or full) samples, "
         "the `[teacher_model]` (a TransformerSpec: a hub id, a folder, or a LoRA run's saved model/ folder) scores "
         "the same tokens; `[dataset]` holds prompt rows, `[reward]` is optional (logged, not trained on). Its "
         "`[training]` table is `DistillationConfig` (TRL 1.16's names and defaults; docs/algorithms.md, "
         "\"On-policy distillation\").", [DistillRecipe, DistillationConfig]),
        ("Supervised stages: `recipe_class = \"sft\"` and `\"reward_model\"`", "The recipes of the stages before "
         "online RL (docs/pipeline.md): their top-level keys, then their `[training]` tables. `[model]` and the "
         "data tables are the specs above. `recipe_class = \"sequence_classification\"` (what training-wizard "
         "1.0's sequence classification recipes become) runs on the same loop.",
         [SFTRecipe, SFTConfig, RewardModelRecipe, RewardConfig, SequenceClassificationRecipe,
          SequenceClassificationConfig]),
        ("[dataset], [eval_dataset]", "`ReasoningGymDataSpec` needs the `envs` extra (docs/environments.md).",
         [*subclasses(dataset, dataset.DataSourceSpec), reasoning_gym.ReasoningGymDataSpec]),
        ("[environment]", "Episodes of several turns (docs/environments.md), limits included; `[training]` keys "
         "of the same names (TRL's) are their aliases, and a limit set in both places must agree.",
         [environment.EnvironmentSpec]),
        ("[reward]", "A `[reward]` table with `reward_funcs` and no `spec_class` is a `RewardFunctionsSpec` (TRL's "
         "form).", [*subclasses(reward, reward.RewardSpec), *python_api_only_excluded(subclasses(reward_functions, reward.RewardSpec)),
                   *subclasses(verifiable, reward.RewardSpec), *subclasses(remote_reward, reward.RewardSpec),
                   *subclasses(text_metrics, reward.RewardSpec), reasoning_gym.ReasoningGymRewardSpec]),
    ]


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if hasattr(value, "model_dump"):
        return "(table)"
    return f"`{value!r}`".replace("|", "\\|")


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    for noise in ("training_wizard.specs.dataset.", "training_wizard.specs.reward.", "training_wizard.specs.model.",
                  "annotated_types.", "pydantic.types."):
        text = text.replace(noise, "")
    return text.replace("|", "\\|")


def render_class(cls) -> str:
    lines = [f"### `{cls.__name__}`", ""]
    doc = inspect.getdoc(cls)
    if doc:
        lines += [doc.splitlines()[0], ""]
    lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in cls.model_fields.items():
        aliases = ""
        if isinstance(field.validation_alias, AliasChoices):
            others = [a for a in field.validation_alias.choices if a != name]
            aliases = f" (alias: {', '.join(f'`{a}`' for a in others)})" if others else ""
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{name}`{aliases} | {_type(field.annotation)} | {_default(field)} | {description} |")
    return "\n".join(lines) + "\n"


TRL_OPTIONS = ROOT / "docs" / "trl_options.md"


def trl_options_section(path: Path = TRL_OPTIONS) -> str:
    """docs/trl_options.md as this document's last section: every heading one level down, and a line naming the
    file to edit. Empty where the file is absent."""
    if not path.is_file():
        return ""
    lines = path.read_text().rstrip("\n").splitlines()
    shifted = ["#" + line if line.startswith("#") else line for line in lines]
    shifted.insert(1, "\nIncluded from `docs/trl_options.md`; edit that file, then regenerate this one.")
    return "\n" + "\n".join(shifted) + "\n"


def render() -> str:
    parts = [INTRO]
    for title, note, classes in _sections():
        parts.append(f"\n## {title}\n")
        if note:
            parts.append(note + "\n")
        for cls in classes:
            parts.append("\n" + render_class(cls))
    parts.append(trl_options_section())
    return "".join(parts)


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
