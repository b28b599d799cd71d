"""Reward specs: turn (prompt, completion, row columns) into one float per completion.

Interface: `compute_reward(prompts, completions, **columns) -> list[float]`.
The trainer calls `score(prompts, completions, columns, step)`, which also returns named components for logging
(`rewards/<name>`) and refuses bad output (an exception, the wrong length, None, NaN, inf) with a one-line
UserError naming the component, the step and the row (the checks are `specs/reward_checks.py`). The trainer
passes the dataset row's columns plus `completion_has_eos` (bool per completion: the completion ended with the
stop token).

Reward functions in TRL's form (a list with weights, None, async) are `specs/reward_functions.py`; a reward served
over HTTP is `specs/remote_reward.py`; built-in verifiable rewards (answer accuracy, format, overlong) are
`specs/verifiable.py`.

Built-in text metrics (length ratio, EOS, novelty, Jaccard, edit distance, embedding similarity, regex,
sentiment) live in `training_wizard.specs.text_metrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from training_wizard.errors import UserError
from training_wizard.spec import Spec, import_object, resolve_path
from training_wizard.specs.reward_checks import RewardError, check_rewards, guarded_call


@dataclass
class FunctionLogs:
    """What reward functions in TRL's form logged while scoring one batch, through the `log_extra` and
    `log_metric` callables TRL 1.16 passes them. `columns`: extra columns of the sample table, one value per
    completion (TRL's completions table); `metrics`: scalar metrics by the name given, each value one call (the
    trainer logs their mean, as TRL averages them per logging step)."""

    columns: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def log_extra(self, column: str, values: list[Any]) -> None:
        self.columns.setdefault(column, []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(name, []).append(float(value))


class RewardSpec(Spec):
    """Base class: subclasses implement `compute_reward`; composite rewards also override `compute_components`."""

    # True: the trainer also passes `templated_prompts` (the prompt as the model saw it, chat template and special
    # tokens included) and `raw_completions` (special tokens kept, the stop token included) among the columns.
    needs_raw_text: ClassVar[bool] = False

    # True: the trainer also passes `completion_ids` (each completion's token ids, stop token included, no padding)
    # and `dataset_prompts` (each row's `prompt` as the dataset holds it: a string or a message list; None for a
    # pre-tokenised row) among the columns.
    needs_trl_inputs: ClassVar[bool] = False

    def uses_raw_text(self) -> bool:
        """Whether this reward (or any reward inside it) needs the raw-text columns."""
        return self.needs_raw_text

    def uses_trl_inputs(self) -> bool:
        """Whether this reward (or any reward inside it) needs `completion_ids` and `dataset_prompts`."""
        return self.needs_trl_inputs

    @classmethod
    def default_spec_class_for(cls, data: dict[str, Any]) -> str | None:
        """A `[reward]` table without `spec_class` is a RewardFunctionsSpec when it has `reward_funcs` (TRL's keys),
        and a reward model (ModelRewardSpec) when it has `pretrained_name` (as TRL's reward_model_path names one)."""
        if cls is RewardSpec and "reward_funcs" in data:
            return "training_wizard.specs.reward_functions.RewardFunctionsSpec"
        if cls is RewardSpec and "pretrained_name" in data:
            return "training_wizard.specs.reward.ModelRewardSpec"
        return super().default_spec_class_for(data)

    @model_validator(mode="after")
    def _not_abstract(self) -> RewardSpec:
        if type(self) is RewardSpec:
            raise ValueError("spec_class is required: name a RewardSpec subclass, e.g. "
                             "'training_wizard.specs.reward.FunctionRewardSpec'")
        return self

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        raise NotImplementedError

    def score_logging(
        self,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list[Any]],
        logs: FunctionLogs,
        step: int = 0,
        label: str | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """`score`, adding what the reward's functions log (`log_extra`, `log_metric`) to `logs`, which belongs to
        this call alone: the async producer thread and the training thread (sample probes, evaluation) score with
        one spec at once, so the spec keeps no logs of its own. The trainer adds the columns to the sample table
        and the metrics to metrics.jsonl. A reward whose class does not override it logs nothing."""
        return self.score(prompts, completions, columns, step, label)

    def compute_components(
        self, prompts: list[str], completions: list[str], **columns: Any
    ) -> tuple[list[float], dict[str, list[float]]]:
        """(total per completion, {component name: values}); a single reward has no components."""
        return self.compute_reward(prompts, completions, **columns), {}

    def score(
        self,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list[Any]],
        step: int = 0,
        label: str | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """Validated `compute_components`: the trainer's entry point. `label` names this reward in errors."""
        label = label or type(self).__name__
        total, components = guarded_call(
            lambda p, c, cols: self.compute_components(p, c, **cols), prompts, completions, columns, label, step
        )
        total = check_rewards(total, len(completions), label, step)
        components = {k: check_rewards(v, len(completions), f"{label}.{k}", step) for k, v in components.items()}
        return total, components


class FunctionRewardSpec(RewardSpec):
    """Wrap a plain function `fn(prompts, completions, **columns) -> list[float]` named as 'pkg.mod:fn'."""

    function: str = Field(description="Import path of the reward function, 'package.module:function'.")

    @field_validator("function")
    @classmethod
    def _importable_now(cls, function: str) -> str:
        """Import the function when the recipe loads, so --dry-run catches a typo before any model loads."""
        resolve_function(function, raising=ValueError)
        return function

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return self._function()(prompts, completions, **columns)

    def _function(self) -> Callable[..., list[float]]:
        return resolve_function(self.function, raising=UserError, key="reward.function: ")


def resolve_function(path: str, raising: type[Exception], key: str = "") -> Callable[..., list[float]]:
    """The callable 'package.module:function' names; `raising(message)` when it is malformed, missing or not
    callable (ValueError while a recipe validates, so the error names the key; UserError at run time)."""
    module_name, colon, name = path.partition(":")
    if not colon or not module_name or not name:
        raise raising(f"{key}'{path}' is not of the form 'package.module:function'")
    try:
        fn = import_object(path)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's path being wrong
        raise raising(f"{key}'{path}' could not be imported ({type(exc).__name__}: {exc})") from None
    if not callable(fn):
        raise raising(f"{key}'{path}' is not callable")
    return fn


class CallableRewardSpec(RewardSpec):
    """A Python callable passed straight to the trainer (Python API only, not from a recipe file)."""

    model_config = RewardSpec.model_config | {"arbitrary_types_allowed": True}
    fn: Any = Field(description="The callable.")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return self.fn(prompts, completions, **columns)


# --------------------------------------------------------------------------------------------------------------
# A reward model


class ModelRewardSpec(RewardSpec):
    """A sequence classifier as reward model, with its own tokenizer (it may differ from the policy's).

    Each completion is scored on `input_template` filled with `prompt`, `completion` and the row's columns;
    inputs are right-padded so a batch scores the same as one row at a time. Loaded lazily, once.
    """

    pretrained_name: str = Field(
        description="Local folder (or cached hub id) of an AutoModelForSequenceClassification checkpoint."
    )
    tokenizer_name: str | None = Field(None, description="Tokenizer folder; default: pretrained_name.")
    input_template: str = Field(
        "{prompt}{completion}", description="Text the classifier reads: fields prompt, completion, row columns."
    )
    batch_size: int = Field(8, gt=0, description="Completions per forward pass.")
    max_length: int = Field(512, gt=0, description="Truncate inputs to this many reward-tokenizer tokens.")
    label_index: int | None = Field(
        None, ge=0, description="Logit used as the reward; required when the classifier has several labels."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights' dtype.")
    device: str | None = Field(None, description="'cpu', 'cuda', ...; default: the current CUDA device, else CPU.")
    trust_remote_code: bool = Field(False, description="Allow custom model code from the checkpoint folder.")

    _model: Any = PrivateAttr(None)
    _tokenizer: Any = PrivateAttr(None)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **fields: Any) -> ModelRewardSpec:
        """Use an already-built model and tokenizer (Python API, tests); `fields` set the other keys."""
        spec = cls(**{"pretrained_name": "<in memory>", **fields})
        spec._model, spec._tokenizer = model.eval(), tokenizer
        return spec

    def load(self) -> tuple[Any, Any]:
        """(model, tokenizer), loaded on first use from safetensors only."""
        if self._model is None:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            folder = _model_path(self.pretrained_name)
            tokenizer_folder = _model_path(self.tokenizer_name) if self.tokenizer_name else folder
            try:
                tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, trust_remote_code=self.trust_remote_code)
                model = AutoModelForSequenceClassification.from_pretrained(
                    folder, use_safetensors=True, dtype=getattr(torch, self.dtype),
                    trust_remote_code=self.trust_remote_code,
                )
            except Exception as exc:  # noqa: BLE001 - a wrong folder or a .bin-only checkpoint
                raise UserError(f"reward.pretrained_name: could not load '{self.pretrained_name}' "
                                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
            self._model, self._tokenizer = model.eval(), tokenizer
        return self._model, self._tokenizer

    def shares_vocabulary(self, tokenizer: Any) -> bool:
        """True when this reward model reads the same token ids as `tokenizer` (the policy's): only then can it
        start PPO's value model, which reads the policy's tokens."""
        return self.load()[1].get_vocab() == tokenizer.get_vocab()

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        import torch

        model, tokenizer = self.load()
        device = self._device(model)
        texts = [self._render(p, c, columns, row) for row, (p, c) in enumerate(zip(prompts, completions))]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if model.config.pad_token_id is None:
            model.config.pad_token_id = pad_id
        batch_size = self.batch_size if pad_id is not None else 1
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                chunk = texts[start : start + batch_size]
                enc = [tokenizer(t, truncation=True, max_length=self.max_length)["input_ids"] for t in chunk]
                width = max(len(ids) for ids in enc)
                # Right padding keeps each real token's position, so batched == one row at a time.
                ids = torch.tensor([x + [pad_id] * (width - len(x)) for x in enc], device=device)
                mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in enc], device=device)
                logits = model(input_ids=ids, attention_mask=mask).logits.float()
                out.extend(self._select(logits).tolist())
        return out

    def _render(self, prompt: str, completion: str, columns: dict[str, list[Any]], row: int) -> str:
        fields = {k: v[row] for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) > row}
        fields.update(prompt=prompt, completion=completion)
        try:
            return self.input_template.format_map(fields)
        except (KeyError, AttributeError, IndexError, ValueError) as exc:
            raise UserError(f"input_template: cannot fill row {row} ({type(exc).__name__}: {exc}); fields: "
                            f"{', '.join(fields)}") from None

    def _select(self, logits: Any) -> Any:
        if self.label_index is not None:
            if self.label_index >= logits.shape[-1]:
                raise UserError(f"label_index {self.label_index}: the classifier has {logits.shape[-1]} labels")
            return logits[:, self.label_index]
        if logits.shape[-1] != 1:
            raise UserError(f"the classifier has {logits.shape[-1]} labels: set label_index")
        return logits[:, 0]

    def _device(self, model: Any) -> Any:
        import torch

        if self.device is not None:
            target = torch.device(self.device)
        elif torch.cuda.is_available():
            target = torch.device("cuda", torch.cuda.current_device())
        else:
            target = torch.device("cpu")
        if next(model.parameters()).device != target:
            model.to(target)
        return target


def _model_path(name: str | None) -> str:
    path = resolve_path(name or "")
    return str(path) if Path(path).exists() else str(name)


# --------------------------------------------------------------------------------------------------------------
# Several rewards combined


class RewardComponent(Spec):
    """One named part of a MultiRewardSpec: a reward spec, its weight, and whether to standardize it."""

    spec: RewardSpec = Field(description="Any reward spec (set its spec_class).")
    weight: float = Field(1.0, description="Weight in the combination (must be > 0 for product/geometric_mean).")
    normalize: bool = Field(False, description="Standardize over the scored batch: (x - mean) / (std + 1e-8).")

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.pop("spec_class")  # a plain table in the recipe, not a swappable spec
        return data


class MultiRewardSpec(RewardSpec):
    """Named components combined into one reward; each is logged as `rewards/<name>` (its raw value).

    With weights w_i and (optionally normalized) values r_i per completion:
      sum: sum_i w_i r_i;  mean: sum_i w_i r_i / sum_i w_i;  product: prod_i r_i ** w_i;
      geometric_mean: exp(sum_i w_i ln max(r_i, epsilon) / sum_i w_i)  (a negative r_i is an error).
    """

    components: dict[str, RewardComponent] = Field(min_length=1, description="name -> {spec, weight, normalize}.")
    strategy: Literal["sum", "mean", "product", "geometric_mean"] = Field("sum", description="How to combine.")
    epsilon: float = Field(
        1e-6, gt=0, description="geometric_mean: values in [0, epsilon) count as epsilon, so a zero stays finite."
    )

    @model_validator(mode="after")
    def _check_weights(self) -> MultiRewardSpec:
        for name, component in self.components.items():
            if self.strategy in ("product", "geometric_mean") and component.weight <= 0:
                raise ValueError(f"components.{name}.weight: must be > 0 with strategy '{self.strategy}'")
            if self.strategy == "geometric_mean" and component.normalize:
                raise ValueError(f"components.{name}.normalize: normalized values can be negative; "
                                 "geometric_mean needs positive values")
        if self.strategy == "mean" and sum(c.weight for c in self.components.values()) == 0:
            raise ValueError("components: weights sum to 0, strategy 'mean' divides by their sum")
        return self

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return self.compute_components(prompts, completions, **columns)[0]

    def uses_raw_text(self) -> bool:
        return any(component.spec.uses_raw_text() for component in self.components.values())

    def uses_trl_inputs(self) -> bool:
        return any(component.spec.uses_trl_inputs() for component in self.components.values())

    def compute_components(
        self, prompts: list[str], completions: list[str], **columns: Any
    ) -> tuple[list[float], dict[str, list[float]]]:
        return self.score(prompts, completions, columns)

    def score(
        self,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list[Any]],
        step: int = 0,
        label: str | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        return self.score_at(prompts, completions, columns, step, label, path=(), logs=FunctionLogs())

    def score_logging(self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]],
                      logs: FunctionLogs, step: int = 0, label: str | None = None
                      ) -> tuple[list[float], dict[str, list[float]]]:
        return self.score_at(prompts, completions, columns, step, label, path=(), logs=logs)

    def score_at(
        self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]], step: int,
        label: str | None, path: tuple[str, ...], logs: FunctionLogs,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """`score` for the MultiRewardSpec at `path` inside an outer one (() at the top): errors name the
        component by its dotted path, e.g. component 'quality.novelty'. What every component logs goes to `logs`."""
        logged: dict[str, list[float]] = {}
        parts: list[tuple[str, float, list[float]]] = []
        for name, component in self.components.items():
            full = ".".join((*path, name))
            if isinstance(component.spec, MultiRewardSpec):
                values, nested = component.spec.score_at(prompts, completions, columns, step,
                                                         f"component '{full}'", (*path, name), logs)
            else:
                values, nested = component.spec.score_logging(prompts, completions, columns, logs, step,
                                                              label=f"component '{full}'")
            logged[name] = values
            logged.update({f"{name}.{k}": v for k, v in nested.items()})
            parts.append((full, component.weight, standardize(values) if component.normalize else values))
        total = [self._combine([(n, w, v[row]) for n, w, v in parts], row, step) for row in range(len(completions))]
        return check_rewards(total, len(completions), label or type(self).__name__, step), logged

    def _combine(self, parts: list[tuple[str, float, float]], row: int, step: int) -> float:
        if self.strategy == "sum":
            return sum(w * r for _, w, r in parts)
        if self.strategy == "mean":
            return sum(w * r for _, w, r in parts) / sum(w for _, w, _ in parts)
        if self.strategy == "product":
            return math.prod(_power(r, w, n, row, step) for n, w, r in parts)
        for name, _, value in parts:
            if value < 0:
                raise RewardError(f"reward component '{name}' at step {step}, row {row}: value {value} is negative; "
                                  "strategy geometric_mean needs values >= 0")
        logs = sum(w * math.log(max(r, self.epsilon)) for _, w, r in parts)
        return math.exp(logs / sum(w for _, w, _ in parts))


def _power(value: float, weight: float, name: str, row: int, step: int) -> float:
    if weight == 1:
        return value
    if value < 0:
        raise RewardError(f"reward component '{name}' at step {step}, row {row}: value {value} is negative; "
                        f"strategy product with weight {weight} needs values >= 0")
    return value**weight


def standardize(values: list[float], eps: float = 1e-8) -> list[float]:
    """(x - mean) / (std + eps) over the batch, population std; a constant batch gives zeros.

    A component's `normalize`: over the completions one process scores (a reward spec never sees other
    processes), on plain lists. The trainer's batch statistics are `core.advantages.whiten` (unbiased variance,
    over all processes); the two are different on purpose and documented in docs/algorithms.md.
    """
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + eps) for v in values]
