"""The Ray Tune searcher that asks and tells a persistent Optuna study (see :mod:`.study`).

Imported only when a study runs: it needs Ray Tune and Optuna at import time (its base class is
Ray's ``Searcher``), which ``import autocompress_opt`` must not pay for.

Contract: :meth:`StudySearcher.suggest` hands Ray one trial request per Optuna trial until the study
holds ``trials`` COMPLETE trials (or ``max_failures`` trials failed), never more in flight than are
still needed; a point the sampler already evaluated is told PRUNED (``duplicate``) and asked again.
:meth:`StudySearcher.on_trial_complete` records the trial's metrics, quality, architecture and
constraint values (``<= 0`` feasible; the target's one check,
:meth:`~autocompress_opt.serving.targets.Target.violations`) and tells the objective values, or
tells FAIL with the error. All storage access happens in the driver process that owns the searcher.

Ctrl-C (:meth:`StudySearcher.stop`): no new trials are asked for; a trial that Ray stops from then
on without a result, and every trial still in flight when the run ends (:meth:`StudySearcher.release`),
is told FAIL with the reason ``interrupted`` and its point enqueued again, so the storage holds no
RUNNING trial and rerunning the same command evaluates that point first.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import optuna
from ray.tune.search import Searcher

from autocompress_opt.serving.targets import Target, all_satisfied

__all__ = ["INTERRUPTED", "StudySearcher", "point_key"]

INTERRUPTED = "interrupted (Ctrl-C) before it finished; parameters re-queued"
_ASK_ATTEMPTS = 100  # sampler repeats in a row before the space counts as exhausted


class Progress(Protocol):
    """What the searcher reports to (a progress bar)."""

    def update_complete(self, feasible: bool, quality: float) -> None: ...

    def update_fail(self) -> None: ...


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
        progress: receives one update per finished trial.
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
    ) -> None:
        super().__init__(metric=None, mode=None)
        self.study, self.distributions, self.request = study, dict(distributions), dict(request)
        self.target, self.parent_cost, self.objectives = target, dict(parent_cost), list(objectives)
        self.trials, self.max_failures, self.progress = trials, max_failures, progress
        self.driver = {"host": socket.gethostname(), "pid": os.getpid()}
        self.live: dict[str, Any] = {}
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        self.complete = len(done)
        self.seen = {point_key(t.params) for t in done}
        self.failures = 0
        self.stopping = False

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
        attrs = {"requeued_from": trial.number}
        baseline = trial.user_attrs.get("baseline")
        if baseline:
            attrs["baseline"] = baseline
        trial.set_user_attr("error", reason)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.study.enqueue_trial(dict(trial.params), user_attrs=attrs)
        return int(trial.number)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # Ray returns FINISHED too
        if self.stopping:
            return Searcher.FINISHED if not self.live else None
        if self.complete >= self.trials or self.failures >= self.max_failures:
            return Searcher.FINISHED if not self.live else None
        if self.complete + len(self.live) >= self.trials:
            return None  # enough in flight; wait for them
        trial = self._ask_unique()
        if trial is None:
            return Searcher.FINISHED if not self.live else None
        self.live[trial_id] = trial
        return {"request": {**self.request, "params": dict(trial.params)}, "number": trial.number}

    def _ask_unique(self) -> Any:
        for _ in range(_ASK_ATTEMPTS):
            trial = self.study.ask(self.distributions)
            trial.set_user_attr("driver", self.driver)
            key = point_key(trial.params)
            if key not in self.seen:
                self.seen.add(key)
                return trial
            trial.set_user_attr("duplicate", True)  # the sampler repeated an evaluated point
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return None  # the space looks exhausted

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        trial = self.live.pop(trial_id, None)
        if trial is None:
            return
        payload = json.loads(result["payload"]) if result and "payload" in result else None
        if self.stopping and payload is None:  # stopped by Ctrl-C before it finished: not its fault
            self._requeue(trial, INTERRUPTED)
            return
        if error or payload is None or "error" in payload:
            self.failures += 1
            trial.set_user_attr("error", (payload or {}).get("error", "trial process died (see Ray logs)"))
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.progress.update_fail()
            return
        metrics = payload["metrics"]
        trial.set_user_attr("metrics", metrics)
        trial.set_user_attr("quality", payload["quality"])
        trial.set_user_attr("quality_kind", payload["quality_kind"])
        trial.set_user_attr("architecture", payload["architecture"])
        trial.set_user_attr("node", payload.get("node"))
        if "selection" in payload:  # weights mode: the inner-search candidate returned, each one's KL
            trial.set_user_attr("selection", payload["selection"])
        violations = self.target.violations(metrics, self.parent_cost)
        for key, value in violations.items():
            trial.set_constraint(key, float(value))
        # Also as user attributes: optuna-dashboard 0.21 shows only old-style list constraints.
        trial.set_user_attr("constraints", {k: float(v) for k, v in violations.items()})
        feasible = all_satisfied(violations)
        trial.set_user_attr("feasible", feasible)
        values = [payload["quality"] if metric == "quality" else metrics[metric] for metric in self.objectives]
        self.study.tell(trial, values)
        self.complete += 1
        self.progress.update_complete(feasible, payload["quality"])
