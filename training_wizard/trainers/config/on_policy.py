"""Training configs (RLOOConfig, PPOConfig, GRPOConfig); their batch sizes are derived in one place,
trainers/config/batch_plan.py, which holds the batch glossary.

Names and defaults follow TRL's RLOO trainer docs (PPOv2 era); the newer TRL names are accepted as
aliases (`num_generations` for `rloo_k`, `beta` for `kl_coef`, ...). See docs/configuration.md.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import (Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, field_validator,
                      model_validator)

from training_wizard.specs.episode import EnvironmentTimeout, EpisodeSettings, MaxToolCallingIterations, MaxTurns
from training_wizard.trainers.config.async_keys import AsyncRolloutOptions
from training_wizard.trainers.config.environment_keys import EnvironmentFailureOptions
from training_wizard.trainers.config.hub import HubArguments
from training_wizard.trainers.config.micro_batch_keys import TokenBudgetOptions
from training_wizard.trainers.config.presentation import PresentationOptions
from training_wizard.trainers.config.sampling_keys import LoraSamplingOptions
from training_wizard.trainers.config.teacher_keys import TeacherOptions
from training_wizard.trainers.config.turn_keys import TurnCreditOptions
from training_wizard.trainers.config.vllm_keys import VLLMAdapterOptions
from training_wizard.trainers.config.batch_plan import (
    BatchPlan, derive_batch_plan, mini_batches_from_generation_batch_size, mini_batches_from_steps_per_generation,
)
from training_wizard.trainers.config.checks import check_sampling_settings, start_warnings
from training_wizard.trainers.config.run import (DEFAULT_SEED, OUTPUT_DIR_DESCRIPTION, SEED_DESCRIPTION,
                                                 SEED_RANGE, RunConfig, aliases)


class OnPolicyConfig(HubArguments, AsyncRolloutOptions, EnvironmentFailureOptions, PresentationOptions,
                     TurnCreditOptions, TokenBudgetOptions, VLLMAdapterOptions, TeacherOptions,
                     LoraSamplingOptions):
    """Options shared by the on-policy trainers (RLOO, PPO, GRPO); TRL 1.x's other keys: trl/configs.py."""

    # -- batch sizes (the glossary: trainers/config/batch_plan.py) -----------------------------------------------------
    per_device_train_batch_size: PositiveInt = Field(8, description="Completions per forward/backward pass.")
    num_mini_batches: PositiveInt = Field(
        1, description="Optimizer steps per PPO epoch over one rollout batch. steps_per_generation or "
        "generation_batch_size (TRL 1.x's names) set it when given."
    )
    steps_per_generation: PositiveInt | None = Field(
        None,
        description="TRL 1.x's count of forward/backward passes per generation (rollout): a multiple of "
        "gradient_accumulation_steps, setting num_mini_batches = steps_per_generation / gradient_accumulation_steps. "
        "Default: gradient_accumulation_steps (one optimizer step per rollout). RLOO and PPO once read this name as "
        "num_mini_batches itself; the two meanings agree when gradient_accumulation_steps is 1.",
    )
    generation_batch_size: PositiveInt | None = Field(
        None,
        description="Completions per generation over all processes (TRL 1.x): per_device_train_batch_size x "
        "processes x steps_per_generation; resolved into num_mini_batches (which it overrides) once the number of "
        "processes is known. Set it or steps_per_generation, not both.",
    )
    num_ppo_epochs: PositiveInt = Field(
        4,
        description="Passes over each rollout batch. 1 (with one mini-batch) makes the update plain REINFORCE.",
        validation_alias=aliases("num_ppo_epochs", "num_iterations"),
    )
    total_episodes: PositiveInt | None = Field(
        None, description="Completions to train on in total, rounded up to whole iterations (batch_size each). "
        "Default: num_train_epochs x dataset rows x completions per prompt."
    )
    num_train_epochs: PositiveFloat = Field(1.0, description="Passes over the prompts (without total_episodes).")
    max_steps: PositiveInt | None = Field(None, description="Optimizer steps in all (TRL's max_steps): the run ends "
                                          "at the iteration that reaches them; set it or total_episodes, not both.")
    local_rollout_forward_batch_size: PositiveInt = Field(
        64, description="Rows per sampling chunk and per no-grad forward pass (logprobs of policy and reference, "
        "reward model)."
    )
    # -- optimisation --------------------------------------------------------------------------------------------
    learning_rate: PositiveFloat = Field(3e-6, description="Peak AdamW learning rate.")
    gradient_checkpointing: bool = Field(
        False, description="Trade compute for memory in the update. Slows generation; keep off when memory allows."
    )
    # -- sampling ------------------------------------------------------------------------------------------------
    response_length: PositiveInt = Field(
        53,
        description="Maximum new tokens per completion. Newer TRL name: max_completion_length.",
        validation_alias=aliases("response_length", "max_completion_length"),
    )
    temperature: PositiveFloat = Field(0.7, description="Sampling temperature; logprobs use the same temperature.")
    top_k: int = Field(0, ge=0, description="Sample from the k most likely tokens only; 0 keeps them all.")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Nucleus sampling: from the fewest most likely tokens whose probability "
        "reaches top_p; 1.0 keeps them all."
    )
    min_p: float | None = Field(
        None, ge=0.0, le=1.0, description="Drop tokens less likely than min_p times the most likely one; null: off."
    )
    repetition_penalty: PositiveFloat = Field(
        1.0, description="Divide the positive logits (multiply the negative ones) of tokens already in the prompt "
        "or completion by this while sampling (the CTRL paper); 1.0: off. The filters shape only the sampling: "
        "the losses and the KL use the policy's own distribution at the temperature, as TRL does."
    )
    stop_token: Literal["eos"] | None = Field(
        "eos", description='"eos": truncate each completion after its first stop token and mask what follows; the '
        "stop tokens are the tokenizer's EOS and every id of the model's generation_config.eos_token_id (as TRL: "
        "chat models list several, e.g. Llama-3's <|eot_id|> and <|end_of_text|>).",
    )
    stop_token_id: int | None = Field(
        None, ge=0, description="Truncate after this token id instead (takes precedence over stop_token)."
    )
    stop_token_ids: list[NonNegativeInt] | None = Field(
        None, description="Truncate after the first of any of these token ids instead (takes precedence over "
        "stop_token_id and stop_token).",
    )
    missing_eos_penalty: float | None = Field(
        None, description="Subtracted from the score of completions that end without the stop token (EOS trick)."
    )
    reward_timeout: PositiveFloat = Field(
        600.0, description="Seconds a reward (a reward function, a remote reward, any reward spec) may take to score "
        "one batch; past it the run stops with one line naming it and the step, the last checkpoint kept. A stop "
        "signal while it runs ends the run within a second (exit 143/130, checkpoint of the iteration's start).",
    )
    # the episode's limits (specs/episode.py), under TRL's names
    max_turns: MaxTurns = EpisodeSettings.max_turns
    max_tool_calling_iterations: MaxToolCallingIterations = EpisodeSettings.max_tool_calling_iterations
    environment_timeout: EnvironmentTimeout = EpisodeSettings.environment_timeout
    # -- regularisation ------------------------------------------------------------------------------------------
    kl_coef: NonNegativeFloat = Field(
        0.05, description="KL penalty coefficient. Newer TRL name: beta.", validation_alias=aliases("kl_coef", "beta")
    )
    kl_estimator: Literal["k1", "k3"] = Field(
        "k1", description="Per-token KL estimator: k1 = log p - log q; k3 = (r - 1) - log r, r = q / p."
    )
    cliprange: PositiveFloat = Field(
        0.2, description="PPO ratio clipping range. Newer TRL name: epsilon.", validation_alias=aliases("cliprange", "epsilon")
    )
    whiten_rewards: bool = Field(
        False,
        description="RLOO: multiply the rewards by 1 / their standard deviation over the batch (the mean is scaled "
        "too). PPO: whiten the per-token rewards over the batch's real tokens (std 1, mean kept).",
    )
    # -- logging, evaluation, saving ----------------------------------------------------------------------------
    num_sample_generations: int = Field(
        10, ge=0, description="How many times per run to print and save a sample table (0 disables)."
    )
    ds3_gather_for_generation: bool = Field(
        True, description="Under DeepSpeed ZeRO-3, gather full weights for generation (faster, more memory)."
    )
    torch_compile: bool = Field(
        False,
        description="Compile the update's forward passes (policy, and PPO's value model) with torch.compile, "
        "dynamic shapes. The first update pays the compilation (about a minute for a 25M model on a 2-core CPU); "
        "generation and the no-grad logprob passes stay eager. One process or plain data parallel only.",
    )
    logprobs_from_sampling: bool | Literal["auto"] = Field(
        "auto",
        description="Take the policy's rollout logprobs (KL penalty, the ratio's old side) from the logits that "
        "sampled each token instead of a second forward pass over the completions: one forward pass less per "
        "iteration. \"auto\": on where the two are the same computation up to float32 rounding (float32 weights, "
        "no mixed-precision autocast, the built-in decode loop, no DeepSpeed or FSDP), off otherwise; in bf16/fp16 a cached decode and a "
        "full forward pass differ more, which is why the N+ implementation details recompute them. "
        "true/false force it.",
    )

    # -- generation with vLLM (TRL's names and defaults; docs/vllm.md) ----------------------------------------
    use_vllm: bool = Field(
        False, description="Sample completions with vLLM instead of the built-in decode loop (pip install -e .[vllm]). "
        "The rollout's logprobs still come from the training forward pass; vLLM's are the sampling logprobs."
    )
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description='"colocate": one vLLM engine inside each training process, weights pushed in memory '
        'after every update. "server": a separate `training-wizard vllm-serve` process, weights pushed over HTTP.'
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0.0, le=1.0, description="Colocate: share of the GPU's memory vLLM may take (weights, activations "
        "and KV cache); the rest is the trainer's. Ignored on CPU (the KV cache is VLLM_CPU_KVCACHE_SPACE GiB)."
    )
    vllm_max_model_length: PositiveInt | None = Field(
        None, description="Colocate: the engine's context length. Default: the longest training prompt plus "
        "response_length."
    )
    vllm_tensor_parallel_size: PositiveInt = Field(1, description="Colocate: GPUs one engine spreads a model over.")
    vllm_enable_sleep_mode: bool = Field(
        False, description="Colocate on GPU: release vLLM's weights and KV cache while the trainer updates, so both "
        "fit; not available on CPU."
    )
    vllm_server_base_url: str | None = Field(
        None, description="Server: the server's URL, e.g. http://10.0.0.5:8000; overrides host and port."
    )
    vllm_server_host: str = Field("0.0.0.0", description="Server: host of the vLLM server (when no base URL).")
    vllm_server_port: int = Field(8000, ge=1, le=65535, description="Server: port of the vLLM server.")
    vllm_server_timeout: PositiveFloat = Field(
        240.0, description="Server: seconds to wait for the server to answer at start-up, and for each request."
    )
    vllm_importance_sampling_correction: bool = Field(
        True, description="Re-weight the policy loss by exp(training logprob - sampling logprob), bounded, to "
        "correct for vLLM sampling from a slightly different distribution than the training forward pass."
    )
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        "sequence_mask", description="token_* weight each token, sequence_* each completion (exp of the summed "
        "log-ratio); *_truncate clamps the weight to the bounds, *_mask zeroes weights outside them."
    )
    vllm_importance_sampling_clip_max: PositiveFloat | None = Field(
        3.0, description="Upper bound of the correction weight. Older TRL name: vllm_importance_sampling_cap.",
        validation_alias=aliases("vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap"),
    )
    vllm_importance_sampling_clip_min: NonNegativeFloat | None = Field(
        None, description="Lower bound of the correction weight (none by default)."
    )

    @model_validator(mode="after")
    def _steps_per_generation(self) -> OnPolicyConfig:
        """TRL's steps_per_generation counts micro-batches; ours counts optimizer steps (num_mini_batches)."""
        if self.steps_per_generation is not None:
            derived = mini_batches_from_steps_per_generation(self)
            object.__setattr__(self, "num_mini_batches", derived)  # not an assignment: no second validation
        return self

    def for_processes(self, world_size: int):
        """This config with generation_batch_size resolved into num_mini_batches for `world_size` processes (the
        trainers resolve it before anything reads num_mini_batches)."""
        if self.generation_batch_size is None:
            return self
        return self.model_copy(update={"num_mini_batches": mini_batches_from_generation_batch_size(self, world_size),
                                       "generation_batch_size": None})

    @model_validator(mode="after")
    def _sampling_settings_agree(self) -> OnPolicyConfig:
        check_sampling_settings(self)
        return self

    def start_warnings(self) -> list[str]:
        """Settings that are allowed but are likely not what was meant: said once at the start (and by --dry-run)."""
        return start_warnings(self)

    def sampling_filters(self):
        from training_wizard.rollout.sampling import SamplingFilters

        return SamplingFilters(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                               repetition_penalty=self.repetition_penalty)

    @property
    def single_update_pass(self) -> bool:
        """One epoch of one mini-batch: the update sees each rollout once, with the weights that sampled it, so
        the ratio's old side is the update's own logprobs, detached (ratio exactly 1, as TRL does)."""
        return self.num_ppo_epochs == 1 and self.num_mini_batches == 1

    def batch_plan(self, world_size: int = 1, dataset_rows: int | None = None) -> BatchPlan:
        """Derive every batch size once, checking divisibility with an error that names both numbers."""
        if self.generation_batch_size is not None:
            return self.for_processes(world_size).batch_plan(world_size, dataset_rows)
        return derive_batch_plan(self, world_size, dataset_rows)

    group_key: ClassVar[str] = "rloo_k"  # the key that sets group_size(), for error messages

    def group_size(self) -> int:
        """Completions sampled per prompt (rloo_k for RLOO, num_generations for GRPO, 1 for PPO)."""
        return 1

    @property
    def uses_reference(self) -> bool:
        """Whether the run needs a reference model and its logprob pass (GRPO: only when beta > 0)."""
        return True


class RLOOConfig(OnPolicyConfig):
    """RLOO options (TRL's RLOO trainer docs). Defaults are TRL's; the RLOO recipe uses training-wizard 1.0's (see RLOORecipeConfig)."""

    rloo_k: int = Field(
        2,
        ge=2,
        description="Completions per prompt; each one's baseline is the mean reward of the other k-1. "
        "Newer TRL name: num_generations.",
        validation_alias=aliases("rloo_k", "num_generations"),
    )
    normalize_reward: bool = Field(
        False, description="Standardise scores over the batch, then clamp them to +-reward_clip_range (Reinforce++)."
    )
    reward_clip_range: PositiveFloat | tuple[float, float] = Field(
        10.0,
        description="One number c: with normalize_reward, clamp the standardised scores to [-c, c] (without it c "
        "does nothing). A pair [min, max] (TRL 1.x's RLOO): clamp the raw scores, after missing_eos_penalty and "
        "before the KL penalty is subtracted, whether or not normalize_reward is on (then the clamped scores are "
        "standardised and not clamped again).",
    )
    normalize_advantage: bool = Field(
        False,
        description="Whiten the advantages over the whole batch (every process): (A - mean) / sqrt(var + 1e-8), "
        "unbiased variance. TRL 1.x name: normalize_advantages (TRL divides by std + 1e-4: the same up to that "
        "epsilon).",
        validation_alias=aliases("normalize_advantage", "normalize_advantages"),
    )
    epsilon_high: PositiveFloat | None = Field(
        None,
        description="Upper clip of the ratio (DAPO's clip-higher, TRL 1.x's RLOO): a ratio is clipped to "
        "[1 - cliprange, 1 + epsilon_high], so a positive advantage can raise a completion's probability further "
        "than a negative one can lower it. The ratio is the sequence's (per token with token_level_kl). Default: "
        "cliprange.",
    )
    mask_truncated_completions: bool = Field(
        False,
        description="Completions without the stop token (cut at response_length) carry no loss and no gradient "
        "(DAPO; TRL 1.x's RLOO). They still count in their siblings' leave-one-out baselines with their full "
        "reward (TRL also leaves their KL out of that reward, since it masks their tokens everywhere), and the loss "
        "is still the mean over all completions.",
    )
    token_level_kl: bool = Field(
        False,
        description="Per-token KL penalty (Reinforce++ eq. 1) with a per-token ratio, instead of one sequence-level"
        " KL term and a sequence-level ratio.",
    )

    @field_validator("reward_clip_range")
    @classmethod
    def _ordered_pair(cls, value):
        if isinstance(value, tuple) and not value[0] < value[1]:
            raise ValueError(f"expected [min, max] with min < max, got {list(value)}")
        return value

    def group_size(self) -> int:
        return self.rloo_k


class RLOORecipeConfig(RLOOConfig):
    """The RLOO recipe's [training] table: the defaults of training-wizard 1.0's RLOO example README where they differ from TRL's."""

    temperature: PositiveFloat = Field(0.5, description="Sampling temperature (training-wizard 1.0's RLOO README: lower it if samples are poor).")
    learning_rate: PositiveFloat = Field(1e-6, description="Peak AdamW learning rate (training-wizard 1.0's RLOO README: keep it near 1e-6).")


class PPOConfig(OnPolicyConfig):
    """PPO options (TRL's PPOv2 docs; "The N+ Implementation Details of RLHF with PPO"). Defaults are TRL's.

    One completion per prompt; per-token KL rewards with the score at the last real token; GAE advantages from a
    value model, whitened over the batch; a clipped value loss weighted by vf_coef.
    """

    supported_turn_credit: ClassVar[tuple[str, ...]] = ("episode", "gae")
    cliprange_value: PositiveFloat = Field(0.2, description="Clip range of the value update around the old values.")
    vf_coef: NonNegativeFloat = Field(0.1, description="Weight of the value loss in the total loss.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount factor of GAE.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="Lambda of GAE (bias-variance trade-off of advantages).")
    non_eos_penalty: bool = Field(
        False,
        description="The older spelling of the EOS trick: replace the score of a completion without the stop token "
        "by penalty_reward_value (missing_eos_penalty subtracts instead).",
    )
    penalty_reward_value: float = Field(-1.0, description="The score given by non_eos_penalty.")

    @model_validator(mode="after")
    def _one_eos_trick(self) -> PPOConfig:
        if self.non_eos_penalty and self.missing_eos_penalty is not None:
            raise ValueError("set either non_eos_penalty (replace the score) or missing_eos_penalty (subtract from "
                             "it), not both")
        return self


class GRPOConfig(OnPolicyConfig):
    """GRPO options, with TRL 1.x's GRPOConfig names and defaults (TRL's GRPO trainer docs; DeepSeekMath, DAPO,
    Dr. GRPO, GSPO and CISPO for the loss variants; docs/algorithms.md gives the formulas).

    num_generations completions per prompt; advantages are each reward minus its group's mean, scaled by
    scale_rewards; the loss is PPO's clipped ratio per token, aggregated by loss_type; the KL to a reference is a
    loss term weighted by beta (0 by default: no reference model at all).
    """

    num_generations: int = Field(
        8, ge=2, description="Completions sampled per prompt: one group, whose mean reward is each one's baseline."
    )
    num_ppo_epochs: PositiveInt = Field(
        1,
        description="Passes over each rollout batch (TRL name: num_iterations). With one mini-batch and 1 pass the "
        "ratio is exactly 1 and the old logprobs are the update's own, detached.",
        validation_alias=aliases("num_ppo_epochs", "num_iterations"),
    )
    learning_rate: PositiveFloat = Field(1e-6, description="Peak AdamW learning rate.")
    response_length: PositiveInt = Field(
        512,
        description="Maximum new tokens per completion (TRL name: max_completion_length); dr_grpo divides by it.",
        validation_alias=aliases("response_length", "max_completion_length"),
    )
    temperature: PositiveFloat = Field(1.0, description="Sampling temperature; logprobs use the same temperature.")
    kl_coef: NonNegativeFloat = Field(
        0.0,
        description="beta: weight of the per-token k3 KL to the reference, added to the loss (DeepSeekMath). 0: no "
        "reference model is loaded and no reference pass is made ([ref_model] is then not loaded either).",
        validation_alias=aliases("kl_coef", "beta"),
    )
    kl_estimator: Literal["k3"] = Field(
        "k3", description="The KL estimator of the loss term and of objective/kl: k3 = (r - 1) - log r, r = q / p."
    )
    epsilon_high: PositiveFloat | None = Field(
        None,
        description="Upper clip: the ratio of a positive advantage is clipped at 1 + epsilon_high (DAPO's "
        "clip-higher, which suggests 0.28); cispo caps its weight at epsilon_high itself. Default: epsilon.",
    )
    delta: float | None = Field(
        None, gt=1.0, description="Cap the unclipped ratio at delta (INTELLECT-2's two-sided clipping; above "
        "1 + epsilon), so a negative advantage cannot push an unbounded ratio. Not used by cispo.",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description='"token": one ratio per token; "sequence": each token carries its sequence\'s ratio, exp of the '
        "mean per-token log-ratio (GSPO, which uses epsilon around 3e-4 to 4e-4).",
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo"] = Field(
        "dapo",
        description="Loss aggregation: grpo = mean of per-sequence token means; bnpo = token mean over this "
        "process's mini-batch; dr_grpo = token sum / (sequences x response_length); dapo = token mean over the "
        "whole optimizer step on every process; cispo = dapo's aggregation of the capped-weight REINFORCE loss.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description='Divide advantages by the group\'s reward std ("group"), the batch\'s ("batch"), or not '
        '("none", Dr. GRPO). true/false are read as "group"/"none" (older TRL).',
    )
    mask_truncated_completions: bool = Field(
        False, description="Completions without the stop token (cut at response_length) carry no loss (DAPO)."
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling without the refill: groups whose rewards are all equal (zero "
        "advantage) are left out of the loss and of the token counts it divides by. The batch is not topped up "
        "with new groups, so an iteration trains on fewer completions; frac_reward_zero_std says how many fewer.",
    )
    top_entropy_quantile: float = Field(
        1.0, gt=0.0, le=1.0,
        description="Train only on the tokens whose entropy is in this top share of the micro-batch's tokens on "
        "every process (0.2: the 20% highest; \"Beyond the 80/20 Rule\"). 1.0 keeps every token.",
    )

    @model_validator(mode="before")
    @classmethod
    def _older_scale_rewards(cls, data):
        if isinstance(data, dict) and isinstance(data.get("scale_rewards"), bool):
            data = {**data, "scale_rewards": "group" if data["scale_rewards"] else "none"}
        return data

    @model_validator(mode="after")
    def _grpo_options(self) -> GRPOConfig:
        if self.whiten_rewards:
            raise ValueError("whiten_rewards is an RLOO/PPO option; GRPO scales rewards with scale_rewards")
        return self

    group_key: ClassVar[str] = "num_generations"

    def group_size(self) -> int:
        return self.num_generations

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0.0

