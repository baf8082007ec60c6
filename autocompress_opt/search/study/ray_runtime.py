"""Ray for the study driver: connecting to (or starting) Ray, where trials run and with what
(:func:`study_placement`), and the Ray Tune trainable that runs one trial (:func:`trainable`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autocompress_opt.search.study.config import StudyConfig
from autocompress_opt.search.study.placement import (
    Placement,
    check_visible_paths,
    cluster_nodes,
    plan_placement,
    trial_provenance,
)
from autocompress_opt.search.study.trials import run_trial

__all__ = ["TRIAL_NICENESS", "init_ray", "study_placement", "trainable", "usable_cpus", "yield_to_the_driver"]

# A trial process runs at this niceness (or above, if started there). Where the driver and the trials
# share cores (a laptop, a 2-core demo, a GPU-less head node that also runs trials), the driver's
# preparation of the targets still waiting (their seeds' candidate scores, the proxy) then goes
# before the trials of the targets already admitted, so every target starts early instead of the last
# one being ready only when the time budget ends (make demo in fp32 on 2 shared cores: rtx5080
# prepared at 515 s of a 390 s budget). Elsewhere nothing competes and it changes nothing; a trial's
# own CPU time is the same either way.
TRIAL_NICENESS = 5


def trainable(config: dict[str, Any]) -> dict[str, Any]:
    """The Ray Tune function trainable: runs one trial, never raises (errors become payload).

    While the trial runs, what it reports (:func:`~autocompress_opt.search.study.progress.report`: its
    phase, inner step, held-out KL, violation) goes to ``ray.tune.report``; a scheduler that stops
    the trial ends it inside that call (Ray's ``SystemExit``, deliberately not caught). The final
    result carries the last step and score too: Ray Tune wants the scheduler's metric in every result.
    ``config["stoppable"]`` False (a seeded baseline's point) is the scheduler's to honour
    (:func:`~.schedulers.per_target_scheduler`: judged, and stopped only once it has reported its fallback,
    the baseline's own model measured, which the study then records)."""
    from ray import tune

    from autocompress_opt.search.study.progress import SCORE, STEP, TrialProgress, reporting

    last: list[TrialProgress] = []

    def forward(progress: TrialProgress) -> None:
        if progress.fallback is not None:  # a complete result in waiting: where it was computed, as a final one
            progress = replace(progress, fallback=json.dumps({**json.loads(progress.fallback), **trial_provenance()}))
        else:
            last[:] = [progress]
        tune.report(progress.to_result())

    def final(payload: dict[str, Any]) -> dict[str, Any]:
        step, score = (last[0].inner_step, last[0].score) if last else (0, float("inf"))
        return {STEP: step, SCORE: score, "payload": json.dumps(payload)}

    try:
        yield_to_the_driver()
        check_visible_paths(config["request"])  # a clear error when this node cannot see the model
        with reporting(forward):
            result = run_trial(config["request"])
        result.update(trial_provenance())  # which Ray node ran it, on which GPUs
        return final(result)
    except Exception as exc:
        return final({"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"})


def yield_to_the_driver() -> None:
    """Raise this process's niceness to :data:`TRIAL_NICENESS` if it is below (once is enough: it
    stays); never lowers it. Where the system refuses, the process runs on as it was."""
    try:
        current = os.nice(0)
        if current < TRIAL_NICENESS:
            os.nice(TRIAL_NICENESS - current)
    except OSError:
        pass


def _plugin_paths(plugins: Sequence[str]) -> list[str]:
    """Directories that make the plugin modules importable in Ray workers."""
    import importlib

    paths = []
    for name in plugins:
        module = importlib.import_module(name)
        top = Path(module.__file__ or "").resolve().parents[len(name.split(".")) - 1]
        paths.append(str(top))
    return paths


def init_ray(address: str | None, concurrency: int | None, plugins: Sequence[str] = ()) -> None:
    """Connect to the Ray cluster at ``address`` (else at ``RAY_ADDRESS`` when set), or start a new
    local Ray with the CPUs this process may use (:func:`usable_cpus`, at least ``concurrency``) and
    this machine's GPUs; nothing when Ray is already up. Without an address the local Ray is always a
    new one (``address="local"``): Ray's own default would attach to whatever cluster another process
    on this machine last started (its ``/tmp/ray/ray_current_cluster``), a test's two-node cluster
    included. Trial workers run at this process's niceness, not Ray's default 15."""
    import logging

    import ray

    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no per-trial json/csv/tb files
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ray's raylet starts its workers at niceness 15 (RAY_worker_niceness), below the driver: on a
    # busy machine the driver's own work (preparing the next targets) and any other process would
    # starve the trials. A local Ray started here runs them at the driver's priority (an explicit
    # RAY_worker_niceness wins; a cluster started elsewhere keeps its own setting).
    os.environ.setdefault("RAY_worker_niceness", "0")  # an increment over the raylet, which has ours
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    extra = _plugin_paths(plugins)
    if extra:  # workers import plugins by name: put their directories on the workers' path
        path = os.pathsep.join(extra + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(address="local", num_cpus=max(concurrency or 1, usable_cpus()), **kwargs)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``os.sched_getaffinity``, which honours
    ``taskset``, cgroup cpusets and a Slurm/Kubernetes allocation), else ``os.cpu_count()`` where the
    platform has no affinity call (macOS); at least 1. ``os.cpu_count()`` alone counts the host's
    cores: on a shared GPU node given 16 of 128 cores, a local Ray would plan 128 CPUs of trials."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        return max(1, len(getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def study_placement(config: StudyConfig, progress: bool = False) -> Placement:
    """GPUs and CPUs per trial and trials at once, from the connected cluster's nodes (not the
    driver's cores; :func:`~autocompress_opt.search.study.placement.plan_placement`). Plan trials take 1
    CPU; weights trials share each node's cores between the trials it holds (Ray sets
    OMP_NUM_THREADS, hence torch's threads, from this)."""
    placement = plan_placement(
        cluster_nodes(),
        mode=config.mode,
        device=str(config.inner.get("device", "auto")),
        gpus_per_trial=config.gpus_per_trial,
        concurrency=config.concurrency,
    )
    if progress and (placement.gpus_per_trial or config.address):
        print(f"placement: {placement.describe()}", file=sys.stderr, flush=True)
    return placement
