"""Pareto studies: Ray Tune runs the trials, a persistent Optuna study decides what to try.

One Optuna study per target (hardware × engine × workload × dtype × tp) in one storage; a *study
group* (``StudyConfig.targets``) runs several targets with one command. The storage is the state:
running the same command again continues every study to its requested number of COMPLETE trials.

Flow per target (all storage access in this driver process; trials run wherever Ray puts them)::

    open/create study ──► repair: RUNNING trials of a stopped driver → FAIL, their params re-queued
        └─► Tuner(search_alg=StudySearcher) ── suggest(), under the study's driver lock: count every
             driver's COMPLETE + RUNNING trials, study.ask() (points any driver already holds are
             told PRUNED and asked again), start the trial's heartbeat ── trial runs on Ray ──
             on_trial_complete(): set_constraint(...) (≤ 0 feasible), tell(values) or FAIL with the error

Targets are prepared (seeds, proxy points) in a driver thread while the one Ray Tune run goes on:
each joins the run as soon as it is ready (:class:`_Preparation`), so the first target's trials do
not wait for the last target's preparation. Targets that read the same data are prepared together,
those of the first target's data first (:func:`preparation_order`); results keep the config's order.

Several drivers may run one study at once, on one host or on many sharing an RDB
(:class:`~.coordination.Coordination`): together they reach exactly the requested COMPLETE count with no repeated
point, and a driver repairs another's trials only when their heartbeat stopped. Ctrl-C stops the
whole run with no RUNNING trial left (:func:`run_study`).

Ray's stock ``OptunaSearch`` is not used: it neither passes constraints through nor repairs
orphaned RUNNING trials after a killed driver.

Early stopping (:mod:`~autocompress_opt.search.study.schedulers`) and the points a study enqueues
before its own samples, the baselines' and the proxy's (:mod:`~autocompress_opt.search.study.seeding`),
are described where they are implemented.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.hybrid import is_sparse
from autocompress_opt.search.study.config import StudyConfig, check_config
from autocompress_opt.search.study.coordination import Coordination, open_study
from autocompress_opt.search.study.placement import Placement, driver_cache_dir, driver_path
from autocompress_opt.search.study.progress import ProgressBar, finished_trials
from autocompress_opt.search.study.ray_runtime import init_ray, study_placement, trainable
from autocompress_opt.search.study.records import (
    TargetOutcome,
    best_feasible,
    constraint_misses,
    first_line,
    trial_record,
)
from autocompress_opt.search.study.schedulers import make_scheduler, rung_steps
from autocompress_opt.search.study.seeding import (
    SeedScoring,
    enqueue_proxy_points,
    make_proxy,
    seed_study,
    seeded_baselines,
)
from autocompress_opt.search.study.signals import InterruptState, StudyInterrupted, fit_until_stopped, handle_sigint
from autocompress_opt.search.study.trials import Target

__all__ = ["preparation_order", "run_study"]


def run_study(
    config: StudyConfig, *, progress: bool = True, layer_order: Sequence[int] | None = None
) -> list[TargetOutcome]:
    """Run (or continue) every target's study to ``config.trials`` COMPLETE trials.

    Ctrl-C (in the main thread) stops the whole run: raises :class:`~.signals.StudyInterrupted` with no
    RUNNING trial left behind (:func:`~.signals.handle_sigint`)."""
    state = InterruptState()
    interrupted: list[str] = []
    with handle_sigint(state):
        try:
            return _run_targets(config, progress, layer_order, state, interrupted)
        except KeyboardInterrupt:
            raise StudyInterrupted("; ".join(interrupted) or "no trial was running") from None


def _run_targets(
    config: StudyConfig,
    progress: bool,
    layer_order: Sequence[int] | None,
    state: InterruptState,
    interrupted: list[str],
) -> list[TargetOutcome]:
    """The targets of :func:`run_study`, all in one Ray Tune run (:func:`_run_group`); ``interrupted``
    collects what Ctrl-C stopped."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parent = load_architecture(config.model)
    check_config(config, parent)  # before Ray starts and before any study is created
    if progress:
        import ray

        if not ray.is_initialized():  # several seconds of silence otherwise
            where = f"connecting to the Ray cluster at {config.address}" if config.address else "starting a local Ray"
            print(f"{where}…", file=sys.stderr, flush=True)
    # (importance, score) for seeds and proxy: built once per data setting the targets share; the
    # parent they need loads on the driver's CPU (unless driver_device names a GPU) while Ray starts
    # and the studies open (after the placement, when only the cluster says the trials' dtype)
    scoring = SeedScoring(config)
    scoring.preload(config.targets[0])
    runs: list[_TargetRun] = []
    try:
        init_ray(config.address, config.concurrency, config.plugins)
        placement = study_placement(config, progress)  # checked against the cluster before any study is created
        scoring.place(placement)  # the dtype the parent is read in, when only the cluster could say
        scoring.preload(config.targets[0])
        deadline = time.monotonic() + 60 * config.time_budget if config.time_budget else None
        for index, target in enumerate(config.targets):
            runs.append(_open_target(config, target, parent, layer_order, progress, index, deadline))
        prepare = partial(
            _prepare_target, parent=parent, layer_order=layer_order, scoring=scoring, memos={}, progress=progress
        )
        pending = [r for r in runs if r.needs_trials]
        order = preparation_order([scoring.data_key(r.target) for r in pending])
        _run_group(config, pending, order, prepare, scoring.release, placement, state, interrupted)
    finally:
        scoring.settle()
        for run in runs:
            run.coordination.close()
            run.bar.close()
    return [_outcome(run) for run in runs]


def preparation_order(data_keys: Sequence[str]) -> list[int]:
    """The positions of a group's targets in the order the driver prepares them, given each target's
    data setting (:meth:`~.seeding.SeedScoring.data_key`): the first target first, then the others
    that read its data (their importance and candidate scores are then ready: each costs seconds, not
    the minutes of a new data setting), then the next data setting's targets, and so on; config order
    within a setting. The demo's group (in-game, local-coding, datacenter, datacenter) is prepared
    0, 2, 3, 1: three targets run trials before the one that reads code is scored."""
    first: dict[str, int] = {}
    for position, key in enumerate(data_keys):
        first.setdefault(key, position)
    return sorted(range(len(data_keys)), key=lambda position: (first[data_keys[position]], position))


@dataclass
class _TargetRun:
    """One target of a group run: its study and what its trials need and report to."""

    config: StudyConfig
    target: Target
    study: Any
    coordination: Coordination
    repaired: list[int]
    complete_before: int
    done: int  # trials evaluated before this run: COMPLETE or stopped early
    parent_cost: dict[str, float]
    request: dict[str, Any]
    bar: ProgressBar
    deadline: float | None  # time.monotonic() after which no new trial starts
    seeded: list[str] = field(default_factory=list)
    searcher: Any = None  # StudySearcher once prepared; None when the study already holds its trials

    @property
    def needs_trials(self) -> bool:
        return self.done < self.config.trials


def _open_target(
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    layer_order: Sequence[int] | None,
    progress: bool,
    position: int,
    deadline: float | None,
) -> _TargetRun:
    """Open ``target``'s study and repair a stopped driver's trials (the cheap part, before Ray Tune
    starts; :func:`_prepare_target` does the rest)."""
    study, storage, parent_cost = open_study(config, target, parent)
    coordination = Coordination(study, config.storage_url, storage)
    with coordination.lock():
        repaired = coordination.repair()
    request = {
        "mode": config.mode,
        "plugins": list(config.plugins),
        "parent": parent.to_dict(),
        "space": config.space.to_dict(),
        "target": target.to_dict(),
        "layer_order": list(layer_order) if layer_order else None,
        "seed": config.seed,
        "inner": dict(config.inner),
        "parent_model": driver_path(config.model),  # absolute when a local path: trials run elsewhere
        "importance": str(Path(config.importance).resolve()) if config.importance else None,
        "plan_quality": config.plan_quality,
        "hardware": [dict(h) for h in config.hardware],  # user GPUs, registered in each trial's worker
        "serve_as": config.serve_as_for(target),  # trials keep shapes this engine loads
        "measure_at": rung_steps(config),  # held-out KL only where the scheduler reads it
        # absolute: Ray Tune runs each trial in its own (scratch) working directory
        "cache_dir": driver_cache_dir(config.cache_dir),
    }
    complete_before, stopped_before = finished_trials(study)
    done = complete_before + stopped_before
    bar = ProgressBar(config.study_name(target), config.trials, min(done, config.trials), progress, position)
    bar.count_existing(study)
    return _TargetRun(
        config, target, study, coordination, repaired, complete_before, done, dict(parent_cost), request, bar, deadline
    )


def _prepare_target(
    run: _TargetRun,
    *,
    parent: Architecture,
    layer_order: Sequence[int] | None,
    scoring: SeedScoring,
    memos: dict[str, Any],
    progress: bool,
) -> None:
    """Enqueue ``run``'s seeds and the proxy's points and make its searcher (``run.searcher``); the
    preparation's local start time and seconds go into the study's ``prepared`` attribute."""
    config, target, study = run.config, run.target, run.study
    began, clock = datetime.now(), time.perf_counter()
    seeding = seeded_baselines(config, parent)
    if progress and config.seeds_baselines and seeding and "baseline_seeds" not in study.user_attrs:
        # Say what the silent minutes are: in weights mode the first target loads the parent, each
        # workload's data its importance, and the Minitron and best-uniform candidates are scored
        # (shared by the later targets of the same data).
        _say(f"{config.study_name(target)}: {_choosing(seeding)}")
    score = partial(scoring, target)
    if config.seeds_baselines:
        run.seeded = seed_study(study, config, target, parent, layer_order, score)
    proxy = None
    if config.proxy_points:
        proxy = make_proxy(config, target, parent, run.parent_cost, layer_order, score, memos)
        run.seeded += enqueue_proxy_points(study, proxy, config.proxy_points, config.seed)
    from autocompress_opt.search.study.searcher import StudySearcher  # needs Ray Tune and Optuna

    run.searcher = StudySearcher(
        study,
        distributions=config.space.distributions(),
        request=run.request,
        target=target,
        parent_cost=run.parent_cost,
        objectives=[o.metric for o in config.objectives_for(target)],
        trials=config.trials,
        max_failures=config.max_failures if config.max_failures is not None else config.trials,
        progress=run.bar,
        coordination=run.coordination,
        early_stopping=config.scheduler_name != "none",
        proxy=proxy,
        deadline=run.deadline,
        sparse=is_sparse(parent),
    )
    seconds = time.perf_counter() - clock
    study.set_user_attr("prepared", {"at": began.isoformat(), "seconds": round(seconds, 3)})
    if progress and seconds >= 1:
        _say(f"{config.study_name(target)}: prepared in {seconds:.0f} s; its trials may start")


def _choosing(names: Sequence[str]) -> str:
    """What the driver says it is choosing: ``choosing the depth, minitron, best-uniform baselines to
    seed the study`` (one baseline: ``the minitron baseline``)."""
    return f"choosing the {', '.join(names)} baseline{'s' if len(names) > 1 else ''} to seed the study"


def _say(line: str) -> None:
    """A line on stderr that leaves the progress bars intact."""
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stderr)


class _Preparation(threading.Thread):
    """Prepares a group's targets one after another in the driver (:func:`_prepare_target`), in
        ``order`` (positions in ``runs``; :func:`preparation_order`), and admits each to the group's
        searcher at its own position as soon as it is ready, so the first target's trials run while the
        later targets are prepared. The first target is prepared with the process's torch threads; the
        later ones with one, since the trials then hold the CPUs Ray gave them. No target is started once
    Ctrl-C came (``interrupt``), even while Ray Tune is still stopping its trials. An error is kept
        (:attr:`error`) and closes the group (:meth:`~.searcher.GroupSearcher.abandon`); ``finish`` runs at
        the end in any case."""

    def __init__(
        self,
        runs: Sequence[_TargetRun],
        order: Sequence[int],
        prepare: Callable[[_TargetRun], None],
        group: Any,
        finish: Callable[[], None],
        deadline: float | None,
        interrupt: InterruptState | None = None,
    ) -> None:
        super().__init__(name="autocompress-prepare", daemon=True)  # a Ctrl-C does not wait for it
        if sorted(order) != list(range(len(runs))):
            raise ValueError(f"a preparation order must list each of the {len(runs)} targets once, got {list(order)}")
        self.runs, self.order, self.prepare, self.group = runs, list(order), prepare, group
        self.finish, self.deadline, self.interrupt = finish, deadline, interrupt
        self.cancelled = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        threads = None  # the process's torch threads, while the later targets are prepared with one
        try:
            for turn, index in enumerate(self.order):
                if self._stopped():
                    break
                torch = sys.modules.get("torch")  # imported by a weights preparation; a plan study never pays for it
                if turn and torch is not None and threads is None:
                    threads = torch.get_num_threads()
                    torch.set_num_threads(1)
                run = self.runs[index]
                self.prepare(run)
                self.group.admit(index, run.searcher)
        except BaseException as exc:  # re-raised by the driver once the trials in flight are recorded
            self.error = exc
            self.group.abandon(close=True)
        finally:
            self.group.abandon()  # positions never admitted (deadline, Ctrl-C): nothing to wait for
            if threads is not None:
                sys.modules["torch"].set_num_threads(threads)
            self.finish()

    def _stopped(self) -> bool:
        """Cancelled by the driver, Ctrl-C seen (before the driver's loop has ended), or past the deadline."""
        return (
            self.cancelled.is_set()
            or (self.interrupt is not None and self.interrupt.interrupted)
            or (self.deadline is not None and time.monotonic() >= self.deadline)
        )


def _run_group(
    config: StudyConfig,
    runs: Sequence[_TargetRun],
    order: Sequence[int],
    prepare: Callable[[_TargetRun], None],
    finish: Callable[[], None],
    placement: Placement,
    state: InterruptState,
    interrupted: list[str],
) -> None:
    """One Ray Tune run for the targets that still need trials (:class:`~.searcher.GroupSearcher`):
    the trial actors, each holding the parent once, serve every target (``reuse_actors``). Each
    target joins once ``prepare`` made its searcher (:class:`_Preparation`, in a thread beside Ray
    Tune's loop, in ``order``); ``finish`` runs after the last preparation. A preparation's error is raised once
    the trials in flight are recorded."""
    if not runs:
        finish()
        return
    import optuna
    from ray import tune

    from autocompress_opt.search.study.searcher import INTERRUPTED, GroupSearcher  # needs Ray Tune and Optuna

    searcher = GroupSearcher([None] * len(runs))
    preparation = _Preparation(runs, order, prepare, searcher, finish, runs[0].deadline, state)
    scratch = tempfile.mkdtemp(prefix="autocompress-tune-")
    try:
        preparation.start()
        tuner = tune.Tuner(
            tune.with_resources(trainable, placement.resources()),
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                num_samples=-1,
                max_concurrent_trials=placement.concurrency,
                reuse_actors=True,
                scheduler=make_scheduler(config, len(runs)),
            ),
            run_config=tune.RunConfig(
                storage_path=scratch,
                name=config.name,
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=2),
            ),
        )
        fit_until_stopped(tuner, searcher, state)
    except KeyboardInterrupt:
        preparation.cancelled.set()  # stops after the target it is preparing
        if preparation.is_alive():  # torch killed mid-call at interpreter exit aborts the process (SIGABRT)
            _say("waiting for the target being prepared to finish (Ctrl-C again to quit at once)")
            preparation.join()
        for run in runs:
            stopped = [
                t.number
                for t in run.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
                if t.user_attrs.get("driver") == run.coordination.driver and t.user_attrs.get("error") == INTERRUPTED
            ]
            if stopped:
                numbers = ", ".join(f"#{n}" for n in stopped)
                interrupted.append(f"{run.study.study_name}: trials {numbers} stopped, marked FAIL and re-queued")
        raise
    finally:
        preparation.cancelled.set()
        shutil.rmtree(scratch, ignore_errors=True)
    preparation.join()  # the group finished: every target was admitted or given up
    if preparation.error is not None:
        raise preparation.error


def _outcome(run: _TargetRun) -> TargetOutcome:
    """What ``run``'s target ended with (its trials, this run's failures, feasibility, misses)."""
    import optuna

    study = run.study
    final, n_stopped = finished_trials(study)
    failed = [  # this run's: trials of other runs or drivers are not its failures
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
        if t.user_attrs.get("driver") == run.coordination.driver
    ]
    first_error = first_line(failed[0].user_attrs.get("error")) if failed else None
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    records = [trial_record(study.study_name, t) for t in complete]
    return TargetOutcome(
        study.study_name,
        final,
        run.repaired,
        run.seeded,
        run.complete_before,
        len(failed),
        first_error,
        feasible=sum(r.feasible for r in records),
        misses=constraint_misses(records),
        stopped=n_stopped,
        screened=run.searcher.screened if run.searcher is not None else 0,
        best=best_feasible(records),
        out_of_time=run.deadline is not None and time.monotonic() >= run.deadline,
    )
