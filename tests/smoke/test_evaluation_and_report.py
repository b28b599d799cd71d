"""`training-wizard eval` on tiny models, `training-wizard plot`, and report.html in a headless browser."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from training_wizard.cli import main

EVAL_RECIPE = """\
output_dir = "{out}"
seed = 1
{baseline}
response_length = 6
temperature = {temperature}

[prompts]
data_files = "{data}"

[candidate]
pretrained_name = "{candidate}"

[judge]
spec_class = "training_wizard.evaluation.judges.RewardJudgeSpec"
[judge.reward]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "eval_rewards:length"
"""

REWARDS = '''
def length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def eval_folder(tmp_path):
    rows = [{"prompt": f"Tell me about {t}.", "reference": "x" * (i % 3 * 40)} for i, t in
            enumerate(["owls", "ice", "sand", "oak", "tea", "maps"])]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "eval_rewards.py").write_text(REWARDS)
    return tmp_path


def write_eval(folder: Path, candidate, baseline_line: str, temperature=0.0) -> Path:
    path = folder / "eval.toml"
    path.write_text(EVAL_RECIPE.format(out=folder / "eval", candidate=candidate, baseline=baseline_line,
                                       data=folder / "prompts.jsonl", temperature=temperature))
    return path


def test_eval_against_reference_completions_has_the_known_answer(eval_folder, tiny_model_dir, capsys):
    # references are 0, 40 or 80 characters: the tiny model's 6 tokens beat the empty ones and lose to the others
    path = write_eval(eval_folder, tiny_model_dir, 'reference_column = "reference"')
    assert main(["eval", str(path)]) == 0, capsys.readouterr().err
    summary = json.loads((eval_folder / "eval" / "winrate.json").read_text())
    decisions = [json.loads(line) for line in (eval_folder / "eval" / "decisions.jsonl").read_text().splitlines()]
    assert len(decisions) == 6 and summary["n"] == 6
    assert [d["outcome"] for d in decisions] == [1.0 if d["baseline"] == "" else 0.0 for d in decisions]
    assert summary["win_rate"] == pytest.approx(2 / 6)
    assert "vs column reference" in capsys.readouterr().out
    assert "<td>candidate</td>" in (eval_folder / "eval" / "decisions.html").read_text()


def test_eval_of_a_model_against_itself_greedy_is_all_ties(eval_folder, tiny_model_dir, capsys):
    path = write_eval(eval_folder, tiny_model_dir, f'[baseline]\npretrained_name = "{tiny_model_dir}"')
    text = path.read_text()
    # TOML: the [baseline] table must come after the top-level keys
    top, table = text.split("[baseline]\n", 1)
    baseline_block, rest = table.split("\n", 1)
    path.write_text(top + rest + f"\n[baseline]\n{baseline_block}\n")
    assert main(["eval", str(path)]) == 0, capsys.readouterr().err
    summary = json.loads((eval_folder / "eval" / "winrate.json").read_text())
    assert (summary["ties"], summary["win_rate"]) == (6, 0.5)


def test_a_lora_runs_model_folder_loads_for_evaluation(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training_wizard.specs.model import TransformerSpec

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapted = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", init_lora_weights=False))
    adapted.save_pretrained(tmp_path / "model")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "model")
    loaded = TransformerSpec(pretrained_name=str(tmp_path / "model")).load_causal_lm()
    merged = adapted.merge_and_unload()
    assert all((a - b).abs().max() < 1e-6 for a, b in zip(loaded.state_dict().values(), merged.state_dict().values()))


def make_run(folder: Path, shift: float) -> Path:
    folder.mkdir(parents=True)
    metrics = [{"episode": 8 * i, "objective/scores": shift + 0.1 * i, "objective/rlhf_reward": shift + 0.09 * i,
                "objective/kl": 0.01 * i, "val/ratio": 1.0, "lr": 1e-5, "eps": 3.0, "rewards/novelty": 0.2 + 0.01 * i}
               for i in range(1, 11)]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n{\"eval/scores\": 0.7, \"episode\": 80}\n")
    samples = [{"step": s, "episode": 8 * s, "query": f"Prompt {q} <b>bold?</b>", "response": f"answer {q} at {s}",
                "score": 0.1 * s, "probe": True} for s in (1, 5, 10) for q in range(2)]
    (folder / "samples.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    (folder / "resolved_config.toml").write_text('recipe_class = "rloo"\noutput_dir = "x"\n')
    return folder


def test_plot_overlays_runs_and_refuses_a_folder_without_metrics(tmp_path, capsys):
    a, b = make_run(tmp_path / "run-a", 0.0), make_run(tmp_path / "run-b", 0.5)
    out = tmp_path / "both.png"
    assert main(["plot", str(a), str(b), "-o", str(out)]) == 0
    from PIL import Image

    image = Image.open(out).convert("RGB")
    assert image.size == (1440, 504)  # two rows of four panels, 16 x 5.6 inches at 90 dpi
    pixels = {colour: count for count, colour in image.getcolors(image.width * image.height)}
    # both runs are drawn, in matplotlib's first two colours (one run alone leaves the second at 0)
    assert pixels.get((31, 119, 180), 0) > 100 and pixels.get((255, 127, 14), 0) > 100
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_report_shows_samples_side_by_side_escaped_and_opens_in_chromium(tmp_path):
    from training_wizard.tracking.report import write_run_outputs

    run = make_run(tmp_path / "run", 0.0)
    report = write_run_outputs(run)
    text = report.read_text()
    assert "<th>step 1</th><th>step 5</th><th>step 10</th>" in text
    assert "Prompt 0 &lt;b&gt;bold?&lt;/b&gt;" in text and "answer 0 at 10" in text and "eval/scores" in text
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium); .ci/run installs it")
    shot = tmp_path / "shot.png"
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                           "--window-size=1280,900", "--enable-logging=stderr", "--v=0", report.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.is_file(), done.stderr[-2000:]
    console_errors = [line for line in done.stderr.splitlines() if "CONSOLE" in line and "ERROR" in line.upper()]
    assert not console_errors, console_errors
    from PIL import Image

    image = Image.open(shot).convert("L")
    low, high = image.getextrema()
    assert high - low > 100  # not a blank page: text and the plot are drawn
    colours = len(set(image.resize((320, 225)).getdata()))
    assert colours > 20


METRICS_RECIPE = """\
output_dir = "{out}"
seed = 1
response_length = 6
temperature = 0.0

[prompts]
data_files = "{data}"

[candidate]
pretrained_name = "{model}"

[baseline]
pretrained_name = "{model}"

[metrics.long]
reward_funcs = ["eval_metric_rewards:is_long"]

[metrics.length]
reward_funcs = ["eval_metric_rewards:length"]
"""

METRIC_REWARDS = REWARDS + '''
def is_long(completions, **columns):
    return [float(len(c) > 12) for c in completions]
'''


def test_eval_metrics_score_each_model_on_its_own_with_intervals(eval_folder, tiny_model_dir, capsys):
    from training_wizard.evaluation.winrate import wilson

    # a module name of its own: an earlier test's eval_rewards may already be imported (without is_long)
    (eval_folder / "eval_metric_rewards.py").write_text(METRIC_REWARDS)
    path = eval_folder / "metrics.toml"
    path.write_text(METRICS_RECIPE.format(out=eval_folder / "eval", data=eval_folder / "prompts.jsonl",
                                          model=tiny_model_dir))
    assert main(["eval", str(path)]) == 0, capsys.readouterr().err
    summary = json.loads((eval_folder / "eval" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (eval_folder / "eval" / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and not (eval_folder / "eval" / "winrate.json").exists()  # no judge, no win rate
    share = sum(len(r["candidate"]) > 12 for r in rows) / 6
    long = summary["candidate"]["long"]
    assert long["mean"] == pytest.approx(share) and long["n"] == 6
    assert (long["ci95_low"], long["ci95_high"]) == pytest.approx(wilson(share, 6))  # 0/1 values: Wilson
    lengths = [float(len(r["candidate"])) for r in rows]
    assert summary["candidate"]["length"]["mean"] == pytest.approx(sum(lengths) / 6)
    assert summary["baseline"] == {**summary["candidate"], "model": summary["baseline"]["model"]}  # same model, greedy
    assert [r["candidate_long"] for r in rows] == [float(len(r["candidate"]) > 12) for r in rows]


TRL_METRIC_RECIPE = """\
output_dir = "{out}"
seed = 1
response_length = 6
temperature = 1.0

[prompts]
data_files = "{data}"

[candidate]
pretrained_name = "{model}"

[metrics.forms]
reward_funcs = ["eval_trl_metric_rewards:token_count"]

[metrics.overlong]
spec_class = "training_wizard.specs.verifiable.OverlongRewardSpec"
max_completion_length = 8
soft_punish_cache = 4
"""

TRL_METRIC_REWARDS = '''
SEEN = []

def token_count(prompts, completions, completion_ids, **columns):
    # written as for TRL's trainer: conversational rows give message lists on both sides
    SEEN.extend(zip(prompts, [c[0]["content"] for c in completions], completion_ids))
    return [float(len(ids)) for ids in completion_ids]
'''


def test_eval_metrics_give_trl_functions_what_training_gives_them(eval_folder, tiny_model_dir, capsys):
    """Conversational prompts as message lists, completions as assistant messages, completion_ids with the stop
    token: in eval as in training (a reward written for TRL indexes completion[0]["content"])."""
    import sys

    from transformers import AutoTokenizer

    rows = [{"prompt": [{"role": "user", "content": f"Tell me about {t}."}]} for t in ["owls", "ice", "sand", "oak"]]
    (eval_folder / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (eval_folder / "eval_trl_metric_rewards.py").write_text(TRL_METRIC_REWARDS)
    path = eval_folder / "trl.toml"
    path.write_text(TRL_METRIC_RECIPE.format(out=eval_folder / "eval", data=eval_folder / "chat.jsonl",
                                             model=tiny_model_dir))
    assert main(["eval", str(path)]) == 0, capsys.readouterr().err
    seen = sys.modules["eval_trl_metric_rewards"].SEEN
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert [prompt for prompt, _, _ in seen] == [row["prompt"] for row in rows]
    for _, text, ids in seen:
        assert 1 <= len(ids) <= 6 and tokenizer.decode(ids, skip_special_tokens=True) == text
    lengths = [len(ids) for _, _, ids in seen]
    summary = json.loads((eval_folder / "eval" / "metrics.json").read_text())
    assert summary["candidate"]["forms"]["mean"] == pytest.approx(sum(lengths) / 4)
    penalties = [0.0 if n <= 4 else (4 - n) / 4 for n in lengths]  # DAPO's ramp from 4 to 8 tokens
    assert any(-1.0 < p < 0.0 for p in penalties), lengths  # on the ramp: the token count decides the value
    assert summary["candidate"]["overlong"]["mean"] == pytest.approx(sum(penalties) / 4)


def test_eval_without_judge_or_metrics_is_one_line(eval_folder, tiny_model_dir, capsys):
    path = eval_folder / "none.toml"
    path.write_text(f'output_dir = "{eval_folder}/e"\n[prompts]\ndata_files = "{eval_folder}/prompts.jsonl"\n'
                    f'[candidate]\npretrained_name = "{tiny_model_dir}"\n')
    assert main(["eval", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "set a judge" in err and len(err.splitlines()) == 1
