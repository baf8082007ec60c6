"""Where a study's trials run on a Ray cluster, and what they need to find on whichever node runs them.

The driver decides, once Ray is up and before any study is created (:func:`plan_placement`):

- **GPUs per trial** ``G`` (``--gpus-per-trial``): a fraction shares one GPU between trials of a
  small parent (0.5: two per GPU); a whole number ``k > 1`` reserves ``k`` GPUs of one node as one
  placement-group bundle (:meth:`Placement.resources`) for a parent that does not fit one GPU. The
  trainable runs in the placement group's first bundle and Ray makes only that bundle's GPUs visible
  to it, so the ``k`` GPUs are one bundle, not ``k`` bundles of one. Default: 1 in weights mode on a
  cluster with GPUs (unless the trials' device is ``cpu``), else 0.
- **Trials at once** (``--parallel``): default the number of trials the cluster's GPUs hold
  (``cluster GPUs / G``, counted node by node) when ``G > 0``, else 1.
- **CPUs per trial**: the most CPUs such that every node that can host a trial (enough GPUs, at
  least one CPU) hosts one, and the cluster holds ``--parallel`` trials at once. Counted from the
  cluster's nodes (``ray.nodes()``), never from the driver's cores: a worker with fewer cores than
  the driver would otherwise never be offered a trial. Ray sets each trial's ``OMP_NUM_THREADS``
  (hence torch's threads) from it.

In the trial (:func:`trial_device`, :func:`trial_gpus`, :func:`check_visible_paths`,
:func:`trial_provenance`): Ray sets ``CUDA_VISIBLE_DEVICES`` to the GPUs it assigned, so a trial's
``auto``/``cuda`` device is ``cuda:0``, the first of them, and a trial given ``k > 1`` GPUs spreads
its parent over all ``k`` (``load_model(..., gpus=k)``); the assigned ids are recorded with the
result. Paths in the request are made absolute in the driver (:func:`driver_path`) because trials
run in Ray's own working directory; a node that cannot see one fails the trial with an error naming
the node and the path.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DRIVER_DEVICE",
    "NodeResources",
    "Placement",
    "assigned_gpus",
    "check_cache_dir",
    "check_driver_device",
    "check_gpus_per_trial",
    "check_trial_gpus",
    "check_visible_paths",
    "cluster_nodes",
    "driver_cache_dir",
    "driver_compute_dtype",
    "driver_path",
    "plan_placement",
    "trial_device",
    "trial_gpus",
    "trial_provenance",
    "trials_on_gpus",
]

_log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = ".autocompress"  # importance, teacher log-probs and quality caches, below the driver's cwd
DRIVER_DEVICE = "cpu"  # where the driver reads the parent (seeds, proxy) unless the user names a GPU


# ------------------------------------------------------------------ in the driver
@dataclass(frozen=True)
class NodeResources:
    """One alive Ray node: its id, address, and logical CPUs and GPUs."""

    node_id: str
    address: str
    cpus: float
    gpus: float

    def __str__(self) -> str:
        return f"{self.address} ({self.cpus:g} CPUs, {self.gpus:g} GPUs)"


def cluster_nodes() -> list[NodeResources]:
    """The alive nodes of the Ray cluster this process is connected to (``ray.nodes()``)."""
    import ray

    return [
        NodeResources(
            str(n.get("NodeID", "")),
            str(n.get("NodeManagerAddress", "?")),
            float(n.get("Resources", {}).get("CPU", 0.0)),
            float(n.get("Resources", {}).get("GPU", 0.0)),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


def check_gpus_per_trial(value: Any) -> float | None:
    """``value`` as GPUs per trial: None (unset: :func:`plan_placement` chooses), a fraction in
    (0, 1], or a whole number of GPUs; anything else is a :class:`ConfigError` naming it."""
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise ConfigError(
            f"gpus_per_trial must be a number > 0 (a fraction such as 0.5 shares a GPU, a whole number k "
            f"reserves k GPUs of one node), got {value!r}; for trials on the CPU leave it unset and use --device cpu"
        )
    if value > 1 and value != int(value):
        raise ConfigError(
            f"gpus_per_trial {value!r}: above 1 it must be a whole number of GPUs (2, 4, 8: one node's GPUs "
            "for a parent that does not fit one), or a fraction up to 1"
        )
    return float(value)


def check_trial_gpus(mode: str, inner: Mapping[str, Any], gpus_per_trial: float | None) -> float | None:
    """``gpus_per_trial`` checked (:func:`check_gpus_per_trial`) against the trial mode and the
    trials' requested device (``inner["device"]``): plan-mode trials are arithmetic and take no GPU;
    weights trials on the CPU take none; an explicit ``cuda:N`` must be one of the trial's own GPUs
    (Ray shows a trial its assigned GPUs as ``cuda:0`` onwards)."""
    gpus = check_gpus_per_trial(gpus_per_trial)
    if not gpus:
        return gpus
    if mode == "plan":
        raise ConfigError(
            f"gpus_per_trial {gpus:g}: plan-mode trials are cost-model arithmetic and use no GPU; "
            "drop it or use --mode weights"
        )
    device = str(inner.get("device", "auto")).strip().lower()
    if device == "cpu":
        raise ConfigError(f"gpus_per_trial {gpus:g} with device cpu: the trials would hold GPUs they never use")
    index = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
    if index >= max(1, int(gpus)):
        raise ConfigError(
            f"device {device!r} with gpus_per_trial {gpus:g}: under Ray a trial sees only its own GPUs, as "
            f"cuda:0..cuda:{max(1, int(gpus)) - 1}; use --device auto"
        )
    return gpus


def check_cache_dir(cache_dir: Any) -> str | None:
    """``cache_dir`` (None: :data:`DEFAULT_CACHE_DIR`) as a string, or a :class:`ConfigError` when it
    is not a non-empty path or names an existing file."""
    if cache_dir is None:
        return None
    if not isinstance(cache_dir, (str, Path)) or not str(cache_dir).strip():
        raise ConfigError(f"cache_dir must be a directory path, got {cache_dir!r}")
    if Path(cache_dir).expanduser().is_file():
        raise ConfigError(f"cache_dir {str(cache_dir)!r} is a file; it must be a directory (created if missing)")
    return str(cache_dir)


def driver_cache_dir(cache_dir: str | None) -> str:
    """The absolute cache directory the trials get (trials run in Ray's own working directory)."""
    return str(Path(cache_dir or DEFAULT_CACHE_DIR).expanduser().resolve())


@dataclass(frozen=True)
class Placement:
    """What every trial of a run asks Ray for, and how many run at once."""

    gpus_per_trial: float  # 0: CPU only
    cpus_per_trial: int
    concurrency: int
    capacity: int  # trials the cluster holds at once with these resources

    def resources(self) -> Any:
        """The argument of ``tune.with_resources``: ``{"cpu": c[, "gpu": G]}`` for ``G <= 1``; for
        ``k > 1`` GPUs a placement group of one bundle of ``k`` GPUs and ``c`` CPUs (one node)."""
        if self.gpus_per_trial <= 1:
            out: dict[str, float] = {"cpu": self.cpus_per_trial}
            if self.gpus_per_trial:
                out["gpu"] = self.gpus_per_trial
            return out
        from ray import tune

        return tune.PlacementGroupFactory(
            [{"CPU": self.cpus_per_trial, "GPU": int(self.gpus_per_trial)}], strategy="STRICT_PACK"
        )

    def describe(self) -> str:
        """``"2 trials at once, each 1 GPU and 8 CPUs"``."""
        plural = lambda n, word: f"{n:g} {word}{'s' if n > 1 else ''}"
        gpus = plural(self.gpus_per_trial, "GPU") + " and " if self.gpus_per_trial else ""
        return f"{plural(self.concurrency, 'trial')} at once, each {gpus}{plural(self.cpus_per_trial, 'CPU')}"


def plan_placement(
    nodes: Sequence[NodeResources],
    *,
    mode: str,
    device: str = "auto",
    gpus_per_trial: float | None = None,
    concurrency: int | None = None,
) -> Placement:
    """GPUs and CPUs per trial and trials at once on a cluster of ``nodes`` (module doc).

    ``device`` is the trials' requested device (``inner.device``); ``gpus_per_trial`` and
    ``concurrency`` None mean the defaults. Pure: the same nodes give the same placement. Raises
    :class:`ConfigError` when no node can host a trial (``G`` more GPUs than any one node has)."""
    cluster_gpus = sum(n.gpus for n in nodes)
    if gpus_per_trial is None:
        gpus = 1.0 if mode == "weights" and cluster_gpus > 0 and device != "cpu" else 0.0
    else:
        gpus = check_gpus_per_trial(gpus_per_trial) or 0.0
    listing = "; ".join(str(n) for n in nodes) or "none"
    hosts = [n for n in nodes if n.cpus >= 1 and (gpus == 0 or n.gpus + 1e-9 >= gpus)]
    if not hosts:
        if gpus and cluster_gpus == 0:
            raise ConfigError(
                f"gpus_per_trial {gpus:g}, but the Ray cluster has no GPU (nodes: {listing}); "
                "leave --gpus-per-trial unset to run the trials on CPUs"
            )
        if gpus:
            most = max(n.gpus for n in nodes)
            raise ConfigError(
                f"gpus_per_trial {gpus:g}: no node of the Ray cluster has {gpus:g} GPUs and a CPU (nodes: {listing}); "
                f"a trial's GPUs are on one node, so at most {most:g}"
            )
        raise ConfigError(f"no alive node of the Ray cluster has a CPU to run a trial on (nodes: {listing})")
    # trials each host holds by its GPUs (by its CPUs only, when trials take no GPU)
    slots = [math.floor(n.gpus / gpus + 1e-9) if gpus else int(n.cpus) for n in hosts]
    capacity = sum(slots)
    wanted = concurrency if concurrency is not None else (capacity if gpus else 1)
    if gpus and wanted > capacity:
        _log.warning(
            "--parallel %d: the cluster holds %d trials of %g GPU(s) at once; the others wait", wanted, capacity, gpus
        )
    return Placement(gpus, 1 if mode == "plan" else _cpus_per_trial(hosts, slots, wanted), wanted, capacity)


def _cpus_per_trial(hosts: Sequence[NodeResources], slots: Sequence[int], concurrency: int) -> int:
    """The most CPUs c (at most the smallest host's) with which the hosts hold ``concurrency``
    trials at once, each host at most its ``slots``; 1 when even c = 1 does not reach it."""
    for c in range(int(min(n.cpus for n in hosts)), 0, -1):
        if sum(min(s, int(n.cpus) // c) for n, s in zip(hosts, slots)) >= concurrency:
            return c
    return 1


def check_driver_device(value: Any) -> str:
    """``value`` (None: :data:`DRIVER_DEVICE`) as the device the driver reads the parent on: ``cpu``,
    ``cuda`` or ``cuda:N`` of the driver's own GPUs; a :class:`ConfigError` naming it otherwise
    (``auto`` too: the driver uses a GPU only when asked)."""
    if value is None:
        return DRIVER_DEVICE
    text = str(value).strip().lower()
    index = text.partition(":")[2]
    if text not in ("cpu", "cuda") and not (text.startswith("cuda:") and index.isdigit()):
        raise ConfigError(
            f"driver_device {value!r} is not one of cpu, cuda, cuda:N: the driver reads the parent (baseline "
            "seeds, proxy) on the CPU unless a GPU of its own is named; the trials use the GPUs Ray assigns them"
        )
    return text


def trials_on_gpus(device: str, gpus_per_trial: float | None, placement: Placement | None = None) -> bool | None:
    """Whether a weights study's trials compute on GPUs: from ``placement`` once planned; before,
    False for trials on the CPU (``device`` ``cpu``), True when ``gpus_per_trial`` is set, else
    None (it depends on the cluster's GPUs, :func:`plan_placement`)."""
    if str(device).strip().lower() == "cpu":
        return False
    if placement is not None:
        return placement.gpus_per_trial > 0
    return True if gpus_per_trial else None


def driver_compute_dtype(compute_dtype: str, gpu_trials: bool) -> str:
    """The compute dtype the driver reads the parent in, wherever it reads it: the trials' own, so
    that the importance it estimates is the cache entry the trials then read (the parent's id, which
    keys that cache, names its dtype). ``auto`` and ``fast`` on GPU trials are bf16 (what they give
    on an Ampere or later GPU); ``auto`` on CPU trials fp32 (also for a driver on a GPU); otherwise
    ``compute_dtype`` unchanged (the driver's CPU standing for the workers' where ``fast`` asks)."""
    text = str(compute_dtype).strip().lower()
    if text in ("auto", "fast") and gpu_trials:
        return "bf16"
    return "fp32" if text == "auto" else text


def driver_path(ref: str) -> str:
    """``ref`` made absolute when it names a path that exists here (the driver), else unchanged (a
    known model name, a Hugging Face id): trials run in Ray's own working directory, maybe on
    another node, where a relative path means nothing."""
    path = Path(ref).expanduser()
    return str(path.resolve()) if path.exists() else ref


# ------------------------------------------------------------------ in the trial
def _ray() -> Any:
    """The ``ray`` module when this process already imported it and is connected, else None (a
    trial run outside Ray, e.g. by a test, never imports Ray for nothing). A module another thread is
    still importing (the driver starts Ray while its parent-loading thread asks: seeding's preload)
    has no ``is_initialized`` yet: not connected."""
    ray = sys.modules.get("ray")
    connected = getattr(ray, "is_initialized", None)
    return ray if connected is not None and connected() else None


def assigned_gpus() -> list[str]:
    """The ids of the GPUs Ray assigned to this task or actor ([] outside Ray or without GPUs)."""
    ray = _ray()
    if ray is None:
        return []
    try:
        return [str(i) for i in ray.get_gpu_ids()]
    except Exception:  # the driver, or a worker being shut down
        return []


def trial_device(requested: str) -> str:
    """The device a trial computes on: ``cuda:0`` (the first GPU Ray assigned; Ray's
    ``CUDA_VISIBLE_DEVICES`` shows the trial only its own) when Ray assigned GPUs and ``requested``
    is ``auto`` or ``cuda``; ``requested`` otherwise (``cpu``, or an explicit ``cuda:N`` counted
    among the assigned GPUs)."""
    if str(requested).strip().lower() in ("auto", "cuda") and assigned_gpus():
        return "cuda:0"
    return requested


def trial_gpus(device: Any) -> int:
    """How many GPUs the trial's parent is spread over: every GPU Ray assigned when there are
    several and the trial computes on the first (``cuda:0``, what :func:`trial_device` gives), else
    1 (the CPU, a fraction of one GPU, one GPU, or an explicit other ``cuda:N``)."""
    gpus = len(assigned_gpus())
    return gpus if gpus > 1 and str(device) == "cuda:0" else 1


def _node_name() -> str:
    ray = _ray()
    node = ray.get_runtime_context().get_node_id()[:12] if ray is not None else "-"
    return f"{socket.gethostname()} (Ray node {node})"


def check_visible_paths(request: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming this node and the path when the request names a path the
    driver saw (made absolute there) that this node cannot: the parent model (except in plan mode,
    which never loads it) and the importance record."""
    paths = [("importance record", request.get("importance"))]
    if request.get("mode", "plan") != "plan":
        paths.insert(0, ("model", request.get("parent_model")))
    for what, path in paths:
        if path and os.path.isabs(str(path)) and not Path(str(path)).exists():
            raise ConfigError(
                f"node {_node_name()} cannot see the {what} path {path!r} that the driver loaded; put it on storage "
                "mounted at the same path on every node, or pass a model name the nodes can download"
            )


def trial_provenance() -> dict[str, Any]:
    """What a trial's result records about where it ran: the Ray node id and the GPU ids Ray assigned."""
    ray = _ray()
    return {
        "node": ray.get_runtime_context().get_node_id() if ray is not None else None,
        "gpu_ids": assigned_gpus(),
    }
