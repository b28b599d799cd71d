"""Every field of TRL 1.16's GRPOConfig and RLOOConfig (tests/fixtures/trl_1_16_config_fields.json, written by
scripts/trl_config_fields.py, TrainingArguments' fields included) is accepted by our config of the same name, as a
keyword and in a recipe's [training], or refused with one line that names it. None is silently dropped."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from training_wizard.cli import main
from training_wizard.errors import UserError
from training_wizard.recipes.base import load_recipe
from training_wizard.trl.configs import GRPOConfig, RLOOConfig
from training_wizard.trl.keys import TRL_KEYS, is_off

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "trl_1_16_config_fields.json").read_text())
CONFIGS = {"GRPOConfig": GRPOConfig, "RLOOConfig": RLOOConfig}
RECIPES = {"GRPOConfig": "grpo", "RLOOConfig": "rloo"}

# A value that asks for something, for the fields whose TRL default is None (a bool's is its negation, a number's
# twice itself or 1, a string's below).
SET_VALUES = {
    "output_dir": "elsewhere", "max_steps": 4, "lr_scheduler_kwargs": {"num_cycles": 2}, "optim_args": "a=1",
    "optim_target_modules": ["q_proj"], "bf16": True, "tf32": True, "activation_checkpointing": True,
    "activation_checkpointing_kwargs": {"every_n_layers": 2}, "gradient_checkpointing_kwargs": {"use_reentrant": True},
    "torch_compile_backend": "eager", "torch_compile_mode": "max-autotune", "liger_kernel_config": {"rope": True},
    "neftune_noise_alpha": 5.0, "torch_empty_cache_steps": 10, "disable_tqdm": True, "report_to": "tensorboard",
    "run_name": "try-1", "project": "mine", "trackio_space_id": "me/space", "trackio_bucket_id": "b",
    "trackio_static_space_id": "s", "eval_steps": 5, "eval_accumulation_steps": 2, "include_for_metrics": ["inputs"],
    "save_total_limit": 2, "hub_token": "t", "hub_private_repo": True, "hub_model_id": "me/model",
    "hub_revision": "main", "metric_for_best_model": "loss", "greater_is_better": True, "data_seed": 3,
    "accelerator_config": {"split_batches": True}, "parallelism_config": {"tp_size": 2}, "label_names": ["labels"],
    "dataloader_prefetch_factor": 2, "dataloader_multiprocessing_context": "spawn",
    "ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 25, "ddp_broadcast_buffers": True,
    "ddp_static_graph": True, "ddp_backend": "gloo", "fsdp": "full_shard", "fsdp_config": {"version": 2},
    "deepspeed": "ds.json", "resume_from_checkpoint": "latest", "model_init_kwargs": {"dtype": "bfloat16"},
    "router_aux_loss_coef": 0.01, "num_generations_eval": 4, "generation_batch_size": 16,
    "steps_per_generation": 2, "min_p": 0.1, "generation_kwargs": {"do_sample": True},
    "chat_template_kwargs": {"enable_thinking": False}, "cache_implementation": "static",
    "vllm_structured_outputs_regex": "[a-z]+", "vllm_server_base_url": "http://localhost:8000",
    "vllm_max_model_length": 256, "delta": 1.5, "epsilon_high": 0.28, "reward_weights": [1.0, 0.5],
    "max_tool_calling_iterations": 3, "vllm_importance_sampling_clip_min": 0.5, "vllm_importance_sampling_cap": 2.0,
    "off_policy_mask_threshold": 0.5, "num_completions_to_print": 3, "log_completions_hub_repo": "me/logs",
    "transformers_continuous_batching_config": {"block_size": 64}, "reward_clip_range": [-1.0, 1.0],
    "debug": "underflow_overflow", "optim": "sgd", "lr_scheduler_type": "cosine", "logging_strategy": "epoch",
    "eval_strategy": "steps", "save_strategy": "no", "hub_strategy": "end", "train_sampling_strategy": "sequential",
    "length_column_name": "n_tokens", "include_num_input_tokens_seen": "all", "log_level": "info",
    "log_level_replica": "info", "pad_to_multiple_of": 64, "vllm_mode": "server", "vllm_model_impl": "transformers",
    "vllm_server_host": "127.0.0.1", "vllm_importance_sampling_mode": "token_mask", "importance_sampling_level":
    "sequence", "multi_objective_aggregation": "normalize_then_sum", "scale_rewards": "batch", "loss_type": "grpo",
    "local_rank": 0, "max_completion_length": 32,
}


def set_value(name, default):
    if name in SET_VALUES:
        return SET_VALUES[name]
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default * 2 if default else 1
    raise AssertionError(f"no value that sets {name} (default {default!r}): add one to SET_VALUES")


def cases():
    return [pytest.param(config, name, value, id=f"{config}-{name}={value!r}"[:90])
            for config, fields in FIXTURE["configs"].items() for name, default in fields.items()
            for value in (default, set_value(name, default))]


def test_the_fixture_is_trl_1_16_and_the_table_covers_it_exactly():
    assert (FIXTURE["trl_version"], len(FIXTURE["configs"]["GRPOConfig"]), len(FIXTURE["configs"]["RLOOConfig"])) \
        == ("1.16.0", 191, 165)
    fields = set(FIXTURE["configs"]["GRPOConfig"]) | set(FIXTURE["configs"]["RLOOConfig"])
    assert set(FIXTURE["training_arguments_fields"]) <= fields
    assert sorted(fields - set(TRL_KEYS)) == [] and sorted(set(TRL_KEYS) - fields) == []


def outcome(config, name, value):
    """None when the config accepts `name = value` as a keyword, else the first error's one line."""
    try:
        CONFIGS[config](**{name: value})
    except ValidationError as exc:
        error = exc.errors()[0]
        return f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
    return None


@pytest.mark.parametrize("config, name, value", cases())
def test_each_trl_field_as_a_keyword_is_accepted_or_refused_by_name(config, name, value):
    rule, refusal = TRL_KEYS[name], outcome(config, name, value)
    if refusal is not None:
        assert "\n" not in refusal and name in refusal, refusal
    default = FIXTURE["configs"][config][name]
    if rule.kind in ("ours", "top") and value == default:  # TRL's default of a key we have: always taken
        assert refusal is None
    if rule.kind == "refused" or (rule.kind == "unsupported" and not is_off(value)):
        assert refusal is not None and name in refusal.split(": ", 2)[1]  # the message itself names it
    if rule.kind == "unsupported" and is_off(value):
        assert refusal is None


@pytest.fixture(scope="module")
def recipe_folder(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("trl-recipes")
    (folder / "p.jsonl").write_text('{"prompt": "hi"}\n')
    (folder / "model").symlink_to(tiny_model_dir)
    return folder


def load_training(folder, recipe_class, training):
    """A JSON recipe (TRL's None has no TOML spelling) whose [training] is `training`, loaded."""
    path = folder / "r.json"
    path.write_text(json.dumps({
        "recipe_class": recipe_class, "output_dir": str(folder / "out"),
        "model": {"pretrained_name": str(folder / "model")},
        "dataset": {"data_files": str(folder / "p.jsonl")},
        "reward": {"spec_class": "training_wizard.specs.reward.FunctionRewardSpec", "function": "os.path:join"},
        "training": training}))
    return load_recipe(path).training


@pytest.mark.parametrize("config, name, value", cases())
def test_each_trl_field_in_a_recipe_is_accepted_or_one_line_naming_it(config, name, value, recipe_folder):
    try:
        load_training(recipe_folder, RECIPES[config], {name: value})
    except UserError as exc:
        message = str(exc)
        assert "\n" not in message
        assert f"training.{name}" in message or f"set {name} at the top level" in message, message
        # the run's folder and seed are top-level keys; the Python constructor's arguments are the model and reward
        # tables' in a recipe
        python_only = ("output_dir", "seed", "model_init_kwargs", "reward_weights")
        assert outcome(config, name, value) is not None or name in python_only
    else:
        assert outcome(config, name, value) is None  # the keyword and the recipe agree


def test_trl_forms_of_our_keys_mean_what_they_mean_in_trl():
    config = GRPOConfig(report_to="none", max_steps=-1, max_grad_norm=0, warmup_steps=0.1, save_strategy="no",
                        eval_strategy="no", logging_strategy="steps", activation_checkpointing=True,
                        log_completions=False, run_name="try-1", project="mine", bf16=False, fp16=False,
                        use_cpu=False, disable_dropout=True, optim="adamw_torch")
    assert config.report_to == [] and config.max_steps is None and config.max_grad_norm is None
    assert config.warmup_ratio == 0.1 and config.warmup_steps == 0
    assert config.save_steps is None and config.eval_steps is None and config.gradient_checkpointing
    assert config.num_sample_generations == 0 and (config.run_name, config.project) == ("try-1", "mine")
    assert GRPOConfig(report_to="wandb").report_to == ["wandb"]
    assert RLOOConfig(reward_clip_range=None).reward_clip_range == 10.0  # TRL's None: nothing clipped, as ours
    # the deprecated cap's None leaves clip_max in force, as in TRL
    assert GRPOConfig(vllm_importance_sampling_cap=None).vllm_importance_sampling_clip_max == 3.0
    assert GRPOConfig(vllm_importance_sampling_cap=2.0).vllm_importance_sampling_clip_max == 2.0
    assert GRPOConfig(save_strategy="steps", save_steps=7, warmup_steps=3).save_steps == 7
    assert GRPOConfig(log_completions=True).num_sample_generations == 10  # our default stays
    # our defaults where TRL's differ
    ours = GRPOConfig()
    assert (ours.gradient_checkpointing, ours.logging_steps, ours.num_train_epochs) == (False, 1, 1.0)


@pytest.mark.parametrize("options, message", [
    ({"bf16": True, "fp16": True}, "bf16 and fp16 are both true: choose one mixed precision"),
    ({"tf32": True}, "tf32: true is not supported: TF32 matmuls follow torch's setting"),
    ({"disable_dropout": False}, "disable_dropout: false is not supported (only true): dropout is always disabled"),
    ({"save_strategy": "epoch"}, 'save_strategy: "epoch" is not supported: use "steps" or "no" with save_steps'),
    ({"report_to": "all"}, 'report_to: "all" is not supported: name the trackers'),
    ({"save_strategy": "no", "save_steps": 5}, 'save_strategy = "no" means save_steps = unset, but save_steps is 5'),
    ({"log_completions": False, "num_sample_generations": 3}, "means num_sample_generations = 0"),
])
def test_refusals_name_the_key_and_what_to_use_instead(options, message):
    with pytest.raises(ValidationError) as caught:
        GRPOConfig(**options)
    assert message in caught.value.errors()[0]["msg"]


TOML = """recipe_class = "grpo"
output_dir = "{out}"
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
[reward]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "os.path:join"
[training]
num_generations = 2
tf32 = true
"""


def test_cli_refuses_a_trl_key_in_one_line_naming_it_with_exit_2(recipe_folder, tiny_model_dir, capsys):
    path = recipe_folder / "r.toml"
    path.write_text(TOML.format(out=recipe_folder / "out", model=tiny_model_dir, data=recipe_folder / "p.jsonl"))
    code = main([str(path), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{path}: training.tf32 (line 12): true is not supported: TF32 matmuls follow torch's setting" in err
    assert err.strip().endswith("; remove it")


def test_run_name_and_project_name_the_tracker_run(tmp_path, monkeypatch):
    from training_wizard.tracking.metrics import MetricsLogger

    calls = []
    fake = SimpleNamespace(init=lambda **kw: calls.append(kw), log=lambda *a, **k: None, finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object())
    config = GRPOConfig(output_dir=str(tmp_path), report_to="wandb", run_name="try-1", project="mine")
    MetricsLogger(tmp_path, config.report_to, True, config.model_dump(mode="json")).log({"a": 1.0}, step=1)
    assert (calls[0]["project"], calls[0]["name"]) == ("mine", "try-1")
    calls.clear()
    default = GRPOConfig(output_dir=str(tmp_path), report_to=["wandb"])
    MetricsLogger(tmp_path / "b", default.report_to, True, default.model_dump(mode="json")).log({"a": 1.0}, step=1)
    assert (calls[0]["project"], calls[0]["name"]) == ("training-wizard", None)



def test_docs_name_every_field_of_the_fixture():
    text = (ROOT / "docs" / "trl_options.md").read_text()
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| ")]
    fields = set(FIXTURE["configs"]["GRPOConfig"]) | set(FIXTURE["configs"]["RLOOConfig"])
    assert sorted(name for name in fields if not any(f"`{name}`" in row for row in rows)) == []


def test_a_reward_table_with_pretrained_name_alone_is_a_reward_model_in_a_recipe(recipe_folder):
    # TRL's reward_model_path: a recipe needs no spec_class for it
    from training_wizard.specs.reward import ModelRewardSpec

    path = recipe_folder / "rm.toml"
    path.write_text(f'recipe_class = "grpo"\noutput_dir = "{recipe_folder / "out"}"\n[model]\npretrained_name = '
                    f'"{recipe_folder / "model"}"\n[dataset]\ndata_files = "{recipe_folder / "p.jsonl"}"\n[reward]\n'
                    f'pretrained_name = "{recipe_folder / "model"}"\n')
    reward = load_recipe(path).reward
    assert type(reward) is ModelRewardSpec and reward.pretrained_name == str(recipe_folder / "model")


def test_bf16_trains_under_accelerate_s_bf16_autocast_as_trl_s_does(tokenizer, tmp_path):
    """bf16 = true (TRL's meaning: mixed precision, the weights kept in float32) makes the run's Accelerator; it
    changes the update's arithmetic. accelerate allows one state per process: a second trainer asking for other
    settings in the same process stops with one line."""
    from accelerate.state import AcceleratorState

    from tests.helpers import make_rloo_trainer
    from training_wizard.errors import UserError
    from training_wizard.tracking.metrics import read_metrics

    options = dict(total_episodes=32, num_sample_generations=0, seed=3)
    AcceleratorState._reset_state()
    try:
        mixed = make_rloo_trainer(tokenizer, tmp_path / "bf16", bf16=True, **options)
        assert mixed.accelerator.mixed_precision == "bf16"
        assert next(mixed.unwrapped_policy.parameters()).dtype == torch.float32
        mixed.train()
        with pytest.raises(UserError, match=r"^training.bf16 / fp16 / use_cpu: this process already made an "):
            make_rloo_trainer(tokenizer, tmp_path / "other", fp16=True, **options)
    finally:
        AcceleratorState._reset_state()
    plain = make_rloo_trainer(tokenizer, tmp_path / "fp32", **options)
    assert plain.accelerator.mixed_precision == "no"
    plain.train()
    first, second = read_metrics(tmp_path / "bf16")[-1], read_metrics(tmp_path / "fp32")[-1]
    assert first["loss/policy_avg"] != second["loss/policy_avg"]


def test_the_python_constructor_s_config_keys_point_a_recipe_to_its_tables(recipe_folder):
    with pytest.raises(UserError, match=r"training.model_init_kwargs: a recipe sets these in \[model\]"):
        load_training(recipe_folder, "grpo", {"model_init_kwargs": {"dtype": "bfloat16"}})
    with pytest.raises(UserError, match=r"training.reward_weights: a recipe sets these in \[reward\] reward_weights"):
        load_training(recipe_folder, "rloo", {"reward_weights": [1.0, 0.5]})
    assert load_training(recipe_folder, "grpo", {"model_init_kwargs": None}).model_init_kwargs is None
