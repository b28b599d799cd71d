"""GRPOTrainer, RLOOTrainer and DistillationTrainer with TRL 1.16's constructors: the classes `training_wizard` exports.

Each takes TRL's arguments (`model=`, `reward_funcs=`, `args=`, `processing_class=`, `callbacks=`,
`peft_config=`, ...) or the native trainer's older ones (`config=`, `tokenizer=`, `policy=`, `reward_model=`,
`ref_policy=`, `accelerator=`, and the rollout sources), translates them (trl/arguments.py) and builds the native
trainer (trainers/algorithms/grpo.py, trainers/algorithms/rloo.py) through its one keyword-only constructor. It is that trainer with
the methods of TRL's trainers that scripts call (trl/callbacks.py, trl/results.py).
"""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator

from training_wizard.rollout.asynchronous import with_async
from training_wizard.trainers.algorithms import distill, grpo, ppo, rloo
from training_wizard.trl.arguments import load_teacher, trainer_arguments
from training_wizard.trl.callbacks import TRLTrainerMethods
from training_wizard.trl.configs import DistillationConfig, GRPOConfig, RLOOConfig

# TRL's constructor arguments, whichever of them a trainer's signature names; the others are the older form's.
TRL_ARGUMENTS = ("model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class",
                 "reward_processing_classes", "callbacks", "optimizers", "quantization_config", "peft_config",
                 "tools", "rollout_func", "environment_factory")


def split_arguments(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TRL's arguments, the older ones) of a facade's constructor call, `given` its parameters (`sources` the
    extra keywords): a TRL argument counts as TRL's whether the signature names it or it came in `sources`."""
    everything = {name: value for name, value in given.items() if name not in ("self", "sources")}
    everything.update(given.get("sources") or {})
    trl = {name: everything.pop(name) for name in TRL_ARGUMENTS if name in everything}
    return trl, everything


class TRLTrainer(TRLTrainerMethods):
    """Mixed in before a native trainer: its constructor's arguments read in either form."""

    def build_from(self, config_class: type, suffix: str, given: dict[str, Any]) -> None:
        """Build the native trainer of `given` (a facade's parameters), then attach TRL's callbacks."""
        resolved = trainer_arguments(config_class, suffix, *split_arguments(given))
        callbacks = resolved.pop("callbacks")
        resolved.setdefault("source_wrapper", with_async)  # async_rollouts: batches sampled ahead
        super().__init__(**resolved)
        self.attach_callbacks(callbacks)


class GRPOTrainer(TRLTrainer, grpo.GRPOTrainer):
    """GRPO (trainers/algorithms/grpo.py) built from TRL's arguments or the older ones.

    TRL 1.16's arguments: `GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
    eval_dataset=..., processing_class=..., reward_processing_classes=..., callbacks=..., peft_config=...,
    tools=..., environment_factory=...)`, then `.train()` (trl/arguments.py, docs/porting_from_trl.md).
    The older ones: `GRPOTrainer(config=GRPOConfig(...), tokenizer=..., policy=..., reward_model=...,
    train_dataset=..., ref_policy=..., eval_dataset=...)`; `reward_model` is as for RLOOTrainer (a sequence
    classifier, a RewardSpec or a callable). With beta = 0 (the default) no reference is used and `ref_policy` is
    ignored; with beta > 0 and no `ref_policy`, a LoRA policy's base (adapter disabled) or a frozen copy of the
    starting policy is the reference.
    """

    def __init__(self, model=None, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), quantization_config=None, peft_config=None, tools=None, rollout_func=None,
                 environment_factory=None, *, config: GRPOConfig | None = None, tokenizer=None, policy=None,
                 reward_model=None, ref_policy=None, accelerator: Accelerator | None = None, **sources):
        """TRL's arguments or the older ones (not the same one both ways); `sources`: `generation_backend`,
        `rollout_source` and `episode_settings`, as for every trainer (trainers/loop/on_policy.py)."""
        self.build_from(GRPOConfig, "GRPO", locals())


class RLOOTrainer(TRLTrainer, rloo.RLOOTrainer):
    """RLOO (trainers/algorithms/rloo.py) built from TRL's arguments or the older ones.

    TRL 1.16's arguments: `RLOOTrainer(model=..., reward_funcs=..., args=RLOOConfig(...), train_dataset=...,
    eval_dataset=..., processing_class=..., reward_processing_classes=..., callbacks=..., peft_config=...)`, then
    `.train()` (trl/arguments.py, docs/porting_from_trl.md). The older ones: `RLOOTrainer(
    config=RLOOConfig(...), tokenizer=..., policy=..., ref_policy=..., reward_model=..., train_dataset=...,
    eval_dataset=...)`; `reward_model` is a sequence classifier sharing the policy's tokenizer, a RewardSpec, or a
    callable `fn(prompts, completions, **columns) -> list[float]`. Without `ref_policy`, a LoRA policy uses itself
    with the adapter disabled as the reference, and a full policy a frozen copy of its starting weights.
    """

    def __init__(self, model=None, reward_funcs=None, args: RLOOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), quantization_config=None, peft_config=None, *,
                 config: RLOOConfig | None = None, tokenizer=None, policy=None, reward_model=None, ref_policy=None,
                 accelerator: Accelerator | None = None, **sources):
        """TRL's arguments or the older ones (not the same one both ways); `sources`: `generation_backend`,
        `rollout_source`, and `environment_factory`, `tools` and `episode_settings` for episodes, as for every
        trainer (trainers/loop/on_policy.py)."""
        self.build_from(RLOOConfig, "RLOO", locals())


class PPOTrainer(ppo.PPOTrainer):
    """PPO (trainers/algorithms/ppo.py) as `training_wizard` exports it: the native constructor (`config=`, `tokenizer=`,
    `policy=`, `reward_model=`, `train_dataset=`, `ref_policy=`, `value_model=`, `eval_dataset=`, `accelerator=`,
    and the rollout sources), with the async_rollouts schedule as GRPO's and RLOO's."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("source_wrapper", with_async)  # async_rollouts: batches sampled ahead
        super().__init__(*args, **kwargs)


class DistillationTrainer(TRLTrainer, distill.DistillationTrainer):
    """On-policy distillation (trainers/algorithms/distill.py) built from TRL 1.16's arguments or the native ones.

    TRL's: `DistillationTrainer(model=..., teacher_model=..., args=DistillationConfig(...), train_dataset=...,
    eval_dataset=..., processing_class=..., callbacks=..., peft_config=..., tools=...)`, then `.train()`.
    `teacher_model` is a model object or a folder / cached Hub id, loaded with `args.teacher_model_init_kwargs`
    (and `args.teacher_model_revision`) as `model` is with `model_init_kwargs`; without it,
    `args.teacher_model_name_or_path`. The native ones: `DistillationTrainer(config=..., tokenizer=..., policy=...,
    teacher_model=..., train_dataset=..., reward_model=None, ...)`.
    """

    def __init__(self, model=None, teacher_model=None, args: DistillationConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, callbacks=None, optimizers=(None, None),
                 quantization_config=None, peft_config=None, tools=None, *, config: DistillationConfig | None = None,
                 tokenizer=None, policy=None, reward_model=None, accelerator: Accelerator | None = None, **sources):
        """TRL's arguments or the native ones (not the same one both ways); `sources`: `generation_backend`,
        `rollout_source`, `environment_factory` and `episode_settings`, as for every trainer."""
        given = dict(locals())
        given.pop("teacher_model")
        given.pop("__class__", None)
        resolved = trainer_arguments(DistillationConfig, "Distillation",
                                     *split_arguments({**given, "reward_model": reward_model or distill.no_reward}))
        resolved["teacher_model"] = load_teacher(teacher_model, resolved["config"], resolved["tokenizer"])
        callbacks = resolved.pop("callbacks")
        resolved.setdefault("source_wrapper", with_async)
        distill.DistillationTrainer.__init__(self, **resolved)
        self.attach_callbacks(callbacks)
