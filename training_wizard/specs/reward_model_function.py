"""A reward model as a TRL-form reward function: TRL's trainers take a reward model's id or object in
`reward_funcs`, and so do the trainers' TRL-form constructor (specs/reward_functions.py: RewardObjectsSpec) and a recipe's
`reward_funcs` (specs/reward_functions.py). It scores the text TRL's trainers give a reward model: the prompt
followed by the completion, or a conversation through the reward tokenizer's chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training_wizard.errors import UserError
from training_wizard.specs.chat_rendering import render_chat
from training_wizard.specs.reward import ModelRewardSpec


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
        return render_chat(tokenizer, prompt + completion, tokenize=False)


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
