"""The rollout collector: steps 2-5 of an iteration (numbered in `trainers/loop/on_policy.py`) for a batch of prompt rows.

  2. sample completions with the policy                      rollout/backends.py (decode loop or vLLM)
  3. truncate at the stop token and mask what follows         core/masking.py
  4. logprobs of the policy ("old") and the reference         rollout/scoring.py, + any extra per-token pass
  5. score with the reward (+ missing_eos_penalty)            specs/reward.py or a sequence classifier

`collect` returns a complete, immutable `TrajectoryBatch`. Another algorithm adds per-token passes over the same
(prompt, completion) batch through `extra_passes` (PPO's value model: `{"values": fn}`) without editing this file.

A rollout source is anything with `collect(request: RolloutRequest) -> TrajectoryBatch` (`RolloutSource`): the
trainer asks its source for each iteration's batch and reads nothing else of it. `RolloutCollector` is the
single-turn source; a source of episodes of several turns samples its own way and hands its token batch to
`RolloutCollector.complete` for the logprob passes and the scores.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import torch

from training_wizard.collectives import Collectives
from training_wizard.errors import UserError
from training_wizard.timeouts import StoppedWhileWaiting, call_with_timeout
from training_wizard.rollout.backends import Completions, DecodeLoopBackend, GenerationBackend, sample_completions
from training_wizard.rollout.generation import GenerationParams
from training_wizard.rollout.prompts import EncodedPrompts, RolloutRequest
from training_wizard.rollout.trajectory import StopReason, TrajectoryBatch
from training_wizard.rollout.sampling import SamplingFilters
from training_wizard.rollout.scoring import batched_logprobs, classifier_scores, content_columns, forward_chunks
from training_wizard.sharding import unwrap_model
from training_wizard.specs.reward import FunctionLogs

# fn(prompt_ids (B, P), prompt_mask (B, P), responses (B, T)) -> (B, T) float32, run without gradients.
# (prompt_ids, prompt_mask, completion_ids, completion_mask) -> (B, T)
ExtraPass = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingSettings:
    """What the collector needs from the training config."""

    response_length: int
    temperature: float
    stop_token_ids: tuple[int, ...]  # a completion ends at the first of any; () = no stop token
    pad_token_id: int
    forward_batch_size: int  # local_rollout_forward_batch_size
    missing_eos_penalty: float | None = None  # subtracted from the score of a completion without the stop token
    score_without_stop: float | None = None  # PPO's non_eos_penalty: such a completion's score is replaced by this
    gather_weights_for_generation: bool = True  # ds3_gather_for_generation
    logprobs_from_sampling: bool = False  # the policy's logprobs from the sampling pass, not a second forward pass
    share_prompts: bool = True  # a prompt's samples share one pass over it (trainers/loop/setup.py decides)
    head_logprobs: bool = True  # logprobs from the final hidden states, no whole logits (trainers/loop/setup.py decides)
    padding_free: bool = False  # every pass over completions packs its rows into one sequence (rollout/packing.py)
    filters: SamplingFilters | None = None  # top_k, top_p, min_p, repetition_penalty
    reference_logprobs: bool = True  # False (GRPO with beta 0): no reference pass; ref_logprobs are the policy's
    reward_timeout: float = float("inf")  # seconds a reward spec may take to score one batch (timeouts.py)
    max_tokens_per_forward: int | None = None  # max_tokens_per_micro_batch: no-grad passes chunked by tokens


class RolloutSource(Protocol):
    """Anything that turns a request into a complete trajectory batch (rollout/trajectory.py)."""

    def collect(self, request: RolloutRequest) -> TrajectoryBatch: ...


@dataclass(frozen=True)
class Sampled:
    """The token tensors of a sampled batch, before the logprob passes and scoring (shapes as in
    `TrajectoryBatch`). `sampling_logprobs`: the sampler's logprobs, 0 outside the loss mask; None if it gave none.
    `seconds`: the time sampling took."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor
    stop_reason: torch.Tensor
    sampling_logprobs: torch.Tensor | None
    seconds: float = 0.0
    turn_index: torch.Tensor | None = None  # (B, T) long, as TrajectoryBatch.turn_index; None: one reply per row

    @property
    def has_stop(self) -> torch.Tensor:
        """(B,) bool, as `TrajectoryBatch.has_stop`: the row was not cut off by the length budget."""
        return self.stop_reason != StopReason.LENGTH

    @classmethod
    def single_replies(cls, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                       mask: torch.Tensor, has_stop: torch.Tensor, sampling_logprobs: torch.Tensor | None,
                       seconds: float) -> Sampled:
        """One reply per row: every real token was sampled (the loss mask is the completion mask), and a row's
        stop reason is STOP_TOKEN where `has_stop` ((B,) bool) says it ended with a stop token, else LENGTH."""
        stop_reason = torch.where(has_stop, int(StopReason.STOP_TOKEN), int(StopReason.LENGTH)).long()
        return cls(prompt_ids, prompt_mask, completion_ids, mask, mask, stop_reason, sampling_logprobs, seconds)


@dataclass(frozen=True)
class EpisodeScoring:
    """What a source of several turns gives scoring: the text each row's reward scores (the model's last
    reply), more reward columns (e.g. the whole episode as `transcript`), and the environment's rewards by
    component name, (B,) each."""

    texts: list[str]
    columns: dict[str, list[Any]]
    rewards: dict[str, list[float]]
    stats: dict[str, list[float]] = field(default_factory=dict)  # TrajectoryBatch.episode_stats
    turn_rewards: list[list[float]] = field(default_factory=list)  # each row's step reward per reply, one per reply


@dataclass(frozen=True)
class LogprobPasses:
    """The no-grad per-token passes over a sampled batch, (B, T) each, and the seconds they took."""

    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    extras: dict[str, torch.Tensor]
    seconds: float


@dataclass(frozen=True)
class RolloutModel:
    """The model the no-grad rollout passes use, the context to run them in, and whether its weights are sharded
    (then every forward pass is a collective, so every process must run the same number of them)."""

    model: torch.nn.Module
    context: Any
    sharded: bool


def rollout_model(accelerator, policy: torch.nn.Module, gather_weights: bool) -> RolloutModel:
    """Plain data parallel: the unwrapped model. DeepSpeed ZeRO-3 with `ds3_gather_for_generation`: the unwrapped
    model inside `GatheredParameters`. ZeRO-3 without it, and FSDP: the sharded model itself, whose forward passes
    gather weights layer by layer."""
    state = accelerator.state
    unwrapped = unwrap_model(accelerator, policy)
    plugin = getattr(state, "deepspeed_plugin", None)
    if plugin is not None and plugin.zero_stage == 3:
        if gather_weights:
            import deepspeed

            return RolloutModel(unwrapped, deepspeed.zero.GatheredParameters(list(policy.parameters())), False)
        return RolloutModel(unwrapped, contextlib.nullcontext(), True)
    if getattr(state, "fsdp_plugin", None) is not None:
        return RolloutModel(policy, contextlib.nullcontext(), True)
    return RolloutModel(unwrapped, contextlib.nullcontext(), False)


class RolloutCollector:
    """Samples, masks, computes logprobs and scores one batch of prompt rows on this process.

    policy: the (accelerate-prepared) policy; ref_policy: a frozen reference, or None to use the policy with its
    LoRA adapter disabled; reward: a sequence classifier sharing the policy's tokenizer, or a RewardSpec;
    backend: what samples the completions (rollout/backends.py; default the built-in decode loop).
    """

    def __init__(
        self,
        *,
        accelerator,
        collectives: Collectives,
        tokenizer,
        settings: SamplingSettings,
        policy: torch.nn.Module,
        ref_policy: torch.nn.Module | None,
        reward,
        extra_passes: Mapping[str, ExtraPass] | None = None,
        backend: GenerationBackend | None = None,
    ):
        self.accelerator = accelerator
        self.collectives = collectives
        self.tokenizer = tokenizer
        self.settings = settings
        self.policy = policy
        self.ref_policy = ref_policy
        self.reward = reward
        self.extra_passes = dict(extra_passes or {})
        self.backend = backend if backend is not None else DecodeLoopBackend(settings.forward_batch_size)

    def collect(self, request: RolloutRequest) -> TrajectoryBatch:
        """A complete TrajectoryBatch of one reply per row. A stop signal while the reward runs raises
        `StoppedWhileWaiting` on every process."""
        with self.rollout_engine() as engine:
            sampled = self.sample(engine, request)
            passes = self.logprob_passes(engine, sampled)
        return self.complete(request, sampled, passes)

    @contextlib.contextmanager
    def rollout_engine(self):
        """The model the no-grad rollout passes use (`RolloutModel`), in eval mode, inside its context and the
        accelerator's autocast: accelerate's mixed precision autocasts the prepared policy's forward only; the
        reference and a reward model run under the same autocast, so that policy and reference agree exactly while
        they are equal."""
        engine = rollout_model(self.accelerator, self.policy, self.settings.gather_weights_for_generation)
        engine.model.eval()  # no dropout either way; eval lets the KV cache work under gradient checkpointing
        with engine.context, self.accelerator.autocast():
            yield engine

    def sample(self, engine: RolloutModel, request: RolloutRequest) -> Sampled:
        """One reply per row from the generation backend, truncated after its first stop token."""
        settings, pad = self.settings, self.settings.pad_token_id
        started = time.perf_counter()
        prompt_ids, prompt_mask = (t.to(self.accelerator.device) for t in request.prompts.left_pad(request.rows, pad))
        completions = self._sample(engine, prompt_ids, prompt_mask, request.seeds)
        responses, mask, has_stop = completions.responses, completions.mask, completions.has_stop
        if not settings.stop_token_ids and self.tokenizer.eos_token_id is not None:
            has_stop = (responses == self.tokenizer.eos_token_id).any(-1)
        return Sampled.single_replies(prompt_ids, prompt_mask, responses, mask, has_stop,
                                      completions.sampling_logprobs, time.perf_counter() - started)

    def logprob_passes(self, engine: RolloutModel, sampled: Sampled) -> LogprobPasses:
        """The no-grad per-token passes over a sampled batch: the policy's logprobs (or the sampler's, under
        logprobs_from_sampling), the reference's, and the extra passes. Run inside `rollout_engine()`."""
        settings = self.settings
        started = time.perf_counter()
        prompt_ids, prompt_mask = sampled.prompt_ids, sampled.prompt_mask
        responses, mask = sampled.completion_ids, sampled.completion_mask
        if settings.logprobs_from_sampling:
            logprobs = sampled.sampling_logprobs
        else:
            logprobs = self.logprobs_of(engine.model, prompt_ids, prompt_mask, responses, mask)
        ref_logprobs = (self._reference_logprobs(engine.model, prompt_ids, prompt_mask, responses, mask)
                        if settings.reference_logprobs else logprobs)  # no reference: KL exactly 0
        extras = {name: self._extra_pass(run, prompt_ids, prompt_mask, responses, mask)
                  for name, run in self.extra_passes.items()}
        return LogprobPasses(logprobs, ref_logprobs, extras, time.perf_counter() - started)

    def complete(self, request: RolloutRequest, sampled: Sampled, passes: LogprobPasses,
                 episode: EpisodeScoring | None = None) -> TrajectoryBatch:
        """The scores of a sampled batch with its logprob passes, as one TrajectoryBatch. `episode`: what a source
        of several turns adds to scoring (the texts the reward scores, more columns, the environment's rewards)."""
        pad = self.settings.pad_token_id
        responses, mask = sampled.completion_ids, sampled.completion_mask
        timings = {"generation": sampled.seconds, "logprobs": passes.seconds}
        if episode is not None:
            texts = episode.texts
        else:
            texts = self.tokenizer.batch_decode(
                torch.where(mask, responses, torch.full_like(responses, pad)), skip_special_tokens=True
            )
        queries = [request.prompts.queries[i] for i in request.rows]
        scored = time.perf_counter()
        scores, components, logs = self._score(request.prompts, request.rows, queries, texts, sampled,
                                               request.step, episode)
        timings["scoring"] = time.perf_counter() - scored
        rows = len(request.rows)
        return TrajectoryBatch(
            prompt_ids=sampled.prompt_ids, prompt_mask=sampled.prompt_mask, completion_ids=responses,
            completion_mask=mask,
            loss_mask=sampled.loss_mask, stop_reason=sampled.stop_reason,
            group_ids=torch.tensor(request.group_ids, dtype=torch.long, device=responses.device),
            policy_version=torch.full((rows,), request.policy_version, dtype=torch.long, device=responses.device),
            logprobs=passes.logprobs, ref_logprobs=passes.ref_logprobs, scores=scores, queries=queries,
            completions=texts, components=components, extras=passes.extras, timings=timings,
            sampling_logprobs=None if self.backend.samples_with_training_forward else sampled.sampling_logprobs,
            episode_stats={name: torch.tensor(values, dtype=torch.float32, device=responses.device)
                           for name, values in (episode.stats if episode is not None else {}).items()},
            logged_columns=logs.columns, logged_metrics=logs.metrics,
            **turn_credit_fields(sampled, scores, episode),
        )

    def _sample(self, engine: RolloutModel, prompt_ids, prompt_mask, seeds) -> Completions:
        """Completions (B, T) truncated after the stop token, from the generation backend."""
        settings = self.settings
        params = GenerationParams(settings.response_length, settings.temperature, settings.stop_token_ids,
                                  settings.pad_token_id, settings.filters)
        return sample_completions(
            self.backend, engine.model, prompt_ids, prompt_mask, params, seeds, sharded=engine.sharded,
            all_finished=self.collectives.all_true if engine.sharded else None, agree_width=self.collectives.max_int,
        )

    def logprobs_of(self, model, prompt_ids, prompt_mask, responses, mask) -> torch.Tensor:
        """`model`'s logprobs of the completion tokens, (B, T), as the rollout's no-grad passes compute them."""
        settings = self.settings
        return batched_logprobs(
            model, prompt_ids, prompt_mask, responses, mask, settings.temperature, settings.forward_batch_size,
            share_prompts=settings.share_prompts, from_hidden_states=settings.head_logprobs,
            max_tokens=settings.max_tokens_per_forward, padding_free=settings.padding_free,
        )

    def _extra_pass(self, run: ExtraPass, prompt_ids, prompt_mask, responses, mask) -> torch.Tensor:
        """An algorithm's extra pass over the whole batch, or with max_tokens_per_forward over chunks of rows of
        similar length, each cut to its content (0 after a chunk's last real token: no loss reads it)."""
        budget = self.settings.max_tokens_per_forward
        if budget is None:
            return run(prompt_ids, prompt_mask, responses, mask)
        out = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        for part in forward_chunks(prompt_mask, mask, len(mask), budget, padded=not self.settings.padding_free):
            first, end = content_columns(prompt_mask[part], mask[part])
            out[part, :end] = run(prompt_ids[part, first:], prompt_mask[part, first:], responses[part, :end],
                                  mask[part, :end])
        return out

    def _reference_logprobs(self, model, prompt_ids, prompt_mask, responses, mask) -> torch.Tensor:
        if self.ref_policy is not None:
            return self.logprobs_of(self.ref_policy, prompt_ids, prompt_mask, responses, mask)
        with unwrap_model(self.accelerator, self.policy).disable_adapter():  # LoRA: the base model is the reference
            return self.logprobs_of(model, prompt_ids, prompt_mask, responses, mask)

    def _score(self, prompts: EncodedPrompts, rows, queries, completions, sampled: Sampled, step: int,
               episode: EpisodeScoring | None = None) -> tuple[torch.Tensor, dict[str, list[float]], FunctionLogs]:
        """(scores (B,) float32 after missing_eos_penalty, reward components, what the reward's functions logged).
        An episode's environment rewards are added to the reward (weight 1), each logged as its own component."""
        has_stop = sampled.has_stop
        components: dict[str, list[float]] = {}
        logs = FunctionLogs()
        if isinstance(self.reward, torch.nn.Module):
            with self.accelerator.autocast():
                scores = classifier_scores(
                    self.reward, sampled.prompt_ids, sampled.prompt_mask, sampled.completion_ids,
                    sampled.completion_mask, self.settings.pad_token_id, self.settings.forward_batch_size,
                    max_tokens=self.settings.max_tokens_per_forward, padding_free=self.settings.padding_free,
                )
        else:
            columns = self._reward_columns(prompts, rows, sampled, episode)
            totals, components, logs = self._score_with_spec(queries, completions, columns, step)
            scores = torch.tensor(totals, dtype=torch.float32, device=sampled.completion_ids.device)
        if episode is not None:
            for name, values in episode.rewards.items():
                scores = scores + torch.tensor(values, dtype=scores.dtype, device=scores.device)
                components = {**components, name: list(values)}
        if self.settings.score_without_stop is not None:
            scores = torch.where(has_stop, scores, torch.full_like(scores, self.settings.score_without_stop))
        if self.settings.missing_eos_penalty is not None:
            scores = scores - self.settings.missing_eos_penalty * (~has_stop).float()
        return scores.float(), components, logs

    def _reward_columns(self, prompts: EncodedPrompts, rows, sampled: Sampled,
                        episode: EpisodeScoring | None) -> dict[str, list[Any]]:
        """What a reward spec is given beside the query and completion texts: the rows' dataset columns,
        `completion_has_eos`, an episode's columns, and the raw-text and TRL inputs where the reward asks."""
        columns = {name: [values[i] for i in rows] for name, values in prompts.columns.items()}
        columns["completion_has_eos"] = sampled.has_stop.tolist()
        if episode is not None:
            columns.update(episode.columns)
        responses, mask = sampled.completion_ids, sampled.completion_mask
        if self.reward.uses_raw_text():
            columns.update(self._raw_text(sampled.prompt_ids, sampled.prompt_mask, responses, mask))
        if self.reward.uses_trl_inputs():
            columns["completion_ids"] = [ids[keep].tolist() for ids, keep in zip(responses, mask)]
            columns["dataset_prompts"] = [prompts.prompts[i] if prompts.prompts else None for i in rows]
        return columns

    def _score_with_spec(self, queries, completions, columns, step: int
                         ) -> tuple[list[float], dict[str, list[float]], FunctionLogs]:
        """The reward spec's (totals, components, logs) of this process's rows. A reward error on any process
        stops every process with its message; a stop signal while it runs stops all of them together."""
        label = f"reward {type(self.reward).__name__}"
        error, stopped, totals, components = None, False, [], {}
        logs = FunctionLogs()  # this call's own: the producer thread and the training thread share the spec
        try:
            totals, components = call_with_timeout(
                lambda: self.reward.score_logging(queries, completions, columns, logs, step=step),
                self.settings.reward_timeout, label, step, "training.reward_timeout")
            checked_logs(logs, len(completions), label, step)
        except UserError as exc:
            error = str(exc)
        except StoppedWhileWaiting:
            stopped = True
        if self.collectives.any_process(stopped):  # every process stops together, none left in a collective
            raise StoppedWhileWaiting()
        self.collectives.raise_if_any_failed(error)
        return totals, components, logs

    def _raw_text(self, prompt_ids, prompt_mask, responses, mask) -> dict[str, list[str]]:
        """For rewards written against the raw text (`RewardSpec.needs_raw_text`): the prompt as the model saw it
        (chat template and special tokens included) and the completion with its special tokens (the stop token
        included)."""
        decode = self.tokenizer.decode
        return {
            "templated_prompts": [decode(ids[keep]) for ids, keep in zip(prompt_ids, prompt_mask)],
            "raw_completions": [decode(ids[keep]) for ids, keep in zip(responses, mask)],
        }


def turn_credit_fields(sampled: Sampled, scores: torch.Tensor, episode: EpisodeScoring | None
                       ) -> dict[str, torch.Tensor]:
    """TrajectoryBatch's turn_index, turn_rewards and turn_counts. One reply per row: one turn worth the score.
    Episodes: each reply's step reward, the last reply's topped up by what the score holds beside the step rewards
    (the end-of-episode reward, the reward spec's score, missing_eos_penalty), so a row's turn rewards sum to its
    score."""
    device = scores.device
    if episode is None or sampled.turn_index is None:
        turn_index = torch.where(sampled.loss_mask, 0, -1).long()
        counts = torch.ones_like(scores, dtype=torch.long)
        return {"turn_index": turn_index, "turn_rewards": scores.unsqueeze(-1).clone(), "turn_counts": counts}
    counts = torch.tensor([max(len(rewards), 1) for rewards in episode.turn_rewards], dtype=torch.long, device=device)
    rewards = torch.zeros((len(episode.turn_rewards), int(counts.max())), dtype=torch.float32, device=device)
    for row, steps in enumerate(episode.turn_rewards):
        rewards[row, : len(steps)] = torch.tensor(steps, dtype=torch.float32, device=device)
    top_up = scores - rewards.sum(-1)
    rewards[torch.arange(len(counts), device=device), counts - 1] += top_up
    return {"turn_index": sampled.turn_index, "turn_rewards": rewards, "turn_counts": counts}


def checked_logs(logs: FunctionLogs, completions: int, label: str, step: int) -> FunctionLogs:
    """The reward's logs, refused in one line where a `log_extra` column does not hold one value per completion
    (a column of the sample table has one row per completion, as TRL's completions table)."""
    for column, values in logs.columns.items():
        if len(values) != completions:
            raise UserError(f"{label} at step {step}: log_extra({column!r}, values) was given {len(values)} "
                            f"values for {completions} completions; give one value per completion")
    return logs
