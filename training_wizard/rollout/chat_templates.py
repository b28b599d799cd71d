"""Training chat templates: what `chat_template` names when a model's own template cannot render tools or is not
prefix-preserving (rollout/chat_turns.py checks both at start).

`chat_template` is a name below ("hermes"), the path of a Jinja file, or the template itself. "hermes" is ChatML
(<|im_start|>role ... <|im_end|>) with tools in the Hermes form: the tools' JSON schemas in the system message,
calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the assistant's text, each tool result as
a user message inside `<tool_response>`. It only ever appends, so episodes can be spliced token by token. SmolLM2's
and Qwen2's tokenizers know its special tokens.
"""

from __future__ import annotations

from pathlib import Path

from training_wizard.errors import UserError

HERMES = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = none -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- if tools or system is not none -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if system is not none -%}{{- system -}}{%- if tools -%}{{- '\\n\\n' -}}{%- endif -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{- 'You can call functions to help you answer. Their JSON schemas are inside <tools></tools>:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    "{{- '</tools>\\nTo call one, write a JSON object with its name and arguments inside <tool_call></tool_call>:"
    "\\n<tool_call>\\n{\"name\": \"function name\", \"arguments\": {\"argument\": \"value\"}}\\n</tool_call>\\n"
    "Each result comes back inside <tool_response></tool_response>.' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in rest -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') -}}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set function = call['function'] if call['function'] is defined else call -%}"
    "{{- '\\n<tool_call>\\n' -}}{{- {'name': function['name'], 'arguments': function['arguments']} | tojson -}}"
    "{{- '\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

NAMED = {"hermes": HERMES}


def load_chat_template(value: str, key: str = "environment.chat_template") -> str:
    """The template `value` names: a name in NAMED, a file, or the Jinja text itself."""
    if value in NAMED:
        return NAMED[value]
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise UserError(f"{key}: {value!r} is neither a template name ({', '.join(NAMED)}), a file, nor a Jinja "
                        "template")
    return path.read_text(encoding="utf-8")
