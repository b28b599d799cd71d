"""The on-policy options that shape the forward passes over completions: micro-batches sized by tokens instead of
rows (trainers/loop/token_budget.py, core/micro_batches.py; docs/performance.md, "Token-budget micro-batches"),
and rows packed without padding (rollout/packing.py; docs/performance.md, "Padding-free packed forwards").

Peers' names for it: veRL's `use_dynamic_bsz` with `ppo_max_token_len_per_gpu`, OpenRLHF's
`--train.dynamic_batch_enable --train.max_tokens_per_gpu`, SkyRL's `max_tokens_per_microbatch`, AReaL's
`mb_spec.max_tokens_per_mb`, slime's `--use-dynamic-batch-size --max-tokens-per-gpu`, NeMo-RL's
`policy.dynamic_batching`.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from training_wizard.trainers.config.run import RunConfig


class TokenBudgetOptions(RunConfig):
    """How many tokens one forward pass over completions may hold, and whether its rows are packed."""

    max_tokens_per_micro_batch: PositiveInt | None = Field(
        None, description="Tokens per forward pass over completions (padding included: rows x the chunk's longest "
        "prompt + response, after cutting columns that are padding in every row; with padding_free the rows' real "
        "tokens). Set: every update micro-batch "
        "and every no-grad pass (policy, reference, value and reward models) groups rows of similar length to fill "
        "it, a row longer than it going alone; each optimizer step still covers the rows of one mini-batch, its "
        "loss normalised by the step's totals, so the gradient does not depend on the split "
        "(per_device_train_batch_size and gradient_accumulation_steps then only size the mini-batch, and "
        "local_rollout_forward_batch_size only the sampling). None: fixed row counts. Not supported under "
        "DeepSpeed or FSDP.")
    padding_free: bool = Field(
        False, description="Padding-free packed forwards: every pass over completions (policy "
        "and reference logprobs, the update, PPO's values, a reward model) runs its rows as one sequence, no padding "
        "(veRL: use_remove_padding; OpenRLHF: --ds.packing_samples; NeMo-RL: sequence_packing); no prompt is then "
        "shared. Llama, Mistral, Qwen2/3 models; not with DeepSpeed, FSDP or torch_compile. docs/performance.md.")
