"""The GPU suite's switches and recorders.

Every test under ``tests/gpu`` runs on one device, ``cuda`` by default: without a CUDA GPU each is
skipped, naming why. ``--gpu-suite-device cpu`` (with ``pytest tests/gpu``; the option exists only
when this folder is named on the command line) or ``AUTOCOMPRESS_GPU_SUITE_DEVICE=cpu`` (anywhere)
runs the same tests on the CPU, in the same bf16 and fp32, to check their code paths on a machine
without a GPU. ``cuda:N`` picks another GPU.

Each test may record figures (seconds, peak device memory, the bf16 and fp32 KL) with the
``gpu_record`` fixture; they are printed after the run and, with ``--gpu-suite-record FILE`` or
``AUTOCOMPRESS_GPU_SUITE_RECORD=FILE``, written to FILE as JSON.
"""

from __future__ import annotations

import gc
import json
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

DEVICE_ENV, RECORD_ENV = "AUTOCOMPRESS_GPU_SUITE_DEVICE", "AUTOCOMPRESS_GPU_SUITE_RECORD"
# The real-model module (test_gpu_smollm2.py) on a CPU that emulates bf16: opt in with this set to 1.
REAL_ON_CPU_ENV = "AUTOCOMPRESS_GPU_SUITE_REAL_ON_CPU"
_RECORDS: dict[str, dict[str, Any]] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu suite", "tests/gpu: the GPU path on a real device")
    group.addoption(
        "--gpu-suite-device",
        default=None,
        help=f"device of tests/gpu: cuda (default; skipped without a CUDA GPU), cuda:N or cpu (env {DEVICE_ENV})",
    )
    group.addoption(
        "--gpu-suite-record", default=None, metavar="FILE", help=f"write tests/gpu's figures as JSON (env {RECORD_ENV})"
    )


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    try:
        value = config.getoption(name)
    except ValueError:  # this conftest was not loaded when the command line was parsed
        value = None
    return value or os.environ.get(env) or None


def suite_device_name(config: pytest.Config) -> str:
    """The suite's device, checked: ``cuda`` (default), ``cuda:N`` or ``cpu``."""
    name = (_option(config, "--gpu-suite-device", DEVICE_ENV) or "cuda").strip().lower()
    if name != "cpu" and not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        raise pytest.UsageError(f"--gpu-suite-device / {DEVICE_ENV} {name!r} is not one of cuda, cuda:N, cpu")
    return name


@pytest.fixture(scope="session", autouse=True)
def suite_device(request: pytest.FixtureRequest) -> torch.device:
    """The device every test here runs on; skips the whole suite, saying why, when it is a GPU
    that torch cannot see (session scope: no module fixture loads anything before this skip)."""
    name = suite_device_name(request.config)
    reason = missing_gpu(name)
    if reason:
        pytest.skip(reason)
    return torch.device("cuda", int(name.partition(":")[2] or 0)) if name.startswith("cuda") else torch.device("cpu")


# Every skip of the suite's device starts with it; no allowance of tests/skip_budget.py covers it.
SKIP_PREFIX = "GPU suite"
# The real-model module's skip on a CPU without bf16 instructions; tests/skip_budget.py allows it.
REAL_ON_CPU_PREFIX = "real SmolLM2 in bf16 on a CPU that emulates bf16"


@pytest.fixture(scope="module")
def real_model_device(suite_device: torch.device) -> torch.device:
    """The suite's device for the real-model module. On a CPU without bf16 instructions (torch
    emulates bf16 there, about 6x slower than fp32) the module's bf16 half costs over 10 minutes
    of the CPU-only CI run while the tiny-parent module checks the same code paths; it runs there
    only with ``AUTOCOMPRESS_GPU_SUITE_REAL_ON_CPU=1``, and skips, saying so, otherwise."""
    from autocompress_opt.hf.device import cpu_bf16_native

    if suite_device.type == "cpu" and not cpu_bf16_native() and os.environ.get(REAL_ON_CPU_ENV) != "1":
        pytest.skip(
            f"{REAL_ON_CPU_PREFIX} takes over 10 minutes (tests/gpu/test_gpu_tiny.py checks the same code "
            f"paths); {REAL_ON_CPU_ENV}=1 runs it"
        )
    return suite_device


def missing_gpu(name: str) -> str | None:
    """Why the suite cannot run on device ``name`` (None: it can): no CUDA GPU, torch's own reason
    when it gives one (a driver too old for this torch's CUDA, say), or fewer GPUs than ``cuda:N``.
    The message starts with :data:`SKIP_PREFIX`, so the skip budget counts these skips as skips of
    the GPU suite, never within another test's allowance."""
    if not name.startswith("cuda"):
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if not available:
        told = "; ".join(dict.fromkeys(" ".join(str(w.message).split()) for w in caught))
        why = f"torch says: {told}" if told else "a CPU build or no driver"
        return (
            f"{SKIP_PREFIX} needs a CUDA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none ({why}; "
            f"`make install-gpu` installs the CUDA build). {DEVICE_ENV}=cpu runs this suite on the CPU"
        )
    index = int(name.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        return f"{SKIP_PREFIX} needs CUDA GPU {index}: this machine has {torch.cuda.device_count()}"
    return None


@pytest.fixture
def peak_memory(suite_device: torch.device) -> Callable[[], Any]:
    """``with peak_memory() as peak: ...`` leaves ``peak["peak_bytes"]``, the CUDA allocator's peak over
    the block (``torch.cuda.max_memory_allocated``: every live tensor of the process counts, also
    those made before the block), and ``peak["start_bytes"]``, what was allocated when it began
    (``peak_bytes - start_bytes``: what the block added at most); both None on the CPU."""

    @contextmanager
    def measure() -> Iterator[dict[str, int | None]]:
        out: dict[str, int | None] = {"peak_bytes": None, "start_bytes": None}
        cuda = suite_device.type == "cuda"
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.synchronize(suite_device)
            torch.cuda.reset_peak_memory_stats(suite_device)
            out["start_bytes"] = int(torch.cuda.memory_allocated(suite_device))
        yield out
        if cuda:
            torch.cuda.synchronize(suite_device)
            out["peak_bytes"] = int(torch.cuda.max_memory_allocated(suite_device))

    return measure


@pytest.fixture
def gpu_record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``gpu_record(key=value, ...)``: figures of this test, printed after the run (JSON-safe values)."""

    def record(**values: Any) -> None:
        _RECORDS.setdefault(request.node.nodeid, {}).update(values)
        for key, value in values.items():
            request.node.user_properties.append((key, value))

    return record


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _RECORDS:
        return
    terminalreporter.section("GPU suite figures")
    for test, values in _RECORDS.items():
        shown = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
        terminalreporter.write_line(f"{test.rpartition('::')[2]}: {shown}")
    path = _option(config, "--gpu-suite-record", RECORD_ENV)
    if path:
        payload = {"device": suite_device_name(config), "torch": torch.__version__, "tests": _RECORDS}
        if torch.cuda.is_available():
            payload["gpu"] = torch.cuda.get_device_name(0)
        Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        terminalreporter.write_line(f"wrote {path}")


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and value > 2**20:
        return f"{value / 2**20:.0f} MiB"
    return str(value)
