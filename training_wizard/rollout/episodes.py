"""Episodes of several turns: the model replies, the environment (or its tools) answers, until the episode ends.

Two protocols: "tools" (rollout/tools.py), TRL's `environment_factory` contract (an environment's public methods,
and plain functions, are tools the model calls in the Hermes form), and "text" (rollout/environment_protocols.py:
`step(reply) -> (observation, reward, done)`). An environment is made fresh for every episode by its factory; a
mapping of factories routes each row by its `environment` column.

`EpisodeSource` is a rollout source (rollout/collector.py): it samples each turn with the trainer's generation
backend, splices the environment's answer in as tokens (rollout/chat_turns.py: token-in/token-out, outside the
loss mask), and hands the finished token batch to the single-turn collector for the logprob passes and the
scores. The reward spec scores each row's last reply, with the whole episode as text in a `transcript` column and
as messages (`completion_messages`, which TRL-form reward functions get as `completions`); the environment's own
reward (summed step rewards, or `get_reward()`) is a reward component named after its class, added with weight 1.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from training_wizard.errors import UserError
from training_wizard.rollout.backends import sample_completions
from training_wizard.rollout.chat_templates import load_chat_template
from training_wizard.rollout.chat_turns import TurnRenderer
from training_wizard.rollout.collector import (
    EpisodeScoring, RolloutCollector, Sampled, SamplingSettings,
)
from training_wizard.rollout.environment_protocols import Answer, JobResult, TextProtocol, Turn
from training_wizard.rollout.environments import (
    EnvironmentFailure, check_reward_source, factory_name, factory_table, gives_reward, new_environment_for,
    reset_columns, reset_environment,
)
from training_wizard.rollout.generation import GenerationParams
from training_wizard.rollout.kept_cache import KeptCaches
from training_wizard.rollout.prompts import EncodedPrompts, RolloutRequest, left_pad, prompt_text, row_seed
from training_wizard.rollout.tools import ToolsProtocol, reply_parser, typed_arguments, without_calls
from training_wizard.rollout.trajectory import StopReason, TrajectoryBatch
from training_wizard.signals import stop_requested
from training_wizard.specs.episode import EpisodeSettings

# Tool calls and environment steps of one turn run in this many threads at most.
MAX_CONCURRENT_STEPS = 16


@dataclass
class Episode:
    """One row's episode as it grows: the prompt's ids, then every reply and environment answer."""

    environment: Any
    tools: dict[str, Callable]
    schemas: list[dict] | None
    prompt_ids: list[int]
    prompt_messages: list[dict[str, Any]] | None  # None: a plain-text prompt
    name: str = ""  # the factory's name: the reward component the environment's reward goes to
    row: int = -1  # the dataset row it plays: errors name it
    prompt: Any = None  # the prompt as played (the reset text appended): what TRL-form rewards get
    ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)  # the loss mask: True for the model's tokens
    logprobs: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation after the prompt
    transcript: list[str] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)  # per token: the reply it belongs to, -1 for the environment's
    step_rewards: list[float] = field(default_factory=list)  # the environment's reward after each stepped reply
    reward: float = 0.0
    stop: StopReason | None = None
    failed: bool = False  # the environment could not reset: the first reply ends the episode, stepped by nothing
    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAT_NAMES, 0.0))

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.sampled += [logprobs is not None] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.turns += [len(self.replies) if logprobs is not None else -1] * len(ids)


STAT_NAMES = ("calls", "failures", "malformed", "errors", "drift", "failed")


def prepare_episodes(tokenizer, environment_factory, tools, settings: EpisodeSettings | None,
                     has_reward: bool = True) -> EpisodeSettings | None:
    """How a trainer or the eval recipe given an environment or tools plays its episodes (the given settings with
    the tools added), its training chat template set on the tokenizer before any prompt is rendered; None: single
    replies. Without a reward of its own (`has_reward`) the run needs an environment that gives one."""
    if environment_factory is None and not tools and not (settings is not None and settings.tools):
        return None  # single replies (a recipe's tools-only table gives its tools in the settings)
    settings = settings or EpisodeSettings()
    check_reward_source(factory_table(environment_factory).values(), settings.protocol, has_reward)
    if settings.protocol == "text" and (tools or settings.tools):
        raise UserError("environment: tools are given with the text protocol, which shows the model none (its "
                        "environment reads each reply); use the tools protocol, or give no tools")
    use_episode_chat_template(tokenizer, settings.chat_template)
    return dataclasses.replace(settings, tools=tuple(settings.tools) + tuple(tools or ()))


def use_episode_chat_template(tokenizer, chat_template: str | None) -> None:
    """The episodes' training chat template (EpisodeSettings.chat_template), if any, replaces the tokenizer's: the
    one place it is set, for a recipe's start check and for the trainer and the eval recipe."""
    if chat_template is not None:
        tokenizer.chat_template = load_chat_template(chat_template)


def episode_protocol(settings: EpisodeSettings) -> TextProtocol | ToolsProtocol:
    """The protocol `settings` names, under its limit: replies per episode (text) or rounds of tool calls (tools)."""
    if settings.protocol == "tools":
        return ToolsProtocol(list(settings.tools), settings.max_tool_calling_iterations)
    return TextProtocol(settings.max_turns)


def turn_seed(row_seed_value: int, turn: int) -> int:
    """The sampling key of one turn: the row's own key for the first (a one-turn episode samples what a single
    reply would), keyed by (row, turn) after it, so results do not depend on batch or process count."""
    return row_seed_value if turn == 0 else row_seed(row_seed_value, turn, 1)


class EpisodePlayer:
    """Plays episodes (module docstring) with a model: `play` samples every turn and splices every answer in,
    `finish` adds the environments' end-of-episode rewards and checks the tokenization, `scoring` gives what the
    reward reads. `environment_factory`: a callable making one environment, a mapping of them by the rows'
    `environment` column, or None (tools only). Training (EpisodeSource) and evaluation both play through it."""

    def __init__(self, tokenizer, backend, sampling: SamplingSettings, environment_factory,
                 settings: EpisodeSettings = EpisodeSettings()):
        self.tokenizer, self.backend, self.sampling, self.settings = tokenizer, backend, sampling, settings
        self.factories = factory_table(environment_factory)
        if settings.protocol == "text" and not self.factories:
            raise UserError("environment: the text protocol needs an environment factory")
        if settings.protocol == "tools" and not self.factories and not settings.tools:
            raise UserError("environment: the tools protocol needs an environment factory or tools")
        self.protocol = episode_protocol(settings)
        self.turns = TurnRenderer(tokenizer, with_tools=settings.protocol == "tools")
        self.parse = reply_parser(tokenizer, settings.tool_parser)
        self.names = sorted({factory_name(factory) for factory in self.factories.values()
                             if settings.protocol == "text" or gives_reward(factory)})
        self.warned_drift = False

    def play(self, model, prompts: EncodedPrompts, rows: list[int], seeds: list[int], device) -> list[Episode]:
        """The episodes of dataset rows `rows`, each turn sampled with the row's key `seeds[i]` (turn_seed)."""
        episodes = [self._reset(prompts, row) for row in rows]
        kept = KeptCaches() if self.settings.keep_kv_cache else None  # each episode's KV cache across its turns
        turn = 0
        while any(episode.stop is None for episode in episodes):
            if stop_requested():
                # SIGTERM/SIGINT: the trainer stops before this rollout's update and saves the iteration's start,
                # so these episodes are never trained on; end them now rather than after every turn and tool
                for episode in episodes:
                    episode.stop = StopReason.LENGTH if episode.stop is None else episode.stop
                break
            self._turn(model, seeds, episodes, turn, device, kept)
            turn += 1
        return episodes

    def _reset(self, prompts: EncodedPrompts, row: int) -> Episode:
        """A fresh environment for dataset row `row`; its reset text is appended to the prompt's last user message
        as TRL 1.16 appends it (no separator: an environment that supplies the whole prompt gets an empty one)."""
        columns = {name: values[row] for name, values in prompts.columns.items()}
        prompt = prompts.prompts[row] if prompts.prompts else None
        name, environment = new_environment_for(self.factories, columns, row)
        opening, failure = reset_environment(environment, prompt, reset_columns(self.factories, columns), row)
        if failure is not None:  # the model still replies once (an episode has a reply), then it ends
            print(f"warning: dataset row {row}: the environment could not reset: {failure}", flush=True)
        tools, schemas = self.protocol.tools_of(environment)
        if isinstance(prompt, str) and self.settings.protocol == "tools":
            prompt = [{"role": "user", "content": prompt}]  # tools need the chat template
        if opening and prompt is not None:
            if isinstance(prompt, str):
                prompt = prompt + opening
            else:
                prompt = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + opening}]
        if isinstance(prompt, list):
            episode = Episode(environment, tools, schemas, self.turns.prompt_ids(prompt, schemas), prompt, name)
        else:
            ids = self.turns.encode(prompt) if isinstance(prompt, str) else list(prompts.input_ids[row])
            episode = Episode(environment, tools, schemas, ids, None, name)
        episode.failed, episode.row, episode.prompt = failure is not None, row, prompt
        episode.counts["failed"] = float(episode.failed)  # counted even if its one reply runs out of tokens
        return episode

    def _turn(self, model, seeds: list[int], episodes: list[Episode], turn: int, device,
              kept: KeptCaches | None = None) -> None:
        """One reply for every running episode, then the environments' answers."""
        running = [i for i, episode in enumerate(episodes) if episode.stop is None]
        if kept is not None:
            kept.keep_only(running)
        settings = self.sampling
        prompt_ids, prompt_mask = left_pad([episodes[i].prompt_ids + episodes[i].ids for i in running],
                                           settings.pad_token_id)
        left = [settings.response_length - len(episodes[i].ids) for i in running]
        params = GenerationParams(max(left), settings.temperature, settings.stop_token_ids, settings.pad_token_id,
                                  settings.filters)
        out = sample_completions(self.backend, model, prompt_ids.to(device), prompt_mask.to(device), params,
                                 [turn_seed(seeds[i], turn) for i in running],
                                 kept=(kept, running) if kept is not None else None)
        pending: dict[int, tuple[Turn | Answer, int | None]] = {}
        for row, i in enumerate(running):
            keep = out.mask[row].nonzero().flatten()[: left[row]]
            ids, logprobs = out.responses[row, keep].tolist(), out.sampling_logprobs[row, keep].tolist()
            episode = episodes[i]
            episode.add(ids, logprobs)
            ended = bool(out.has_stop[row]) and len(keep) == int(out.mask[row].sum())
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            episode.replies.append(text)
            episode.transcript.append(self.tokenizer.decode(ids))
            content = self.tokenizer.decode(ids[:-1] if ended else ids, clean_up_tokenization_spaces=False)
            episode.messages.append({"role": "assistant", "content": content})
            if not ended:
                episode.stop = StopReason.LENGTH
                continue
            step = Answer(stop=StopReason.ENVIRONMENT_DONE, errors=1) if episode.failed else self.protocol.turn(
                episode.environment, episode.tools, text, len(episode.replies), self.parse, episode.row)
            pending[i] = (step, ids[-1] if ids else None)
        results = self._run_jobs({i: step.jobs for i, (step, _) in pending.items() if isinstance(step, Turn)})
        for i, (step, reply_end) in pending.items():
            answer = step if isinstance(step, Answer) else step.answer(results[i])
            self._apply(episodes[i], answer, reply_end)

    def _apply(self, episode: Episode, answer: Answer, reply_end: int | None) -> None:
        """An answer's reward and counts into the episode; its messages spliced in as tokens. Messages that do not
        fit the token budget are dropped and the episode ends on the reply that called for them, as TRL 1.16's
        tool loop rolls them back: that reply ended with its stop token, so the row is not truncated."""
        episode.reward += answer.reward
        episode.step_rewards.append(answer.reward)
        for name in ("calls", "failures", "malformed", "errors", "failed"):
            episode.counts[name] += getattr(answer, name)
        if answer.stop is not None or not answer.messages:
            episode.stop = answer.stop if answer.stop is not None else StopReason.ENVIRONMENT_DONE
            return
        ids = self.turns.message_ids(answer.messages, reply_end)
        room = self.sampling.response_length - len(episode.ids)
        if len(ids) > room:
            episode.stop = StopReason.STOP_TOKEN
            return
        episode.add(ids, None)
        episode.messages += answer.messages
        episode.transcript.append(self.tokenizer.decode(ids))
        if len(ids) == room:  # no token is left for a reply: the row ends without its stop token
            episode.stop = StopReason.LENGTH

    def _run_jobs(self, jobs: dict[int, list[Callable[[], Any]]]) -> dict[int, list[JobResult]]:
        """Every job of this turn, concurrently; each within environment_timeout from its own start. A job that
        raises or runs late gives an error result; its thread is left behind (Python cannot stop it) and the
        run goes on."""
        flat = [(i, job) for i, episode_jobs in jobs.items() for job in episode_jobs]
        results: dict[int, list[JobResult]] = {i: [] for i in jobs}
        if not flat:
            return results
        timeout = self.settings.environment_timeout
        starts: dict[int, float] = {}

        def timed(index: int, job: Callable[[], Any]) -> Any:
            starts[index] = time.monotonic()
            return job()

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT_STEPS, len(flat)))
        futures = [pool.submit(timed, index, job) for index, (_, job) in enumerate(flat)]
        late: set[int] = set()
        pending = set(futures)
        while pending and not stop_requested():  # a stop signal: the rollout is dropped (see play), wait no more
            _, pending = concurrent.futures.wait(pending, timeout=min(0.05, timeout))
            now = time.monotonic()
            for index, future in enumerate(futures):
                if future in pending and index in starts and now - starts[index] > timeout:
                    late.add(index)
                    pending.discard(future)
        pool.shutdown(wait=False, cancel_futures=True)
        for index, (i, _) in enumerate(flat):
            future = futures[index]
            if index in late or not future.done() or future.cancelled():  # (the last two: a stop signal)
                results[i].append(JobResult(error=f"no answer within environment_timeout ({timeout:g} s)"))
            elif future.exception() is not None:
                error = future.exception()
                results[i].append(JobResult(error=f"{type(error).__name__}: {error}",
                                            ends_episode=isinstance(error, EnvironmentFailure)))
            else:
                results[i].append(JobResult(future.result()))
        return results

    def finish(self, rows: list[int], episodes: list[Episode]) -> str | None:
        """The environments' end-of-episode rewards (get_reward) and the tokenization check; the error that must
        stop the run (a failing get_reward, a strict check's difference), or None."""
        try:
            for row, episode in zip(rows, episodes):
                episode.reward += self.protocol.final_reward(episode.environment, row)
        except UserError as error:  # the environment's own scorer broke its contract: the run cannot go on
            return str(error)
        if self.settings.tokenization_check != "off":
            return self._check_tokenization(rows, episodes)
        return None

    def scoring(self, episodes: list[Episode]) -> EpisodeScoring:
        """The texts and columns the reward reads, the environment's rewards by factory name, and the counts the
        episode metrics sum."""
        rewards = {name: [episode.reward if episode.name == name else 0.0 for episode in episodes]
                   for name in self.names}
        return EpisodeScoring(
            texts=[episode.replies[-1] if episode.replies else "" for episode in episodes],
            columns={"transcript": ["".join(episode.transcript) for episode in episodes],
                     "completion_messages": [self._as_trl_messages(episode) for episode in episodes],
                     "environments": [episode.environment for episode in episodes]},
            rewards=rewards,
            stats={name: [episode.counts[name] for episode in episodes] for name in STAT_NAMES},
            # a reply the budget cut off was never stepped: its reward is 0 (or the last turn's top-up)
            turn_rewards=[episode.step_rewards + [0.0] * (len(episode.replies) - len(episode.step_rewards))
                          for episode in episodes],
        )

    def _as_trl_messages(self, episode: Episode) -> list[dict[str, Any]]:
        """The conversation after the prompt as TRL gives it to reward functions: a reply that called tools carries
        them as `tool_calls` (arguments typed by each tool's schema), its text outside the calls as content."""
        if self.settings.protocol != "tools":
            return episode.messages
        messages = []
        for message in episode.messages:
            calls = self.parse(message["content"]).calls if message["role"] == "assistant" else []
            if calls:
                message = {**message, "content": without_calls(message["content"]), "tool_calls": [
                    {"type": "function", "function": {"name": call.name, "arguments": typed_arguments(
                        episode.tools[call.name], call.arguments) if call.name in episode.tools else call.arguments}}
                    for call in calls]}
            messages.append(message)
        return messages

    def played_request(self, request: RolloutRequest, episodes: list[Episode]) -> RolloutRequest:
        """`request` with one prompt per episode as it was played (the reset text appended), which the sample
        table shows and TRL-form rewards get as `prompts`, as TRL 1.16 gives them."""
        source = request.prompts
        played = EncodedPrompts(
            [episode.prompt_ids for episode in episodes],
            [prompt_text(episode.prompt) if episode.prompt is not None else source.queries[row]
             for row, episode in zip(request.rows, episodes)],
            {name: [values[row] for row in request.rows] for name, values in source.columns.items()},
            [episode.prompt for episode in episodes])
        return dataclasses.replace(request, prompts=played, rows=list(range(len(episodes))))

    def _check_tokenization(self, rows: list[int], episodes: list[Episode]) -> str | None:
        """Compare each conversational episode's spliced ids with the template's own rendering; count drift, warn
        once, or (strict) return the error that stops the run."""
        for row, episode in zip(rows, episodes):
            last_reply = max(i for i, message in enumerate(episode.messages) if message["role"] == "assistant")
            if episode.prompt_messages is None or last_reply == 0:
                continue  # nothing was spliced
            if not self.turns.drift(episode.prompt_ids, episode.ids, episode.sampled, episode.prompt_messages,
                                    episode.messages[: last_reply + 1], episode.schemas):
                continue
            episode.counts["drift"] = 1.0
            message = (f"environment: dataset row {row}: the episode's spliced token ids differ from the chat "
                       "template's rendering of its conversation (tokenization_check)")
            if self.settings.tokenization_check == "strict":
                return message
            if not self.warned_drift:
                print(f"warning: {message}; episodes/tokenization_drift counts them", flush=True)
                self.warned_drift = True
        return None


class EpisodeSource:
    """A rollout source of episodes: an EpisodePlayer's episodes as one token batch, with the collector's
    logprob passes and scores (the collector gives the models, the backend, the reward and the settings)."""

    def __init__(self, collector: RolloutCollector, environment_factory, settings: EpisodeSettings, limits: Any):
        self.collector = collector
        self.player = episode_player(collector.tokenizer, collector.backend, collector.settings, environment_factory,
                                     settings, limits)

    def collect(self, request: RolloutRequest) -> TrajectoryBatch:
        started = time.perf_counter()
        collector, player = self.collector, self.player
        with collector.rollout_engine() as engine:
            if engine.sharded:
                raise UserError("environment: episodes of several turns need the model's whole weights on each "
                                "process (plain data parallel, or ds3_gather_for_generation = true)")
            broken = None
            try:
                episodes = player.play(engine.model, request.prompts, request.rows, request.seeds,
                                       collector.accelerator.device)
            except UserError as error:  # an environment broke its contract here: every process stops with it
                broken = str(error)
            collector.collectives.raise_if_any_failed(broken)
            sampled = self._token_batch(episodes, time.perf_counter() - started)
            passes = collector.logprob_passes(engine, sampled)
        collector.collectives.raise_if_any_failed(player.finish(request.rows, episodes))
        return collector.complete(player.played_request(request, episodes), sampled, passes,
                                  player.scoring(episodes))

    def _token_batch(self, episodes: list[Episode], seconds: float) -> Sampled:
        """The episodes as one token batch, prompts left-padded (shapes as in TrajectoryBatch); the completion
        width is the same on every process (token-level statistics gather (B, T) tensors)."""
        collector, pad = self.collector, self.collector.settings.pad_token_id
        width = collector.collectives.max_int(max(len(episode.ids) for episode in episodes))
        prompt_ids, prompt_mask = left_pad([episode.prompt_ids for episode in episodes], pad)
        rows = len(episodes)
        ids = torch.full((rows, width), pad, dtype=torch.long)
        real = torch.zeros((rows, width), dtype=torch.bool)
        loss = torch.zeros((rows, width), dtype=torch.bool)
        logprobs = torch.zeros((rows, width), dtype=torch.float32)
        turns = torch.full((rows, width), -1, dtype=torch.long)
        for row, episode in enumerate(episodes):
            length = len(episode.ids)
            turns[row, :length] = torch.tensor(episode.turns, dtype=torch.long)
            ids[row, :length] = torch.tensor(episode.ids, dtype=torch.long)
            real[row, :length] = True
            loss[row, :length] = torch.tensor(episode.sampled, dtype=torch.bool)
            logprobs[row, :length] = torch.tensor(episode.logprobs, dtype=torch.float32)
        stop = torch.tensor([int(episode.stop) for episode in episodes], dtype=torch.long)
        device = collector.accelerator.device
        return Sampled(prompt_ids.to(device), prompt_mask.to(device), ids.to(device), real.to(device),
                       loss.to(device), stop.to(device), logprobs.to(device), seconds, turns.to(device))


def episode_player(tokenizer, backend, sampling: SamplingSettings, environment_factory, settings: EpisodeSettings,
                   limits: Any) -> EpisodePlayer:
    """The player of a training run's episodes (EpisodeSource) and of the eval recipe's: `settings` from
    prepare_episodes, under the limits `limits` holds (an on-policy config, or the eval recipe)."""
    return EpisodePlayer(tokenizer, backend, sampling, environment_factory, settings.with_limits(limits))


def episode_source(environment_factory, settings: EpisodeSettings, config: Any):
    """The rollout source of episodes with `environment_factory`'s environments, under an on-policy config's limits
    (the collector it is given holds the models)."""
    return lambda collector: EpisodeSource(collector, environment_factory, settings, config)
