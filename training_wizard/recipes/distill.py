"""The on-policy distillation recipe: `recipe_class = "distill"` (or "training_wizard.recipes.distill.DistillRecipe").

The lifecycle (load, plan, resume, train, save) is `OnPolicyRecipe.main` in recipes/on_policy.py; this file names
the `[teacher_model]` and `[training]` tables, checks at start (and on --dry-run) that the teacher can load and
shares the student's tokenizer, and builds the `DistillationTrainer`.
"""

from __future__ import annotations

import json

from pydantic import Field, model_validator

from training_wizard.errors import UserError
from training_wizard.recipes.on_policy import OnPolicyRecipe
from training_wizard.rollout.asynchronous import with_async
from training_wizard.specs.model import TransformerSpec
from training_wizard.specs.reward import RewardSpec
from training_wizard.trainers.algorithms.distill import DistillationTrainer
from training_wizard.trl.configs import DistillationConfig

# [training] keys of TRL's Python constructor whose recipe form is the [teacher_model] table
TEACHER_KEYS = ("teacher_model_name_or_path", "teacher_model_init_kwargs", "teacher_model_revision")


class DistillRecipe(OnPolicyRecipe):
    """Student, teacher, prompt data and training arguments of one on-policy distillation run."""

    teacher_model: TransformerSpec = Field(
        description="The teacher (hub id, local folder, or a LoRA run's saved model/ folder: its base with the "
        "adapter merged in). Frozen, loaded once, sharded like a reference; its tokenizer must be the student's.")
    reward: RewardSpec | None = Field(
        None, description="Optional: scored and logged (objective/scores, rewards/*), not trained on; the teacher "
        "is the training signal.")
    training: DistillationConfig = Field(default_factory=DistillationConfig, description="DistillationConfig "
                                         "options.")
    trainer_class = DistillationTrainer

    @model_validator(mode="after")
    def _something_scores(self) -> DistillRecipe:
        """The teacher scores every token: no [reward] is needed. TRL's teacher keys have a table here."""
        for key in TEACHER_KEYS:
            if getattr(self.training, key) is not None:
                raise ValueError(f"training.{key}: a recipe names its teacher in a [teacher_model] table "
                                 "(pretrained_name, revision, trust_remote_code, ...)")
        if self.training.model_init_kwargs is not None:
            raise ValueError("training.model_init_kwargs: a recipe sets these in [model] and [training] dtype")
        self.teacher_model._key = "teacher_model"  # its errors name [teacher_model], not [model]
        return self

    def build_trainer(self, config, tokenizer, train_rows, eval_rows, accelerator):
        """The student (LoRA applied) and the teacher (with the student's tokenizer: the same pad id and
        embedding size), and the `DistillationTrainer` of them."""
        policy = self.model.apply_lora(self.model.load_causal_lm(config.dtype))
        teacher = self.teacher_model.load_causal_lm(config.dtype, tokenizer)
        return DistillationTrainer(config=config, tokenizer=tokenizer, policy=policy, teacher_model=teacher,
                                   reward_model=self.reward, train_dataset=train_rows, eval_dataset=eval_rows,
                                   accelerator=accelerator, source_wrapper=with_async, **self.environment_factory())

    def check_can_start(self, config, accelerator, console, train_rows=None) -> None:
        """The shared checks, then the teacher's: its folder holds a loadable model and its tokenizer is the
        student's (one line naming [teacher_model] otherwise)."""
        super().check_can_start(config, accelerator, console, train_rows)
        check_teacher_loadable(self.teacher_model)
        check_same_tokenizer(self.model, self.teacher_model)


def check_teacher_loadable(spec: TransformerSpec) -> None:
    """The teacher's folder is a model folder with safetensors weights, or a LoRA adapter folder whose base model
    resolves (what `load_causal_lm` reads), without loading any weights."""
    folder = spec.resolved_path()
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base:
            raise UserError(f"teacher_model.pretrained_name: '{folder}' is a LoRA adapter without "
                            "base_model_name_or_path")
        base_spec = spec.model_copy(update={"pretrained_name": base, "lora": None})
        base_spec._key = spec._key
        return check_teacher_loadable(base_spec)
    if not (folder / "config.json").is_file():
        raise UserError(f"teacher_model.pretrained_name: folder '{folder}' has no config.json; expected a Hugging "
                        "Face model folder or a LoRA run's model/ folder")
    if not any(folder.glob("*.safetensors")):
        raise UserError(f"teacher_model.pretrained_name: folder '{folder}' has no *.safetensors weights; "
                        "training-wizard loads safetensors only")


def check_same_tokenizer(student: TransformerSpec, teacher: TransformerSpec) -> None:
    """The divergence compares the two models token by token: the teacher's vocabulary (tokens and their ids) must
    be the student's."""
    mine, theirs = student.load_tokenizer().get_vocab(), teacher.load_tokenizer().get_vocab()
    if mine != theirs:
        differ = sorted({token for token, index in (set(mine.items()) ^ set(theirs.items()))})
        raise UserError(f"teacher_model: its tokenizer is not the student's ([model]): {len(theirs)} tokens against "
                        f"{len(mine)}, {len(differ)} token(s) missing or with another id (e.g. {differ[:3]}); "
                        "distillation needs the student's tokenizer")
