"""What a running trial says about itself: its phase and, during the inner search, how it is doing.

A trial function calls :func:`report` at each phase (load the parent, importance, teacher, inner
step k of N, materialise, quality); outside a study (no :func:`reporting` block) the call does
nothing. The study's Ray Tune trainable installs a reporter that forwards each
:class:`TrialProgress` to ``ray.tune.report``, where

* the progress bar shows it (``trial 5: inner step 12/24, val KL 2.31``), and
* a scheduler (ASHA, :attr:`~autocompress_opt.search.study.StudyConfig.scheduler`) may stop the
  trial early on :data:`SCORE` over the resource :data:`STEP` (inner-search steps).

:data:`SCORE` is constraint-aware: the held-out calibration KL plus :data:`INFEASIBLE_PENALTY`
nats per unit of normalised constraint violation, so an infeasible trial is never promoted on
quality alone. Every result a study's trial sends carries :data:`STEP` and :data:`SCORE` (Ray
Tune's strict metric check wants the scheduler's metric in every result); the step counter never
decreases within a trial.

The driver shows them in one progress bar per target (:class:`ProgressBar`) and counts the trials
evaluated (:func:`finished_trials`: COMPLETE or stopped early).

No torch, no Ray: the driver reads results with it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from autocompress_opt.search.study.records import trial_record

__all__ = [
    "FALLBACK",
    "INFEASIBLE_PENALTY",
    "PHASES",
    "SCORE",
    "STEP",
    "STOPPED_EARLY",
    "ProgressBar",
    "TrialProgress",
    "finished_trials",
    "is_stopped_early",
    "report",
    "reporting",
]

# The phases of a weights trial, in order (a cached parent skips the first three; only a seeded
# trial measures its baseline's own model first).
PHASES: tuple[str, ...] = (
    "load parent",
    "importance",
    "teacher",
    "baseline",
    "block library",
    "inner search",
    "materialise",
    "quality",
)
STEP = "inner_step"  # the scheduler's resource: inner-search steps done (monotone within a trial)
SCORE = "progress_score"  # the scheduler's metric, lower is better (TrialProgress.score)
# Nats of score per unit of normalised violation (0.1 = 10 % over a constraint costs 10 nats):
# larger than the KL gap between any two pruned SmolLM2 children (held-out KL 1-15 nats), so a
# trial that still violates a constraint ranks below every feasible one.
INFEASIBLE_PENALTY = 100.0
# User attribute of an Optuna trial the scheduler stopped (state PRUNED): its last report
# (TrialProgress.to_result). Duplicate points, also PRUNED, do not have it.
STOPPED_EARLY = "stopped_early"
# Result key of a seeded trial's fallback (TrialProgress.fallback): the complete result the study
# records if the scheduler stops the trial, so a seeded baseline's point can be stopped early
# without losing the baseline's own model.
FALLBACK = "fallback"

Reporter = Callable[["TrialProgress"], None]
_REPORTER: ContextVar[Reporter | None] = ContextVar("autocompress_trial_reporter", default=None)


@dataclass(frozen=True)
class TrialProgress:
    """One intermediate report of a trial.

    Attributes:
        phase: one of :data:`PHASES` (a plugin's trial may name its own).
        inner_step / inner_steps: inner-search steps done and planned (0 before the search).
        val_kl: KL(parent ‖ pruned) in nats, on the calibration rows held out of the search, of
            what the inner search would return if it ended now (its selection's rule over the
            current masks discretised, the start point and the uniform allocation; the training
            batch's KL when no rows are held out); None before the search measured one.
        violation: how far that result is from feasible, as a normalised constraint violation:
            0 when a feasible candidate exists, else the smallest largest-violation among them
            (:func:`~autocompress_opt.search.inner.inner_search.search`).
        stale: ``val_kl`` and ``violation`` were measured at an earlier step (the inner search
            measures every few steps and reports every step).
        fallback: a seeded trial's complete result (the trial's JSON payload) should the scheduler
            stop it: its baseline's own model, measured before the inner search (phase
            ``baseline``); sent once, as :data:`FALLBACK` in :meth:`to_result`.
    """

    phase: str
    inner_step: int = 0
    inner_steps: int = 0
    val_kl: float | None = None
    violation: float | None = None
    stale: bool = False
    fallback: str | None = None

    @property
    def score(self) -> float:
        """``val_kl + INFEASIBLE_PENALTY · max(violation, 0)``; +inf before a KL was measured."""
        if self.val_kl is None or not math.isfinite(self.val_kl):
            return math.inf
        return self.val_kl + INFEASIBLE_PENALTY * max(self.violation or 0.0, 0.0)

    def to_result(self) -> dict[str, Any]:
        """The flat, JSON-safe result Ray Tune receives (:data:`STEP` and :data:`SCORE` included)."""
        return {
            "phase": self.phase,
            STEP: self.inner_step,
            "inner_steps": self.inner_steps,
            "val_kl": self.val_kl,
            "violation": self.violation,
            "stale": self.stale,
            SCORE: self.score,
            **({FALLBACK: self.fallback} if self.fallback is not None else {}),
        }

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> TrialProgress | None:
        """The progress in a Ray Tune result; None when it carries none (e.g. a plan-mode result)."""
        if "phase" not in result or STEP not in result:
            return None
        return cls(
            str(result["phase"]),
            int(result[STEP]),
            int(result.get("inner_steps") or 0),
            _number(result.get("val_kl")),
            _number(result.get("violation")),
            bool(result.get("stale", False)),
        )

    def describe(self) -> str:
        """``"inner step 12/24, val KL 2.31"``, ``"inner step 12/24, val KL 2.31, violation 0.04"``, ``"teacher"``."""
        text = f"inner step {self.inner_step}/{self.inner_steps}" if self.phase == "inner search" else self.phase
        if self.val_kl is not None and self.phase == "inner search":
            text += f", val KL {self.val_kl:.2f}"
            if self.violation:
                text += f", violation {self.violation:.2f}"
        return text


def is_stopped_early(trial: Any) -> bool:
    """Whether an Optuna trial was stopped early by the study's scheduler (PRUNED with
    :data:`STOPPED_EARLY`): a finished trial, evaluated partly, that counts toward the study's
    trials (a PRUNED duplicate point does not)."""
    return trial.state.name == "PRUNED" and STOPPED_EARLY in trial.user_attrs


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """Send every :func:`report` inside the block (same thread or task) to ``reporter``."""
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        _REPORTER.reset(token)


def report(progress: TrialProgress) -> None:
    """Tell the study (when inside :func:`reporting`) where the trial is; a no-op otherwise."""
    reporter = _REPORTER.get()
    if reporter is not None:
        reporter(progress)


class ProgressBar:
    """One tqdm bar per target, one line: trials evaluated (COMPLETE or stopped early), feasible,
    failed, stopped early, best feasible quality so far, and what each running trial is doing
    (``trial 5: inner step 12/24, val KL 2.31``)."""

    def __init__(self, desc: str, total: int, initial: int, enabled: bool, position: int | None = None):
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=total, initial=initial, desc=desc, disable=not enabled, unit="trial", leave=True, position=position
        )
        self.feasible, self.failed, self.stopped = 0, 0, 0
        self.best: float | None = None
        self.running: dict[int, str] = {}  # trial number -> what it last reported

    def count_existing(self, study: Any) -> None:
        """Start from the study's finished trials (a resumed study): feasible count, best quality,
        trials stopped early."""
        import optuna

        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            record = trial_record(study.study_name, trial)
            self.feasible += record.feasible
            if record.feasible and record.quality is not None and (self.best is None or record.quality > self.best):
                self.best = record.quality
        self.stopped = finished_trials(study)[1]
        if self.feasible or self.stopped:
            self._post()

    def text(self) -> str:
        """The bar's postfix."""
        best = "-" if self.best is None else f"{self.best:.3f}"
        stopped = f", stopped early {self.stopped}" if self.stopped else ""
        text = f"feasible {self.feasible}, failed {self.failed}{stopped}, best quality {best}"
        running = "; ".join(f"trial {n}: {what}" for n, what in sorted(self.running.items()))
        return text + (f" | {running}" if running else "")

    def _post(self) -> None:
        self.bar.set_postfix_str(self.text())

    def update_running(self, number: int, what: str) -> None:
        self.running[number] = what
        self._post()

    def update_complete(self, feasible: bool, quality: float, number: int | None = None) -> None:
        if number is not None:
            self.running.pop(number, None)
        self.feasible += feasible
        if feasible and (self.best is None or quality > self.best):
            self.best = quality
        self.bar.update(1)
        self._post()

    def update_pruned(self, number: int) -> None:
        self.running.pop(number, None)
        self.stopped += 1
        self.bar.update(1)
        self._post()

    def update_fail(self, number: int | None = None) -> None:
        if number is not None:
            self.running.pop(number, None)
        self.failed += 1
        self._post()

    def close(self) -> None:
        self.bar.close()


def finished_trials(study: Any) -> tuple[int, int]:
    """``(complete, stopped)``: the study's COMPLETE trials and those the scheduler stopped early
    (:func:`~autocompress_opt.search.study.progress.is_stopped_early`); together, the trials evaluated,
    which ``StudyConfig.trials`` counts."""
    import optuna

    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    return complete, sum(is_stopped_early(t) for t in trials)
