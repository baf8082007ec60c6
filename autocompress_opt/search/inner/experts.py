"""The inner search of a mixture-of-experts or hybrid parent (issue 30): *which* routed experts and
expert channels each MoE layer keeps, which shared-expert channels, and which Mamba-2 heads each
Mamba-2 layer keeps, under the outer trial's uniform choice of *how many*.

Without per-layer counts (below) the child is the family's plain config (one expert count, top-``k``,
expert width, shared width for every MoE layer and one head count for every Mamba-2 layer:
:func:`~autocompress_opt.prune.experts.slice_experts`), so the trial's point fixes the counts
(:data:`SEARCHED_CHOICES` the parent has: ``num_experts``, ``experts_per_token``, ``expert_width``,
and for Nemotron-H ``shared_width`` and ``mamba_heads``) and this search decides, per layer, which
units fill them. The dense axes (layers, hidden size, attention heads, dense FFN) are not pruned here:
a point must hold them at the ``parent``'s sizes (:func:`expert_point`), else a :class:`ConfigError`
names the choice. A trial of fewer layers or heads cuts the parent first and searches the cut model
(:func:`~autocompress_opt.search.study.weights_trial.dense_cut`).

Relaxation (:class:`ExpertMasks`): per MoE layer ``l`` a learnable score per expert ``s_le``, per
expert channel ``c_lef`` and per shared-expert channel, and per Mamba-2 layer one per SSM head, in
*rank units* (initialised to ``n - rank`` of the importance order, so the start is the importance
choice of :func:`~autocompress_opt.prune.experts.expert_masks`). A soft top-``n`` keeps unit ``u``
with ``m_u = σ((s_u − t) / τ)``, ``t`` the midpoint between the ``n``-th and ``(n+1)``-th scores
(detached), ``τ`` the dense search's schedule (units of one rank); as ``τ → 0`` it is the hard
top-``n`` that :func:`discretise_experts` keeps. Mamba-2 heads are a soft top-``n / G`` within each
of the mixer's ``G`` groups (every group keeps the same number, :mod:`autocompress_opt.prune.mamba`).
In the forward pass the expert masks enter the router by its own rule
(:attr:`~autocompress_opt.hf.adapters.FamilyAdapter.router_scoring`): ``softmax`` (Qwen3-MoE) as
``logits + log m`` before its softmax and top-``k``; ``sigmoid`` (Nemotron-H) as ``log m`` added to
the choice scores (``sigmoid(logits) + correction bias``) before the top-``k`` and ``m`` times the
chosen scores before the renormalisation; a dropped expert, ``m = 0``, is never chosen, exactly
:func:`~autocompress_opt.prune.masking.apply_masks`. The channel masks scale the columns of the
stacked down projection ``(E, D, F)`` (latent MoE: the experts' own width, inside the latent
projections) and the shared expert's ``down_proj`` input; a Mamba-2 head mask weighs the head's
channels in its group's gated-norm statistic and scales them after it
(:func:`~autocompress_opt.prune.masking.kept_channel_gated_norm`).

Cost: :func:`expert_param_totals` counts the MoE blocks' parameters, total and active per token,
by the arch's formulas (:meth:`~autocompress_opt.arch.moe.MoESpec.params` / ``active_params``,
which are affine in the expert count, expert width and shared width), and :func:`mamba_param_total`
the Mamba-2 mixers' (:meth:`~autocompress_opt.arch.moe.MambaSpec.params`, affine in the heads;
every token runs them), on the masks' expected counts; the Lagrangian prices them against the
point's uniform child with straight-through values, as the dense search does. Since every soft
top-``n`` rounds to exactly ``n`` units, those budgets hold at every step: the counts, and so the
serving cost, are the outer loop's, and the exact cost model judges the discretised child's
feasibility (:meth:`~autocompress_opt.serving.targets.Target.check`).

Per layer (``per_layer=True``, the Puzzle form: :func:`search_experts`): each MoE layer also learns
its own expert width and experts per token, as keep fractions ``width_keep`` / ``topk_keep`` of the
parent's (starting at the point's). A layer's channel masks are the soft top-``c_l`` of its scores
with a fractional count (:func:`~autocompress_opt.search.inner.expert_cost.soft_top_at`: the
threshold read between the sorted scores, so ``c_l`` has a gradient), and its router returns every
choice up to the parent's top-``k``, the ``j``-th weighed by ``σ((k_l − j − ½)/τ)`` before the
renormalisation (at ``τ → 0``: the top-``k_l``, exactly ``apply_masks`` with per-layer top-``k``).
The counts step by :class:`~autocompress_opt.search.inner.optim.SharedScaleAdam` (``InnerConfig.lr``:
each layer in proportion to its own KL gradient, not in lockstep) and after every step are
projected back onto the point's budgets (:func:`project_counts`: one common shift spends the total,
then the active, expert parameters exactly), so what one layer gains another pays; the Lagrangian
prices only the other budgets. The discretised choice is rounded per layer, then repaired into the
budgets and refilled (:func:`repair_counts`). The number of experts and the shared width stay the
point's in every layer (the Puzzle config's ``n_routed_experts`` and shared width are global).

Selection: the trained choice and the importance start, the lower KL to the parent on the held-out
rows (ties to ``trained``), as :func:`~autocompress_opt.search.inner.inner_search.search` does.
Deterministic given ``InnerConfig.seed``. Group-limited routing (``n_group > 1``) is refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import sparse_limits
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, moe_adapter, renormalises_top_k
from autocompress_opt.prune.experts import expert_masks
from autocompress_opt.prune.importance import Importance
from autocompress_opt.prune.masking import Masks, apply_masks, kept_channel_gated_norm
from autocompress_opt.quality.metrics import Teacher, log_probs, teacher_kl
from autocompress_opt.search.inner.budget import CostGoal
from autocompress_opt.search.inner.expert_cost import (
    expert_param_totals,
    mamba_param_total,
    mamba_specs,
    param_budget,
    soft_prefix,
    soft_top,
    soft_top_at,
    soft_top_grouped,
    start_scores,
)
from autocompress_opt.search.inner.expert_counts import (
    PROJECTED,
    budget_use,
    layer_architecture,
    project_counts,
    repair_counts,
)
from autocompress_opt.search.inner.optim import SharedScaleAdam
from autocompress_opt.serving.targets import all_satisfied

__all__ = [
    "ExpertMasks",
    "ExpertResult",
    "discretise_experts",
    "expert_param_totals",
    "expert_point",
    "mamba_param_total",
    "search_experts",
]

# The choices the expert search fills (which experts, channels, shared channels and Mamba-2 heads), those
# the parent has a sub-block for (arch.hybrid.sparse_limits): Qwen3-MoE the first three, Nemotron-H all five.
SEARCHED_CHOICES: tuple[str, ...] = ("num_experts", "experts_per_token", "expert_width", "shared_width", "mamba_heads")
_EPS = 1e-12  # keeps log m finite for a fully dropped soft mask (log 1e-12 ≈ −28: no token routed)


# ------------------------------------------------------------------------------ the point
def expert_point(params: Mapping[str, int], parent: Architecture) -> dict[str, int]:
    """The counts of a MoE / hybrid trial's point: each of :data:`SEARCHED_CHOICES` the parent has a
    sub-block for (an absent one at the parent's size). Raises :class:`ConfigError` naming the choice
    when the point prunes a dense axis (``num_layers``, ``hidden_size``, heads, dense FFN: not pruned
    in a MoE parent yet), names a choice the parent has no sub-block for, puts a count outside
    ``1..parent``, routes to more experts than it keeps, or keeps Mamba-2 heads that are not a
    multiple of the mixer's groups."""
    limits = sparse_limits(parent)
    if "num_experts" not in limits:
        raise ConfigError("the parent has no mixture-of-experts layer: the expert search has nothing to choose")
    searched = [key for key in SEARCHED_CHOICES if key in limits]
    for key, value in params.items():
        if key not in limits:
            raise ConfigError(
                f"point choice {key}={value!r}: the parent has no sub-block for it; valid: {', '.join(limits)}"
            )
        if key not in SEARCHED_CHOICES and int(value) != limits[key]:
            raise ConfigError(
                f"point choice {key}={value} prunes an axis of a MoE parent that the expert search does not "
                f"(layers and attention heads: cut the parent first, weights_trial.dense_cut; hidden size, dense "
                f"FFN: not yet); valid: {key}={limits[key]} (the parent's), with {', '.join(searched)} free"
            )
    point = {key: int(params.get(key, limits[key])) for key in searched}
    for key, value in point.items():
        if not 1 <= value <= limits[key]:
            raise ConfigError(f"point choice {key}={value} is outside 1..{limits[key]} (the parent's)")
    if point["experts_per_token"] > point["num_experts"]:
        raise ConfigError(
            f"point choice experts_per_token={point['experts_per_token']} exceeds num_experts="
            f"{point['num_experts']}; valid: 1..{point['num_experts']}"
        )
    mamba = mamba_specs(parent)
    if mamba and point["mamba_heads"] % mamba[0].groups:
        groups, heads = mamba[0].groups, mamba[0].num_heads
        raise ConfigError(
            f"point choice mamba_heads={point['mamba_heads']} is not a multiple of the Mamba-2 groups ({groups}: "
            f"every group keeps the same number); valid: {', '.join(map(str, range(groups, heads + 1, groups)))}"
        )
    return point


# ------------------------------------------------------------------------------ relaxation
@dataclass(frozen=True)
class LiveExperts:
    """The float masks of one forward pass: ``experts`` ``(M, E)``, ``channels`` ``(M, E, F)``,
    ``shared`` ``(M, S)`` (None: not searched), ``mamba`` ``(N, H)`` (None: no Mamba-2 layers) and
    ``route`` ``(M, K)`` the weight of each layer's ``j``-th routing choice (None: one top-``k`` for
    every layer, the point's)."""

    experts: torch.Tensor
    channels: torch.Tensor
    shared: torch.Tensor | None = None
    mamba: torch.Tensor | None = None
    route: torch.Tensor | None = None


def _uniform(parts: list[LayerParts], what: str, shape: Any) -> tuple[int, ...]:
    shapes = {shape(p) for p in parts}
    if len(shapes) > 1:
        raise ConfigError(f"the {what} layers differ in {sorted(shapes)}; a plain config has one size per kind")
    return shapes.pop() if shapes else ()


class ExpertMasks(torch.nn.Module):
    """Learnable scores of a MoE / hybrid parent's ``M`` MoE and ``N`` Mamba-2 layers (module doc).

    ``expert_score`` ``(M, E)``, ``channel_score`` ``(M, E, F)``, ``shared_score`` ``(M, S)`` (a point
    with ``shared_width``; else None) and ``mamba_score`` ``(N, H)`` (a point with ``mamba_heads``; else
    None), float32 in rank units, start at ``start``'s choice (a :class:`Masks` from
    :func:`~autocompress_opt.prune.experts.expert_masks`: the importance choice), the rest ordered by
    ``importance`` (expert frequency, channel and head scores). ``point``: the counts kept
    (:func:`expert_point`); ``scoring``: the router's rule
    (:attr:`~autocompress_opt.hf.adapters.FamilyAdapter.router_scoring`).
    """

    def __init__(
        self,
        parts: list[LayerParts],
        importance: Importance,
        point: Mapping[str, int],
        start: Masks,
        device: torch.device | str | None = None,
        scoring: str = "softmax",
        per_layer: bool = False,
    ) -> None:
        super().__init__()
        if scoring not in _ROUTER_HOOKS:
            raise ConfigError(f"router_scoring {scoring!r} is not searched; valid: {', '.join(_ROUTER_HOOKS)}")
        self.scoring = scoring
        self.moe_layers = [i for i, p in enumerate(parts) if p.moe is not None]
        self.mamba_layers = [i for i, p in enumerate(parts) if p.mamba is not None and "mamba_heads" in point]
        self.parts = [parts[i] for i in self.moe_layers]
        self.mamba_parts = [parts[i] for i in self.mamba_layers]
        _uniform(self.parts, "MoE", lambda p: (p.num_experts, p.expert_width, p.shared_width))
        heads = _uniform(self.mamba_parts, "Mamba-2", lambda p: (int(p.mamba.num_heads), int(p.mamba.n_groups)))
        self.groups = heads[1] if heads else 1
        for i, p in zip(self.moe_layers, self.parts):
            if int(getattr(p.router, "num_group", 1) or 1) > 1:
                raise ConfigError(
                    f"MoE layer {i} routes group-limited (n_group={p.router.num_group}); the expert search "
                    "handles n_group=1 only"
                )
        self.point = dict(point)
        experts, channels, shared = [], [], []
        for i in self.moe_layers:
            mask, freq, chan = start.layers[i], importance.expert_frequency[i], importance.expert_ffn[i]
            if mask.experts is None or mask.expert_ffn is None or freq is None or chan is None:
                raise ConfigError(f"MoE layer {i} has no expert masks or expert scores to start from")
            experts.append(start_scores(mask.experts.cpu(), freq.cpu()))
            channels.append(torch.stack([start_scores(m, c) for m, c in zip(mask.expert_ffn.cpu(), chan.cpu())]))
            if "shared_width" in point:
                scores = importance.shared_ffn[i]
                if mask.shared_ffn is None or scores is None:
                    raise ConfigError(f"MoE layer {i} has no shared-expert mask or scores to start from")
                shared.append(start_scores(mask.shared_ffn.cpu(), scores.cpu()))
        self.expert_score = torch.nn.Parameter(torch.stack(experts))  # (M, E)
        self.channel_score = torch.nn.Parameter(torch.stack(channels))  # (M, E, F)
        self.shared_score = torch.nn.Parameter(torch.stack(shared)) if shared else None  # (M, S)
        mamba = []
        for i in self.mamba_layers:
            keep, scores = start.layers[i].mamba_heads, importance.mamba_heads[i]
            if keep is None or scores is None:
                raise ConfigError(f"Mamba-2 layer {i} has no head mask or head scores to start from")
            mamba.append(start_scores(keep.cpu(), scores.cpu()))
        self.mamba_score = torch.nn.Parameter(torch.stack(mamba)) if mamba else None  # (N, H)
        # Per-layer counts (module doc, "Per layer"): each MoE layer's expert width and top-k as keep
        # fractions of the parent's, starting at the point's; None: the point's in every layer.
        self.per_layer = per_layer
        self.width_size = int(self.channel_score.shape[-1])
        self.route_size = min(int(self.parts[0].router.top_k), self.point["num_experts"]) if self.parts else 1
        self.width_keep: torch.nn.Parameter | None = None
        self.topk_keep: torch.nn.Parameter | None = None
        if per_layer:
            m = len(self.moe_layers)
            self.width_keep = torch.nn.Parameter(torch.full((m,), point["expert_width"] / self.width_size))
            self.topk_keep = torch.nn.Parameter(torch.full((m,), point["experts_per_token"] / self.route_size))
        self._live: LiveExperts | None = None
        if device is not None:
            self.to(device)

    def live(self, tau: float) -> LiveExperts:
        """Soft masks at softness ``tau`` (rank units; ``<= 0``: the hard choice)."""
        shared = None if self.shared_score is None else soft_top(self.shared_score, self.point["shared_width"], tau)
        mamba = None
        if self.mamba_score is not None:
            mamba = soft_top_grouped(self.mamba_score, self.point["mamba_heads"], self.groups, tau)
        if self.width_keep is None or self.topk_keep is None:
            channels, route = soft_top(self.channel_score, self.point["expert_width"], tau), None
        else:
            channels = soft_top_at(self.channel_score, self.width_keep * self.width_size, tau)
            route = soft_prefix(self.topk_keep.clamp(0.0, 1.0) * self.route_size, self.route_size, tau)
        return LiveExperts(soft_top(self.expert_score, self.point["num_experts"], tau), channels, shared, mamba, route)

    def layer_counts(self) -> dict[str, list[int]]:
        """Each MoE layer's hard ``expert_width`` and ``experts_per_token`` (the point's in every layer
        unless :attr:`per_layer`)."""
        m = len(self.moe_layers)
        if self.width_keep is None or self.topk_keep is None:
            point = self.point
            return {"expert_width": [point["expert_width"]] * m, "experts_per_token": [point["experts_per_token"]] * m}
        width = (self.width_keep.detach() * self.width_size).round().clamp(1, self.width_size)
        k = (self.topk_keep.detach() * self.route_size).round().clamp(1, self.route_size)
        return {"expert_width": [int(w) for w in width.tolist()], "experts_per_token": [int(v) for v in k.tolist()]}

    def expected(self, tau: float, hard: bool = False) -> dict[str, torch.Tensor]:
        """The counts expected per layer: ``experts`` ``(M,)`` kept, ``width`` ``(M,)`` channels per kept
        expert (mean over experts weighted by their keep masks), and where searched ``shared_width``
        ``(M,)`` and ``mamba_heads`` ``(N,)``. Straight-through unless ``hard``: the values of the hard
        choice with the gradients of the soft masks."""
        soft = self.live(tau)
        experts = soft.experts.sum(-1)
        counts = {
            "num_experts": experts,
            "expert_width": (soft.experts * soft.channels.sum(-1)).sum(-1) / experts.clamp_min(_EPS),
        }
        if soft.shared is not None:
            counts["shared_width"] = soft.shared.sum(-1)
        if soft.mamba is not None:
            counts["mamba_heads"] = soft.mamba.sum(-1)
        if soft.route is not None:
            counts["experts_per_token"] = soft.route.sum(-1)
        if hard:
            return {k: v.detach().round() for k, v in counts.items()}
        exact = {k: torch.full_like(v, float(self.point[k])) for k, v in counts.items()}
        for key, values in self.layer_counts().items() if self.per_layer else ():
            exact[key] = torch.tensor(values, dtype=counts[key].dtype, device=counts[key].device)
        return {k: v + (exact[k] - v).detach() for k, v in counts.items()}

    def discrete(self, base: Masks) -> Masks:
        """``base`` with every MoE layer's experts, channels, shared channels and top-``k`` and every
        Mamba-2 layer's heads the hard choice of the scores."""
        hard = self.live(0.0)
        layers = list(base.layers)
        ks = self.layer_counts()["experts_per_token"]
        for j, i in enumerate(self.moe_layers):
            layers[i] = replace(
                layers[i],
                experts=hard.experts[j].bool().cpu(),
                expert_ffn=hard.channels[j].bool().cpu(),
                experts_per_token=ks[j],
            )
            if hard.shared is not None:
                layers[i] = replace(layers[i], shared_ffn=hard.shared[j].bool().cpu())
        for j, i in enumerate(self.mamba_layers):
            assert hard.mamba is not None  # scores exist for every Mamba-2 layer listed
            layers[i] = replace(layers[i], mamba_heads=hard.mamba[j].bool().cpu())
        return replace(base, layers=tuple(layers))

    @contextmanager
    def use(self, live: LiveExperts) -> Iterator[None]:
        """The installed hooks read ``live`` while the block runs."""
        previous, self._live = self._live, live
        try:
            yield
        finally:
            self._live = previous

    @contextmanager
    def install(self) -> Iterator[None]:
        """Router hooks (the router's own rule on the masked experts: module doc), a parametrization of
        each stacked down projection (``W · m[:, None, :]``), and where those axes are pruned a
        ``down_proj`` input hook on each shared expert and a gated-norm hook on each Mamba-2 mixer,
        reading the masks set by :meth:`use`; removed on exit, the stored weights untouched."""
        from torch.nn.utils import parametrize

        handles, parametrized = [], []
        try:
            for j, p in enumerate(self.parts):
                handles.append(p.router.register_forward_hook(_ROUTER_HOOKS[self.scoring](self, j)))
                name = next(n for n, w in p.experts.named_parameters(recurse=False) if w is p.expert_down)
                parametrize.register_parametrization(p.experts, name, _Columns(self, j))
                parametrized.append((p.experts, name))
                if self.shared_score is not None and self.point["shared_width"] < p.shared_width:
                    handles.append(p.shared_expert.down_proj.register_forward_pre_hook(self._shared_hook(j)))
            for j, p in enumerate(self.mamba_parts):
                if self.point["mamba_heads"] < int(p.mamba.num_heads):
                    handles.append(p.mamba.norm.register_forward_hook(self._mamba_hook(j, int(p.mamba.head_dim))))
            yield
        finally:
            for h in handles:
                h.remove()
            for module, name in parametrized:
                parametrize.remove_parametrizations(module, name, leave_parametrized=False)

    def route_k(self) -> int:
        """How many routing choices the relaxed routers return: the point's top-``k``, or with per-layer
        counts every choice a layer may keep (:attr:`route_size`), weighed by the route masks."""
        return self.route_size if self.per_layer else self.point["experts_per_token"]

    def _current(self) -> LiveExperts:
        if self._live is None:
            raise RuntimeError("ExpertMasks hooks ran outside ExpertMasks.use(...)")
        return self._live

    def _shared_hook(self, j: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            shared = self._current().shared
            assert shared is not None  # installed only when the shared channels are searched
            x = args[0]  # (..., S)
            return (x * shared[j].to(device=x.device, dtype=x.dtype), *args[1:])

        return hook

    def _mamba_hook(self, j: int, head_dim: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            mamba = self._current().mamba
            assert mamba is not None  # installed only when the heads are searched
            return kept_channel_gated_norm(module, args, mamba[j].repeat_interleave(head_dim))  # (H·P,)

        return hook


def _softmax_router(masks: ExpertMasks, j: int) -> Any:
    """Qwen3-MoE's rule on ``logits + log m``: softmax, top-``k``, renormalised iff ``norm_topk_prob``."""

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        logits = output[0]  # (tokens, E)
        live = masks._current()
        mask = live.experts[j].to(device=logits.device, dtype=torch.float32)
        shifted = logits.float() + torch.log(mask + _EPS)
        probs = torch.softmax(shifted, dim=-1)
        top, index = torch.topk(probs, masks.route_k(), dim=-1)  # (tokens, k), highest first
        if live.route is not None:
            top = top * live.route[j].to(device=top.device, dtype=top.dtype)
        if renormalises_top_k(module):
            top = top / top.sum(dim=-1, keepdim=True)
        return (shifted.to(logits.dtype), top.to(logits.dtype), index, *output[3:])

    return hook


def _sigmoid_router(masks: ExpertMasks, j: int) -> Any:
    """Nemotron-H's rule (transformers' ``NemotronHTopkRouter``, ``n_group == 1``) with the masks: the
    top-``k`` of ``sigmoid(logits) + correction bias + log m``, weights ``m · sigmoid(logits)`` of the
    chosen, renormalised iff ``norm_topk_prob`` (+1e-20, as there), times ``routed_scaling_factor``. At
    ``m`` in {0, 1} it is :func:`~autocompress_opt.prune.masking.apply_masks`' sigmoid reroute."""

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        logits = output[0]  # (tokens, E), float32
        live = masks._current()
        mask = live.experts[j].to(device=logits.device, dtype=torch.float32)
        scores = logits.sigmoid()
        choice = scores + module.e_score_correction_bias + torch.log(mask + _EPS)
        per_layer = live.route is not None  # per-layer top-k: the ranked choices, weighed by the route masks
        index = torch.topk(choice.detach(), masks.route_k(), dim=-1, sorted=per_layer)[1]  # (tokens, k)
        weights = (scores * mask).gather(1, index)
        if live.route is not None:
            weights = weights * live.route[j].to(device=weights.device, dtype=weights.dtype)
        if module.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (logits, weights * module.routed_scaling_factor, index, *output[3:])

    return hook


class _Columns(torch.nn.Module):
    """A parametrization: the stacked down projection ``(E, D, F)`` times layer ``j``'s channel masks."""

    def __init__(self, masks: ExpertMasks, j: int) -> None:
        super().__init__()
        self._masks = [masks]  # a list: not a submodule (its parameters are not this module's)
        self.j = j

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        live = self._masks[0]._live
        if live is None:  # registration's check, outside a pass: the weight as stored
            return weight
        mask = live.channels[self.j]  # (E, F)
        return weight * mask.to(device=weight.device, dtype=weight.dtype).unsqueeze(1)


# FamilyAdapter.router_scoring -> the relaxed router hook of that rule.
_ROUTER_HOOKS = {"softmax": _softmax_router, "sigmoid": _sigmoid_router}


# ------------------------------------------------------------------------------ search
# The expert search's candidates, in tie-break order: the trained choice and the importance start.
EXPERT_CANDIDATES: tuple[str, ...] = ("trained", "start")


@dataclass
class ExpertResult:
    """What one expert search produced (the MoE counterpart of
    :class:`~autocompress_opt.search.inner.inner_search.InnerResult`).

    Attributes:
        architecture: the point's uniform child (every layer kept, the MoE layers at the point's counts).
        masks: which experts, channels and top-``k`` of the parent it keeps
            (:func:`~autocompress_opt.prune.experts.slice_experts` cuts them).
        feasible / violations / metrics: by the exact cost model (budgets included).
        history: per step ``kl``, ``penalty``, ``tau``; selection: per candidate ``feasible`` and
            held-out ``val_kl``, and ``chosen``; seconds: where the time went.
        candidates: every candidate's masks by name.
        layers: with per-layer counts, the trained choice's ``expert_width`` and ``experts_per_token``
            per MoE layer and ``repaired_steps`` (:func:`repair_counts`); else empty.
    """

    architecture: Architecture
    masks: Masks
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    selection: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, Masks] = field(default_factory=dict, repr=False)
    layers: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-safe record (no tensors)."""
        return {
            "form": "experts",
            "feasible": self.feasible,
            "violations": self.violations,
            "seconds": self.seconds,
            "selection": self.selection,
            "final_kl_train": self.history[-1]["kl"] if self.history else None,
            "steps": len(self.history),
            **({"per_layer": self.layers} if self.layers else {}),
        }

    def choice(self) -> dict[str, Any]:
        """``chosen``, ``val_kl`` (None when not measured) and ``feasible`` per candidate, JSON-safe."""
        rows = {n: v for n, v in self.selection.items() if n != "chosen"}
        return {
            "chosen": self.selection.get("chosen"),
            "val_kl": {n: v["val_kl"] if math.isfinite(v["val_kl"]) else None for n, v in rows.items()},
            "feasible": {n: bool(v["feasible"]) for n, v in rows.items()},
        }


def discretise_experts(masks: ExpertMasks, parent: Architecture) -> Masks:
    """The hard choice of ``masks``: bool :class:`Masks` over the parent that keep everything but the
    routed experts, expert and shared channels and Mamba-2 heads the scores leave out
    (:meth:`ExpertMasks.discrete`)."""
    return masks.discrete(Masks.ones(parent))


def search_experts(
    model: Any,
    parent: Architecture,
    importance: Importance,
    tokens: torch.Tensor,
    teacher: Teacher,
    *,
    params: Mapping[str, int],
    goal: CostGoal | None,
    config: Any,
    adapter: FamilyAdapter | None = None,
    on_step: Any = None,
    measure_at: Collection[int] | None = None,
    per_layer: bool = False,
) -> ExpertResult:
    """Choose which experts, expert channels and shared-expert channels every MoE layer of ``model``
    keeps, and which heads every Mamba-2 layer keeps, at the counts of ``params`` (module doc);
    ``config``: an :class:`~autocompress_opt.search.inner.inner_search.InnerConfig` (``steps``,
    ``batch_size``, ``val_samples``, ``gate_lr`` on the scores, ``tau_start``/``tau_end`` in rank units,
    ``dual_lr``, ``penalty``, ``seed``); ``tokens`` / ``teacher`` as for
    :func:`~autocompress_opt.search.inner.inner_search.search` (the first ``val_samples`` rows choose
    between the trained and the start choice). ``on_step(step, val_kl | None, violation | None)``
    after each step; every ``config.measure_every`` steps (or at the steps ``measure_at``:
    :meth:`~autocompress_opt.search.inner.inner_search.InnerConfig.measures`) with the current hard
    choice's held-out KL. ``per_layer``: each MoE layer learns its own expert width and top-``k``
    under the point's parameter budgets (module doc, "Per layer"; the Puzzle form,
    :func:`~autocompress_opt.arch.hybrid.per_layer_moe`); else every layer keeps the point's.
    Raises :class:`ConfigError` for a point that prunes a dense axis (:func:`expert_point`)."""
    from autocompress_opt.arch.search_space import uniform_allocation

    adapter = adapter or moe_adapter(model)
    point = expert_point(params, parent)
    if tuple(teacher.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"teacher log-probs {tuple(teacher.shape)} do not fit tokens {tuple(tokens.shape)}")
    if config.val_samples >= tokens.shape[0]:
        raise ConfigError(f"val_samples={config.val_samples} leaves no training rows of the {tokens.shape[0]} given")
    began = time.perf_counter()
    arch = uniform = uniform_allocation({**sparse_limits(parent), **point}, parent)
    start = expert_masks(model, importance, point)
    masks = ExpertMasks(
        adapter.all_layer_parts(model),
        importance,
        point,
        start,
        device=next(model.parameters()).device,
        scoring=adapter.base(model).router_scoring,
        per_layer=per_layer,
    )
    val, train = slice(0, config.val_samples), slice(config.val_samples, None)
    budget = param_budget(parent, point)
    history = _train(
        model,
        masks,
        parent,
        tokens[train],
        teacher[train],
        budget,
        config,
        on_step,
        tokens[val],
        teacher[val],
        adapter,
        measure_at,
    )
    repaired = repair_counts(masks, parent, budget)
    arch = layer_architecture(arch, masks)
    trained_at = time.perf_counter()
    candidates = {"trained": discretise_experts(masks, parent), "start": start}
    violations, metrics = _exact(arch, masks, parent, budget, goal)
    feasible = all_satisfied(violations)
    kls = {n: _masks_kl(model, m, tokens[val], teacher[val], config.batch_size, adapter) for n, m in candidates.items()}
    chosen = min(candidates, key=lambda n: (kls[n] if math.isfinite(kls[n]) else 0.0, list(candidates).index(n)))
    selection: dict[str, Any] = {n: {"feasible": feasible, "val_kl": kls[n]} for n in candidates}
    selection["chosen"] = chosen
    done = time.perf_counter()
    seconds = {"train": trained_at - began, "select": done - trained_at, "total": done - began}
    if chosen == "start":  # the importance choice keeps the point's counts in every layer
        arch, violations, metrics = uniform, *_exact(uniform, None, parent, budget, goal)
        feasible = all_satisfied(violations)
    result = ExpertResult(
        arch, candidates[chosen], feasible, violations, metrics, history, selection, seconds, candidates
    )
    result.layers = {**masks.layer_counts(), "repaired_steps": repaired} if per_layer else {}
    return result


def _exact(
    arch: Architecture,
    masks: ExpertMasks | None,
    parent: Architecture,
    budget: Mapping[str, float],
    goal: CostGoal | None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Violations of the discrete choice of ``masks`` (None: the point's own counts, its budgets met
    by definition): the parameter budgets, then the target's constraints by the exact cost model on
    the child's architecture."""
    out: dict[str, float] = dict.fromkeys(budget, 0.0)
    if masks is not None:
        with torch.no_grad():
            out = {k: float(v) for k, v in budget_use(masks, parent, budget, masks.expected(0.0, hard=True)).items()}
    metrics: dict[str, float] = {}
    if goal is not None:
        hardware, metrics = goal.target.check(arch, goal.parent_metrics)
        out.update(hardware)
    return out, metrics


def _violations(
    masks: ExpertMasks, parent: Architecture, budget: Mapping[str, float], tau: float
) -> dict[str, torch.Tensor]:
    """Differentiable parameter budgets (straight-through: the hard choice's values)."""
    return budget_use(masks, parent, budget, masks.expected(tau))


def _train(
    model: Any,
    masks: ExpertMasks,
    parent: Architecture,
    tokens: torch.Tensor,
    teacher: Teacher,
    budget: Mapping[str, float],
    config: Any,
    on_step: Any,
    val_tokens: torch.Tensor,
    val_teacher: Teacher,
    adapter: FamilyAdapter,
    measure_at: Collection[int] | None = None,
) -> list[dict[str, float]]:
    """Adam (``gate_lr``) on the scores against KL + Lagrangian, with dual ascent; the history."""
    if not config.steps:
        return []
    gen = torch.Generator().manual_seed(config.seed)
    counts = [p for p in (masks.width_keep, masks.topk_keep) if p is not None]
    scores = [p for p in masks.parameters() if all(p is not c for c in counts)]
    optimizer = torch.optim.Adam(scores, lr=config.gate_lr)
    # The per-layer counts move in proportion to each layer's own gradient (SharedScaleAdam), not in lockstep.
    count_step = SharedScaleAdam(counts, lr=config.lr) if counts else None
    device = next(model.parameters()).device
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    duals: dict[str, float] = {}
    history: list[dict[str, float]] = []
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        model.eval()
        with masks.install():
            for step in range(config.steps):
                tau = config.tau(step)
                rows = torch.randint(0, tokens.shape[0], (config.batch_size,), generator=gen)
                with masks.use(masks.live(tau)):
                    logits = model(input_ids=tokens[rows].to(device), use_cache=False).logits  # (B, T, V)
                kl = teacher_kl(log_probs(logits), teacher[rows].to(logits.device)).mean()
                violations = _violations(masks, parent, budget, tau)
                priced = {k: v for k, v in violations.items() if not (masks.per_layer and k in PROJECTED)}
                penalty = sum(
                    (duals.get(k, 0.0) * v + config.penalty / 2 * torch.relu(v) ** 2 for k, v in priced.items()),
                    torch.zeros((), dtype=torch.float64, device=masks.expert_score.device),
                )
                loss = kl + penalty.to(device=kl.device, dtype=kl.dtype)
                if loss.requires_grad:  # else every unit is kept: nothing to learn, the start is the choice
                    optimizer.zero_grad(set_to_none=True)
                    if count_step is not None:
                        count_step.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    if count_step is not None:
                        count_step.step()
                        project_counts(masks, parent, budget)
                values = {k: float(v.detach()) for k, v in violations.items()}
                for k, v in values.items():
                    duals[k] = max(0.0, duals.get(k, 0.0) + config.dual_lr * v)
                history.append(
                    {
                        "step": step,
                        "tau": tau,
                        "kl": float(kl.detach()),
                        "penalty": float(penalty.detach()),
                        "max_violation": max(values.values(), default=0.0),
                    }
                )
                done = step + 1
                if on_step is None:
                    continue
                if config.measures(done, measure_at) and val_tokens.shape[0]:
                    with masks.use(masks.live(0.0)), torch.no_grad():  # the hard choice, as discretised
                        val_kl = _kl_rows(model, val_tokens, val_teacher, config.batch_size)
                    on_step(done, val_kl, max(max(values.values(), default=0.0), 0.0))
                else:
                    on_step(done, None, None)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)
    return history


def _kl_rows(model: Any, tokens: torch.Tensor, teacher: Teacher, batch_size: int) -> float:
    """Mean per-position KL(parent ‖ model as it computes now) on ``tokens``, in nats."""
    device = next(model.parameters()).device
    total = 0.0
    for start in range(0, tokens.shape[0], batch_size):
        logits = model(input_ids=tokens[start : start + batch_size].to(device), use_cache=False).logits
        kl = teacher_kl(log_probs(logits), teacher[start : start + batch_size].to(logits.device)).mean()
        total += float(kl) * logits.shape[0]
    return total / tokens.shape[0]


def _masks_kl(
    model: Any, masks: Masks, tokens: torch.Tensor, teacher: Teacher, batch_size: int, adapter: FamilyAdapter
) -> float:
    """KL(parent ‖ parent under the bool ``masks``) on ``tokens`` (NaN without rows)."""
    if not tokens.shape[0]:
        return math.nan
    with apply_masks(model, masks, adapter=adapter), torch.inference_mode():
        return _kl_rows(model, tokens, teacher, batch_size)
