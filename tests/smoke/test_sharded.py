"""Real sharding on two CPU processes: FSDP2 ends where the one-process run ends.

accelerate turns an FSDP or DeepSpeed config into plain data parallel on CPU, and without a GPU it brings each
launched process up alone. For these tests only, a `sitecustomize` module in the launch's PYTHONPATH makes
accelerate's backend choice say gloo with the GPU code path (`ACCELERATE_TORCH_DEVICE=cpu` keeps tensors on CPU),
so the real FSDP2 / DeepSpeed wrapping runs. It leans on a private accelerate method, hence the pinned accelerate;
the trainer itself refuses such fallbacks with one line.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from optional_extras import requires
from safetensors.torch import load_file

from tests.smoke.test_distributed import free_port, launch

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

SHIM = """\
import os
if os.environ.get("LOCAL_RANK") is not None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    PartialState._prepare_backend = lambda self, *args, **kwargs: ("gloo", DistributedType.MULTI_GPU)
"""


def launch_sharded(tmp_path, model_dir, name, config_text, overrides=(), env_extra=None, timeout=400):
    """Like `launch` with two processes, under an accelerate config file and the CPU arrangement above."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(config_text)
    (tmp_path / "sitecustomize.py").write_text(SHIM)
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update({"ACCELERATE_TORCH_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{tmp_path}:{REPO}",
                "DS_ACCELERATOR": "cpu", **(env_extra or {})})
    recipe = tmp_path / f"{name}.toml"
    # the one-process run of the same test wrote the recipe; same global batch (1 x 4 x 2 == 2 x 4 x 1)
    single = (tmp_path / "single.toml").read_text()
    recipe.write_text(single.replace(str(tmp_path / "single"), str(tmp_path / name))
                      .replace("gradient_accumulation_steps = 2", "gradient_accumulation_steps = 1"))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--main_process_port", str(free_port()), "-m", "training_wizard", str(recipe), *overrides]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def max_difference(a: Path, b: Path, start: bool = False) -> float:
    """Largest weight difference between two runs' saved models (`start`: b is the starting model folder)."""
    one = load_file(str(a / "model" / "model.safetensors"))
    two = load_file(str(b / "model.safetensors" if start else b / "model" / "model.safetensors"))
    assert one.keys() == two.keys()
    return max((one[k] - two[k]).abs().max().item() for k in one)


def test_fsdp2_two_processes_match_one_process(tmp_path, tiny_model_dir):
    single = launch(tmp_path, tiny_model_dir, "single", 1)
    assert single.returncode == 0, single.stderr[-3000:]
    # the launch sets ACCELERATE_USE_FSDP; the run refuses to start unless it really came up as FSDP
    sharded = launch_sharded(tmp_path, tiny_model_dir, "fsdp2", FSDP2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert max_difference(tmp_path / "single", tmp_path / "fsdp2") < 1e-5
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


# ZeRO-3 with a full policy: the model arrives partitioned and the reference is a deepcopy holding empty weights,
# so the rollout fails ("'weight' must be 2-D"); strict, so this flips to a failure once the reference is fixed.
ZERO3_REFERENCE = pytest.mark.xfail(strict=True, reason="ZeRO-3 reference model is an empty partitioned copy")


@pytest.mark.slow
@requires("deepspeed")
@pytest.mark.parametrize("stage", [2, pytest.param(3, marks=ZERO3_REFERENCE)])
def test_deepspeed_two_processes_match_one_process(tmp_path, tiny_model_dir, stage):
    single = launch(tmp_path, tiny_model_dir, "single", 1)
    assert single.returncode == 0, single.stderr[-3000:]
    # DS_ACCELERATOR=cpu: DeepSpeed's CPU accelerator (gloo); its one compiled op is cached across runs
    cache = {"TORCH_EXTENSIONS_DIR": str(Path(tempfile.gettempdir()) / "training-wizard-torch-extensions")}
    sharded = launch_sharded(tmp_path, tiny_model_dir, f"zero{stage}", ZERO.format(stage=stage), env_extra=cache)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert max_difference(tmp_path / "single", tmp_path / f"zero{stage}") < 1e-5
