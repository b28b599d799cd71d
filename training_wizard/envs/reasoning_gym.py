"""reasoning-gym's procedural tasks as prompts, as a reward and as a multi-turn environment.

    [dataset]
    spec_class = "training_wizard.envs.reasoning_gym.ReasoningGymDataSpec"
    task = "leg_counting"           # any name of reasoning_gym.factory.DATASETS
    config = { max_animals = 3 }    # the task's own config fields
    size = 1128                     # distinct questions generated from `seed`
    hold_out = 128                  # the last 128 are the held-out part (part = "held_out" in an eval)

    [reward]
    spec_class = "training_wizard.envs.reasoning_gym.ReasoningGymRewardSpec"

Each row keeps what regenerates its item (task, config, seed, index) in a `reasoning_gym` column, so the reward and
the environment score a reply with the task's own `score_answer` on exactly the item the prompt asked. The answer
is read from the reply as reasoning-gym's own training scripts read it: the content of the last
`<answer>...</answer>`; a reply without one is scored as no answer (0 for every task).

`RetryWithFeedback` (text protocol) plays a task as several attempts: a reply the scorer does not grade fully right
gets its verdict and another turn, up to `max_attempts` replies.

reasoning-gym is an optional dependency (`pip install -e .[envs]`): nothing here imports it until a spec or an
environment is used.
"""

from __future__ import annotations

import difflib
import functools
import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from training_wizard.errors import UserError
from training_wizard.specs.dataset import DataSourceSpec
from training_wizard.specs.reward import RewardSpec
from training_wizard.specs.verifiable import completion_text, last_number_text

# Distinct questions are searched for among at most this many items per question wanted: a task whose space of
# questions is smaller than `size` is refused rather than searched forever.
SEARCH_FACTOR = 20


def reasoning_gym_module():
    """The reasoning_gym package, or the one line that says how to install it."""
    try:
        import reasoning_gym
    except ImportError:
        raise UserError("reasoning-gym is not installed: pip install -e '.[envs]' (requirements-envs.txt pins "
                        "it)") from None
    return reasoning_gym


def system_prompts() -> dict[str, str]:
    return reasoning_gym_module().utils.SYSTEM_PROMPTS


@functools.lru_cache(maxsize=64)
def _generator(task: str, config_json: str, seed: int, size: int):
    return reasoning_gym_module().create_dataset(task, seed=seed, size=size, **json.loads(config_json))


def task_generator(task: str, config: dict[str, Any], seed: int, size: int):
    """The task's generator (cached: scoring regenerates items from it)."""
    return _generator(task, json.dumps(config, sort_keys=True), seed, size)


def item_of(key: str | dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(the task's generator, the item) a row's `reasoning_gym` column names."""
    found = json.loads(key) if isinstance(key, str) else key
    generator = task_generator(found["task"], found["config"], found["seed"], found["size"])
    return generator, generator[found["index"]]


def extract_answer(reply: str, answer_tag: str = "answer", fallback: Literal["none", "last_number"] = "none"
                   ) -> str | None:
    """The content of the reply's last `<answer_tag>...</answer_tag>` (stripped; reasoning-gym's own
    `extract_answer`). A reply without one: None (no answer), or with fallback "last_number" its last number."""
    found = reasoning_gym_module().utils.extract_answer(reply, tag_name=answer_tag)
    if found is None and fallback == "last_number":
        return last_number_text(reply)
    return found


def score_reply(key: str | dict[str, Any], reply: str, answer_tag: str = "answer",
                fallback: Literal["none", "last_number"] = "none") -> tuple[float, str | None]:
    """(the task's score of the reply's answer, the answer read) for the item a `reasoning_gym` column names."""
    generator, item = item_of(key)
    answer = extract_answer(reply, answer_tag, fallback)
    return float(generator.score_answer(answer, item)), answer


class ReasoningGymDataSpec(DataSourceSpec):
    """Prompt rows from one reasoning-gym task: `size` items with distinct questions, generated from `seed`.

    Columns: `prompt` (the system prompt, if any, and the question as the user's message), `question`, `answer`
    (the task's reference answer, as text) and `reasoning_gym` (what regenerates the item for scoring). Use
    `hold_out` for a held-out part: it is cut from the same distinct questions, so no question is in both parts."""

    task: str = Field(description="The task's name in reasoning-gym (e.g. 'leg_counting', 'basic_arithmetic').")
    config: dict[str, Any] = Field(default_factory=dict, description="The task's config fields (its dataclass), "
                                   "e.g. {max_animals = 3}; its seed and size are the keys below.")
    size: int = Field(gt=0, description="Rows: items with distinct questions, the first found from index 0 on.")
    seed: int = Field(0, description="The task generator's seed: the same seed gives the same items.")
    system_prompt: str | None = Field(
        "default", description="The first message: a name from reasoning-gym's SYSTEM_PROMPTS ('default', "
        "'direct', 'simple', 'chain_of_draft', 'DeepSeekZero'), the text itself, or none (no system message).")

    @field_validator("config")
    @classmethod
    def _own_keys(cls, config: dict[str, Any]) -> dict[str, Any]:
        taken = sorted({"seed", "size"} & set(config))
        if taken:
            raise ValueError(f"'{taken[0]}' is a key of its own beside config")
        return config

    @model_validator(mode="after")
    def _task_exists(self) -> ReasoningGymDataSpec:
        """Make the generator when the recipe loads, so a wrong task name or config field fails --dry-run."""
        known = reasoning_gym_module().factory.DATASETS
        if self.task not in known:
            close = difflib.get_close_matches(self.task, sorted(known), n=3)
            raise ValueError(f"task '{self.task}' is not a reasoning-gym task" +
                             (f" (did you mean {', '.join(close[:3])}?)" if close else ""))
        try:
            task_generator(self.task, self.config, self.seed, 1)
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValueError(f"config of task '{self.task}': {exc}") from None
        return self

    def system_message(self) -> str | None:
        if self.system_prompt is None or self.system_prompt == "":
            return None
        return system_prompts().get(self.system_prompt, self.system_prompt)

    def load_raw(self, label: str = "dataset"):
        import datasets

        search = self.size * SEARCH_FACTOR
        generator = task_generator(self.task, self.config, self.seed, search)
        system = self.system_message()
        rows, seen = [], set()
        for index in range(search):
            item = generator[index]
            if item["question"] in seen:
                continue
            seen.add(item["question"])
            key = {"task": self.task, "config": self.config, "seed": self.seed, "size": search, "index": index}
            prompt = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": item["question"]}]
            rows.append({"prompt": prompt, "question": item["question"], "answer": str(item["answer"]),
                         "reasoning_gym": json.dumps(key, sort_keys=True)})
            if len(rows) == self.size:
                return datasets.Dataset.from_list(rows)
        raise UserError(f"{label}.size: task '{self.task}' gave {len(rows)} distinct questions among its first "
                        f"{search} items; expected {self.size} (lower size, or widen the task's config)")

    def raw_row_origin(self, raw_index: int) -> str | None:
        return f"reasoning-gym task {self.task}, seed {self.seed}"


class ReasoningGymRewardSpec(RewardSpec):
    """The task's own `score_answer` of each reply's answer (the content of its last `<answer>...</answer>`), for
    rows from ReasoningGymDataSpec (their `reasoning_gym` column). Scores are in [0, 1]; some tasks give partial
    credit."""

    answer_tag: str = Field("answer", description="The tag the answer is read from: <answer_tag>...</answer_tag>.")
    fallback: Literal["none", "last_number"] = Field(
        "none", description="A reply without the tag: 'none' scores it as no answer (0); 'last_number' scores its "
        "last number instead (for numeric tasks and a model that does not write the tag yet).")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        keys = columns.get("reasoning_gym")
        if keys is None:
            raise UserError("reward: ReasoningGymRewardSpec needs the `reasoning_gym` column of "
                            "ReasoningGymDataSpec rows; the dataset has none")
        return [score_reply(key, completion, self.answer_tag, self.fallback)[0]
                for key, completion in zip(keys, completions)]


def reasoning_gym_reward(completions: list[Any], reasoning_gym: list[str], **kwargs: Any) -> list[float]:
    """TRL-form reward function (for `reward_funcs`): the task's own score of each completion's answer."""
    return [score_reply(key, completion_text(completion))[0] for key, completion in zip(reasoning_gym, completions)]


class RetryWithFeedback:
    """A reasoning-gym item played over several attempts (text protocol: `[environment] protocol = "text"`).

    A reply the task's scorer grades below 1 gets the verdict as the next user message ("Your answer ... scored
    0.00 ...") and another attempt, up to `max_attempts` replies. The episode's reward is the last answer's score
    times `discount ** (attempts - 1)`: a right first answer is worth 1, a right second one `discount`. Each step's
    reward is the change in that value, so the summed step rewards equal it wherever the episode ends (the run's
    `max_turns` may end it first)."""

    def __init__(self, max_attempts: int = 3, discount: float = 0.5, answer_tag: str = "answer",
                 fallback: Literal["none", "last_number"] = "none"):
        if max_attempts < 1 or not 0.0 <= discount <= 1.0:
            raise UserError(f"environment.factory_kwargs: expected max_attempts >= 1 and 0 <= discount <= 1; got "
                            f"max_attempts={max_attempts}, discount={discount}")
        self.max_attempts, self.discount, self.answer_tag, self.fallback = max_attempts, discount, answer_tag, fallback
        self.key: str | None = None
        self.attempts = 0
        self.value = 0.0  # the episode's reward so far: what the step rewards have summed to

    def reset(self, reasoning_gym: str | None = None, **row: Any) -> None:
        if reasoning_gym is None:
            raise UserError("environment: RetryWithFeedback needs the `reasoning_gym` column of "
                            "ReasoningGymDataSpec rows")
        self.key, self.attempts, self.value = reasoning_gym, 0, 0.0
        return None  # the prompt already asks the question

    def step(self, reply: str) -> tuple[str | None, float, bool]:
        self.attempts += 1
        score, answer = score_reply(self.key, reply, self.answer_tag, self.fallback)
        value = score * self.discount ** (self.attempts - 1)
        reward, self.value = value - self.value, value
        if score >= 1.0 or self.attempts >= self.max_attempts:
            return None, reward, True
        tag = self.answer_tag
        if answer is None:
            verdict = f"No answer was found in your reply (expected <{tag}>...</{tag}>), so it scored 0."
        else:
            verdict = f"Your answer {answer!r} scored {score:.2f} of 1; it is not right."
        return f"{verdict} Try again, with the final answer in <{tag}>...</{tag}>.", reward, False
