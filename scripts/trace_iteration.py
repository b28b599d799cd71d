"""Count, at run time, the package functions one GRPO training iteration passes through and how often the path
switches between files: the figure a refactor of the package's layout is judged by (before and after).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python scripts/trace_iteration.py [--case single|tools|both]
        [--json] [--list]

Definition. A run of exactly one iteration (max_steps = 1: one batch of 4 completions, 2 per prompt; no checkpoint
save, no evaluation, no sample table, no extra tracker) is built first, untraced; then `trainer.train()` is traced,
so the trace holds the iteration itself beside train()'s own start and finish. Every Python "call" event (the
profile hook, on the main thread and on any thread started while tracing) whose code object's file lies inside the
training_wizard package is recorded, except code named `<lambda>`, `<listcomp>`, `<dictcomp>`, `<setcomp>` or
`<genexpr>`. A call on a thread started while tracing is read where that thread was started (right after the
package call before the start, as the thread's own calls follow in order), so the order does not depend on the
threads' timing.
- stops: the distinct functions (file, qualname) in the order of their FIRST call: the reading order, a
  depth-first walk of the call tree;
- files: the distinct files among the stops;
- switches: the number of consecutive pairs in that ordered list whose files differ.

The cases: "single" is single-turn GRPO (one reply per prompt); "tools" is GRPO with a TRL-style
`environment_factory` (a class whose public methods are tools and whose get_reward scores the episode): every
episode makes one tool call, reads its result and answers. Both use only the public API (`from training_wizard
import GRPOConfig, GRPOTrainer` with TRL's arguments, and training_wizard.testing's tiny tokenizer, model and
scripted generation backend; the tools case renders tools with rollout/chat_templates.py's Hermes template), a tiny random Qwen2 (hidden 64, 2 layers) on the CPU, and scripted replies, so the
run is short and the same every time. The scripted backend lives in training_wizard/testing.py, so its `sample`
is one of the stops.

Output: a table (case, stops, files, switches); --json: one JSON line per case {"case", "stops", "files",
"switches"}; --list: the ordered stops, one `file:qualname` a line, for a reviewer to read the path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import training_wizard  # noqa: E402
from training_wizard import GRPOConfig, GRPOTrainer  # noqa: E402
from training_wizard.testing import build_causal_lm, build_tokenizer, scripted_backend  # noqa: E402
from training_wizard.rollout.chat_templates import HERMES  # noqa: E402 - the tools case renders tools with it

PACKAGE_DIR = Path(training_wizard.__file__).resolve().parent
SKIPPED_NAMES = {"<lambda>", "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}
THREAD_START = threading.Thread.start.__code__
CASES = ("single", "tools")
QUESTIONS = ("What is 6 times 7?", "What is 3 times 5?")

TOOL_CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


# ---------------------------------------------------------------------------------------------------- counting
def count_switches(stops: list[tuple[str, str]]) -> int:
    """The number of consecutive pairs of (file, qualname) stops whose files differ."""
    return sum(first[0] != second[0] for first, second in zip(stops, stops[1:]))


def summary(case: str, stops: list[tuple[str, str]]) -> dict:
    return {"case": case, "stops": len(stops), "files": len({file for file, _ in stops}),
            "switches": count_switches(stops)}


def package_file(code) -> str | None:
    """The code object's file relative to the repository root (training_wizard/...), or None outside the package."""
    path = Path(code.co_filename).resolve()
    return path.relative_to(PACKAGE_DIR.parent).as_posix() if path.is_relative_to(PACKAGE_DIR) else None


class CallOrder:
    """The profile hook: the package's functions with the reading-order key of their first call. A key is a tuple:
    (n,) for the main thread's n-th package call; a thread started after its starter's call with key K numbers its
    own calls K + (t, n), t counting the threads started there, so they sort right after the call that started
    the thread and before the starter's next one, whatever the threads' timing."""

    def __init__(self):
        self.first: dict[tuple[str, str], tuple] = {}  # (file, qualname) -> the key of its first call
        self.files: dict[object, str | None] = {}  # code object -> package file, each resolved once
        self.bases: dict[threading.Thread, tuple] = {threading.current_thread(): ()}  # thread -> its keys' prefix
        self.started: dict[tuple, int] = {}  # a key -> how many threads were started after it
        self.local = threading.local()  # this thread's prefix and last key
        self.lock = threading.Lock()

    def _last_key(self) -> tuple:
        if not hasattr(self.local, "last"):
            thread = threading.current_thread()
            self.local.base = self.bases.get(thread, (math.inf, id(thread)))  # started elsewhere: read last
            self.local.count = 0
            self.local.last = self.local.base + (0,)
        return self.local.last

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        with self.lock:
            if code is THREAD_START:  # the started thread's calls are read after this thread's last call
                last = self._last_key()
                self.started[last] = self.started.get(last, 0) + 1
                self.bases[frame.f_locals["self"]] = last + (self.started[last],)
                return
            if code.co_name in SKIPPED_NAMES:
                return
            if code not in self.files:
                self.files[code] = package_file(code)
            if self.files[code] is None:
                return
            self._last_key()
            self.local.count += 1
            self.local.last = self.local.base + (self.local.count,)
            self.first.setdefault((self.files[code], code.co_qualname), self.local.last)

    def stops(self) -> list[tuple[str, str]]:
        return sorted(self.first, key=self.first.__getitem__)


def traced_stops(run) -> list[tuple[str, str]]:
    """Call `run()` with every call event recorded; the package's functions (file, qualname) in order of first
    call, the skipped names left out (module docstring)."""
    order = CallOrder()
    before = sys.getprofile(), threading.getprofile()
    threading.setprofile(order.profile)
    sys.setprofile(order.profile)
    try:
        run()
    finally:
        sys.setprofile(before[0])
        threading.setprofile(before[1])
    return order.stops()


# ---------------------------------------------------------------------------------------------------- the runs
@dataclass
class Sampled:
    """What a generation backend's sampler gives (tokens, and logprobs unused with logprobs_from_sampling off)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor


class Calculator:
    """The environment: its one tool multiplies; the reward is the number of multiplications done."""

    def reset(self, **row):
        self.multiplications = 0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.multiplications += 1
        return a * b

    def get_reward(self) -> float:
        return float(self.multiplications)


def reply_length(prompts, completions, **columns):
    """A TRL-form reward: the length of the completion's text (or of its messages)."""
    return [float(len(str(completion))) for completion in completions]


def scripted_replies(tokenizer, tools: bool):
    """A backend giving fixed replies: single-turn, a short answer that differs by row; with tools, a call to
    multiply on the first turn and an answer once the context holds its result."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def reply(context: str, row: int) -> str:
        if tools:
            return "It is 42." if "<tool_response>\n" in context else TOOL_CALL
        return ["It is 42.", "Forty-two.", "It is 15.", "Fifteen."][row % 4]

    def sample(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        rows = [tokenizer(reply(tokenizer.decode(ids[keep].tolist()), row), add_special_tokens=False)["input_ids"]
                + [end] for row, (ids, keep) in enumerate(zip(prompt_ids, prompt_mask))]
        tokens = torch.full((len(rows), max(map(len, rows))), tokenizer.pad_token_id, dtype=torch.long)
        for index, ids in enumerate(rows):
            tokens[index, : len(ids)] = torch.tensor(ids)
        return Sampled(tokens, torch.zeros(tokens.shape))

    return scripted_backend(sample)


def build_trainer(case: str, output_dir: str) -> GRPOTrainer:
    """One iteration of GRPO (TRL's constructor) on the tiny Qwen2: single-turn, or with the Calculator."""
    tools = case == "tools"
    tokenizer = build_tokenizer()
    if tools:
        tokenizer.chat_template = HERMES
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    args = GRPOConfig(output_dir=output_dir, max_steps=1, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=320 if tools else 16, num_sample_generations=0, report_to="none",
                      logging_steps=1, save_steps=None,
                      logprobs_from_sampling=False, bf16=False, gradient_checkpointing=False, seed=0,
                      stop_token_ids=[end])
    dataset = [{"prompt": [{"role": "user", "content": question}]} for question in QUESTIONS]
    environment = {"environment_factory": Calculator} if tools else {}
    return GRPOTrainer(model=build_causal_lm(tokenizer, arch="qwen2", hidden_size=64, num_layers=2),
                       processing_class=tokenizer, reward_funcs=reply_length, args=args, train_dataset=dataset,
                       generation_backend=scripted_replies(tokenizer, tools), **environment)


def trace_iteration(case: str) -> dict:
    """The case's summary (case, stops, files, switches) and its ordered stops under "list"."""
    if case not in CASES:
        raise ValueError(f"case: one of {', '.join(CASES)}, got {case!r}")
    torch.manual_seed(0)
    # the run's own lines (progress, notes) go to stderr, so stdout holds only the figures
    with tempfile.TemporaryDirectory() as output_dir, contextlib.redirect_stdout(sys.stderr):
        trainer = build_trainer(case, output_dir)
        if trainer.plan.num_iterations != 1:
            raise RuntimeError(f"expected a run of one iteration, got {trainer.plan.num_iterations}")
        stops = traced_stops(trainer.train)
    return {**summary(case, stops), "list": [f"{file}:{qualname}" for file, qualname in stops]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=[*CASES, "both"], default="both")
    parser.add_argument("--json", action="store_true", help="one JSON line per case instead of the table")
    parser.add_argument("--list", action="store_true", help="the ordered stops (file:qualname) of each case")
    options = parser.parse_args(argv)
    results = [trace_iteration(case) for case in (CASES if options.case == "both" else [options.case])]
    if options.json:
        for result in results:
            print(json.dumps({key: result[key] for key in ("case", "stops", "files", "switches")}))
    else:
        print(f"{'case':<8} {'stops':>6} {'files':>6} {'switches':>9}")
        for result in results:
            print(f"{result['case']:<8} {result['stops']:>6} {result['files']:>6} {result['switches']:>9}")
    if options.list:
        for result in results:
            print(f"\n# {result['case']}: the stops in order of first call")
            print("\n".join(result["list"]))


if __name__ == "__main__":
    main()
