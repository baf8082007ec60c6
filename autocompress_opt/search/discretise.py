"""From trained masks to a discrete, feasible architecture: round to hardware-friendly sizes
(whole FFN units, whole KV groups; gates at 1/2), cap kept sub-blocks by the layer budget,
**repair** with the exact cost model (greedily remove the unit with the least importance per unit of
violation removed) until every constraint and budget holds, then **fill** (greedily add back the
unit with the most importance per unit of slack used while everything still holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.search.budget import Budget, CostGoal, exact_violations, totals_of
from autocompress_opt.search.relaxation import DiscreteLayer, ParentMasks
from autocompress_opt.serving.costmodel import ArchArrays
from autocompress_opt.serving.targets import all_satisfied

__all__ = ["Discrete", "discretise"]


# -------------------------------------------------------------------- discretisation
@dataclass(frozen=True)
class _Values:
    """Importance of each unit, comparable across layers: a unit's share of its sub-block's summed
    scores × half the layer's importance (``skip_loss``, floored at a small positive value)."""

    ffn: list[list[float]]  # [layer][unit rank]
    heads: list[list[list[float]]]  # [layer][group rank][head rank inside group]


def _unit_values(masks: ParentMasks, importance: Importance) -> _Values:
    skip = importance.skip_loss.double().clamp(min=0)
    floor = max(float(skip.mean()) * 1e-3, 1e-9)
    weight = (skip + floor).tolist()
    ffn, heads = [], []
    for i, spec in enumerate(masks.parent.layers):
        f_vals: list[float] = []
        ffn_scores, head_scores, group_scores = importance.ffn[i], importance.heads[i], importance.kv_groups[i]
        if spec.ffn:
            assert ffn_scores is not None  # Importance holds scores for every kept sub-block
            scores = torch.sort(ffn_scores.double(), descending=True, stable=True).values
            f_vals = (scores.view(-1, masks.ffn_unit).sum(-1) / scores.sum() * weight[i] / 2).tolist()
        h_vals: list[list[float]] = []
        if spec.attention:
            r = spec.num_heads // spec.num_kv_heads
            assert head_scores is not None and group_scores is not None
            by_group = head_scores.double().view(spec.num_kv_heads, r)
            total = by_group.sum()
            for g in ranked(group_scores).tolist():
                sorted_heads = torch.sort(by_group[g], descending=True, stable=True).values
                h_vals.append((sorted_heads / total * weight[i] / 2).tolist())
        ffn.append(f_vals)
        heads.append(h_vals)
    return _Values(ffn, heads)


def _attn_value(v: _Values, i: int, d: DiscreteLayer) -> float:
    return sum(v.heads[i][g][j] for g in range(d.kv_groups) for j in range(d.q_per_group)) if d.attention else 0.0


def _ffn_value(v: _Values, i: int, d: DiscreteLayer) -> float:
    return sum(v.ffn[i][: d.ffn_units]) if d.ffn else 0.0


def _shrink_moves(layers: list[DiscreteLayer], v: _Values) -> list[tuple[str, list[DiscreteLayer], float]]:
    """Every one-step removal: (description, new layers, importance lost)."""
    active = sum(d.attention or d.ffn for d in layers)
    moves = []

    def add(name: str, i: int, new: DiscreteLayer, lost: float) -> None:
        if not (new.attention or new.ffn) and active <= 1:
            return  # keep at least one layer computing something
        moves.append((f"{name}@{i}", layers[:i] + [new] + layers[i + 1 :], lost))

    for i, d in enumerate(layers):
        if d.ffn:
            if d.ffn_units > 1:
                add("ffn-unit", i, replace(d, ffn_units=d.ffn_units - 1), v.ffn[i][d.ffn_units - 1])
            add("drop-ffn", i, replace(d, ffn=False), _ffn_value(v, i, d))
        if d.attention:
            if d.kv_groups > 1:
                add(
                    "kv-group",
                    i,
                    replace(d, kv_groups=d.kv_groups - 1),
                    sum(v.heads[i][d.kv_groups - 1][: d.q_per_group]),
                )
            if d.q_per_group > 1:
                add(
                    "q-head",
                    i,
                    replace(d, q_per_group=d.q_per_group - 1),
                    sum(v.heads[i][g][d.q_per_group - 1] for g in range(d.kv_groups)),
                )
            add("drop-attn", i, replace(d, attention=False), _attn_value(v, i, d))
        if d.attention and d.ffn:
            add("drop-layer", i, replace(d, attention=False, ffn=False), _attn_value(v, i, d) + _ffn_value(v, i, d))
    return moves


def _grow_moves(
    layers: list[DiscreteLayer], v: _Values, parent: Architecture, sizes: torch.Tensor
) -> list[tuple[str, list[DiscreteLayer], float]]:
    """Every one-step addition the parent allows: (description, new layers, importance gained)."""
    moves = []
    for i, (d, p) in enumerate(zip(layers, parent.layers)):
        g_n, r_n, u_n = (int(x) for x in sizes[i])

        def add(name: str, new: DiscreteLayer, gained: float, i: int = i) -> None:
            moves.append((f"{name}@{i}", layers[:i] + [new] + layers[i + 1 :], gained))

        if p.ffn:
            if not d.ffn:
                add("add-ffn", replace(d, ffn=True, ffn_units=1), v.ffn[i][0])
            elif d.ffn_units < u_n:
                add("ffn-unit", replace(d, ffn_units=d.ffn_units + 1), v.ffn[i][d.ffn_units])
        if p.attention:
            if not d.attention:
                r = max(1, min(d.q_per_group, r_n))
                add("add-attn", replace(d, attention=True, kv_groups=1, q_per_group=r), sum(v.heads[i][0][:r]))
            else:
                if d.kv_groups < g_n:
                    add(
                        "kv-group", replace(d, kv_groups=d.kv_groups + 1), sum(v.heads[i][d.kv_groups][: d.q_per_group])
                    )
                if d.q_per_group < r_n:
                    add(
                        "q-head",
                        replace(d, q_per_group=d.q_per_group + 1),
                        sum(v.heads[i][g][d.q_per_group] for g in range(d.kv_groups)),
                    )
    return moves


class _Evaluator:
    """Violations of many candidate architectures at once (numpy :func:`estimate_batch`: the same
    equations as :func:`estimate_cost`, which judges the final answer)."""

    def __init__(self, masks: ParentMasks, budget: Budget, goal: CostGoal | None) -> None:
        self.masks, self.budget, self.goal = masks, budget, goal
        self.names = list(budget.limits()) + (list(goal.violations(goal.parent_metrics)) if goal else [])

    def __call__(self, candidates: Sequence[list[DiscreteLayer]]) -> np.ndarray:
        archs = [self.masks.architecture(c) for c in candidates]
        rows = [self.budget.violations(totals_of(a)) for a in archs]
        if self.goal is not None:
            metrics = self.goal.metrics(ArchArrays.from_architectures(archs))
            for n, row in enumerate(rows):
                one = {k: float(np.asarray(m).reshape(-1)[n]) for k, m in metrics.items()}
                row.update(self.goal.violations(one))
        return np.array([[float(r[k]) for k in self.names] for r in rows])  # (N, K)


@dataclass(frozen=True)
class Discrete:
    """A discretised, repaired point: its architecture and verdict by the exact cost model."""

    architecture: Architecture
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    moves: dict[str, int]


def discretise(
    masks: ParentMasks, importance: Importance, budget: Budget, goal: CostGoal | None, *, fill: bool = True
) -> Discrete:
    """Round the masks, cap the kept layers by gate value, repair, fill; judged by :func:`exact_violations`."""
    values = _unit_values(masks, importance)
    layers = _ensure_active(_cap_layers(masks.discrete(), budget.num_layers, values), masks)
    evaluate = _Evaluator(masks, budget, goal)
    layers, repaired = _repair(layers, values, evaluate)
    filled = 0
    if fill and np.all(evaluate([layers])[0] <= 0):
        layers, filled = _fill(layers, values, evaluate, masks)
    arch = masks.architecture(layers)
    violations, metrics = exact_violations(arch, budget, goal)
    feasible = all_satisfied(violations)
    return Discrete(arch, feasible, violations, metrics, {"repair": repaired, "fill": filled})


def _ensure_active(layers: list[DiscreteLayer], masks: ParentMasks) -> list[DiscreteLayer]:
    """A decoder needs one computing layer: if the masks dropped all, revive the one with the
    highest gate score (its FFN, else its attention, at least one unit)."""
    if any(d.attention or d.ffn for d in layers):
        return layers
    i = max(range(len(layers)), key=lambda j: (layers[j].gate_score, -j))
    d, spec = layers[i], masks.parent.layers[i]
    if spec.ffn:
        revived = replace(d, ffn=True, ffn_units=max(d.ffn_units, 1))
    else:
        revived = replace(d, attention=True, kv_groups=max(d.kv_groups, 1), q_per_group=max(d.q_per_group, 1))
    return layers[:i] + [revived] + layers[i + 1 :]


def _cap_layers(layers: list[DiscreteLayer], limit: int, values: _Values) -> list[DiscreteLayer]:
    """Drop kept sub-blocks until at most ``limit`` layer equivalents remain (two sub-blocks per
    layer): from the layer with the lowest gate score, its less important sub-block first."""
    layers = list(layers)
    while sum(d.attention + d.ffn for d in layers) > 2 * limit:
        i = min((j for j, d in enumerate(layers) if d.attention or d.ffn), key=lambda j: (layers[j].gate_score, -j))
        d = layers[i]
        drop_attn = d.attention and (not d.ffn or _attn_value(values, i, d) <= _ffn_value(values, i, d))
        layers[i] = replace(d, attention=False) if drop_attn else replace(d, ffn=False)
    return layers


_BATCH_MOVES = 8  # most one-unit removals applied at once while far from feasible (on distinct layers)


def _repair(layers: list[DiscreteLayer], values: _Values, evaluate: _Evaluator) -> tuple[list[DiscreteLayer], int]:
    """Greedy: remove the unit with the least importance per unit of total violation removed.

    While the total excess is large, the best few removals on distinct layers are applied together
    (``1 + 8·excess`` of them, at most :data:`_BATCH_MOVES`), so a far-off start does not cost one
    cost-model sweep per unit; near the boundary it is one unit at a time.
    """
    current = evaluate([layers])[0]
    moves = 0
    while np.any(current > 0):
        candidates = _shrink_moves(layers, values)
        if not candidates:
            break  # nothing left to remove: infeasible
        viol = evaluate([c[1] for c in candidates])  # (N, K)
        lost = np.array([c[2] for c in candidates]) + 1e-12
        over = current > 0
        gain = np.maximum(current, 0).sum() - np.maximum(viol, 0).sum(1)
        if np.any(gain > 1e-12):
            score = np.where(gain > 1e-12, lost / np.maximum(gain, 1e-12), np.inf)
        else:  # e.g. a stepwise metric: reduce the violated values themselves, else shrink cheaply
            drop = (current[over][None, :] - viol[:, over]).sum(1)
            score = np.where(drop > 1e-12, lost / np.maximum(drop, 1e-12), np.inf)
            if not np.isfinite(score).any():
                score = lost
        best = int(np.argmin(score))
        batch = min(_BATCH_MOVES, 1 + int(8 * np.maximum(current, 0).sum()))
        if batch > 1:
            combined, applied = _combine(layers, candidates, np.argsort(score, kind="stable"), score, batch)
            if applied > 1:
                after = evaluate([combined])[0]
                if np.maximum(after, 0).sum() < np.maximum(viol[best], 0).sum():
                    layers, current, moves = combined, after, moves + applied
                    continue
        layers, current = candidates[best][1], viol[best]
        moves += 1
    return layers, moves


def _combine(
    layers: list[DiscreteLayer],
    candidates: list[tuple[str, list[DiscreteLayer], float]],
    order: np.ndarray,
    score: np.ndarray,
    limit: int,
) -> tuple[list[DiscreteLayer], int]:
    """Apply the best-scoring finite moves, at most one per layer and ``limit`` in all."""
    combined, touched = list(layers), set[int]()
    for j in order:
        if len(touched) >= limit or not np.isfinite(score[j]):
            break
        i = int(candidates[j][0].rsplit("@", 1)[1])
        if i not in touched:
            touched.add(i)
            combined[i] = candidates[j][1][i]
    if not any(d.attention or d.ffn for d in combined):
        return layers, 0  # never remove the last computing layer
    return combined, len(touched)


def _fill(
    layers: list[DiscreteLayer], values: _Values, evaluate: _Evaluator, masks: ParentMasks
) -> tuple[list[DiscreteLayer], int]:
    """Greedy: add the unit with the most importance per unit of slack used while all constraints hold."""
    current = evaluate([layers])[0]
    moves, cap = 0, 8 * len(layers)
    while moves < cap:
        candidates = _grow_moves(layers, values, masks.parent, masks.sizes)
        if not candidates:
            break
        viol = evaluate([c[1] for c in candidates])
        ok = np.all(viol <= 0, axis=1)
        if not ok.any():
            break
        gained = np.array([c[2] for c in candidates])
        used = np.maximum(viol - current[None, :], 0).sum(1)
        score = np.where(ok, gained / np.maximum(used, 1e-12), -np.inf)
        best = int(np.argmax(score))
        layers, current = candidates[best][1], viol[best]
        moves += 1
    return layers, moves
