"""Steps 1-5 of an iteration, shared by every on-policy trainer: take prompts, sample completions, truncate them,
compute policy and reference logprobs, and score them. Mixed into `OnPolicyTrainer` (trainers/base.py), whose
attributes it uses: config, tokenizer, accelerator, state, reward, ref_policy, stop_token_id.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from training_wizard.core.masking import truncate_after_stop
from training_wizard.errors import UserError
from training_wizard.rollout.generation import GenerationParams, generate
from training_wizard.rollout.prompts import EncodedPrompts, row_seed
from training_wizard.rollout.record import Rollout
from training_wizard.rollout.scoring import batched_logprobs, classifier_scores
from training_wizard.signals import fault_point


class RolloutSteps:
    def _next_prompts(self) -> tuple[list[int], list[int]]:
        """This process's dataset indices, repeated group_size times in the (k, prompts) layout, and their
        sampling seeds keyed by (seed, iteration, global slot)."""
        plan, k = self.plan, self.config.group_size()
        global_indices = self.state.prompt_order.take(plan.prompts_per_iteration)
        first = self.accelerator.process_index * plan.local_prompts
        local = global_indices[first : first + plan.local_prompts]
        rows = [local[i] for j in range(k) for i in range(plan.local_prompts)]
        seeds = [
            row_seed(self.config.seed, self.state.iteration, (first + i) * k + j)
            for j in range(k)
            for i in range(plan.local_prompts)
        ]
        return rows, seeds

    def _generate(self, prompts: EncodedPrompts, rows: list[int], seeds: list[int]) -> Rollout:
        config, pad = self.config, self.tokenizer.pad_token_id
        started = time.perf_counter()
        prompt_ids, prompt_mask = prompts.left_pad(rows, pad)
        device = self.accelerator.device
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        params = GenerationParams(config.response_length, config.temperature, self.stop_token_id, pad)
        model, weights_context, sharded = self._rollout_model()
        model.eval()  # no dropout either way; eval lets the KV cache work under gradient checkpointing
        all_finished = self._all_processes_done if sharded else None
        step = config.local_rollout_forward_batch_size
        with weights_context:
            chunks = [
                generate(model, prompt_ids[start : start + step], prompt_mask[start : start + step], params,
                         seeds[start : start + step], all_finished)
                for start in range(0, len(rows), step)
            ]
            # One width on every process: token-level statistics gather (B, T) tensors across processes.
            width = self._max_over_processes(max(chunk.shape[1] for chunk in chunks))
            raw = torch.cat([torch.nn.functional.pad(c, (0, width - c.shape[1]), value=pad) for c in chunks])
            responses, mask, has_stop = truncate_after_stop(raw, self.stop_token_id, pad)
            generated = time.perf_counter()
            logprobs = self._logprobs(model, prompt_ids, prompt_mask, responses)
            ref_logprobs = self._reference_logprobs(model, prompt_ids, prompt_mask, responses)
        if self.stop_token_id is None and self.tokenizer.eos_token_id is not None:
            has_stop = (responses == self.tokenizer.eos_token_id).any(-1)
        completions = self.tokenizer.batch_decode(
            torch.where(mask, responses, torch.full_like(responses, pad)), skip_special_tokens=True
        )
        return Rollout(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, responses=responses, response_mask=mask,
            has_stop=has_stop, logprobs=logprobs, ref_logprobs=ref_logprobs, scores=torch.empty(0),
            queries=[prompts.queries[i] for i in rows], completions=completions,
            timings={"generation": generated - started, "logprobs": time.perf_counter() - generated},
        )

    def _rollout_model(self) -> tuple[torch.nn.Module, Any, bool]:
        """(model for the no-grad rollout passes, context to run them in, whether its weights are sharded).

        Plain data parallel: the unwrapped model. DeepSpeed ZeRO-3 with `ds3_gather_for_generation`: the unwrapped
        model inside `GatheredParameters`. ZeRO-3 without it, and FSDP: the sharded model itself, whose forward
        passes gather weights layer by layer (collectives, so every process must run the same passes).
        """
        state = self.accelerator.state
        plugin = getattr(state, "deepspeed_plugin", None)
        if plugin is not None and plugin.zero_stage == 3:
            if self.config.ds3_gather_for_generation:
                import deepspeed

                return self.unwrapped_policy, deepspeed.zero.GatheredParameters(list(self.policy.parameters())), False
            return self.unwrapped_policy, contextlib.nullcontext(), True
        if getattr(state, "fsdp_plugin", None) is not None:
            return self.policy, contextlib.nullcontext(), True
        return self.unwrapped_policy, contextlib.nullcontext(), False

    def _all_processes_done(self, done: bool) -> bool:
        return not self._agree(not done)[0]

    def _max_over_processes(self, value: int) -> int:
        if self.accelerator.num_processes == 1:
            return value
        return int(self.accelerator.reduce(torch.tensor(value, device=self.accelerator.device), "max"))

    def _logprobs(self, model, prompt_ids, prompt_mask, responses) -> torch.Tensor:
        return batched_logprobs(
            model, prompt_ids, prompt_mask, responses, self.config.temperature,
            self.config.local_rollout_forward_batch_size,
        )

    def _reference_logprobs(self, model, prompt_ids, prompt_mask, responses) -> torch.Tensor:
        if self.ref_policy is not None:
            return self._logprobs(self.ref_policy, prompt_ids, prompt_mask, responses)
        with self.unwrapped_policy.disable_adapter():  # LoRA: the base model is the reference
            return self._logprobs(model, prompt_ids, prompt_mask, responses)

    def _score(self, rollout: Rollout, prompts: EncodedPrompts, rows: list[int]) -> None:
        started = time.perf_counter()
        if isinstance(self.reward, torch.nn.Module):
            scores = classifier_scores(
                self.reward, rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.response_mask,
                self.tokenizer.pad_token_id, self.config.local_rollout_forward_batch_size,
            )
        else:
            columns = {name: [values[i] for i in rows] for name, values in prompts.columns.items()}
            columns["completion_has_eos"] = rollout.has_stop.tolist()
            error, totals = None, []
            try:
                totals, rollout.components = self.reward.score(
                    rollout.queries, rollout.completions, columns, step=self.state.iteration
                )
            except UserError as exc:
                error = str(exc)
            self._raise_if_any_process_failed(error)
            scores = torch.tensor(totals, dtype=torch.float32, device=rollout.responses.device)
        if self.config.missing_eos_penalty is not None:
            scores = scores - self.config.missing_eos_penalty * (~rollout.has_stop).float()
        rollout.scores = scores.float()
        rollout.timings["scoring"] = time.perf_counter() - started

    def _raise_if_any_process_failed(self, error: str | None) -> None:
        """A user error on one process stops every process with its message, instead of leaving the others
        blocked in the next collective."""
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            errors = [e for e in gather_object([error]) if e]
            error = errors[0] if errors else None
        if error:
            raise UserError(error)

    def collect_rollout(self) -> Rollout:
        rows, seeds = self._next_prompts()
        rollout = self._generate(self.train_prompts, rows, seeds)
        fault_point("generation", self.state.iteration)
        self._score(rollout, self.train_prompts, rows)
        return rollout
