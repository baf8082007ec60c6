"""Trial records: a stored trial in plain values, Pareto fronts, and what a target's run ended with.

Pure data and arithmetic on it: nothing here opens a storage
(:func:`~.storage.load_records` reads records from one).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.serving.targets import all_satisfied

__all__ = [
    "BINDING_SLACK",
    "TargetOutcome",
    "TrialRecord",
    "best_feasible",
    "binding_constraints",
    "constraint_misses",
    "first_line",
    "pareto_front",
    "shared_answers",
    "trial_record",
]

BINDING_SLACK = 0.05  # a constraint within this normalised slack of its limit binds (shared_answers)


@dataclass(frozen=True)
class TrialRecord:
    """A finished or failed trial as stored, in plain values.

    ``quality`` is the objective stored as ``quality``; what it measures is ``quality_kind``
    (``retained_params``, ``retained_importance``, ``exp_neg_kl``, or a plugin's; see
    :data:`~autocompress_opt.search.study.trials.QUALITY_LABELS`). None for trials that did not complete.
    ``selection`` (weights mode): which inner-search candidate the trial returned and each one's
    held-out KL (:meth:`~autocompress_opt.search.inner.inner_search.InnerResult.choice`); ``baseline``:
    the baseline(s) a seeded trial's point comes from (e.g. ``"depth"``; :func:`~.seeding.seed_study`).
    ``stopped_early``: for a trial the scheduler stopped (state PRUNED), its last report
    (``phase``, ``inner_step``, ``inner_steps``, ``val_kl``, ``violation``, ``progress_score``);
    ``intermediate``: the held-out KL and violation it reported during its inner search, as
    ``[inner_step, val_kl, violation]`` rows (weights mode). ``proxy_infeasible``: the proxy's
    violations of a point it kept from running (PRUNED); ``proxy_rank``: the rank of a point the
    proxy enqueued (:mod:`~autocompress_opt.search.study.proxy`). ``timings_s`` (weights mode): where a
    completed trial's seconds went (``parent``: loading it, when this trial's process did;
    ``search``: the inner search; ``quality``: the held-out measurement(s); ``total``). ``kept``
    (weights mode): the parent layers, heads, KV groups, FFN and hidden channels the trial's model
    kept (:meth:`~autocompress_opt.prune.plan.PrunePlan.kept`; None for trials stored before it was).
    ``ffn_budget`` (weights mode): the sampled FFN width, the most FFN channels a per-layer shape under
    the engine's rules keeps within it and what the trial's model kept
    (:func:`~autocompress_opt.search.study.weights_trial.ffn_budget`; None for trials stored before it was).
    """

    study: str
    number: int
    state: str
    params: dict[str, Any]
    values: list[float] | None
    feasible: bool
    quality: float | None
    metrics: dict[str, float]
    constraints: dict[str, float]
    architecture: dict[str, Any] | None
    error: str | None = None
    quality_kind: str | None = None
    selection: dict[str, Any] | None = None
    baseline: str | None = None
    stopped_early: dict[str, Any] | None = None
    intermediate: list[list[float]] | None = None
    proxy_infeasible: dict[str, Any] | None = None  # the proxy's violations of a point it kept from running
    proxy_rank: int | None = None  # the proxy's rank of a point it enqueued (1 = best)
    timings_s: dict[str, float] | None = None  # weights mode: parent / search / quality / total seconds
    kept: dict[str, Any] | None = None  # weights mode: the kept indices the trial measured (PrunePlan.kept)
    ffn_budget: dict[str, int] | None = None  # weights mode: the sampled FFN width and what was kept of it

    def arch(self) -> Architecture | None:
        return Architecture.from_dict(self.architecture) if self.architecture else None


def trial_record(study_name: str, trial: Any) -> TrialRecord:
    """``trial`` (an Optuna ``FrozenTrial`` of study ``study_name``) as a :class:`TrialRecord`."""
    attrs = trial.user_attrs
    constraints = {k.split(":", 1)[1]: v for k, v in trial.system_attrs.items() if k.startswith("constraints:")}
    return TrialRecord(
        study=study_name,
        number=trial.number,
        state=trial.state.name,
        params=dict(trial.params),
        values=list(trial.values) if trial.values else None,
        feasible=trial.state.name == "COMPLETE" and all_satisfied(constraints),
        quality=attrs.get("quality"),
        metrics=dict(attrs.get("metrics", {})),
        constraints=constraints,
        architecture=attrs.get("architecture"),
        error=attrs.get("error"),
        quality_kind=attrs.get("quality_kind"),
        selection=attrs.get("selection"),
        baseline=attrs.get("baseline"),
        stopped_early=attrs.get("stopped_early"),
        intermediate=attrs.get("intermediate"),
        proxy_infeasible=attrs.get("proxy_infeasible"),
        proxy_rank=attrs.get("proxy_rank"),
        timings_s=attrs.get("timings_s"),
        kept=attrs.get("kept"),
        ffn_budget=attrs.get("ffn_budget"),
    )


def pareto_front(records: Sequence[TrialRecord], directions: Sequence[str]) -> list[TrialRecord]:
    """Feasible COMPLETE trials not dominated by another feasible one (``values`` vs ``directions``)."""
    pool = [r for r in records if r.feasible and r.values]
    sign = [1.0 if d == "maximize" else -1.0 for d in directions]

    def dominates(a: TrialRecord, b: TrialRecord) -> bool:
        better_eq = all(s * x >= s * y for s, x, y in zip(sign, a.values, b.values))  # type: ignore[arg-type]
        strictly = any(s * x > s * y for s, x, y in zip(sign, a.values, b.values))  # type: ignore[arg-type]
        return better_eq and strictly

    return [r for r in pool if not any(dominates(o, r) for o in pool if o is not r)]


def best_feasible(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The feasible COMPLETE record of highest ``quality`` (the lowest number on a tie); None when
    there is none."""
    feasible = [r for r in records if r.feasible and r.quality is not None]
    return max(feasible, key=lambda r: (r.quality, -r.number)) if feasible else None


def constraint_misses(records: Sequence[TrialRecord]) -> dict[str, tuple[int, float]]:
    """Per constraint (``"tpot_ms <= 0.5x"``, ``"fits device memory"``): how many COMPLETE trials
    violate it and the smallest violation among them (normalised, ``> 0``), most violated first.
    Constraints every trial meets are left out."""
    out: dict[str, tuple[int, float]] = {}
    for r in records:
        if r.state != "COMPLETE":
            continue
        for name, value in r.constraints.items():
            if value > 0:
                n, least = out.get(name, (0, float("inf")))
                out[name] = (n + 1, min(least, value))
    return dict(sorted(out.items(), key=lambda kv: (-kv[1][0], kv[1][1])))


def first_line(error: str | None) -> str:
    """The first non-empty line of a stored trial error ("" for none)."""
    return next((line.strip() for line in (error or "").splitlines() if line.strip()), "")


@dataclass
class TargetOutcome:
    """One target's run: COMPLETE trials ``before`` it and after it (``complete``), trials it ran
    that FAILed (``failed``) and the first one's error (``first_error``, its first line)."""

    study_name: str
    complete: int
    repaired: list[int] = field(default_factory=list)
    seeded: list[str] = field(default_factory=list)  # seed_study's lines
    before: int = 0
    failed: int = 0
    first_error: str | None = None
    feasible: int = 0  # feasible COMPLETE trials in the study (every run's, not only this one's)
    misses: dict[str, tuple[int, float]] = field(default_factory=dict)  # constraint_misses of its COMPLETE trials
    stopped: int = 0  # trials in the study stopped early by the scheduler (PRUNED; every run's)
    screened: int = 0  # points this run's proxy kept from running (PRUNED, proxy_infeasible)
    best: TrialRecord | None = None  # the feasible COMPLETE trial of highest quality (None: none)
    out_of_time: bool = False  # the run's time budget had ended when it stopped

    @property
    def completed_none(self) -> bool:
        """Trials were wanted and run, and none of them completed."""
        return self.complete == self.before and self.failed > 0


def binding_constraints(record: TrialRecord, slack: float = BINDING_SLACK) -> list[str]:
    """The constraints that bind ``record`` (normalised violation within ``slack`` of 0, tightest
    first, as ``"tpot_ms <= 0.8x (slack 0.001)"``); when none is that close, one line saying so
    and naming the tightest (the point is not held back by its constraints)."""
    ranked = sorted(record.constraints.items(), key=lambda kv: -kv[1])
    close = [(k, v) for k, v in ranked if v > -slack]
    if not close and ranked:
        k, v = ranked[0]
        return [f"none within {slack:g} of its limit (tightest: {k}, slack {-v:.3f})"]
    return [f"{k} (slack {-v:.3f})" for k, v in close]


def shared_answers(outcomes: Sequence[TargetOutcome]) -> list[str]:
    """One line per group of targets whose best feasible architecture is the same, saying which
    constraints bind each (:func:`binding_constraints`): why the search gave them one answer."""
    groups: dict[str, list[TargetOutcome]] = {}
    for o in outcomes:
        if o.best is not None and o.best.architecture:
            key = json.dumps({**o.best.architecture, "name": ""}, sort_keys=True)
            groups.setdefault(key, []).append(o)
    lines = []
    for members in groups.values():
        if len(members) > 1:
            why = "; ".join(
                f"{o.study_name}: {', '.join(binding_constraints(o.best))}" for o in members if o.best is not None
            )
            names = " and ".join(o.study_name for o in members)
            lines.append(f"{names} end with the same architecture; binding constraints: {why}")
    return lines
