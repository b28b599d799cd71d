"""The on-policy option that trades the decode loop's speed with LoRA for memory (rollout/adapters.py;
docs/performance.md, "Memory plan")."""

from __future__ import annotations

from pydantic import Field

from training_wizard.trainers.config.run import RunConfig


class LoraSamplingOptions(RunConfig):
    """Whether the decode loop samples with each LoRA layer's adapter folded into a copy of its weight."""

    fold_lora_for_sampling: bool = Field(
        True, description="With LoRA, the decode loop samples with each adapted layer's weight and adapter folded "
        "into one new tensor: one matrix product per layer and token step instead of three, at the cost of a copy "
        "of every adapted weight while sampling runs (Qwen2.5-7B in bfloat16 with LoRA on every linear layer: "
        "13 GB). false: sample through the adapters as they are, slower per token, no copy; the --dry-run memory "
        "plan names this key when the copy decides the peak. Samples differ only by float rounding. "
        "No effect with vLLM, or where the model samples sharded (FSDP; ZeRO-3 without ds3_gather_for_generation).")
