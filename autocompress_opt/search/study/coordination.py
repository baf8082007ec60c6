"""How several drivers share one study (several ``study run`` at once, on one host or on many
sharing an RDB): opening or creating it one at a time, a lock held while a driver counts trials and
asks for a new one, trial heartbeats, and the repair of trials whose driver stopped.

Trials are addressed by their storage ids, looked up through Optuna's public storage API
(``get_study_id_from_name``, ``get_trial_id_from_study_id_trial_number``) on the storage
:func:`~.storage.make_storage` opened; the one private call (stale
heartbeats) is :func:`~autocompress_opt.search.study._optuna_private.stale_trial_ids`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.search_space import space_changes
from autocompress_opt.cache import file_lock, process_alive
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.loadability import parent_problems
from autocompress_opt.search.study._optuna_private import stale_trial_ids
from autocompress_opt.search.study.config import Objective, StudyConfig, sampler_seed
from autocompress_opt.search.study.storage import driver_lock_file, make_storage, resolve_storage, study_exists
from autocompress_opt.search.study.trials import Target, parent_metrics

__all__ = ["Coordination", "driver_identity", "driver_lock", "heartbeat_interval", "open_study", "repair_orphans"]

_log = logging.getLogger(__name__)


def heartbeat_interval(storage: Any) -> int | None:
    """Seconds between the trial heartbeats ``storage`` records: an ``RDBStorage`` opened with a
    ``heartbeat_interval`` (:func:`~.storage.make_storage` with
    ``heartbeat=True``); None for any other storage (a journal file has no heartbeats)."""
    import optuna

    return storage.get_heartbeat_interval() if isinstance(storage, optuna.storages.RDBStorage) else None


def driver_identity() -> dict[str, Any]:
    """This driver process as trials record it (``driver`` user attribute)."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


class Coordination:
    """How the drivers of one study share it (several ``study run`` at once, on one host or many).

    * :meth:`lock`: a mutex over every driver of the study, held while a driver counts the COMPLETE
      and RUNNING trials and asks for a new one, so together they run exactly the trials needed:
      ``pg_advisory_lock`` on PostgreSQL, ``GET_LOCK`` on MySQL, an ``flock`` on a file beside a
      SQLite database or journal file (``<file>.driver-lock``; those storages are one host's).
      Released by the server or the kernel when a driver dies (where the file system refuses
      ``flock``, a lock file instead: :func:`~autocompress_opt.cache.file_lock`).
    * :meth:`beat`: while a trial runs, its driver records a heartbeat in the storage every
      ``interval`` seconds (Optuna's ``RDBStorage`` heartbeats; journal files have none).
    * :meth:`repair`: RUNNING trials whose driver stopped become FAIL and their points are
      re-queued (:func:`repair_orphans`).
    """

    def __init__(self, study: Any, url: str, storage: Any):
        """``study`` opened from ``storage``, the storage :func:`~.storage.make_storage` opened for ``url``
        (:func:`open_study` returns both)."""
        self.study = study
        self.driver = {**driver_identity(), "run": uuid.uuid4().hex[:12]}  # this run of this driver
        self.storage = storage
        self.study_id: int = storage.get_study_id_from_name(study.study_name)
        interval = heartbeat_interval(storage)
        self.heartbeats = interval is not None
        self.interval = float(interval) if interval is not None else 5.0
        self._lock = driver_lock(storage, resolve_storage(url), study.study_name)
        self._beating: dict[int, int] = {}  # trial_id -> number, of this driver's trials in flight
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lock(self) -> Any:
        return self._lock()

    def __getstate__(self) -> dict[str, Any]:
        """Ray Tune pickles its searcher (this included) into its scratch experiment state; that copy
        is never run, and goes without the lock, the beating trials and the heartbeat thread."""
        return {**self.__dict__, "_lock": None, "_beating": {}, "_stop": None, "_thread": None}

    def beat(self, trial: Any) -> None:
        """Start ``trial``'s heartbeat (first one now, marked in its system attributes)."""
        if not self.heartbeats:
            return
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number)
        self.storage.record_heartbeat(trial_id)
        self.storage.set_trial_system_attr(trial_id, "heartbeat", True)
        self._beating[trial_id] = trial.number
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="autocompress-heartbeat", daemon=True)
            self._thread.start()

    def done(self, trial: Any) -> None:
        """Stop ``trial``'s heartbeat (nothing when it has none)."""
        for trial_id, number in list(self._beating.items()):
            if number == trial.number:
                del self._beating[trial_id]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for trial_id in list(self._beating):
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception as exc:  # a lost connection: the next beat tries again
                    _log.warning("heartbeat of trial %s not recorded: %s", self._beating.get(trial_id), exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._stop.clear()

    def repair(self, keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """:func:`repair_orphans` sparing ``keep`` (this driver's trials in flight); call under :meth:`lock`."""
        return repair_orphans(self.study, self.storage, keep)


def driver_lock(storage: Any, url: str, study_name: str) -> Callable[[], Any]:
    """The :meth:`Coordination.lock` of a study in ``storage`` (as :func:`~.storage.make_storage` opened
    ``url``; ``url`` as resolved)."""
    import hashlib

    local = threading.Lock()  # the drivers in this process (tests run several)
    engine = getattr(storage, "engine", None)  # RDBStorage's SQLAlchemy engine
    dialect = engine.dialect.name if engine is not None else None
    key = int.from_bytes(hashlib.sha256(f"autocompress:{study_name}".encode()).digest()[:8], "big", signed=True)

    if engine is not None and dialect in ("postgresql", "mysql", "mariadb"):
        from sqlalchemy import text

        acquire, release = (
            ("SELECT pg_advisory_lock(:k)", "SELECT pg_advisory_unlock(:k)")
            if dialect == "postgresql"
            else ("SELECT GET_LOCK(:k, -1)", "SELECT RELEASE_LOCK(:k)")
        )
        param = key if dialect == "postgresql" else f"autocompress:{key:x}"

        @contextmanager
        def server_lock() -> Iterator[None]:
            with local, engine.connect() as conn:
                conn.execute(text(acquire), {"k": param})
                try:
                    yield
                finally:
                    conn.execute(text(release), {"k": param})
                    conn.commit()

        return server_lock
    lock_file = driver_lock_file(storage, url)
    if lock_file is None and dialect != "sqlite":  # an in-memory SQLite has one driver by construction
        _log.warning("%s: no lock shared between drivers; run one driver per study", dialect or type(storage).__name__)

    @contextmanager
    def driver_file_lock() -> Iterator[None]:
        with local:
            if lock_file is None:
                yield
                return
            with file_lock(lock_file):
                yield

    return driver_file_lock


def repair_orphans(study: Any, storage: Any, keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Mark RUNNING trials whose driver stopped as FAIL and re-queue their parameters.

    A trial with a heartbeat (:class:`Coordination`) is orphaned when its heartbeat is older than
    the grace period, or when its driver ran on this host and that process is gone (no need to wait
    then); a live driver on another host sharing the RDB keeps its trials. A trial without a
    heartbeat (a journal file; older versions) is orphaned unless its driver is another live
    process on this host. Trials numbered in ``keep`` (the caller's own in flight) are left alone.
    Safe against other drivers repairing at once: a trial is failed and re-queued by one of them.
    ``storage``: the one ``study`` was opened from (:func:`~.storage.make_storage`). Returns the
    repaired trial numbers."""
    import optuna

    study_id = storage.get_study_id_from_name(study.study_name)
    stale = stale_trial_ids(storage, study_id) if heartbeat_interval(storage) is not None else set()
    me = driver_identity()
    repaired = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if trial.number in keep:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        owner = trial.user_attrs.get("driver") or {}
        here = owner.get("host") == me["host"]
        other_live_here = here and owner.get("pid") != me["pid"] and process_alive(owner.get("pid"))
        if trial.system_attrs.get("heartbeat"):
            orphaned = trial_id in stale or (here and not other_live_here)
        else:
            orphaned = not other_live_here
        if not orphaned:
            continue
        try:
            storage.set_trial_user_attr(trial_id, "error", "orphaned: its driver stopped; parameters re-queued")
            storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # finished meanwhile, or repaired by another driver
        if trial.params:
            study.enqueue_trial(dict(trial.params), user_attrs={"requeued_from": trial.number})
        repaired.append(trial.number)
    return repaired


def open_study(config: StudyConfig, target: Target, parent: Architecture) -> tuple[Any, Any, dict[str, float]]:
    """Create the target's study, or load it and check it is the same study (directions included);
    returns the study, the storage it was opened from (for :class:`Coordination`) and the parent's
    cost on the target.

    Creation is all or nothing: everything is computed before the study is created, and a study
    whose creation did not finish (no stored identity, no trials; e.g. left by an interrupted
    earlier version) is deleted and created again. Drivers started at once do this one at a time
    under the study's driver lock (:class:`Coordination`): one creates the study, the others load it."""
    import optuna

    objectives = config.objectives_for(target)
    directions = [o.direction for o in objectives]
    storage = make_storage(config.storage_url, heartbeat=True)
    name = config.study_name(target)
    identity = _identity(config, target, objectives)
    sampler = config.space.make_sampler(seed=sampler_seed(config.seed, target))
    cost = None if study_exists(storage, name) else parent_metrics(parent, target)  # outside the lock
    with driver_lock(storage, resolve_storage(config.storage_url), name)():
        existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
        if name in existing and "identity" not in existing[name].user_attrs and existing[name].n_trials == 0:
            optuna.delete_study(study_name=name, storage=storage)  # a half-created study: nothing to keep
            del existing[name]
        if name in existing:
            study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
            old_dirs = [d.name.lower() for d in study.directions]
            if old_dirs != directions:
                raise ConfigError(
                    f"study {name!r} in {config.storage_url} has directions {old_dirs}; this run asks for "
                    f"{directions} ({', '.join(map(str, objectives))}). Use another --name or the same objectives."
                )
            old = study.user_attrs.get("identity", {})
            added_later: dict[str, Any] = {"inner": {}, "importance": None, "hardware_profile": None}  # newer keys
            added_later["plan_quality"] = "params"  # a study from before the estimate used the parameters
            added_later["serve_as"] = identity["serve_as"]  # a study from before the rules resumes under them
            # ... and before it recorded what its data held: alike without --data; with it, the rows'
            # roles were then hashed from row numbers, so such a study resumes only when told to
            added_later["data"] = None
            # ... and before roles were assigned by content: its trials were chosen on other rows
            added_later["split_rule"] = None
            diffs = [k for k in identity if old.get(k, added_later.get(k)) != identity[k]]
            if diffs and set(diffs) <= {"data", "split_rule"}:
                _resume_on_changed_data(study, name, old, identity, config.allow_data_change)
            elif diffs:
                detail = "; ".join(_difference(k, old.get(k), identity[k]) for k in diffs)
                raise ConfigError(f"study {name!r} exists with different settings ({detail}). Use another --name.")
            return study, storage, dict(study.user_attrs["parent_metrics"])
        cost = cost if cost is not None else parent_metrics(parent, target)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            directions=directions,  # type: ignore[arg-type]  # "minimize" / "maximize", checked by Objective
            sampler=sampler,
        )
        try:
            study.set_user_attr("parent_metrics", cost)
            study.set_user_attr("parent_architecture", parent.to_dict())
            study.set_user_attr("objectives", [str(o) for o in objectives])
            study.set_user_attr("serve_as", _serve_as_record(config, target, parent))
            study.set_user_attr("identity", identity)  # last: its presence marks a finished creation
        except BaseException:
            optuna.delete_study(study_name=name, storage=storage)
            raise
        return study, storage, cost


def _difference(key: str, stored: Any, now: Any) -> str:
    """One clause of a refused resume: the identity ``key``'s stored and new values; a search space by
    the choices that changed (:func:`~autocompress_opt.arch.search_space.space_changes`), since the
    study's sampler has drawn every stored trial from the stored space."""
    if key == "space" and isinstance(stored, Mapping) and isinstance(now, Mapping):
        return f"space: {space_changes(stored, now)}"
    return f"{key}: stored {stored!r}, now {now!r}"


def _resume_on_changed_data(
    study: Any, name: str, old: dict[str, Any], identity: dict[str, Any], allowed: bool
) -> None:
    """The study's ``--data`` specs are the same but what they hold is not: refused in one line saying
    what changed, unless ``allowed`` (``--allow-data-change``): then the new record is stored and the
    change logged in the study's ``data_changes`` attribute."""
    from autocompress_opt.data.user import data_changes

    changes = [data_changes(old.get("data"), identity["data"])]
    if old.get("split_rule") != identity["split_rule"]:
        changes.append(
            f"its split rule was {old.get('split_rule')}, now {identity['split_rule']} (documents nested in others "
            "share their role; held-out rows sharing a long n-gram with calibration text are dropped)"
        )
    what = "; ".join(c for c in changes if c)
    if not allowed:
        raise ConfigError(
            f"study {name!r} was run on other data: {what}; resume on the new data with --allow-data-change, "
            "or use another --name"
        )
    _log.warning("study %s resumes on changed data: %s", name, what)
    study.set_user_attr("data_changes", [*study.user_attrs.get("data_changes", []), what])
    study.set_user_attr("identity", identity)


def _identity(config: StudyConfig, target: Target, objectives: Sequence[Objective]) -> dict[str, Any]:
    from autocompress_opt.data.textdata import SPLIT_RULE
    from autocompress_opt.data.user import data_record

    specs = config.inner.get("data") if config.mode == "weights" else None
    return {
        "model": config.model,
        "mode": config.mode,
        "target": target.to_dict(),
        "space": config.space.to_dict(),
        "objectives": [str(o) for o in objectives],
        "inner": dict(config.inner),
        "importance": config.importance,
        # plan mode's stand-in for quality (another one ranks the same points differently)
        "plan_quality": config.plan_quality,
        # a user GPU's numbers (None for a built-in one): the same name with other numbers is another study
        "hardware_profile": next((dict(h) for h in config.hardware if h["name"] == target.hardware), None),
        "serve_as": config.serve_as_for(target),  # the engine whose loadable shapes the trials keep
        # what the --data specs held (source, documents, content SHA-256): a grown file is other data
        "data": data_record(specs) if specs else None,
        # how text is assigned to roles (weights trials read it): another rule gives other rows
        "split_rule": SPLIT_RULE if config.mode == "weights" else None,
    }


def _serve_as_record(config: StudyConfig, target: Target, parent: Architecture) -> dict[str, Any]:
    """The study's ``serve_as`` user attribute: the engine whose rules its trials keep, whether it
    was asked for (``--serve-as``) or is the target's, and what no pruned model of the parent can
    change for it (:func:`~autocompress_opt.prune.loadability.parent_problems`)."""
    engine = config.serve_as_for(target)
    return {
        "engine": engine,
        "explicit": config.serve_as is not None,
        "parent_problems": parent_problems(parent, engine),
    }
