"""A local Ray is started with the CPUs this process may use (its affinity mask), not the host's core
count: on a GPU node that gives a job 16 of 128 cores, trials are planned for 16."""

from __future__ import annotations

import os
from typing import Any

import pytest

from autocompress_opt.search.study import ray_runtime
from autocompress_opt.search.study.ray_runtime import init_ray, usable_cpus


def test_usable_cpus_is_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 5}, raising=False)
    assert usable_cpus() == 3


def test_usable_cpus_falls_back_to_cpu_count_without_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS has none
    assert usable_cpus() == 12
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "undeterminable"
    assert usable_cpus() == 1


@pytest.mark.parametrize(("concurrency", "expected"), [(1, 3), (None, 3), (8, 8)])
def test_local_ray_gets_the_affinity_cpus_or_concurrency(
    monkeypatch: pytest.MonkeyPatch, concurrency: int | None, expected: int
) -> None:
    import ray

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 4}, raising=False)
    monkeypatch.setattr(ray_runtime, "_plugin_paths", lambda plugins: [])
    init_ray(None, concurrency)
    assert [(c["address"], c["num_cpus"]) for c in calls] == [("local", expected)]


_NICENESS_SCRIPT = """
import os, sys
os.nice(3)  # a driver started with `nice -n 3`
from autocompress_opt.search.study.ray_runtime import init_ray
import ray
init_ray(None, 1)
@ray.remote
def niceness():
    return os.nice(0)
print("NICE", os.nice(0), ray.get(niceness.remote()))
ray.shutdown()
"""


@pytest.mark.slow
def test_a_local_rays_workers_run_at_the_drivers_niceness() -> None:
    """Ray's raylet starts workers at niceness 15 by default (``RAY_worker_niceness``): trials would
    yield to the driver's own preparation and to any other process. A local Ray started by the study
    runs them at the driver's niceness (a real Ray, in a process of its own)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    out = subprocess.run(
        [sys.executable, "-c", _NICENESS_SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("NICE"))
    driver, worker = (int(v) for v in line.split()[1:])
    assert driver == worker == os.nice(0) + 3
