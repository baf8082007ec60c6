"""The per-layer counts of the expert search (issue 43, :mod:`.experts`' "Per layer"): the budgets'
use at given counts, the projection of the learnable counts onto the point's budgets after each
step, the repair and refill of the rounded choice, and the architecture it describes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.inner.expert_cost import expert_param_totals, mamba_param_total

# The masks are an experts.ExpertMasks (not imported: experts imports this module).
ExpertMasks = Any

__all__ = ["PROJECTED", "budget_use", "layer_architecture", "project_counts", "repair_counts"]


def layer_architecture(uniform: Architecture, masks: ExpertMasks) -> Architecture:
    """``uniform`` (the point's child) with each MoE layer's expert width and top-``k`` the hard counts
    of ``masks`` (:meth:`ExpertMasks.layer_counts`; unchanged without per-layer counts)."""
    if not masks.per_layer:
        return uniform
    counts = masks.layer_counts()
    layers = list(uniform.layers)
    for j, i in enumerate(masks.moe_layers):
        moe = layers[i].moe
        assert moe is not None  # the child keeps every MoE layer of the parent
        layers[i] = replace(
            layers[i],
            moe=replace(moe, expert_width=counts["expert_width"][j], experts_per_token=counts["experts_per_token"][j]),
        )
    return replace(uniform, layers=tuple(layers))


# The budgets the per-layer counts are projected onto (project_counts) instead of priced by the Lagrangian.
PROJECTED = ("budget:expert_params", "budget:active_expert_params")


def project_counts(masks: ExpertMasks, parent: Architecture, budget: Mapping[str, float]) -> None:
    """Move the per-layer keep fractions onto the point's budgets (a no-op without per-layer counts):
    one common shift of every layer's width fraction that spends the total expert budget exactly,
    then one of every top-``k`` fraction that spends the active budget at those widths (each clamped
    to its range; bisection, as far as the clamps allow). What one step of the counts changed between
    layers survives the shift: more width in one layer is paid by every other."""
    if masks.width_keep is None or masks.topk_keep is None:
        return
    m, point = len(masks.moe_layers), masks.point
    full = lambda key: torch.full((m,), float(point[key]), dtype=torch.float64)
    shared = full("shared_width") if "shared_width" in point else None
    lo_w, lo_k = 1.0 / masks.width_size, 1.0 / masks.route_size
    with torch.no_grad():
        width, k = masks.width_keep.detach().double(), masks.topk_keep.detach().double()

        def spend(shift: float, of: str) -> float:
            w = (width + shift if of == "total" else width).clamp(lo_w, 1.0) * masks.width_size
            kk = (k + shift if of == "active" else k).clamp(lo_k, 1.0) * masks.route_size
            return float(expert_param_totals(parent, full("num_experts"), w, kk, shared)[of])

        for of, keep, lo in (("total", width, lo_w), ("active", k, lo_k)):
            target = budget["budget:expert_params" if of == "total" else "budget:active_expert_params"]
            low, high = -1.0, 1.0
            for _ in range(48):
                mid = (low + high) / 2
                low, high = (mid, high) if spend(mid, of) <= target else (low, mid)
            keep.copy_((keep + low).clamp(lo, 1.0))
        masks.width_keep.copy_(width.to(masks.width_keep.dtype))
        masks.topk_keep.copy_(k.to(masks.topk_keep.dtype))


def repair_counts(masks: ExpertMasks, parent: Architecture, budget: Mapping[str, float]) -> int:
    """Bring a per-layer choice whose rounding overshoots the point's parameter budgets back inside
    them, one unit at a time: the total budget by the expert width of the layer rounded up most (its
    fraction furthest below its hard count), the active budget likewise by a top-``k`` (then a
    width where every top-``k`` is 1); then, while both budgets still hold, a unit back to the
    layer rounded down most (width first, then top-``k``). Returns the units removed (0 without
    per-layer counts)."""
    if masks.width_keep is None or masks.topk_keep is None:
        return 0
    steps = 0
    with torch.no_grad():
        while True:
            use = budget_use(masks, parent, budget, masks.expected(0.0, hard=True))
            over = [k for k in PROJECTED if float(use[k]) > 1e-9]
            if not over:
                _fill_counts(masks, parent, budget)
                return steps
            counts = masks.layer_counts()
            keep, size, key = masks.width_keep, masks.width_size, "expert_width"
            if over[0] == "budget:active_expert_params" and max(counts["experts_per_token"]) > 1:
                keep, size, key = masks.topk_keep, masks.route_size, "experts_per_token"
            hard = torch.tensor(counts[key], dtype=keep.dtype, device=keep.device)
            up = torch.where(hard > 1, hard - keep * size, torch.full_like(hard, -math.inf))
            if not bool(torch.isfinite(up).any()):
                raise ConfigError(f"the per-layer counts cannot meet {over[0]}: every layer is at its minimum")
            j = int(torch.argmax(up))
            keep[j] = (hard[j] - 1) / size
            steps += 1


def _fill_counts(masks: ExpertMasks, parent: Architecture, budget: Mapping[str, float]) -> None:
    """Give a unit back to the layer whose fraction sits furthest above its hard count while the
    budgets hold (a choice that rounded down everywhere leaves budget unspent)."""
    for keep, size, key in (
        (masks.width_keep, masks.width_size, "expert_width"),
        (masks.topk_keep, masks.route_size, "experts_per_token"),
    ):
        assert keep is not None  # per-layer counts (repair_counts' check)
        while True:
            hard = torch.tensor(masks.layer_counts()[key], dtype=keep.dtype, device=keep.device)
            down = torch.where(hard < size, keep * size - hard, torch.full_like(hard, -math.inf))
            if not bool((down > 0).any()):
                break
            j, was = int(torch.argmax(down)), keep.detach().clone()
            keep[j] = (hard[j] + 1) / size
            use = budget_use(masks, parent, budget, masks.expected(0.0, hard=True))
            if any(float(use[k]) > 1e-9 for k in PROJECTED):
                keep.copy_(was)
                keep[j] = hard[j] / size  # settled at its hard count: not tried again


def budget_use(
    masks: ExpertMasks, parent: Architecture, budget: Mapping[str, float], counts: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Each budget's relative excess (``used / budget - 1``) at the expected ``counts``."""
    shared = counts["shared_width"].double() if "shared_width" in counts else None
    k = counts["experts_per_token"].double() if "experts_per_token" in counts else masks.point["experts_per_token"]
    totals = expert_param_totals(parent, counts["num_experts"].double(), counts["expert_width"].double(), k, shared)
    out = {
        "budget:expert_params": totals["total"] / budget["budget:expert_params"] - 1,
        "budget:active_expert_params": totals["active"] / budget["budget:active_expert_params"] - 1,
    }
    if "mamba_heads" in counts:
        mamba = mamba_param_total(parent, counts["mamba_heads"].double())
        out["budget:mamba_params"] = mamba / budget["budget:mamba_params"] - 1
    return out
