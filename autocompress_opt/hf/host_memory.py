"""How the host's C allocator treats the big tensors of a trial on the CPU: reuse freed blocks while it runs.

A trial's largest tensors are vocabulary-wide: the logits, log-probabilities and KL terms of a
batch, ``(B, T, V)`` float32 (2 x 128 x 49,152 for SmolLM2: 50 MB). glibc's ``malloc`` serves a
block above ``M_MMAP_THRESHOLD`` (at most 32 MiB however far its dynamic threshold rises) with its
own ``mmap`` and returns it with ``munmap`` when freed, so every such tensor of every step starts
on fresh pages, and the kernel zero-fills each 4 KiB page on its first write. On one core that
fault work made an elementwise pass over such a tensor 2-3x slower than over reused memory
(``exp`` 24 -> 8 ms, a copy 22 -> 7 ms) and a warm SmolLM2 trial spend about a fifth of its CPU
time in it.

:func:`reused_host_memory` raises the threshold above any tensor a trial makes (and the heap's trim
threshold with it) for as long as the block runs, so a freed logits tensor stays in the heap and
the next step's is carved from the same, already mapped pages. PyTorch's CPU performance guide
makes the same point and recommends jemalloc or tcmalloc; this needs neither, but glibc's heap has
no size classes, and it is not safe for *any* code: a loop that frees a big tensor and keeps a small
new allocation each time can pin every freed block behind a live one and grow the heap by a block
per step (50 MB a cycle, measured). So it is scoped: a trial's own loops (their allocations were
measured flat: 24 trials in one process, resident size 2,858 MB from the 4th to the 24th) and
the seeds' candidate scores run inside it; on leaving the outermost block the thresholds go back to
where glibc's dynamic rule settles for such tensors (mmap 32 MiB, trim 64 MiB) and ``malloc_trim``
hands the freed blocks back to the system. Results are bit-identical (the allocator decides where a
tensor lives, not what it holds); CUDA memory is not touched (PyTorch's caching allocator reuses it).
On a C library without ``mallopt`` (macOS, musl) the block runs unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["KEEP_BYTES", "reused_host_memory"]

# Blocks up to this size come from the heap and freed memory up to it stays there: above the
# largest tensor of a CPU trial (a Llama-3 batch of 2 x 256 positions x 128,256 float32 logits is
# 263 MB), below what a 2-core, 24 GiB machine can spare for one process's free list.
KEEP_BYTES = 1 << 30
# Where glibc's dynamic thresholds settle once a block of 32 MiB or more was freed (malloc.c:
# DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, the trim threshold twice the mmap one): restored on leaving.
_AFTER_MMAP_BYTES = 32 << 20
_AFTER_TRIM_BYTES = 64 << 20

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_depth = 0  # blocks entered and not left, across threads (the settings are process-wide)


@functools.cache
def _libc() -> Any | None:
    """The C library's ``mallopt`` and ``malloc_trim`` (None where it has no ``mallopt``)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # no C library by that name, or one without them
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return libc


@contextlib.contextmanager
def reused_host_memory() -> Iterator[bool]:
    """Run the block with glibc serving blocks up to :data:`KEEP_BYTES` from its heap and keeping as
    much freed memory there (module doc); yields whether the C library took the settings. Nestable
    and usable from several threads at once: the outermost block to leave restores the thresholds
    and trims the heap. It changes where tensors live, never their values."""
    global _depth
    libc = _libc()
    if libc is None:
        yield False
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES)
            libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
    try:
        yield True
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(_M_MMAP_THRESHOLD, _AFTER_MMAP_BYTES)
                libc.mallopt(_M_TRIM_THRESHOLD, _AFTER_TRIM_BYTES)
                libc.malloc_trim(0)
