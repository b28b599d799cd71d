"""TRL's `reward_funcs` given as Python objects (the trainers' TRL-form constructor): functions and reward models
in one RewardFunctionsSpec, so they are called, weighted, checked and logged as the recipe's `reward_funcs` are.

- A function is called TRL-style by keyword (specs/reward_functions.py) and logged under its `__name__`.
- A reward model (a sequence classifier with one output, as a folder, a cached Hub id or a model object) becomes a
  `ModelRewardFunction`: it scores the text TRL's trainers give a reward model (the prompt followed by the
  completion; a conversation through the reward tokenizer's chat template) with a ModelRewardSpec, and is logged
  under its folder's base name, as TRL names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import Field, field_validator

from training_wizard.errors import UserError
from training_wizard.specs.reward import ModelRewardSpec
from training_wizard.specs.reward_functions import RewardFunctionsSpec, unique_names


class RewardObjectsSpec(RewardFunctionsSpec):
    """RewardFunctionsSpec over callables rather than import paths (Python API only, not from a recipe file)."""

    model_config = RewardFunctionsSpec.model_config | {"arbitrary_types_allowed": True}

    reward_funcs: list[Any] = Field(min_length=1, description="The reward functions, each a TRL-form callable.")

    @field_validator("reward_funcs")
    @classmethod
    def _importable_now(cls, functions: list[Any]) -> list[Any]:  # replaces the parent's import check
        for index, fn in enumerate(functions):
            if not callable(fn):
                raise ValueError(f"reward_funcs[{index}]: expected a callable, got {type(fn).__name__}")
        return functions

    def functions(self) -> dict[str, Callable[..., Any]]:
        return unique_names([(getattr(fn, "__name__", None) or type(fn).__name__, fn) for fn in self.reward_funcs])


class ModelRewardFunction:
    """A reward model as a TRL-form reward function: one float per completion."""

    def __init__(self, spec: ModelRewardSpec, name: str):
        self.spec = spec
        self.__name__ = name

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        texts = [self.render(prompt, completion) for prompt, completion in zip(prompts, completions)]
        return self.spec.compute_reward(texts, [""] * len(texts))

    def render(self, prompt: Any, completion: Any) -> str:
        """Plain rows: prompt + completion. Conversations: the messages through the reward tokenizer's template."""
        if not isinstance(prompt, list):
            return f"{prompt}{completion}"
        tokenizer = self.spec.load()[1]
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(f"reward_funcs: reward model '{self.__name__}' has no chat template for the "
                            "conversational prompts; give its tokenizer one (reward_processing_classes)")
        return tokenizer.apply_chat_template(prompt + completion, tokenize=False)


def model_reward_function(model: Any, tokenizer: Any, dtype: str | None, trust_remote_code: bool
                          ) -> ModelRewardFunction:
    """A ModelRewardFunction for `model`: a folder or cached Hub id (loaded now, safetensors only, in `dtype`:
    "float32", "bfloat16" or "float16"), or a model object; `tokenizer` replaces the model's own (default: loaded
    from its folder or `name_or_path`). A tokenizer without a pad token pads with EOS, as TRL's trainers do."""
    if isinstance(model, str):
        spec = ModelRewardSpec(pretrained_name=model, trust_remote_code=trust_remote_code,
                               **({"dtype": dtype} if dtype is not None else {}))
        model, own_tokenizer = spec.load()
        name = spec.pretrained_name
    else:
        name = getattr(model.config, "name_or_path", None) or type(model).__name__
        own_tokenizer = tokenizer if tokenizer is not None else reward_tokenizer(name, trust_remote_code)
    tokenizer = tokenizer if tokenizer is not None else own_tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    spec = ModelRewardSpec.from_model(model, tokenizer, trust_remote_code=trust_remote_code)
    return ModelRewardFunction(spec, Path(str(name).rstrip("/")).name)


def reward_tokenizer(name: str, trust_remote_code: bool) -> Any:
    """The tokenizer saved beside a reward model object's weights (its `name_or_path`), never downloaded."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError):
        raise UserError(f"reward_processing_classes: no tokenizer found for the reward model '{name}'; pass its "
                        "tokenizer in reward_processing_classes") from None
