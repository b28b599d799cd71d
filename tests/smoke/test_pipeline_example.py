"""The pipeline example's recipes load, and its RLOO stage is the paraphrase example with only the reward swapped."""

from pathlib import Path

from training_wizard.recipes.base import load_recipe

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "examples" / "pipeline"


def test_rloo_stage_is_the_paraphrase_example_with_the_learned_reward():
    ours = load_recipe(PIPELINE / "rloo.toml").to_dict()
    example = load_recipe(ROOT / "examples" / "rloo" / "config.toml").to_dict()
    assert ours["reward"]["spec_class"] == "training_wizard.specs.reward.ModelRewardSpec"
    assert ours["reward"]["pretrained_name"] == "runs/pipeline/reward_model/model"
    for key in ("output_dir", "reward"):
        ours.pop(key), example.pop(key)
    assert ours == example


def test_reward_model_and_evaluation_recipes_load():
    reward_model = load_recipe(PIPELINE / "reward_model.toml")
    assert type(reward_model).__name__ == "RewardModelRecipe" and reward_model.dataset.hold_out == 60
    evaluation = load_recipe(PIPELINE / "evaluate.toml", ["recipe_class=evaluate"])  # as `training-wizard eval`
    assert evaluation.candidate.pretrained_name.endswith("runs/pipeline/rloo/model")
    assert evaluation.prompts.hold_out == 100 and evaluation.prompts.part == "held_out"
