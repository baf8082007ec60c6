"""The Ray Tune searcher that asks and tells a persistent Optuna study (see :mod:`.study`).

Imported only when a study runs: it needs Ray Tune and Optuna at import time (its base class is
Ray's ``Searcher``), which ``import autocompress_opt`` must not pay for.

Contract: :meth:`StudySearcher.suggest` hands Ray one trial request per Optuna trial until the study
holds ``trials`` COMPLETE trials (or ``max_failures`` of this searcher's trials failed). Several
drivers may work on one study at once (on one host or many, sharing an RDB): each suggestion is
decided under the study's driver lock (:class:`~autocompress_opt.search.study.Coordination`), which
counts the COMPLETE and RUNNING trials in the storage, every driver's, before asking, so together
the drivers never run more trials than are still needed; a point that any driver already evaluated
or is evaluating is told PRUNED (``duplicate``) and asked again. Each trial in flight gets a
heartbeat in the storage (RDB storages), by which another driver tells a dead driver's trials from
live ones. :meth:`StudySearcher.on_trial_complete` records the trial's metrics, quality,
architecture and constraint values (``<= 0`` feasible; the target's one check,
:meth:`~autocompress_opt.serving.targets.Target.violations`) and tells the objective values, or
tells FAIL with the error. All storage access happens in the driver process that owns the searcher.

Intermediate results (:meth:`StudySearcher.on_trial_result`; weights trials report their phase
and, every few inner steps, the held-out KL and constraint violation,
:mod:`~autocompress_opt.search.study.progress`) go to the progress display and are kept in memory. A
trial that Ray Tune's scheduler stopped (``early_stopping``; it ends with no payload after
reporting progress) is told PRUNED with its last values as the user attribute ``stopped_early``
and all of them as ``intermediate`` (COMPLETE trials keep ``intermediate`` too); in a
single-objective study whose objective is ``quality`` they are also its Optuna intermediate
values (``trial.report(exp(-score), step)``). Multi-objective studies get no Optuna
intermediate values: ``Trial.report`` refuses them there, and Optuna 5's TPE sampler fails
(``study.direction``) on a multi-objective PRUNED trial that has any. A trial stopped early
counts toward ``trials`` like a COMPLETE one (Optuna's and Ray Tune's trial counts do the same)
and never enters the Pareto front (it is not COMPLETE).

Ctrl-C (:meth:`StudySearcher.stop`): no new trials are asked for; a trial that Ray stops from then
on without a result, and every trial still in flight when the run ends (:meth:`StudySearcher.release`),
is told FAIL with the reason ``interrupted`` and its point enqueued again, so the storage holds no
RUNNING trial and rerunning the same command evaluates that point first.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import optuna
from ray.tune.search import Searcher

from autocompress_opt.search.study.progress import FALLBACK, STOPPED_EARLY, TrialProgress, is_stopped_early
from autocompress_opt.search.study.proxy import PROXY_ATTR
from autocompress_opt.serving.targets import Target, all_satisfied

__all__ = ["INTERRUPTED", "StudySearcher", "baseline_candidates", "point_key"]

INTERRUPTED = "interrupted (Ctrl-C) before it finished; parameters re-queued"
_ASK_ATTEMPTS = 100  # sampler repeats in a row before the space counts as exhausted
_SCREEN_ATTEMPTS = 200  # points in a row the proxy finds infeasible before the target gives up
_POLL_S = 1.0  # while other drivers' trials fill the study: seconds between looks at the storage
_log = logging.getLogger(__name__)


def baseline_candidates(study: Any, trial: Any) -> dict[str, dict[str, Any]]:
    """The seeded baselines' own models (architecture dicts by baseline name) for ``trial``: those
    of the baselines named in its ``baseline`` attribute whose point is the trial's (none for a
    sampled trial, or a baseline snapped onto the space). Its inner search weighs them as candidates,
    so the trial never returns worse, on the held-out calibration KL, than those baselines' models."""
    names = str(trial.user_attrs.get("baseline") or "")
    if not names:
        return {}
    seeds = study.user_attrs.get("baseline_seeds") or {}
    return {
        name: seeds[name]["architecture"]
        for name in names.split("+")
        if "architecture" in seeds.get(name, {}) and seeds[name].get("point") == dict(trial.params)
    }


class Progress(Protocol):
    """What the searcher reports to (a progress bar)."""

    def update_running(self, number: int, what: str) -> None: ...

    def update_complete(self, feasible: bool, quality: float, number: int | None = None) -> None: ...

    def update_pruned(self, number: int) -> None: ...

    def update_fail(self, number: int | None = None) -> None: ...


class Coordinator(Protocol):
    """What the searcher needs from the drivers' coordination (:class:`~autocompress_opt.search.study.Coordination`)."""

    driver: dict[str, Any]
    interval: float

    def lock(self) -> AbstractContextManager[None]: ...

    def beat(self, trial: Any) -> None: ...

    def done(self, trial: Any) -> None: ...

    def repair(self, keep: set[int]) -> list[int]: ...


def point_key(params: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """A hashable key of a search-space point (equal points, equal keys)."""
    return tuple(sorted((k, float(v)) for k, v in params.items()))


class StudySearcher(Searcher):
    """Ask/tell a persistent Optuna study from Ray Tune (module doc for the contract).

    Args:
        study: the open ``optuna.Study`` of one target.
        distributions: the search space as Optuna distributions.
        request: the trial request every suggestion extends with its ``params``.
        target: where the model will be served (its constraint check).
        parent_cost: the parent's metrics, the reference of relative constraints.
        objectives: the metric of each study direction, in order (``"quality"`` or a cost metric).
        trials: COMPLETE trials the study should hold.
        max_failures: failed trials after which the searcher stops.
        progress: receives what running trials report and one update per finished trial.
        coordination: the study's driver lock, heartbeats and orphan repair.
        early_stopping: a scheduler may stop trials; one that ends without a result after
            reporting progress is told PRUNED (else such a trial is a FAIL).
        proxy: screens each point the sampler proposes (:class:`~autocompress_opt.search.study.proxy.Proxy`):
            one whose uniform model it finds infeasible is told PRUNED (``proxy_infeasible``)
            without running, and the sampler asks again; None: every point runs.
        deadline: ``time.monotonic()`` after which no new trial starts (None: none); trials in
            flight finish.
        sparse: the parent has MoE or Mamba-2 layers (the constraint check's pessimistic bound
            takes those rows' residuals, :meth:`Target.pessimistic`).
    """

    def __init__(
        self,
        study: Any,
        *,
        distributions: Mapping[str, Any],
        request: Mapping[str, Any],
        target: Target,
        parent_cost: Mapping[str, float],
        objectives: Sequence[str],
        trials: int,
        max_failures: int,
        progress: Progress,
        coordination: Coordinator,
        early_stopping: bool = False,
        proxy: Any = None,
        deadline: float | None = None,
        sparse: bool = False,
    ) -> None:
        super().__init__(metric=None, mode=None)
        self.study, self.distributions, self.request = study, dict(distributions), dict(request)
        self.target, self.parent_cost, self.objectives = target, dict(parent_cost), list(objectives)
        self.trials, self.max_failures, self.progress = trials, max_failures, progress
        self.coordination = coordination
        self.early_stopping = early_stopping
        self.proxy, self.deadline, self.sparse = proxy, deadline, sparse
        self.screened = 0  # points the proxy kept from running, this run
        self.driver = coordination.driver
        self.live: dict[str, Any] = {}
        self.reports: dict[str, list[TrialProgress]] = {}  # trial_id -> its intermediate reports
        self.fallbacks: dict[str, dict[str, Any]] = {}  # trial_id -> a seeded trial's result if stopped early
        self.failures = 0
        self.stopping = False
        self._next_look = 0.0  # monotonic time before which suggest() does not query the storage
        self._next_repair = 0.0

    def stop(self) -> None:
        """Ctrl-C: ask for no new trial; trials stopped without a result are re-queued, not failures."""
        self.stopping = True

    def release(self, reason: str) -> list[int]:
        """Tell FAIL (``error`` = ``reason``) every trial still in flight and enqueue its point again
        (keeping its ``baseline`` label); returns their numbers."""
        numbers = []
        for trial_id in list(self.live):
            numbers.append(self._requeue(self.live.pop(trial_id), reason))
        return numbers

    def _requeue(self, trial: Any, reason: str) -> int:
        self.coordination.done(trial)
        attrs = {"requeued_from": trial.number}
        try:
            baseline = trial.user_attrs.get("baseline")
            if baseline:
                attrs["baseline"] = baseline
            trial.set_user_attr("error", reason)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            return int(trial.number)  # another driver already failed and re-queued it
        self.study.enqueue_trial(dict(trial.params), user_attrs=attrs)
        return int(trial.number)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # Ray returns FINISHED too
        if self.stopping or self.failures >= self.max_failures or self._past_deadline():
            return Searcher.FINISHED if not self.live else None
        if time.monotonic() < self._next_look:
            return None  # waiting for trials in flight (ours or other drivers')
        with self.coordination.lock():  # count and ask as one step among all drivers of the study
            trials = [  # finished (COMPLETE or stopped early) and running; not duplicates, not failures
                t
                for t in self.study.get_trials(
                    deepcopy=False,
                    states=(
                        optuna.trial.TrialState.COMPLETE,
                        optuna.trial.TrialState.RUNNING,
                        optuna.trial.TrialState.PRUNED,
                    ),
                )
                if t.state != optuna.trial.TrialState.PRUNED or is_stopped_early(t)
            ]
            complete = sum(t.state != optuna.trial.TrialState.RUNNING for t in trials)
            if complete >= self.trials:
                return Searcher.FINISHED if not self.live else None
            if len(trials) >= self.trials:  # enough in flight, ours or other drivers'
                self._wait()
                return None
            trial = self._ask_unique({point_key(t.params): t for t in trials})
            if trial is None:
                return Searcher.FINISHED if not self.live else None
            self.coordination.beat(trial)
        self.live[trial_id] = trial
        # A baseline's point is not stopped early before it has reported its baseline's own model
        # (its fallback result): the study keeps its guarantee of holding the baselines' results
        # (study.seed_study, study.per_target_scheduler).
        stoppable = not trial.user_attrs.get("baseline")
        request = {**self.request, "params": dict(trial.params)}
        if not stoppable:  # a weights trial weighs them as candidates (a plan trial ignores them)
            request["baselines"] = baseline_candidates(self.study, trial)
        return {
            "request": request,
            "number": trial.number,
            "stoppable": stoppable,
        }

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _wait(self) -> None:
        """Called under the lock when the trials in flight suffice: look again later; meanwhile
        repair other drivers' trials whose heartbeat stopped (their points are re-queued)."""
        now = time.monotonic()
        self._next_look = now + _POLL_S
        if now >= self._next_repair:
            self._next_repair = now + self.coordination.interval
            repaired = self.coordination.repair({t.number for t in self.live.values()})
            if repaired:
                _log.warning("%s: re-queued trials %s of a driver that stopped", self.study.study_name, repaired)
                self._next_look = 0.0
        if not self.live:
            time.sleep(_POLL_S / 2)  # Ray asks again at once when nothing of ours runs

    def _ask_unique(self, taken: dict[Any, Any]) -> Any:
        """A new RUNNING trial whose point no COMPLETE or RUNNING trial of any driver has (``taken``)
        and that the proxy, if any, does not find infeasible."""
        duplicates = screened = 0
        while duplicates < _ASK_ATTEMPTS and screened < _SCREEN_ATTEMPTS:
            with warnings.catch_warnings():  # "heartbeat ... supposed to be used with Study.optimize":
                warnings.simplefilter("ignore")  # this searcher records the heartbeats itself
                trial = self.study.ask(self.distributions)
            trial.set_user_attr("driver", self.driver)
            key = point_key(trial.params)
            if key not in taken:
                if self._screened_out(trial):
                    screened += 1
                    continue
                taken[key] = trial
                return trial
            duplicates += 1
            trial.set_user_attr("duplicate", True)  # the sampler repeated a point already evaluated
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            other = getattr(taken[key], "user_attrs", {}).get("driver")
            if other is not None and other != self.driver:
                # A point of another driver or an earlier run: with the same seed the sampler replays
                # their sequence, one duplicate after another; leave it.
                self.study.sampler.reseed_rng()
        if screened >= _SCREEN_ATTEMPTS:
            _log.warning(
                "%s: the sampler proposed %d points in a row that the proxy finds infeasible; no more trials",
                self.study.study_name,
                screened,
            )
        return None  # the space looks exhausted

    def _screened_out(self, trial: Any) -> bool:
        """Tell PRUNED (``proxy_infeasible``: its violations, or why no engine-legal shape exists) a
        sampled point whose uniform model the proxy finds infeasible; a baseline's point is never
        screened."""
        if self.proxy is None or trial.user_attrs.get("baseline"):
            return False
        score = self.proxy.check(trial.params)
        if score.feasible:
            return False
        trial.set_user_attr(PROXY_ATTR, score.violations or {"not loadable": score.why_not})
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        self.screened += 1
        return True

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """An intermediate result: shown on the progress display; the inner search's are kept."""
        trial, progress = self.live.get(trial_id), TrialProgress.from_result(result)
        if trial is None or progress is None or "payload" in result:
            return
        if FALLBACK in result:  # what the study records if the scheduler stops this seeded trial
            self.fallbacks[trial_id] = json.loads(result[FALLBACK])
            return
        self._keep(trial_id, progress)
        self.progress.update_running(trial.number, progress.describe())

    def _keep(self, trial_id: str, progress: TrialProgress) -> None:
        kept = self.reports.setdefault(trial_id, [])
        fresh = progress.val_kl is not None and not progress.stale
        if fresh and (not kept or progress.inner_step > kept[-1].inner_step):
            kept.append(progress)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        trial = self.live.pop(trial_id, None)
        fallback = self.fallbacks.pop(trial_id, None)
        if trial is None:
            self.reports.pop(trial_id, None)
            return
        self._next_look = 0.0  # a slot is free: look at the storage again at once
        try:
            last = TrialProgress.from_result(result or {})
            if last is not None:
                self._keep(trial_id, last)  # the result that made the scheduler stop it, if so
            self._record(trial, result, error, last, self.reports.pop(trial_id, []), fallback)
        except optuna.exceptions.UpdateFinishedTrialError:  # failed by another driver (no heartbeat seen)
            _log.warning(
                "%s: trial %d was re-queued by another driver; its result is dropped",
                self.study.study_name,
                trial.number,
            )

    def _record(
        self,
        trial: Any,
        result: dict | None,
        error: bool,
        last: TrialProgress | None,
        reports: list[TrialProgress],
        fallback: dict[str, Any] | None = None,
    ) -> None:
        """Tell the study how ``trial`` ended: ``result`` (its payload), ``last`` (the progress in
        ``result``, if any), ``reports`` (its kept intermediate reports) and ``fallback`` (a
        seeded trial's result, measured before its inner search: recorded COMPLETE, with
        ``selection["stopped_at_step"]``, when the scheduler stopped the trial)."""
        payload = json.loads(result["payload"]) if result and "payload" in result else None
        if self.stopping and payload is None:  # stopped by Ctrl-C before it finished: not its fault
            self._requeue(trial, INTERRUPTED)
            return
        self.coordination.done(trial)
        if self.early_stopping and not error and payload is None and last is not None:
            if fallback is None:
                self._prune(trial, last, reports)
                return
            payload = fallback
            payload["selection"] = {**payload.get("selection", {}), "stopped_at_step": last.inner_step}
        if error or payload is None or "error" in payload:
            self.failures += 1
            trial.set_user_attr("error", (payload or {}).get("error", "trial process died (see Ray logs)"))
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.progress.update_fail(trial.number)
            return
        if reports:
            trial.set_user_attr("intermediate", _rows(reports))
        metrics = payload["metrics"]
        trial.set_user_attr("metrics", metrics)
        trial.set_user_attr("quality", payload["quality"])
        trial.set_user_attr("quality_kind", payload["quality_kind"])
        trial.set_user_attr("architecture", payload["architecture"])
        trial.set_user_attr("node", payload.get("node"))
        trial.set_user_attr("gpu_ids", payload.get("gpu_ids", []))  # the GPUs Ray assigned the trial
        if "kept" in payload:  # weights mode: the kept indices it measured, what prune --from-study exports
            trial.set_user_attr("kept", payload["kept"])
        if "selection" in payload:  # weights mode: the inner-search candidate returned, each one's KL
            trial.set_user_attr("selection", payload["selection"])
        if "timings_s" in payload:  # weights mode: where the trial's time went (parent, search, quality)
            trial.set_user_attr("timings_s", payload["timings_s"])
        if "ffn_budget" in payload:  # weights mode: the sampled FFN width and what the trial's model kept of it
            trial.set_user_attr("ffn_budget", payload["ffn_budget"])
        violations = self.target.violations(metrics, self.parent_cost, self.sparse)
        for key, value in violations.items():
            trial.set_constraint(key, float(value))
        # Also as user attributes: optuna-dashboard 0.21 shows only old-style list constraints.
        trial.set_user_attr("constraints", {k: float(v) for k, v in violations.items()})
        feasible = all_satisfied(violations)
        trial.set_user_attr("feasible", feasible)
        values = [payload["quality"] if metric == "quality" else metrics[metric] for metric in self.objectives]
        self.study.tell(trial, values)
        self.progress.update_complete(feasible, payload["quality"], trial.number)

    def _prune(self, trial: Any, last: TrialProgress, reports: list[TrialProgress]) -> None:
        """Tell PRUNED a trial the scheduler stopped, with its last values (module doc)."""
        trial.set_user_attr(STOPPED_EARLY, last.to_result())
        trial.set_user_attr("intermediate", _rows(reports))
        if self.objectives == ["quality"]:  # Optuna keeps intermediate values of single-objective studies only
            for progress in reports:
                trial.report(math.exp(-progress.score), progress.inner_step)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        self.progress.update_pruned(trial.number)


def _rows(reports: Sequence[TrialProgress]) -> list[list[float | None]]:
    """``[inner_step, val_kl, violation]`` per report of the inner search (JSON-safe)."""
    return [[p.inner_step, p.val_kl, p.violation] for p in reports]


class GroupSearcher(Searcher):
    """The searchers of a study group's targets as one Ray Tune searcher, so one Tuner (and its
    reused trial actors, each holding the parent once) serves every target.

    Each free slot goes to the target this run has started the fewest trials of (ties: the one after
    the target served last), so the targets advance together and one admitted late (the driver
    prepares the targets one after another) catches up with those whose trials began first, instead
    of taking only every n-th slot from then on; a target with nothing to suggest (waiting for its
    own trials in flight, or other drivers') never holds the slot back. Each suggestion's config
    carries ``target_index`` (the searcher's position), by which results and completions go back to
    the target's searcher and a :class:`~autocompress_opt.search.study.PerTargetScheduler` keeps
    each target's trials in its own rungs. FINISHED when every target's searcher is.

    A position may start empty (None: the target is still being prepared, its seeds and proxy
    points not yet in its study): it is skipped until :meth:`admit` fills it, from any thread, so the
    first targets' trials run while the driver prepares the later ones (:func:`~.run.run_study`).
    :meth:`abandon` gives up every position still empty (the run's deadline passed, or it was
    interrupted); with ``close=True`` (a target's preparation failed) no new trial starts either: the
    trials in flight finish and are recorded as usual, then the run ends.
    """

    def __init__(self, searchers: Sequence[StudySearcher | None]) -> None:
        super().__init__(metric=None, mode=None)
        if not searchers:
            raise ValueError("a group searcher needs at least one study searcher")
        self.searchers: list[StudySearcher | None] = list(searchers)
        self.owner: dict[str, int] = {}  # Ray trial id -> index of its searcher
        self.finished: set[int] = set()
        self._next = 0
        self.started = [0] * len(self.searchers)  # trials this run started, per target
        self.closed = False  # abandon(close=True): no new trial of any target
        self.stopping = False  # stop() (Ctrl-C): a target admitted later is stopped on admission
        self._changed = threading.Event()  # set by admit/abandon: an idle suggest() stops waiting

    def __getstate__(self) -> dict[str, Any]:
        """Ray Tune pickles its searcher into its scratch experiment state (a copy never run): no event."""
        return {**self.__dict__, "_changed": None}

    def admit(self, index: int, searcher: StudySearcher) -> None:
        """Fill the empty position ``index`` with its target's ready searcher."""
        if self.searchers[index] is not None:
            raise ValueError(f"target {index} of the group is already admitted")
        if self.stopping:  # prepared while Ctrl-C stopped the run: it asks for nothing either
            searcher.stop()
        self.searchers[index] = searcher
        self._changed.set()

    def abandon(self, close: bool = False) -> None:
        """Give up the positions still empty; ``close``: start no new trial of any target (class doc)."""
        self.finished.update(i for i, searcher in enumerate(self.searchers) if searcher is None)
        self.closed = self.closed or close
        self._changed.set()

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        n = len(self.searchers)
        if self.closed or self.stopping:  # stopping: ends Ray Tune's loop even before a target is admitted
            return Searcher.FINISHED if not self.owner else None
        turn = sorted(range(n), key=lambda i: (self.started[i], (i - self._next) % n))
        for index in turn:
            searcher = self.searchers[index]
            if index in self.finished or searcher is None:
                continue
            out = searcher.suggest(trial_id)
            if out == Searcher.FINISHED:
                self.finished.add(index)
            elif isinstance(out, dict):
                self.owner[trial_id] = index
                self.started[index] += 1
                self._next = (index + 1) % n
                return {**out, "target_index": index}
        if len(self.finished) == n:
            return Searcher.FINISHED
        if not self.owner:  # nothing in flight (targets still being prepared): Ray asks again at once
            self._changed.wait(_POLL_S / 2)
            self._changed.clear()
        return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self.owner:
            self._searcher(self.owner[trial_id]).on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        index = self.owner.pop(trial_id, None)
        if index is not None:
            self._searcher(index).on_trial_complete(trial_id, result, error)

    def _searcher(self, index: int) -> StudySearcher:
        searcher = self.searchers[index]
        assert searcher is not None, "a trial of a target that was never admitted"
        return searcher

    def stop(self) -> None:
        """Ctrl-C: every admitted target, and any admitted from now on, asks for nothing more
        (:meth:`StudySearcher.stop`)."""
        self.stopping = True
        for searcher in self.searchers:
            if searcher is not None:
                searcher.stop()

    def release(self, reason: str) -> list[int]:
        """:meth:`StudySearcher.release` of every admitted target; the trial numbers, target by target."""
        return [number for searcher in self.searchers if searcher is not None for number in searcher.release(reason)]
