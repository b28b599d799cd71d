"""Combinations of on-policy settings (trainers/config/on_policy.py) that are refused while a config validates, or said once
at the start as likely not what was meant. Each reads only the config it is given."""

from __future__ import annotations

from typing import Any


def check_sampling_settings(config: Any) -> None:
    """A ValueError (the config is being validated) for sampling settings that contradict each other."""
    masks = getattr(config, "mask_truncated_completions", False)  # RLOO's and GRPO's option
    # Without a stop token no completion is known to have ended, so every one would be masked: no loss at all.
    if masks and config.stop_token is None and config.stop_token_id is None and not config.stop_token_ids:
        raise ValueError("mask_truncated_completions needs a stop token (stop_token = \"eos\" or stop_token_id): "
                         "without one every completion counts as truncated and nothing is trained")
    if config.use_vllm and config.logprobs_from_sampling is True:
        raise ValueError("use_vllm: the rollout's logprobs must come from the training forward pass under vLLM; "
                         "set logprobs_from_sampling = \"auto\" or false")
    if config.logprobs_from_sampling is True and config.sampling_filters().active:
        raise ValueError("logprobs_from_sampling takes the logprobs of the truncated sampling distribution "
                         "(top_k, top_p, min_p, repetition_penalty), not the policy's; set it to false")


def start_warnings(config: Any) -> list[str]:
    """Settings that are allowed but are likely not what was meant."""
    high = getattr(config, "epsilon_high", None)  # RLOO's and GRPO's option
    if high is not None and high < config.cliprange:
        return [f"training.epsilon_high ({high:g}) is below the lower clip range (epsilon / cliprange = "
                f"{config.cliprange:g}): a positive advantage is clipped sooner than a negative one; DAPO's "
                "clip-higher sets it above (0.28 with 0.2)"]
    return []
