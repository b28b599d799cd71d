"""Tools an episode's model may call: their schemas for the chat template, reading calls out of a reply, and
running them so that nothing a tool does can end the run.

A tool is a Python function (or an environment's public method) with typed arguments and a Google-style
docstring (`Args:`), TRL's contract; its JSON schema comes from transformers' `get_json_schema`, which the chat
template renders as the tool list. A call is read from the reply in the Hermes form the training templates teach,

    <tool_call>
    {"name": "calculate", "arguments": {"expression": "12 * 7"}}
    </tool_call>

or by the tokenizer's own response parser when it has one (transformers' `response_template`), or by a parser the
recipe names. Arguments are passed to the function as keywords; the model's text is never evaluated.

`ToolsProtocol` is the tool-calling environment's side of an episode's turn (the protocols and the records they
answer with: environment_protocols.py): the tools an episode may call, the calls of a reply as jobs, their results
as tool messages, and the finished episode's `get_reward()`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from training_wizard.errors import UserError
from training_wizard.rollout.environment_protocols import Answer, JobResult, Turn, error_text
from training_wizard.rollout.environments import checked_reward, method_name, parsed_calls, qualified_name, raised
from training_wizard.rollout.trajectory import StopReason

_HERMES_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

# Methods of an environment that are its protocol, never tools (TRL: every other public method is a tool).
_NOT_TOOLS = frozenset({"reset", "get_reward"})


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedReply:
    """The calls read from one reply, and how many attempted calls could not be read (malformed)."""

    calls: list[ToolCall]
    malformed: int

    @property
    def attempted(self) -> bool:
        return bool(self.calls) or self.malformed > 0


def tool_schema(function: Callable) -> dict[str, Any]:
    """The JSON schema the chat template renders for `function`; one line naming it when its signature or
    docstring cannot describe it (an argument without a type, a docstring without `Args:`)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(function)
    except Exception as exc:  # transformers raises its own parsing errors; the message names what is missing
        name = getattr(function, "__qualname__", repr(function))
        raise UserError(f"tool {name}: cannot describe it to the model ({exc}); give every argument a type and "
                        "the docstring an 'Args:' section") from None


def environment_tools(environment: Any) -> dict[str, Callable]:
    """An environment's tools: its public methods other than reset and get_reward, by name."""
    tools = {}
    for name in dir(type(environment)):
        if name.startswith("_") or name in _NOT_TOOLS:
            continue
        if inspect.isfunction(getattr(type(environment), name, None)):
            tools[name] = getattr(environment, name)
    return tools


def _call_from_json(payload: Any) -> ToolCall | None:
    """A call from its JSON object ({"name": str, "arguments": object or a JSON string of one}); None when it is
    not one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    return ToolCall(payload["name"], arguments) if isinstance(arguments, dict) else None


def parse_hermes(text: str) -> ParsedReply:
    """The `<tool_call>{json}</tool_call>` blocks of a reply. A block whose JSON cannot be read, that is not a
    call, or that never closes counts as malformed."""
    calls, malformed = [], 0
    for match in _HERMES_CALL.finditer(text):
        body, closed = match.group(1).strip(), bool(match.group(2))
        try:
            call = _call_from_json(json.loads(body)) if closed else None
        except json.JSONDecodeError:
            call = None
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    return ParsedReply(calls, malformed)


def without_calls(text: str) -> str:
    """A reply's text outside its `<tool_call>` blocks: the content of a message that carries its calls apart."""
    return _HERMES_CALL.sub("", text).strip()


def parse_with_tokenizer(tokenizer, text: str) -> ParsedReply:
    """The calls transformers' response parser reads (the tokenizer's `response_template`); a reply it cannot
    parse counts as one malformed call."""
    try:
        message = tokenizer.parse_response(text, prefix="")
    except Exception:  # the parser's own errors: the reply is not in the template's format
        return ParsedReply([], 1)
    calls, malformed = [], 0
    for entry in message.get("tool_calls") or []:
        call = _call_from_json(entry.get("function", entry) if isinstance(entry, dict) else None)
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    return ParsedReply(calls, malformed)


def reply_parser(tokenizer, custom: Callable[[str], Any] | None = None) -> Callable[[str], ParsedReply]:
    """The parser of an episode's replies: the recipe's own (`tool_parser`, text -> a list of {"name",
    "arguments"}; raising ValueError for a malformed reply), else the tokenizer's response parser, else Hermes.
    The recipe's parser breaking its contract (another exception, a value that is not a list) stops the run."""
    if custom is not None:
        def parse_custom(text: str) -> ParsedReply:
            found = parsed_calls(custom, text)
            if found is None:
                return ParsedReply([], 1)
            calls = [_call_from_json(entry) for entry in found]
            return ParsedReply([call for call in calls if call], sum(call is None for call in calls))
        return parse_custom
    if getattr(tokenizer, "response_template", None):
        return lambda text: parse_with_tokenizer(tokenizer, text)
    return parse_hermes


def call_tool(tools: dict[str, Callable], call: ToolCall) -> tuple[str, bool]:
    """(the tool's result as text, whether the call failed). An unknown tool, arguments the function does not
    take, or an exception inside it give an error text; an async tool is run to its end."""
    function = tools.get(call.name)
    if function is None:
        return error_text(f"unknown tool {call.name!r}; the tools are: {', '.join(sorted(tools)) or 'none'}"), True
    arguments = typed_arguments(function, call.arguments)
    try:
        inspect.signature(function).bind(**arguments)
    except TypeError as exc:
        return error_text(f"bad arguments for {call.name}: {exc}"), True
    try:
        result = awaited_value(function(**arguments))
    except Exception as exc:  # a tool's failure is the model's information, never the run's end
        return error_text(f"{type(exc).__name__}: {exc}"), True
    # str(), as TRL 1.16 gives a result to the model: a dict reads {'a': 1}, True reads True
    return str(result), False


def typed_arguments(function: Callable, arguments: dict[str, Any]) -> dict[str, Any]:
    """The model's arguments typed by the tool's JSON schema, as transformers' `parse_response(..., tools=)` types
    them for TRL: the text "6" for an integer parameter is 6, for a string one it stays "6"; text that does not
    read as the declared type is passed as it is (the tool says what is wrong)."""
    try:
        properties = tool_schema(function)["function"]["parameters"].get("properties") or {}
    except (UserError, KeyError, TypeError):  # no schema to type by: the arguments as the model wrote them
        return dict(arguments)
    return {key: _typed(value, _schema_types(properties.get(key))) if isinstance(value, str) else value
            for key, value in arguments.items()}


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a parameter's schema allows, unions and Optional (nullable) included."""
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or [] if isinstance(t, str)]
    for choice in [*(schema.get("anyOf") or []), *(schema.get("oneOf") or [])]:
        types += _schema_types(choice)
    return types + (["null"] if schema.get("nullable") else [])


def _typed(text: str, types: list[str]) -> Any:
    """`text` read as the first of `types` it is written as; itself when none (a string parameter)."""
    for kind in types:
        try:
            if kind == "integer":
                number = float(text)  # JSON Schema counts 3.0 as an integer
                if number.is_integer():
                    return int(text) if text.strip().lstrip("+-").isdigit() else int(number)
            elif kind == "number":
                number = float(text)
                if math.isfinite(number):
                    return int(number) if number.is_integer() and "." not in text else number
            elif kind == "boolean" and text.strip().lower() in ("true", "false", "1", "0"):
                return text.strip().lower() in ("true", "1")
            elif kind == "null" and text.strip() in ("null", "None"):
                return None
            elif kind in ("object", "array"):
                value = json.loads(text)
                if isinstance(value, dict if kind == "object" else list):
                    return value
        except ValueError:  # not written as this type: try the next
            continue
    return text


def awaited_value(value: Any) -> Any:
    """An async function's value (its coroutine run to the end, on this thread's own loop); a plain value as it
    is. Tools and get_reward may be either, as in TRL."""
    return asyncio.run(_awaited(value)) if inspect.isawaitable(value) else value


async def _awaited(awaitable):
    return await awaitable


def refuse_duplicate_tools(named: list[tuple[str, Callable]]) -> None:
    """Two tools of one name would be shown to the model twice while only one could run: one line naming both."""
    seen: dict[str, Callable] = {}
    for name, function in named:
        if name in seen:
            raise UserError(f"environment: two tools are named {name!r} ({_tool_name(seen[name])} and "
                            f"{_tool_name(function)}); the model could call only one of them: rename one")
        seen[name] = function


def _tool_name(function: Callable) -> str:
    owner = getattr(function, "__self__", None)
    return method_name(owner, function.__name__) if owner is not None else qualified_name(function)


class ToolsProtocol:
    """Tool calls each turn until a reply calls none, or max_tool_calling_iterations rounds have run."""

    name = "tools"

    def __init__(self, functions: list[Callable], max_rounds: int | None):
        refuse_duplicate_tools([(function.__name__, function) for function in functions])
        self.functions = {function.__name__: function for function in functions}
        self.function_schemas = [tool_schema(function) for function in functions]
        self.max_rounds = max_rounds

    def tools_of(self, environment: Any) -> tuple[dict[str, Callable], list[dict] | None]:
        """The tools an episode may call (its environment's methods, then the plain functions) and their
        schemas for the chat template."""
        methods = environment_tools(environment) if environment is not None else {}
        refuse_duplicate_tools([*methods.items(), *self.functions.items()])
        schemas = [tool_schema(method) for method in methods.values()] + self.function_schemas
        return {**methods, **self.functions}, schemas or None

    def turn(self, environment: Any, tools: dict, reply: str, replies: int, parse, row: int = -1) -> Turn | Answer:
        parsed: ParsedReply = parse(reply)
        if not parsed.attempted:
            return Answer(stop=StopReason.STOP_TOKEN)  # no call: this reply is the model's answer
        if self.max_rounds is not None and replies > self.max_rounds:
            return Answer(stop=StopReason.TOOL_BUDGET)  # its calls are not run, nor counted

        def answer(results: list[JobResult]) -> Answer:
            messages, failures = [], 0
            for call, found in zip(parsed.calls, results):
                text, failed = (error_text(found.error), True) if found.error is not None else found.value
                failures += failed
                messages.append({"role": "tool", "name": call.name, "content": text})
            for _ in range(parsed.malformed):
                messages.append({"role": "tool", "name": "error", "content": error_text(
                    "a tool call could not be read: expected <tool_call> JSON with name and arguments </tool_call>")})
            return Answer(messages, calls=len(parsed.calls), failures=failures, malformed=parsed.malformed)
        return Turn([_bound(tools, call) for call in parsed.calls], answer)

    def final_reward(self, environment: Any, row: int = -1) -> float:
        """The finished episode's `get_reward()` (0 without one); its exception or a value that is not a finite
        number is the environment's bug: one line naming the method and the row."""
        scorer = getattr(environment, "get_reward", None)
        if scorer is None:
            return 0.0
        where = f"environment: dataset row {row}: {method_name(environment, 'get_reward')}"
        try:
            value = awaited_value(scorer())
        except Exception as error:  # noqa: BLE001 - the environment's own scorer: a bug the run cannot go on with
            raise UserError(f"{where} raised {raised(error)}") from None
        return checked_reward(where, value)


def _bound(tools: dict[str, Callable], call: ToolCall) -> Callable[[], tuple[str, bool]]:
    return lambda: call_tool(tools, call)
