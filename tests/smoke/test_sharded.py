"""Real sharding on two CPU processes: FSDP2 and DeepSpeed ZeRO-2/3 end where the one-process run ends, and a
run stopped by SIGTERM resumes through the engine's sharded checkpoint to the uninterrupted run's weights.

accelerate turns an FSDP or DeepSpeed config into plain data parallel on CPU, and without a GPU it brings each
launched process up alone. For these tests only, a `sitecustomize` module in the launch's PYTHONPATH makes
accelerate's backend choice say gloo with the GPU code path (`ACCELERATE_TORCH_DEVICE=cpu` keeps tensors on CPU),
so the real FSDP2 / DeepSpeed wrapping runs. It leans on a private accelerate method, hence the pinned accelerate;
the trainer itself refuses such fallbacks with one line.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from optional_extras import requires
from safetensors.torch import load_file

from tests.smoke.test_distributed import free_port, launch, write_recipe

FSDP2 = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: false
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: FULL_STATE_DICT
num_machines: 1
num_processes: 2
machine_rank: 0
mixed_precision: "no"
use_cpu: false
"""


REPO = Path(__file__).resolve().parents[2]

COALESCED_GATHERS = "coalesced_gathers.jsonl"  # in the launch's folder, written by the shim below

SHIM = """\
import json
import os
COALESCED_LOG = os.path.abspath(%r)
if os.environ.get("LOCAL_RANK") is not None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    PartialState._prepare_backend = lambda self, *args, **kwargs: ("gloo", DistributedType.MULTI_GPU)
if os.environ.get("LOCAL_RANK") is not None and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
    # DeepSpeed's gather of several parameters at once waits on its last all-gather only, which gloo does not
    # order: a run must never take it (sharding.wait_for_each_zero3_gather); each use is written down for the test
    from deepspeed.runtime.zero.partition_parameters import Init

    coalesced = Init._allgather_params_coalesced

    def recorded(self, param_list, *args, **kwargs):
        if param_list:
            with open(COALESCED_LOG, "a") as log:
                log.write(json.dumps({"rank": os.environ["RANK"], "parameters": len(param_list)}) + "\\n")
        return coalesced(self, param_list, *args, **kwargs)

    Init._allgather_params_coalesced = recorded
""" % COALESCED_GATHERS


def launch_sharded(tmp_path, model_dir, name, config_text, overrides=(), env_extra=None, timeout=900, lora=""):
    """Like `launch` with two processes, under an accelerate config file and the CPU arrangement above. Its output
    is also kept in `<name>.stdout` and `<name>.stderr` beside the run, and a launch still running after `timeout`
    (a hang guard: these runs take well under a minute on an idle machine) fails with the end of its stderr."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(config_text)
    (tmp_path / "sitecustomize.py").write_text(SHIM)
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update({"ACCELERATE_TORCH_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{tmp_path}:{REPO}",
                "DS_ACCELERATOR": "cpu", **(env_extra or {})})
    recipe = write_recipe(tmp_path, model_dir, name, 2, lora=lora)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--main_process_port", str(free_port()), "-m", "training_wizard", str(recipe), *overrides]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired as expired:
        kept = keep_output(tmp_path, name, expired.stdout, expired.stderr)
        pytest.fail(f"{name}: still running after {timeout} s; its stderr ended: {kept[-3000:]}")
    keep_output(tmp_path, name, done.stdout, done.stderr)
    return done


def keep_output(folder: Path, name: str, stdout, stderr) -> str:
    """Writes a launch's output beside its run (a failure seen once is then still there to read); returns stderr.
    A launch stopped by its timeout hands over bytes (or None), a finished one text."""
    texts = [text.decode(errors="replace") if isinstance(text, bytes) else text or "" for text in (stdout, stderr)]
    for suffix, text in zip(("stdout", "stderr"), texts):
        (folder / f"{name}.{suffix}").write_text(text)
    return texts[1]


def saved_weights(run: Path) -> dict:
    """The final model's tensors: full weights, or the LoRA adapter's."""
    folder = run / "model"
    adapter = folder / "adapter_model.safetensors"
    return load_file(str(adapter if adapter.exists() else folder / "model.safetensors"))


def max_difference(a: Path, b: Path, start: bool = False) -> float:
    """Largest weight difference between two runs' saved models (`start`: b is the starting model folder)."""
    one = saved_weights(a)
    two = load_file(str(b / "model.safetensors")) if start else saved_weights(b)
    assert one.keys() == two.keys()
    return max((one[k] - two[k]).abs().max().item() for k in one)


def stop_and_resume(tmp_path, model_dir, name, config_text, env_extra=None, lora=""):
    """An uninterrupted sharded run, and one that rank 1's SIGTERM stops after iteration 2 and that resumes from its
    checkpoint; returns (uninterrupted folder, resumed folder)."""
    full = launch_sharded(tmp_path, model_dir, f"{name}-full", config_text, env_extra=env_extra, lora=lora)
    assert full.returncode == 0, full.stderr[-3000:]
    stop = {**(env_extra or {}), "TRAINING_WIZARD_FAULT_INJECT": "iteration@2#1=term"}
    first = launch_sharded(tmp_path, model_dir, f"{name}-parts", config_text, env_extra=stop, lora=lora)
    # Both ranks report the stop; the launcher then names one failed rank: 143 (SIGTERM's exit), or now and then
    # -6 when torch's process-group threads abort rank 0 during its exit after the committed checkpoint.
    assert first.returncode != 0 and first.stderr.count("stopped by SIGTERM at step 2") == 2, first.stderr[-3000:]
    assert "exitcode  : 143" in first.stderr or "exitcode: -6" in first.stderr, first.stderr[-3000:]
    assert (tmp_path / f"{name}-parts" / "checkpoints" / "step-2" / "sharded").is_dir()
    rest = launch_sharded(tmp_path, model_dir, f"{name}-parts", config_text, env_extra=env_extra, lora=lora,
                          overrides=["resume_from_checkpoint=latest"])
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert "resumed from" in rest.stdout and "iteration 2" in rest.stdout
    return tmp_path / f"{name}-full", tmp_path / f"{name}-parts"


# FSDP1 gathered its full state dict with offload_to_cpu=True, which segfaults in torch on CPU shards
@pytest.mark.slow  # two processes twice, about 45 s: .ci/run runs it
@pytest.mark.parametrize("version", [2, 1], ids=["fsdp2", "fsdp1"])
def test_fsdp_two_processes_match_one_process(tmp_path, tiny_model_dir, version):
    single = launch(tmp_path, tiny_model_dir, "single", 1)
    assert single.returncode == 0, single.stderr[-3000:]
    # the launch sets ACCELERATE_USE_FSDP; the run refuses to start unless it really came up as FSDP
    config = FSDP2.replace("fsdp_version: 2", f"fsdp_version: {version}")
    if version == 1:  # syncing module states needs an accelerator device; every rank loads the same weights anyway
        config = config.replace("fsdp_config:\n", "fsdp_config:\n  fsdp_sync_module_states: false\n  fsdp_use_orig_params: true\n")
    sharded = launch_sharded(tmp_path, tiny_model_dir, f"fsdp{version}", config)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert max_difference(tmp_path / "single", tmp_path / f"fsdp{version}") < 1e-5
    assert max_difference(tmp_path / "single", Path(tiny_model_dir), start=True) > 2e-4


ZERO = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: {stage}
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
  zero3_save_16bit_model: true
num_machines: 1
num_processes: 2
machine_rank: 0
mixed_precision: "no"
use_cpu: false
"""


@pytest.mark.slow  # a minute; CI runs it in its slow step, and the default suite has the FSDP2 1-vs-2 test
def test_fsdp2_resumes_exactly_after_sigterm(tmp_path, tiny_model_dir):
    full, resumed = stop_and_resume(tmp_path, tiny_model_dir, "fsdp2", FSDP2)
    assert max_difference(full, resumed) == 0.0


DEEPSPEED_CACHE = {"TORCH_EXTENSIONS_DIR": str(Path(tempfile.gettempdir()) / "training-wizard-torch-extensions")}
LORA = "lora = { r = 4, alpha = 8 }"


def assert_no_coalesced_gathers(folder: Path) -> None:
    """No process of the runs launched in `folder` gathered several ZeRO-3 parameters through DeepSpeed's coalesced
    all-gather, which on gloo could hand out a weight before its gather finished: a rollout then sampled from
    wrong weights on one process now and then (docs/distributed.md, scripts/zero3_gloo_gather_race.py)."""
    log = folder / COALESCED_GATHERS
    assert not log.exists(), log.read_text()[:2000]


@pytest.mark.slow
@requires("deepspeed")
@pytest.mark.parametrize("stage, lora", [
    pytest.param(2, "", id="zero2"), pytest.param(3, "", id="zero3"),
    # after the gather fix, once failed in 6 runs and once in 23, both with the output lost (a start that crashed
    # the second time: docs/distributed.md, "ZeRO-3 + LoRA"): out of .ci/run until the cause is known
    pytest.param(3, LORA, id="zero3_lora", marks=pytest.mark.nondeterministic),
])
def test_deepspeed_two_processes_match_one_process(tmp_path, tiny_model_dir, stage, lora):
    # ZeRO-3 loads the policy partitioned: the reference is the model loaded a second time (full policy), or the
    # policy with its adapter disabled (LoRA), run through a DeepSpeed inference engine
    single = launch(tmp_path, tiny_model_dir, "single", 1, lora=lora)
    assert single.returncode == 0, single.stderr[-3000:]
    # DS_ACCELERATOR=cpu: DeepSpeed's CPU accelerator (gloo); its one compiled op is cached across runs
    sharded = launch_sharded(tmp_path, tiny_model_dir, f"zero{stage}", ZERO.format(stage=stage),
                             env_extra=DEEPSPEED_CACHE, lora=lora)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert_no_coalesced_gathers(tmp_path)
    assert max_difference(tmp_path / "single", tmp_path / f"zero{stage}") < 1e-5
    if not lora:
        assert max_difference(tmp_path / "single", Path(tiny_model_dir), start=True) > 2e-4


@pytest.mark.slow
@requires("deepspeed")
def test_zero3_resumes_exactly_after_sigterm(tmp_path, tiny_model_dir):
    full, resumed = stop_and_resume(tmp_path, tiny_model_dir, "zero3", ZERO.format(stage=3), env_extra=DEEPSPEED_CACHE)
    assert_no_coalesced_gathers(tmp_path)
    assert max_difference(full, resumed) == 0.0


@pytest.mark.slow
@requires("deepspeed")
def test_deepspeed_nonfinite_loss_on_one_rank_skips_or_stops(tmp_path, tiny_model_dir):
    """DeepSpeed steps inside backward; a NaN loss on rank 1 (iteration 1) must still be skipped on both ranks in
    skip mode, and stop the run with one line (weights never stepped on NaN) otherwise."""
    nan_on_rank_1 = {**DEEPSPEED_CACHE, "TRAINING_WIZARD_FAULT_INJECT": "loss@1#1=nan"}
    zero2 = ZERO.format(stage=2)
    skipped = launch_sharded(tmp_path, tiny_model_dir, "skip", zero2, env_extra=nan_on_rank_1,
                             overrides=["training.skip_nonfinite_batches=true"])
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert [m["guards/skipped_batches"] for m in metrics] == [0, 1, 1]  # epoch 0's step of iteration 1
    weights = saved_weights(tmp_path / "skip")
    assert all(torch.isfinite(w).all() for w in weights.values())
    stopped = launch_sharded(tmp_path, tiny_model_dir, "strict", zero2, env_extra=nan_on_rank_1)
    assert stopped.returncode != 0
    assert "training: non-finite loss at step 1 (ppo epoch 0, mini-batch 0)" in stopped.stderr, stopped.stderr[-3000:]
