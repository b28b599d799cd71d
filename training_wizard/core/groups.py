"""Groups of completions sampled from one prompt, found by their group ids rather than by row position.

Every group-relative statistic (RLOO's leave-one-out baseline, GRPO's group mean and standard deviation, DAPO's
constant-group filter) works on a (group_size, groups) grid gathered from the rows by `group_members`, and puts
its result back on the rows. The rows can come in any order; for the (group_size, prompts) layout the trainers
sample in (completion j of prompt p at row j * P + p) the grid is exactly `values.reshape(group_size, -1)`, so
the numbers are those of a reshape.
"""

from __future__ import annotations

import torch


def repeated_layout_ids(group_size: int, num_prompts: int, first: int = 0) -> torch.Tensor:
    """The group ids of the (group_size, prompts) layout: row j * num_prompts + p belongs to group first + p."""
    return torch.arange(first, first + num_prompts).repeat(group_size)


def group_members(group_ids: torch.Tensor) -> torch.Tensor:
    """(group_size, G) long: column g holds the rows of the g-th group (ordered by id), in row order.

    group_ids: (B,) long. Every group must hold the same number of rows (the trainers sample group_size
    completions per prompt); a ValueError names the sizes otherwise.
    """
    _, counts = torch.unique(group_ids, return_counts=True)
    if counts.numel() and bool((counts != counts[0]).any()):
        raise ValueError(f"groups of unequal size {sorted(set(counts.tolist()))}: every prompt needs the same "
                         "number of completions")
    order = torch.argsort(group_ids, stable=True)
    return order.reshape(counts.numel(), -1).T


def on_grid(values: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """The (group_size, G) grid of (B,) `values`."""
    return values[members.to(values.device)]


def from_grid(grid: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """The (B,) rows of a (group_size, G) grid, inverse of `on_grid`."""
    rows = torch.empty(members.numel(), dtype=grid.dtype, device=grid.device)
    rows[members.reshape(-1).to(grid.device)] = grid.reshape(-1)
    return rows
