"""DistillationTrainer and DistillationConfig with TRL 1.16's constructor (trl/trainers.py): TRL's documented
example with the import line changed, the teacher given as a folder, a model object or
args.teacher_model_name_or_path, and the one-line refusals."""

import json

import pytest
from datasets import Dataset

from training_wizard import DistillationConfig, DistillationTrainer
from training_wizard.errors import UserError
from training_wizard.testing import build_causal_lm, build_tokenizer, save_tiny_model
from training_wizard.tracking.metrics import read_metrics

SMALL = dict(max_steps=2, per_device_train_batch_size=4, max_completion_length=6, num_sample_generations=0,
             report_to="none")


def tldr_prompts(rows: int = 8) -> Dataset:
    return Dataset.from_list([{"prompt": f"Summarise post {i}: the cat sat on the mat."} for i in range(rows)])


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("teacher"), seed=7)


def test_trl_distillation_example(tiny_model_dir, teacher_dir, tmp_path):
    # TRL 1.16's DistillationTrainer example; only the import line differs (and the models and data are local)
    from training_wizard import DistillationTrainer

    dataset = tldr_prompts()  # load_dataset("trl-lib/tldr", split="train")

    trainer = DistillationTrainer(
        model=str(tiny_model_dir),  # "Qwen/Qwen2.5-0.5B-Instruct"
        teacher_model=str(teacher_dir),  # "Qwen/Qwen2.5-1.5B-Instruct"
        train_dataset=dataset,
        args=DistillationConfig(output_dir=str(tmp_path), beta=0.5, **SMALL),
    )
    trainer.train()

    records = read_metrics(tmp_path)
    assert [r["episode"] for r in records] == [4, 8]  # one completion per prompt, max_steps 2
    assert all(r["distill/divergence"] > 1e-4 and 0.0 <= r["distill/agreement"] <= 1.0 for r in records)
    assert records[0]["loss"] == records[0]["distill/divergence"]  # TRL's name: the step's token mean of the JSD
    assert trainer.config.beta == 0.5 and trainer.config.kl_coef == 0.0 and not trainer.config.uses_reference


def test_teacher_from_args_and_as_a_model_object(tiny_model_dir, teacher_dir, tmp_path):
    by_name = DistillationTrainer(model=str(tiny_model_dir), train_dataset=tldr_prompts(4), args=DistillationConfig(
        output_dir=str(tmp_path / "a"), teacher_model_name_or_path=str(teacher_dir),
        teacher_model_init_kwargs={"dtype": "float32"}, **SMALL))
    tokenizer = build_tokenizer()
    teacher = build_causal_lm(tokenizer, seed=7)
    by_object = DistillationTrainer(model=str(tiny_model_dir), teacher_model=teacher, train_dataset=tldr_prompts(4),
                                    args=DistillationConfig(output_dir=str(tmp_path / "b"), **SMALL))
    # the same weights either way (save_tiny_model builds seed 7 the same way)
    for (name, loaded), built in zip(by_name.teacher.state_dict().items(), by_object.teacher.state_dict().values()):
        assert loaded.equal(built), name
    assert not any(p.requires_grad for p in by_name.teacher.parameters())


@pytest.mark.parametrize("arguments,message", [
    ({}, "teacher_model: required"),
    ({"teacher_model": "/nowhere/teacher"}, "teacher_model.pretrained_name: folder '/nowhere/teacher' does not exist"),
    ({"optimizers": (object(), None)}, "optimizers: not supported"),
])
def test_refusals_are_one_line(tiny_model_dir, tmp_path, arguments, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DistillationTrainer(model=str(tiny_model_dir), train_dataset=tldr_prompts(4),
                            args=DistillationConfig(output_dir=str(tmp_path), **SMALL), **arguments)


def test_a_teacher_object_with_init_kwargs_is_refused(tiny_model_dir, tmp_path):
    teacher = build_causal_lm(build_tokenizer())
    with pytest.raises(UserError, match="teacher_model_init_kwargs: given, but teacher_model is already a model"):
        DistillationTrainer(model=str(tiny_model_dir), teacher_model=teacher, train_dataset=tldr_prompts(4),
                            args=DistillationConfig(output_dir=str(tmp_path), teacher_model_init_kwargs={}, **SMALL))


def test_config_takes_trl_distillation_keys():
    config = DistillationConfig(output_dir="x", beta=0.0, max_completion_length=128, temperature=0.8,
                                teacher_model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct", num_iterations=1,
                                log_completions=False, report_to="none")
    assert (config.beta, config.response_length, config.temperature, config.num_ppo_epochs) == (0.0, 128, 0.8, 1)
    assert json.loads(config.model_dump_json())["teacher_model_name_or_path"] == "Qwen/Qwen2.5-1.5B-Instruct"
