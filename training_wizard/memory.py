"""Free host memory handed back to the operating system before the update's backward, the peak of an iteration.

On CPU, glibc's malloc keeps the blocks a process frees and reuses them for later allocations of fitting size.
An iteration allocates in very different shapes (the decode loop's caches, the logprob passes' work buffers, the
update's activations and their gradients), so the freed blocks of one phase often do not fit the next, and the
resident memory grows toward the sum of what every phase left behind rather than the most any phase holds.
`malloc_trim(0)` returns the free pages to the system; GPU trainers call `torch.cuda.empty_cache()` between phases
for the same reason. It is called once per micro-batch, just before the backward: the pages it returns are
touched again only as the backward needs them (`bench/revisions.py` measures peak memory and time).
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; other C libraries have no such call
    except (AttributeError, OSError):
        return None


def release_free_host_memory() -> bool:
    """Return the process's free heap pages to the system (glibc only). Returns whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
