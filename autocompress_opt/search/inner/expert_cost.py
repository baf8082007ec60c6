"""The expert search's cost and relaxation arithmetic (split from :mod:`.experts`): the parameters
of a MoE / hybrid parent's MoE blocks and Mamba-2 mixers as differentiable functions of their sizes
(total and active per token, per layer), the point's budgets, and the soft top-``n`` masks in rank
units (a fixed count, or a learnable per-layer count: :func:`soft_top_at`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.moe import MambaSpec, MoESpec
from autocompress_opt.prune.importance import ranked


# ------------------------------------------------------------------------------ cost
def _affine(f: Any) -> tuple[int, int]:
    """``(a, b)`` with ``f(n) = a·n + b`` for an integer-affine ``f`` (read at 1 and 2)."""
    return f(2) - f(1), 2 * f(1) - f(2)


def _sized(spec: MoESpec, experts: int, k: int, width: int, shared: int | None = None) -> MoESpec:
    return replace(
        spec,
        num_experts=experts,
        experts_per_token=min(k, experts),
        expert_width=width,
        shared_width=spec.shared_width if shared is None else shared,
    )


def moe_specs(parent: Architecture) -> list[MoESpec]:
    return [layer.moe for layer in parent.layers if layer.moe is not None]


def mamba_specs(parent: Architecture) -> list[MambaSpec]:
    return [layer.mamba for layer in parent.layers if layer.mamba is not None]


def expert_param_totals(
    parent: Architecture,
    experts: torch.Tensor,
    width: torch.Tensor,
    k: int | torch.Tensor,
    shared: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Parameters of the MoE blocks of ``parent`` sized ``experts`` ``(M,)`` routed experts of ``width``
    ``(M,)`` channels and a shared expert of ``shared`` ``(M,)`` channels (None: the parent's) in its
    ``M`` MoE layers (in order), top-``k`` (one int for every layer, or ``(M,)`` per layer): ``total``
    (:meth:`~autocompress_opt.arch.moe.MoESpec.params`) and ``active`` per token
    (:meth:`~autocompress_opt.arch.moe.MoESpec.active_params`), norms excluded. Differentiable in the
    sizes and a per-layer ``k`` (both formulas are affine in each, read off the arch's own methods);
    at integer sizes equal to those methods."""
    d, bias = parent.hidden_size, parent.mlp_bias
    total = active = torch.zeros((), dtype=experts.dtype, device=experts.device)
    for i, spec in enumerate(moe_specs(parent)):
        a_w, b_w = _affine(lambda f, s=spec: _sized(s, 1, 1, f).expert_params(d))  # one routed expert
        a_e, b_e = _affine(  # router rows and latent projections: what scales with neither width
            lambda e, s=spec: _sized(s, e, 1, 1, 0).params(d, bias) - e * _sized(s, e, 1, 1, 0).expert_params(d)
        )
        expert, always = a_w * width[i] + b_w, a_e * experts[i] + b_e
        if spec.shared_width:  # the shared expert (affine for widths >= 1; a kept one has at least one channel)
            a_s, b_s = _affine(
                lambda w, s=spec: _sized(s, 1, 1, 1, w).params(d, bias) - _sized(s, 1, 1, 1, 0).params(d, bias)
            )
            always = always + a_s * (spec.shared_width if shared is None else shared[i]) + b_s
        total = total + experts[i] * expert + always
        routed = min(k, spec.num_experts) if isinstance(k, int) else k[i].clamp(max=spec.num_experts)
        active = active + routed * expert + always
    return {"total": total, "active": active}


def mamba_param_total(parent: Architecture, heads: torch.Tensor) -> torch.Tensor:
    """Parameters of the Mamba-2 mixers of ``parent`` keeping ``heads`` ``(N,)`` SSM heads in its ``N``
    Mamba-2 layers (in order), pre-norms excluded (:meth:`~autocompress_opt.arch.moe.MambaSpec.params`,
    affine in the heads; every token runs them, so total and active alike). Differentiable in ``heads``."""
    total = torch.zeros((), dtype=heads.dtype, device=heads.device)
    for i, spec in enumerate(mamba_specs(parent)):
        g = spec.groups  # read at G and 2G heads: a mixer's heads are a multiple of its groups
        at = lambda h, s=spec: replace(s, num_heads=h).params(parent.hidden_size)
        a_h = (at(2 * g) - at(g)) // g
        total = total + a_h * heads[i] + (at(g) - a_h * g)
    return total


def param_budget(parent: Architecture, point: Mapping[str, int]) -> dict[str, float]:
    """The budgets of the point's uniform child: its MoE blocks' total and active parameters, and its
    Mamba-2 mixers' (a parent with Mamba-2 layers)."""
    full = lambda key, n: torch.full((n,), float(point[key]), dtype=torch.float64)
    n = len(moe_specs(parent))
    shared = full("shared_width", n) if "shared_width" in point else None
    totals = expert_param_totals(
        parent, full("num_experts", n), full("expert_width", n), point["experts_per_token"], shared
    )
    out = {"budget:expert_params": float(totals["total"]), "budget:active_expert_params": float(totals["active"])}
    if "mamba_heads" in point:
        out["budget:mamba_params"] = float(mamba_param_total(parent, full("mamba_heads", len(mamba_specs(parent)))))
    return out


# ------------------------------------------------------------------------------ soft top-n
def soft_top(scores: torch.Tensor, n: int, tau: float) -> torch.Tensor:
    """Soft top-``n`` over the last axis of ``scores`` (rank units): ``σ((s − t)/τ)`` with ``t`` the
    midpoint of the ``n``-th and ``(n+1)``-th highest scores (detached); all ones when ``n`` is every
    unit; ``τ <= 0``: the hard top-``n`` (ties to the lower index, :func:`ranked`)."""
    size = scores.shape[-1]
    if n >= size:
        return torch.ones_like(scores)
    if tau <= 0:
        return hard_top(scores, n).to(scores.dtype)
    top = torch.topk(scores.detach(), n + 1, dim=-1).values  # (..., n+1) descending
    threshold = (top[..., n - 1] + top[..., n]) / 2
    return torch.sigmoid((scores - threshold[..., None]) / tau)


def hard_top(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Bool mask of the ``n`` highest scores along the last axis, ties to the lower index."""
    flat = scores.detach().reshape(-1, scores.shape[-1]).cpu()
    out = torch.zeros(flat.shape, dtype=torch.bool)
    for row, s in enumerate(flat):
        out[row, ranked(s)[:n]] = True
    return out.reshape(scores.shape).to(scores.device)


def start_scores(start: torch.Tensor, tiebreak: torch.Tensor) -> torch.Tensor:
    """Scores in rank units (``n − rank``) whose top-``start.sum()`` is ``start``: its units first,
    each group ordered by ``tiebreak`` (higher first, ties to the lower index)."""
    tie = tiebreak.double()
    key = start.double() * 2 + 0.5 * tie / (tie.abs().max() + 1)  # kept units above all others
    n = key.numel()
    ranks = torch.empty(n, dtype=torch.long)
    ranks[ranked(key)] = torch.arange(n)
    return (n - ranks).float()


def soft_top_grouped(scores: torch.Tensor, n: int, groups: int, tau: float) -> torch.Tensor:
    """Soft top-``n / groups`` within each of ``groups`` equal runs of the last axis (Mamba-2 heads)."""
    grouped = scores.unflatten(-1, (groups, -1))  # (..., G, H/G)
    return soft_top(grouped, n // groups, tau).flatten(-2)


def soft_top_at(scores: torch.Tensor, count: torch.Tensor, tau: float) -> torch.Tensor:
    """Soft top-``count`` over the last axis of ``scores`` (rank units) with a learnable count per row
    group: ``count`` has the leading shape of ``scores`` without its last axis, or a prefix of it (a
    layer's count shared by its experts), and may be fractional. ``σ((s − t)/τ)`` with ``t`` the
    sorted (detached) scores read at the fractional position ``count − ½`` (linear between the two
    scores around it, the last one continued one rank below the lowest): at an integer ``n`` exactly
    :func:`soft_top`'s midpoint, so ``t`` and the masks move with ``count`` (its gradient: raising it
    lowers the threshold); ``τ <= 0``: the hard top-``round(count)``."""
    size = scores.shape[-1]
    while count.dim() < scores.dim() - 1:
        count = count.unsqueeze(-1)
    count = count.expand(scores.shape[:-1]).clamp(1.0, float(size))
    if tau <= 0:
        order = torch.argsort(torch.argsort(-scores.detach(), dim=-1, stable=True), dim=-1, stable=True)
        return (order < count.detach().round()[..., None]).to(scores.dtype)
    values = torch.sort(scores.detach(), dim=-1, descending=True).values
    values = torch.cat([values, values[..., -1:] - 1], dim=-1)  # (..., size + 1): one rank below the last
    at = count - 0.5  # in [0.5, size - 0.5]
    low = at.detach().floor().long().clamp(0, size - 1)
    frac = at - low.to(at.dtype)
    upper, lower = values.gather(-1, low[..., None])[..., 0], values.gather(-1, (low + 1)[..., None])[..., 0]
    threshold = upper + frac * (lower - upper)
    return torch.sigmoid((scores - threshold[..., None]) / tau)


def soft_prefix(count: torch.Tensor, size: int, tau: float) -> torch.Tensor:
    """Soft keep masks of the first ``count`` of ``size`` ranked slots, ``(..., size)``:
    ``σ((count − j − ½)/τ)`` for slot ``j`` (0 = first); ``τ <= 0``: ``j < round(count)``."""
    slots = torch.arange(size, dtype=count.dtype, device=count.device)
    if tau <= 0:
        return (slots < count.detach().round()[..., None]).to(count.dtype)
    return torch.sigmoid((count[..., None] - slots - 0.5) / tau)
