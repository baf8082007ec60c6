"""reused_host_memory: inside it a KL step's vocabulary-wide tensors land on pages already mapped;
outside it (before, and after it restored glibc's thresholds) they are faulted in afresh."""

from __future__ import annotations

import contextlib
import ctypes.util
import platform
import resource

import pytest
import torch

from autocompress_opt.hf import host_memory
from autocompress_opt.hf.host_memory import reused_host_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
SHAPE = (2, 128, 49_152)  # a SmolLM2 batch's logits: 50 MB in float32, above glibc's mmap ceiling (32 MiB)
BLOCK_PAGES = 2 * 128 * 49_152 * 4 // 4096


def _faulted_blocks_per_step(logits: torch.Tensor, steps: int = 6) -> float:
    """Logits-sized blocks of fresh pages per step of a KL-like pass (float copy, log-softmax, exp)."""

    def step() -> float:
        lp = torch.log_softmax(logits.float(), dim=-1)
        return float((lp.exp() * lp).sum())

    for _ in range(3):  # the heap grows to hold a step's tensors once
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps / BLOCK_PAGES


@pytest.mark.skipif(not GLIBC, reason="mallopt's thresholds are glibc's")
def test_a_kl_step_reuses_pages_inside_and_faults_them_in_outside() -> None:
    logits = torch.randn(SHAPE).to(torch.bfloat16)
    with reused_host_memory() as taken:
        assert taken is True
        with reused_host_memory():  # nested: the inner block leaves the settings to the outer one
            pass
        inside = _faulted_blocks_per_step(logits)
    after = _faulted_blocks_per_step(logits)
    assert inside < 0.25  # every step's tensors carved from freed heap memory
    assert after >= 1.0  # restored: glibc maps (and the kernel zero-fills) at least one block a step
    assert host_memory._depth == 0


def test_without_mallopt_the_block_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A C library without mallopt (macOS, musl) leaves the allocator alone and says so."""
    host_memory._libc.cache_clear()
    try:
        monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libdoes-not-exist.so.9")
        with reused_host_memory() as taken:
            assert taken is False
    finally:
        host_memory._libc.cache_clear()


def test_the_block_restores_the_settings_when_its_body_raises() -> None:
    with contextlib.suppress(RuntimeError), reused_host_memory():
        raise RuntimeError("a trial that failed")
    assert host_memory._depth == 0
