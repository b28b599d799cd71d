"""Recipes and reward files written for training-wizard 1.0 (in its shape; written for these tests) load, dry-run
and train here, and `training-wizard migrate` converts them to a recipe that resolves to the same config."""

import json
import tomllib
from pathlib import Path

import pytest

from training_wizard.cli import main
from training_wizard.recipes.base import load_recipe

OLD_RECIPE = """\
spec_class = "training_wizard.recipes.rloo.RLOOTrainingSpec"
validation = 5

[transformer_spec]
pretrained_name = "{model}"
device_map = "cpu"

[transformer_spec.tokenizer_call_kwargs]
max_length = 256
truncation = true

[transformer_spec.lora_spec]
r = 4
lora_alpha = 8
lora_dropout = 0.0

[dataset_spec]
spec_class = "training_wizard.specs.dataset.TemplateInstructDatasourceSpec"
output_column = "prompt"

[dataset_spec.parent]
spec_class = "training_wizard.specs.dataset.SimpleDataSourceSpec"
data_files = "sentences.jsonl"

[dataset_spec.parent.preprocessing]
shuffle = 7
take = 13

[[dataset_spec.messages_template]]
role = "user"
content = "Paraphrase: {{sentence}}"

{reward}

[training_args_spec]
run_name = "old run"
output_dir = "{out}"
seed = 4
logging_steps = 1
per_device_train_batch_size = 4
per_device_eval_batch_size = 2
bf16 = false
optim = "adamw_bnb_8bit"
save_only_model = true
eval_strategy = "steps"
rloo_k = 2
num_ppo_epochs = 1
kl_coef = 0.05
learning_rate = 1e-3
temperature = 1.0
response_length = 5
total_episodes = 8
num_sample_generations = 0
"""

PROMPT_AWARE_REWARD = """\
[reward_spec]
spec_class = "old_rewards.PromptAwareReward"
bonus = 0.5
"""

CLASSIFIER_REWARD = """\
[reward_spec]
spec_class = "old_rewards.ClassifierReward"

[reward_spec.transformer_spec]
pretrained_name = "{classifier}"
device_map = "cpu"

[reward_spec.transformer_spec.from_pretrained_kwargs]
torch_dtype = "float32"
num_labels = 1
"""

MULTI_REWARD = """\
[reward_spec]
spec_class = "training_wizard.specs.reward.MultiRewardSpec"
weights = [1.0, 3.0]
normalize_weights = true

[[reward_spec.rewards]]
spec_class = "old_rewards.PromptAwareReward"
bonus = 1.0

[[reward_spec.rewards]]
spec_class = "old_rewards.LengthReward"
"""

OLD_REWARDS = '''
import torch
from transformers import AutoModelForSequenceClassification

from training_wizard.specs.model import TransformerSpec
from training_wizard.specs.reward import RewardSpec

SEEN = []


class PromptAwareReward(RewardSpec):
    """Written against 1.0's inputs: the chat-templated prompt and the completion with its special tokens."""

    bonus: float = 0.0

    def compute_reward(self, prompts, completions, **kwargs):
        assert all(p.startswith("<|im_start|>user\\n") and p.endswith("<|im_start|>assistant\\n") for p in prompts)
        assert self.trainer.args.logging_steps == 1 and self.trainer.is_world_process_zero()
        SEEN.append((self.trainer.state.global_step, [c.endswith("<|im_end|>") for c in completions]))
        return [self.bonus + float("<|im_end|>" in c) for c in completions]


class NoKwargsReward(RewardSpec):
    """1.0's own example rewards take (queries, completions) and nothing else: 1.0 never passed row columns."""

    def compute_reward(self, queries, completions):
        return [float(len(c)) for c in completions]


class SomeColumnsReward(RewardSpec):
    def compute_reward(self, queries, completions, sentence=None, *, missing=None):
        assert len(sentence) == len(completions) and missing is None
        return [float(s in q) for s, q in zip(sentence, queries)]


class LengthReward(RewardSpec):
    def compute_reward(self, prompts, completions, **kwargs):
        return [len(c) / 100 for c in completions]


class ClassifierReward(RewardSpec):
    """A classifier with its own tokenizer, through 1.0's TransformerSpec members."""

    transformer_spec: TransformerSpec

    def compute_reward(self, prompts, completions, **kwargs):
        model = self.transformer_spec.create_model(AutoModelForSequenceClassification)
        assert model.config.num_labels == 1
        batch = self.transformer_spec.encode_batch(completions, return_tensors="pt", padding=True)
        with torch.no_grad():
            return model(**batch).logits[:, 0].tolist()
'''


@pytest.fixture
def old_folder(tmp_path, tiny_model_dir):
    sentences = ["The cat sat.", "It rains today.", "Tea is hot.", "Maps help us.", "Owls fly at night.",
                 "Ice is cold.", "Sand is warm.", "Oaks grow slowly.", "Bikes are fast.", "Clocks tick.",
                 "Rivers run.", "Birds sing.", "Stars shine."]
    (tmp_path / "sentences.jsonl").write_text("\n".join(json.dumps({"sentence": s}) for s in sentences))
    (tmp_path / "old_rewards.py").write_text(OLD_REWARDS)
    return tmp_path


def write_old(folder: Path, model_dir, reward: str, **extra) -> Path:
    path = folder / "old.toml"
    path.write_text(OLD_RECIPE.format(model=model_dir, out=folder / "run", reward=reward.format(**extra)))
    return path


def test_old_recipe_with_template_data_and_validation_trains(old_folder, tiny_model_dir, capsys):
    path = write_old(old_folder, tiny_model_dir, PROMPT_AWARE_REWARD)
    assert main([str(path), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "training_args_spec.optim: ignored ('adamw_bnb_8bit' is not available" in err
    assert "transformer_spec.device_map: ignored" in err and "Traceback" not in err
    assert main([str(path)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (old_folder / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "objective/scores" in r]
    evals = [r for r in records if "eval/scores" in r]
    assert len(train) == 2 and len(evals) == 2  # validation = 5 held out and evaluated
    import old_rewards

    assert {step for step, _ in old_rewards.SEEN} >= {0, 1}  # self.trainer.state.global_step follows the run
    recipe = load_recipe(path)
    assert recipe.dataset.hold_out == 5 and recipe.eval_dataset.part == "held_out"
    assert len(recipe.dataset.load()) == 8 and len(recipe.eval_dataset.load()) == 5  # take 13: 8 train, 5 held


def test_old_classifier_reward_with_its_own_tokenizer(old_folder, tiny_model_dir, capsys):
    from training_wizard.testing import build_sequence_classifier, build_tokenizer

    tokenizer = build_tokenizer(vocab_size=300)  # not the policy's vocabulary
    classifier = old_folder / "classifier"
    build_sequence_classifier(tokenizer).save_pretrained(classifier)
    tokenizer.save_pretrained(classifier)
    path = write_old(old_folder, tiny_model_dir, CLASSIFIER_REWARD, classifier=classifier)
    assert main([str(path)]) == 0, capsys.readouterr().err
    scores = [json.loads(line)["objective/scores"] for line in (old_folder / "run" / "metrics.jsonl").read_text().splitlines()
              if "objective/scores" in line]
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def test_old_multi_reward_keys(old_folder, tiny_model_dir, capsys):
    path = write_old(old_folder, tiny_model_dir, MULTI_REWARD)
    recipe = load_recipe(path)
    assert recipe.reward.strategy == "mean"
    assert [c.weight for c in recipe.reward.components.values()] == [1.0, 3.0]
    assert main([str(path)]) == 0, capsys.readouterr().err
    record = json.loads((old_folder / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"rewards/0_PromptAwareReward", "rewards/1_LengthReward"} <= set(record)


@pytest.mark.parametrize("reward", [PROMPT_AWARE_REWARD, MULTI_REWARD])
def test_migrate_writes_a_recipe_that_resolves_to_the_same_config(old_folder, tiny_model_dir, capsys, reward):
    path = write_old(old_folder, tiny_model_dir, reward)
    new = old_folder / "new.toml"
    assert main(["migrate", str(path), "-o", str(new)]) == 0, capsys.readouterr().err
    text = new.read_text()
    assert "# Migrated from" in text and "training_args_spec.optim dropped" in text
    assert "#   transformer_spec.lora_spec.lora_alpha -> model.lora.alpha" in text
    assert 'recipe_class = "rloo"' in text
    assert load_recipe(new).to_dict() == load_recipe(path).to_dict()


def test_another_old_recipe_class_stops_with_one_line_naming_it(tmp_path, capsys):
    path = tmp_path / "cpo.toml"
    path.write_text('spec_class = "training_wizard.recipes.cpo.CPOTrainingSpec"\n[transformer_spec]\n'
                    'pretrained_name = "x"\n')
    assert main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training_wizard.recipes.cpo.CPOTrainingSpec" in err[0] and "only RLOO" in err[0]


def test_a_key_whose_loss_would_change_the_result_stops(old_folder, tiny_model_dir, capsys):
    path = write_old(old_folder, tiny_model_dir, PROMPT_AWARE_REWARD)
    path.write_text(path.read_text().replace('device_map = "cpu"\n',
                                             'device_map = "cpu"\ntokenizer_special_tokens = { pad_token = "<x>" }\n', 1))
    assert main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "transformer_spec.tokenizer_special_tokens" in err[0] and "change the prompts" in err[0]


@pytest.mark.parametrize("reward_class", ["NoKwargsReward", "SomeColumnsReward"])
def test_old_rewards_get_only_the_columns_their_compute_reward_takes(old_folder, tiny_model_dir, capsys, reward_class):
    # The template source's rows carry the column `sentence`; a 1.0 reward without **kwargs must not receive it
    path = write_old(old_folder, tiny_model_dir, f'[reward_spec]\nspec_class = "old_rewards.{reward_class}"\n')
    assert main([str(path)]) == 0, capsys.readouterr().err
    scores = [json.loads(line)["objective/scores"] for line in (old_folder / "run" / "metrics.jsonl").read_text().splitlines()
              if "objective/scores" in line]
    assert len(scores) == 2
    if reward_class == "SomeColumnsReward":
        assert scores == [1.0, 1.0]  # each prompt holds its own row's sentence


def test_accepted_columns_follows_the_signature():
    from training_wizard.legacy import accepted_columns

    columns = {"input": [1], "topic": [2]}

    def two(queries, completions): ...
    def named(prompts, completions, topic, input=None): ...  # noqa: A002
    def keyword_only(prompts, completions, *, topic): ...
    def anything(prompts, completions, **kwargs): ...

    assert accepted_columns(two, columns) == {}
    assert accepted_columns(named, columns) == columns
    assert accepted_columns(keyword_only, columns) == {"topic": [2]}
    assert accepted_columns(anything, columns) == columns
    assert accepted_columns(lambda completions, queries: None, {"queries": [0]}) == {}  # never twice


OLD_INSTRUCTION_TUNING = """\
spec_class = "training_wizard.recipes.modular.ModularTrainingSpec"
validation = 2

[wizard_module]
spec_class = "training_wizard.specs.modules.instruction_tune.InstructionTuningModule"
eval_sample_size = 100

[wizard_module.transformer_spec]
pretrained_name = "{model}"

[wizard_module.transformer_spec.tokenizer_call_kwargs]
max_length = 128
truncation = true

[dataset_spec]
spec_class = "training_wizard.specs.dataset.TemplateInstructDatasourceSpec"
output_column = "messages"

[[dataset_spec.messages_template]]
role = "system"
content = "You paraphrase."

[[dataset_spec.messages_template]]
role = "user"
content = "{{source}}"

[[dataset_spec.messages_template]]
role = "assistant"
content = "{{target}}"

[dataset_spec.parent]
spec_class = "training_wizard.specs.dataset.SimpleDataSourceSpec"
data_files = "pairs.jsonl"

[training_args_spec]
output_dir = "{out}"
num_train_epochs = 1
per_device_train_batch_size = 2
per_device_eval_batch_size = 2
optim = "adamw_bnb_8bit"
learning_rate = 1e-3
neftune_noise_alpha = 5

[callbacks_spec]
enable_early_stopping = true
"""

OLD_SEQUENCE_CLASSIFICATION = """\
spec_class = "training_wizard.recipes.modular.ModularTrainingSpec"
validation = 2

[wizard_module]
spec_class = "training_wizard.specs.modules.seq_cls.SequenceClassifierModule"
loss_type = "cross_entropy"
label_smoothing = 0.1
compute_eval_metrics = true

[wizard_module.transformer_spec]
pretrained_name = "{model}"

[wizard_module.transformer_spec.from_pretrained_kwargs]
num_labels = 2

[dataset_spec]
spec_class = "training_wizard.specs.dataset.SimpleDataSourceSpec"
data_files = "labels.tsv"
load_dataset_kwargs = {{ sep = "\\t" }}
loader = "csv"

[training_args_spec]
output_dir = "{out}"
num_train_epochs = 1
per_device_train_batch_size = 2
learning_rate = 1e-3
save_only_model = true
"""


def test_old_instruction_tuning_recipe_is_sft_on_the_assistant_message(tmp_path, tiny_model_dir, capsys):
    rows = [{"source": f"The {w} is here.", "target": f"Here is the {w}."} for w in ["cat", "sun", "map", "owl", "sea"]]
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    path = tmp_path / "old.toml"
    path.write_text(OLD_INSTRUCTION_TUNING.format(model=tiny_model_dir, out=tmp_path / "run"))
    recipe = load_recipe(path)
    assert type(recipe).__name__ == "SFTRecipe" and recipe.training.max_length == 128
    assert recipe.training.completion_only_loss and recipe.dataset.hold_out == 2
    assert main([str(path), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "training_args_spec.neftune_noise_alpha: ignored" in captured.err
    assert "callbacks_spec: ignored" in captured.err
    assert "trained on (" in captured.out and "\nHere is the cat.<|im_end|>\n" in captured.out  # the assistant's turn
    assert main([str(path)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in records if "loss" in r] == [2, 4] and any("eval/loss" in r for r in records)
    new = tmp_path / "new.toml"
    assert main(["migrate", str(path), "-o", str(new)]) == 0
    assert load_recipe(new).to_dict() == recipe.to_dict()


def test_old_sequence_classification_recipe_reads_its_tsv_and_trains(tmp_path, tiny_model_dir, capsys):
    lines = ["text\tlabels"] + [f"Sentence number {i} here.\t{i % 2}" for i in range(8)]
    (tmp_path / "labels.tsv").write_text("\n".join(lines) + "\n")
    path = tmp_path / "old.toml"
    path.write_text(OLD_SEQUENCE_CLASSIFICATION.format(model=tiny_model_dir, out=tmp_path / "run"))
    recipe = load_recipe(path)
    assert type(recipe).__name__ == "SequenceClassificationRecipe"
    assert (recipe.training.num_labels, recipe.training.label_smoothing) == (2, 0.1)
    assert main([str(path)]) == 0, capsys.readouterr().err
    assert "dataset_spec.load_dataset_kwargs.sep: ignored" in capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in records if "loss" in r] == [2, 4, 6] and "eval/accuracy" in records[-1]
    from transformers import AutoModelForSequenceClassification

    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "model")
    assert saved.config.num_labels == 2


# 1.0's examples/grpo/config.toml, unchanged. Its reward, examples/grpo/reward.py, needs rapidfuzz: this stand-in
# has its name, reads the same inputs (string prompts, the `target` column) and makes the same trainer calls.
OLD_GRPO_RECIPE = Path(__file__).resolve().parents[1] / "fixtures" / "legacy" / "grpo_config.toml"
GEC_STAND_IN = '''
import difflib

from training_wizard.specs.reward import RewardSpec

CALLS = []


class GECExampleRewardSpec(RewardSpec):
    def compute_reward(self, prompts, completions, **kwargs):
        assert isinstance(prompts[0], str) and "<|im_start|>" not in prompts[0]  # the user message's text
        trainer = self.trainer
        if trainer.is_world_process_zero() and trainer.state.global_step % trainer.args.logging_steps == 0:
            self.trainer._metrics["train"]["gec_gkd/f1"].append(0.5)
        CALLS.append((self.trainer.state.global_step, list(prompts), list(kwargs["target"])))
        return [difflib.SequenceMatcher(None, c, t).ratio() for c, t in zip(completions, kwargs["target"])]
'''


def test_old_grpo_recipe_dry_runs_and_trains_with_tiny_models(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import sys
    import types

    rows = [{"source": f"She {verb} home.", "target": f"She {fixed} home."}
            for verb, fixed in [("go", "goes"), ("walk", "walks"), ("run", "runs"), ("come", "comes")]]
    (tmp_path / "seq2seq.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    module = types.ModuleType("examples.grpo.reward")
    exec(GEC_STAND_IN, module.__dict__)
    monkeypatch.setitem(sys.modules, "examples.grpo.reward", module)
    tiny = [f"model.pretrained_name={tiny_model_dir}", f"dataset.parent.data_files={tmp_path / 'seq2seq.jsonl'}",
            f"output_dir={tmp_path / 'run'}", "training.dtype=float32", "training.max_completion_length=4",
            "training.total_episodes=8"]
    assert main([str(OLD_GRPO_RECIPE), *tiny, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "training_args_spec.max_prompt_length: ignored (prompts are not truncated" in err and "Traceback" not in err
    recipe = load_recipe(OLD_GRPO_RECIPE, tiny)
    training = recipe.training
    assert type(recipe).__name__ == "GRPORecipe" and recipe.reward.raw_text is False
    assert (training.num_generations, training.kl_coef, training.cliprange, training.num_ppo_epochs) == (2, 0.0, 0.2, 1)
    assert (training.learning_rate, training.gradient_checkpointing, training.per_device_train_batch_size) == (
        1e-6, True, 2)
    new = tmp_path / "new.toml"
    assert main(["migrate", str(OLD_GRPO_RECIPE), "-o", str(new)]) == 0
    assert 'recipe_class = "grpo"' in new.read_text() and load_recipe(new, tiny).to_dict() == recipe.to_dict()
    assert main([str(OLD_GRPO_RECIPE), *tiny]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(0.0 <= r["reward"] <= 1.0 for r in records)  # 8 completions, 2 per iteration
    targets = {row["source"]: row["target"] for row in rows}
    assert {step for step, _, _ in module.CALLS} >= {0, 1, 2, 3}  # self.trainer.state.global_step follows the run
    assert all(targets[p] == t for _, prompts, got in module.CALLS for p, t in zip(prompts, got))  # the row's own


def test_old_grpo_max_steps_becomes_training_max_steps(tmp_path):
    # TRL's optimizer steps, which training.max_steps now reads with TRL's meaning (it was refused before)
    path = tmp_path / "old_grpo.toml"
    path.write_text(OLD_GRPO_RECIPE.read_text() + "max_steps = 10\n")  # the file ends inside [training_args_spec]
    new = tmp_path / "new.toml"
    assert main(["migrate", str(path), "-o", str(new)]) == 0
    assert tomllib.loads(new.read_text())["training"]["max_steps"] == 10


@pytest.mark.parametrize("extra, key", [("sync_ref_model = true", "training_args_spec.sync_ref_model"),
                                        ("reward_weights = [1.0, 2.0]", "training_args_spec.reward_weights")])
def test_old_grpo_keys_without_an_equivalent_stop_with_one_line(tmp_path, capsys, extra, key):
    path = tmp_path / "old_grpo.toml"
    path.write_text(OLD_GRPO_RECIPE.read_text() + extra + "\n")  # the file ends inside [training_args_spec]
    assert main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
