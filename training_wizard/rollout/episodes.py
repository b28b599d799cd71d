"""Episodes of several turns with a text environment: the model replies, the environment answers, until the
environment says done, the turn limit or the token budget.

The text protocol (the shape of skyrl-gym's and OpenEnv's environments), duck-typed:
    env = factory()                       # one environment per row, made fresh for every episode
    env.reset(**row) -> str | None        # the row's columns; text appended to the prompt's last user message
    env.step(reply) -> (observation: str | None, reward: float | None, done: bool)

`EpisodeSource` is a rollout source (rollout/collector.py): it samples each turn with the trainer's generation
backend, splices the environment's answer in as tokens (rollout/chat_turns.py: token-in/token-out, outside the
loss mask), and hands the finished token batch to the single-turn collector for the logprob passes and the
scores. The reward spec scores each row's last reply, with the whole episode as text in a `transcript` column; the
environment's rewards, summed over the episode, are a reward component named after its class, added with weight 1.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from training_wizard.errors import UserError
from training_wizard.rollout.backends import sample_completions
from training_wizard.rollout.chat_turns import TurnRenderer
from training_wizard.rollout.collector import EpisodeScoring, RolloutCollector, RolloutRequest, Sampled
from training_wizard.rollout.generation import GenerationParams
from training_wizard.rollout.prompts import render_prompt, row_seed
from training_wizard.rollout.trajectory import StopReason, TrajectoryBatch


@dataclass(frozen=True)
class EpisodeLimits:
    """max_turns: model replies per episode; environment_timeout: seconds one environment step may take (past
    it the episode ends, its step counted as timed out; the run goes on)."""

    max_turns: int = 4
    environment_timeout: float = 60.0


@dataclass
class Episode:
    """One row's episode as it grows: the prompt's ids, then every reply and environment answer."""

    environment: Any
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)  # the loss mask: True for the model's tokens
    logprobs: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    transcript: list[str] = field(default_factory=list)
    reward: float = 0.0
    stop: StopReason | None = None

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.sampled += [logprobs is not None] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def turn_seed(row_seed_value: int, turn: int) -> int:
    """The sampling key of one turn: the row's own key for the first (a one-turn episode samples what a single
    reply would), keyed by (row, turn) after it, so results do not depend on batch or process count."""
    return row_seed_value if turn == 0 else row_seed(row_seed_value, turn, 1)


class EpisodeSource:
    """A rollout source of episodes with a text environment (module docstring). `environment_factory()` makes
    one environment; the collector gives the models, the backend, the reward and the sampling settings."""

    def __init__(self, collector: RolloutCollector, environment_factory: Callable[[], Any], limits: EpisodeLimits):
        self.collector, self.factory, self.limits = collector, environment_factory, limits
        self.tokenizer = collector.tokenizer
        self.turns = TurnRenderer(self.tokenizer)
        self.name = getattr(environment_factory, "__name__", type(environment_factory).__name__)

    def collect(self, request: RolloutRequest) -> TrajectoryBatch:
        started = time.perf_counter()
        episodes = [self._reset(request, row) for row in request.rows]
        collector = self.collector
        with collector.rollout_engine() as engine:
            if engine.sharded:
                raise UserError("environment: episodes of several turns need the model's whole weights on each "
                                "process (plain data parallel, or ds3_gather_for_generation = true)")
            for turn in range(self.limits.max_turns):
                running = [i for i, episode in enumerate(episodes) if episode.stop is None]
                if not running:
                    break
                self._turn(engine, request, episodes, running, turn)
            sampled = self._token_batch(episodes, time.perf_counter() - started)
            passes = collector.logprob_passes(engine, sampled)
        scoring = EpisodeScoring(
            texts=[episode.replies[-1] if episode.replies else "" for episode in episodes],
            columns={"transcript": ["".join(episode.transcript) for episode in episodes]},
            rewards={self.name: [episode.reward for episode in episodes]},
        )
        return collector.complete(request, sampled, passes, scoring)

    def _reset(self, request: RolloutRequest, row: int) -> Episode:
        """A fresh environment for dataset row `row`; its reset text joins the prompt's last user message."""
        prompts = request.prompts
        columns = {name: values[row] for name, values in prompts.columns.items()}
        prompt = prompts.prompts[row] if prompts.prompts else None
        environment = self.factory()
        opening = environment.reset(**{"prompt": prompt, **columns})
        if opening and prompt is not None:
            if isinstance(prompt, str):
                prompt = prompt + "\n\n" + opening
            else:
                prompt = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + "\n\n" + opening}]
            return Episode(environment, render_prompt(self.tokenizer, prompt))
        return Episode(environment, list(prompts.input_ids[row]))

    def _turn(self, engine, request: RolloutRequest, episodes: list[Episode], running: list[int], turn: int) -> None:
        """One reply for every running episode, then the environments' answers."""
        settings = self.collector.settings
        budget = settings.response_length
        contexts = [episodes[i].prompt_ids + episodes[i].ids for i in running]
        width = max(len(ids) for ids in contexts)
        pad = settings.pad_token_id
        prompt_ids = torch.full((len(running), width), pad, dtype=torch.long)
        for row, ids in enumerate(contexts):
            prompt_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompt_ids, dtype=torch.bool)
        for row, ids in enumerate(contexts):
            prompt_mask[row, width - len(ids):] = True
        left = [budget - len(episodes[i].ids) for i in running]
        params = GenerationParams(max(left), settings.temperature, settings.stop_token_ids, pad, settings.filters)
        seeds = [turn_seed(request.seeds[i], turn) for i in running]
        device = self.collector.accelerator.device
        out = sample_completions(self.collector.backend, engine.model, prompt_ids.to(device), prompt_mask.to(device),
                                 params, seeds)
        replies = []
        for row, i in enumerate(running):
            keep = out.mask[row].nonzero().flatten()[: left[row]]
            ids, logprobs = out.responses[row, keep].tolist(), out.sampling_logprobs[row, keep].tolist()
            episodes[i].add(ids, logprobs)
            ended = bool(out.has_stop[row]) and len(keep) == int(out.mask[row].sum())
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            episodes[i].replies.append(text)
            episodes[i].transcript.append(self.tokenizer.decode(ids))
            if not ended:
                episodes[i].stop = StopReason.LENGTH
            replies.append((i, text, ids[-1] if ids else None))
        self._answer(episodes, [(i, text, end) for i, text, end in replies if episodes[i].stop is None], turn)

    def _answer(self, episodes: list[Episode], replies: list[tuple[int, str, int]], turn: int) -> None:
        """Each environment's step on its reply, run concurrently, each within environment_timeout; its answer
        spliced in as tokens outside the loss mask."""
        budget = self.collector.settings.response_length
        if not replies:
            return
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(replies)))
        try:
            futures = {i: pool.submit(episodes[i].environment.step, text) for i, text, _ in replies}
            for i, _, end in replies:
                episode = episodes[i]
                try:
                    observation, reward, done = futures[i].result(timeout=self.limits.environment_timeout)
                except concurrent.futures.TimeoutError:
                    observation, reward, done = None, None, True
                episode.reward += float(reward or 0.0)
                if done or observation is None:
                    episode.stop = StopReason.ENVIRONMENT_DONE
                    continue
                if turn + 1 >= self.limits.max_turns:
                    episode.stop = StopReason.TURNS
                    continue
                answer = self.turns.observation_ids(str(observation), end)
                room = budget - len(episode.ids)
                episode.add(answer[:room], None)
                episode.transcript.append(self.tokenizer.decode(answer[:room]))
                if len(answer) >= room:  # no room left for a reply: the budget ended the episode
                    episode.stop = StopReason.LENGTH
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _token_batch(self, episodes: list[Episode], seconds: float) -> Sampled:
        """The episodes as one left-padded token batch (shapes as in TrajectoryBatch); the completion width is the
        same on every process (token-level statistics gather (B, T) tensors)."""
        collector, pad = self.collector, self.collector.settings.pad_token_id
        for episode in episodes:
            if episode.stop is None:  # the turn limit reached on a reply the environment did not answer
                episode.stop = StopReason.TURNS
        width = collector.collectives.max_int(max(len(episode.ids) for episode in episodes))
        prompt_width = max(len(episode.prompt_ids) for episode in episodes)
        rows = len(episodes)
        prompt_ids = torch.full((rows, prompt_width), pad, dtype=torch.long)
        prompt_mask = torch.zeros((rows, prompt_width), dtype=torch.bool)
        ids = torch.full((rows, width), pad, dtype=torch.long)
        real = torch.zeros((rows, width), dtype=torch.bool)
        loss = torch.zeros((rows, width), dtype=torch.bool)
        logprobs = torch.zeros((rows, width), dtype=torch.float32)
        for row, episode in enumerate(episodes):
            length, prompt_length = len(episode.ids), len(episode.prompt_ids)
            prompt_ids[row, prompt_width - prompt_length:] = torch.tensor(episode.prompt_ids, dtype=torch.long)
            prompt_mask[row, prompt_width - prompt_length:] = True
            ids[row, :length] = torch.tensor(episode.ids, dtype=torch.long)
            real[row, :length] = True
            loss[row, :length] = torch.tensor(episode.sampled, dtype=torch.bool)
            logprobs[row, :length] = torch.tensor(episode.logprobs, dtype=torch.float32)
        stop = torch.tensor([int(episode.stop) for episode in episodes], dtype=torch.long)
        device = collector.accelerator.device
        return Sampled(prompt_ids.to(device), prompt_mask.to(device), ids.to(device), real.to(device),
                       loss.to(device), stop.to(device), logprobs.to(device), seconds)
