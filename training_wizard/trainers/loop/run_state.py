"""The run's state beyond weights and optimizer, which every checkpoint saves: counters, the data position, the
random streams. Shared by the on-policy and supervised loops."""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerState

from training_wizard.rollout.prompts import PromptOrder


class RunState(TrainerState):
    """All state a checkpoint needs beyond weights and optimizer: counters, data position, RNG streams.

    `state_dict()` is plain data (ints, dicts, CPU tensors), so checkpoints load with `weights_only=True`.
    Sampling noise is keyed by (seed, iteration, slot) and needs no state of its own.

    It is also the trainer's transformers `TrainerState` (`trainer.state`, as scripts written for TRL read it):
    `global_step`, `epoch`, `max_steps` and the rest are kept up to date by trl/callbacks.py, `log_history`
    holds every metrics record (`save_state` writes it as trainer_state.json); of those fields only
    `num_input_tokens_seen` (TRL's `num_tokens`) is part of a checkpoint, the others are derived from the counters.
    """

    def __init__(self, seed: int, num_rows: int):
        super().__init__()
        self.iteration = 0
        self.episode = 0
        self.skipped_batches = 0  # mini-batches whose optimizer step the non-finite guard skipped
        self.prompt_order = PromptOrder(num_rows=num_rows, seed=seed)
        self.update_generator = torch.Generator().manual_seed(seed + 1)
        # episodes whose environment failed (trainers/loop/environment_failures.py), and the iterations in a row in which
        # more of them failed than max_environment_failures allows
        self.failed_episodes = 0
        self.failed_iterations_in_a_row = 0
        # what else keeps its state in this one (the on-policy loop's rollout source, rollout/iteration_source.py):
        # `state_dict(saved) -> saved` amends the saved state, `load_state_dict(saved)` reads its part back
        self.parts: list[Any] = []

    def state_dict(self) -> dict[str, Any]:
        state = {
            "iteration": self.iteration,
            "episode": self.episode,
            "skipped_batches": self.skipped_batches,
            "prompt_order": self.prompt_order.state_dict(),
            "update_generator": self.update_generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "failed_episodes": self.failed_episodes,
            "failed_iterations_in_a_row": self.failed_iterations_in_a_row,
            "num_input_tokens_seen": self.num_input_tokens_seen,
        }
        for part in self.parts:
            state = part.state_dict(state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration, self.episode = int(state["iteration"]), int(state["episode"])
        self.skipped_batches = int(state.get("skipped_batches", 0))
        self.failed_episodes = int(state.get("failed_episodes", 0))
        self.failed_iterations_in_a_row = int(state.get("failed_iterations_in_a_row", 0))
        self.num_input_tokens_seen = int(state.get("num_input_tokens_seen", 0))
        self.prompt_order.load_state_dict(state["prompt_order"])
        self.update_generator.set_state(state["update_generator"])
        torch.set_rng_state(state["torch_rng"])
        for part in self.parts:
            part.load_state_dict(state)
