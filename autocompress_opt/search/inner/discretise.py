"""From trained masks to a discrete, feasible architecture: round to hardware-friendly sizes
(whole FFN units, whole KV groups; gates at 1/2), cap kept sub-blocks by the layer budget,
**repair** with the exact cost model (greedily remove the unit with the least importance per unit of
violation removed) until every constraint and budget holds, then **fill** (greedily add back the
unit with the most importance per unit of slack used while everything still holds).

Under a serving engine's rules (``rules``, :class:`~autocompress_opt.prune.loadability.ShapeRules`)
every step stays a shape that engine loads: FFN widths move in the engine's multiple (256 for the
DeciLM readers), every attention layer keeps the trial's query heads (only the KV grouping varies,
``kv_groups · q_per_group`` fixed), the first kept layer keeps its attention where the engine needs
it, and where it loads no per-layer shapes for this parent (:attr:`ShapeRules.heterogeneous`) the
result is the uniform model of the trial's global choices on the layers the gates rank highest.

Every move changes one layer, so a move's candidates are scored as rows of packed cost-model arrays
(:class:`~autocompress_opt.search.inner.candidates._Evaluator`; repair screens them first by
per-layer deltas of the cost model's sums and scores exactly only those that can decide the move:
:func:`~autocompress_opt.search.inner.candidates.repair_scores`): the current layers' row repeated,
the changed layer's column replaced, one numpy
:func:`~autocompress_opt.serving.costmodel.estimate_batch` for the rows that need it. No
:class:`Architecture` is built per candidate: a move costs ``O(L)`` in Python plus array work,
where building and packing every candidate cost ``O(L²)`` in Python. The budgets are exact sums
(the block's, with one column's difference); fill rebuilds only the moved layer's candidates, and
evaluates the target's cost model in two rounds: the candidates that scored best at the last move,
then only those whose budget-only bound can still beat them (:func:`_fill_scores`). The rows are exactly what
``ArchArrays.from_architectures`` packs for those architectures, so every violation, and every
choice made from them, is the one the per-candidate architectures gave
(``tests/search/test_discretise_equivalence.py``; timings: ``benchmarks/bench_discretise.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import islice

import numpy as np
import torch

from autocompress_opt.arch.architecture import Architecture, LayerSpec, uniform_child
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.export import decilm_problems
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.prune.loadability import ShapeRules
from autocompress_opt.search.inner.budget import Budget, CostGoal, exact_violations
from autocompress_opt.search.inner.candidates import _Evaluator, _Packed, repair_scores
from autocompress_opt.search.inner.relaxation import DiscreteLayer, ParentMasks
from autocompress_opt.serving.targets import all_satisfied

__all__ = ["Discrete", "discretise", "shape_problems"]


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
            scores = _descending(ffn_scores)
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


def _descending(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` in float64 sorted from the highest, on their device: the values of
    ``torch.sort(descending=True)`` (equal values are equal floats, so the order among them is
    immaterial), by numpy's sort, which takes a tenth of torch's time on a CPU (~0.1 ms vs 2 ms
    for an FFN of 28672 channels; 126 such layers made this a tenth of a 126-layer discretisation)."""
    ascending = np.sort(scores.detach().double().cpu().numpy())
    return torch.from_numpy(np.ascontiguousarray(ascending[::-1])).to(scores.device)


def _attn_value(v: _Values, i: int, d: DiscreteLayer) -> float:
    return sum(v.heads[i][g][j] for g in range(d.kv_groups) for j in range(d.q_per_group)) if d.attention else 0.0


def _ffn_value(v: _Values, i: int, d: DiscreteLayer) -> float:
    return sum(v.ffn[i][: d.ffn_units]) if d.ffn else 0.0


# One move: (kind, layer index, the layer's new state, importance it loses or gains).
_Move = tuple[str, int, DiscreteLayer, float]


def _applied(layers: list[DiscreteLayer], i: int, new: DiscreteLayer) -> list[DiscreteLayer]:
    return layers[:i] + [new] + layers[i + 1 :]


def _shrink_layer(i: int, d: DiscreteLayer, v: _Values) -> list[_Move]:
    """Every one-step removal from layer ``i`` (state ``d``), before :func:`_keeps_one`."""
    moves: list[_Move] = []
    if d.ffn:
        if d.ffn_units > 1:
            moves.append(("ffn-unit", i, replace(d, ffn_units=d.ffn_units - 1), v.ffn[i][d.ffn_units - 1]))
        moves.append(("drop-ffn", i, replace(d, ffn=False), _ffn_value(v, i, d)))
    if d.attention:
        if d.kv_groups > 1:
            lost = sum(v.heads[i][d.kv_groups - 1][: d.q_per_group])
            moves.append(("kv-group", i, replace(d, kv_groups=d.kv_groups - 1), lost))
        if d.q_per_group > 1:
            lost = sum(v.heads[i][g][d.q_per_group - 1] for g in range(d.kv_groups))
            moves.append(("q-head", i, replace(d, q_per_group=d.q_per_group - 1), lost))
        moves.append(("drop-attn", i, replace(d, attention=False), _attn_value(v, i, d)))
    if d.attention and d.ffn:
        lost = _attn_value(v, i, d) + _ffn_value(v, i, d)
        moves.append(("drop-layer", i, replace(d, attention=False, ffn=False), lost))
    return moves


def _keeps_one(layers: Sequence[DiscreteLayer]) -> Callable[[DiscreteLayer], bool]:
    """Whether a one-layer change to ``layers`` leaves a layer computing something, as a test of
    the changed layer's new state."""
    if sum(d.attention or d.ffn for d in layers) > 1:
        return lambda new: True
    return lambda new: new.attention or new.ffn


def _grow_layer(i: int, d: DiscreteLayer, v: _Values, p: LayerSpec, size: tuple[int, ...]) -> list[_Move]:
    """Every one-step addition to layer ``i`` (state ``d``) its parent layer ``p`` allows (``size``:
    the masks' KV groups, query heads per group and FFN units of the layer)."""
    g_n, r_n, u_n = size
    moves: list[_Move] = []
    if p.ffn:
        if not d.ffn:
            moves.append(("add-ffn", i, replace(d, ffn=True, ffn_units=1), v.ffn[i][0]))
        elif d.ffn_units < u_n:
            moves.append(("ffn-unit", i, replace(d, ffn_units=d.ffn_units + 1), v.ffn[i][d.ffn_units]))
    if p.attention:
        if not d.attention:
            r = max(1, min(d.q_per_group, r_n))
            new = replace(d, attention=True, kv_groups=1, q_per_group=r)
            moves.append(("add-attn", i, new, sum(v.heads[i][0][:r])))
        else:
            if d.kv_groups < g_n:
                gained = sum(v.heads[i][d.kv_groups][: d.q_per_group])
                moves.append(("kv-group", i, replace(d, kv_groups=d.kv_groups + 1), gained))
            if d.q_per_group < r_n:
                gained = sum(v.heads[i][g][d.q_per_group] for g in range(d.kv_groups))
                moves.append(("q-head", i, replace(d, q_per_group=d.q_per_group + 1), gained))
    return moves


@dataclass(frozen=True)
class Discrete:
    """A discretised, repaired point: its architecture and verdict by the exact cost model."""

    architecture: Architecture
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    moves: dict[str, int]


def discretise(
    masks: ParentMasks,
    importance: Importance,
    budget: Budget,
    goal: CostGoal | None,
    *,
    fill: bool = True,
    rules: ShapeRules | None = None,
) -> Discrete:
    """Round the masks, cap the kept layers by gate value, repair, fill; judged by :func:`exact_violations`.

    ``rules``: a serving engine's shape rules (module doc); None: any shape."""
    if rules is not None and not rules.heterogeneous:
        return _judged(_uniform(masks, budget), budget, goal, {"repair": 0, "fill": 0})
    values = _unit_values(masks, importance)
    legal = _Legal(rules, masks) if rules is not None else None
    layers = _ensure_active(_cap_layers(masks.discrete(), budget.num_layers, values), masks)
    if legal is not None:
        layers = legal.snap(layers)
    evaluate = _Evaluator(masks, budget, goal)
    layers, repaired = _repair(layers, values, evaluate, legal)
    filled = 0
    if fill and np.all(evaluate(layers)[0] <= 0):
        layers, filled = _fill(layers, values, evaluate, masks, legal)
    arch = masks.architecture(layers)
    if rules is not None and shape_problems(arch, rules):  # never expected: the moves keep the rules
        arch = _uniform(masks, budget)
    return _judged(arch, budget, goal, {"repair": repaired, "fill": filled})


def _judged(arch: Architecture, budget: Budget, goal: CostGoal | None, moves: dict[str, int]) -> Discrete:
    violations, metrics = exact_violations(arch, budget, goal)
    return Discrete(arch, all_satisfied(violations), violations, metrics, moves)


def shape_problems(arch: Architecture, rules: ShapeRules) -> list[str]:
    """Why ``arch`` breaks ``rules`` (empty when it keeps them): a uniform model keeps every rule;
    a heterogeneous one must be allowed, a DeciLM shape in the engine's FFN multiple with
    ``rules.query_heads`` in every attention layer, and keep attention in its first layer where
    the rules ask."""
    active = arch.active()
    if active.is_uniform:
        return []
    if not rules.heterogeneous:
        return [f"{rules.engine} loads no per-layer shapes of this parent ({rules.why_uniform})"]
    problems = decilm_problems(active)
    problems += [
        f"layer {i}: FFN width {layer.ffn_width} is not a multiple of {rules.ffn_multiple}"
        for i, layer in enumerate(active.layers)
        if layer.ffn and layer.ffn_width % rules.ffn_multiple
    ]
    heads = {layer.num_heads for layer in active.layers if layer.attention}
    if rules.query_heads is not None and heads - {rules.query_heads}:
        problems.append(f"query heads {sorted(heads)} where the rules keep {rules.query_heads} in every layer")
    if rules.first_layer_attention and not active.layers[0].attention:
        problems.append(f"{rules.engine} needs attention in the first layer")
    return problems


def _uniform(masks: ParentMasks, budget: Budget) -> Architecture:
    """The uniform model of ``budget`` on the ``budget.num_layers`` present layers with the highest
    gate scores (ties to the lower index)."""
    parent = masks.parent
    scores = [d.gate_score for d in masks.discrete()]
    present = [i for i, layer in enumerate(parent.layers) if not layer.is_noop]
    kept = sorted(sorted(present, key=lambda i: (-scores[i], i))[: budget.num_layers])
    return uniform_child(
        parent,
        kept_layers=kept,
        hidden_size=masks.hidden_size,
        num_kv_heads=budget.num_kv_heads,
        q_per_kv=budget.q_per_kv,
        ffn_width=budget.ffn_width,
        name=f"{parent.name or parent.family}-searched",
    )


class _Legal:
    """The steps a serving engine's :class:`ShapeRules` allow, in the masks' units: FFN units move
    ``ffn_step`` at a time (the engine's multiple), attention layers take one of ``heads[i]``
    ``(kv_groups, q_per_group)`` with the rules' query heads (or any, when they fix none)."""

    def __init__(self, rules: ShapeRules, masks: ParentMasks) -> None:
        self.rules = rules
        unit = masks.ffn_unit
        step = max(1, rules.ffn_multiple // unit)
        if (step * unit) % rules.ffn_multiple:
            raise ConfigError(
                f"the FFN unit {unit} does not build {rules.engine}'s FFN multiple {rules.ffn_multiple}; "
                "use an ffn_unit that divides it"
            )
        self.ffn_step = step
        self.ffn_max: list[int] = []  # most legal FFN units per layer
        self.heads: list[list[tuple[int, int]]] = []  # legal (kv groups, q per group), by kv groups
        h = rules.query_heads
        for g_n, r_n, u_n in (tuple(int(x) for x in row) for row in masks.sizes):
            self.ffn_max.append(u_n // step * step)
            self.heads.append([(g, r) for g in range(1, g_n + 1) for r in range(1, r_n + 1) if h is None or g * r == h])
        self.parent = masks.parent

    def ok(self, layers: Sequence[DiscreteLayer]) -> bool:
        """Whether the first computing layer keeps its attention (where the rules ask)."""
        if not self.rules.first_layer_attention:
            return True
        first = next((d for d in layers if d.attention or d.ffn), None)
        return first is None or first.attention

    def _heads_near(self, i: int, groups: int) -> tuple[int, int] | None:
        options = self.heads[i]
        return min(options, key=lambda o: (abs(o[0] - groups), -o[0])) if options else None

    def snap(self, layers: list[DiscreteLayer]) -> list[DiscreteLayer]:
        """Rounded layers moved onto legal shapes: FFN units to the nearest multiple of the step
        (at least one), attention to the legal grouping nearest its KV groups, and attention given
        to the first computing layer (the smallest grouping) where the rules need it."""
        out = []
        for i, d in enumerate(layers):
            if d.ffn:
                units = min(
                    self.ffn_max[i],
                    max(self.ffn_step, (d.ffn_units + self.ffn_step // 2) // self.ffn_step * self.ffn_step),
                )
                d = replace(d, ffn=units > 0, ffn_units=units)
            if d.attention:
                near = self._heads_near(i, d.kv_groups)
                d = replace(d, kv_groups=near[0], q_per_group=near[1]) if near else replace(d, attention=False)
            out.append(d)
        for i, d in enumerate(out):
            if self.ok(out) or not (d.attention or d.ffn):
                continue
            if self.parent.layers[i].attention and self.heads[i]:  # the first computing layer gets attention
                g, r = self.heads[i][0]
                out[i] = replace(d, attention=True, kv_groups=g, q_per_group=r)
            else:  # or is dropped, and the next one is looked at
                out[i] = replace(d, ffn=False)
        return out

    def keeps_first(self, layers: list[DiscreteLayer]) -> Callable[[int, DiscreteLayer], bool]:
        """Whether ``layers`` with layer ``i`` set to ``new`` is :meth:`ok`, as a test of ``(i, new)``
        in ``O(1)``: only the first two computing layers of ``layers`` can become the first."""
        if not self.rules.first_layer_attention:
            return lambda i, new: True
        first = list(islice((j for j, d in enumerate(layers) if d.attention or d.ffn), 2)) + [len(layers)] * 2

        def ok(i: int, new: DiscreteLayer) -> bool:
            if i <= first[0] and (new.attention or new.ffn):
                return new.attention  # the changed layer computes first
            j = first[1] if i == first[0] else first[0]  # the change drops the first, or is after it
            return j >= len(layers) or layers[j].attention

        return ok

    def shrink_layer(self, i: int, d: DiscreteLayer, v: _Values) -> list[_Move]:
        """Every legal one-step removal from layer ``i`` (state ``d``; :func:`_shrink_layer` in
        legal steps), before :func:`_keeps_one` and :meth:`keeps_first`."""
        moves: list[_Move] = []
        if d.ffn:
            if d.ffn_units > self.ffn_step:
                lost = sum(v.ffn[i][d.ffn_units - self.ffn_step : d.ffn_units])
                moves.append(("ffn-unit", i, replace(d, ffn_units=d.ffn_units - self.ffn_step), lost))
            moves.append(("drop-ffn", i, replace(d, ffn=False), _ffn_value(v, i, d)))
        if d.attention:
            fewer = [o for o in self.heads[i] if o[0] < d.kv_groups]
            if fewer:
                new = replace(d, kv_groups=fewer[-1][0], q_per_group=fewer[-1][1])
                moves.append(("kv-group", i, new, _attn_value(v, i, d) - _attn_value(v, i, new)))
            moves.append(("drop-attn", i, replace(d, attention=False), _attn_value(v, i, d)))
        if d.attention and d.ffn:
            lost = _attn_value(v, i, d) + _ffn_value(v, i, d)
            moves.append(("drop-layer", i, replace(d, attention=False, ffn=False), lost))
        return moves

    def grow_layer(self, i: int, d: DiscreteLayer, v: _Values) -> list[_Move]:
        """Every legal one-step addition to layer ``i`` (state ``d``) the parent allows
        (:func:`_grow_layer` in legal steps), before :meth:`keeps_first`."""
        p, moves = self.parent.layers[i], list[_Move]()
        if p.ffn and self.ffn_max[i] >= self.ffn_step:
            if not d.ffn:
                new = replace(d, ffn=True, ffn_units=self.ffn_step)
                moves.append(("add-ffn", i, new, sum(v.ffn[i][: self.ffn_step])))
            elif d.ffn_units + self.ffn_step <= self.ffn_max[i]:
                gained = sum(v.ffn[i][d.ffn_units : d.ffn_units + self.ffn_step])
                moves.append(("ffn-unit", i, replace(d, ffn_units=d.ffn_units + self.ffn_step), gained))
        if p.attention and self.heads[i]:
            if not d.attention:
                g, r = self.heads[i][0]
                new = replace(d, attention=True, kv_groups=g, q_per_group=r)
                moves.append(("add-attn", i, new, _attn_value(v, i, new)))
            else:
                more = [o for o in self.heads[i] if o[0] > d.kv_groups]
                if more:
                    new = replace(d, kv_groups=more[0][0], q_per_group=more[0][1])
                    moves.append(("kv-group", i, new, _attn_value(v, i, new) - _attn_value(v, i, d)))
        return moves


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


def _repair(
    layers: list[DiscreteLayer], values: _Values, evaluate: _Evaluator, legal: _Legal | None = None
) -> tuple[list[DiscreteLayer], int]:
    """Greedy: remove the unit with the least importance per unit of total violation removed.

    While the total excess is large, the best few removals on distinct layers are applied together
    (``1 + 8·excess`` of them, at most :data:`_BATCH_MOVES`), so a far-off start does not cost one
    cost-model sweep per unit; near the boundary it is one unit at a time.
    """
    current = evaluate(layers)[0]
    moves, shrinks = 0, _Shrinks(values, evaluate, legal)
    while np.any(current > 0):
        candidates, packed = shrinks(layers)
        if not candidates:
            break  # nothing left to remove: infeasible
        lost = np.array([c[3] for c in candidates]) + 1e-12
        batch = min(_BATCH_MOVES, 1 + int(8 * np.maximum(current, 0).sum()))
        score, viol = repair_scores(packed, lost, current, evaluate, batch)
        best = int(np.argmin(score))
        if batch > 1:
            combined, applied = _combine(layers, candidates, np.argsort(score, kind="stable"), score, batch)
            if applied > 1 and (legal is None or legal.ok(combined)):
                after = evaluate(combined)[0]
                if np.maximum(after, 0).sum() < np.maximum(viol[best], 0).sum():
                    layers, current, moves = combined, after, moves + applied
                    continue
        layers, current = _applied(layers, candidates[best][1], candidates[best][2]), viol[best]
        moves += 1
    return layers, moves


class _Shrinks:
    """Repair's candidates, every one-step removal (:func:`_shrink_layer`, or
    :meth:`_Legal.shrink_layer` under rules) that keeps a layer computing (and the rules' first
    layer), packed by ``evaluate``: each layer's removals and its columns are built again only when that
    layer changed since the last call (a repair move changes one layer, or a few), so a call costs
    ``O(L)`` look-ups where building every candidate cost ``O(L)`` dataclass copies and sums."""

    def __init__(self, values: _Values, evaluate: _Evaluator, legal: _Legal | None) -> None:
        self._values, self._evaluate, self._legal = values, evaluate, legal
        # per layer: (state, its column, its removals, their columns)
        self._last: dict[int, tuple[DiscreteLayer, tuple[float, ...], list[_Move], list[tuple[float, ...]]]] = {}

    def _layer(self, i: int, d: DiscreteLayer) -> tuple[tuple[float, ...], list[_Move], list[tuple[float, ...]]]:
        last = self._last.get(i)
        if last is None or last[0] != d:
            ev, legal = self._evaluate, self._legal
            moves = _shrink_layer(i, d, self._values) if legal is None else legal.shrink_layer(i, d, self._values)
            last = (d, ev.column(i, d), moves, [ev.column(i, m[2]) for m in moves])
            self._last[i] = last
        return last[1:]

    def __call__(self, layers: list[DiscreteLayer]) -> tuple[list[_Move], _Packed]:
        """Every (legal) one-step removal from ``layers``, in layer order, and their rows."""
        keeps = _keeps_one(layers)
        ok = self._legal.keeps_first(layers) if self._legal is not None else None
        block, moves, columns = [], list[_Move](), []
        for i, d in enumerate(layers):
            column, layer_moves, layer_columns = self._layer(i, d)
            block.append(column)
            for m, c in zip(layer_moves, layer_columns):
                if keeps(m[2]) and (ok is None or ok(i, m[2])):
                    moves.append(m)
                    columns.append(c)
        where = np.array([m[1] for m in moves], dtype=np.intp)
        packed = self._evaluate.packed(np.array(block).T, where, np.array(columns).reshape(len(moves), 7).T)
        return moves, packed


def _combine(
    layers: list[DiscreteLayer],
    candidates: list[_Move],
    order: np.ndarray,
    score: np.ndarray,
    limit: int,
) -> tuple[list[DiscreteLayer], int]:
    """Apply the best-scoring finite moves, at most one per layer and ``limit`` in all."""
    combined, touched = list(layers), set[int]()
    for j in order:
        if len(touched) >= limit or not np.isfinite(score[j]):
            break
        _, i, new, _ = candidates[j]
        if i not in touched:
            touched.add(i)
            combined[i] = new
    if not any(d.attention or d.ffn for d in combined):
        return layers, 0  # never remove the last computing layer
    return combined, len(touched)


def _fill(
    layers: list[DiscreteLayer], values: _Values, evaluate: _Evaluator, masks: ParentMasks, legal: _Legal | None = None
) -> tuple[list[DiscreteLayer], int]:
    """Greedy: add the unit with the most importance per unit of slack used while all constraints hold.

    A move changes one layer, so only that layer's candidates (and its column of the packed block)
    are built again (:class:`_Candidates`); the candidates stay in layer order, so ties fall as over
    a fresh list. Each candidate keeps its last exact score: the best few of those are evaluated
    first in the next move, with every row whose bound reaches the best of them
    (:func:`_fill_scores`; the rest of the stack barely moves a layer's score)."""
    current = evaluate(layers)[0]
    sizes = [tuple(int(x) for x in row) for row in masks.sizes.tolist()]
    layers = list(layers)
    block = evaluate.block(layers)

    def grown(i: int) -> list[_Move]:
        if legal is None:
            return _grow_layer(i, layers[i], values, masks.parent.layers[i], sizes[i])
        return legal.grow_layer(i, layers[i], values)

    table = _Candidates(len(layers))
    for i in range(len(layers)):
        table.set(i, grown(i), evaluate)
    moves, cap = 0, 8 * len(layers)
    while moves < cap:
        slots = table.slots(None if legal is None else legal.keeps_first(layers))
        if not len(slots):
            break
        packed = evaluate.packed(block, slots // _SLOTS, table.columns[slots].T)
        prior = table.scores[slots]
        known = np.isfinite(prior)
        likely = np.argsort(-prior, kind="stable")[: known.sum()][:_LIKELY_ROWS]
        expect = float(prior[known].max()) if known.any() else np.inf
        score, viol = _fill_scores(packed, table.gained[slots], current, evaluate, likely, expect)
        finite = np.isfinite(score)
        table.scores[slots[finite]] = score[finite]
        best = int(np.argmax(score))
        if score[best] == -np.inf:
            break  # no candidate keeps every constraint
        _, i, new, _ = table.move(int(slots[best]))
        layers[i], block[:, i], current = new, table.columns[slots[best]], viol[best]
        table.set(i, grown(i), evaluate)
        moves += 1
    return layers, moves


_LIKELY_ROWS = 8  # candidates with the best last scores evaluated first in a fill move
_SLOTS = 3  # most one-step additions to one layer (_grow_layer: FFN, then two of attention)


class _Candidates:
    """The fill moves of every layer in flat arrays: layer ``i``'s ``k``-th move in slot
    ``i·_SLOTS + k``, with its :meth:`_Evaluator.column` ``(7,)``, the importance it gains and its
    last exact score (nan: none yet). Slots in increasing order are the moves in layer order."""

    def __init__(self, n_layers: int) -> None:
        size = n_layers * _SLOTS
        self.columns = np.zeros((size, 7))
        self.gained = np.zeros(size)
        self.scores = np.full(size, np.nan)
        self.used = np.zeros(size, dtype=bool)
        self._moves: list[list[_Move]] = [[] for _ in range(n_layers)]

    def set(self, i: int, moves: list[_Move], evaluate: _Evaluator) -> None:
        """Layer ``i``'s moves are now ``moves`` (scores forgotten)."""
        assert len(moves) <= _SLOTS, moves
        first = i * _SLOTS
        self._moves[i] = moves
        self.used[first : first + _SLOTS] = False
        self.scores[first : first + _SLOTS] = np.nan
        for k, m in enumerate(moves):
            self.columns[first + k] = evaluate.column(i, m[2])
            self.gained[first + k] = m[3]
            self.used[first + k] = True

    def move(self, slot: int) -> _Move:
        return self._moves[slot // _SLOTS][slot % _SLOTS]

    def slots(self, ok: Callable[[int, DiscreteLayer], bool] | None) -> np.ndarray:
        """The used slots, in order, whose move passes ``ok`` (layer, new state) where given."""
        slots = np.flatnonzero(self.used)
        if ok is not None:
            keep = [ok(m[1], m[2]) for m in map(self.move, slots.tolist())]
            slots = slots[np.array(keep, dtype=bool)]
        return slots


_FIRST_ROWS = 16  # candidates whose goal is evaluated first in a fill move without a likely best


def _fill_scores(
    packed: _Packed,
    gained: np.ndarray,
    current: np.ndarray,
    evaluate: _Evaluator,
    likely: np.ndarray | None = None,
    expect: float = np.inf,
) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's score ``gained / used`` (``used``: total rise of the violations; ``-inf``
    where one is violated) and violations (``+inf`` goal columns where not evaluated), with the
    goal evaluated only where it can decide the argmax.

    The budget columns alone bound a score from above: ``used`` sums the rises of every column, the
    budgets' first, and a rise is never negative. The goal is evaluated in two rounds: first the
    ``likely`` best rows (default: the :data:`_FIRST_ROWS` highest bounds) and every row whose
    bound reaches ``expect`` (a score the best is expected to reach: :func:`_fill` passes the best
    last score, which the best exact score met at every move of the 126-layer benchmark), then
    every other row whose bound reaches the best exact score of the first — none where that best
    reached ``expect``, so one cost-model call per move instead of two. The best exact score only
    rises, so every row that could reach it is evaluated and the argmax (first index among equal
    maxima) is the one over every exact score; ``likely`` and ``expect`` decide how many rows and
    calls that takes, never which wins. A row over a budget is infeasible whatever the goal says
    and is never evaluated."""
    nb = packed.n_budgets
    n, k = len(gained), len(evaluate.names)
    viol = np.full((n, k), np.inf)
    viol[:, :nb] = packed.budget
    score = np.full(n, -np.inf)
    within = np.all(packed.budget <= 0, axis=1)
    # (1 - 1e-9): the full sum of non-negative rises never falls below the budgets' share, rounding included
    used_budgets = np.maximum(packed.budget - current[None, :nb], 0).sum(1) * (1 - 1e-9)
    bound = np.where(gained >= 0, gained / np.maximum(used_budgets, 1e-12), 0.0)  # a loss scores <= 0
    bound = np.where(within, bound, -np.inf)
    first = np.unique(likely[within[likely]]) if likely is not None else likely
    if first is None or not len(first):
        first = np.sort(np.argsort(-bound, kind="stable")[:_FIRST_ROWS])
        first = first[within[first]]
    if expect < np.inf:  # one round where the best exact score reaches expect
        first = np.union1d(first, np.flatnonzero(within & (bound >= expect)))
    best = -np.inf
    for rows in (first, None):
        if rows is None:  # the second round: what can still reach the best
            todo = within & (bound >= best)
            todo[first] = False
            rows = np.flatnonzero(todo)
        if not len(rows):
            continue
        viol[rows, nb:] = evaluate.goal_violations(packed, rows)
        ok = np.all(viol[rows] <= 0, axis=1)
        used = np.maximum(viol[rows] - current[None, :], 0).sum(1)
        score[rows] = np.where(ok, gained[rows] / np.maximum(used, 1e-12), -np.inf)
        best = max(best, float(score[rows].max()))
    return score, viol
