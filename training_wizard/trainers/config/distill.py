"""The on-policy distillation config (trainers/algorithms/distill.py): TRL 1.16's DistillationConfig names and
defaults (`beta`, `temperature`, `max_completion_length`, `teacher_model_name_or_path`, ...), plus the choice of
loss form. Its own module: trainers/config/on_policy.py is near the 450-line limit."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from training_wizard.trainers.config.on_policy import OnPolicyConfig
from training_wizard.trainers.config.run import aliases

# The sampled-token forms and the KL estimator each one uses (core/distillation.py: sampled_token_reverse_kl).
SAMPLED_ESTIMATORS = {"sampled_k1": "k1", "sampled_k3": "k3"}


class DistillationConfig(OnPolicyConfig):
    """On-policy distillation options, with TRL 1.16's DistillationConfig names and defaults.

    "On-Policy Distillation of Language Models" (Agarwal et al. 2024); docs/algorithms.md, "On-policy distillation".
    The student samples one completion per prompt, the teacher scores the same tokens, and the student is trained
    on the divergence over the tokens of its loss mask only: TRL's generalized JSD over the full vocabulary
    (`distillation_loss = "jsd"`, `beta` interpolating forward and reverse KL), or the per-token reverse KL estimate
    of the sampled tokens as a dense reward (`"sampled_k1"`, `"sampled_k3"`: veRL's and slime's form), which needs
    only the teacher's logprob of each sampled token. No reward and no reference model are needed.
    """

    supported_turn_credit: ClassVar[tuple[str, ...]] = ("episode",)  # the divergence is per token already

    beta: float = Field(
        1.0, ge=0.0, le=1.0,
        description="Interpolation of TRL's generalized JSD (distillation_loss = \"jsd\"): 0 is the forward KL(teacher "
        "|| student), 1 the reverse KL(student || teacher), 0.5 the JSD. Unlike GRPO's beta, no KL to a reference.")
    distillation_loss: Literal["jsd", "sampled_k1", "sampled_k3"] = Field(
        "jsd",
        description='"jsd": TRL\'s generalized JSD over the full vocabulary, from the student\'s and the teacher\'s '
        "logits of each micro-batch (the teacher runs one no-grad pass per micro-batch). \"sampled_k1\" / "
        "\"sampled_k3\": the per-token estimate of KL(student || teacher) at the sampled tokens (k1 = log p_s - "
        "log p_t; k3 = exp(-k1) - 1 + k1, veRL's low_var_kl) as a negative dense reward, trained with the clipped "
        "per-token policy gradient; the teacher's logprobs come from one no-grad pass in the rollout, and no "
        "(tokens x vocabulary) tensor of the teacher is held.")
    kl_coef: NonNegativeFloat = Field(
        0.0, le=0.0, description="No KL to a reference in distillation (TRL's beta is the JSD's interpolation "
        "here); must stay 0.", validation_alias=aliases("kl_coef"))
    # -- TRL's defaults where they differ from the shared ones --------------------------------------------------
    num_ppo_epochs: PositiveInt = Field(
        1, description="Passes over each rollout batch (TRL: num_iterations). 1 with one mini-batch: every update "
        "sees its own samples (on-policy).", validation_alias=aliases("num_ppo_epochs", "num_iterations"))
    learning_rate: PositiveFloat = Field(1e-6, description="Peak AdamW learning rate (TRL's default).")
    response_length: PositiveInt = Field(
        512, description="Maximum new tokens per completion (TRL name: max_completion_length; GKD's "
        "max_new_tokens).", validation_alias=aliases("response_length", "max_completion_length", "max_new_tokens"))
    temperature: PositiveFloat = Field(
        1.0, description="Sampling temperature; both distributions of the divergence use it too (TRL).")
    # -- the teacher, as TRL's Python constructor reads it (a recipe uses its [teacher_model] table) ------------
    teacher_model_name_or_path: str | None = Field(
        None, description="TRL's teacher to load when the Python constructor's teacher_model= is not given (a hub "
        "id or folder). Python API only: a recipe uses its [teacher_model] table.")
    teacher_model_init_kwargs: dict[str, Any] | None = Field(
        None, description="TRL's keywords for loading the teacher (dtype, revision, trust_remote_code, "
        "attn_implementation). Python API only: a recipe sets them in [teacher_model].")
    teacher_model_revision: str | None = Field(None, description="TRL's hub revision of the teacher. Python API "
                                               "only: a recipe sets [teacher_model] revision.")

    @model_validator(mode="after")
    def _distillation_options(self) -> DistillationConfig:
        if self.whiten_rewards:
            raise ValueError("whiten_rewards is an RLOO/PPO option; distillation has no scalar reward to whiten")
        if self.distillation_coef != 0.0:
            raise ValueError("distillation_coef adds a teacher's term to an RL algorithm's reward; distillation's "
                             "loss is the teacher's divergence already (distillation_loss), leave it at 0")
        return self

    def group_size(self) -> int:
        return 1  # TRL's DistillationTrainer samples one completion per prompt

    @property
    def uses_reference(self) -> bool:
        return False

    @property
    def teacher_logprobs_in_rollout(self) -> bool:
        return self.sampled_estimator is not None  # the JSD runs the teacher per micro-batch in the update instead

    @property
    def sampled_estimator(self) -> str | None:
        """The KL estimator of a sampled-token form ("k1", "k3"); None for the full-vocabulary JSD."""
        return SAMPLED_ESTIMATORS.get(self.distillation_loss)
