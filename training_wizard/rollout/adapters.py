"""LoRA adapters folded into their base weights while the sampling loop runs.

A LoRA linear layer computes base(x) + B(A(x)) * scaling: three matrix products and three element-wise passes
where the base layer alone needs one product, and in the token-by-token decode each of them is small, so that
overhead counts (`bench/decode.py` measures the decode loop with folding). Sampling does not need the gradient,
so each such layer can instead run one product with W + B A * scaling, computed once per rollout. Nothing is
changed in place: the folded weights are new tensors, dropped when the context ends, and the trained adapter and
base weights are never touched (an in-place merge and unmerge would leave rounding drift in the base weights). The folded product differs from the unfolded one by float rounding only (about 1e-6 in the
logprobs in float32).
"""

from __future__ import annotations

import contextlib
import functools

import torch


def foldable_lora_layers(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The model's peft LoRA linear layers when every adapter layer of the model can be folded, else None.

    Foldable: a plain `torch.nn.Linear` base, adapters enabled and not merged, and every active adapter plain LoRA
    (no DoRA or other variant, no LoRA bias). Any other adapter layer (embeddings, convolutions, quantised bases)
    means no folding at all, which keeps one rule for the whole model.
    """
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # peft is optional for models without adapters
        return None
    layers = []
    for module in model.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if type(module) is not LoraLinear or module.disable_adapters or module.merged:
            return None
        if type(module.base_layer) is not torch.nn.Linear:
            return None
        for adapter in module.active_adapters:
            if adapter in module.lora_A and (adapter in module.lora_variant or module.lora_bias.get(adapter, False)):
                return None
        layers.append(module)
    return layers or None


@contextlib.contextmanager
def adapters_folded(model: torch.nn.Module):
    """Within the context, each LoRA linear layer of `model` runs one product with its folded weight (see the
    module docstring). Yields whether it folded; models without foldable adapters run unchanged."""
    layers = foldable_lora_layers(model)
    if layers is None:
        yield False
        return
    with torch.no_grad():
        for layer in layers:
            base = layer.base_layer
            weight = base.weight
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
            layer.forward = functools.partial(_folded_linear, weight, base.bias)  # shadows the class's forward
    try:
        yield True
    finally:
        for layer in layers:
            del layer.forward


def _folded_linear(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return torch.nn.functional.linear(x.to(weight.dtype), weight, bias)
