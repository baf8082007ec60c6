"""reused_host_memory: inside it a KL step's vocabulary-wide tensors land on pages already mapped;
outside it (before, and after it restored glibc's thresholds) they are faulted in afresh."""

from __future__ import annotations

import contextlib
import ctypes.util
import platform
import subprocess
import sys

import pytest

from autocompress_opt.hf import host_memory
from autocompress_opt.hf.host_memory import reused_host_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Run in a fresh process: how a block is served outside the setting depends on the heap's history
# (a free chunk left by an earlier test is reused whatever the thresholds say).
PROBE = """
import resource, torch
from autocompress_opt.hf import host_memory
from autocompress_opt.hf.host_memory import reused_host_memory

logits = torch.randn(2, 128, 49_152).to(torch.bfloat16)  # a SmolLM2 batch's logits: 50 MB in float32
pages = 2 * 128 * 49_152 * 4 // 4096


def step():  # a KL-like pass: float copy, log-softmax, exp, product
    lp = torch.log_softmax(logits.float(), dim=-1)
    return float((lp.exp() * lp).sum())


def blocks_faulted_per_step(steps=6):
    for _ in range(3):  # the heap grows to hold a step's tensors once
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps / pages


before = blocks_faulted_per_step()
with reused_host_memory() as taken:
    with reused_host_memory():  # nested: the inner block leaves the settings to the outer one
        pass
    inside = blocks_faulted_per_step()
after = blocks_faulted_per_step()
print(taken, before, inside, after, host_memory._depth)
"""


@pytest.mark.skipif(not GLIBC, reason="mallopt's thresholds are glibc's")
def test_a_kl_step_reuses_pages_inside_and_faults_them_in_outside() -> None:
    """Logits-sized blocks of fresh pages per step: at least one before the block and after it (the
    thresholds restored), almost none inside."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    taken, before, inside, after, depth = out.stdout.split()
    assert taken == "True" and depth == "0"
    assert float(before) >= 1.0 and float(after) >= 1.0
    assert float(inside) < 0.25


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
