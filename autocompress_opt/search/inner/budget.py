"""What one inner search must meet: the outer trial's global choices as budgets (:class:`Budget`),
the target's hardware constraints (:class:`CostGoal`), and the bridge from (expected) per-layer
structure to the cost model's arrays (:func:`cost_arrays`), exact at a discrete point.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_sparse
from autocompress_opt.errors import ConfigError, check_int
from autocompress_opt.search.inner.relaxation import ExpectedStructure
from autocompress_opt.serving.costmodel import (
    FULL_WINDOW,
    ArchArrays,
    LayerSums,
    LayerTerms,
    Scenario,
    estimate_batch,
    estimate_from_sums,
    layer_terms,
    max_concurrency_from_sums,
)
from autocompress_opt.serving.engine_models import Engine
from autocompress_opt.serving.targets import Target, parent_metrics

__all__ = [
    "Budget",
    "CostGoal",
    "cost_arrays",
    "cost_dtype",
    "exact_violations",
    "expected_of",
    "expected_totals",
    "totals_of",
]


# ----------------------------------------------------------------------------- budget
@dataclass(frozen=True)
class Budget:
    """The outer trial's global choices, as budgets on the per-layer allocation.

    ``num_layers`` bounds the kept *layer equivalents*: kept sub-blocks (attention, FFN) count
    half a layer each, so ``num_layers`` full layers meet it exactly, and so do, e.g., two fewer
    attention blocks and two more FFN blocks (an attention-only or FFN-only layer is half a layer
    of depth). ``ffn_width``, ``num_kv_heads`` and ``num_kv_heads · q_per_kv`` bound the *mean*
    FFN width, KV heads and query heads over ``num_layers`` layers — i.e. totals ``num_layers · x``.
    The uniform allocation meets every budget exactly, and the search may move depth between
    sub-blocks and width between layers. ``hidden_size`` is fixed, not a bound.
    """

    num_layers: int
    hidden_size: int
    ffn_width: int
    num_kv_heads: int
    q_per_kv: int

    def __post_init__(self) -> None:
        for f in fields(self):
            check_int(getattr(self, f.name), f"Budget.{f.name}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Budget:
        """From a search-space point (``num_layers``, ``hidden_size``, ``ffn_width``, ``num_kv_heads``,
        ``q_per_kv``)."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in params]
        if missing:
            raise ConfigError(f"search-space point lacks {', '.join(missing)}")
        return cls(**{n: int(params[n]) for n in names})

    @classmethod
    def of(cls, parent: Architecture) -> Budget:
        """Budgets that never bind: the parent's active layers and its widest layer's sizes."""
        attn = [s for s in parent.layers if s.attention]
        return cls(
            num_layers=parent.num_active_layers,
            hidden_size=parent.hidden_size,
            ffn_width=max((s.ffn_width for s in parent.layers), default=1) or 1,
            num_kv_heads=max((s.num_kv_heads for s in attn), default=1),
            q_per_kv=max((s.num_heads // s.num_kv_heads for s in attn), default=1),
        )

    def limits(self) -> dict[str, float]:
        """Totals over the whole stack: kept layers, FFN channels, query heads, KV heads."""
        n = self.num_layers
        return {
            "budget:num_layers": n,
            "budget:ffn_width": n * self.ffn_width,
            "budget:num_heads": n * self.num_kv_heads * self.q_per_kv,
            "budget:num_kv_heads": n * self.num_kv_heads,
        }

    def violations(self, totals: Mapping[str, Any]) -> dict[str, Any]:
        """Normalised ``(total - limit) / limit`` per budget (floats or tensors), ``<= 0`` within."""
        return {k: (totals[k] - lim) / lim for k, lim in self.limits().items()}


def totals_of(arch: Architecture) -> dict[str, float]:
    return {
        "budget:num_layers": sum(s.attention + s.ffn for s in arch.layers) / 2,
        "budget:ffn_width": sum(s.ffn_width for s in arch.layers if s.ffn),
        "budget:num_heads": sum(s.num_heads for s in arch.layers if s.attention),
        "budget:num_kv_heads": sum(s.num_kv_heads for s in arch.layers if s.attention),
    }


def expected_totals(e: ExpectedStructure) -> dict[str, torch.Tensor]:
    return {
        "budget:num_layers": (e.attn.sum() + e.ffn.sum()) / 2,
        "budget:ffn_width": (e.ffn * e.ffn_width).sum(),
        "budget:num_heads": (e.attn * e.heads).sum(),
        "budget:num_kv_heads": (e.attn * e.kv_heads).sum(),
    }


# ------------------------------------------------------------------------------ cost
@dataclass(frozen=True)
class CostGoal:
    """A target's hardware constraints (:meth:`Target.violations`: the workload's, relative to
    ``parent_metrics``, plus device fit) with the parent's metrics bound, for the inner search."""

    target: Target
    parent_metrics: Mapping[str, float]
    sparse: bool = False  # the parent has MoE or Mamba-2 layers: pessimistic bounds from those rows' residuals

    @classmethod
    def for_target(cls, target: Target, parent: Architecture) -> CostGoal:
        return cls(target, parent_metrics(parent, target), is_sparse(parent))

    def metrics(self, arrays: ArchArrays) -> dict[str, Any]:
        """The cost metrics of ``arrays`` (numpy or torch) in the target's scenario that
        :meth:`violations` reads: every metric, less the roofline floors unless the target's
        ``confidence`` bounds latencies by them (no constraint names a floor)."""
        t = self.target
        return estimate_batch(arrays, t.hardware, self._engine, self._scenario, floors=t.confidence is not None)

    def layer_terms(self, arrays: ArchArrays) -> LayerTerms:
        """Each layer's own cost terms of ``arrays`` in the target's scenario (:func:`layer_terms`)."""
        return layer_terms(arrays, self._engine, self._scenario)

    def metrics_of_sums(self, arrays: ArchArrays, sums: LayerSums) -> dict[str, Any]:
        """:meth:`metrics` from sums over layers (:func:`estimate_from_sums`): the same equations,
        equal to :meth:`metrics` up to the rounding of the sums."""
        t = self.target
        return estimate_from_sums(
            arrays, sums, t.hardware, self._engine, self._scenario, floors=t.confidence is not None
        )

    def max_concurrency_of_sums(self, arrays: ArchArrays, sums: LayerSums) -> Any:
        """The ``max_concurrency`` :meth:`metrics_of_sums` would give (memory only)."""
        return max_concurrency_from_sums(arrays, sums, self.target.hardware, self._engine, self._scenario)

    @property
    def additive(self) -> bool:
        """Whether a batch's costs follow from its sums at a few batch sizes: every arrival but
        ``poisson``, whose Little's-law batch differs with every candidate."""
        return self._scenario.arrival != "poisson"

    @cached_property
    def _engine(self) -> Engine:  # resolved once: a registry look-up per cost-model call adds up in discretise
        return self.target.engine_obj()

    @cached_property
    def _scenario(self) -> Scenario:
        return self.target.scenario()

    def violations(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`Target.violations` of ``metrics`` (floats, numpy or torch arrays) against this parent;
        ``<= 0`` feasible."""
        return self.target.violations(metrics, self.parent_metrics, self.sparse)


def cost_dtype(device: torch.device | str) -> torch.dtype:
    """The float dtype of the differentiable cost and the Lagrangian terms on ``device``.

    float64 on the CPU, where the search ran in float64 before its masks moved to the parent's
    device: float32 there changes the per-step penalties in their last digits (the recorded step
    history), though on the tiny seeded searches not which architecture comes out. float32 on an
    accelerator, where float64 is slow or absent (Apple's MPS has none). Either way the exact
    cost model (:func:`exact_violations`, numpy float64) judges feasibility.
    """
    return torch.float64 if torch.device(device).type == "cpu" else torch.float32


def cost_arrays(
    parent: Architecture, hidden_size: int, e: ExpectedStructure, dtype: torch.dtype | None = None
) -> ArchArrays:
    """A batch of one torch :class:`ArchArrays` from expected per-layer structure, on ``e``'s device
    in ``dtype`` (default :func:`cost_dtype` of that device: float64 on the CPU).

    At a discrete point (gates 0/1, integer widths) it packs exactly what
    ``ArchArrays.from_architectures`` packs for that architecture, so the two agree. Windows are
    the parent layers' (a constant: the search never changes a layer's attention kind).
    """
    device = e.attn.device
    dtype = dtype or cost_dtype(device)
    one = lambda v: torch.tensor([float(v)], dtype=dtype, device=device)
    per_layer = lambda v: torch.tensor([v], dtype=dtype, device=device)  # (1, L) constants
    row = lambda x: x.to(dtype)[None, :]
    attn, ffn = row(e.attn), row(e.ffn)
    return ArchArrays(
        vocab=one(parent.vocab_size),
        hidden=one(hidden_size),
        tied=one(parent.tie_embeddings),
        attn=attn,
        heads=row(e.heads) * (attn > 0),
        kv_heads=row(e.kv_heads) * (attn > 0),
        head_dim=per_layer([float(s.head_dim) for s in parent.layers]) * (attn > 0),
        ffn=ffn,
        ffn_width=row(e.ffn_width) * (ffn > 0),
        qkv_bias=one(parent.qkv_bias),
        o_bias=one(parent.o_bias),
        mlp_bias=one(parent.mlp_bias),
        qk_norm=one(parent.qk_norm),
        window=per_layer([float(s.window or FULL_WINDOW) for s in parent.layers]),
    )


def expected_of(arch: Architecture) -> ExpectedStructure:
    """The (degenerate) expected structure of a discrete architecture: gates 0/1, exact widths
    (float64, on the CPU)."""
    t = lambda v: torch.tensor(v, dtype=torch.float64)
    return ExpectedStructure(
        attn=t([float(s.attention) for s in arch.layers]),
        ffn=t([float(s.ffn) for s in arch.layers]),
        heads=t([float(s.num_heads) for s in arch.layers]),
        kv_heads=t([float(s.num_kv_heads) for s in arch.layers]),
        ffn_width=t([float(s.ffn_width) for s in arch.layers]),
    )


def exact_violations(
    arch: Architecture, budget: Budget, goal: CostGoal | None
) -> tuple[dict[str, float], dict[str, float]]:
    """``(violations, metrics)`` of ``arch``: the budgets, then the target's constraints by the exact
    scalar cost model (:meth:`Target.check`; no metrics without a goal)."""
    out = {k: float(v) for k, v in budget.violations(totals_of(arch)).items()}
    metrics: dict[str, float] = {}
    if goal is not None:
        hardware, metrics = goal.target.check(arch, goal.parent_metrics)
        out.update(hardware)
    return out, metrics
