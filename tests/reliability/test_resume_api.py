"""Through the Python API: prompt order across a resume (also at an epoch boundary), a save that fails with a full
disk, and the numerical guards."""

import errno
import json

import pytest
import torch

from training_wizard import signals
from training_wizard.checkpoint import find_checkpoint, is_valid_checkpoint, load_checkpoint
from training_wizard.errors import UserError
from training_wizard.signals import TrainingInterrupted
from training_wizard.tracking.metrics import read_metrics

from reliability_helpers import assert_bitwise_equal
from tests.helpers import distinct, make_rloo_trainer, prompts


@pytest.fixture(autouse=True)
def fresh_faults(monkeypatch):
    signals._fired.clear()
    monkeypatch.delenv(signals.FAULT_ENV, raising=False)


# Six prompts, four per iteration: the epochs end inside iterations and between them.
RESUME_OPTIONS = dict(seed=11, rloo_k=2, per_device_train_batch_size=4, num_mini_batches=2, num_ppo_epochs=2,
                      total_episodes=8 * 6, response_length=5, learning_rate=2e-3, num_sample_generations=0,
                      save_steps=1)


def make(tokenizer, out, reward=distinct, **overrides):
    trainer = make_rloo_trainer(tokenizer, out, reward=reward, dataset=prompts(6, "Item {i}."),
                                **{**RESUME_OPTIONS, **overrides})
    trainer.taken = []
    original = trainer.iteration_prompts.next_batch

    def record(iteration):
        batch = original(iteration)
        trainer.taken.append((iteration, batch.rows[: trainer.plan.local_prompts]))
        return batch

    trainer.iteration_prompts.next_batch = record
    return trainer


@pytest.mark.parametrize("fault, stop_step", [("generation@2=term", 2), ("iteration@3=term", 3)])
def test_prompts_after_resume_are_exactly_the_uninterrupted_ones(tokenizer, tmp_path, monkeypatch, fault, stop_step):
    # 6 prompts, 4 per iteration: epochs end inside iteration 1 and exactly after iteration 3 (the second case)
    full = make(tokenizer, tmp_path / "full")
    full.train()
    monkeypatch.setenv(signals.FAULT_ENV, fault)
    first = make(tokenizer, tmp_path / "cut")
    with pytest.raises(TrainingInterrupted) as stopped:
        first.train()
    assert stopped.value.exit_code == 143 and stopped.value.step == stop_step
    monkeypatch.delenv(signals.FAULT_ENV)
    second = make(tokenizer, tmp_path / "cut")
    load_checkpoint(second, find_checkpoint(tmp_path / "cut", "latest"))
    assert second.state.iteration == stop_step
    if stop_step == 3:
        assert second.state.prompt_order.state_dict()["position"] == 0  # resumed exactly at an epoch boundary
    second.train()
    consumed = [t for t in first.taken if t[0] < stop_step] + second.taken
    assert consumed == full.taken  # no repeats, no skips, same order
    assert_bitwise_equal(second.unwrapped_policy.state_dict(), full.unwrapped_policy.state_dict(), "weights")
    assert_bitwise_equal(second.optimizer.state_dict(), full.optimizer.state_dict(), "optimizer")


@pytest.mark.parametrize("bound", [1, 2])
def test_an_async_run_resumes_without_losing_or_repeating_a_prompt(tokenizer, tmp_path, monkeypatch, bound):
    """Stopped after iteration 2, with the batches of the next `bound` iterations already sampled ahead
    (async_rollouts): the checkpoint keeps the prompt order from before those batches, so the resumed run samples
    them again (with the resumed weights) and the prompts of the whole run are the uninterrupted run's, in order."""
    options = dict(async_rollouts=True, max_staleness=bound)
    full = make(tokenizer, tmp_path / "full", **options)
    full.train()
    assert [iteration for iteration, _ in full.taken] == list(range(6))
    monkeypatch.setenv(signals.FAULT_ENV, "iteration@2=term")
    first = make(tokenizer, tmp_path / "cut", **options)
    with pytest.raises(TrainingInterrupted) as stopped:
        first.train()
    assert stopped.value.step == 2 and first.taken[-1][0] == 1 + bound  # sampled ahead of iteration index 2
    monkeypatch.delenv(signals.FAULT_ENV)
    second = make(tokenizer, tmp_path / "cut", **options)
    load_checkpoint(second, find_checkpoint(tmp_path / "cut", "latest"))
    second.train()
    consumed = [t for t in first.taken if t[0] < 2] + second.taken
    assert consumed == full.taken  # no prompt lost, none repeated, same order
    records = read_metrics(tmp_path / "cut")
    assert len(records) == len(read_metrics(tmp_path / "full"))
    # the 4 prompts of each batch sampled ahead before the stop were sampled again after it: counted once resumed
    assert [r["async/reissued_prompts_total"] for r in records] == [0.0, 0.0] + [4.0 * bound] * 4
    logged = [json.loads(line) for line in (tmp_path / "cut" / "prompts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6]
    assert [r["prompts"] for r in logged] == [r["prompts"] for r in map(json.loads, (
        tmp_path / "full" / "prompts.jsonl").read_text().splitlines())]


# What the writers raise when the disk fills: the OS's error, and torch's zip writer's own RuntimeError.
WRITE_FAILURES = {
    "OSError": (lambda path: OSError(errno.ENOSPC, "No space left on device", path), "No space left on device"),
    "torch zip writer": (lambda path: RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos "
                                                   "4160 vs 4054"), "write error: [enforce fail"),
}


@pytest.mark.parametrize("failure_kind", WRITE_FAILURES)
def test_disk_full_during_save_keeps_previous_checkpoint(tokenizer, tmp_path, monkeypatch, failure_kind):
    trainer = make(tokenizer, tmp_path, total_episodes=8 * 3)
    real_save, calls = torch.save, []
    make_error, reason = WRITE_FAILURES[failure_kind]

    def full_disk(obj, path, *args, **kwargs):
        calls.append(str(path))
        if str(path).endswith("optimizer.pt") and len([c for c in calls if c.endswith("optimizer.pt")]) == 2:
            with open(path, "wb") as handle:
                handle.write(b"partial")  # half a file, then the disk is full
            raise make_error(str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(UserError) as failure:
        trainer.train()
    message = str(failure.value)
    assert "\n" not in message and "checkpoint step-2 could not be written" in message
    assert reason in message and "optimizer.pt" in message and "checkpoints/step-1 is kept" in message
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text() == "step-1"
    assert not (root / "step-2").exists() and not (root / ".staging-step-2").exists()
    assert is_valid_checkpoint(root / "step-1") and find_checkpoint(tmp_path, "latest") == root / "step-1"
    monkeypatch.setattr(torch, "save", real_save)
    resumed = make(tokenizer, tmp_path, total_episodes=8 * 3)
    load_checkpoint(resumed, root / "step-1")
    assert resumed.state.iteration == 1
    resumed.train()  # and it continues from there


def test_a_safetensors_write_error_during_save_keeps_previous_checkpoint(tokenizer, tmp_path, monkeypatch):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    trainer = make(tokenizer, tmp_path, total_episodes=8 * 3)
    real_write, calls = transformers.modeling_utils.safe_save_file, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint's weights
            raise SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", failing)
    with pytest.raises(UserError, match=r"^checkpoint step-2 could not be written \(SafetensorError: Error while "
                                        r"serializing: I/O error: Disk quota exceeded.*checkpoints/step-1 is kept"):
        trainer.train()
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text() == "step-1" and not (root / ".staging-step-2").exists()
    assert find_checkpoint(tmp_path, "latest") == root / "step-1"


def test_nonfinite_loss_stops_with_one_line_naming_step_and_tensor(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path)
    real_loss, calls = trainer.micro_batch_loss, []

    def nan_on_fifth(*args):
        out = real_loss(*args)
        calls.append(1)
        if len(calls) == 5:  # iteration 1, epoch 0, mini-batch 0
            out.loss = out.loss * float("nan")
        return out

    trainer.micro_batch_loss = nan_on_fifth
    with pytest.raises(UserError) as failure:
        trainer.train()
    assert str(failure.value).startswith("training: non-finite logits at step 1 (ppo epoch 0, mini-batch 0)") or \
        str(failure.value).startswith("training: non-finite loss at step 1 (ppo epoch 0, mini-batch 0)")
    assert "skip_nonfinite_batches" in str(failure.value)
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped_policy.parameters())  # never stepped on NaN


def test_a_minus_inf_logit_in_the_update_stops_with_one_line_naming_the_logits(tokenizer, tmp_path):
    """A -inf logit leaves the chosen tokens' logprobs and the loss finite; the guard must still see it."""
    trainer = make(tokenizer, tmp_path)
    head = trainer.unwrapped_policy.get_output_embeddings()

    def minus_inf_in_training(module, args, output):
        if module.training:
            output = output.clone()
            output[0, 0, 0] = -float("inf")  # the last position predicts nothing and is dropped
            return output

    head.register_forward_hook(minus_inf_in_training)
    with pytest.raises(UserError) as failure:
        trainer.train()
    assert str(failure.value).startswith("training: non-finite logits at step 0 (ppo epoch 0, mini-batch 0)")


def test_skip_nonfinite_batches_skips_the_step_and_counts_it(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, skip_nonfinite_batches=True)
    real_loss, calls = trainer.micro_batch_loss, []

    def nan_once(*args):
        out = real_loss(*args)
        calls.append(1)
        if len(calls) == 5:
            out.loss = out.loss * float("nan")
        return out

    trainer.micro_batch_loss = nan_once
    trainer.train()
    metrics = read_metrics(tmp_path)
    assert [m["guards/skipped_batches"] for m in metrics] == [0, 1, 1, 1, 1, 1]
    steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {6 * 4 - 1}  # 6 iterations x 2 epochs x 2 mini-batches, one skipped
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped_policy.parameters())


def test_nonfinite_gradient_is_named(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path)
    weight = trainer.unwrapped_policy.lm_head.weight
    weight.register_hook(lambda grad: grad * float("inf"))
    with pytest.raises(UserError, match=r"^training: non-finite gradient at step 0 \(ppo epoch 0, mini-batch 0\)"):
        trainer.train()


def test_nonfinite_weights_are_never_committed_and_rollout_guard(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, skip_nonfinite_batches=True)
    with torch.no_grad():
        trainer.unwrapped_policy.lm_head.weight[3, 5] = float("nan")
    with pytest.raises(UserError) as failure:
        trainer.train()  # the rollout guard skips the update; the save refuses the NaN weights
    assert str(failure.value).startswith("checkpoint step-1 not written: parameter 'lm_head.weight' has non-finite")
    assert find_checkpoint(tmp_path, "latest") is None and not list((tmp_path / "checkpoints").glob("*step-1"))
    strict = make(tokenizer, tmp_path / "strict")
    with torch.no_grad():
        strict.unwrapped_policy.lm_head.weight[3, 5] = float("nan")
    with pytest.raises(UserError, match=r"^training: non-finite rollout logprobs at step 0 \(rollout\)"):
        strict.train()


def test_checkpoint_missing_a_weight_is_refused(tokenizer, tmp_path):
    from safetensors.torch import load_file, save_file

    trainer = make(tokenizer, tmp_path / "a", total_episodes=8)
    trainer.train()
    folder = find_checkpoint(tmp_path / "a", "latest")
    weights_file = folder / "model" / "model.safetensors"
    weights = load_file(str(weights_file))
    dropped = next(name for name in weights if "mlp" in name)
    del weights[dropped]
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    fresh = make(tokenizer, tmp_path / "b", total_episodes=8)
    with pytest.raises(UserError, match=f"missing weight {dropped}"):
        load_checkpoint(fresh, folder)


def test_a_bug_while_saving_keeps_its_traceback_and_the_previous_checkpoint(tokenizer, tmp_path, monkeypatch):
    # Only the user's causes (disk full, permissions) become one line; a programming error must stay visible.
    trainer = make(tokenizer, tmp_path, total_episodes=8 * 3)
    real_save, calls = torch.save, []

    def buggy(obj, path, *args, **kwargs):
        calls.append(str(path))
        if str(path).endswith("scheduler.pt") and len([c for c in calls if c.endswith("scheduler.pt")]) == 2:
            raise TypeError("a bug in a serializer")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", buggy)
    with pytest.raises(TypeError, match="a bug in a serializer"):
        trainer.train()
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text() == "step-1" and not (root / ".staging-step-2").exists()


def test_python_trainer_refuses_a_used_output_dir_and_resumes_with_trls_argument(tokenizer, tmp_path):
    first = make(tokenizer, tmp_path, total_episodes=8 * 2)
    first.train()
    metrics = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(UserError) as refused:
        make(tokenizer, tmp_path, total_episodes=8 * 2).train()
    assert "holds another run's files" in str(refused.value) and "overwrite_output_dir" in str(refused.value)
    assert (tmp_path / "metrics.jsonl").read_bytes() == metrics  # nothing appended
    longer = make(tokenizer, tmp_path, total_episodes=8 * 3)
    longer.train(resume_from_checkpoint="latest")  # TRL's Trainer.train argument
    assert longer.state.iteration == 3
    assert [record["episode"] for record in read_metrics(tmp_path)] == [8, 16, 24]
