"""Repair's and fill's candidates as packed cost-model rows (:class:`_Evaluator`), and repair's
screening of them by per-layer deltas (:func:`repair_scores`).

Every move changes one layer, so a move's candidates are the current ``(7, L)`` block with one
column replaced each. The exact violations of ``N`` such rows cost one numpy
:func:`~autocompress_opt.serving.costmodel.estimate_batch` over ``(N, L)`` arrays. Their *estimates*
cost ``O(N + L)``: the cost model's metrics are a function of sums over layers and a few maxima
(:func:`~autocompress_opt.serving.costmodel.estimate_from_sums`), and a row's sums are the block's
with one layer's terms swapped (:meth:`LayerSums.one_layer_changed`). Repair scores every row by
its estimate, keeps the rows that can decide its move, and scores those exactly.

Why the decision is the exact one: a sum of ``L <= 126`` positive float64 terms, taken in another
order or as ``total − old + new``, differs from the exact one by at most ``~(L + 2)·2⁻⁵³ ≈ 1.4e-14``
of itself, and every metric is a sum, product, quotient or maximum of such sums without
cancellation below that scale, except ``max_concurrency``, a ``floor`` of a memory ratio: a row
whose floor could fall either way (the sums moved by ``±``:data:`_SUMS_SLACK` give two values) is
always scored exactly. Each other estimated violation ``v`` is taken to lie within
:data:`_VIOLATION_SLACK` ``·(1 + |v|)`` of the exact one (four orders of magnitude above the bound),
which bounds each row's score in an interval; every row whose interval reaches the rows the move
needs (the best, or the best few on distinct layers) is scored exactly, so the exact argmin, order
and ties are those over every exact score. A Poisson target's batch is a fixed point that differs
with every row, and a move of fewer than :data:`DELTA_MIN_CELLS` candidate-layer cells is cheaper
exact: those moves score every row exactly (``tests/search/test_discretise_equivalence.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from autocompress_opt.search.inner.budget import Budget, CostGoal
from autocompress_opt.search.inner.relaxation import DiscreteLayer, ParentMasks
from autocompress_opt.serving.costmodel import FULL_WINDOW, ArchArrays, LayerSums

__all__: list[str] = []

_VIOLATION_SLACK = 1e-9  # an estimated violation's assumed largest error, relative to 1 + |v| (module doc)
_SUMS_SLACK = 1e-9  # relative move of the sums that must not change a row's max_concurrency (module doc)
# Fewest cells (candidates x layers) a move's rows must have for per-layer deltas to pay: below, one
# estimate_batch of every row costs less than the deltas' fixed cost (CPU seconds of the repair-heavy
# bench_discretise case, exact vs deltas: 30 layers 2.7 vs 6.3, 80 layers 22.1 vs 11.8).
DELTA_MIN_CELLS = 12_000
_TINY = 1e-12  # repair's least violation removed that counts as a gain (as in discretise._repair)


class _Evaluator:
    """Violations (the budgets', then the goal's, in :attr:`names` order) of the current layers and
    of one-layer changes to them, by the numpy :func:`estimate_batch` (the same equations as
    :func:`estimate_cost`, which judges the final answer).

    A layer is packed as one column of the seven per-layer fields of :class:`ArchArrays` — exactly
    what ``ArchArrays.from_architectures`` packs for that layer of ``masks.architecture(layers)`` —
    so ``N`` candidates are the current ``(7, L)`` block repeated ``N`` times with one column each
    replaced: ``O(N + L)`` Python, no :class:`Architecture` per candidate, and the same numbers
    (hence the same violations, bit for bit) as packing every candidate's architecture."""

    _FIELDS = ("attn", "heads", "kv_heads", "head_dim", "ffn", "ffn_width", "window")

    def __init__(self, masks: ParentMasks, budget: Budget, goal: CostGoal | None) -> None:
        self.budget, self.goal = budget, goal
        self.names = list(budget.limits()) + (list(goal.violations(goal.parent_metrics)) if goal else [])
        parent = masks.parent
        self._ffn_unit = masks.ffn_unit
        self._head_dim = [float(p.head_dim) for p in parent.layers]
        self._window = [float(p.window or FULL_WINDOW) for p in parent.layers]
        # the per-architecture fields of masks.architecture(...): the parent's, at the trial's hidden size
        self._per_arch = {
            "vocab": float(parent.vocab_size),
            "hidden": float(masks.hidden_size),
            "tied": float(parent.tie_embeddings),
            "qkv_bias": float(parent.qkv_bias),
            "o_bias": float(parent.o_bias),
            "mlp_bias": float(parent.mlp_bias),
            "qk_norm": float(parent.qk_norm),
        }

    def column(self, i: int, d: DiscreteLayer) -> tuple[float, ...]:
        """Layer ``i`` in state ``d`` as :data:`_FIELDS` (:meth:`ParentMasks.architecture`'s rules:
        a sub-block needs one unit; a dropped attention has no heads, head size or window)."""
        attn = d.attention and d.kv_groups >= 1 and d.q_per_group >= 1
        ffn = d.ffn and d.ffn_units >= 1
        return (
            float(attn),
            float(d.kv_groups * d.q_per_group) if attn else 0.0,
            float(d.kv_groups) if attn else 0.0,
            self._head_dim[i] if attn else 0.0,
            float(ffn),
            float(d.ffn_units * self._ffn_unit) if ffn else 0.0,
            self._window[i] if attn else FULL_WINDOW,
        )

    def block(self, layers: Sequence[DiscreteLayer]) -> np.ndarray:
        """``layers`` as a ``(7, L)`` block of :meth:`column` s."""
        return np.array([self.column(i, d) for i, d in enumerate(layers)]).T

    def pack(
        self, layers: Sequence[DiscreteLayer], changes: Sequence[tuple[int, DiscreteLayer]] | None = None
    ) -> _Packed:
        """``layers`` with each of ``changes`` (layer, new state) applied on its own (``N`` rows), or
        ``layers`` as they are (one row), packed, with their budget violations."""
        if changes is None:
            return self.packed(self.block(layers), None, None)
        where = np.array([i for i, _ in changes], dtype=np.intp)
        columns = np.array([self.column(i, d) for i, d in changes]).reshape(len(changes), 7).T
        return self.packed(self.block(layers), where, columns)

    def packed(self, block: np.ndarray, where: np.ndarray | None, columns: np.ndarray | None) -> _Packed:
        """The rows of ``block`` ``(7, L)`` with column ``where[n]`` replaced by ``columns[:, n]``
        ``(7, N)`` (or ``block`` itself: one row), with their budget violations. The budgets are
        sums of whole numbers, exact in float64: the block's sums with one column's difference are
        the sums of each row (what ``budget.totals_of`` gives each architecture), in ``O(N + L)``."""
        sums = block.sum(-1)  # (7,)
        change = np.zeros((7, 1)) if where is None else columns - block[:, where]  # (7, N)
        t = dict(zip(self._FIELDS, sums[:, None] + change))
        totals = {
            "budget:num_layers": (t["attn"] + t["ffn"]) / 2,
            "budget:ffn_width": t["ffn_width"],
            "budget:num_heads": t["heads"],
            "budget:num_kv_heads": t["kv_heads"],
        }
        return _Packed(block, where, columns, np.stack(list(self.budget.violations(totals).values()), axis=1))

    def goal_violations(self, packed: _Packed, rows: np.ndarray | None = None) -> np.ndarray:
        """``(len(rows), K - B)`` goal violations of ``packed``'s ``rows`` (default all); ``(n, 0)``
        without a goal. A row's values do not depend on the other rows evaluated with it."""
        if rows is None:
            rows = np.arange(packed.n_rows)
        n = len(rows)
        if self.goal is None or n == 0:
            return np.zeros((n, 0))
        arrays = ArchArrays(**{k: np.full(n, v) for k, v in self._per_arch.items()}, **packed.per_layer(rows))
        goal = self.goal.violations(self.goal.metrics(arrays))
        return np.stack([np.asarray(goal[k], dtype=float).reshape(-1) for k in self.names[packed.n_budgets :]], 1)

    def goal_estimates(self, packed: _Packed) -> tuple[np.ndarray, np.ndarray] | None:
        """``(N, K - B)`` goal violations of every row of ``packed`` by per-layer deltas
        (:meth:`LayerSums.one_layer_changed`; module doc) and ``(N,)`` whether a row's
        ``max_concurrency`` is uncertain; None without a goal, rows or a target whose costs follow
        from sums (:attr:`CostGoal.additive`), or with fewer than :data:`DELTA_MIN_CELLS` cells."""
        goal = self.goal
        if goal is None or not goal.additive or packed.where is None or packed.n_rows == 0:
            return None
        if packed.n_rows * packed.block.shape[1] < DELTA_MIN_CELLS:
            return None
        assert packed.columns is not None
        n = packed.n_rows
        stack = ArchArrays(
            **{k: np.full(1, v) for k, v in self._per_arch.items()},
            **{f: packed.block[j][None, :] for j, f in enumerate(self._FIELDS)},
        )
        arrays = ArchArrays(
            **{k: np.full(n, v) for k, v in self._per_arch.items()},
            **{f: packed.columns[j][:, None] for j, f in enumerate(self._FIELDS)},
        )
        sums = LayerSums.one_layer_changed(goal.layer_terms(stack), packed.where, goal.layer_terms(arrays))
        viol = goal.violations(goal.metrics_of_sums(arrays, sums))
        names = self.names[packed.n_budgets :]
        estimates = np.stack([np.asarray(viol[k], dtype=float).reshape(-1) for k in names], 1)
        # the sums a memory floor reads, moved down and up: a row whose concurrency changes is uncertain
        moved = ("dense_params", "expert_params", "active_expert_params", "kv_seq_bytes", "state_bytes")
        low = replace(sums, **{k: getattr(sums, k) * (1 - _SUMS_SLACK) for k in moved})
        high = replace(sums, **{k: getattr(sums, k) * (1 + _SUMS_SLACK) for k in moved})
        uncertain = goal.max_concurrency_of_sums(arrays, low) != goal.max_concurrency_of_sums(arrays, high)
        return estimates, np.asarray(uncertain).reshape(-1)

    def __call__(
        self, layers: Sequence[DiscreteLayer], changes: Sequence[tuple[int, DiscreteLayer]] | None = None
    ) -> np.ndarray:
        """``(N, K)`` violations of :meth:`pack` ``(layers, changes)``: budgets, then the goal."""
        packed = self.pack(layers, changes)
        return np.concatenate([packed.budget, self.goal_violations(packed)], axis=1)


@dataclass(frozen=True)
class _Packed:
    """Candidate rows of :class:`_Evaluator`: the current layers' block ``(7, L)``, each row's
    changed layer ``where`` ``(N,)`` and its column ``(7, N)`` (None: the block itself, one row),
    and the budget violations ``(N, B)``."""

    block: np.ndarray
    where: np.ndarray | None
    columns: np.ndarray | None
    budget: np.ndarray

    @property
    def n_budgets(self) -> int:
        return int(self.budget.shape[1])

    @property
    def n_rows(self) -> int:
        return int(self.budget.shape[0])

    def per_layer(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The seven per-layer fields of ``rows``, each ``(len(rows), L)`` and C-contiguous: the
        block repeated, each row's changed column replaced."""
        n = len(rows)
        out = np.repeat(self.block[:, None, :], n, axis=1)  # (7, n, L)
        if self.where is not None:
            assert self.columns is not None
            out[:, np.arange(n), self.where[rows]] = self.columns[:, rows]
        return dict(zip(_Evaluator._FIELDS, out))


def repair_scores(
    packed: _Packed, lost: np.ndarray, current: np.ndarray, evaluate: _Evaluator, batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Repair's score of each row of ``packed`` (importance ``lost`` per unit of total violation
    removed from ``current``; lower is better) and its violations ``(N, K)``, exact on every row
    that can be among the best ``batch`` rows on distinct layers, the best included (module doc);
    the other rows score ``inf`` (their violations: estimates). Equal, on the rows that decide the
    move, to :func:`exact_repair_scores` of every row."""
    estimated = evaluate.goal_estimates(packed)
    if estimated is None:
        return exact_repair_scores(packed, lost, current, evaluate)
    goal, uncertain = estimated
    assert packed.where is not None  # estimates exist only for one-layer changes
    nb = packed.n_budgets
    viol = np.concatenate([packed.budget, goal], axis=1)
    slack = np.zeros_like(viol)
    slack[:, nb:] = _VIOLATION_SLACK * (1 + np.abs(goal))
    before = np.maximum(current, 0).sum()
    gain_low = before - np.maximum(viol + slack, 0).sum(1)
    gain_high = before - np.maximum(viol - slack, 0).sum(1)
    if not np.any((gain_low > _TINY) & ~uncertain):  # which scoring applies is not certain: every row exactly
        return exact_repair_scores(packed, lost, current, evaluate)
    # the score's interval (lost / gain, inf without a gain), widened by the division's rounding
    low = np.where(gain_high > _TINY, lost / np.where(gain_high > _TINY, gain_high, 1.0), np.inf) * (1 - 1e-12)
    high = np.where(gain_low > _TINY, lost / np.where(gain_low > _TINY, gain_low, 1.0), np.inf) * (1 + 1e-12)
    low[uncertain], high[uncertain] = -np.inf, np.inf
    rows = np.flatnonzero(low <= _needed(high, packed.where, batch))
    viol[rows, nb:] = evaluate.goal_violations(packed, rows)
    score = np.full(packed.n_rows, np.inf)
    gain = before - np.maximum(viol[rows], 0).sum(1)
    score[rows] = np.where(gain > _TINY, lost[rows] / np.maximum(gain, _TINY), np.inf)
    return score, viol


def _needed(high: np.ndarray, where: np.ndarray, batch: int) -> float:
    """A score every row the move needs reaches: the largest upper bound among the rows with the
    lowest upper bounds that span ``batch`` distinct layers (``inf`` where the finite ones do not)."""
    layers: set[int] = set()
    for j in np.argsort(high, kind="stable"):
        if not np.isfinite(high[j]):
            return np.inf
        layers.add(int(where[j]))
        if len(layers) >= batch:
            return float(high[j])
    return np.inf


def exact_repair_scores(
    packed: _Packed, lost: np.ndarray, current: np.ndarray, evaluate: _Evaluator
) -> tuple[np.ndarray, np.ndarray]:
    """Repair's score of every row of ``packed`` and its violations, every row scored exactly."""
    viol = np.concatenate([packed.budget, evaluate.goal_violations(packed)], axis=1)  # (N, K)
    over = current > 0
    gain = np.maximum(current, 0).sum() - np.maximum(viol, 0).sum(1)
    if np.any(gain > _TINY):
        score = np.where(gain > _TINY, lost / np.maximum(gain, _TINY), np.inf)
    else:  # e.g. a stepwise metric: reduce the violated values themselves, else shrink cheaply
        drop = (current[over][None, :] - viol[:, over]).sum(1)
        score = np.where(drop > _TINY, lost / np.maximum(drop, _TINY), np.inf)
        if not np.isfinite(score).any():
            score = lost
    return score, viol
