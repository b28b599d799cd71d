"""The on-policy distillation recipe: `recipe_class = "distill"` (or "training_wizard.recipes.distill.DistillRecipe").

The lifecycle (load, plan, resume, train, save) is `OnPolicyRecipe.main` in recipes/on_policy.py; this file names
the `[teacher_model]` and `[training]` tables, checks at start (and on --dry-run) that the teacher can load and
shares the student's tokenizer (recipes/teacher.py, as for any recipe with a teacher), and builds the
`DistillationTrainer`.
"""

from __future__ import annotations

from pydantic import Field, model_validator

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
    def _teacher_with_its_coefficient(self) -> DistillRecipe:
        """The teacher is the loss here: no distillation_coef (DistillationConfig refuses one)."""
        return self

    @model_validator(mode="after")
    def _something_scores(self) -> DistillRecipe:
        """The teacher scores every token: no [reward] is needed. TRL's teacher keys have a table here."""
        for key in TEACHER_KEYS:
            if getattr(self.training, key) is not None:
                raise ValueError(f"training.{key}: a recipe names its teacher in a [teacher_model] table "
                                 "(pretrained_name, revision, trust_remote_code, ...)")
        if self.training.model_init_kwargs is not None:
            raise ValueError("training.model_init_kwargs: a recipe sets these in [model] and [training] dtype")
        return self

    def build_trainer(self, config, tokenizer, train_rows, eval_rows, accelerator):
        """The student (LoRA applied) and the teacher (with the student's tokenizer: the same pad id and
        embedding size), and the `DistillationTrainer` of them."""
        policy = self.model.apply_lora(self.model.load_causal_lm(config.dtype))
        return DistillationTrainer(config=config, tokenizer=tokenizer, policy=policy, reward_model=self.reward,
                                   train_dataset=train_rows, eval_dataset=eval_rows, accelerator=accelerator,
                                   source_wrapper=with_async, **self.environment_factory(),
                                   **self.teacher_arguments(config, tokenizer))

