"""The skip budget of ``make test``: which reasons a test may skip for in the full run, and how often.

``make test`` installs the engines and the task data and runs ``tests/gpu`` on the CPU
(``AUTOCOMPRESS_GPU_SUITE_DEVICE=cpu``), so almost nothing should skip there. With
``AUTOCOMPRESS_SKIP_BUDGET=1`` (the Makefile's test target sets it) or ``--skip-budget``, the hook in
``tests/conftest.py`` fails the run when a test skips for a reason not listed here, or when one of
these reasons skips more tests than its count: a missing engine, missing data or a GPU suite that
silently skipped would otherwise pass CI. ``make test-fast`` (no engines, no data) does not use it.

A reason matches a skip whose message starts with it. Raise a count, or add a reason, in the same
change that adds the skipping test, saying where it comes from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ALLOWED", "ENV", "Allowance", "over_budget"]

ENV = "AUTOCOMPRESS_SKIP_BUDGET"


@dataclass(frozen=True)
class Allowance:
    """Up to ``count`` tests may skip with a message starting with ``reason``; ``where`` says which."""

    reason: str
    count: int
    where: str


ALLOWED: tuple[Allowance, ...] = (
    # A CPU-only CI machine. tests/gpu runs on the CPU there; its skips ("GPU suite needs ...", e.g. a
    # driver too old for torch's CUDA) have no allowance: a GPU suite that skipped fails the budget.
    Allowance("needs a CUDA GPU", 1, "tests/hf/test_loading_devices.py: a load straight onto cuda:0"),
    Allowance("needs two CUDA GPUs", 1, "tests/hf/test_loading_devices.py: a model spread over two GPUs"),
    # The real-model GPU-suite module on a CPU that emulates bf16 (tests/gpu/conftest.py: over 10 minutes
    # of CI for code paths test_gpu_tiny.py checks too); AUTOCOMPRESS_GPU_SUITE_REAL_ON_CPU=1 runs it.
    Allowance(
        "real SmolLM2 in bf16 on a CPU that emulates bf16", 6, "tests/gpu/test_gpu_smollm2.py: every test of the module"
    ),
    # A machine with a GPU skips the two no-GPU checks instead.
    Allowance(
        "this machine has a CUDA GPU",
        3,
        "tests/hf/test_device.py: auto and cuda without a GPU; tests/hf/test_cuda_check.py: the check's exit 1",
    ),
    # PyPI stopped serving the bigbench-1.0.0 sdist (HTTP 403 since 2026-12; its index lists only 0.0.1,
    # without the task): where make data could not fetch it, the one real-data test of that task skips.
    Allowance(
        "wikihow-goal-step: fetch it with", 1, "tests/tasks/test_task_builders.py: BIG-bench 1.0.0 not downloadable"
    ),
    # The optional aic extra (NVIDIA AIConfigurator) is not part of make test's install: CI checks that
    # everything works without it (issue 45); its tests with the package skip there.
    Allowance(
        "AIConfigurator is not installed",
        11,
        "tests/serving/test_aic.py (9): the backend's own lookups and study show's check of the front; "
        "tests/serving/test_aic_fit.py (2): the fit to them",
    ),
    # CI containers run as root, which may write into read-only folders.
    Allowance(
        "root writes into read-only folders anyway", 7, "tests/cli/test_bad_inputs.py: one per verb of READ_ONLY"
    ),
)


def over_budget(reasons: Iterable[str], allowed: Iterable[Allowance] = ALLOWED) -> list[str]:
    """One line per budget ``reasons`` (the messages of the run's skips) break: a reason skipping
    more tests than its count, or a skip no allowance covers (its message, how many). Empty: within."""
    allowances = tuple(allowed)
    used: Counter[str] = Counter()
    unexpected: Counter[str] = Counter()
    for message in reasons:
        match = next((a for a in allowances if message.startswith(a.reason)), None)
        if match is None:
            unexpected[message] += 1
        else:
            used[match.reason] += 1
    problems = [
        f"{used[a.reason]} tests skipped with {a.reason!r}, {a.count} allowed ({a.where})"
        for a in allowances
        if used[a.reason] > a.count
    ]
    problems += [f"{n} test(s) skipped with an unlisted reason: {message}" for message, n in unexpected.items()]
    return problems
