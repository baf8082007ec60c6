"""Early stopping: Ray Tune's ASHA scheduler, one per target of a group run (:func:`make_scheduler`).

Weights trials report their held-out KL and constraint violation every few inner steps
(:mod:`~autocompress_opt.search.study.progress`); a trial outside the best third of its target's is
stopped at an eighth or three eighths of its inner search. It is stored PRUNED with its last values
(``stopped_early``), counts toward ``trials`` (the study then evaluates more points in the same
time) and never enters the Pareto front. The seeded baselines' trials are never stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autocompress_opt.search.study.config import StudyConfig

__all__ = ["REDUCTION_FACTOR", "make_scheduler", "per_target_scheduler", "rung_steps"]

REDUCTION_FACTOR = 3  # ASHA keeps the best third of a target's trials at each rung


def make_scheduler(config: StudyConfig, targets: int = 1) -> Any:
    """Ray Tune's trial scheduler for ``config.scheduler_name``: None for ``none``; for ``asha`` one
    ASHAScheduler per target (:func:`per_target_scheduler`; ``targets`` of them, the trials' config
    ``target_index`` choosing) over inner-search steps (:data:`~autocompress_opt.search.study.progress.STEP`)
    on the constraint-aware score (:data:`~autocompress_opt.search.study.progress.SCORE`, lower is better):
    a trial is only ever compared with trials of its own target, whose constraints it shares.

    Rungs at an eighth and at three eighths of the inner search's steps (3 and 9 of 24; the steps
    where the trials measure their held-out KL, :func:`rung_steps`), reduction factor 3: at each
    rung a trial that is not in the best third of its target's trials that reached it is stopped.
    The first rung is cheap (a few steps and a forward pass or two) and already telling: the
    reported KL is that of what the search would return, the uniform allocation or the greedy start
    point at first, and in the measured studies a trial's rank at step 6 was its rank at the end.
    No rung after half way and ``stop_last_trials=False``: a trial that got past it is never
    stopped, so the cost of its search is not thrown away just before its quality is measured. The
    seeded baselines' trials are judged at the rungs too, so they set the bar, but never stopped
    (:func:`per_target_scheduler`)."""
    if config.scheduler_name == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler

    from autocompress_opt.search.study.progress import SCORE, STEP

    grace, max_t = _asha_span(config)

    def asha() -> Any:
        return ASHAScheduler(
            time_attr=STEP,
            metric=SCORE,
            mode="min",
            grace_period=grace,
            max_t=max_t,
            reduction_factor=REDUCTION_FACTOR,
            stop_last_trials=False,
        )

    return per_target_scheduler([asha() for _ in range(targets)])


def rung_steps(config: StudyConfig) -> list[int] | None:
    """The inner steps of the scheduler's rungs (3 and 9 of 24 steps), the only steps whose measured
    KL anyone reads: the study's trials measure there only (``measure_at``,
    :meth:`~autocompress_opt.search.inner.inner_search.InnerConfig.measures`; each measurement is a
    discretisation and a forward pass over up to all the choice rows, up to about 3 training steps'
    time on SmolLM2). The other steps still report their count (the progress bar keeps the last KL).
    The same steps without a scheduler (``none``), where only the progress bar reads them: measuring
    every eighth of the search, as such trials did, cost a quarter more CPU time than the search
    measured at these two steps, and made a single-fidelity study pay for measurements a
    multi-fidelity one skips. None without a scheduler where the trials measure on their own terms:
    an ``inner.report_every`` the user set (every that many steps), or trials that are not weights
    trials (plan mode, a plugin's trial mode: their ``inner`` is their own)."""
    if config.scheduler_name == "none" and (config.mode != "weights" or config.inner.get("report_every")):
        return None
    grace, max_t = _asha_span(config)
    rungs = [grace]
    while rungs[-1] * REDUCTION_FACTOR < max_t:  # Ray's ASHA rungs: grace * rf**k below max_t
        rungs.append(rungs[-1] * REDUCTION_FACTOR)
    return rungs


def _asha_span(config: StudyConfig) -> tuple[int, int]:
    """``(grace_period, max_t)`` of the study's ASHA over inner steps: an eighth and half its steps."""
    from autocompress_opt.search.study.weights_trial import TrialConfig

    steps = TrialConfig.from_dict(config.inner, seed=config.seed).inner.steps
    grace = max(1, steps // 8)
    return grace, max(grace, steps // 2)


def per_target_scheduler(schedulers: Sequence[Any]) -> Any:
    """One Ray Tune scheduler made of ``schedulers``, one per target of a group run: each trial goes
    to the one its config's ``target_index`` names (trials without one to the first). A trial whose
    config says ``stoppable: False`` (a seeded baseline) is judged like the others, so its results
    enter the rungs, but not stopped before it has reported its fallback
    (:data:`~autocompress_opt.search.study.progress.FALLBACK`: its baseline's own model, measured, which
    the study records as the trial's result if it stops it). Trials run in the order they were
    added (FIFO)."""
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    from autocompress_opt.search.study.progress import FALLBACK, SCORE

    class PerTargetScheduler(FIFOScheduler):
        def __init__(self, parts: Sequence[Any]) -> None:
            super().__init__()
            self.parts = list(parts)
            self._metric = SCORE
            self.covered: set[str] = set()  # trials whose fallback result has arrived

        def _part(self, trial: Any) -> Any:
            return self.parts[int(trial.config.get("target_index", 0))]

        def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
            return all(part.set_search_properties(metric, mode, **spec) for part in self.parts)

        def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
            self._part(trial).on_trial_add(tune_controller, trial)

        def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
            self._part(trial).on_trial_error(tune_controller, trial)

        def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
            decision: str = self._part(trial).on_trial_result(tune_controller, trial, result)
            if FALLBACK in result:
                self.covered.add(trial.trial_id)
            if not trial.config.get("stoppable", True) and trial.trial_id not in self.covered:
                return str(TrialScheduler.CONTINUE)
            return decision or TrialScheduler.CONTINUE

        def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
            self._part(trial).on_trial_complete(tune_controller, trial, result)

        def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
            self._part(trial).on_trial_remove(tune_controller, trial)

        def debug_string(self) -> str:
            return f"one scheduler per target ({len(self.parts)}): " + "; ".join(p.debug_string() for p in self.parts)

    return PerTargetScheduler(schedulers)
