"""How a LoRA policy's weights reach vLLM (rollout/vllm_lora.py; docs/vllm.md, "LoRA: pushing the adapter")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from training_wizard.spec import KeyValueError
from training_wizard.trainers.config.run import RunConfig


class VLLMAdapterOptions(RunConfig):
    """Whether a LoRA policy is pushed to vLLM as its adapter alone or with the adapter merged into the weights."""

    vllm_lora_push: Literal["auto", "adapter", "merged"] = Field(
        "auto", description='How a LoRA policy reaches a colocated vLLM engine after each update. "adapter": the '
        "frozen base weights once, then only the adapter, which vLLM applies through its LoRA layers (a fresh "
        "adapter id per push); refused where it cannot be (server mode, sleep mode, modules_to_save, trained base "
        'weights, DoRA, several adapters, or vLLM refusing the target modules). "merged": every weight, each adapter '
        'folded into its base weight, every push. "auto": "adapter" on GPUs where the policy and engine allow it, '
        '"merged" elsewhere and on CPU (vLLM\'s CPU build samples from an adapter several times slower). Without LoRA '
        "the whole weights are pushed whatever this says.")

    @model_validator(mode="after")
    def _adapter_push_possible(self) -> VLLMAdapterOptions:
        if self.vllm_lora_push != "adapter" or not getattr(self, "use_vllm", False):
            return self
        if getattr(self, "vllm_mode", "colocate") == "server":
            raise KeyValueError("vllm_lora_push", '"adapter" needs vllm_mode = "colocate": the server takes merged '
                                'weights only; use "auto" or "merged"')
        if getattr(self, "vllm_enable_sleep_mode", False):
            raise KeyValueError("vllm_lora_push", '"adapter" does not work with vllm_enable_sleep_mode = true (sleep '
                                'drops the base weights, which are pushed once); use "auto" or "merged"')
        return self
