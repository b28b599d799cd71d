"""Pushing only a LoRA policy's adapter to a colocated vLLM engine (`vllm_lora_push`), as TRL's async trainer,
prime-rl and Unsloth do.

The merged push (rollout/vllm.py: `checkpoint_weights`) sends every weight of the model, each adapted one with
`scaling * B A` folded in, after every update. With LoRA only the adapter trains, so the engine can instead take
the frozen base weights once and, after each update, just the adapter: a few MiB at rank 16 instead of the whole
model. vLLM applies it through its LoRA layers (`enable_lora`), given a `LoRARequest` with each generate call.

vLLM caches a loaded adapter by its integer id and reuses it for a request of the same id, so each push writes
the adapter to a fresh folder under a new id, loads it at once (`add_lora`: vLLM's own checks, e.g. target modules
its LoRA layers do not wrap, fail at the push rather than mid-sample) and drops the previous one.

Which policies qualify (`adapter_push_refusal`): a peft model with one plain LoRA adapter on linear layers (what
`rollout/adapters.py` can fold), nothing trained but that adapter (no `modules_to_save`, no unfrozen base
weights), a rank vLLM takes, a colocated engine without sleep mode (sleep level 2 drops the base weights that are
pushed only once). Server mode keeps the merged push: its HTTP protocol carries checkpoint tensors only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from typing import Any, Callable, Iterable, Literal

import torch

from training_wizard.errors import UserError

LoraPush = Literal["auto", "adapter", "merged"]

# The values vLLM's LoRAConfig takes for max_lora_rank (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def single_lora_config(model: torch.nn.Module):
    """The peft config of the model's one adapter, or None (no peft model, or several adapters)."""
    configs = getattr(model, "peft_config", None)
    if not configs or len(configs) != 1:
        return None
    return next(iter(configs.values()))


def adapter_rank(config) -> int:
    """The largest rank of any layer of the adapter (`rank_pattern` may raise some above `r`)."""
    return max([int(config.r), *(int(rank) for rank in (getattr(config, "rank_pattern", None) or {}).values())])


def engine_lora_rank(rank: int) -> int | None:
    """The smallest max_lora_rank vLLM accepts that holds `rank`; None above vLLM's largest."""
    return next((allowed for allowed in VLLM_LORA_RANKS if allowed >= rank), None)


def adapter_push_refusal(model: torch.nn.Module, *, server: bool, sleep_mode: bool) -> str | None:
    """Why the policy's adapter alone cannot be pushed to vLLM (one clause), or None when it can."""
    from training_wizard.rollout.adapters import foldable_lora_layers

    config = single_lora_config(model)
    if config is None:
        return "the policy is not a peft model with exactly one adapter"
    if getattr(getattr(config, "peft_type", None), "value", None) != "LORA" or foldable_lora_layers(model) is None:
        return "only a plain LoRA adapter on linear layers can be pushed alone (no DoRA, LoRA bias or other layers)"
    if getattr(config, "modules_to_save", None):
        return f"modules_to_save ({', '.join(sorted(config.modules_to_save))}) train outside the adapter"
    unfrozen = [name for name, parameter in model.named_parameters() if parameter.requires_grad and ".lora_" not in name]
    if unfrozen:
        return f"{len(unfrozen)} base weights train (e.g. {unfrozen[0]}), so the base changes too"
    if engine_lora_rank(adapter_rank(config)) is None:
        return f"rank {adapter_rank(config)} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})"
    if server:
        return "vllm_mode = \"server\" receives checkpoint weights only"
    if sleep_mode:
        return "sleep mode drops the base weights, which an adapter push sends only once"
    return None


def adapter_push(model: torch.nn.Module, mode: LoraPush, *, server: bool, sleep_mode: bool,
                 cpu: bool = False) -> AdapterPush | None:
    """The adapter push for `mode`: "merged" never, "auto" where the policy qualifies on a GPU, "adapter" where it
    qualifies and one line saying why not elsewhere (a policy without adapters has nothing to push but its weights).

    "auto" merges on vLLM's CPU build: it applies LoRA through plain torch kernels, and sampling from an adapter
    there took about 4 times as long as from merged weights (BENCHMARKS.md), more than the push saves."""
    if mode == "merged" or mode == "auto" and (cpu or single_lora_config(model) is None):
        return None
    refusal = adapter_push_refusal(model, server=server, sleep_mode=sleep_mode)
    if refusal is None:
        return AdapterPush(model, strict=mode == "adapter")
    if mode == "adapter":
        raise UserError(f"training.vllm_lora_push: \"adapter\" cannot push this policy's adapter alone: {refusal}; "
                        "use \"auto\" or \"merged\"")
    return None


def adapter_tensors(model: torch.nn.Module, whole) -> Iterable[tuple[str, torch.Tensor]]:
    """The adapter's A and B matrices under the names peft saves them with (`base_model.model.<layer>.lora_A.weight`),
    each whole (`whole` gathers sharded ones: every process must call this alike)."""
    from training_wizard.rollout.adapters import foldable_lora_layers

    hf_model = model.get_base_model()
    names = {id(module): name for name, module in hf_model.named_modules()}
    for layer in foldable_lora_layers(model) or []:
        for adapter in layer.active_adapters:
            for kind, modules in (("lora_A", layer.lora_A), ("lora_B", layer.lora_B)):
                if adapter not in modules:
                    continue
                for _, tensor in whole(modules[adapter]):
                    yield f"base_model.model.{names[id(layer)]}.{kind}.weight", tensor


def write_adapter(model: torch.nn.Module, folder: str, whole) -> None:
    """The policy's adapter as a peft adapter folder (adapter_config.json, adapter_model.safetensors): what vLLM
    loads for a LoRARequest."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    with torch.no_grad():
        tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in adapter_tensors(model, whole)}
    save_file(tensors, os.path.join(folder, ADAPTER_WEIGHTS))
    config = single_lora_config(model).to_dict()
    with open(os.path.join(folder, ADAPTER_CONFIG), "w") as out:
        json.dump(config, out, indent=1, default=_jsonable)


def _jsonable(value: Any):
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "value"):  # enums (peft_type, task_type)
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class AdapterPush:
    """The adapter side of a colocated engine: the engine options LoRA needs, the base weights sent once, and per
    push a fresh adapter folder and id (`request` is what each generate call passes)."""

    def __init__(self, model: torch.nn.Module, strict: bool):
        self.rank = engine_lora_rank(adapter_rank(single_lora_config(model)))
        self.strict = strict  # "adapter": vLLM refusing the adapter ends the run; "auto": merged pushes from then on
        self.pushes = 0
        self.request = None
        self.base_pushed = False
        self._folder = tempfile.mkdtemp(prefix="training-wizard-vllm-lora-")
        weakref.finalize(self, shutil.rmtree, self._folder, True)  # the folders go with the engine, or at exit

    def engine_arguments(self) -> dict[str, Any]:
        return {"enable_lora": True, "max_lora_rank": self.rank, "max_loras": 1}

    def push(self, engine, model: torch.nn.Module, whole, push_base: Callable[[], None]) -> bool:
        """Send the adapter (and, the first time, the base weights: `push_base`) to `engine`; False when vLLM
        refused the adapter under "auto" (the caller pushes merged weights instead, from then on)."""
        from vllm.lora.request import LoRARequest

        if not self.base_pushed:  # frozen (adapter_push_refusal): once is enough
            push_base()
            self.base_pushed = True
        self.pushes += 1
        folder = os.path.join(self._folder, f"push-{self.pushes}")
        write_adapter(model, folder, whole)
        # a new id every push: vLLM would otherwise answer the request with the adapter it cached under the old id
        request = LoRARequest(f"policy-{self.pushes}", self.pushes, folder)
        try:
            engine.llm_engine.add_lora(request)
        except (ValueError, RuntimeError) as exc:
            if self.strict:
                raise UserError(f"training.vllm_lora_push: vLLM refused the policy's adapter ({exc}); use \"auto\" "
                                "or \"merged\"") from None
            print(f"warning: vLLM refused the policy's adapter ({exc}); pushing merged weights instead", flush=True)
            self.close()
            return False
        self._drop(engine)
        self.request = request
        return True

    def _drop(self, engine) -> None:
        """Unload the previous adapter from the engine and remove its folder."""
        if self.request is None:
            return
        engine.llm_engine.remove_lora(self.request.lora_int_id)
        shutil.rmtree(self.request.lora_path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)
        self.request = None
