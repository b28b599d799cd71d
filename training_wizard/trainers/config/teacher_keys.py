"""The on-policy option of a teacher beside an RL algorithm (trainers/loop/teacher.py; docs/algorithms.md, "On-policy
distillation"). 0, the default, is the run without a teacher, exactly."""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat

from training_wizard.trainers.config.run import RunConfig, aliases


class TeacherOptions(RunConfig):
    """How much a teacher's per-token term weighs in an RL algorithm's reward."""

    distillation_coef: NonNegativeFloat = Field(
        0.0, description="With a [teacher_model] (Python: teacher_model=), subtract distillation_coef x the sum over "
        "each completion's loss tokens of the sampled-token reverse KL estimate log p_policy - log p_teacher from "
        "its score, before the algorithm shapes it (on-policy distillation beside the task reward; slime's "
        "opd_kl_coef, accepted as an alias). Logged as distill/reverse_kl, distill/teacher_logprob and "
        "distill/student_logprob. 0: no teacher term.", validation_alias=aliases("distillation_coef", "opd_kl_coef"))

    @property
    def teacher_logprobs_in_rollout(self) -> bool:
        """Whether the rollout runs the teacher's logprob pass (trainers/loop/teacher.py)."""
        return self.distillation_coef > 0.0
