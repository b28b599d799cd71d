"""Write tests/fixtures/trl_rewards.json: what TRL's `trl.rewards` returns on its own docstring examples and on 50
generated inputs per function and setting, with the name each function is logged under (its `__name__`).

TRL is no dependency of training-wizard: run this with a separate environment that has TRL 1.16 and math-verify
0.9.0 (the version requirements.txt pins), for example

    python3 -m venv /tmp/trlvenv
    /tmp/trlvenv/bin/pip install torch==2.13.0 "trl==1.16.*" math-verify==0.9.0
    /tmp/trlvenv/bin/python scripts/trl_reward_fixture.py

tests/unit/test_trl_rewards.py then checks that `training_wizard.rewards` gives the same outputs and names. The
inputs are built without randomness, so running the script again writes the same file.
"""

from __future__ import annotations

import argparse
import itertools
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable

import trl.rewards

ROWS = 50
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "trl_rewards.json"

# Gold answers as datasets hold them: numbers, fractions, LaTeX that math-verify parses, and text it cannot.
GOLDS = ["3", "-4", "0", "0.5", "1,234", r"\frac{1}{3}", r"\frac{2}{6}", r"$\frac{1}{2}$", r"\dfrac{3}{4}",
         r"\sqrt{2}", r"2\sqrt{3}", "x^2 + 1", r"\pi", r"\frac{\pi}{2}", r"10\%", "(1, 2)", r"\{1, 2\}",
         r"\boxed{7}", r"5 \text{ cm}", "1/3", "a third", "", r"\frac{1}{", r"\text{yes}", "x = 5", "[0, 1)",
         r"\infty", "e^{2}", "3.14"]

# Completion texts: G is the gold answer, W another one. Boxed, inline and plain answers, think blocks (closed,
# unclosed, nested), other reasoning delimiters, malformed LaTeX and the empty text.
TEMPLATES = [r"The answer is \boxed{G}", r"\boxed{W}", "G", "The answer is G.", "$G$", r"\(G\)", "$$G$$",
             "<think>\nG? no, W\n</think>\nSo \\boxed{G}", "<think>\nMaybe \\boxed{G}\n</think>\nFinal: \\boxed{W}",
             "<think> unfinished \\boxed{G}", "", r"\boxed{G", r"\boxed{}", r"First \boxed{W} then \boxed{G}",
             "Answer: G", "</think> \\boxed{G}", "<think>a</think><think>b</think> \\boxed{G}",
             "<reasoning>W</reasoning> Final answer: \\boxed{G}", "Final answer: $W$ </reasoning> \\boxed{G}",
             "</think>\\boxed{W}</reasoning>\\boxed{G}", r"\boxed{G} \text{ meters}", r"\frac{G}{", "G = W",
             r"$\boxed{G}$ and $W$"]


def message(text: str) -> list[dict[str, str]]:
    """A completion in TRL's conversational form, the one form its functions read."""
    return [{"role": "assistant", "content": text}]


def answer_rows(offset: int = 0) -> tuple[list[list[dict[str, str]]], list[str]]:
    """ROWS completions and their gold answers, each template meeting many golds (the steps are coprime)."""
    completions, solutions = [], []
    for row in range(offset, offset + ROWS):
        gold, wrong = GOLDS[row % len(GOLDS)], GOLDS[(3 * row + 1) % len(GOLDS)]
        template = TEMPLATES[(7 * row + row // len(GOLDS)) % len(TEMPLATES)]
        text = template.replace("G", "\x00").replace("W", wrong).replace("\x00", gold)
        completions.append(message(text))
        solutions.append(gold)
    return completions, solutions


def think_texts() -> list[str]:
    """ROWS texts around the <think> format: prefixes, tag spellings, bodies and what follows."""
    parts = itertools.product(["", " ", "\n", "x"], ["<think>", "<think >", ""], ["r", "a\nb", "", "<think>"],
                              ["</think>", "</Think>", ""], ["", " ans", "\n<think>x</think>", "\n\nanswer\nmore"])
    every = list(parts)
    return ["".join(combo) for combo in every[:: len(every) // ROWS][:ROWS]]


def lengths_around(*edges: int) -> list[int]:
    """ROWS token counts: 0, 1, each edge and its neighbours, then counts spread up to about twice the last edge."""
    near = sorted({max(0, edge + delta) for edge in edges for delta in (-2, -1, 0, 1, 2)} | {0, 1})
    spread = 2 * edges[-1] + 3
    return (near + [(7 * step + 3) % spread for step in range(ROWS)])[:ROWS]


def token_rows(ngram_size: int) -> list[list[int]]:
    """ROWS token id lists: empty, shorter than the n-gram, constant, periodic, counting, and a fixed pseudo-random
    sequence from a small vocabulary (a linear congruential generator, so no library's randomness is involved)."""
    rows: list[list[int]] = [[], [7], [7] * max(ngram_size - 1, 0), [7] * ngram_size]
    state = 12345
    while len(rows) < ROWS:
        kind, length = len(rows) % 4, 3 + (len(rows) * 5) % 37
        if kind == 0:
            rows.append([5] * length)
        elif kind == 1:
            period = 2 + len(rows) % 5
            rows.append([index % period for index in range(length)])
        elif kind == 2:
            rows.append(list(range(length)))
        else:
            ids = []
            for _ in range(length):
                state = (1103515245 * state + 12345) % 2**31
                ids.append(state % 6)
            rows.append(ids)
    return rows


def case(label: str, function: str, factory: dict[str, Any] | None, args: list[Any], kwargs: dict[str, Any],
         logs_extra: bool = False) -> dict[str, Any]:
    """Call TRL's function (built by the factory if there is one) and record inputs, outputs and name."""
    reward: Callable = getattr(trl.rewards, function)
    if factory is not None:
        reward = reward(**factory)
    extra: dict[str, list] = {}
    if logs_extra:
        kwargs = {**kwargs, "log_extra": lambda column, values: extra.__setitem__(column, values)}
    output = reward(*args, **kwargs)
    kwargs.pop("log_extra", None)
    record = {"case": label, "function": function, "factory": factory, "args": args, "kwargs": kwargs,
              "name": reward.__name__, "output": output}
    if logs_extra:
        record["log_extra"] = extra
    return record


def docstring_cases() -> list[dict[str, Any]]:
    """The examples of TRL 1.16's docstrings, called as they are written there."""
    third = r"\frac{1}{3}"
    reasoning = [message(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}"),
                 message(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}"),
                 message(r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer")]
    return [
        case("docstring", "accuracy_reward", None, [[message(r"My answer is \boxed{\frac{1}{3}}"),
                                                     message(r"My answer is \boxed{\frac{1}{2}}")], [third, third]],
             {}, logs_extra=True),
        case("docstring", "reasoning_accuracy_reward", None, [reasoning, [third] * 3],
             {"reasoning_delimiters": ["</think>"]}, logs_extra=True),
        case("docstring", "get_cosine_scaled_reward", {"max_len": 100},
             [[[{"content": r"\boxed{\frac{1}{3}}"}], [{"content": r"\boxed{\frac{1}{2}}"}]], [third, third],
              [[1] * 50, [1] * 50]], {}),
        case("docstring", "think_format_reward", None,
             [[[{"content": "<think>\nThis is my reasoning.\n</think>\nThis is my answer."}],
               [{"content": "<think>\nThis is my reasoning.\nThis is my answer."}]]], {}),
        case("docstring", "get_repetition_penalty_reward", {"ngram_size": 2, "max_penalty": -1.0},
             [[[1, 2, 3, 4], [5, 5, 5, 5, 5]]], {}),
        case("docstring", "get_soft_overlong_punishment", {"max_completion_len": 100, "soft_punish_cache": 20},
             [[[1] * 90]], {}),
    ]


def generated_cases() -> list[dict[str, Any]]:
    """ROWS inputs per function and setting, passed by keyword as a trainer passes them."""
    completions, solutions = answer_rows()
    shifted, shifted_solutions = answer_rows(offset=ROWS)
    cases = [
        case("generated", "accuracy_reward", None, [], {"completions": completions, "solution": solutions},
             logs_extra=True),
        case("generated", "reasoning_accuracy_reward", None, [],
             {"completions": completions, "solution": solutions}, logs_extra=True),
        case("generated", "reasoning_accuracy_reward", None, [],
             {"completions": shifted, "solution": shifted_solutions,
              "reasoning_delimiters": ["</reasoning>", "Final answer:"]}, logs_extra=True),
        case("generated", "think_format_reward", None, [], {"completions": [message(t) for t in think_texts()]}),
    ]
    for factory in ({"max_len": 100}, {"max_len": 20, "min_value_wrong": -2.0, "max_value_wrong": 0.0,
                                       "min_value_correct": 0.25, "max_value_correct": 2.0}):
        lengths = lengths_around(factory["max_len"] // 2, factory["max_len"])
        cases.append(case("generated", "get_cosine_scaled_reward", factory, [],
                          {"completions": completions, "solution": solutions,
                           "completion_ids": [[1] * n for n in lengths]}))
    for factory in ({}, {"ngram_size": 2, "max_penalty": -0.5}, {"ngram_size": 1, "max_penalty": -2.0}):
        rows = token_rows(factory.get("ngram_size", 3))
        cases.append(case("generated", "get_repetition_penalty_reward", factory, [], {"completion_ids": rows}))
    for max_len, cache in ((100, 20), (16, 4), (8, 0), (4, 6)):
        lengths = lengths_around(max_len - cache, max_len)
        cases.append(case("generated", "get_soft_overlong_punishment",
                          {"max_completion_len": max_len, "soft_punish_cache": cache}, [],
                          {"completion_ids": [[1] * n for n in lengths]}))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the fixture")
    out = parser.parse_args().out
    versions = {"trl": version("trl"), "math_verify": version("math-verify")}
    cases = docstring_cases() + generated_cases()
    # one case a line: a regenerated fixture's diff shows which cases changed
    lines = ",\n".join(json.dumps(record, ensure_ascii=False) for record in cases)
    out.write_text(json.dumps(versions)[:-1] + ', "cases": [\n' + lines + "\n]}\n")
    print(f"wrote {len(cases)} cases (trl {versions['trl']}, math-verify {versions['math_verify']}) to {out}")


if __name__ == "__main__":
    main()
