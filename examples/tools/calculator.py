"""The calculator environment of examples/tools, in TRL's environment_factory contract: its public method
`calculate` is the tool the model calls; the reward reads the episode's last reply.

The expression is parsed with Python's `ast` and walked node by node: integers, + - * and parentheses only.
Nothing the model writes is evaluated as code.
"""

from __future__ import annotations

import ast
import operator
import re

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_LAST_NUMBER = re.compile(r"-?\d[\d,]*")


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return -_value(node.operand) if isinstance(node.op, ast.USub) else _value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only integers, +, -, * and parentheses")


class Calculator:
    """One per episode; counts the calls it answered."""

    def __init__(self):
        self.calls = 0

    def reset(self, **row) -> None:
        self.calls = 0
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression of integers with +, -, * and parentheses.

        Args:
            expression: The expression, e.g. "23 * 41 + 100".
        """
        if len(expression) > 200:
            raise ValueError("the expression is too long")
        self.calls += 1
        return str(_value(ast.parse(expression.replace("×", "*"), mode="eval")))


def last_reply(completion) -> str:
    """The text of a completion: a string, or (an episode in TRL's form) its last assistant message."""
    if isinstance(completion, str):
        return completion
    replies = [message["content"] for message in completion if message["role"] == "assistant"]
    return replies[-1] if replies else ""


def right_answer(completions, answer, **columns) -> list[float]:
    """1.0 when the last number of the episode's last reply is the answer."""
    scores = []
    for completion, expected in zip(completions, answer):
        numbers = _LAST_NUMBER.findall(last_reply(completion))
        scores.append(float(bool(numbers) and numbers[-1].replace(",", "") == str(expected)))
    return scores
