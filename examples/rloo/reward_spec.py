"""The paraphrase reward of the RLOO example (as in training-wizard 1.0's RLOO example): several text metrics go into one training signal.

Use it from a recipe with `[reward] spec_class = "examples.rloo.reward_spec.ParaphraseRewardSpec"`; the source
sentence is the dataset row's `text` column.
"""

from __future__ import annotations

from pydantic import Field

from training_wizard.specs.reward import MultiRewardSpec, RewardComponent
from training_wizard.specs.text_metrics import (
    EmbeddingSimilarityRewardSpec,
    EosRewardSpec,
    LengthRatioRewardSpec,
    NoveltyRewardSpec,
)


def paraphrase_components() -> dict[str, RewardComponent]:
    """similarity 1.0, novelty 0.5, length 0.25, eos 0.25 (summed; see ParaphraseRewardSpec)."""
    return {
        "similarity": RewardComponent(spec=EmbeddingSimilarityRewardSpec(source_column="text"), weight=1.0),
        "novelty": RewardComponent(spec=NoveltyRewardSpec(source_column="text", metric="chrf"), weight=0.5),
        "length": RewardComponent(spec=LengthRatioRewardSpec(source_column="text", target_ratio=1.0), weight=0.25),
        "eos": RewardComponent(spec=EosRewardSpec(), weight=0.25),
    }


class ParaphraseRewardSpec(MultiRewardSpec):
    """Reward a paraphrase of the row's `text`: same meaning, different words, similar length, finished.

    Components (weighted sum, each logged as `rewards/<name>`):

    - `similarity` (weight 1.0): cosine similarity of all-MiniLM-L6-v2 embeddings, completion vs source: the
      meaning is kept. The main term, so that an unrelated sentence never wins.
    - `novelty` (weight 0.5): 1 - chrF / 100 against the source: the wording changed. A verbatim copy scores 0
      here, so it loses to a good paraphrase (e.g. similarity 0.9 + novelty 0.6 * 0.5 > 1.0 + 0).
    - `length` (weight 0.25): min(L/T, T/L) with T the source length in characters: no rambling, no truncation.
    - `eos` (weight 0.25): 1 if the completion ended with the stop token (trainer column `completion_has_eos`).

    Range: about -0.25 .. 2.0. One step on 16 completions costs one MiniLM forward pass over at most 16 + 16
    sentences plus chrF: well under a second on two CPU cores (the encoder loads once, ~10 s).
    `strategy` can be changed from the recipe; a `[reward.components...]` table replaces the whole default set.
    """

    components: dict[str, RewardComponent] = Field(
        default_factory=paraphrase_components, description="name -> {spec, weight, normalize}."
    )
