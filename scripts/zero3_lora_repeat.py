"""Runs the ZeRO-3 + LoRA comparison of tests/smoke/test_sharded.py many times and keeps every launch's output, to
catch the now-and-then failure that docs/distributed.md ("ZeRO-3 + LoRA") still lists as open.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/zero3_lora_repeat.py FOLDER [--runs 8] [--fresh-extensions]

Each run is the test's pair of launches on the tiny test model: one process, then two processes under DeepSpeed
ZeRO-3 (gloo, DeepSpeed's CPU accelerator), both training a LoRA adapter. One JSON line per run says each launch's
exit code, the largest difference between the two saved adapters (the test allows 1e-5) and whether any process
took DeepSpeed's coalesced gather; `FOLDER/rN/` keeps the runs, their `*.stderr` and `*.stdout`.
`--fresh-extensions` gives every run a torch extensions folder of its own, so each two-process launch compiles
DeepSpeed's CPU communication op at start, as the first DeepSpeed launch on a machine does. Exits 1 if any run
failed or differed.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the test harness and its optional_extras helper

from tests.smoke.test_distributed import launch  # noqa: E402
from tests.smoke.test_sharded import (  # noqa: E402
    COALESCED_GATHERS, DEEPSPEED_CACHE, LORA, ZERO, keep_output, launch_sharded, max_difference)
from training_wizard.testing import save_tiny_model  # noqa: E402


def one_run(folder: Path, model_dir: Path, fresh_extensions: bool) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    single = launch(folder, model_dir, "single", 1, lora=LORA)
    keep_output(folder, "single", single.stdout, single.stderr)
    extensions = {"TORCH_EXTENSIONS_DIR": str(folder / "extensions")} if fresh_extensions else DEEPSPEED_CACHE
    sharded = launch_sharded(folder, model_dir, "zero3", ZERO.format(stage=3), env_extra=extensions, lora=LORA)
    both = single.returncode == 0 and sharded.returncode == 0
    return {"single": single.returncode, "zero3": sharded.returncode,
            "difference": max_difference(folder / "single", folder / "zero3") if both else None,
            "coalesced_gather": (folder / COALESCED_GATHERS).exists()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--fresh-extensions", action="store_true")
    args = parser.parse_args()
    model_dir = save_tiny_model(args.folder / "tiny-llama")
    failed = 0
    for number in range(args.runs):
        result = one_run(args.folder / f"r{number}", model_dir, args.fresh_extensions)
        bad = result["difference"] is None or result["difference"] >= 1e-5 or result["coalesced_gather"]
        failed += bad
        print(json.dumps({"run": number, **result, "failed": bad}), flush=True)
    print(f"{failed} of {args.runs} runs failed or differed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
