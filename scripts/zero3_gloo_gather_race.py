"""DeepSpeed alone: under ZeRO-3 on gloo (CPU), gathering several parameters at once can hand out weights before
their all-gather has finished.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc_per_node 2 \
        scripts/zero3_gloo_gather_race.py [--steps 20] [--fixed]

No training-wizard code runs here. A model of four 512x512 linear layers and a 512x4 head is trained with ZeRO-3
on two CPU processes. After each optimizer step, on every process:
- `deepspeed.zero.GatheredParameters(all parameters)` is entered and each weight is copied at once: what a forward
  pass inside the context would read;
- the context is left, and each weight is gathered again alone (one parameter takes DeepSpeed's blocking path):
  the weights the optimizer wrote.
Every step whose two copies differ is printed (which weights, on which process, how many of their values, and
how many of those are the weight's values from before the step); the script exits 1 if any step did.

Why: `Init._allgather_params_coalesced` (partition_parameters.py, DeepSpeed 0.19.0) starts one asynchronous
all-gather per parameter and waits on the last only ("Wait ensures the operation is enqueued, but not necessarily
complete"), relying on a GPU stream to order them. Gloo runs asynchronous collectives on a pool of worker threads
(two per process group), so the last can finish while an earlier one is still writing. Each gather's buffer comes
from `torch.empty`, so until then a weight holds whatever that memory held (zeros, another tensor's values, or
the weight's own values from before the step: the script counts those). The same function re-gathers ZeRO-3's persistent (small)
parameters after every optimizer step (stage3.py), so plain training is exposed too, not only
`GatheredParameters`.

`--fixed` sets `stage3_allgather_sequential`, under which DeepSpeed gathers parameters one at a time and waits on
each (what training-wizard does on gloo); no step should then differ.
"""

import argparse
import sys

import deepspeed
import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # large weights first and a small one last: the last all-gather is the one waited on, and it finishes long
    # before the large ones started next to it on the other gloo thread
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=False) for _ in range(4)],
                                torch.nn.Linear(512, 4, bias=False))
    names = [name for name, _ in model.named_parameters()]
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        # every weight under the threshold stays gathered between steps: the optimizer step re-gathers them with
        # the same coalesced all-gather, and GatheredParameters then finds them all gathered already. A threshold
        # of 0 keeps them partitioned, so the context gathers them itself.
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "stage3_allgather_sequential": args.fixed},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    params = list(engine.module.parameters())
    bad_steps = 0
    before = {}  # each weight as the previous step left it
    for step in range(args.steps):
        x = torch.randn(4, 512)
        loss = engine(x).square().mean()
        engine.backward(loss)
        engine.step()
        with deepspeed.zero.GatheredParameters(params):
            seen = [p.data.clone() for p in params]
        wrong = []
        for name, p, s in zip(names, params, seen):
            with deepspeed.zero.GatheredParameters([p]):  # one parameter: the blocking path
                written = p.data.clone()
            if not torch.equal(s, written):
                stale = int((s == before[name]).sum()) if name in before else 0
                wrong.append(f"{name} ({int((s != written).sum())} of {written.numel()} values wrong, {stale} of "
                             "them the values from before this step)")
            before[name] = written
        dist.barrier()  # nothing of this step's gathers is still running when the next step starts
        if wrong:
            bad_steps += 1
            print(f"rank {rank} step {step}: gathered before their all-gather finished: {', '.join(wrong)}",
                  flush=True)
    flags = torch.tensor([bad_steps])
    dist.all_reduce(flags)
    if rank == 0:
        print(f"steps with weights read before their gather finished, summed over processes: {flags.item()} "
              f"of {args.steps} x {dist.get_world_size()}", flush=True)
    return 1 if flags.item() else 0


if __name__ == "__main__":
    sys.exit(main())
