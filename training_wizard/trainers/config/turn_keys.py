"""The on-policy options of credit per turn in episodes of several turns (core/turn_credit.py; docs/algorithms.md,
"Credit per turn"). "episode" is the one credit of every row, as before these options existed."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from training_wizard.trainers.config.run import RunConfig


class TurnCreditOptions(RunConfig):
    """How an episode's reward is credited to its turns (model replies); refused at the start where the algorithm
    or another option cannot honour it."""

    # the modes the algorithm computes ("gae" needs PPO's critic; the group baselines need RLOO's or GRPO's groups)
    supported_turn_credit: ClassVar[tuple[str, ...]] = ("episode", "discounted_return", "turn_baseline")

    turn_credit: Literal["episode", "discounted_return", "turn_baseline", "gae"] = Field(
        "episode", description='How an episode\'s reward reaches its turns. "episode": every model token gets the '
        'row\'s one advantage (single replies always do). "discounted_return" (RLOO, GRPO): turn k\'s tokens get '
        "its discounted return from k on (the environment's step rewards; the last turn also the rest of the "
        'score) minus the group\'s mean whole-episode return. "turn_baseline" (RLOO, GRPO): the same return minus '
        "the group's mean return at turn k (an episode that ended before k counted by its last turn's). \"gae\" "
        "(PPO): each turn's reward at its last model token in the per-token rewards, then GAE as usual. RLOO's "
        "baselines leave the row out, GRPO's take the whole group (then scale_rewards as usual).")
    turn_gamma: float = Field(
        1.0, ge=0.0, le=1.0, description="Discount per turn of discounted_return and turn_baseline (PPO's gae "
        "discounts per token with gamma instead); 1.0: undiscounted.")

    @model_validator(mode="after")
    def _turn_credit_supported(self) -> TurnCreditOptions:
        name = self.turn_credit
        if name not in self.supported_turn_credit:
            algorithm = type(self).__name__.removesuffix("RecipeConfig").removesuffix("Config")
            hint = ('; use "gae" (the value model\'s per-token credit)' if "gae" in self.supported_turn_credit
                    else '; "gae" needs a critic (PPO): use "discounted_return" or "turn_baseline"')
            raise ValueError(f"turn_credit = {name!r} is not supported by {algorithm}{hint}")
        if self.turn_gamma != 1.0 and name not in ("discounted_return", "turn_baseline"):
            raise ValueError(f"turn_gamma discounts the turn returns of discounted_return and turn_baseline; "
                             f"turn_credit = {name!r} does not read it (leave it at 1.0)")
        for option in self.turn_credit_conflicts():
            raise ValueError(f"turn_credit = {name!r} cannot honour {option}; use turn_credit = \"episode\" with it")
        return self

    def turn_credit_conflicts(self) -> list[str]:
        """The options set that the turn modes' advantages cannot honour: RLOO's token-level KL (its own per-token
        reward-to-go) and its transforms of the whole scores (normalize_reward, whiten_rewards, a (min, max)
        reward_clip_range), which the per-turn rewards would escape."""
        if self.turn_credit not in ("discounted_return", "turn_baseline"):
            return []
        conflicts = [name for name in ("token_level_kl", "normalize_reward", "whiten_rewards")
                     if getattr(self, name, False)]
        if isinstance(getattr(self, "reward_clip_range", None), (tuple, list)):
            conflicts.append("a (min, max) reward_clip_range")
        return conflicts
