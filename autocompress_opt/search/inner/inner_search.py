"""The inner loop: a differentiable per-layer mask search under a trial's budget, hardware-guided.

Given a frozen parent, its importance scores and calibration tokens, :func:`search` trains the
masks of :class:`~autocompress_opt.search.inner.relaxation.ParentMasks` with Adam on

    loss = KL(parent ‖ masked parent)  +  Σ_k λ_k · v_k  +  ρ/2 · Σ_k relu(v_k)²

* ``KL`` — next-token distillation to the parent on calibration batches; the parent's log-probs
  are computed once per (parent, data) and cached in process and on disk
  (:func:`teacher_log_probs`, ``.autocompress/teacher/``), over the full vocabulary or, for
  calibration sets too large for that, as top-k targets plus tail mass (the KL against them is
  a lower bound of the full one; :func:`~autocompress_opt.quality.metrics.teacher_kl`).
* ``v_k`` — normalised constraint violations (``<= 0`` feasible): the target workload's
  constraints relative to the parent's metrics and the device-fit constraint, evaluated by the
  *differentiable* cost model (:func:`~autocompress_opt.serving.costmodel.estimate_batch` on torch
  tensors built from the masks' expected per-layer structure, :func:`cost_arrays`, on the parent's
  device with the masks: float64 on the CPU, float32 on an accelerator, :func:`cost_dtype`); and the outer
  trial's global choices as budgets (:class:`Budget`). Hardware constraints get a small margin
  (``v + margin``) so that rounding lands inside. By default the violation *values* are those of
  the rounded masks and the *gradients* those of the relaxation (straight-through), so the
  penalty prices exactly what discretisation will keep.
* ``λ_k`` — Lagrange multipliers, raised while violated and lowered while satisfied (dual ascent,
  ``λ ← max(0, λ + η·v)``, once per step).

Around the training (:func:`search`):

1. **Start point** — the trial's uniform allocation (or the parent) is rounded, repaired and
   filled (below) into a feasible heterogeneous point, and the masks start there.
   Under a serving engine's rules (``rules``) the relaxation has the engine's shape
   (``InnerConfig.engine_relaxation``): FFN units of the engine's multiple, and no head masks
   where the rules fix every layer's query heads, so training never learns a saving the rules
   would take back at discretisation (measured: ``benchmarks/bench_ablation.py``).
2. **Train** as above, then **discretise** (:func:`discretise`): round to hardware-friendly sizes
   (whole FFN units, whole KV groups; gates at ½; kept sub-blocks capped by the layer budget by gate
   value), **repair** with the exact cost model (greedily remove the unit with the least
   importance per unit of violation removed) until every constraint and budget holds, and
   **fill** (greedily add back the unit with the most importance per unit of slack used while
   everything still holds).
3. **Select** among the candidates — the trained point, the start point, and the trial's
   uniform allocation itself (``init``) when the exact cost model finds it feasible — feasible
   first, then the lowest KL to the parent on the first ``val_samples`` rows, held out of training
   (a study trial passes selection-split rows there, disjoint from its objective's rows, never
   calibration or test documents: :mod:`autocompress_opt.data.textdata`), compared row by row: a
   heterogeneous candidate replaces the best uniform one (the uniform allocation, a seeded
   baseline's model) only when the 95 % interval of their paired per-row difference lies below
   ``-InnerConfig.choice_margin``, and a candidate with a non-finite KL is never chosen over one
   with a finite KL. With a few dozen noisy steps the search must never return worse than where it
   started, nor worse than the uniform model of its own global choices, and a heterogeneous answer
   must have earned its place on rows that did not choose it.

If no repair satisfies everything the result says infeasible and lists the violated amounts;
feasibility is always judged by :func:`~autocompress_opt.serving.costmodel.estimate_cost` on the final
architecture, never by the relaxation.

Determinism: the same inputs and ``InnerConfig.seed`` give the same result (batch sampling and
gate noise come from one seeded CPU generator, whatever the parent's device; CPU kernels are
deterministic at a fixed thread count),
with or without activation checkpointing (``InnerConfig.checkpoint_activations``: a rebuilt
layer uses the masks its forward pass drew, never new noise).
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import FamilyAdapter, adapter_for, architecture_mismatch
from autocompress_opt.prune.importance import Importance
from autocompress_opt.prune.loadability import ShapeRules
from autocompress_opt.prune.masking import Masks
from autocompress_opt.prune.plan import PrunePlan, plan_pruning
from autocompress_opt.quality.metrics import Teacher, log_probs, teacher_kl
from autocompress_opt.search.inner.budget import (
    Budget,
    CostGoal,
    cost_arrays,
    cost_dtype,
    exact_violations,
    expected_totals,
)
from autocompress_opt.search.inner.config import InnerConfig
from autocompress_opt.search.inner.discretise import Discrete, discretise
from autocompress_opt.search.inner.optim import SharedScaleAdam
from autocompress_opt.search.inner.relaxation import ExpectedStructure, LiveMasks, ParentMasks, ffn_unit_for
from autocompress_opt.serving.targets import all_satisfied

__all__ = ["CANDIDATES", "InnerConfig", "InnerResult", "StepListener", "objective", "search"]

# on_step(steps done, held-out KL in nats, largest normalised violation >= 0) of :func:`search`;
# KL and violation are None at the steps where they are not measured.
StepListener = Callable[[int, float | None, float | None], None]

# What the selection chooses between, in tie-break order: the trained masks (discretised,
# repaired, filled), the greedy start point (the uniform allocation repaired and filled), and the
# uniform allocation of the trial's global choices as it is (only when feasible).
# A caller may add more, judged the same way (:func:`search`'s ``extra``: a seeded baseline's own model).
CANDIDATES: tuple[str, ...] = ("trained", "start", "uniform")


# ------------------------------------------------------------------------------ search
@dataclass
class InnerResult:
    """What one inner search produced.

    Attributes:
        architecture: heterogeneous, the parent's number of layers (dropped ones are no-ops).
        plan / masks: how to materialise it from the parent (:func:`~autocompress_opt.prune.slicing.materialize`).
        feasible: every constraint and budget holds by the exact cost model.
        violations: normalised violations of the final architecture (``<= 0`` satisfied).
        metrics: its exact cost metrics (empty without a cost goal).
        expected: the masks' expected per-layer structure at the end of training.
        history: per step: ``kl``, ``penalty``, ``tau`` and the largest violation.
        moves: how many units the repair removed and the fill added back.
        seconds: wall-clock seconds of the start point, training, discretising and selecting.
        selection: per candidate (:data:`CANDIDATES`: ``trained``, ``start``, ``uniform``) its
            ``feasible``, held-out ``val_kl`` (mean over the choice rows; NaN when not measured:
            infeasible, or no choice rows) and ``summary``; ``chosen``: the name of the candidate
            returned; ``paired`` (when the lowest-KL candidate was heterogeneous and a uniform one
            was feasible): their paired per-row KL difference ``diff`` with its 95 % interval
            ``low``/``high`` over ``rows`` rows, the two names, the ``margin`` and whether the
            heterogeneous one ``won``.
        learned: the trained :class:`~autocompress_opt.search.inner.relaxation.ParentMasks` (frozen values).
        candidates: every candidate's architecture by name (the returned one included), for
            ablations that evaluate each of them on held-out data; not part of :meth:`summary`.
    """

    architecture: Architecture
    plan: PrunePlan
    masks: Masks
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    expected: dict[str, list[float]]
    history: list[dict[str, float]] = field(default_factory=list)
    moves: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    selection: dict[str, Any] = field(default_factory=dict)
    learned: ParentMasks | None = field(default=None, repr=False)
    candidates: dict[str, Architecture] = field(default_factory=dict, repr=False)

    def summary(self) -> dict[str, Any]:
        """JSON-safe record (no tensors)."""
        return {
            "feasible": self.feasible,
            "violations": self.violations,
            "moves": self.moves,
            "seconds": self.seconds,
            "expected": self.expected,
            "selection": self.selection,
            "final_kl_train": self.history[-1]["kl"] if self.history else None,
            "steps": len(self.history),
        }

    def choice(self) -> dict[str, Any]:
        """Which candidate was returned and how each did, JSON-safe: ``chosen`` (one of
        :data:`CANDIDATES`), ``val_kl`` per candidate (nats on the held-out calibration rows; None
        when not measured) and ``feasible`` per candidate."""
        rows = {n: v for n, v in self.selection.items() if isinstance(v, dict) and n != "paired"}
        out = {
            "chosen": self.selection.get("chosen"),
            "val_kl": {n: v["val_kl"] if math.isfinite(v["val_kl"]) else None for n, v in rows.items()},
            "feasible": {n: bool(v["feasible"]) for n, v in rows.items()},
        }
        if "paired" in self.selection:
            out["paired"] = dict(self.selection["paired"])
        for key in ("skipped", "start_from", "start_from_refused"):
            if key in self.selection:
                out[key] = self.selection[key]
        return out


def search(
    model: Any,
    parent: Architecture,
    importance: Importance,
    tokens: torch.Tensor,
    teacher: Teacher,
    *,
    budget: Budget,
    goal: CostGoal | None,
    config: InnerConfig = InnerConfig(),
    init: Architecture | None = None,
    adapter: FamilyAdapter | None = None,
    on_step: StepListener | None = None,
    rules: ShapeRules | None = None,
    extra: Mapping[str, Architecture] | None = None,
    measure_at: Collection[int] | None = None,
    start_from: str | None = None,
    slice_hidden: bool = True,
) -> InnerResult:
    """Search per-layer structure under ``budget`` and ``goal``; see the module doc.

    1. *Start*: ``init`` (``config.init == "budget"``) or the parent, discretised, repaired and
       filled by the exact cost model — a feasible, importance-guided heterogeneous point (when
       one exists); the masks are reset to it.
    2. *Train* the masks (``config.steps`` Adam steps on KL + Lagrangian) and discretise, repair
       and fill the result.
    3. *Select* among the trained point, the start point and ``init`` as it is (when it meets every
       budget and constraint by the exact cost model, whatever ``config.init``): feasible first,
       then the lowest KL to the parent on the first ``config.val_samples`` rows, held out of
       training (the caller's selection rows, never test data); ties go to the earlier of :data:`CANDIDATES`.
       So with ``init`` the trial's uniform allocation, the result is never worse on that KL than
       the uniform model of the trial's global choices, when that model is feasible.

    Args:
        model: the parent (frozen while the masks train; hooks and flags are restored afterwards).
        parent / importance: its architecture and importance scores.
        tokens: rows ``(n, T)``: the first ``config.val_samples`` choose among the candidates (a
            trial's selection rows), the rest train the masks (calibration rows).
            ``teacher``: the parent's log-probs on them ``(n, T, V)``,
            or its top-k :class:`~autocompress_opt.quality.metrics.TeacherTargets` (``shape`` ``(n, T, k)``).
        budget: the trial's global choices; ``goal``: hardware constraints (None: budgets only).
        config: steps, batch, learning rates, schedule, seed.
        init: the trial's uniform allocation (:func:`~autocompress_opt.arch.search_space.uniform_allocation`
            of its global choices, listing every parent layer): the start point for
            ``config.init == "budget"`` and the ``uniform`` candidate of the selection. None: start
            from the parent, no ``uniform`` candidate.
        on_step: called as ``on_step(step, val_kl, violation)`` after every training step
            (``step`` = steps done, 1-based); every ``config.measure_every`` steps with what the
            search would return if it ended then (:class:`_Meter`): the current masks discretised
            as at the end, and the selection's rule over that point, the start point and the
            uniform allocation: the lowest KL(parent ‖ point) in nats on the held-out calibration
            rows among the feasible ones and violation 0; none feasible: the current point's KL
            and the smallest largest-normalised-violation (``> 0``); the step's training-batch KL
            when no rows are held out. ``None, None`` at the other steps.
            It may raise to abandon the search (the model's hooks are removed first). Measuring
            draws no random numbers: the result is the same with or without a listener.
        measure_at: measure after these steps only (:meth:`InnerConfig.measures`; the others
            report ``None, None``); None: every ``config.measure_every`` steps.
        rules: a serving engine's shape rules (:func:`~autocompress_opt.prune.loadability.shape_rules`):
            the start and trained points are discretised onto shapes that engine loads; None: any shape.
        extra: more candidates by name (not one of :data:`CANDIDATES`), judged like ``uniform``: as
            they are, when they meet every budget and constraint, after the others on ties. A study
            passes a seeded baseline's own model (its kept layers by its own criterion), so the trial
            of the baseline's global choices never returns worse than that baseline.
        start_from: the name of an ``extra`` candidate to start from instead of step 1's importance
            start (the block-library solver's answer): when it is feasible the masks are reset to it
            as it is and it is the ``start`` candidate (``selection["start_from"]`` names it);
            otherwise the importance start stands, and the record says so.
        slice_hidden: when the trial's hidden size is below the parent's, train the masks and take
            the rung measurements on the parent cut to that hidden size once (every layer, head and
            channel kept; :func:`hidden_sliced`) rather than on the parent under a hidden-channel
            mask: the same function, up to float rounding, with the pruned channels never computed.
            False: the masked parent (for comparisons).
    """
    adapter = adapter or adapter_for(model)
    clash = sorted(set(extra or ()) & set(CANDIDATES))
    if clash:
        raise ConfigError(f"extra candidate name(s) {clash} are taken; use names other than {', '.join(CANDIDATES)}")
    if tuple(teacher.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"teacher log-probs {tuple(teacher.shape)} do not fit tokens {tuple(tokens.shape)}")
    if start_from is not None and start_from not in (extra or {}):
        raise ConfigError(f"start_from={start_from!r} names no extra candidate; given: {sorted(extra or {})}")
    if config.val_samples >= tokens.shape[0]:
        raise ConfigError(f"val_samples={config.val_samples} leaves no training rows of the {tokens.shape[0]} given")
    began = time.perf_counter()
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    ffn_unit, train_heads = _relaxation_shape(config, rules, parent)
    masks = ParentMasks(
        parent,
        importance,
        hidden_size=budget.hidden_size,
        init=init if config.init == "budget" else None,
        init_log_alpha=config.init_log_alpha,
        ffn_unit=ffn_unit,
        device=next(model.parameters()).device,  # beside the parent: no copy per hook (ParentMasks)
    )
    uniform = _as_candidate(init, budget, goal) if init is not None else None
    judged = {"uniform": uniform} if uniform is not None else {}
    judged.update({name: _as_candidate(arch, budget, goal) for name, arch in (extra or {}).items()})
    start_record: dict[str, str] = {"start_from": "importance"}
    if start_from is not None and judged[start_from].feasible:
        start = judged[start_from]
        start_record["start_from"] = start_from
    else:
        start = discretise(masks, importance, budget, goal, fill=config.fill, rules=rules)
        if start_from is not None:
            start_record["start_from_refused"] = f"{start_from} is not feasible by the exact cost model"
    if start.feasible:
        masks.reset(start.architecture, config.init_log_alpha)
    started = time.perf_counter()
    val, train = slice(0, config.val_samples), slice(config.val_samples, None)
    fixed = {"start": start, **{name: cand for name, cand in judged.items() if cand.feasible}}
    rows = _RowKLs(tokens[val], teacher[val], config.batch_size)
    skipped = _nothing_to_learn(rules)
    trains = bool(config.steps) and not skipped  # else neither the masks nor the meter run a pass
    work = hidden_sliced(model, masks, importance, adapter) if slice_hidden and trains else model
    meter = _Meter(work, masks, importance, budget, goal, config, rules, rows, fixed)
    history = (
        _train(
            work,
            masks,
            tokens[train],
            teacher[train],
            budget,
            goal,
            config,
            gen,
            adapter,
            on_step=on_step,
            meter=meter,
            train_heads=train_heads,
            measure_at=measure_at,
        )
        if trains
        else []
    )
    trained_at = time.perf_counter()
    with torch.no_grad():
        expected = masks.expected(config.tau_end).to_dict()
    # Nothing trained: the start point stands for the trained one (no second discretisation).
    trained = start if skipped else discretise(masks, importance, budget, goal, fill=config.fill, rules=rules)
    discretised = time.perf_counter()
    candidates = {"trained": trained, "start": start, **{n: c for n, c in judged.items() if c.feasible}}
    if skipped:
        del candidates["trained"]
    chosen, selection = _select(candidates, model, parent, importance, rows, adapter, config.choice_margin)
    for name, cand in judged.items():
        if not cand.feasible:  # recorded, never returned
            selection[name] = {"feasible": False, "val_kl": math.nan, "summary": cand.architecture.summary()}
    if skipped:
        selection["skipped"] = skipped
    selection.update(start_record)
    plan = plan_pruning(parent, importance, chosen.architecture)
    seconds = {
        "start": started - began,
        "train": trained_at - started,
        "discretise": discretised - trained_at,
        "select": time.perf_counter() - discretised,
        "total": time.perf_counter() - began,
    }
    masks.requires_grad_(False)
    return InnerResult(
        chosen.architecture,
        plan,
        plan.masks(),
        chosen.feasible,
        chosen.violations,
        chosen.metrics,
        expected,
        history,
        chosen.moves,
        seconds,
        selection,
        masks,
        {name: cand.architecture for name, cand in candidates.items()},
    )


# Parents cut to a hidden size, per parent model (hidden_sliced): a study worker's trials at one
# hidden size share one; the two most recent are kept, and none outlives its parent.
_SLICED_KEPT = 2
_SLICED: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()


def hidden_sliced(model: Any, masks: ParentMasks, importance: Importance, adapter: FamilyAdapter) -> Any:
    """``model`` cut to ``masks.hidden_size`` residual channels (its most important ones, as the
    hidden mask keeps them), every layer, head and channel kept: what the parent computes under the
    hidden mask (kept-channel RMSNorm) without computing the pruned channels, a smaller model for
    every matrix product of the search, the LM head's included. ``model`` itself when nothing is
    cut, a layer is MoE / Mamba-2 (hidden masks are refused there) or the cut model would lose a
    layer (an empty one: the masks index the parent's layers). Cached per parent model by
    (kept channels, device, dtype), the two most recent, so a worker builds one per hidden size."""
    if masks.hidden_size >= masks.parent.hidden_size or any(
        spec.moe is not None or spec.mamba is not None for spec in masks.parent.layers
    ):
        return model
    from autocompress_opt.prune.slicing import materialize

    first = next(model.parameters())
    key = (bytes(masks.hidden.cpu().numpy().tobytes()), str(first.device), str(first.dtype))
    cache = _SLICED.setdefault(model, {})
    if key not in cache:
        while len(cache) >= _SLICED_KEPT:
            cache.pop(next(iter(cache)))
        work = materialize(model, plan_pruning(masks.parent, importance, masks.sliced_parent), adapter=adapter)
        # A parent with an empty layer (a DeciLM no-op) is built without it: the masks index the
        # parent's layers, so such a parent keeps the hidden mask (None: the masked parent).
        same = architecture_mismatch(masks.sliced_parent, adapter_for(work).architecture(work)) is None
        cache[key] = work.eval() if same else None
    cache[key] = cache.pop(key)  # the most recent last
    return model if cache[key] is None else cache[key]


def _nothing_to_learn(rules: ShapeRules | None) -> str:
    """Why the masks need no training for this trial ("" when they do): under rules that load only
    the uniform model of the trial's global choices (:attr:`ShapeRules.heterogeneous` False, e.g.
    llama.cpp where ``query heads · head_dim`` is not the hidden size), discretisation throws every
    learned width away and keeps only the gates' ranking of layers, which a few dozen steps from
    log α = ±3 do not change: the trained point was the start point (measured on the demo's
    llama.cpp targets: ``benchmarks/results/trial_phases.json``). The layers kept are then the start
    point's (the trial's layer order), and the seeded baselines' own models still compete."""
    if rules is not None and not rules.heterogeneous:
        return f"{rules.engine} loads only uniform shapes here ({rules.why_uniform})"
    return ""


def _relaxation_shape(config: InnerConfig, rules: ShapeRules | None, parent: Architecture) -> tuple[int, bool]:
    """``(FFN unit, whether the head masks train)`` of the relaxation (:attr:`InnerConfig.engine_relaxation`):
    ``config.ffn_unit``, else :func:`~autocompress_opt.search.inner.relaxation.ffn_unit_for`, given the
    engine's FFN multiple under heterogeneous rules; the head masks stay put where the rules fix
    every layer's query heads."""
    engine = rules if config.engine_relaxation else None
    if config.ffn_unit is not None:
        unit = config.ffn_unit
    else:
        unit = ffn_unit_for(parent, engine.ffn_multiple if engine is not None and engine.heterogeneous else None)
    return unit, engine is None or engine.query_heads is None


def _as_candidate(arch: Architecture, budget: Budget, goal: CostGoal | None) -> Discrete:
    """``arch`` as it is (no repair, no fill), judged by the exact cost model."""
    violations, metrics = exact_violations(arch, budget, goal)
    return Discrete(arch, all_satisfied(violations), violations, metrics, {"repair": 0, "fill": 0})


def _select(
    candidates: dict[str, Discrete],
    model: Any,
    parent: Architecture,
    importance: Importance,
    rows: _RowKLs,
    adapter: FamilyAdapter,
    margin: float = 0.0,
) -> tuple[Discrete, dict[str, Any]]:
    """Feasible before infeasible (then less violation); among the feasible ones with a finite KL
    on every choice row the lowest mean KL, where a heterogeneous candidate must beat the best
    uniform one (:func:`_paired`) beyond its interval and ``margin``; a candidate whose KL is not
    finite is never chosen over one whose KL is; ties to the earlier candidate. Returns the chosen
    one and the record (:attr:`InnerResult.selection`). Equal architectures (names aside) are
    measured once, and rows ``rows`` already holds (the :class:`_Meter`'s) not again; when the
    feasible candidates are all one architecture no row is measured for the choice (``val_kl`` NaN
    unless every row was measured already)."""
    record: dict[str, Any] = {}
    per_row: dict[str, list[float]] = {}
    # One feasible model under several names leaves nothing to compare: no row is read.
    distinct = {replace(c.architecture, name="") for c in candidates.values() if c.feasible}
    n = rows.count if len(distinct) > 1 else 0
    for name, cand in candidates.items():
        if n and cand.feasible:
            per_row[name] = _row_kls(model, parent, importance, cand.architecture, rows, adapter)
        held = rows.held.get(replace(cand.architecture, name=""), [])
        if cand.feasible and name not in per_row and rows.count and len(held) >= rows.count:
            per_row[name] = held[: rows.count]  # measured already (the meter's last step): recorded
        kl = sum(per_row[name]) / rows.count if name in per_row else math.nan
        record[name] = {"feasible": cand.feasible, "val_kl": kl, "summary": cand.architecture.summary()}
    order = list(candidates)
    finite = [n_ for n_ in order if n_ in per_row and all(math.isfinite(v) for v in per_row[n_])]
    feasible = [n_ for n_ in order if candidates[n_].feasible]
    if finite:
        mean = lambda name: (record[name]["val_kl"], order.index(name))
        best = min(finite, key=mean)
        uniform = [name for name in finite if candidates[name].architecture.active().is_uniform]
        if uniform and best not in uniform:
            reference = min(uniform, key=mean)
            interval = _paired(per_row[best], per_row[reference])
            won = interval["high"] < -margin
            record["paired"] = {**interval, "candidate": best, "reference": reference, "margin": margin, "won": won}
            if not won:
                best = reference
    elif feasible:  # no choice rows, or no finite KL: the first feasible one
        best = feasible[0]
    else:
        excess = lambda name: (sum(max(v, 0.0) for v in candidates[name].violations.values()), order.index(name))
        best = min(order, key=excess)
    record["chosen"] = best
    return candidates[best], record


# The two-sided 95 % normal quantile of the paired interval (_paired).
_Z95 = 1.959964


def _paired(kls: list[float], reference: list[float]) -> dict[str, float]:
    """Mean per-row difference ``kls − reference`` (nats) and its 95 % interval (normal, from the
    rows' sample standard deviation; zero width for one row): ``{"diff", "low", "high", "rows"}``."""
    diffs = [a - b for a, b in zip(kls, reference, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    half = _Z95 * sd / math.sqrt(n)
    return {"diff": mean, "low": mean - half, "high": mean + half, "rows": n}


class _RowKLs:
    """Per-row KL(parent ‖ architecture) on the choice rows ``tokens`` ``(n, T)`` (``teacher``: the
    parent's log-probs on them), each row of each architecture (names aside) measured once: a
    request for the first ``k`` rows computes only those not held yet, in batches of
    ``batch_size``. The mean over positions of each row; rows have equal length, so the mean of
    rows is the mean over positions."""

    def __init__(self, tokens: torch.Tensor, teacher: Teacher, batch_size: int) -> None:
        self.tokens, self.teacher, self.batch_size = tokens, teacher, batch_size
        self.held: dict[Architecture, list[float]] = {}

    @property
    def count(self) -> int:
        return int(self.tokens.shape[0])

    def first(self, arch: Architecture, k: int, masked: Callable[[], Any], model: Any) -> list[float]:
        """Per-row KLs of ``arch`` on the first ``k`` rows; ``masked()`` is the context in which
        ``model`` computes ``arch`` (entered only when a row is missing)."""
        have = self.held.setdefault(replace(arch, name=""), [])
        if len(have) < k:
            device = next(model.parameters()).device
            with masked(), torch.inference_mode():
                for start in range(len(have), k, self.batch_size):
                    stop = min(start + self.batch_size, k)
                    logits = model(input_ids=self.tokens[start:stop].to(device), use_cache=False).logits
                    teacher = self.teacher[start:stop].to(logits.device)
                    have += teacher_kl(log_probs(logits), teacher).mean(-1).double().tolist()
        return have[:k]


def _row_kls(
    model: Any,
    parent: Architecture,
    importance: Importance,
    arch: Architecture,
    rows: _RowKLs,
    adapter: FamilyAdapter,
) -> list[float]:
    """Per-row KL(parent ‖ ``arch``) on every choice row, computed by ``arch`` materialised from the
    parent's weights by its pruning plan (rows already held are not computed again)."""
    held = rows.held.get(replace(arch, name=""), [])
    if len(held) >= rows.count:
        return held[: rows.count]
    from autocompress_opt.prune.slicing import materialize

    # The candidate itself, cut from the parent's weights: it computes only what it keeps (the
    # parent under the plan's masks computes every head and channel and zeroes the cut ones), the
    # same logits up to float rounding (tests/prune: masked and sliced models agree), about a third
    # less time for a mid-size SmolLM2 point. Built once, only when a row is missing.
    child = materialize(model, plan_pruning(parent, importance, arch), adapter=adapter)
    return rows.first(arch, rows.count, contextlib.nullcontext, child)


def _train(
    model: Any,
    masks: ParentMasks,
    tokens: torch.Tensor,
    teacher: Teacher,
    budget: Budget,
    goal: CostGoal | None,
    config: InnerConfig,
    gen: torch.Generator,
    adapter: FamilyAdapter,
    *,
    on_step: StepListener | None = None,
    meter: _Meter | None = None,
    train_heads: bool = True,
    measure_at: Collection[int] | None = None,
) -> list[dict[str, float]]:
    """Adam on the mask parameters with dual ascent on the multipliers; returns the per-step history.
    ``train_heads=False`` leaves the KV-group and query-head keep-fractions where they are (rules
    that fix every layer's query heads: :attr:`InnerConfig.engine_relaxation`).
    ``on_step`` after every step; every ``config.measure_every`` steps (or at ``measure_at``) with
    what ``meter`` measures (:func:`search`). With ``config.checkpoint_activations`` every decoder layer is checkpointed
    for the training steps (:meth:`ParentMasks.checkpoint_layers`; the layers are restored after)."""
    if tuple(teacher.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"teacher log-probs {tuple(teacher.shape)} do not fit tokens {tuple(tokens.shape)}")
    was_training = model.training
    model.eval()
    widths = [masks.kv_keep, masks.q_keep, masks.ffn_keep] if train_heads else [masks.ffn_keep]
    gates = torch.optim.Adam([masks.attn_log_alpha, masks.ffn_log_alpha], lr=config.gate_lr)
    steppers = [
        gates,
        SharedScaleAdam(widths, lr=config.lr)
        if config.width_step == "shared"
        else torch.optim.Adam(widths, lr=config.lr),
    ]
    duals: dict[str, float] = {}
    history = []
    try:
        with (
            masks.install(model, adapter=adapter),
            masks.checkpoint_layers(model, adapter=adapter)
            if config.checkpoint_activations
            else contextlib.nullcontext(),
        ):
            for step in range(config.steps):
                tau = config.tau(step)
                rows = torch.randint(0, tokens.shape[0], (config.batch_size,), generator=gen)
                loss, kl, violations = objective(
                    model,
                    masks,
                    tokens[rows],
                    teacher[rows],
                    budget=budget,
                    goal=goal,
                    tau=tau,
                    duals=duals,
                    config=config,
                    generator=gen,
                )
                for stepper in steppers:
                    stepper.zero_grad(set_to_none=True)
                loss.backward()
                for stepper in steppers:
                    stepper.step()
                masks.clamp_()
                for k, v in violations.items():
                    duals[k] = max(0.0, duals.get(k, 0.0) + config.dual_lr * v)
                history.append(
                    {
                        "step": step,
                        "tau": tau,
                        "kl": kl,
                        "penalty": float(loss.detach()) - kl,
                        "max_violation": max(violations.values(), default=0.0),
                    }
                )
                done = step + 1
                if on_step is not None and meter is not None and config.measures(done, measure_at):
                    val_kl, violation = meter.measure(done)
                    on_step(done, kl if val_kl is None else val_kl, violation)
                elif on_step is not None:
                    on_step(done, None, None)
    finally:
        model.train(was_training)
    return history


class _Meter:
    """What the search would return if it ended now, measured during training (hooks installed).

    :meth:`measure` discretises the current masks exactly as the end of the search does (round,
    repair, fill) and applies the selection's rule to that point and the fixed candidates (the
    start point, the uniform allocation when feasible): among the feasible ones the lowest KL on
    the choice rows read so far and violation 0; when none is feasible, the current point's KL and
    the smallest largest-violation among them. The first measurement reads the first
    :attr:`InnerConfig.rung_rows` choice rows, each later one twice as many (up to all of them;
    after the last step all of them, so the report there is the final choice's KL):
    the KLs an early-stopping scheduler compares at one rung are on the same rows for every
    trial, and a trial stopped early paid for few rows. A KL is a forward pass over the rows not
    yet measured for that point (:class:`_RowKLs`, shared with the final choice) with the point's
    0/1 masks through the installed hooks (equal to the bool masks of its pruning plan), no
    gradients and no random draws. No choice rows: KL None."""

    def __init__(
        self,
        model: Any,
        masks: ParentMasks,
        importance: Importance,
        budget: Budget,
        goal: CostGoal | None,
        config: InnerConfig,
        rules: ShapeRules | None,
        rows: _RowKLs,
        fixed: dict[str, Discrete],
    ) -> None:
        self.model, self.masks, self.importance, self.budget, self.goal = model, masks, importance, budget, goal
        self.config, self.rules, self.rows, self.fixed = config, rules, rows, fixed
        self.measured = 0  # measurements so far

    @torch.no_grad()
    def measure(self, done: int) -> tuple[float | None, float]:
        """After ``done`` steps: the first measurement reads ``rung_rows`` rows, each later one twice
        as many, the one after the last step every row (what the final choice reads)."""
        k = min(self.rows.count, self.config.rung_rows * 2**self.measured)
        if done >= self.config.steps:
            k = self.rows.count
        self.measured += 1
        now = discretise(self.masks, self.importance, self.budget, self.goal, fill=self.config.fill, rules=self.rules)
        candidates = [now, *self.fixed.values()]
        feasible = [c for c in candidates if c.feasible]
        if feasible:
            return (min(self._kl(c.architecture, k) for c in feasible) if k else None), 0.0
        excess = min(max(max(c.violations.values(), default=0.0), 0.0) for c in candidates)
        return (self._kl(now.architecture, k) if k else None), excess

    def _kl(self, arch: Architecture, k: int) -> float:
        def hooked() -> Any:
            live = _live_of(self.masks, plan_pruning(self.masks.parent, self.importance, arch).masks())
            return self.masks.use(live)

        return sum(self.rows.first(arch, k, hooked, self.model)) / k


def _live_of(masks: ParentMasks, plan_masks: Masks) -> LiveMasks:
    """The 0/1 :class:`LiveMasks` of a pruning plan's bool masks: kept heads and FFN channels 1, a
    removed sub-block's gate 0 (its output, bias included, is zeroed, as :func:`apply_masks` does)."""
    ref = masks.live(1.0, sample=False)  # for the shapes, dtype and device only
    # Built on the CPU (the plan's masks are there) and moved once, four tensors in all.
    cpu = lambda t: torch.zeros(t.shape, dtype=t.dtype)
    heads, ffn, attn_gate, ffn_gate = cpu(ref.heads), cpu(ref.ffn), cpu(ref.attn_gate), cpu(ref.ffn_gate)
    for i, layer in enumerate(plan_masks.layers):
        if layer.heads is not None:
            heads[i, : layer.heads.numel()] = layer.heads.cpu().to(heads.dtype)
            attn_gate[i] = 1.0
        if layer.ffn is not None:
            ffn[i, : layer.ffn.numel()] = layer.ffn.cpu().to(ffn.dtype)
            ffn_gate[i] = 1.0
    on = lambda t: t.to(ref.heads.device)
    return LiveMasks(attn_gate=on(attn_gate), ffn_gate=on(ffn_gate), heads=on(heads), ffn=on(ffn))


def objective(
    model: Any,
    masks: ParentMasks,
    tokens: torch.Tensor,
    teacher: Teacher,
    *,
    budget: Budget,
    goal: CostGoal | None,
    tau: float,
    duals: Mapping[str, float],
    config: InnerConfig,
    generator: torch.Generator | None = None,
    sample: bool = True,
) -> tuple[torch.Tensor, float, dict[str, float]]:
    """One batch of the Lagrangian: ``(loss, kl, violations)``; ``loss`` is differentiable w.r.t. the masks.

    ``model`` must have ``masks.install``-ed hooks; ``tokens`` ``(B, T)`` and ``teacher`` ``(B, T, V)``
    log-probs or :class:`~autocompress_opt.quality.metrics.TeacherTargets`. ``violations`` (floats)
    are those the multipliers are updated with (margin included). The live masks (gate noise
    included) are drawn once, here, before the forward pass; a checkpointed layer rebuilt in
    ``loss.backward()`` reuses them.
    """
    device = next(model.parameters()).device
    live = masks.live(tau, sample=sample, generator=generator)
    with masks.use(live):
        logits = model(input_ids=tokens.to(device), use_cache=False).logits  # (B, T, V)
    kl = _kl(logits, teacher.to(logits.device))
    violations = _violations(masks, tau, budget, goal, config.margin, config.straight_through)
    penalty = sum(
        (duals.get(k, 0.0) * v + config.penalty / 2 * torch.relu(v) ** 2 for k, v in violations.items()),
        torch.zeros((), dtype=cost_dtype(masks.device), device=masks.device),
    )
    loss = kl + penalty.to(device=kl.device, dtype=kl.dtype)
    # One read from the device for the multipliers and the history, not one per constraint.
    values = torch.stack(
        [kl.detach().to(device=penalty.device, dtype=penalty.dtype), *(v.detach() for v in violations.values())]
    ).tolist()
    return loss, values[0], dict(zip(violations, values[1:]))


def _kl(logits: torch.Tensor, teacher: Teacher) -> torch.Tensor:
    """Mean per-position ``KL(teacher ‖ student)`` in nats, differentiable w.r.t. ``logits``.

    ``logits`` ``(B, T, V)`` of the masked student; ``teacher`` ``(B, T, V)`` log-probabilities (any
    float dtype, e.g. the float16 cache of :func:`teacher_log_probs`), compared in float32, or
    top-k :class:`~autocompress_opt.quality.metrics.TeacherTargets` (the lumped KL, a lower bound)."""
    return teacher_kl(log_probs(logits), teacher).mean()


def _violations(
    masks: ParentMasks, tau: float, budget: Budget, goal: CostGoal | None, margin: float, straight_through: bool = True
) -> dict[str, torch.Tensor]:
    """Differentiable violations: budgets on the expected structure, hardware constraints (+margin)
    by the torch cost model. With ``straight_through`` the *values* are those of the rounded masks
    (what discretisation will keep) and the *gradients* those of the relaxation, so the penalty
    and the multipliers see no relaxation gap (a gate at σ(−3) still costs 5 % of a layer otherwise)."""
    dtype, device = cost_dtype(masks.device), masks.device  # float64 on the CPU, float32 on an accelerator
    e = masks.expected(tau)
    if straight_through:
        hard = masks.expected(tau, hard=True)
        e = ExpectedStructure(
            **{
                k: getattr(e, k) + (getattr(hard, k) - getattr(e, k)).detach()
                for k in ("attn", "ffn", "heads", "kv_heads", "ffn_width")
            }
        )
    scalar = lambda v: torch.as_tensor(v, dtype=dtype, device=device).reshape(())
    out = {k: scalar(v) for k, v in budget.violations(expected_totals(e)).items()}
    if goal is not None:
        metrics = goal.metrics(cost_arrays(masks.parent, budget.hidden_size, e, dtype))
        for k, v in goal.violations(metrics).items():
            out[k] = scalar(v) + margin
    return out
