"""The run summary (terminal, report.html, model card), the smoothed metric panel, and eps per iteration."""

import json
import time

import pytest
import yaml

from training_wizard.tracking.model_card import front_matter, model_card
from training_wizard.tracking.plots import panel_names, smooth, smoothing_weight
from training_wizard.tracking.report import write_run_outputs
from training_wizard.tracking.summary import main_metric_names, run_summary, window_size


def test_smoothing_is_a_debiased_moving_average():
    # weight 0.5: m = 0.5, 1.25, 2.125; divided by 1 - 0.5^n = 0.5, 0.75, 0.875
    assert smooth([1.0, 2.0, 3.0], 0.5) == pytest.approx([1.0, 5 / 3, 2.125 / 0.875])
    # a NaN is passed over: 3 follows 1 (m = 0.25 + 1.5 = 1.75, n = 2)
    assert smooth([1.0, float("nan"), 3.0], 0.5)[2] == pytest.approx(1.75 / 0.75)
    assert smooth([4.0, 7.0], 0.0) == [4.0, 7.0]
    assert [smoothing_weight(n) for n in (1, 5, 10, 50, 1000)] == pytest.approx([0, 0, 0.5, 0.9, 0.95])


def test_main_metrics_come_first():
    present = {"lr", "eps", "objective/kl", "objective/scores", "rewards/b", "rewards/a", "objective/rlhf_reward",
               "val/ratio", "completions/mean_length"}
    assert main_metric_names(present) == ["objective/scores", "objective/rlhf_reward", "rewards/a", "rewards/b",
                                          "objective/kl", "completions/mean_length"]
    assert panel_names(present)[6:] == ["val/ratio", "lr", "eps"]


def make_run(folder, iterations=12):
    folder.mkdir()
    lines = [{"episode": 8 * i, "objective/scores": float(i), "objective/kl": 0.1 * i, "rewards/meaning": 2.0 * i,
              "eps": 5.0, "lr": 1e-5} for i in range(1, iterations + 1)]
    lines.insert(6, {"eval/scores": 0.25, "eval/kl": 0.5, "episode": 48})
    lines.append({"eval/scores": 0.75, "eval/kl": 1.5, "eval/response_length": 9.0, "episode": 8 * iterations})
    (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n{\"cut short")
    (folder / "resolved_config.toml").write_text(
        'recipe_class = "rloo"\noutput_dir = "runs/x"\nseed = 3\n[model]\npretrained_name = "Org/Base"\n'
        '[training]\nrloo_k = 4\nkl_coef = 0.05\n')
    (folder / "eval").mkdir()
    (folder / "eval" / "winrate.json").write_text(json.dumps(
        {"candidate": "model", "baseline": "Org/Base", "win_rate": 0.625, "ci95_low": 0.5, "ci95_high": 0.74, "n": 100}))
    return folder


def test_summary_of_a_run_folder(tmp_path):
    summary = run_summary(make_run(tmp_path / "run"), wall_seconds=754)
    assert window_size(12) == 3 and summary.window == 3
    # scores 1..12: first three average 2, last three 11
    assert summary.metrics == [("objective/scores", 2.0, 11.0), ("rewards/meaning", 4.0, 22.0),
                               ("objective/kl", pytest.approx(0.2), pytest.approx(1.1))]
    assert (summary.algorithm, summary.base_model, summary.episodes, summary.iterations) == ("RLOO", "Org/Base", 96, 12)
    assert summary.evaluation["eval/scores"] == 0.75
    lines = summary.lines()
    assert lines[0] == "RLOO of Org/Base: 96 episodes, 12 logged iterations in 12 min 34 s"
    assert lines[-1] == ("last evaluation (episode 96): eval/scores 0.75, eval/kl 1.5, eval/response_length 9; "
                         "win rate 62.5% against Org/Base (95% CI 50.0% to 74.0%, n = 100)")


def test_model_card_front_matter_is_hub_metadata(tmp_path):
    assert yaml.safe_load(front_matter("Org/Base", "rloo", lora=True).strip("-\n")) == {
        "base_model": "Org/Base", "library_name": "peft", "pipeline_tag": "text-generation",
        "tags": ["training-wizard", "rloo", "reinforcement-learning", "lora", "base_model:adapter:Org/Base"]}
    local = yaml.safe_load(front_matter(str(tmp_path), "ppo", lora=False).strip("-\n"))
    assert "base_model" not in local and local["library_name"] == "transformers"  # a folder is no Hub id
    summary = run_summary(make_run(tmp_path / "run"))
    card = model_card(summary, {"recipe_class": "rloo", "training": {"rloo_k": 4}}, {"torch": "2.9"}, lora=True)
    assert "| rloo_k | `4` |" in card and "| objective/scores | 2 | 11 |" in card and "- torch: 2.9" in card
    assert "https://arxiv.org/abs/2402.14740" in card


def test_report_opens_with_the_summary(tmp_path):
    run = make_run(tmp_path / "run")
    text = write_run_outputs(run).read_text()
    assert text.index('id="summary"') < text.index('src="metrics.png"') < text.index("Last evaluation")
    assert "<td>objective/scores</td><td>2</td><td>11</td><td>+9</td>" in text
    assert (run / "metrics.png").stat().st_size > 10_000


def test_eps_is_the_rate_of_each_iteration_not_a_running_average(tmp_path, monkeypatch):
    """A clock that only moves inside the reward: 8 completions take 4 s in the first iteration and 1 s in the
    second, so eps is 2 then 8 (a running average would say 16 / 5 = 3.2 for the second)."""
    from training_wizard import RLOOConfig, RLOOTrainer
    from training_wizard.testing import build_causal_lm, build_tokenizer
    from training_wizard.tracking.metrics import read_metrics

    clock = {"now": 0.0, "calls": 0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])

    def reward(prompts, completions, **columns):
        clock["calls"] += 1
        clock["now"] += 4.0 if clock["calls"] == 1 else 1.0
        return [0.0] * len(completions)

    tokenizer = build_tokenizer()
    trainer = RLOOTrainer(config=RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, rloo_k=4,
                                            total_episodes=16, response_length=4, num_sample_generations=0),
                          tokenizer=tokenizer, policy=build_causal_lm(tokenizer), reward_model=reward,
                          train_dataset=[{"prompt": f"Say {i}."} for i in range(4)])
    trainer.train()
    assert [m["eps"] for m in read_metrics(tmp_path)] == [2.0, 8.0]
