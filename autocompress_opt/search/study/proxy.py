"""The cheap proxy of a weights-mode study: plan-mode scoring of global points, before and between
the expensive trials (multi-fidelity, the first and cheapest fidelity).

A point's proxy is what a plan-mode trial computes (:func:`~autocompress_opt.search.study.trials.plan_trial`,
with the same functions; the cost model runs on a batch of points at once): the engine-legal
uniform model of the point (:func:`~autocompress_opt.search.study.trials.uniform_model`; layers ranked as
the weights trial ranks them), the target's exact cost metrics and constraint violations, and — with
the parent's importance — the retained importance, else the retained parameter fraction
(:func:`~autocompress_opt.search.study.trials.plan_quality`), or with ``proxy_quality: estimate`` the
per-axis quality estimate fitted on measured KL (:mod:`autocompress_opt.quality.estimate`). A study
uses it twice (:mod:`.study`, :mod:`.searcher`):

- **ranking**: before its weights trials, each target's study enqueues the ``k`` best points by the
  proxy among the feasible, *maximal* ones (no other feasible point scored is at least as large in
  every choice: pruning such a point keeps a subset of what the larger one keeps, so it would
  waste a trial), scored over the whole search space or, for a space larger than
  :data:`RANK_POINTS`, a seeded random sample of that many points;
- **screening**: a point the sampler proposes whose uniform model the proxy already finds
  infeasible is never run in weights mode; it is told PRUNED with the attribute
  ``proxy_infeasible`` (its violations) and the sampler asks again. The inner search could shrink
  such a point below its budgets until it fits, but the result is then a smaller point's, which the
  sampler can propose itself.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_moe, is_sparse
from autocompress_opt.arch.search_space import CHOICES, SPARSE_CHOICES, SearchSpace
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.study.trials import LegalMemo, plan_quality, uniform_model
from autocompress_opt.serving.costmodel import ArchArrays, estimate_batch
from autocompress_opt.serving.targets import Target, all_satisfied

__all__ = ["PROXY_ATTR", "RANK_POINTS", "Proxy", "ProxyScore", "maximal", "retained_expert_importance"]

PROXY_ATTR = "proxy_infeasible"  # user attribute of a point the proxy screened out (its violations)
PROXY_RANK_ATTR = "proxy_rank"  # user attribute of a point the ranking enqueued (1 = best)
RANK_POINTS = 16384  # points the ranking scores at most (a seeded sample of a larger space)
COST_CHUNK = 4096  # architectures per cost-model call of Proxy.check_many


@dataclass(frozen=True)
class ProxyScore:
    """One point under the proxy: the legal point scored, its violations (``<= 0`` satisfied),
    whether all hold, and the proxy quality (None when not computed)."""

    point: dict[str, int]
    violations: dict[str, float]
    feasible: bool
    quality: float | None = None
    why_not: str | None = None  # the engine cannot load any point at or below it


@dataclass
class Proxy:
    """The plan-mode proxy of one target's study (module doc)."""

    parent: Architecture
    space: SearchSpace
    target: Target
    parent_cost: Mapping[str, float]
    serve_as: str = "any"
    importance: Any = None
    layer_order: Sequence[int] | None = None
    # Candidates' parameters and loadability (trials.legal_point): of this parent, space and serve_as
    # only; targets that share them may share it (make_proxy).
    memo: LegalMemo = field(default_factory=dict, repr=False)
    # what ranks points: "importance" (the importance kept, else the parameters) or "estimate" (exp(-KL)
    # of the per-axis quality estimate fitted on measured KL, quality.estimate)
    quality: str = "importance"

    def __post_init__(self) -> None:
        if self.layer_order is None and self.importance is not None:
            self.layer_order = self.importance.layer_order()

    def _quality(self, arch: Architecture) -> float:
        """The proxy quality of ``arch``: :func:`~.trials.plan_quality`; for a MoE parent with importance,
        the expert mass its counts keep (:func:`retained_expert_importance`: the dense
        plan's retained importance counts no expert); with ``quality="estimate"``, ``exp(−KL̂)`` of the
        per-axis estimate (:mod:`autocompress_opt.quality.estimate`) whatever the parent."""
        if self.quality == "estimate":
            return plan_quality(arch, self.parent, None, "estimate")[0]
        if self.importance is not None and is_moe(self.parent):
            return retained_expert_importance(arch, self.importance)
        return plan_quality(arch, self.parent, self.importance)[0]

    def check(self, params: Mapping[str, Any]) -> ProxyScore:
        """Feasibility of ``params``' engine-legal uniform model (no quality: the cheap part)."""
        return self.check_many([params])[0]

    def check_many(self, points: Sequence[Mapping[str, Any]]) -> list[ProxyScore]:
        """:meth:`check` of every point, the cost model run once per :data:`COST_CHUNK` of them
        (:func:`~autocompress_opt.serving.costmodel.estimate_batch`)."""
        scores: list[ProxyScore | None] = [None] * len(points)
        built: list[tuple[int, dict[str, int], Architecture]] = []
        for i, params in enumerate(points):
            point = {k: int(params[k]) for k in _names(self.space)}
            try:
                legal, arch = uniform_model(point, self.space, self.parent, self.serve_as, self.layer_order, self.memo)
            except ConfigError as exc:
                scores[i] = ProxyScore(point, {}, False, why_not=str(exc))
                continue
            built.append((i, legal, arch))
        target = self.target
        for start in range(0, len(built), COST_CHUNK):
            chunk = built[start : start + COST_CHUNK]
            arrays = ArchArrays.from_architectures([arch for *_, arch in chunk])
            metrics = estimate_batch(arrays, target.hardware, target.engine_obj(), target.scenario())
            violations = {
                k: np.asarray(v).reshape(-1)
                for k, v in target.violations(metrics, self.parent_cost, is_sparse(self.parent)).items()
            }
            for row, (i, legal, _) in enumerate(chunk):
                mine = {k: float(v[row]) for k, v in violations.items()}
                scores[i] = ProxyScore(legal, mine, all_satisfied(mine))
        return [score for score in scores if score is not None]

    def rank(self, k: int, seed: int = 0, limit: int = RANK_POINTS) -> list[ProxyScore]:
        """The ``k`` best feasible maximal points by proxy quality (module doc), best first; ties go
        to the larger model. Scores the whole space, or ``limit`` points of it drawn with ``seed``."""
        if k <= 0:
            return []
        points = _points(self.space, limit, seed)
        scored: dict[tuple[int, ...], ProxyScore] = {}
        for score in self.check_many(points):
            if score.feasible:
                scored.setdefault(tuple(score.point[c] for c in _names(self.space)), score)
        ranked = []
        for key in maximal(list(scored)):
            s = scored[key]
            arch = self.space.architecture(s.point, self.parent, self.layer_order)
            quality = self._quality(arch)
            ranked.append((-quality, -arch.num_params, ProxyScore(s.point, s.violations, True, quality)))
        ranked.sort(key=lambda r: r[:2])
        return [score for *_, score in ranked[:k]]


def maximal(points: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The points no other point matches or exceeds in every coordinate (duplicates removed)."""
    unique = sorted(set(points), key=lambda p: sum(p), reverse=True)
    kept: list[tuple[int, ...]] = []
    for p in unique:
        if not any(all(a >= b for a, b in zip(q, p)) for q in kept):
            kept.append(p)
    return kept


def _points(space: SearchSpace, limit: int, seed: int) -> list[dict[str, int]]:
    """Every point of ``space``, or ``limit`` of them drawn with ``seed`` when it has more."""
    names = _names(space)
    values = [space[c].values for c in names]
    if space.size <= limit:
        return [dict(zip(names, combo)) for combo in itertools.product(*values)]
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    while len(seen) < limit:
        seen.add(tuple(rng.choice(v) for v in values))
    return [dict(zip(names, combo)) for combo in sorted(seen)]


def _names(space: SearchSpace) -> tuple[str, ...]:
    """The choices of a point of ``space``: the dense five, and a MoE / hybrid space's own."""
    return tuple(c for c in CHOICES + SPARSE_CHOICES if c in space.names)


def retained_expert_importance(arch: Architecture, importance: Any) -> float:
    """The proxy's quality of a MoE / hybrid point: per MoE layer, the fraction of ``expert_frequency``
    (router use) of the ``num_experts`` most used experts, times the mean fraction of ``expert_ffn``
    mass their ``expert_width`` most active channels hold, times (with a shared expert) the fraction of
    ``shared_ffn`` mass its ``shared_width`` most active channels hold; per Mamba-2 layer, the fraction
    of ``mamba_heads`` mass its kept heads hold (the most active ``H / G`` of each group); per attention
    layer whose heads are cut, the fraction of ``heads`` mass the kept ones hold (the dense plan's rule:
    the best KV groups, the best query heads of each); averaged over those layers; times, where
    ``arch`` drops layers of the parent (listed as dropped, as a uniform child lists them), the share
    of the parent's ``skip_loss`` (clamped at 0) its kept layers hold; times, where ``arch`` keeps fewer
    residual channels than the parent, the share of the ``hidden`` score mass its most active channels hold.
    With the record's ``routing_mass``, a MoE layer's fraction is also times the share of the routing
    weight its ``experts_per_token`` largest choices hold (an experts-per-token cut scored by the mass
    it drops; records without it leave top-``k`` out). In [0, 1], 1.0 for the parent; the units are the
    ones :func:`~autocompress_opt.prune.experts.expert_masks` keeps (ties aside)."""
    fractions = []
    for i, layer in enumerate(arch.layers):
        if layer.mamba is not None and i < len(importance.mamba_heads) and importance.mamba_heads[i] is not None:
            heads = importance.mamba_heads[i].clamp_min(0).reshape(layer.mamba.groups, -1)  # (G, H/G) of the parent
            fractions.append(_kept_mass_of_groups(heads, layer.mamba.num_heads // layer.mamba.groups))
        if layer.attention and i < len(importance.heads) and importance.heads[i] is not None:
            fractions.extend(_kept_head_mass(importance, i, layer))
        if layer.moe is None or i >= len(importance.expert_frequency) or importance.expert_frequency[i] is None:
            continue
        freq = importance.expert_frequency[i].clamp_min(0)  # (E,)
        kept = freq.argsort(descending=True)[: layer.moe.num_experts]
        used = float(freq[kept].sum()) / float(freq.sum()) if float(freq.sum()) > 0 else 1.0
        ffn = importance.expert_ffn[i][kept].clamp_min(0)  # (n, F)
        channels = _kept_mass(ffn, layer.moe.expert_width)
        shared = importance.shared_ffn[i] if i < len(importance.shared_ffn) else None
        if layer.moe.shared_width and shared is not None:
            channels *= _kept_mass(shared.clamp_min(0)[None], layer.moe.shared_width)
        mass = importance.routing_mass[i] if i < len(importance.routing_mass) else None
        if mass is not None:  # an experts-per-token cut: the routing weight it drops
            channels *= _kept_mass(mass.clamp_min(0)[None], layer.moe.experts_per_token)
        fractions.append(used * channels)
    if not fractions:
        raise ConfigError("the importance record has no expert scores for this MoE architecture")
    dense = 1.0  # what the dense cuts keep: the depth's share of skip-loss, times the hidden channels' mass
    if len(arch.layers) == len(importance.skip_loss) and any(layer.is_noop for layer in arch.layers):
        skip = importance.skip_loss.clamp_min(0)
        kept = [i for i, layer in enumerate(arch.layers) if not layer.is_noop]
        dense = float(skip[kept].sum()) / float(skip.sum()) if float(skip.sum()) > 0 else len(kept) / len(arch.layers)
    if arch.hidden_size < len(importance.hidden):  # a hidden cut: the channel mass it keeps
        dense *= _kept_mass(importance.hidden.clamp_min(0)[None], arch.hidden_size)
    return dense * sum(fractions) / len(fractions)


def _kept_mass_of_groups(heads: Any, per_group: int) -> float:
    """The fraction of ``heads`` ``(G, H/G)`` mass (non-negative) that the ``per_group`` highest of each group hold."""
    total = float(heads.sum())
    return float(heads.sort(dim=1, descending=True).values[:, :per_group].sum()) / total if total > 0 else 1.0


def _kept_mass(scores: Any, n: int) -> float:
    """Mean over the rows of ``scores`` ``(rows, units)`` (non-negative) of the fraction of each row's
    mass its ``n`` highest units hold (1.0 for a row without mass)."""
    top = scores.sort(dim=1, descending=True).values[:, :n].sum(dim=1)
    total = scores.sum(dim=1)
    return float((top / total.clamp_min(1e-30)).where(total > 0, top.new_ones(())).mean())


def _kept_head_mass(importance: Any, i: int, layer: Any) -> list[float]:
    """``[fraction of layer i's query-head score mass (clamped at 0) its kept heads hold]`` when ``layer``
    keeps fewer heads than the parent's layer ``i`` (the heads a MoE trial's cut keeps:
    :func:`~autocompress_opt.prune.plan.layer_heads`), else ``[]``."""
    from autocompress_opt.prune.plan import layer_heads

    full = importance.architecture.layers[i]
    if (layer.num_heads, layer.num_kv_heads) == (full.num_heads, full.num_kv_heads):
        return []
    heads = importance.heads[i].clamp_min(0)
    kept, _ = layer_heads(
        importance.kv_groups[i], importance.heads[i], layer.num_kv_heads, layer.num_heads // layer.num_kv_heads
    )
    total = float(heads.sum())
    return [float(heads[list(kept)].sum()) / total if total > 0 else 1.0]
