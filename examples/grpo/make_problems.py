"""Write data/products.jsonl: every product a * b of two numbers from 2 to 12 (121 problems), as conversational
prompt rows with the answer in their own column. Deterministic: rerunning it rewrites the same file.

    python examples/grpo/make_problems.py
"""

import json
from pathlib import Path

QUESTION = "What is {a} * {b}? Reply with the equation only, like 3 * 4 = 12."


def problems() -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": QUESTION.format(a=a, b=b)}], "answer": str(a * b)}
        for a in range(2, 13)
        for b in range(2, 13)
    ]


if __name__ == "__main__":
    target = Path(__file__).parent / "data" / "products.jsonl"
    target.write_text("".join(json.dumps(row) + "\n" for row in problems()))
    print(f"wrote {target}")
