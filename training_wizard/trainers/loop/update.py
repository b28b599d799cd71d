"""Step 7 of an iteration: the update loop shared by RLOO, PPO and GRPO (`UpdateLoop._update`).

num_ppo_epochs passes over the rollout, each in num_mini_batches optimizer steps of gradient_accumulation_steps
micro-batches. For each micro-batch this loop runs the policy's forward pass (`PolicyForward`), asks the algorithm
for the loss (`micro_batch_loss`, given everything it reads), runs the backward, checks that logits, loss and
gradient are finite (guards.py, agreed across processes), clips, steps or skips, and averages the micro-batches'
statistics over processes. Every statistic of the loop reads the loss mask.
"""

from __future__ import annotations

import types
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from training_wizard import guards
from training_wizard.core.advantages import ShapedRewards
from training_wizard.core.importance_sampling import ImportanceWeights
from training_wizard.core.logprobs import TokenLogprobs
from training_wizard.core.masking import masked_mean
from training_wizard.core.importance_sampling import sampling_correction_weights
from training_wizard.memory import release_free_host_memory
from training_wizard.rollout.iteration_source import OffPolicyRule
from training_wizard.rollout.scoring import response_token_logprobs
from training_wizard.sharding import engine_kind, unwrap_model
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.signals import fault_point
from training_wizard.trainers.loop.iteration_metrics import sampling_metrics
from training_wizard.trainers.loop.token_budget import MicroBatchShare, TokenBudgetSteps


@dataclass
class MicroBatchLoss:
    """What one micro-batch's forward pass gives the update loop (subclass hook `micro_batch_loss`).

    loss: scalar to back-propagate; entropy: (b, T) detached policy entropy (for its metric, and the guard: it
    is non-finite where a logit is, see `logprobs_and_entropy`); ratio: (b,) or (b, T) policy ratios (summarised
    as val/ratio); stats: scalar metrics averaged over micro-batches. Holding no logits lets the backward free
    them as soon as it has used them. step_shares: loss and stats are already this micro-batch's share of its
    optimizer step's value times gradient_accumulation_steps (normalised by the step's totals, as GRPO's are),
    not means over the micro-batch's rows; micro-batches by tokens weigh them by it (trainers/loop/token_budget.py).
    """

    loss: torch.Tensor
    entropy: torch.Tensor
    ratio: torch.Tensor
    stats: dict[str, torch.Tensor]  # at least "loss/policy_avg", "policy/approxkl_avg", "policy/clipfrac_avg"
    step_shares: bool = False


@dataclass
class PolicyForward:
    """The policy's forward pass over one micro-batch, as every algorithm's loss reads it.

    token: the logprobs (with gradient) and entropy of the completion tokens, (b, T); old_logprobs: (b, T), the
    ratio's old side: the rollout's logprobs, or with a single update pass the update's own, detached (the ratio is
    then exactly 1); correction: the weights that correct for another engine (vLLM) having sampled the rows
    (core/importance_sampling.py), or None.
    """

    token: TokenLogprobs
    old_logprobs: torch.Tensor
    correction: ImportanceWeights | None


@dataclass
class UpdateResult:
    """What an update gives the iteration's metrics: its statistics (averaged over micro-batches and processes), and
    the sampling/* metrics of the corrections it computed against its own pass (`OffPolicyRule.report`), which
    replace those of the batch's logprobs; both empty when the update was skipped."""

    stats: dict[str, float] = field(default_factory=dict)
    corrections: dict[str, float] = field(default_factory=dict)


@dataclass
class OffPolicyPass:
    """An update over a batch that its source samples off-policy (`rule`), and the corrections computed against
    the update's own pass, per micro-batch: (proximal logprobs, behaviour logprobs, loss mask, weights)."""

    rule: OffPolicyRule
    corrections: list[tuple] = field(default_factory=list)


class UpdateLoop(TokenBudgetSteps):
    """The update loop of `OnPolicyTrainer` (trainers/loop/on_policy.py), which provides what it reads: `config`, `plan`,
    `state`, `accelerator`, `collectives`, `trained_models`, `optimizer_step`, `deepspeed_guard`, `policy_forward` and
    the algorithm's hooks `micro_batch_loss` and `optimizer_step_totals`."""

    @property
    def unwrapped_policy(self) -> torch.nn.Module:
        """The policy without its accelerate/DeepSpeed/FSDP wrapper (the prompt pass of a shared-prompt update, and
        the trainer's set-up, read it)."""
        return unwrap_model(self.accelerator, self.policy)

    def _update(self, rollout: TrajectoryBatch, shaped: ShapedRewards,
                off_policy: OffPolicyRule | None = None) -> UpdateResult:
        """num_ppo_epochs x num_mini_batches optimizer steps, each over gradient_accumulation_steps micro-batches.
        `off_policy`: the rule of a source whose batches may be sampled by older weights (None: on-policy).

        `accelerator.accumulate` divides each micro-batch loss by the accumulation steps, skips the gradient
        all-reduce until the last micro-batch, and lets the optimizer step only there (also under DeepSpeed,
        whose engine does its own accumulation). Every mini-batch is exactly gradient_accumulation_steps
        micro-batches, so accelerate's step counter is a multiple of them at every iteration boundary (which is
        what makes a checkpoint taken there resume exactly). With max_tokens_per_micro_batch a mini-batch is as
        many micro-batches as its rows' tokens need, synchronised by the loop itself (trainers/loop/token_budget.py).
        """
        config, plan = self.config, self.plan
        for model in self.trained_models.values():
            model.train()
        stats: dict[str, list[torch.Tensor]] = defaultdict(list)
        stale = OffPolicyPass(off_policy) if off_policy is not None else None
        ratios: list[torch.Tensor] = []
        self.last_grad_norm: float | None = None
        for epoch in range(config.num_ppo_epochs):
            order = torch.randperm(plan.local_batch_size, generator=self.state.update_generator)
            step_totals = self.optimizer_step_totals(shaped, order)
            by_tokens = self.token_budget_splits(rollout, order) if config.max_tokens_per_micro_batch else None
            for mini, first in enumerate(range(0, plan.local_batch_size, plan.local_mini_batch_size)):
                totals = step_totals[mini] if step_totals is not None else None
                # non-finite logits, loss: guards.MINI_BATCH_TENSORS without the gradient (checked at the step)
                flags = torch.zeros(2, dtype=torch.bool, device=self.accelerator.device)
                where = f" (ppo epoch {epoch}, mini-batch {mini})"
                if by_tokens is not None:
                    ratios += self.token_budget_step(rollout, shaped, by_tokens[mini], totals, stats, flags, stale,
                                                     where)
                else:
                    for start in range(first, first + plan.local_mini_batch_size, plan.micro_batch_size):
                        index = order[start : start + plan.micro_batch_size]
                        with self.accelerator.accumulate(*self.trained_models.values()):
                            ratios.append(self._micro_step(rollout, shaped, index, totals, stats, flags, stale))
                            if self.accelerator.sync_gradients:
                                self._optimizer_step(flags, where)
                fault_point("update", self.state.iteration)
        summary = {key: float(self.collectives.mean(torch.stack(values).mean().to(self.accelerator.device)))
                   for key, values in stats.items()}
        summary.update(self._ratio_summary(ratios))
        if self.last_grad_norm is not None:  # transformers' grad_norm: the last optimizer step's, before clipping
            summary["grad_norm"] = self.last_grad_norm
        reported = stale is not None and stale.rule.report
        return UpdateResult(summary, self._correction_metrics(stale.corrections) if reported else {})

    def optimizer_step_totals(self, shaped: ShapedRewards, order: torch.Tensor) -> list | None:
        """Per mini-batch of this epoch's `order`, what a loss normalised by the whole optimizer step needs to know
        before its first micro-batch (GRPO's dapo/bnpo token counts); each micro-batch of that mini-batch gets it
        as `micro_batch_loss`'s `step_totals`. Called on every process at the same point (it may run a
        collective). None: unused."""
        return None

    def policy_forward(self, rows: dict[str, torch.Tensor], stale: OffPolicyPass | None = None) -> PolicyForward:
        """The policy's logprobs (with gradient) and entropy on `rows`, the ratio's old side, and the sampling
        correction (`stale`: the rows were sampled off-policy, see `_update`)."""
        config = self.config
        token = response_token_logprobs(
            self.update_forward["model"], rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"],
            config.temperature, share_prompts=self.share_prompts_in_update,
            from_hidden_states=self.head_logprobs_in_update, prompt_model=self.unwrapped_policy,
            packed_by=rows["completion_mask"] if config.padding_free else None)
        old = token.logprobs.detach() if config.single_update_pass else rows["logprobs"]
        correction = None
        # a batch sampled off-policy is always corrected; the vLLM gap alone when the option says so
        if "sampling_logprobs" in rows and (config.vllm_importance_sampling_correction or stale is not None):
            if stale is not None and config.single_update_pass:
                # one pass: this forward's own logprobs are the proximal policy's (the batch was not refreshed)
                correction = self.correction_weights(old, rows["sampling_logprobs"], rows["loss_mask"])
                stale.corrections.append((old, rows["sampling_logprobs"], rows["loss_mask"], correction))
            else:
                correction = self.correction_weights(rows["logprobs"], rows["sampling_logprobs"], rows["loss_mask"])
        return PolicyForward(token, old, correction)

    @property
    def correction_mode(self) -> str:
        """The rule bounding the correction weights: async_correction where batches are sampled ahead (their gap
        is mostly staleness), else vllm_importance_sampling_mode (the sampler's gap alone), which also holds for
        batches sampled ahead when the config sets it and not async_correction (it was the rule there before)."""
        config = self.config
        chosen = config.model_fields_set
        if not config.samples_ahead or ("vllm_importance_sampling_mode" in chosen and "async_correction" not in chosen):
            return config.vllm_importance_sampling_mode  # a mode the user chose holds unless they chose both
        return config.async_correction

    def correction_weights(self, logprobs, sampling_logprobs, mask) -> ImportanceWeights:
        """The bounded correction weights under the config's mode and bounds."""
        config = self.config
        return sampling_correction_weights(
            logprobs, sampling_logprobs, mask, self.correction_mode,
            config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max,
        )

    def _correction_metrics(self, parts: list[tuple]) -> dict[str, float]:
        """The sampling/* metrics of the corrections the update computed itself (one pass over a batch sampled
        off-policy, which was not refreshed): the gap between the proximal and the behaviour logprobs, and the
        bounded weights."""
        if not parts:
            return {}
        per_sequence = self.correction_mode.startswith("sequence")
        flat = types.SimpleNamespace(
            logprobs=torch.cat([proximal[mask] for proximal, _, mask, _ in parts]),
            sampling_logprobs=torch.cat([behaviour[mask] for _, behaviour, mask, _ in parts]))
        flat.loss_mask = torch.ones_like(flat.logprobs, dtype=torch.bool)
        weights = ImportanceWeights(token=torch.cat([w.token[mask] for _, _, mask, w in parts]),
                                    sequence=torch.cat([w.sequence for *_, w in parts]), raw=flat.logprobs)
        return sampling_metrics(self.collectives, self.accelerator.device, flat, weights, per_sequence)

    def _micro_step(self, rollout, shaped: ShapedRewards, index, step_totals, stats, flags: torch.Tensor,
                    stale: OffPolicyPass | None = None, share: MicroBatchShare | None = None) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its ratios on loss tokens (flattened) for val/ratio.
        `share`: the micro-batch's part of its step when micro-batches are by tokens (None: a fixed one)."""
        rows = rollout.rows(index)  # cut to the rows' content: no work on padding
        width = rows.pop("width")
        shaped_rows = {name: value[index, :width] if value.dim() == 2 else value[index]
                       for name, value in vars(shaped).items() if isinstance(value, torch.Tensor)}
        if share is not None and share.rows == 0:  # a padding pass: nothing in it is trained on or measured
            for tensors in (rows, shaped_rows):
                if "loss_mask" in tensors:
                    tensors["loss_mask"] = torch.zeros_like(tensors["loss_mask"])
        out = self.micro_batch_loss(rows, shaped_rows, self.policy_forward(rows, stale), step_totals)
        if fault_point("loss", self.state.iteration):  # test hook (action `nan`)
            out.loss = out.loss * float("nan")
        with torch.no_grad():  # numerical guard: one isfinite reduction per tensor, no host sync here
            flags |= ~torch.stack([guards.all_finite(out.entropy), guards.all_finite(out.loss.detach())])
            entropy = masked_mean(out.entropy, rows["loss_mask"])
        loss = out.loss
        if share is not None:  # accelerate's backward divides by the accumulation steps: undo it, then weigh
            loss = loss * (share.weight(out.step_shares) * share.accumulation_steps)
        if self.deepspeed_guard is not None and self.accelerator.sync_gradients and any(
            self.collectives.any_true(*flags.tolist())
        ):  # DeepSpeed steps inside backward: make this step one its overflow check skips
            loss = self.deepspeed_guard.poison(loss)
        if self.accelerator.device.type == "cpu" and engine_kind(self.accelerator) is None:
            # The backward is the iteration's peak: start it from the live memory only. Not under DeepSpeed or
            # FSDP, whose own buffers and asynchronous gathers it was never measured with.
            release_free_host_memory()
        self.accelerator.backward(loss)
        weight = share.weight(out.step_shares) if share is not None else None
        for name, value in out.stats.items():
            stats[name].append(value if weight is None else value * weight)
        stats["policy/entropy_avg"].append(entropy if share is None else entropy * share.token_share)
        return out.ratio.reshape(-1) if out.ratio.dim() == 1 else out.ratio[rows["loss_mask"]]

    def _ratio_summary(self, ratios: list[torch.Tensor]) -> dict[str, float]:
        """val/ratio and val/ratio_var over every ratio of every process, from sums: processes may hold different
        numbers of them (token-level ratios count real tokens)."""
        values = torch.cat(ratios).double().to(self.accelerator.device)
        sums = self.collectives.sum(torch.stack([values.sum(), (values**2).sum(), values.new_tensor(values.numel())]))
        count = sums[2].clamp(min=1)
        mean = sums[0] / count
        return {"val/ratio": float(mean), "val/ratio_var": float((sums[1] / count - mean**2).clamp(min=0))}

    def _optimizer_step(self, flags: torch.Tensor, where: str) -> None:
        """Clip, check logits/loss/gradient are finite (agreed over processes), then step or skip the step
        (trainers/loop/step.py)."""
        outcome = self.optimizer_step(flags, guards.MINI_BATCH_TENSORS,
                                      lambda name: guards.nonfinite_error(name, self.state.iteration, where))
        self.last_grad_norm = outcome.grad_norm
        if not outcome.stepped:
            self.state.skipped_batches += 1
