"""Generated fuzz through the CLI entry point (in-process, --dry-run): malformed recipes and malformed dataset rows
each end in exit code 2 with exactly one stderr line and no traceback; a mutation that is in fact valid exits 0."""

import copy
import json
import random
import tomllib

import pytest

from training_wizard.cli import main
from training_wizard.spec import dump_toml

from reliability_helpers import make_recipe

WRONG_VALUES = ["x", -1, 0, -2.5, 1.5, True, [], [1, "a"], {"a": 1}, "", 10**30, "-3", "nope.Missing"]
SPEC_CLASSES = ["nope.Missing", "os.system", "builtins.dict", "training_wizard.specs.dataset.DataSourceSpec",
                "training_wizard.specs.reward.RewardSpec", "training_wizard", "", 3, ["a"], "a..b", ".", ":"]
GARBAGE = ["=", "[[", "]", '"', "'''", "= =", "[a.", "\x00", "a = ", "{", "k = [1,", "[training]\n[training]"]


def leaves(data, prefix=()):
    for key, value in data.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from leaves(value, prefix + (key,))


def table(data, path):
    for key in path[:-1]:
        data = data[key]
    return data


def mutate_recipe(rng, base, text):
    kind = rng.choice(["delete", "wrong", "unknown", "spec_class", "negative", "garbage", "recipe_class"])
    data = copy.deepcopy(base)
    paths = list(leaves(data))
    if kind == "garbage":
        cut = rng.randrange(len(text))
        return kind, text[:cut] + rng.choice(GARBAGE) + text[cut + rng.randint(0, 5):]
    if kind == "delete":
        path = rng.choice(paths)
        del table(data, path)[path[-1]]
    elif kind == "wrong":
        path = rng.choice(paths)
        table(data, path)[path[-1]] = rng.choice(WRONG_VALUES)
    elif kind == "unknown":
        holder = rng.choice([()] + [p for p in paths if isinstance(table(data, p)[p[-1]], dict)])
        target = table(data, holder + ("x",))
        target[rng.choice(["lerning_rate", "sede", "extra", "model_name", "rloo", "spec"])] = rng.choice(WRONG_VALUES)
    elif kind == "spec_class":
        section = rng.choice(["reward", "dataset", "model"])
        data[section]["spec_class"] = rng.choice(SPEC_CLASSES)
    elif kind == "negative":
        numeric = [p for p in paths if isinstance(table(data, p)[p[-1]], (int, float))
                   and not isinstance(table(data, p)[p[-1]], bool)]
        path = rng.choice(numeric)
        table(data, path)[path[-1]] = -abs(table(data, path)[path[-1]]) - rng.choice([0, 1, 0.5])
    elif kind == "recipe_class":
        data["recipe_class"] = rng.choice(["ppo", "rlo", "", 1, "training_wizard.recipes.base.Recipe", "os.path"])
    return kind, dump_toml(data)


def run(capsys, path):
    try:
        code = main([str(path), "--dry-run"])
    except SystemExit as exc:  # argparse or a stray exit: a failure unless it is code 2 with one line
        code = exc.code
    except Exception as exc:  # noqa: BLE001 - a bug: reported with its type and message
        capsys.readouterr()
        return f"crash {type(exc).__name__}: {exc}", [], ""
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line.strip()], captured.err


def check(outcomes, code, lines, err, label):
    if code == 0:
        outcomes["valid (exit 0)"] += 1
    elif code == 2 and len(lines) == 1 and "Traceback" not in err and lines[0].startswith("error: "):
        outcomes["rejected (exit 2, one line)"] += 1
    else:
        outcomes["violations"].append(f"{label}\n-> exit {code}\n{err[-1500:]}")


def test_malformed_recipes(tmp_path, tiny_model_dir, capsys):
    rng = random.Random(7)
    good = make_recipe(tmp_path, tiny_model_dir, "good")
    text = good.read_text()
    base = tomllib.loads(text)
    code, lines, err = run(capsys, good)
    assert code == 0, err
    outcomes = {"valid (exit 0)": 0, "rejected (exit 2, one line)": 0, "violations": []}
    kinds = {}
    for number in range(300):
        kind, mutated = mutate_recipe(rng, base, text)
        path = tmp_path / f"m{number}.toml"
        path.write_text(mutated)
        code, lines, err = run(capsys, path)
        check(outcomes, code, lines, err, f"mutation {number} ({kind}):\n{mutated}")
        kinds[kind] = kinds.get(kind, 0) + (code == 2)
    print(f"recipe fuzz: {outcomes}, rejections by kind: {kinds}")
    assert not outcomes["violations"], "\n\n".join(outcomes["violations"][:5])
    assert outcomes["rejected (exit 2, one line)"] >= 200


GOOD_ROWS = [{"prompt": "Tell me about cats."}, {"prompt": [{"role": "user", "content": "Hi there."}]},
             {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]},
             {"prompt": "Another prompt.", "topic": "x"}]
BAD_PROMPTS = [None, 3, 2.5, True, "", "   ", [], [{}], [None], ["text"], [{"role": "bot", "content": "x"}],
               [{"role": "user"}], [{"role": "user", "content": 5}], [{"content": "x"}],
               [{"role": "assistant", "content": "x"}], [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}],
               {"role": "user", "content": "x"}, [[{"role": "user", "content": "x"}]], [{"role": "user", "content": None}]]
# "null" as the first line once segfaulted pyarrow under datasets; JSON files are now checked before pyarrow.
BAD_LINES = ["null", "not json", "[1, 2]", "42", '"a string"', '{"prompt": "unterminated', "{}", '{"promt": "typo"}',
             '{"prompt": "a", "prompt": 3}', "{'prompt': 'single quotes'}"]


def bad_row_file(rng):
    rows = [json.dumps(r) for r in rng.sample(GOOD_ROWS, k=rng.randint(1, 4))]
    if rng.random() < 0.6:
        bad = dict(rng.choice(GOOD_ROWS))
        if rng.random() < 0.8:
            bad["prompt"] = rng.choice(BAD_PROMPTS)
        else:
            del bad["prompt"]
        line = json.dumps(bad)
    else:
        line = rng.choice(BAD_LINES)
    rows.insert(rng.randint(0, len(rows)), line)
    return "\n".join(rows) + "\n"


def test_malformed_dataset_rows(tmp_path, tiny_model_dir, capsys):
    rng = random.Random(8)
    outcomes = {"valid (exit 0)": 0, "rejected (exit 2, one line)": 0, "violations": []}
    for number in range(300):
        folder = tmp_path / f"d{number}"
        recipe = make_recipe(folder, tiny_model_dir, "r")
        content = bad_row_file(rng)
        (folder / "prompts.jsonl").write_text(content)
        code, lines, err = run(capsys, recipe)
        check(outcomes, code, lines, err, f"rows {number}:\n{content}")
    print(f"row fuzz: {outcomes}")
    assert not outcomes["violations"], "\n\n".join(outcomes["violations"][:5])
    assert outcomes["rejected (exit 2, one line)"] >= 200


def test_non_string_recipe_class_is_one_line(tmp_path, tiny_model_dir, capsys):
    good = make_recipe(tmp_path, tiny_model_dir, "good")
    good.write_text(good.read_text().replace('recipe_class = "rloo"', "recipe_class = []"))
    code, lines, err = run(capsys, good)
    assert code == 2 and len(lines) == 1 and "recipe_class: expected a string" in lines[0], err


@pytest.mark.parametrize("first_line", ["null", '"a string"', "[1, 2]"])
def test_json_rows_that_are_not_objects_are_one_line(first_line, tmp_path, tiny_model_dir, capsys):
    good = make_recipe(tmp_path, tiny_model_dir, "good")
    (tmp_path / "prompts.jsonl").write_text(f'{first_line}\n{{"prompt": "a"}}\n')
    code, lines, err = run(capsys, good)
    assert code == 2 and len(lines) == 1 and "line 1: expected a JSON object" in lines[0], err
