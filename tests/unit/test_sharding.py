"""What a sharded run does differently (training_wizard/sharding.py), checked without launching processes: the
refusals that keep a sharded run from going wrong silently. The launched runs are in tests/smoke/test_sharded.py."""

from types import SimpleNamespace

import pytest
import torch

from training_wizard import RLOOConfig, RLOOTrainer
from training_wizard.checkpoint import find_checkpoint, load_checkpoint
from training_wizard.errors import UserError
from training_wizard.sharding import check_supported, needs_separate_reference, wait_for_each_zero3_gather
from training_wizard.testing import build_causal_lm, build_tokenizer


def fake_accelerator(kind: str, zero_stage=None):
    plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage is not None else None
    return SimpleNamespace(distributed_type=SimpleNamespace(name=kind), state=SimpleNamespace(deepspeed_plugin=plugin))


def test_two_trained_models_are_refused_under_an_engine_in_one_line():
    models = {"model": torch.nn.Linear(2, 2), "value_model": torch.nn.Linear(2, 1)}
    for kind in ("DEEPSPEED", "FSDP"):
        with pytest.raises(UserError, match=rf"^accelerate config: {kind} trains one model per run here, .* "
                                            r"\(model, value_model\); use plain data parallel"):
            check_supported(fake_accelerator(kind), models)
    check_supported(fake_accelerator("MULTI_GPU"), models)  # data parallel trains both
    check_supported(fake_accelerator("DEEPSPEED", 2), {"model": models["model"]})


def test_a_run_without_deepspeed_does_not_import_it():
    """accelerate's unwrapping (also inside save_pretrained) imports DeepSpeed when it is installed: 221 MB and
    4 s in every CPU run. The run below samples, updates and saves a checkpoint."""
    script = (
        "import sys, tempfile\n"
        "from training_wizard import RLOOConfig, RLOOTrainer\n"
        "from training_wizard.testing import build_causal_lm, build_tokenizer\n"
        "tokenizer = build_tokenizer()\n"
        "config = RLOOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, rloo_k=2, total_episodes=8,"
        " response_length=4, num_sample_generations=0, save_steps=1)\n"
        "RLOOTrainer(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer), reward_model=lambda p, c, **k:"
        " [1.0] * len(c), train_dataset=[{'prompt': 'a b'}] * 4).train()\n"
        "print('deepspeed' in sys.modules)\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_only_a_full_policy_under_zero3_needs_its_reference_loaded_again():
    full = torch.nn.Linear(2, 2)
    lora = SimpleNamespace(disable_adapter=lambda: None)
    assert needs_separate_reference(fake_accelerator("DEEPSPEED", 3), full)
    assert not needs_separate_reference(fake_accelerator("DEEPSPEED", 3), lora)  # adapter disabled is the reference
    assert not needs_separate_reference(fake_accelerator("DEEPSPEED", 2), full)
    assert not needs_separate_reference(fake_accelerator("FSDP"), full)


def test_zero3_over_gloo_gathers_one_parameter_at_a_time(monkeypatch):
    """DeepSpeed's coalesced gather waits on its last all-gather only, which gloo does not order (docs/
    distributed.md): under ZeRO-3 on gloo the config asks for sequential gathers, in accelerate's config and in
    transformers' copy that partitions models as they load; other backends and stages are left alone."""

    class Plugin:
        def __init__(self, stage):
            self.zero_stage = stage
            self.deepspeed_config = {"zero_optimization": {"stage": stage}}
            self.dschf = object()  # the copy accelerate hands transformers once the plugin is selected
            self.renewed = 0

        def set_deepspeed_weakref(self):
            self.renewed += 1

    def run(stage, backend):
        plugin = Plugin(stage)
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: backend)
        wait_for_each_zero3_gather(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)))
        return plugin.deepspeed_config["zero_optimization"].get("stage3_allgather_sequential"), plugin.renewed

    assert run(3, "gloo") == (True, 1)
    assert run(3, "nccl") == (None, 0)
    assert run(2, "gloo") == (None, 0)
    plugin = Plugin(3)  # a second call (before prepare) finds it set and renews nothing
    plugin.deepspeed_config["zero_optimization"]["stage3_allgather_sequential"] = True
    wait_for_each_zero3_gather(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)))
    assert plugin.renewed == 0


def test_a_sharded_checkpoint_is_refused_by_an_unsharded_run(tmp_path):
    tokenizer = build_tokenizer()
    options = dict(output_dir=str(tmp_path), seed=1, rloo_k=2, per_device_train_batch_size=4, total_episodes=8,
                   response_length=4, num_sample_generations=0, save_steps=1)
    trainer = RLOOTrainer(config=RLOOConfig(**options), tokenizer=tokenizer, policy=build_causal_lm(tokenizer),
                          reward_model=lambda prompts, completions, **_: [1.0] * len(completions),
                          train_dataset=[{"prompt": f"Item {i}."} for i in range(4)])
    trainer.train()
    folder = find_checkpoint(tmp_path, "latest")
    (folder / "sharded").mkdir()  # what a DeepSpeed or FSDP run writes beside model/
    before = [p.detach().clone() for p in trainer.unwrapped_policy.parameters()]
    with pytest.raises(UserError, match=r"^resume_from_checkpoint: .*step-\d+ was written under DeepSpeed or FSDP and "
                                        r"this run is not sharded; resume with the accelerate config that wrote it$"):
        load_checkpoint(trainer, folder)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.unwrapped_policy.parameters()))
