"""The paraphrase reward of the examples: keep the meaning, change the words, keep the length, stop when done.

Use it from a recipe with `[reward] spec_class = "examples.rloo.reward_spec.ParaphraseRewardSpec"`; the source
sentence is the dataset row's `text` column.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from training_wizard.specs.reward import RewardSpec
from training_wizard.specs.text_metrics import (
    EmbeddingSimilarityRewardSpec,
    EosRewardSpec,
    LengthRatioRewardSpec,
    NoveltyRewardSpec,
)


class ParaphraseRewardSpec(RewardSpec):
    """reward = similarity x (copy_floor + novelty) + length_weight x length + eos_weight x eos.

    - `similarity`: cosine similarity of all-MiniLM-L6-v2 embeddings, completion vs source (meaning kept).
    - `novelty`: 1 - chrF / 100 against the source (wording changed): 0 for a verbatim copy.
    - `length`: min(L/T, T/L), T the source length in characters; `eos`: 1 if the completion ended with the stop
      token.

    Meaning and new wording are multiplied, so neither pays alone: a weighted sum let the policy collect the
    similarity term by copying the source (a copy scored 1.5, more than most rewrites). The `copy_floor` keeps a
    faithful copy above an unrelated sentence (similarity about 0.1, however novel), so the order is: a faithful
    rewrite > a copy > an unrelated sentence (tested on real sentences). Each part is logged as `rewards/<name>`.
    """

    copy_floor: float = Field(0.3, ge=0.0, description="What a copy (novelty 0) earns per unit of similarity.")
    length_weight: float = Field(0.25, ge=0.0, description="Weight of the length term.")
    eos_weight: float = Field(0.25, ge=0.0, description="Weight of the stop-token term.")
    source_column: str = Field("text", description="Row column holding the source sentence.")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return self.compute_components(prompts, completions, **columns)[0]

    def compute_components(
        self, prompts: list[str], completions: list[str], **columns: Any
    ) -> tuple[list[float], dict[str, list[float]]]:
        source = {"source_column": self.source_column}
        parts = {
            "similarity": EmbeddingSimilarityRewardSpec(**source).compute_reward(prompts, completions, **columns),
            "novelty": NoveltyRewardSpec(metric="chrf", **source).compute_reward(prompts, completions, **columns),
            "length": LengthRatioRewardSpec(**source).compute_reward(prompts, completions, **columns),
            "eos": EosRewardSpec().compute_reward(prompts, completions, **columns),
        }
        total = [
            sim * (self.copy_floor + new) + self.length_weight * length + self.eos_weight * eos
            for sim, new, length, eos in zip(parts["similarity"], parts["novelty"], parts["length"], parts["eos"])
        ]
        return total, parts
