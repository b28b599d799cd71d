"""Writes the data of examples/tools: "What is a * b + c?" (a, b two digits, c three digits), no two rows alike.

    data/demonstrations.jsonl  256 worked episodes for the SFT warm start (sft.toml): the question, the
                               assistant's calculator call, the tool's result, the assistant's answer; with the
                               calculator's schema in a `tools` column (TRL's tool-calling SFT format)
    data/train.jsonl           1,024 questions for GRPO (grpo.toml), with their answer
    data/test.jsonl            128 held-out questions for evaluate.toml

Seeded, so the files are the same on every run:  python examples/tools/make_data.py
"""

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.tools.calculator import Calculator  # noqa: E402
from training_wizard.rollout.tools import tool_schema  # noqa: E402

SIZES = {"demonstrations": 256, "train": 1_024, "test": 128}


def problems(count: int, rng: random.Random, seen: set) -> list[tuple[int, int, int]]:
    found = []
    while len(found) < count:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(100, 999)
        if (a, b, c) not in seen:
            seen.add((a, b, c))
            found.append((a, b, c))
    return found


def demonstration(a: int, b: int, c: int, schema: dict) -> dict:
    expression = f"{a} * {b} + {c}"
    call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    return {"messages": [{"role": "user", "content": f"What is {expression}?"},
                         {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                         {"role": "tool", "name": "calculate", "content": str(a * b + c)},
                         {"role": "assistant", "content": f"The answer is {a * b + c}."}],
            "tools": [schema]}


def main() -> None:
    rng, seen = random.Random(7), set()
    schema = tool_schema(Calculator().calculate)  # what the GRPO run's template renders, so the prompts agree
    folder = Path(__file__).parent / "data"
    folder.mkdir(exist_ok=True)
    for name, count in SIZES.items():
        rows = [demonstration(a, b, c, schema) if name == "demonstrations"
                else {"prompt": [{"role": "user", "content": f"What is {a} * {b} + {c}?"}], "answer": a * b + c}
                for a, b, c in problems(count, rng, seen)]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} rows to {folder / name}.jsonl")


if __name__ == "__main__":
    main()
