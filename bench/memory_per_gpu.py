"""Memory per GPU of an RLOO run under each engine, computed (not measured) from the model's shape.

    python bench/memory_per_gpu.py [--gpus 8] [--micro-batch 4] [--prompt 256] [--response 256] [--rollout-rows 16]

Prints the markdown table of docs/distributed.md. What is counted, per GPU, in GiB:
- trained state: 16 bytes per trained parameter (fp32 weights 4, gradients 4, Adam's two moments 8; DeepSpeed's
  bf16 mode keeps the same total as bf16 weights 2 + gradients 2 + fp32 master and moments 12). ZeRO-2 shards
  gradients and optimizer state over the GPUs, ZeRO-3 and FSDP also the weights.
- reference: the frozen starting policy at 4 bytes per parameter. ZeRO-3 (a DeepSpeed inference engine) and
  FSDP2 shard it; under DDP and ZeRO-2 each GPU holds a full copy. With LoRA there is no copy (the reference is the
  policy with its adapter disabled) and the trained state is the adapter's only.
- activations of one update micro-batch, no gradient checkpointing, bf16 autocast with fused attention (SDPA):
  about 34 x tokens x hidden bytes per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", without the attention-score term that fused attention does not store), plus the
  response logits in float32 and their gradient (8 bytes per response token per vocabulary entry).
- the rollout's KV cache: rows x (prompt + response) x layers x 2 x kv_heads x head_dim x 2 bytes (bf16).
Not counted: the CUDA context and allocator slack (budget 1-3 GiB), a reward model, temporary buffers of a
ZeRO-3/FSDP layer gather (one layer's weights at a time).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Shape:
    name: str
    parameters: float
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def lora_parameters(self, rank: int = 16, intermediate_ratio: float = 3.5) -> float:
        """LoRA r on every linear layer of every block (q, k, v, o, gate, up, down)."""
        kv = self.kv_heads * self.head_dim
        inter = int(self.hidden * intermediate_ratio)
        pairs = [(self.hidden, self.hidden), (self.hidden, kv), (self.hidden, kv), (self.hidden, self.hidden),
                 (self.hidden, inter), (self.hidden, inter), (inter, self.hidden)]
        return self.layers * sum(rank * (a + b) for a, b in pairs)


MODELS = [
    Shape("SmolLM2-135M", 134.5e6, 576, 30, 9, 3, 49152),
    Shape("Qwen2.5-1.5B", 1.54e9, 1536, 28, 12, 2, 151936),
    Shape("Qwen2.5-7B", 7.62e9, 3584, 28, 28, 4, 152064),
]
MODES = ["DDP", "ZeRO-2", "ZeRO-3", "FSDP2 (full shard)", "DDP + LoRA r 16"]


def per_gpu(shape: Shape, mode: str, gpus: int, micro_batch: int, prompt: int, response: int, rows: int) -> dict:
    n = shape.parameters
    trained_params = shape.lora_parameters() if "LoRA" in mode else n
    if mode == "ZeRO-2":
        trained = 4 * n + 12 * n / gpus
    elif mode in ("ZeRO-3", "FSDP2 (full shard)"):
        trained = 16 * n / gpus
    elif "LoRA" in mode:
        trained = 4 * n + 16 * trained_params  # frozen base weights + the adapter's full state
    else:
        trained = 16 * n
    reference = 0.0 if "LoRA" in mode else (4 * n / gpus if mode in ("ZeRO-3", "FSDP2 (full shard)") else 4 * n)
    tokens = micro_batch * (prompt + response)
    activations = 34 * tokens * shape.hidden * shape.layers + 8 * micro_batch * response * shape.vocab
    kv_cache = rows * (prompt + response) * shape.layers * 2 * shape.kv_heads * shape.head_dim * 2
    parts = {"trained": trained, "reference": reference, "activations": activations, "kv cache": kv_cache}
    return {name: value / GIB for name, value in parts.items()} | {"total": sum(parts.values()) / GIB}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--rollout-rows", type=int, default=16)
    args = parser.parse_args()
    print(f"GiB per GPU; {args.gpus} GPUs; update micro-batch {args.micro_batch} x ({args.prompt} prompt + "
          f"{args.response} response tokens); rollout {args.rollout_rows} rows at a time\n")
    print("| model | engine | weights + grads + Adam | reference | activations | KV cache | total |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in MODELS:
        for mode in MODES:
            m = per_gpu(shape, mode, args.gpus, args.micro_batch, args.prompt, args.response, args.rollout_rows)
            print(f"| {shape.name} | {mode} | {m['trained']:.1f} | {m['reference']:.1f} | {m['activations']:.1f} "
                  f"| {m['kv cache']:.2f} | {m['total']:.1f} |")


if __name__ == "__main__":
    main()
