"""Write tests/fixtures/trl_1_16_config_fields.json: every dataclass field of TRL's GRPOConfig and RLOOConfig
(the inherited transformers.TrainingArguments ones included) with its default.

Run it with a Python that has TRL installed (not a dependency of training-wizard):

    python scripts/trl_config_fields.py [OUT.json]

tests/unit/test_trl_config_fields.py walks the file: each field must be accepted by our config of the same name
or refused with one line, and named in docs/trl_options.md. Regenerate it when moving to a newer TRL.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "trl_1_16_config_fields.json"


def plain(value):
    """The default as JSON: itself when JSON can hold it, else its repr (enums, callables, ...)."""
    if hasattr(value, "value") and type(value).__module__.startswith(("transformers", "trl")):
        value = value.value  # transformers' string enums (IntervalStrategy.STEPS -> "steps")
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return repr(value)


def field_defaults(config_class) -> dict:
    """Field name -> default, in declaration order; a field without any default maps to "<required>"."""
    out = {}
    for field in dataclasses.fields(config_class):
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = "<required>"
        out[field.name] = plain(value)
    return out


def main(argv: list[str]) -> int:
    import transformers
    import trl

    out = Path(argv[0]) if argv else DEFAULT_OUT
    base = {field.name for field in dataclasses.fields(transformers.TrainingArguments)}
    data = {
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "training_arguments_fields": sorted(base),
        "configs": {name: field_defaults(getattr(trl, name)) for name in ("GRPOConfig", "RLOOConfig")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"{out}: {sum(len(fields) for fields in data['configs'].values())} fields")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
