"""The memory plan an on-policy recipe prints at --dry-run: its facts gathered from the recipe, its config, the
launch and the prompts (memory_plan.py does the arithmetic), and whether it fits a budget.

Nothing here loads weights: the model's shape comes from its config.json (a bundled model's converted folder, a
LoRA run's adapter folder through its base model). The budget is `--memory-budget`, else the device's: a CUDA
device's total memory, or on CPU the machine's available memory shared by the processes launched on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from training_wizard.errors import UserError
from training_wizard.memory_plan import (
    MemoryFacts, MemoryPlan, ModelShape, format_bytes, plan_memory, verdict,
)

# What a CPU run's process holds besides the planned terms: Python, torch, transformers, datasets, accelerate and
# peft imported, the tokenizer and the prompts, and glibc's allocator keeping freed blocks of one phase that the
# next cannot reuse (memory.py). Measured by bench/memory_plan.py on a 1M-parameter model, whose planned terms are
# a few MB (BENCHMARKS.md, "Memory plan").
CPU_RUNTIME_BYTES = 600 * 10**6
# A CUDA context and the caching allocator's slack (PyTorch's CUDA notes): a common figure, not measured here.
CUDA_RUNTIME_BYTES = 500 * 10**6
_WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_config(folder: Path) -> dict | None:
    """config.json of a model folder, or of a LoRA adapter folder's base model; None where there is none."""
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    adapter = folder / "adapter_config.json"
    base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path") if adapter.is_file() else None
    if not base:
        return None
    from training_wizard.specs.model import TransformerSpec

    return model_config(TransformerSpec(pretrained_name=base).resolved_path())


def model_shape(spec, vocab: int | None = None) -> ModelShape:
    """The shape of the model a TransformerSpec (or a reward spec with `pretrained_name`) names, from its config;
    a UserError says why there is none."""
    from training_wizard.specs.model import TransformerSpec

    folder = spec.resolved_path() if isinstance(spec, TransformerSpec) else TransformerSpec(
        pretrained_name=spec.pretrained_name).resolved_path()
    config = model_config(folder)
    if config is None:
        raise UserError(f"{folder}: no config.json")
    try:
        return ModelShape.from_config(config, vocab)
    except KeyError as missing:
        raise UserError(f"{folder}/config.json has no {missing} (a Llama/Qwen2-style decoder's keys)") from None


def sharding_kind(accelerator) -> str:
    from training_wizard.sharding import engine_kind, zero_stage

    kind = engine_kind(accelerator)
    if kind == "deepspeed":
        stage = zero_stage(accelerator)
        return f"zero{stage}" if stage else "none"
    return kind or "none"


def weight_bytes(config, folder_config: dict) -> int:
    dtype = config.dtype
    if dtype == "auto":
        dtype = str(folder_config.get("dtype") or folder_config.get("torch_dtype") or "float32")
    return _WEIGHT_BYTES.get(dtype, 4)


def memory_facts(recipe, config, accelerator, tokenizer, train_rows) -> MemoryFacts:
    """The facts of the run `recipe` would start: its policy's shape, the batch keys, the launch."""
    from training_wizard.rollout.prompts import EncodedPrompts, longest_prompt

    shape = model_shape(recipe.model, len(tokenizer))
    weights = weight_bytes(config, model_config(recipe.model.resolved_path()) or {})
    autocast = getattr(accelerator, "mixed_precision", "no") in ("bf16", "fp16")
    sharding = sharding_kind(accelerator)
    plan = config.batch_plan(accelerator.num_processes, len(train_rows))
    lora = recipe.model.lora
    on_cuda = accelerator.device.type == "cuda"
    vllm_share = None
    if config.use_vllm:  # colocated: its share of the device; a server samples on devices of its own
        vllm_share = config.vllm_gpu_memory_utilization if config.vllm_mode == "colocate" else 0.0
    return MemoryFacts(
        policy=shape, weight_bytes=weights, activation_bytes=2 if autocast else weights,
        lora_rank=lora.r if lora else None,
        lora_targets=_lora_targets(lora),
        micro_batch_rows=plan.micro_batch_size,
        max_tokens_per_micro_batch=getattr(config, "max_tokens_per_micro_batch", None),
        padding_free=bool(getattr(config, "padding_free", None)),
        rollout_rows=min(config.local_rollout_forward_batch_size, plan.local_batch_size),
        prompt_length=longest_prompt(EncodedPrompts.from_rows(train_rows, tokenizer)),
        completion_length=config.response_length, gradient_checkpointing=config.gradient_checkpointing,
        eager_attention=recipe.model.attn_implementation == "eager", reference=_reference(recipe, config),
        value_model="value_model" in type(recipe).model_fields,
        reward_model=_reward_shape(recipe.reward), reward_weight_bytes=_WEIGHT_BYTES.get(
            getattr(recipe.reward, "dtype", "float32"), 4),
        processes=accelerator.num_processes, sharding=sharding,
        head_logprobs=sharding == "none" and not config.torch_compile, vllm_share=vllm_share,
        device_total=_cuda_total(accelerator) if on_cuda else None,
        runtime_bytes=CUDA_RUNTIME_BYTES if on_cuda else CPU_RUNTIME_BYTES,
        token_budget_key="max_tokens_per_micro_batch" in type(config).model_fields,
        fold_lora=folds_lora(config, sharding),
    )


def folds_lora(config, sharding: str) -> bool:
    """Whether the decode loop folds LoRA into copies of the adapted weights while it samples: unless switched off,
    and not where it samples with the sharded model itself (rollout/collector.py: rollout_model)."""
    samples_sharded = sharding == "fsdp" or (sharding == "zero3" and not config.ds3_gather_for_generation)
    return config.fold_lora_for_sampling and not samples_sharded


def _lora_targets(lora) -> str | tuple[str, ...]:
    if lora is None or isinstance(lora.target_modules, str):
        return "all-linear" if lora is None else lora.target_modules
    return tuple(lora.target_modules)


def _reference(recipe, config) -> str:
    if not config.uses_reference:
        return "none"
    if recipe.ref_model is None and recipe.model.lora is not None:
        return "adapter"
    return "copy"


def _reward_shape(reward) -> ModelShape | None:
    """A reward model's body with its one-output head (ModelRewardSpec); None for reward functions."""
    if reward is None or not isinstance(getattr(reward, "pretrained_name", None), str):
        return None
    try:
        return model_shape(reward).as_classifier()
    except UserError:
        return None


def _cuda_total(accelerator) -> int:
    import torch

    return torch.cuda.get_device_properties(accelerator.device).total_memory


def device_budget(accelerator) -> tuple[int, str]:
    """(bytes, what they are) of one process's device: CUDA total memory, or the machine's available memory
    over the processes launched on it."""
    if accelerator.device.type == "cuda":
        return _cuda_total(accelerator), f"{accelerator.device} total memory"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes))
    available = _available_memory()
    share = f" / {local} processes on this machine" if local > 1 else ""
    return available // local, f"available memory{share}"


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_table(plan: MemoryPlan, facts: MemoryFacts) -> Table:
    table = Table(title=f"memory plan per process (peak: held + the {plan.peak_phase} phase)")
    table.add_column("term")
    table.add_column("phase")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("to shrink it", overflow="fold")
    for term in sorted(plan.terms, key=lambda t: (t.phase != "held", t.phase, -t.bytes)):
        table.add_row(term.name, term.phase, format_bytes(term.bytes), term.knob or "")
    table.add_row("peak", "", format_bytes(plan.total), "")
    return table


def describe(facts: MemoryFacts) -> str:
    shape = facts.policy
    trained = "all weights" if facts.lora_rank is None else f"LoRA r {facts.lora_rank}"
    tokens = facts.update_tokens()
    return (f"model: {shape.parameters() / 1e6:.1f}M parameters ({shape.layers} layers, hidden {shape.hidden}, "
            f"{shape.heads} heads, {shape.kv_heads} kv heads, vocabulary {shape.vocab}), {facts.weight_bytes} bytes "
            f"per weight, {facts.activation_bytes} per activation, trains {trained}; prompt up to "
            f"{facts.prompt_length} + completion {facts.completion_length} tokens; update micro-batch "
            f"{facts.micro_batch_rows} rows ({tokens} tokens), rollout chunk {facts.rollout_rows} rows; sharding "
            f"{facts.sharding} over {facts.processes} process(es)")


def show_memory_plan(recipe, config, accelerator, tokenizer, train_rows, console: Console,
                     budget: int | None = None) -> None:
    """Print the plan and whether it fits `budget` (bytes; None: the device's), with the one key to change first
    when it does not. A model the plan cannot read is said in one line; the run is not stopped for it."""
    try:
        facts = memory_facts(recipe, config, accelerator, tokenizer, train_rows)
    except UserError as reason:
        console.print(f"memory plan: not made ({reason})", markup=False, highlight=False, soft_wrap=True)
        return
    plan = plan_memory(facts)
    console.print(plan_table(plan, facts))
    console.print(describe(facts), markup=False, highlight=False, soft_wrap=True)
    source = "--memory-budget"
    if budget is None:
        budget, source = device_budget(accelerator)
    answer = verdict(plan, budget)
    if answer.fits:
        line = f"memory: the plan's peak {format_bytes(plan.total)} fits {format_bytes(budget)} ({source})"
    else:
        change = f"; change first: {answer.knob}" if answer.knob else "; no key shrinks the largest terms"
        line = (f"memory: the plan's peak {format_bytes(plan.total)} does not fit {format_bytes(budget)} "
                f"({source}){change}")
    console.print(line, markup=False, highlight=False, soft_wrap=True)
