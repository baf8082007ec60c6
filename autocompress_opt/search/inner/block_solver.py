"""An exact solver over the block library (issue 49, item 3): one variant per layer minimising the
summed replace-one scores (:class:`~autocompress_opt.prune.block_library.BlockLibrary`) under a
trial's budgets and its target's constraints; the candidate and baseline named ``"block-library"``.

A mixed-integer linear program (HiGHS through :func:`scipy.optimize.milp`, as Puzzle's MIP):
binary ``x[i, v]`` picks variant ``v`` of layer ``i`` (exactly one per layer), the objective is
``Σ score(i, v)·x[i, v]``, and

* the budgets (:meth:`Budget.limits`: layer equivalents, FFN channels, query heads, KV heads) are
  sums of per-layer terms, so they are exact linear rows;
* a serving engine's rules (:class:`~autocompress_opt.prune.loadability.ShapeRules`) remove the
  variants it cannot load (FFN widths off its multiple, other query-head counts) and, where it
  asks, keep attention in the first computing layer (``computes_i − attends_i ≤ Σ_{j<i} computes_j``);
* the target's constraints (:meth:`CostGoal.violations`) are functions of sums over layers
  (:func:`~autocompress_opt.serving.costmodel.estimate_from_sums`): at a fixed batch every time and
  memory term is a per-layer sum, so one violation is linear in the per-layer choices; where the
  batch follows from memory (``concurrency: max``) or from a maximum over layers it is not. Each is
  linearised at a reference architecture — ``viol(ref) + Σ_i [viol(ref with layer i := v) − viol(ref)]``,
  every one-layer change costed in one numpy batch — and the answer is judged by the exact cost
  model (:func:`~autocompress_opt.search.inner.budget.exact_violations`). Where the exact violation
  differs from the linear one, the program is solved again, linearised at the new answer and with
  that constraint's bound tightened by the error seen, for at most ``rounds`` rounds; the best
  feasible answer is kept.

:attr:`BlockSolution.optimal` is true when HiGHS proved the program optimal (within its default
relative gap, 1e-4, and its time limit) and its linear violations equal the exact ones at the answer
(within 1e-4 of each limit) with no tightening: then the answer is optimal for the library's scores
whenever the constraints are linear in the choices (the budgets alone, or a fixed batch), and a
first-order optimum otherwise. The first program is linearised at the budgets' own answer. Tens to
hundreds of milliseconds for SmolLM2's 30 layers × 70 variants (``benchmarks/bench_block_library.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from autocompress_opt.arch.architecture import Architecture, LayerSpec, uniform_child
from autocompress_opt.errors import ConfigError, check_int
from autocompress_opt.prune.block_library import BlockLibrary, BlockVariant
from autocompress_opt.prune.loadability import ShapeRules
from autocompress_opt.search.inner.budget import Budget, CostGoal, exact_violations
from autocompress_opt.serving.arch_arrays import FULL_WINDOW, ArchArrays
from autocompress_opt.serving.targets import all_satisfied

__all__ = ["NAME", "BlockSolution", "legal_variants", "solve_block_library"]

NAME = "block-library"  # the candidate's and the baseline's name
_LINEAR_TOL = 1e-4  # a linear violation this close to the exact one (a share of the limit) counts as exact
_TIE = 1e-12  # scores this close are equal (nats)
_TIME_LIMIT_S = 2.0  # most seconds HiGHS spends on one program (then its best answer, not proved optimal)
_BIG = 1e6  # a one-layer change whose violation is not finite (no sequence fits) is priced at this


@dataclass(frozen=True)
class BlockSolution:
    """The solver's answer: the architecture (named :data:`NAME`), each layer's variant, the summed
    score (nats of replace-one KL increase), the exact verdict (``violations``: budgets then the
    target's, ``<= 0`` feasible; ``metrics``), whether it is proved optimal (module doc), the
    programs solved (``rounds``) and the wall time (``seconds``)."""

    architecture: Architecture
    variants: tuple[BlockVariant, ...]
    score: float
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    optimal: bool
    rounds: int
    seconds: float


def legal_variants(library: BlockLibrary, rules: ShapeRules | None = None) -> list[list[BlockVariant]]:
    """Each layer's variants that ``rules`` load (all without rules): FFN widths in the engine's
    multiple, attention with the rules' query heads."""
    out = []
    for i in range(library.num_layers):
        kept = []
        for v in library.variants(i):
            if rules is not None and v.ffn and v.ffn_width % rules.ffn_multiple:
                continue
            if rules is not None and v.attention and rules.query_heads is not None and v.num_heads != rules.query_heads:
                continue
            kept.append(v)
        out.append(kept)
    return out


def solve_block_library(
    library: BlockLibrary,
    budget: Budget,
    goal: CostGoal | None = None,
    *,
    rules: ShapeRules | None = None,
    rounds: int = 6,
    name: str = NAME,
) -> BlockSolution:
    """One variant per layer of ``library`` with the least summed score under ``budget``, ``goal``
    and ``rules`` (module doc). Where ``rules`` load no per-layer shapes, the uniform model of the
    budget on the layers whose skipping scores highest. Raises :class:`ConfigError` when the
    budget's hidden size is not the library's."""
    began = time.perf_counter()
    check_int(rounds, "rounds")
    if budget.hidden_size != library.hidden_size:
        raise ConfigError(
            f"the budget's hidden_size={budget.hidden_size} is not the library's {library.hidden_size}; "
            "build a library at that hidden size"
        )
    if rules is not None and not rules.heterogeneous:
        return _uniform(library, budget, goal, name, began)
    problem = _Program(library, budget, goal, rules)
    best: BlockSolution | None = None
    # the first linearisation at the budgets' own answer (nearer the answer than any fixed start)
    ref = _Program(library, budget, None, rules).solve(None, np.zeros(0))[0] if goal is not None else None
    tighten = np.zeros(problem.n_goal)
    for round_ in range(1, rounds + 1):
        picked, proved = problem.solve(ref, tighten)
        if picked is None:
            break
        arch = problem.architecture(picked, name)
        violations, metrics = exact_violations(arch, budget, goal)
        feasible = all_satisfied(violations)
        exact = np.array([violations[k] for k in problem.goal_names])
        error = exact - problem.predicted(picked)
        linear = bool(np.all(np.abs(error) <= _LINEAR_TOL))
        optimal = proved and linear and not tighten.any()
        score = sum(library.score(i, v) for i, v in enumerate(picked))
        answer = BlockSolution(arch, tuple(picked), score, feasible, violations, metrics, optimal, round_, 0.0)
        # ties to the later answer: linearised nearer to itself, so its optimality is the better judged
        if best is None or (feasible and (not best.feasible or score <= best.score + _TIE)):
            best = answer
        if feasible and linear:
            break
        tighten = tighten + np.maximum(error, 0) * (exact > 0)
        ref = picked
    if best is None:  # the target's limits cannot be met: the budgets' best, judged (infeasible)
        picked, _ = _Program(library, budget, None, rules).solve(None, np.zeros(0))
        if picked is None:
            raise ConfigError(f"no variant per layer meets the budget {budget} under the rules {rules}")
        arch = problem.architecture(picked, name)
        violations, metrics = exact_violations(arch, budget, goal)
        score = sum(library.score(i, v) for i, v in enumerate(picked))
        best = BlockSolution(arch, tuple(picked), score, all_satisfied(violations), violations, metrics, False, 0, 0.0)
    return replace(best, seconds=time.perf_counter() - began)


class _Program:
    """The program's data: the flat variables ``(layer, variant)``, their scores, the budget and
    rules rows, and the goal's linearisation at a reference."""

    def __init__(self, library: BlockLibrary, budget: Budget, goal: CostGoal | None, rules: ShapeRules | None) -> None:
        self.library, self.budget, self.goal, self.rules = library, budget, goal, rules
        self.parent = library.parent
        self.options = legal_variants(library, rules)
        empty = [i for i, vs in enumerate(self.options) if not vs]
        if empty:
            raise ConfigError(f"layers {empty} have no variant the rules allow")
        self.layer = np.concatenate([np.full(len(vs), i) for i, vs in enumerate(self.options)])
        self.flat = [v for vs in self.options for v in vs]
        self.cost = np.array([library.score(i, v) for i, v in zip(self.layer, self.flat)])
        self.goal_names = list(goal.violations(goal.parent_metrics)) if goal is not None else []
        self.n_goal = len(self.goal_names)
        self._linear: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ constraints
    def _fixed_rows(self) -> tuple[list[np.ndarray], list[float], list[float]]:
        """The one-hot, budget, one-computing-layer and first-layer-attention rows: (A, low, high)."""
        n, L = len(self.flat), len(self.options)
        rows, low, high = [], [], []
        for i in range(L):  # exactly one variant per layer
            rows.append((self.layer == i).astype(float))
            low.append(1.0)
            high.append(1.0)
        attends = np.array([float(v.attention) for v in self.flat])
        computes = np.array([float(not v.skipped) for v in self.flat])
        terms = {
            "budget:num_layers": (attends + np.array([float(v.ffn) for v in self.flat])) / 2,
            "budget:ffn_width": np.array([float(v.ffn_width) for v in self.flat]),
            "budget:num_heads": np.array([float(v.num_heads) for v in self.flat]),
            "budget:num_kv_heads": np.array([float(v.kv_heads) for v in self.flat]),
        }
        for k, limit in self.budget.limits().items():
            rows.append(terms[k])
            low.append(-np.inf)
            high.append(float(limit))
        rows.append(computes)  # a decoder computes in one layer at least
        low.append(1.0)
        high.append(np.inf)
        if self.rules is not None and self.rules.first_layer_attention:
            for i in range(L):  # computes_i − attends_i − Σ_{j<i} computes_j ≤ 0
                row = np.where(self.layer == i, computes - attends, 0.0) - np.where(self.layer < i, computes, 0.0)
                rows.append(row)
                low.append(-np.inf)
                high.append(0.0)
        assert all(len(r) == n for r in rows)
        return rows, low, high

    def _linearise(self, ref: Sequence[BlockVariant]) -> tuple[np.ndarray, np.ndarray]:
        """``(viol(ref) (K,), delta (K, n))``: the goal's violations at ``ref`` and each variable's
        one-layer change of them (one numpy batch of ``n + 1`` rows)."""
        assert self.goal is not None
        block = np.array([_column(self.parent.layers[i], v) for i, v in enumerate(ref)]).T  # (7, L)
        n = len(self.flat)
        cols = np.repeat(block[:, None, :], n + 1, axis=1)  # (7, n + 1, L); row 0: ref itself
        changed = np.array([_column(self.parent.layers[i], v) for i, v in zip(self.layer, self.flat)]).T  # (7, n)
        cols[:, np.arange(1, n + 1), self.layer] = changed
        per_arch = _per_arch(self.parent, self.library.hidden_size)
        arrays = ArchArrays(**{k: np.repeat(v, n + 1) for k, v in per_arch.items()}, **dict(zip(_FIELDS, cols)))
        viol = self.goal.violations(self.goal.metrics(arrays))
        values = np.stack([np.asarray(viol[k], dtype=float).reshape(-1) for k in self.goal_names])  # (K, n + 1)
        values = np.clip(np.nan_to_num(values, nan=_BIG, posinf=_BIG, neginf=-_BIG), -_BIG, _BIG)
        return values[:, 0], values[:, 1:] - values[:, :1]

    def predicted(self, picked: Sequence[BlockVariant]) -> np.ndarray:
        """The linear goal violations of ``picked`` at the last linearisation."""
        if self.goal is None:
            return np.zeros(0)
        assert self._linear is not None
        base, delta = self._linear
        chosen = self._chosen(picked)
        return base + delta[:, chosen].sum(1)

    def _chosen(self, picked: Sequence[BlockVariant]) -> np.ndarray:
        index = {(int(i), v): j for j, (i, v) in enumerate(zip(self.layer, self.flat))}
        return np.array([index[(i, v)] for i, v in enumerate(picked)])

    # ------------------------------------------------------------------------ solve
    def start(self) -> list[BlockVariant]:
        """A reference where no answer is known: each layer's widest variant within the budget's
        per-layer sizes (the uniform point's shape where it is legal)."""
        b = self.budget
        out = []
        for vs in self.options:
            fits = [
                v
                for v in vs
                if v.kv_heads <= b.num_kv_heads and v.q_per_kv <= b.q_per_kv and v.ffn_width <= b.ffn_width
            ]
            out.append(max(fits or vs, key=lambda v: (v.ffn_width, v.num_heads)))
        return out

    def solve(self, ref: list[BlockVariant] | None, tighten: np.ndarray) -> tuple[list[BlockVariant] | None, bool]:
        """The program's answer (None where it is infeasible) and whether HiGHS proved it optimal;
        the goal linearised at ``ref`` (default :meth:`start`) with its bounds lowered by ``tighten``."""
        from scipy.optimize import Bounds, LinearConstraint, milp

        rows, low, high = self._fixed_rows()
        if self.goal is not None:
            self._linear = self._linearise(ref if ref is not None else self.start())
            base, delta = self._linear
            for k in range(self.n_goal):
                rows.append(delta[k])
                low.append(-np.inf)
                high.append(float(-base[k] - tighten[k]))
        constraints = LinearConstraint(np.array(rows), np.array(low), np.array(high))
        n = len(self.flat)
        result = milp(
            self.cost,
            constraints=constraints,
            integrality=np.ones(n),
            bounds=Bounds(0, 1),
            options={"time_limit": _TIME_LIMIT_S},
        )
        if result.x is None:
            return None, False
        picked = [self.flat[j] for j in np.flatnonzero(result.x > 0.5)]
        assert len(picked) == len(self.options)
        return picked, bool(result.status == 0)

    def architecture(self, picked: Sequence[BlockVariant], name: str) -> Architecture:
        layers = tuple(v.spec(p) for v, p in zip(picked, self.parent.layers))
        return replace(self.parent, hidden_size=self.library.hidden_size, layers=layers, name=name)


_FIELDS = ("attn", "heads", "kv_heads", "head_dim", "ffn", "ffn_width", "window")


def _column(parent: LayerSpec, v: BlockVariant) -> tuple[float, ...]:
    """Layer variant ``v`` of ``parent`` as the cost model's seven per-layer fields (what
    ``ArchArrays.from_architectures`` packs for ``v.spec(parent)``)."""
    return (
        float(v.attention),
        float(v.num_heads),
        float(v.kv_heads),
        float(parent.head_dim) if v.attention else 0.0,
        float(v.ffn),
        float(v.ffn_width),
        float(parent.window or FULL_WINDOW) if v.attention else FULL_WINDOW,
    )


def _per_arch(parent: Architecture, hidden_size: int) -> dict[str, np.ndarray]:
    """The per-architecture columns of ``parent`` at ``hidden_size`` (one row)."""
    packed = ArchArrays.from_architectures([replace(parent, hidden_size=hidden_size)])
    names = ("vocab", "hidden", "tied", "qkv_bias", "o_bias", "mlp_bias", "qk_norm", "ffn_matrices", "attention_sinks")
    return {k: np.asarray(getattr(packed, k)) for k in names}


def _uniform(library: BlockLibrary, budget: Budget, goal: CostGoal | None, name: str, began: float) -> BlockSolution:
    """The uniform model of ``budget`` on the ``num_layers`` layers whose skipping scores highest."""
    skip = BlockVariant(0, 0, 0)
    order = sorted(range(library.num_layers), key=lambda i: (-library.score(i, skip), i))
    arch = uniform_child(
        library.parent,
        kept_layers=sorted(order[: budget.num_layers]),
        hidden_size=budget.hidden_size,
        num_kv_heads=budget.num_kv_heads,
        q_per_kv=budget.q_per_kv,
        ffn_width=budget.ffn_width,
        name=name,
    )
    variants = tuple(
        BlockVariant(s.num_kv_heads, s.num_heads // s.num_kv_heads if s.attention else 0, s.ffn_width)
        for s in arch.layers
    )
    try:
        score = sum(library.score(i, v) for i, v in enumerate(variants))
    except ConfigError:  # a width the library did not measure
        score = float("nan")
    violations, metrics = exact_violations(arch, budget, goal)
    return BlockSolution(
        arch, variants, score, all_satisfied(violations), violations, metrics, False, 0, time.perf_counter() - began
    )
