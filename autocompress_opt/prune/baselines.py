"""Uniform baselines, all judged by the same constraint check and importance scores as the search.

**Uniform candidates** (:func:`uniform_grid`): every uniform child of the parent on hardware-friendly
sizes (num_layers, hidden size, FFN width, KV groups, query heads per group), each knowing its
global point in the search space's keys (:attr:`UniformCandidate.point`, so a study can enqueue it).
Three baselines choose among them under a constraint (a predicate, e.g. :func:`target_feasibility`):

* :func:`minitron_search` (``minitron``): ModelOpt's Minitron candidate search as shipped — the grid
  within Minitron's limits (:data:`MINITRON_LIMITS`: at most 40 % of each width, 20 % of the depth
  cut), the top K feasible by parameters, each scored (e.g. :func:`masked_kl_scorer`, held-out KL
  after pruning by importance), the best kept. Nothing feasible inside the limits is a finding
  (:data:`INFEASIBLE_WITHIN_LIMITS`), and ``limits=None`` lifts them.
* :func:`depth_baseline` (``depth``): static depth pruning at full width (ShortGPT block-influence
  order), the deepest feasible model.
* :func:`best_uniform` (``best-uniform``): the best-scoring uniform model on the whole grid.

:func:`make_baseline` runs one by name; each returns a :class:`BaselineResult` saying what it chose
and why. Which heads, channels and layers a chosen model keeps is decided by
:func:`~autocompress_opt.prune.plan.plan_pruning` from the importance scores.

**The parameter-target recipe** (:func:`uniform_baseline`): the practitioner's older Minitron-style
recipe, which fixes the sizes of a uniform model from a parameter target (``autocompress prune
--params``). It is not a baseline under a hardware constraint: it never prunes heads and does not
look at quality, so the baselines above replace it there.

**MoE and hybrid parents** (:func:`expert_seeds`): a weights study's outer loop chooses the sparse
counts only (experts, top-``k``, expert and shared widths, Mamba-2 heads), so its ``minitron`` seed
scores the largest feasible points of that space (:func:`expert_kl_scorer`: the masked parent's KL
with the experts, channels and heads chosen by importance, the trial's ``start`` candidate);
its ``depth`` seed is the deepest point with every other choice at the space's largest (named, not
seeded, when it lies below the space's depth floor); ``best-uniform`` is skipped with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture, default_layer_order, reference_layer, uniform_child
from autocompress_opt.arch.search_space import CHOICES, SearchSpace, uniform_allocation
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.prune.uniform_grid import (
    MAX_WIDTH_VALUES,
    MINITRON_LIMITS,
    MinitronLimits,
    UniformCandidate,
    grid_values,
    point_cuts,
    uniform_grid,
)

if TYPE_CHECKING:
    import torch

    from autocompress_opt.hf.adapters import FamilyAdapter
    from autocompress_opt.prune.importance import Importance
    from autocompress_opt.serving.targets import Target

__all__ = [
    "BASELINES",
    "BASELINE_WIDTHS",
    "DEPTH_ORDERS",
    "INFEASIBLE_WITHIN_LIMITS",
    "MAX_WIDTH_VALUES",
    "MINITRON_LIMITS",
    "SEED_CANDIDATES",
    "BaselineResult",
    "MinitronLimits",
    "ScoredCandidate",
    "UniformCandidate",
    "best_uniform",
    "depth_baseline",
    "expert_kl_scorer",
    "expert_seeds",
    "grid_values",
    "make_baseline",
    "masked_kl_scorer",
    "minitron_search",
    "point_cuts",
    "resolve_param_target",
    "target_feasibility",
    "uniform_baseline",
    "uniform_grid",
]


# --------------------------------------------------------------------------- baseline recipe
def resolve_param_target(params: float, parent_params: int) -> int:
    """A parameter budget: ``0 < params <= 1`` is a fraction of ``parent_params``, ``> 1`` a count."""
    if isinstance(params, bool) or not isinstance(params, (int, float)) or not params > 0:
        raise ConfigError(f"params must be a fraction in (0, 1] or a parameter count > 1, got {params!r}")
    return int(params * parent_params) if params <= 1 else int(params)


BASELINE_WIDTHS = ("ffn", "hidden+ffn")


def uniform_baseline(
    parent: Architecture,
    params: float,
    *,
    max_layer_drop: float = 0.25,
    width_multiple: int = 64,
    width: str = "ffn",
) -> Architecture:
    """The practitioner's Minitron-style baseline: a UNIFORM target with at most ``params`` parameters.

    This is what a user picks without a hardware model — a parameter count — with a fixed recipe
    for splitting the cut between depth and width:

    1. **Depth**: drop layers, least important first, while the model is over budget and at most
       ``floor(max_layer_drop · L)`` layers are gone (default 25%; Minitron found width pruning
       keeps more accuracy than depth pruning, so depth is capped).
    2. **Width**, by ``width``:

       * ``"ffn"``: the widest FFN, a multiple of ``width_multiple`` (64: GEMM-friendly), that
         meets the budget at that depth. Heads and hidden size are kept.
       * ``"hidden+ffn"``: Minitron's width recipe (Llama-3.1-Minitron-4B-Width shrinks hidden
         4096 → 3072 and MLP 14336 → 9216, heads kept): hidden size and FFN shrink by one shared
         ratio ``r``, each rounded down to a multiple of ``width_multiple`` — the largest ``r``, in
         steps of 1/1024, that meets the budget. Heads are kept. This is the recipe that can reach
         budgets below the embeddings' share of the parent (Gemma 3's 262K vocabulary holds 63% of
         Gemma-3-270M's parameters).
    3. If even the narrowest width is over budget, drop one more layer and retry step 2, down to
       one layer; past that, :class:`ConfigError` (the embeddings alone are too big).

    Which layers, channels and heads go is decided afterwards by :func:`plan_pruning` from the
    importance scores (``layer_metric``); this function only fixes the sizes. Returns ``parent`` itself when it
    already meets the budget. ``parent`` must be uniform (windows may differ: Gemma 3).

    Windows (they change the cost, not the parameter count): an ``n``-layer result lists the windows
    of the parent layers it most likely keeps without knowing the importance scores, the ``n`` first
    of :func:`~autocompress_opt.arch.architecture.default_layer_order` (the first ``n - 1`` and the
    last; the first alone when ``n = 1``). :func:`plan_pruning` then gives every kept layer its
    actual parent layer's window.
    """
    _check_recipe(parent, max_layer_drop, width_multiple, width)
    budget = resolve_param_target(params, parent.num_params)
    if parent.num_params <= budget:
        return parent
    layer, depth = parent.layers[0], parent.num_layers
    name = f"{parent.name.rstrip('/').rsplit('/', 1)[-1] or parent.family}-uniform-{budget}"
    order = default_layer_order(parent)  # the windows' source layers (docstring)

    def build(n: int, shape: tuple[int, int]) -> Architecture:
        hidden, ffn = shape
        return uniform_child(
            parent,
            kept_layers=order[:n],
            hidden_size=hidden,
            num_kv_heads=layer.num_kv_heads,
            q_per_kv=layer.num_heads // layer.num_kv_heads,
            ffn_width=ffn,
            name=name,
        ).active()

    def down(value: int, ratio: float) -> int:
        return max(width_multiple, int(value * ratio) // width_multiple * width_multiple) if ratio < 1 else value

    full = (parent.hidden_size, layer.ffn_width)
    if width == "ffn":
        shapes = [full] + [
            (parent.hidden_size, w)
            for w in range(layer.ffn_width // width_multiple * width_multiple, 0, -width_multiple)
        ]
    else:
        shapes = list(
            dict.fromkeys(
                (down(parent.hidden_size, r / 1024), down(layer.ffn_width, r / 1024)) for r in range(1024, 0, -1)
            )
        )
    min_depth = parent.num_layers - int(max_layer_drop * parent.num_layers)
    while depth > min_depth and build(depth, full).num_params > budget:
        depth -= 1
    for n in range(depth, 0, -1):
        for shape in shapes:
            if build(n, shape).num_params <= budget:
                return build(n, shape)
    smallest = build(1, shapes[-1]).num_params
    raise ConfigError(
        f"cannot reach {budget:,} parameters with a uniform model: the smallest "
        f"(1 layer, hidden {shapes[-1][0]}, FFN {shapes[-1][1]}) has {smallest:,} "
        f"({parent.embedding_params:,} in embeddings)"
        + ("; width='hidden+ffn' also shrinks the embeddings" if width == "ffn" else "")
    )


def _check_recipe(parent: Architecture, max_layer_drop: float, width_multiple: int, width: str) -> None:
    """Raise :class:`ConfigError` naming the first recipe setting :func:`uniform_baseline` cannot use."""
    if not parent.is_uniform:
        raise ConfigError(f"the uniform baseline needs a uniform parent; {parent.summary()} is heterogeneous")
    if not 0.0 <= max_layer_drop < 1.0:
        raise ConfigError(f"max_layer_drop must be a fraction in [0, 1), got {max_layer_drop!r}")
    if not isinstance(width_multiple, int) or width_multiple < 1:
        raise ConfigError(f"width_multiple must be a positive int, got {width_multiple!r}")
    if width not in BASELINE_WIDTHS:
        raise ConfigError(f"width must be one of {', '.join(BASELINE_WIDTHS)}, got {width!r}")


# ------------------------------------------------------------------------------- the results
BASELINES: tuple[str, ...] = ("minitron", "depth", "best-uniform")
INFEASIBLE_WITHIN_LIMITS = "infeasible within Minitron's limits"
# Candidates a MoE parent's minitron seed scores (expert_seeds): Minitron's top-K (minitron_search's top_k).
SEED_CANDIDATES = 10


@dataclass(frozen=True)
class ScoredCandidate:
    """A candidate the search looked at closely, with its score (lower is better; None when not scored)."""

    candidate: UniformCandidate
    score: float | None


@dataclass(frozen=True)
class BaselineResult:
    """What a baseline chose and why.

    Attributes:
        baseline: one of :data:`BASELINES`.
        choice: the chosen candidate, or None when no candidate meets the constraints (then
            ``finding`` says so, e.g. :data:`INFEASIBLE_WITHIN_LIMITS`: a finding, not an error).
        finding: one sentence: what was chosen and by what, or why nothing was.
        ranked_by: ``"score"`` (lowest score wins) or ``"parameters"`` (most parameters wins: no
            score was given, or the baseline does not use one).
        grid_size: candidates of the grid; ``considered``: those inside the limits (all without);
            ``checked``: constraint checks run (largest first, stopped once enough passed);
            ``feasible``: checked candidates that passed.
        candidates: the candidates ranked (the top K by parameters; ``depth``: its one pick),
            most parameters first, with their scores.
        limits: Minitron's limits searched within, or None (lifted, or not a Minitron search).
        layer_order: ``"<metric> importance"`` or ``"default"`` (no importance): where kept layers came from.
        lifted_from: for a Minitron search rerun with its limits lifted, the finding of the search
            within them; else None.
    """

    baseline: str
    choice: UniformCandidate | None
    finding: str
    ranked_by: str
    grid_size: int
    considered: int
    checked: int
    feasible: int
    candidates: tuple[ScoredCandidate, ...]
    limits: MinitronLimits | None = None
    layer_order: str = "default"
    lifted_from: str | None = None

    @property
    def architecture(self) -> Architecture:
        """The chosen architecture; :class:`ConfigError` carrying :attr:`finding` when there is none."""
        if self.choice is None:
            raise ConfigError(f"{self.baseline}: {self.finding}")
        return self.choice.architecture

    @property
    def score(self) -> float | None:
        """The chosen candidate's score (None when not scored or nothing was chosen)."""
        return next((s.score for s in self.candidates if s.candidate == self.choice), None)

    def report(self) -> str:
        """Several lines for a person: the finding, the counts, and each ranked candidate."""
        lines = [f"{self.baseline}: {self.finding}"]
        if self.lifted_from:
            lines.insert(0, f"{self.baseline}: {self.lifted_from}; searched again with the limits lifted")
        scope = f" ({self.limits.describe()})" if self.limits else ""
        lines.append(
            f"  grid {self.grid_size:,} uniform candidates, {self.considered:,} considered{scope}, "
            f"{self.checked:,} checked against the constraints (largest first), {self.feasible:,} feasible; "
            f"kept layers by {self.layer_order} order"
        )
        for rank, s in enumerate(self.candidates, 1):
            mark = "*" if s.candidate == self.choice else " "
            score = "not scored" if s.score is None else f"score {s.score:.4f}"
            lines.append(
                f"  {mark}{rank:>2}. {s.candidate.label():<26} {s.candidate.num_params / 1e6:8.2f}M params  {score}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (for a model card or a benchmark table)."""
        row = lambda s: {"point": s.candidate.point, "num_params": s.candidate.num_params, "score": s.score}
        return {
            "baseline": self.baseline,
            "choice": None if self.choice is None else self.choice.point,
            "num_params": None if self.choice is None else self.choice.num_params,
            "score": self.score,
            "finding": self.finding,
            "ranked_by": self.ranked_by,
            "grid_size": self.grid_size,
            "considered": self.considered,
            "checked": self.checked,
            "feasible": self.feasible,
            "candidates": [row(s) for s in self.candidates],
            "limits": None if self.limits is None else {"width": self.limits.width, "depth": self.limits.depth},
            "layer_order": self.layer_order,
            "lifted_from": self.lifted_from,
        }


# ------------------------------------------------------------------------------ the searches
def minitron_search(
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    *,
    importance: Importance | None = None,
    score: Callable[[Architecture], float] | None = None,
    top_k: int = 10,
    limits: MinitronLimits | None = MINITRON_LIMITS,
    layer_metric: str = "skip_loss",
    width_multiple: int | None = None,
) -> BaselineResult:
    """ModelOpt's Minitron candidate search (``mcore_minitron`` with a metric constraint), as shipped.

    1. Enumerate :func:`uniform_grid` (kept layers by ``importance.layer_order(layer_metric)``, or the
       default order without importance) and keep the candidates inside ``limits``
       (:meth:`MinitronLimits.allows`; ``None`` lifts them).
    2. Keep those ``feasible`` accepts (the target's constraint check), and of them the ``top_k``
       with the most parameters (checked largest first, stopping after ``top_k`` passes: the same
       top K as checking all).
    3. Score each with ``score`` (lower is better; e.g. :func:`masked_kl_scorer`, held-out KL to the
       parent after pruning by the importance scores) and choose the lowest; a non-finite score ranks
       last, ties go to more parameters. Without ``score`` the most parameters wins (``ranked_by``
       says so).

    When no candidate inside the limits is feasible the result has no choice and its finding starts
    with :data:`INFEASIBLE_WITHIN_LIMITS`: a finding, not an error; search again with
    ``limits=None`` (:func:`make_baseline` does). Raises :class:`ConfigError` for a heterogeneous
    parent or a bad ``top_k`` / ``width_multiple``.
    """
    _check_top_k(top_k)
    order, order_label = _layer_order(parent, importance, layer_metric)
    grid_size = math.prod(len(v) for v in grid_values(parent, width_multiple).values())
    considered = uniform_grid(parent, layer_order=order, width_multiple=width_multiple, limits=limits)
    top, checked = _largest_feasible(considered, feasible, top_k)
    counts: dict[str, Any] = dict(grid_size=grid_size, considered=len(considered), checked=checked, feasible=len(top))
    ranked_by = "score" if score else "parameters"
    if not top:
        finding = (
            f"{INFEASIBLE_WITHIN_LIMITS} ({limits.describe()}): none of the {len(considered):,} candidates "
            "inside them meets the constraints"
            if limits is not None
            else f"no uniform candidate of the {grid_size:,} meets the constraints"
        )
        return BaselineResult(
            "minitron", None, finding, ranked_by, **counts, candidates=(), limits=limits, layer_order=order_label
        )
    ranked, choice, finding = _choose(top, score)
    return BaselineResult(
        "minitron",
        choice,
        finding,
        ranked_by,
        **counts,
        candidates=ranked,
        limits=limits,
        layer_order=order_label,
    )


def best_uniform(
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    *,
    importance: Importance | None = None,
    score: Callable[[Architecture], float] | None = None,
    top_k: int = 20,
    layer_metric: str = "skip_loss",
    width_multiple: int | None = None,
) -> BaselineResult:
    """The best uniform model on the whole grid (no limits) by ``score``.

    Scores the ``top_k`` largest *maximal* feasible candidates of :func:`uniform_grid`: a feasible
    candidate that another feasible one matches or exceeds in every choice is left out (pruning
    keeps a superset of its heads, channels and layers there), so the K scored are K different
    shapes rather than one shape's FFN steps. Checked largest first; a candidate dominated by a
    feasible one already found is not checked. Then as :func:`minitron_search`: lowest score wins,
    or the most parameters without ``score``; no feasible candidate gives a result without a choice.
    """
    _check_top_k(top_k)
    order, order_label = _layer_order(parent, importance, layer_metric)
    grid = uniform_grid(parent, layer_order=order, width_multiple=width_multiple)
    top, checked = _largest_feasible(grid, feasible, top_k, maximal=True)
    counts: dict[str, Any] = dict(grid_size=len(grid), considered=len(grid), checked=checked, feasible=len(top))
    ranked_by = "score" if score else "parameters"
    if not top:
        finding = f"no uniform candidate of the {len(grid):,} meets the constraints"
        return BaselineResult(
            "best-uniform", None, finding, ranked_by, **counts, candidates=(), layer_order=order_label
        )
    ranked, choice, finding = _choose(top, score)
    return BaselineResult(
        "best-uniform", choice, finding, ranked_by, **counts, candidates=ranked, layer_order=order_label
    )


def depth_baseline(
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    *,
    importance: Importance | None = None,
    layer_metric: str = "block_influence",
    score: Callable[[Architecture], float] | None = None,
) -> BaselineResult:
    """Static depth pruning at full width: the deepest feasible model that keeps every head, KV group,
    FFN channel and hidden channel of the parent.

    Layers go in ``importance.layer_order(layer_metric)`` (default ``block_influence``: ShortGPT's
    block influence, Men et al. arXiv 2403.03853; ``skip_loss`` is Minitron's LM-loss metric), or
    :func:`~autocompress_opt.arch.architecture.default_layer_order` without importance. Checks
    ``L, L - 1, ..., 1`` layers and stops at the first ``feasible`` accepts. ``score``, when given,
    is recorded for the pick (it does not change it). No feasible depth gives a result without a choice.
    """
    if not parent.is_uniform:
        raise ConfigError(f"the depth baseline needs a uniform parent; {parent.summary()} is heterogeneous")
    order, order_label = _layer_order(parent, importance, layer_metric)
    ref, depth = reference_layer(parent), parent.num_active_layers
    full = dict(
        hidden_size=parent.hidden_size,
        ffn_width=ref.ffn_width,
        num_kv_heads=ref.num_kv_heads,
        q_per_kv=ref.num_heads // ref.num_kv_heads,
    )
    checked = 0
    for n in range(depth, 0, -1):
        point = {"num_layers": n, **full}
        candidate = UniformCandidate.build(point, parent, order)
        checked += 1
        if feasible(candidate.architecture):
            s = None if score is None else float(score(candidate.architecture))
            finding = f"chose {candidate.label()}: the deepest feasible model at full width ({n} of {depth} layers)"
            counts: dict[str, Any] = dict(grid_size=depth, considered=depth, checked=checked, feasible=1)
            scored = (ScoredCandidate(candidate, s),)
            return BaselineResult(
                "depth", candidate, finding, "depth", **counts, candidates=scored, layer_order=order_label
            )
    finding = f"no depth-only model at full width meets the constraints, not even 1 of {depth} layers"
    return BaselineResult("depth", None, finding, "depth", depth, depth, checked, 0, (), layer_order=order_label)


def make_baseline(
    name: str,
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    *,
    importance: Importance | None = None,
    score: Callable[[Architecture], float] | None = None,
    top_k: int | None = None,
    layer_metric: str | None = None,
) -> BaselineResult:
    """The baseline ``name`` (one of :data:`BASELINES`) with each one's defaults for ``top_k`` (10,
    20) and ``layer_metric`` (``skip_loss``; for ``depth`` see below).

    ``depth`` without ``layer_metric`` but with ``importance`` and ``score`` drops layers in each of
    :data:`DEPTH_ORDERS` (ShortGPT's block influence, Minitron's LM loss without the layer) and keeps
    the order whose pick scores lower: both are published depth-pruning criteria, and the baseline is
    the stronger of the two. Otherwise it uses ``layer_metric`` (default ``block_influence``).

    ``minitron`` runs within :data:`MINITRON_LIMITS`; when nothing there is feasible it searches again
    with the limits lifted and returns that result, its ``lifted_from`` holding the first finding.
    Raises :class:`UnknownNameError` for another name.
    """
    if name not in BASELINES:
        raise UnknownNameError("baseline", name, BASELINES)
    if name == "depth":
        if layer_metric is not None or importance is None or score is None:
            metric = layer_metric or "block_influence"
            return depth_baseline(parent, feasible, importance=importance, layer_metric=metric, score=score)
        return _best_depth_order(parent, feasible, importance, score)
    metric = layer_metric or "skip_loss"
    if name == "best-uniform":
        k = 20 if top_k is None else top_k
        return best_uniform(parent, feasible, importance=importance, score=score, top_k=k, layer_metric=metric)
    k = 10 if top_k is None else top_k
    result = minitron_search(parent, feasible, importance=importance, score=score, top_k=k, layer_metric=metric)
    if result.choice is not None:
        return result
    lifted = minitron_search(
        parent, feasible, importance=importance, score=score, top_k=k, limits=None, layer_metric=metric
    )
    return replace(lifted, lifted_from=result.finding)


DEPTH_ORDERS = ("block_influence", "skip_loss")


def _best_depth_order(
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    importance: Importance,
    score: Callable[[Architecture], float],
) -> BaselineResult:
    """:func:`depth_baseline` in each of :data:`DEPTH_ORDERS`; the lower-scoring pick (ties: the first)."""
    results = [
        depth_baseline(parent, feasible, importance=importance, layer_metric=m, score=score) for m in DEPTH_ORDERS
    ]
    if results[0].choice is None:  # the order does not change feasibility: same depth, same width
        return results[0]

    def value(r: BaselineResult) -> float:
        v = r.candidates[0].score
        return math.inf if v is None or not math.isfinite(v) else v

    best = min(results, key=value)
    scores = "; ".join(f"{r.layer_order}: KL {value(r):.4f}" for r in results)
    finding = f"{best.finding}, layers dropped in the lower-scoring order ({scores})"
    ranked = tuple(sorted((r.candidates[0] for r in results), key=lambda c: math.inf if c.score is None else c.score))
    return replace(best, finding=finding, ranked_by="score", candidates=ranked, checked=sum(r.checked for r in results))


def masked_kl_scorer(
    model: Any,
    importance: Importance,
    tokens: torch.Tensor,
    *,
    layer_metric: str = "skip_loss",
    batch_size: int = 4,
    adapter: FamilyAdapter | None = None,
) -> Callable[[Architecture], float]:
    """``score(arch)``: mean per-position KL(parent ‖ ``arch``) on ``tokens``, in nats (lower is better).

    ``arch`` is computed as the parent ``model`` masked to ``plan_pruning(parent, importance, arch)``
    (:func:`~autocompress_opt.prune.masking.apply_masks`: equal to the sliced model up to float
    rounding, without building it); the KL is :func:`~autocompress_opt.quality.metrics.kl_divergence`
    against the parent's logits on ``tokens``, computed once here and kept on the CPU (``n·L·V``
    float32: 8 rows of 256 tokens of a 49,152-token vocabulary take 0.4 GB). ``tokens``
    ``(n, L)`` should be held-out rows, not the ones ``importance`` was estimated on.

    The scorer is deterministic, remembers each architecture's score, and leaves ``model`` unchanged
    (its hooks are removed after each call, also on an error). Raises :class:`ConfigError` for bad
    tokens or an ``importance`` computed for another architecture (when called on an ``arch`` that is
    not a sub-architecture of the parent).
    """
    from autocompress_opt.hf.adapters import adapter_for
    from autocompress_opt.prune.masking import apply_masks
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.quality.metrics import cache_teacher_logits, kl_divergence

    adapter = adapter or adapter_for(model)
    parent = adapter.architecture(model)
    teacher = cache_teacher_logits(model, tokens, batch_size=batch_size, progress=False)
    memo: dict[Architecture, float] = {}

    def score(arch: Architecture) -> float:
        if arch not in memo:
            plan = plan_pruning(parent, importance, arch, layer_metric=layer_metric)
            with apply_masks(model, plan.masks(), adapter=adapter):
                memo[arch] = kl_divergence(
                    model, None, tokens, teacher_logits=teacher, batch_size=batch_size, progress=False
                )
        return memo[arch]

    return score


def target_feasibility(target: Target, parent: Architecture) -> Callable[[Architecture], bool]:
    """The constraint check of ``target`` as a predicate: ``arch`` meets every constraint by the exact
    cost model (:meth:`~autocompress_opt.serving.targets.Target.feasible`, relative constraints against
    ``parent``'s cost there, computed once)."""
    from autocompress_opt.serving.targets import parent_metrics

    reference = parent_metrics(parent, target)
    return lambda arch: target.feasible(arch, reference)


# --------------------------------------------------------------------------------- internals
def _check_top_k(top_k: int) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ConfigError(f"top_k must be a positive int, got {top_k!r}")


def _layer_order(parent: Architecture, importance: Importance | None, metric: str) -> tuple[list[int], str]:
    """The parent's layers, most worth keeping first, and where that order came from."""
    if importance is None:
        return default_layer_order(parent), "default"
    return importance.layer_order(metric), f"{metric} importance"


def _largest_feasible(
    candidates: Sequence[UniformCandidate], feasible: Callable[[Architecture], bool], k: int, *, maximal: bool = False
) -> tuple[list[UniformCandidate], int]:
    """The first ``k`` of ``candidates`` (most parameters first) that ``feasible`` accepts, and the
    number of checks run. ``maximal``: skip, unchecked, a candidate that a feasible one already found
    matches or exceeds in every choice (more of any choice means more parameters, so such a
    candidate always comes later in the order)."""
    found: list[UniformCandidate] = []
    checked = 0
    for candidate in candidates:
        if len(found) == k:
            break
        if maximal and any(_covers(f, candidate) for f in found):
            continue
        checked += 1
        if feasible(candidate.architecture):
            found.append(candidate)
    return found, checked


def _covers(big: UniformCandidate, small: UniformCandidate) -> bool:
    return all(getattr(big, name) >= getattr(small, name) for name in CHOICES)


def _choose(
    top: list[UniformCandidate], score: Callable[[Architecture], float] | None
) -> tuple[tuple[ScoredCandidate, ...], UniformCandidate, str]:
    """Score ``top`` (most parameters first) and choose: the lowest finite score, ties to more
    parameters; without ``score``, the first."""
    if score is None:
        choice = top[0]
        finding = (
            f"chose {choice.label()}: the most parameters of the feasible candidates "
            "(ranked by parameters only: no score given)"
        )
        return tuple(ScoredCandidate(c, None) for c in top), choice, finding
    scores = [float(score(c.architecture)) for c in top]
    best = min(
        range(len(top)), key=lambda i: (not math.isfinite(scores[i]), scores[i] if math.isfinite(scores[i]) else 0, i)
    )
    choice = top[best]
    finding = (
        f"chose {choice.label()}: the lowest score ({scores[best]:.4f}) of the {len(top)} feasible candidates "
        "with the most parameters"
    )
    return tuple(ScoredCandidate(c, s) for c, s in zip(top, scores)), choice, finding


# ------------------------------------------------------- MoE and hybrid parents: the sparse axes
def _points(space: SearchSpace) -> list[dict[str, int]]:
    """Every point of ``space`` (a MoE weights space: its sparse choices vary, the rest is pinned)."""
    import itertools

    names = space.names
    return [dict(zip(names, combo)) for combo in itertools.product(*(space[n].values for n in names))]


def _covers_point(big: Mapping[str, int], small: Mapping[str, int]) -> bool:
    return all(big[k] >= small[k] for k in small)


def expert_seeds(
    space: SearchSpace,
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    score: Callable[[Architecture], float] | None,
    layer_order: Sequence[int] | None = None,
) -> dict[str, dict[str, Any]]:
    """The seeds of a MoE or hybrid parent's weights study, in
    :func:`~autocompress_opt.search.study.seeding.baseline_seeds`' form, over ``space``'s sparse axes and
    depth (its other choices pinned to the parent's: :func:`~autocompress_opt.search.study.config.expert_space`):
    ``minitron`` scores the :data:`SEED_CANDIDATES` feasible points with the most parameters that no
    other feasible point covers (``score``: lower is better; None ranks by parameters), each a
    point of ``space``, so nothing is snapped, its layers the first of ``layer_order`` (the trial's:
    :func:`~autocompress_opt.search.study.weights_trial.dense_cut`); ``depth`` is the deepest point that
    meets the target with every other choice at the space's largest (:func:`_expert_depth_seed`; skipped,
    saying by how much, where that depth is below the space's floor); ``best-uniform`` is skipped."""
    out: dict[str, dict[str, Any]] = {"depth": _expert_depth_seed(space, parent, feasible, layer_order)}
    ranked = sorted(
        ((uniform_allocation(p, parent, layer_order).num_params, p) for p in _points(space)), key=lambda r: -r[0]
    )  # most parameters first: a point that covers another comes before it
    found: list[tuple[dict[str, int], Architecture]] = []
    for _, point in ranked:
        if len(found) == SEED_CANDIDATES:
            break
        if point["experts_per_token"] > point["num_experts"] or any(_covers_point(f, point) for f, _ in found):
            continue
        arch = uniform_allocation(point, parent, layer_order)
        if feasible(arch):
            found.append((point, arch))
    if not found:
        out["minitron"] = {"skipped": "no point of the expert space meets the target's constraints"}
    else:
        scores = [float(score(arch)) if score is not None else None for _, arch in found]
        best = min(range(len(found)), key=lambda i: (scores[i] if scores[i] is not None else 0.0, i))
        point, arch = found[best]
        how = f"the lowest masked KL ({scores[best]:.4f})" if scores[best] is not None else "the most parameters"
        finding = f"chose {point}: {how} of the {len(found)} largest feasible expert points"
        out["minitron"] = {"point": point, "baseline_point": point, "finding": finding}
    out["best-uniform"] = {
        "skipped": "it scores every point of the expert grid; for a MoE parent the minitron seed scores the largest "
        "feasible ones"
    }
    return out


def _expert_depth_seed(
    space: SearchSpace,
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    layer_order: Sequence[int] | None,
) -> dict[str, Any]:
    """The ``depth`` seed of a MoE study: every choice but ``num_layers`` at the space's largest (the
    parent's, in the default space), the most layers of ``1..`` the parent's that meet the target. On
    the real-weights MoE this plain depth cut beat the study's best at two targets, from below the
    default space's depth floor (docs/results/moe.md), so a depth below the floor is named, with the
    change of space that would reach it, rather than dropped silently."""
    full = {c.name: c.values[-1] for c in space.choices}
    deepest = next(
        (
            n
            for n in range(parent.num_active_layers, 0, -1)
            if feasible(uniform_allocation({**full, "num_layers": n}, parent, layer_order))
        ),
        None,
    )
    if deepest is None:
        return {"skipped": "no depth meets the target's constraints with every other choice at the space's largest"}
    floor = min(space["num_layers"].values)
    if deepest not in space["num_layers"].values:
        return {
            "skipped": f"the deepest point that meets the target with every other choice at the space's largest "
            f"keeps {deepest} layers, below the space's depth floor of {floor}: a --space whose num_layers goes "
            f"down to {deepest} lets the study start there"
        }
    point = {**full, "num_layers": deepest}
    finding = f"chose {deepest} layers: the deepest that meets the target with every expert, width and head kept"
    return {"point": point, "baseline_point": point, "finding": finding}


def expert_kl_scorer(
    model: Any, importance: Any, tokens: Any, *, batch_size: int = 4
) -> Callable[[Architecture], float]:
    """``score(arch)``: mean per-position KL(parent ‖ the parent masked to ``arch``) on ``tokens``
    ``(n, L)``, in nats (lower is better): the layers ``arch`` drops skipped, its attention heads those
    a dense plan keeps (:func:`~autocompress_opt.prune.experts.head_choice`), its residual channels the
    highest-scoring ones (:func:`~autocompress_opt.prune.experts.hidden_choice`), its experts, channels and
    Mamba-2 heads chosen by importance (:func:`~autocompress_opt.prune.experts.expert_masks`): the
    trial's ``start`` candidate, cut as :func:`~autocompress_opt.search.study.weights_trial.dense_cut`
    cuts it. The expert
    counterpart of :func:`~autocompress_opt.prune.baselines.masked_kl_scorer`; ``model`` is unchanged
    after each call."""
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.prune.experts import expert_masks, head_choice, head_masks, hidden_choice
    from autocompress_opt.prune.masking import LayerMask, apply_masks
    from autocompress_opt.prune.plan import _indicator
    from autocompress_opt.quality.metrics import cache_teacher_logits, kl_divergence

    adapter = moe_adapter(model)
    parent = adapter.architecture(model)
    teacher = cache_teacher_logits(model, tokens, batch_size=batch_size, progress=False)

    def score(arch: Architecture) -> float:
        moe = next(layer.moe for layer in arch.layers if layer.moe is not None)
        point = {"num_experts": moe.num_experts, "experts_per_token": moe.experts_per_token}
        point["expert_width"] = moe.expert_width
        if moe.shared_width:
            point["shared_width"] = moe.shared_width
        mamba = next((layer.mamba for layer in arch.layers if layer.mamba is not None), None)
        if mamba is not None:
            point["mamba_heads"] = mamba.num_heads
        masks = expert_masks(model, importance, point)
        attn = next((layer for layer in arch.layers if layer.attention), None)
        full = next((layer for layer in parent.layers if layer.attention), None)
        if (
            attn is not None
            and full is not None
            and (attn.num_heads, attn.num_kv_heads) != (full.num_heads, full.num_kv_heads)
        ):
            chosen = head_choice(importance, parent, attn.num_kv_heads, attn.num_heads // attn.num_kv_heads)
            masks = head_masks(masks, parent, chosen)
        if arch.hidden_size < parent.hidden_size:  # the residual channels a dense plan keeps, masked
            masks = replace(masks, hidden=_indicator(parent.hidden_size, hidden_choice(importance, arch.hidden_size)))
        if len(arch.layers) == len(masks.layers):  # the layers ``arch`` drops: skipped (every sub-block None)
            skip = LayerMask(None, None)
            masks = replace(masks, layers=tuple(skip if s.is_noop else m for s, m in zip(arch.layers, masks.layers)))
        with apply_masks(model, masks, adapter=adapter):
            return float(
                kl_divergence(model, None, tokens, teacher_logits=teacher, batch_size=batch_size, progress=False)
            )

    return score
