"""Per-layer sizes without weights: where a plan's uniform cut of one kind of sub-block should fall,
layer by layer, for the same total, by the quality estimate's layer profile.

Plan mode samples one size per kind (:func:`~autocompress_opt.arch.hybrid.hybrid_child`). With a
layer profile (:class:`~autocompress_opt.quality.estimate.LayerProfile`) the estimate prices each
layer's cut on its own curve ``k_l · c ** p_l``. For the same mean cut, their sum is least where
``k_l p_l c_l ** (p_l − 1)`` is equal across the layers (convex curves: less cut where a layer is
sensitive or its KL grows fast), or, for concave curves (``p ≤ 1``), where the least sensitive layers
are cut first and fully (:func:`allocate_cuts`).
The continuous cuts are then snapped onto the search space's grid of sizes under the uniform plan's
own budget (:func:`snap_to_grid`), so the per-layer plan never holds more than the uniform one.

:func:`per_layer_ffn_plan` does this for a dense parent's FFN widths (the DeciLM form's per-layer
widths, for the engines that read it), and :func:`per_layer_moe_plan` for the axes NVIDIA's Puzzle
form stores per MoE layer
(``nemotron_h_puzzle``'s ``block_configs``): expert width under the uniform plan's total expert
channels (the parameters and weight memory), then experts per token under its routed channels per
token (``Σ top-k · width``: the active parameters, decode's weight traffic). Everything else stays
as the uniform plan has it. When rounding leaves the per-layer plan no better by the estimate, the
uniform plan is returned unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from autocompress_opt.arch.architecture import Architecture, MoESpec
from autocompress_opt.quality.estimate import QualityEstimate

__all__ = ["allocate_cuts", "allot_sizes", "per_layer_ffn_plan", "per_layer_moe_plan", "snap_to_grid"]


def allocate_cuts(weights: Sequence[float], mean_cut: float, p: float | Sequence[float], max_cut: float) -> list[float]:
    """The cuts ``c_l`` in ``[0, max_cut]`` with mean ``mean_cut`` that minimise ``Σ w_l · c_l ** p_l``
    (module doc; ``p`` one exponent for every layer or one per layer). ``mean_cut`` above ``max_cut``
    is clipped to it. Every ``p_l > 1``: the stationary point of the Lagrangian, by bisection on its
    multiplier; every ``p_l <= 1`` (concave): the least sensitive layers first, each fully; a mix
    is treated as convex, its concave exponents raised to just above 1."""
    n = len(weights)
    if n == 0:
        return []
    powers = [float(p)] * n if isinstance(p, (int, float)) else [float(q) for q in p]
    target = min(max(mean_cut, 0.0), max_cut)
    if target <= 0.0:
        return [0.0] * n
    if all(q <= 1.0 for q in powers):
        cuts, left = [0.0] * n, target * n
        for i in sorted(range(n), key=lambda i: weights[i]):
            cuts[i] = min(max_cut, left)
            left -= cuts[i]
            if left <= 0:
                break
        return cuts
    powers = [max(q, 1.05) for q in powers]

    def at(lam: float) -> list[float]:  # in logs: a steep layer's power would overflow a float
        return [
            min(max_cut, math.exp(min(700.0, (math.log(lam) - math.log(q * w)) / (q - 1.0))))
            for w, q in zip(weights, powers, strict=True)
        ]

    lo, hi = 1e-300, 1.0
    while sum(at(hi)) / n < target:
        hi *= 2.0
    for _ in range(400):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if sum(at(mid)) / n < target else (lo, mid)
    return at(hi)


def snap_to_grid(
    ideal: Sequence[float], grids: Sequence[Sequence[int]], costs: Sequence[float], budget: float
) -> list[int]:
    """Integer sizes on each layer's grid (sorted values), near ``ideal``, with ``Σ cost_l · size_l``
    at most ``budget``: each starts at its grid's value at or below the ideal (the grid's least when
    none), is lowered one step at a time where it sits furthest above its ideal while over budget,
    then raised one step at a time where it sits furthest below while the step fits."""
    pos = []
    for x, grid in zip(ideal, grids, strict=True):
        below = [j for j, v in enumerate(grid) if v <= x + 1e-9]
        pos.append(below[-1] if below else 0)

    def total() -> float:
        return sum(c * g[j] for c, g, j in zip(costs, grids, pos, strict=True))

    while total() > budget + 1e-9:
        movable = [i for i in range(len(pos)) if pos[i] > 0]
        if not movable:
            break
        i = max(movable, key=lambda i: (grids[i][pos[i]] - ideal[i]) / max(ideal[i], 1.0))
        pos[i] -= 1
    while True:
        spare = budget - total()
        fits = [i for i in range(len(pos)) if pos[i] + 1 < len(grids[i])]
        fits = [i for i in fits if costs[i] * (grids[i][pos[i] + 1] - grids[i][pos[i]]) <= spare + 1e-9]
        if not fits:
            break
        i = max(fits, key=lambda i: (ideal[i] - grids[i][pos[i]]) / max(ideal[i], 1.0))
        pos[i] += 1
    return [g[j] for g, j in zip(grids, pos, strict=True)]


def per_layer_moe_plan(
    arch: Architecture,
    parent: Architecture,
    estimate: QualityEstimate,
    widths: Sequence[int],
    tops: Sequence[int],
) -> Architecture:
    """``arch`` (a uniform plan of ``parent``) with each MoE layer's expert width and experts per token
    allotted by the estimate's ``ffn`` layer profile (module doc): ``widths`` and ``tops`` are the
    search space's candidate values of ``expert_width`` and ``experts_per_token``. Returns ``arch``
    itself when it has no MoE layer, the estimate no profile for these axes, or the allotment does
    not lower the estimated KL."""
    moe = [i for i, layer in enumerate(arch.layers) if layer.moe is not None]
    if not moe or estimate.profile("expert_width") is None:
        return arch
    n = len(parent.layers)
    depths = [(i + 0.5) / n for i in moe]
    mother, child = _moe_pairs(arch, parent, moe)
    new_widths = _allot(
        estimate,
        "expert_width",
        depths,
        parents=[m.expert_width for m in mother],
        uniform=[c.expert_width for c in child],
        grids=[_grid(widths, c.expert_width, m.expert_width) for m, c in zip(mother, child)],
        costs=[1.0] * len(moe),
    )
    new_tops = _allot(
        estimate,
        "experts_per_token",
        depths,
        parents=[m.experts_per_token for m in mother],
        uniform=[c.experts_per_token for c in child],
        grids=[
            _grid(tops, c.experts_per_token, min(m.experts_per_token, c.num_experts)) for m, c in zip(mother, child)
        ],
        costs=[float(w) for w in new_widths],
        budget=float(sum(c.experts_per_token * c.expert_width for c in child)),
    )
    layers = list(arch.layers)
    for i, spec, w, k in zip(moe, child, new_widths, new_tops, strict=True):
        layers[i] = replace(layers[i], moe=replace(spec, expert_width=int(w), experts_per_token=int(k)))
    return _if_better(replace(arch, layers=tuple(layers)), arch, parent, estimate)


def per_layer_ffn_plan(
    arch: Architecture, parent: Architecture, estimate: QualityEstimate, widths: Sequence[int], multiple: int = 1
) -> Architecture:
    """``arch`` (a uniform plan of a dense ``parent``) with each kept dense FFN's width allotted by the
    estimate's ``ffn`` layer profile under the uniform plan's total FFN channels (module doc; the
    DeciLM form's per-layer widths): ``widths`` are the search space's ``ffn_width`` values, and with
    ``multiple`` > 1 (an engine's DeciLM reader: 256) every width is a multiple of it. Returns
    ``arch`` itself when it has no dense FFN, the estimate no profile, or the allotment does not
    lower the estimated KL."""
    kept = [i for i, layer in enumerate(arch.layers) if layer.ffn and parent.layers[i].ffn]
    if not kept or estimate.profile("ffn_width") is None:
        return arch
    n = len(parent.layers)
    full = [parent.layers[i].ffn_width for i in kept]
    uniform = [arch.layers[i].ffn_width for i in kept]
    new = _allot(
        estimate,
        "ffn_width",
        [(i + 0.5) / n for i in kept],
        parents=full,
        uniform=uniform,
        grids=[_grid(widths, u, f, multiple) for f, u in zip(full, uniform, strict=True)],
        costs=[1.0] * len(kept),
    )
    if any(w % multiple for w in new):  # a layer whose grid held no multiple: no per-layer shape
        return arch
    layers = list(arch.layers)
    for i, w in zip(kept, new, strict=True):
        layers[i] = replace(layers[i], ffn_width=int(w))
    return _if_better(replace(arch, layers=tuple(layers)), arch, parent, estimate)


def _if_better(
    planned: Architecture, arch: Architecture, parent: Architecture, estimate: QualityEstimate
) -> Architecture:
    """``planned`` where the estimate finds it closer to ``parent`` than the uniform ``arch``, else ``arch``."""
    return planned if estimate.kl(planned, parent) < estimate.kl(arch, parent) - 1e-12 else arch


def _grid(values: Sequence[int], uniform: int, largest: int, multiple: int = 1) -> list[int]:
    """A layer's candidate sizes: the space's ``values`` and the uniform plan's, up to ``largest``
    (the parent's); with ``multiple`` > 1 the multiples of it up to ``largest`` instead."""
    if multiple > 1:
        return list(range(multiple, largest + 1, multiple)) or [uniform]
    return sorted(v for v in {*values, uniform} if v <= largest)


def _moe_pairs(arch: Architecture, parent: Architecture, moe: Sequence[int]) -> tuple[list[MoESpec], list[MoESpec]]:
    """The parent's and the plan's MoE specs of the layers ``moe`` (both present by construction)."""
    mother, child = [], []
    for i in moe:
        m, c = parent.layers[i].moe, arch.layers[i].moe
        if m is None or c is None:
            raise ValueError(f"layer {i} is a MoE layer of the plan but not of its parent")
        mother.append(m)
        child.append(c)
    return mother, child


def _allot(
    estimate: QualityEstimate,
    axis: str,
    depths: Sequence[float],
    *,
    parents: Sequence[int],
    uniform: Sequence[int],
    grids: Sequence[Sequence[int]],
    costs: Sequence[float],
    budget: float | None = None,
) -> list[int]:
    """Sizes of one axis per layer: :func:`allot_sizes` on the curves of the axis's profile at ``depths``."""
    profile = estimate.profile(axis)
    if profile is None:
        return list(uniform)
    curves = profile.curves(depths, estimate.curve(axis)[1])
    return allot_sizes(curves, parents=parents, uniform=uniform, grids=grids, costs=costs, budget=budget)


def allot_sizes(
    curves: Sequence[tuple[float, float]],
    *,
    parents: Sequence[int],
    uniform: Sequence[int],
    grids: Sequence[Sequence[int]],
    costs: Sequence[float],
    budget: float | None = None,
) -> list[int]:
    """Sizes of one axis per layer from each layer's ``(k, p)`` curve (:meth:`LayerProfile.curves
    <autocompress_opt.quality.estimate.LayerProfile.curves>`): :func:`allocate_cuts` at the uniform
    sizes' mean cut, snapped onto ``grids`` under their budget (``Σ cost · uniform`` unless ``budget``
    is given)."""
    mean_cut = sum(1.0 - u / m for u, m in zip(uniform, parents, strict=True)) / len(parents)
    max_cut = min(1.0 - g[0] / m for g, m in zip(grids, parents, strict=True))
    cuts = allocate_cuts([k for k, _ in curves], mean_cut, [q for _, q in curves], max(max_cut, 0.0))
    ideal = [m * (1.0 - c) for m, c in zip(parents, cuts, strict=True)]
    if budget is None:
        budget = float(sum(c * u for c, u in zip(costs, uniform, strict=True)))
    return snap_to_grid(ideal, grids, costs, budget)
