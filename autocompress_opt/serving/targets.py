"""Targets: where and how a pruned model will be served (hardware x workload x engine x
constraints), the parent's cost there, and *the* feasibility check.

One Optuna study per target; the target's constraints come from its workload, overridden or extended
by the target's own (``{"tpot_ms": "0.6x"}``, relative to the parent). :meth:`Target.violations` is
the one implementation of "is this architecture feasible here": the workload's constraints (relative
ones scaled by the parent's metrics) plus :data:`FITS_DEVICE`. The study driver, the inner search's
:class:`~autocompress_opt.search.inner.budget.CostGoal` and the benchmarks all call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_sparse
from autocompress_opt.errors import check_fraction, reject_unknown_keys
from autocompress_opt.serving.costmodel import Scenario, cost_intervals, estimate_cost
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.hardware import get_hardware
from autocompress_opt.serving.profiles import get_profile
from autocompress_opt.serving.workloads import Workload, get_workload

__all__ = ["FITS_DEVICE", "Target", "all_satisfied", "device_fit_violation", "parent_metrics"]


@dataclass(frozen=True)
class Target:
    """Where and how the pruned model will be served; one Optuna study per target.

    ``constraints`` overrides or adds to the workload's (``{"tpot_ms": "0.6x"}``); ``None``
    fields take the workload's defaults.

    ``confidence`` (e.g. 0.9; None = judge the median prediction) makes every latency and
    throughput constraint bind at the pessimistic end of the prediction's interval at that
    confidence (:func:`~autocompress_opt.serving.costmodel.cost_intervals`: the held-out residuals of
    the engine's profile in this regime): a candidate's TTFT/TPOT/E2E are judged at their high
    end, its throughput at its low end. The limits themselves stay fixed: a relative limit
    (``0.6x``) scales the parent's *median* prediction. Memory has no interval.
    """

    hardware: str
    workload: str
    engine: str | None = None
    dtype: str | None = None
    tp: int = 1
    input_len: int | None = None
    output_len: int | None = None
    concurrency: int | str | None = None
    constraints: Mapping[str, str] = field(default_factory=dict)
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    confidence: float | None = None

    def __post_init__(self) -> None:
        get_hardware(self.hardware)
        check_fraction(self.confidence, "target confidence", one=False, hint="e.g. 0.9", also=(None,))
        self.resolved_workload()  # validates names and constraint strings
        self.scenario()

    def resolved_workload(self) -> Workload:
        return get_workload(self.workload).with_constraints(dict(self.constraints))

    @property
    def engine_name(self) -> str:
        return self.engine or get_workload(self.workload).engine

    def scenario(self) -> Scenario:
        return get_workload(self.workload).scenario(
            dtype=self.dtype,
            tp=self.tp,
            input_len=self.input_len,
            output_len=self.output_len,
            concurrency=self.concurrency,
        )

    def engine_obj(self) -> Any:
        return get_engine(self.engine_name).with_options(**dict(self.engine_options))

    def cost_metrics(self, arch: Architecture) -> dict[str, float]:
        """Every cost metric of ``arch`` served here, by the exact scalar cost model (:func:`estimate_cost`)."""
        return estimate_cost(arch, self.hardware, self.engine_obj(), self.scenario()).to_dict()

    def violations(
        self, metrics: Mapping[str, Any], parent_metrics: Mapping[str, float], sparse: bool = False
    ) -> dict[str, Any]:
        """Normalised violation of every constraint of this target; ``<= 0`` means satisfied.

        ``metrics``: cost metrics of one or many architectures — floats, or numpy / torch arrays of
        one shape (e.g. ``estimate_batch`` output; torch stays differentiable). ``parent_metrics``:
        the parent's metrics here (:func:`parent_metrics`), the reference of relative constraints.
        Returns, in this order, one entry per workload constraint, keyed by its text
        (``"tpot_ms <= 0.6x"``: ``(value - limit) / limit``, or ``(limit - value) / limit`` for a
        lower bound), then :data:`FITS_DEVICE` (:func:`device_fit_violation`). Values have the type
        and shape of ``metrics``' values. An architecture is feasible when every value is ``<= 0``.
        ``sparse``: the architectures have MoE or Mamba-2 layers (their pessimistic bound takes the
        MoE rows' residuals, :meth:`pessimistic`). Pure.
        """
        judged = self.pessimistic(metrics, sparse)
        out = dict(self.resolved_workload().violations(judged, parent_metrics))
        out[FITS_DEVICE] = device_fit_violation(metrics, self)
        return out

    def pessimistic(self, metrics: Mapping[str, Any], sparse: bool = False) -> Mapping[str, Any]:
        """``metrics`` with TTFT/TPOT/E2E at the high and output throughput at the low end of their
        interval at :attr:`confidence` (unchanged when it is None, or the engine's profile holds
        no residuals); a ``sparse`` model's from the MoE/hybrid rows' held-out residuals, a dense
        one's from the dense rows' (:meth:`CostProfile.interval`). Floats, numpy and torch arrays
        alike (a constant factor per metric)."""
        if self.confidence is None:
            return metrics
        profile = get_profile(self.engine_name, get_hardware(self.hardware).name)
        bounds = cost_intervals(metrics, self.scenario(), profile, self.confidence, sparse=sparse)
        worse = dict(metrics)
        for metric in ("ttft_ms", "tpot_ms", "e2e_latency_ms", "output_throughput_tok_s"):
            end = f"{metric}_high" if metric.endswith("_ms") else f"{metric}_low"
            if bounds.get(end) is not None:
                worse[metric] = bounds[end]
        return worse

    def check(
        self, arch: Architecture, parent_metrics: Mapping[str, float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """``(violations, metrics)`` of one architecture by the exact cost model: :meth:`violations`
        (as floats) of :meth:`cost_metrics`. Feasible when :func:`all_satisfied` ``(violations)``."""
        metrics = self.cost_metrics(arch)
        violations = self.violations(metrics, parent_metrics, sparse=is_sparse(arch))
        return {k: float(v) for k, v in violations.items()}, metrics

    def feasible(self, arch: Architecture, parent_metrics: Mapping[str, float]) -> bool:
        """Whether ``arch`` meets every constraint of this target: :func:`all_satisfied` of :meth:`check`."""
        return all_satisfied(self.check(arch, parent_metrics)[0])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["constraints"] = dict(self.constraints)
        data["engine_options"] = dict(self.engine_options)
        if self.confidence is None:  # absent, so targets written before the field read back the same
            del data["confidence"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        reject_unknown_keys(data, cls.__dataclass_fields__, "a target")
        return cls(**data)


FITS_DEVICE = "fits device memory"


def all_satisfied(violations: Mapping[str, float]) -> bool:
    """The one feasibility rule: every normalised violation (:meth:`Target.violations`, budgets
    alike) is ``<= 0``. An empty mapping is satisfied."""
    return all(v <= 0 for v in violations.values())


def device_fit_violation(metrics: Mapping[str, Any], target: Target) -> Any:
    """Normalised violation of "the model, its KV cache and activations fit the device":
    ``peak_memory_gib / (device memory · engine memory fraction) - 1`` (<= 0 fits); at least +1
    when not one sequence fits (``max_concurrency < 1``).

    Elementwise on floats and on numpy / torch arrays (the result has their type and shape; torch
    keeps gradients where the memory term is returned)."""
    engine = target.engine_obj()
    budget = get_hardware(target.hardware).memory_gib * (
        engine.memory_fraction if engine.memory_policy != "dynamic" else 1.0
    )
    over = metrics["peak_memory_gib"] / budget - 1
    none_fits = metrics["max_concurrency"] < 1
    if hasattr(none_fits, "logical_not"):  # torch tensors (this module does not import torch)
        return over.clamp(min=1.0).where(none_fits, over)
    if np.ndim(over) or np.ndim(none_fits):
        return np.where(none_fits, np.maximum(over, 1.0), over)
    return max(over, 1.0) if none_fits else over


def parent_metrics(parent: Architecture, target: Target) -> dict[str, float]:
    """The parent's cost in the target scenario: the reference of relative constraints."""
    return target.cost_metrics(parent)
