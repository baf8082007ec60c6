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

Several drivers may run one study at once, on one host or on many sharing an RDB
(:class:`Coordination`): together they reach exactly the requested COMPLETE count with no repeated
point, and a driver repairs another's trials only when their heartbeat stopped. Ctrl-C stops the
whole run with no RUNNING trial left (:func:`run_study`).

Ray's stock ``OptunaSearch`` is not used: it neither passes constraints through nor repairs
orphaned RUNNING trials after a killed driver.

**Early stopping** (:attr:`StudyConfig.scheduler`, ``asha`` by default for weights studies of
more than 4 trials): weights trials report their held-out KL and constraint violation every few
inner steps (:mod:`~autocompress_opt.search.study.progress`); Ray Tune's ASHA (:func:`make_scheduler`)
stops a trial outside the best third of its target's at an eighth or three eighths of its inner search. It is
stored PRUNED with its last values (``stopped_early``), counts toward ``trials`` (the study then
evaluates more points in the same time) and never enters the Pareto front. The seeded baselines'
trials are never stopped.

**Seeding with the baselines** (:attr:`StudyConfig.seed_baselines`, on by default in weights mode):
before its own samples a study enqueues the global choices of the ``depth``, ``minitron`` and ``best-uniform``
baselines for its target (:func:`~autocompress_opt.prune.baselines.make_baseline`, feasibility by the
target's exact constraint check), snapped down onto the search space's values. Together with the
inner search's ``uniform`` candidate, a weights study's best is then never worse on its own objective
than the uniform models it would be compared with. The points are stored in the study
(``baseline_seeds``) and enqueued with ``skip_if_exists``, so resuming never adds them twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import CHOICES, SearchSpace, uniform_allocation
from autocompress_opt.errors import ConfigError, suggest
from autocompress_opt.prune.loadability import SERVE_AS_ANY, check_serve_as, parent_problems, rules_engine_for
from autocompress_opt.search.study.placement import (
    Placement,
    check_cache_dir,
    check_trial_gpus,
    check_visible_paths,
    cluster_nodes,
    driver_cache_dir,
    driver_path,
    plan_placement,
    trial_provenance,
)
from autocompress_opt.search.study.trials import (
    TRIAL_MODES,
    Target,
    load_plugins,
    parent_metrics,
    register_hardware,
    run_trial,
)
from autocompress_opt.serving.targets import all_satisfied

__all__ = [
    "SCHEDULERS",
    "SEEDED_BASELINES",
    "Coordination",
    "Objective",
    "StudyConfig",
    "StudyInterrupted",
    "TrialRecord",
    "baseline_seeds",
    "best_feasible",
    "binding_constraints",
    "check_config",
    "constraint_misses",
    "default_storage",
    "delete_studies",
    "driver_identity",
    "finished_trials",
    "first_line",
    "group_members",
    "load_records",
    "make_scheduler",
    "pareto_front",
    "resolve_storage",
    "run_study",
    "sampler_seed",
    "seed_study",
    "shared_answers",
]

_log = logging.getLogger(__name__)

DEFAULT_GROUP: tuple[str, ...] = ("rtx5070", "rtx5080", "h100-sxm", "b200")
_MAXIMISE = {"quality", "output_throughput_tok_s", "max_concurrency"}
PRIMARY_METRIC = {"local-coding": "ttft_ms", "datacenter": "output_throughput_tok_s", "in-game": "tpot_ms"}
# The baselines a study enqueues before its own samples, in this order (prune/baselines.BASELINES).
SEEDED_BASELINES: tuple[str, ...] = ("depth", "minitron", "best-uniform")
# Early stopping of trials by Ray Tune's scheduler (StudyConfig.scheduler, asha_scheduler).
SCHEDULERS: tuple[str, ...] = ("asha", "none")
ASHA_MIN_TRIALS = 4  # with this many trials or fewer ASHA has too few to compare: off by default
PROXY_POINTS = 4  # weights mode: points the plan-mode proxy enqueues per target by default
BINDING_SLACK = 0.05  # a constraint within this normalised slack of its limit binds (shared_answers)


@dataclass(frozen=True)
class Objective:
    """One optimisation direction: ``quality`` or a cost metric, maximised or minimised.

    ``quality`` is one stored objective name for every trial mode (existing studies keep loading);
    its meaning is the trial's ``quality_kind``: the retained-parameter fraction or retained
    importance in plan mode, ``exp(-KL to parent)`` in weights mode (see
    :data:`~autocompress_opt.search.study.trials.QUALITY_LABELS`).
    """

    metric: str
    direction: str

    def __post_init__(self) -> None:
        from autocompress_opt.serving.costmodel import METRICS

        valid = ("quality",) + METRICS
        if self.metric not in valid:
            raise ConfigError(
                f"unknown objective {self.metric!r}{suggest(self.metric, valid)}; valid: {', '.join(valid)}"
            )
        if self.direction not in ("maximize", "minimize"):
            raise ConfigError(f"objective direction must be 'maximize' or 'minimize', got {self.direction!r}")

    @classmethod
    def parse(cls, text: str) -> Objective:
        """``"tpot_ms"`` (natural direction), ``"tpot_ms:min"``, ``"quality:max"``."""
        metric, _, way = text.strip().partition(":")
        if not way:
            way = "max" if metric in _MAXIMISE else "min"
        direction = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}.get(way)
        if direction is None:
            raise ConfigError(f"objective {text!r}: direction must be max or min, got {way!r}")
        return cls(metric, direction)

    def __str__(self) -> str:
        return f"{self.metric}:{self.direction[:3]}"


@dataclass(frozen=True)
class StudyConfig:
    """Everything that defines a study group; also its identity when resuming.

    ``seed_baselines``: enqueue the ``depth``, ``minitron`` and ``best-uniform`` baselines' global choices before the
    study's own samples (module doc); None (default) means on in ``weights`` mode, off otherwise
    (:attr:`seeds_baselines`). Not part of the identity: a study may be resumed with it changed.
    ``hardware``: user GPU profiles (``Hardware.to_dict()`` of what
    :func:`~autocompress_opt.serving.hardware.load_hardware_file` read) the targets may name; they are
    registered here and in every trial's worker, and a target's profile is part of its identity.
    ``gpus_per_trial``, ``concurrency`` (None: defaults from the cluster) and ``cache_dir``: where
    trials run and keep their caches (:mod:`~autocompress_opt.search.study.placement`); not part of the
    identity either.
    """

    name: str
    model: str
    targets: tuple[Target, ...]
    space: SearchSpace
    trials: int
    objectives: tuple[Objective, ...] = ()
    mode: str = "plan"
    storage: str | None = None
    seed: int = 0
    concurrency: int | None = None  # trials at once; None: the cluster's GPUs / gpus_per_trial, else 1 (placement)
    address: str | None = None
    max_failures: int | None = None
    plugins: tuple[str, ...] = ()
    inner: Mapping[str, Any] = field(default_factory=dict)  # per-trial budget of the weights mode
    importance: str | None = None  # plan mode: an Importance record of the parent → retained-importance proxy
    seed_baselines: bool | None = None
    hardware: tuple[Mapping[str, Any], ...] = ()  # user hardware profiles (Hardware.to_dict) the targets may name
    serve_as: str | None = None  # engine whose loadable shapes trials keep; None: each target's engine (serve_as_for)
    gpus_per_trial: float | None = None  # None: 1 in weights mode on a cluster with GPUs, else 0 (placement)
    cache_dir: str | None = None  # importance/teacher/quality caches; shared storage on a cluster (placement)
    scheduler: str | None = None  # "asha" | "none"; None: asha in weights mode with > 4 trials (scheduler_name)
    proxy: int | None = None  # points the plan-mode proxy enqueues per target; None: PROXY_POINTS in weights mode
    time_budget: float | None = None  # minutes after which no new trial starts (the run's; trials in flight finish)

    def __post_init__(self) -> None:
        if self.seed_baselines not in (None, True, False):
            raise ConfigError(f"seed_baselines must be true, false or unset, got {self.seed_baselines!r}")
        if self.scheduler is not None and self.scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        if self.scheduler == "asha" and self.mode == "plan":
            raise ConfigError(
                "scheduler 'asha' stops trials on their intermediate inner-search results, which plan-mode "
                "trials do not report; use --scheduler none or --mode weights"
            )
        bad_proxy = not isinstance(self.proxy, int) or isinstance(self.proxy, bool) or self.proxy < 0
        if self.proxy is not None and bad_proxy:
            raise ConfigError(f"proxy must be an int >= 0 (points enqueued per target; 0: off), got {self.proxy!r}")
        if self.proxy and self.mode != "weights":
            raise ConfigError(
                f"proxy {self.proxy}: the plan-mode proxy ranks points for weights-mode trials; a {self.mode}-mode "
                "study's trials are as cheap as the proxy. Use --proxy 0 or --mode weights"
            )
        if self.time_budget is not None and (
            isinstance(self.time_budget, bool)
            or not isinstance(self.time_budget, (int, float))
            or not math.isfinite(self.time_budget)
            or self.time_budget <= 0
        ):
            raise ConfigError(f"time_budget must be a number of minutes > 0, got {self.time_budget!r}")
        if not self.name or any(c in self.name for c in "/\\ :"):
            raise ConfigError(f"study name {self.name!r} must be non-empty without '/', '\\\\', ':' or spaces")
        if not isinstance(self.trials, int) or self.trials < 1:
            raise ConfigError(f"trials must be a positive integer, got {self.trials!r}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency!r}")
        object.__setattr__(self, "gpus_per_trial", check_trial_gpus(self.mode, self.inner, self.gpus_per_trial))
        object.__setattr__(self, "cache_dir", check_cache_dir(self.cache_dir))
        load_plugins(self.plugins)
        register_hardware(self.hardware)
        TRIAL_MODES.get(self.mode)
        if self.serve_as is not None:
            check_serve_as(self.serve_as, "serve_as")
        names = [t.hardware for t in self.targets]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"targets must be distinct hardware names, got {names}")

    def objectives_for(self, target: Target) -> tuple[Objective, ...]:
        """Explicit objectives, else quality plus the workload's primary metric."""
        if self.objectives:
            return self.objectives
        return (Objective("quality", "maximize"), Objective.parse(PRIMARY_METRIC.get(target.workload, "tpot_ms")))

    def study_name(self, target: Target) -> str:
        return f"{self.name}.{target.hardware}"

    @property
    def seeds_baselines(self) -> bool:
        """Whether studies enqueue the baselines first: ``seed_baselines``, by default in weights mode."""
        return self.mode == "weights" if self.seed_baselines is None else self.seed_baselines

    @property
    def proxy_points(self) -> int:
        """Points the plan-mode proxy enqueues per target (:mod:`~autocompress_opt.search.study.proxy`):
        ``proxy``, by default :data:`PROXY_POINTS` in weights mode, 0 (no proxy) otherwise. With
        any, the proxy also screens the sampler's points."""
        if self.proxy is not None:
            return self.proxy
        return PROXY_POINTS if self.mode == "weights" else 0

    @property
    def scheduler_name(self) -> str:
        """The early-stopping scheduler: ``scheduler``, by default ``asha`` in weights mode with more
        than :data:`ASHA_MIN_TRIALS` trials, else ``none``."""
        if self.scheduler is not None:
            return self.scheduler
        return "asha" if self.mode == "weights" and self.trials > ASHA_MIN_TRIALS else "none"

    def serve_as_for(self, target: Target) -> str:
        """The engine whose rules ``target``'s trials keep (:mod:`~autocompress_opt.prune.loadability`):
        ``serve_as`` when given, else the target's own engine (``torch-eager``: ``transformers``; an
        engine without rules: ``any``)."""
        return self.serve_as or rules_engine_for(target.engine_name)

    @property
    def storage_url(self) -> str:
        return self.storage or default_storage(self.name)


def default_storage(name: str) -> str:
    """``sqlite:///studies/<name>.db`` (relative to the working directory; created on first use)."""
    return f"sqlite:///studies/{name}.db"


_SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def _is_journal(path: Path) -> bool:
    """Whether ``path``'s first line is an Optuna journal record (a JSON object with an int ``op_code``)."""
    with path.open("rb") as f:
        first = f.readline(1 << 20)
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("op_code"), int)


def resolve_storage(url: str) -> str:
    """The storage ``make_storage`` opens for ``url``: a URL with ``://`` as is; a bare path that
    does not exist → a new SQLite file (``sqlite:///`` + path); an existing SQLite database (by its
    16-byte header) → ``sqlite:///`` + path; an existing Optuna journal file (JSON lines with
    ``op_code`` records) → the path. Anything else (an empty file, a user's text file, a directory)
    is a ConfigError, and the file is not opened for writing."""
    valid = (
        "give an existing Optuna journal or SQLite file, a path that does not exist yet (a new SQLite file), "
        "or a URL such as sqlite:///studies/x.db"
    )
    if url.startswith("sqlite:///") and url.removeprefix("sqlite:///") not in ("", ":memory:"):
        path = Path(url.removeprefix("sqlite:///")).expanduser()
        # a user's file named in an sqlite URL: never write to it (an empty file is an empty database)
        if path.exists() and not (_is_sqlite(path) or (path.is_file() and path.stat().st_size == 0)):
            raise ConfigError(f"study storage {url!r}: {str(path)!r} is not a SQLite database; {valid}")
        _check_creatable(path, url)
        return url
    if "://" in url:
        return url
    path = Path(url).expanduser()
    if not path.exists():
        _check_creatable(path, url)
        return f"sqlite:///{path}"
    if not path.is_file():
        raise ConfigError(f"study storage {url!r} is not a file; {valid}")
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
        if head == _SQLITE_HEADER:
            return f"sqlite:///{path}"
        if head and _is_journal(path):
            return str(path)
    except OSError as exc:
        raise ConfigError(f"cannot read study storage {url!r}: {exc.strerror or exc}") from None
    kind = "an empty file" if not head else "neither an Optuna journal nor a SQLite database"
    raise ConfigError(f"study storage {url!r} is {kind}; not touching it: {valid}")


def _is_sqlite(path: Path) -> bool:
    """``path`` is an existing file that starts with SQLite's 16-byte header."""
    if not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            return f.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except OSError:
        return False


def _check_creatable(path: Path, url: str) -> None:
    """A ConfigError when ``path`` (not there yet) cannot be created: its nearest existing ancestor
    is a file, not a folder (e.g. ``notes.txt/x.db``)."""
    if path.exists():
        return
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"study storage {url!r} cannot be created: {str(existing)!r} is a file, not a folder")


def _heartbeat_settings() -> tuple[int, int]:
    """``(interval, grace)`` in seconds of the trial heartbeats: ``$AUTOCOMPRESS_HEARTBEAT_S``
    (default 10) and six times that; a RUNNING trial whose heartbeat is older than the grace period
    belongs to a driver that stopped (:func:`repair_orphans`)."""
    text = os.environ.get("AUTOCOMPRESS_HEARTBEAT_S", "10")
    try:
        interval = int(text)
    except ValueError:
        interval = 0
    if interval < 1:
        raise ConfigError(f"AUTOCOMPRESS_HEARTBEAT_S must be a positive integer (seconds), got {text!r}")
    return interval, 6 * interval


def _driver_url(url: str) -> str:
    """``postgresql://`` names SQLAlchemy's default PostgreSQL driver (psycopg 3 in SQLAlchemy
    2.1); with only psycopg2 installed (the ``dev`` extra) use it instead."""
    import importlib.util

    psycopg2_only = importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None
    if url.startswith("postgresql://") and psycopg2_only:
        return "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    return url


def make_storage(url: str, *, heartbeat: bool = False) -> Any:
    """An Optuna storage for ``url`` as :func:`resolve_storage` resolves it: an RDB URL
    (``sqlite://``, ``postgresql://``...) or an existing Optuna journal file. ``heartbeat``: an RDB
    storage records trial heartbeats (:func:`_heartbeat_settings`), as drivers running trials do.

    Drivers started at once on a new database race to create its tables; the loser retries."""
    import warnings

    import optuna

    url = resolve_storage(url)
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if "://" in url:
        kwargs: dict[str, Any] = {}
        if heartbeat:
            kwargs["heartbeat_interval"], kwargs["grace_period"] = _heartbeat_settings()
        for attempt in range(5):
            try:
                with warnings.catch_warnings():  # heartbeat_interval is an "experimental" argument
                    warnings.simplefilter("ignore")
                    return optuna.storages.RDBStorage(_driver_url(url), **kwargs)
            except Exception as exc:
                if attempt < 4 and _creation_race(exc):
                    time.sleep(0.2 + random.random() * 0.5)  # another driver is creating the tables
                    continue
                raise ConfigError(f"cannot open study storage {url!r}: {first_line(str(exc))}") from None
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(url))


def _creation_race(exc: Exception) -> bool:
    """Whether opening an RDB failed because another driver was creating its tables at that moment."""
    text = str(exc)
    return any(s in text for s in ("already exists", "UNIQUE constraint failed", "duplicate key", "UniqueViolation"))


# ---------------------------------------------------------------- coordination
def driver_identity() -> dict[str, Any]:
    """This driver process as trials record it (``driver`` user attribute)."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


class Coordination:
    """How the drivers of one study share it (several ``study run`` at once, on one host or many).

    * :meth:`lock`: a mutex over every driver of the study, held while a driver counts the COMPLETE
      and RUNNING trials and asks for a new one, so together they run exactly the trials needed:
      ``pg_advisory_lock`` on PostgreSQL, ``GET_LOCK`` on MySQL, an ``flock`` on a file beside a
      SQLite database or journal file (``<file>.driver-lock``; those storages are one host's).
      Released by the server or the kernel when a driver dies.
    * :meth:`beat`: while a trial runs, its driver records a heartbeat in the storage every
      ``interval`` seconds (Optuna's ``RDBStorage`` heartbeats; journal files have none).
    * :meth:`repair`: RUNNING trials whose driver stopped become FAIL and their points are
      re-queued (:func:`repair_orphans`).
    """

    def __init__(self, study: Any, url: str):
        from optuna.storages._heartbeat import is_heartbeat_enabled

        self.study = study
        self.driver = {**driver_identity(), "run": uuid.uuid4().hex[:12]}  # this run of this driver
        self.storage = study._storage
        self.heartbeats = is_heartbeat_enabled(self.storage)
        self.interval = float(self.storage.get_heartbeat_interval()) if self.heartbeats else 5.0
        self._lock = _driver_lock(self.storage, resolve_storage(url), study.study_name)
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
        self.storage.record_heartbeat(trial._trial_id)
        self.storage.set_trial_system_attr(trial._trial_id, "heartbeat", True)
        self._beating[trial._trial_id] = trial.number
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="autocompress-heartbeat", daemon=True)
            self._thread.start()

    def done(self, trial: Any) -> None:
        self._beating.pop(trial._trial_id, None)

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
        return repair_orphans(self.study, keep)


def _lock_file(storage: Any, url: str) -> Path | None:
    """The ``<file>.driver-lock`` the drivers of a SQLite database or journal file lock (``url`` as
    resolved); None for an in-memory SQLite and for a server (it locks in the server instead)."""
    from optuna.storages.journal import JournalStorage

    backend = getattr(storage, "_backend", storage)  # a study's storage is Optuna's cache around the RDB
    engine = getattr(backend, "engine", None)
    if engine is not None and engine.dialect.name == "sqlite":
        path = url.removeprefix("sqlite:///")
        if path in ("", ":memory:") or url.startswith("sqlite:///:memory:"):
            return None
        return Path(f"{Path(path).expanduser()}.driver-lock")
    if isinstance(backend, JournalStorage) and "://" not in url:  # a journal file
        return Path(f"{Path(url).expanduser()}.driver-lock")
    return None


def _driver_lock(storage: Any, url: str, study_name: str) -> Callable[[], Any]:
    """The :meth:`Coordination.lock` of a study in ``storage`` (``url`` as resolved)."""
    import hashlib

    local = threading.Lock()  # the drivers in this process (tests run several)
    backend = getattr(storage, "_backend", storage)  # a study's storage is Optuna's cache around the RDB
    engine = getattr(backend, "engine", None)
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
    lock_file = _lock_file(storage, url)
    if lock_file is None and dialect != "sqlite":  # an in-memory SQLite has one driver by construction
        _log.warning("%s: no lock shared between drivers; run one driver per study", dialect or type(backend).__name__)

    @contextmanager
    def file_lock() -> Iterator[None]:
        import fcntl

        with local:
            if lock_file is None:
                yield
                return
            with open(lock_file, "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    return file_lock


# --------------------------------------------------------------------- records
@dataclass(frozen=True)
class TrialRecord:
    """A finished or failed trial as stored, in plain values.

    ``quality`` is the objective stored as ``quality``; what it measures is ``quality_kind``
    (``retained_params``, ``retained_importance``, ``exp_neg_kl``, or a plugin's; see
    :data:`~autocompress_opt.search.study.trials.QUALITY_LABELS`). None for trials that did not complete.
    ``selection`` (weights mode): which inner-search candidate the trial returned and each one's
    held-out KL (:meth:`~autocompress_opt.search.inner.inner_search.InnerResult.choice`); ``baseline``:
    the baseline(s) a seeded trial's point comes from (e.g. ``"depth"``; :func:`seed_study`).
    ``stopped_early``: for a trial the scheduler stopped (state PRUNED), its last report
    (``phase``, ``inner_step``, ``inner_steps``, ``val_kl``, ``violation``, ``progress_score``);
    ``intermediate``: the held-out KL and violation it reported during its inner search, as
    ``[inner_step, val_kl, violation]`` rows (weights mode). ``proxy_infeasible``: the proxy's
    violations of a point it kept from running (PRUNED); ``proxy_rank``: the rank of a point the
    proxy enqueued (:mod:`~autocompress_opt.search.study.proxy`). ``timings_s`` (weights mode): where a
    completed trial's seconds went (``parent``: loading it, when this trial's process did;
    ``search``: the inner search; ``quality``: the held-out measurement(s); ``total``).
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

    def arch(self) -> Architecture | None:
        return Architecture.from_dict(self.architecture) if self.architecture else None


def _record(study_name: str, trial: Any) -> TrialRecord:
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
    )


def load_records(storage_url: str, study_name: str) -> tuple[list[TrialRecord], dict[str, Any]]:
    """All trials of a study as :class:`TrialRecord` plus the study's user attributes."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name, storage=make_storage(storage_url))
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(make_storage(storage_url))]
        raise ConfigError(
            f"no study {study_name!r} in {storage_url}{suggest(study_name, names)}; "
            f"studies there: {', '.join(names) or '(none)'}"
        ) from None
    return [_record(study_name, t) for t in study.get_trials(deepcopy=False)], dict(study.user_attrs)


def group_members(name: str, storage_url: str) -> list[str]:
    """The studies of group ``name`` (``name.<hardware>``), or the study ``name``, in the storage;
    a ConfigError naming the studies there when there is none (or no storage at all)."""
    import optuna

    url = resolve_storage(storage_url)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).expanduser().exists():
        raise ConfigError(f"no study storage at {storage_url}; run 'autocompress study list' to see studies")
    names = [s.study_name for s in optuna.get_all_study_summaries(make_storage(url))]
    chosen = [n for n in names if n == name or n.startswith(name + ".")]
    if not chosen:
        raise ConfigError(
            f"no study named {name!r} in {storage_url}{suggest(name, names)}; "
            f"studies there: {', '.join(names) or '(none)'}"
        )
    return chosen


def delete_studies(storage_url: str, names: Sequence[str]) -> None:
    """Delete the named studies (their trials included) from the storage."""
    import optuna

    storage = make_storage(storage_url)
    for name in names:
        optuna.delete_study(study_name=name, storage=storage)
    _remove_idle_driver_lock(storage, storage_url)


def _remove_idle_driver_lock(storage: Any, storage_url: str) -> None:
    """Remove the ``<file>.driver-lock`` of a SQLite or journal file that holds no study any more
    (no driver can be running on it); a storage that still holds studies keeps its lock file."""
    import optuna

    if optuna.get_all_study_names(storage=storage):
        return
    lock_file = _lock_file(storage, resolve_storage(storage_url))
    if lock_file is not None:
        lock_file.unlink(missing_ok=True)


def pareto_front(records: Sequence[TrialRecord], directions: Sequence[str]) -> list[TrialRecord]:
    """Feasible COMPLETE trials not dominated by another feasible one (``values`` vs ``directions``)."""
    pool = [r for r in records if r.feasible and r.values]
    sign = [1.0 if d == "maximize" else -1.0 for d in directions]

    def dominates(a: TrialRecord, b: TrialRecord) -> bool:
        better_eq = all(s * x >= s * y for s, x, y in zip(sign, a.values, b.values))  # type: ignore[arg-type]
        strictly = any(s * x > s * y for s, x, y in zip(sign, a.values, b.values))  # type: ignore[arg-type]
        return better_eq and strictly

    return [r for r in pool if not any(dominates(o, r) for o in pool if o is not r)]


# ----------------------------------------------------------------- the trainable
def _trainable(config: dict[str, Any]) -> dict[str, Any]:
    """The Ray Tune function trainable: runs one trial, never raises (errors become payload).

    While the trial runs, what it reports (:func:`~autocompress_opt.search.study.progress.report`: its
    phase, inner step, held-out KL, violation) goes to ``ray.tune.report``; a scheduler that stops
    the trial ends it inside that call (Ray's ``SystemExit``, deliberately not caught). The final
    result carries the last step and score too: Ray Tune wants the scheduler's metric in every result.
    ``config["stoppable"]`` False (a seeded baseline's point) is the scheduler's to honour
    (:func:`per_target_scheduler`: judged, and stopped only once it has reported its fallback,
    the baseline's own model measured, which the study then records)."""
    from ray import tune

    from autocompress_opt.search.study.progress import SCORE, STEP, TrialProgress, reporting

    last: list[TrialProgress] = []

    def forward(progress: TrialProgress) -> None:
        if progress.fallback is not None:  # a complete result in waiting: where it was computed, as a final one
            progress = replace(progress, fallback=json.dumps({**json.loads(progress.fallback), **trial_provenance()}))
        else:
            last[:] = [progress]
        tune.report(progress.to_result())

    def final(payload: dict[str, Any]) -> dict[str, Any]:
        step, score = (last[0].inner_step, last[0].score) if last else (0, float("inf"))
        return {STEP: step, SCORE: score, "payload": json.dumps(payload)}

    try:
        check_visible_paths(config["request"])  # a clear error when this node cannot see the model
        with reporting(forward):
            result = run_trial(config["request"])
        result.update(trial_provenance())  # which Ray node ran it, on which GPUs
        return final(result)
    except Exception as exc:
        return final({"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"})


# ------------------------------------------------------------------- repair
def repair_orphans(study: Any, keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Mark RUNNING trials whose driver stopped as FAIL and re-queue their parameters.

    A trial with a heartbeat (:class:`Coordination`) is orphaned when its heartbeat is older than
    the grace period, or when its driver ran on this host and that process is gone (no need to wait
    then); a live driver on another host sharing the RDB keeps its trials. A trial without a
    heartbeat (a journal file; older versions) is orphaned unless its driver is another live
    process on this host. Trials numbered in ``keep`` (the caller's own in flight) are left alone.
    Safe against other drivers repairing at once: a trial is failed and re-queued by one of them.
    Returns the repaired trial numbers."""
    import optuna
    from optuna.storages._heartbeat import is_heartbeat_enabled

    storage = study._storage
    stale = set(storage._get_stale_trial_ids(study._study_id)) if is_heartbeat_enabled(storage) else set()
    me = driver_identity()
    repaired = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if trial.number in keep:
            continue
        owner = trial.user_attrs.get("driver") or {}
        here = owner.get("host") == me["host"]
        other_live_here = here and owner.get("pid") != me["pid"] and _alive(owner.get("pid"))
        if trial.system_attrs.get("heartbeat"):
            orphaned = trial._trial_id in stale or (here and not other_live_here)
        else:
            orphaned = not other_live_here
        if not orphaned:
            continue
        try:
            storage.set_trial_user_attr(trial._trial_id, "error", "orphaned: its driver stopped; parameters re-queued")
            storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # finished meanwhile, or repaired by another driver
        if trial.params:
            study.enqueue_trial(dict(trial.params), user_attrs={"requeued_from": trial.number})
        repaired.append(trial.number)
    return repaired


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------ opening
def _identity(config: StudyConfig, target: Target, objectives: Sequence[Objective]) -> dict[str, Any]:
    return {
        "model": config.model,
        "mode": config.mode,
        "target": target.to_dict(),
        "space": config.space.to_dict(),
        "objectives": [str(o) for o in objectives],
        "inner": dict(config.inner),
        "importance": config.importance,
        # a user GPU's numbers (None for a built-in one): the same name with other numbers is another study
        "hardware_profile": next((dict(h) for h in config.hardware if h["name"] == target.hardware), None),
        "serve_as": config.serve_as_for(target),  # the engine whose loadable shapes the trials keep
    }


def check_config(config: StudyConfig, parent: Architecture) -> None:
    """Every option of a study group checked against ``parent`` without touching any storage: the
    search space fits the parent; each target's hardware, engine, engine options, workload and
    constraints (by costing the parent on it); the ``inner`` keys for the mode (``weights``: the
    :class:`~autocompress_opt.search.study.weights_trial.TrialConfig` keys and values; ``plan`` takes none;
    a plugin's mode checks its own); the ``importance`` record exists; the storage is one that
    :func:`resolve_storage` accepts (nothing is opened). Raises ConfigError."""
    resolve_storage(config.storage_url)
    config.space.check_parent(parent)
    if config.serve_as not in (None, SERVE_AS_ANY):
        problems = parent_problems(parent, config.serve_as)
        if problems:
            raise ConfigError(
                f"serve_as {config.serve_as}: no pruned model of {parent.name or parent.family} loads in "
                f"{config.serve_as} ({'; '.join(problems)}); use another engine or serve_as any"
            )
    for target in config.targets:
        config.objectives_for(target)
        parent_metrics(parent, target)
    if config.inner and config.mode == "plan":
        raise ConfigError(
            f"--inner {', '.join(f'{k}={v}' for k, v in config.inner.items())}: inner-search settings apply to "
            "--mode weights only; drop them or use --mode weights"
        )
    if config.mode == "weights":
        from autocompress_opt.search.study.weights_trial import TrialConfig  # torch: the weights mode needs it anyway

        TrialConfig.from_dict(config.inner, seed=config.seed)
    if config.importance and not Path(config.importance).exists():
        raise ConfigError(f"importance record {config.importance!r} does not exist")


def sampler_seed(seed: int, target: Target) -> int:
    """The seed of ``target``'s sampler in a study group run with ``seed``: ``seed`` mixed with the
    target's hardware and workload (stable: the same whatever the group's other targets or their order).

    One seed for every target would make every study draw the same random start-up points: measured
    in a four-target weights group (``bench_multifidelity.py`` at 15 minutes, seed 1), the 26 trials
    without early stopping were 7 distinct points, each run once per target, and 21 of the 87
    with it were repeats of another target's point. The inner search of a repeat is not shared (it
    follows the target's constraints), so each target explores its own points instead."""
    digest = hashlib.sha256(f"{int(seed)}:{target.hardware}:{target.workload}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def open_study(config: StudyConfig, target: Target, parent: Architecture) -> tuple[Any, dict[str, float]]:
    """Create the target's study, or load it and check it is the same study (directions included).

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
    cost = None if _study_exists(storage, name) else parent_metrics(parent, target)  # outside the lock
    with _driver_lock(storage, resolve_storage(config.storage_url), name)():
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
            added_later["serve_as"] = identity["serve_as"]  # a study from before the rules resumes under them
            diffs = [k for k in identity if old.get(k, added_later.get(k)) != identity[k]]
            if diffs:
                detail = "; ".join(f"{k}: stored {old.get(k)!r}, now {identity[k]!r}" for k in diffs)
                raise ConfigError(f"study {name!r} exists with different settings ({detail}). Use another --name.")
            return study, dict(study.user_attrs["parent_metrics"])
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
        return study, cost


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


def _study_exists(storage: Any, name: str) -> bool:
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


# ------------------------------------------------------------------- seeding
def baseline_seeds(
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    *,
    importance: Any = None,
    score: Any = None,
    layer_order: Sequence[int] | None = None,
) -> dict[str, dict[str, Any]]:
    """The study's seed point of each of :data:`SEEDED_BASELINES` for ``target``.

    Each baseline is chosen by :func:`~autocompress_opt.prune.baselines.make_baseline` under the
    target's exact constraint check (:func:`~autocompress_opt.prune.baselines.target_feasibility`),
    with ``importance`` (its layer orders) and ``score`` (``minitron``'s candidate score, lower is
    better; None ranks by parameters). Its point is snapped onto ``config.space``: each choice to the
    largest allowed value not above it (never a larger, costlier model), and the snapped point's
    architecture (:func:`uniform_allocation` in ``layer_order``) is checked again. Returns, per
    baseline, ``{"point", "baseline_point", "finding"}`` plus, when the point needed no snapping,
    ``"architecture"``: the baseline's own model (its layers kept by its own criterion), which the
    trial of that point weighs as a candidate (:func:`~.searcher.baseline_candidates`); or ``{"skipped": reason}``.
    """
    from autocompress_opt.prune.baselines import make_baseline, target_feasibility

    feasible = target_feasibility(target, parent)
    out: dict[str, dict[str, Any]] = {}
    for name in SEEDED_BASELINES:
        result = make_baseline(name, parent, feasible, importance=importance, score=score)
        if result.choice is None:
            out[name] = {"skipped": result.finding}
            continue
        wanted = result.choice.point
        point, why = _snap(wanted, config.space)
        if point is None:
            out[name] = {"skipped": f"{result.choice.label()} is outside the search space: {why}"}
        elif point != wanted and not feasible(uniform_allocation(point, parent, layer_order)):
            out[name] = {"skipped": f"{result.choice.label()} snapped onto the search space as {point} is infeasible"}
        else:
            out[name] = {"point": point, "baseline_point": wanted, "finding": result.finding}
            if point == wanted:  # the trial of this point also weighs the baseline's own model
                out[name]["architecture"] = result.choice.architecture.to_dict()
    return out


def _snap(point: Mapping[str, int], space: SearchSpace) -> tuple[dict[str, int] | None, str]:
    """Each choice to the largest value of ``space`` not above it; None and why when there is none."""
    snapped: dict[str, int] = {}
    for name in CHOICES:
        below = [v for v in space[name].values if v <= point[name]]
        if not below:
            return None, f"{name}={point[name]} is below the smallest allowed {min(space[name].values)}"
        snapped[name] = int(max(below))
    return snapped, ""


def seed_study(
    study: Any,
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    layer_order: Sequence[int] | None = None,
    scoring: Callable[[], tuple[Any, Any]] | None = None,
) -> list[str]:
    """Enqueue the baselines' points (:func:`baseline_seeds`) in ``study``; returns one line per baseline.

    The points are computed once per study and stored as its ``baseline_seeds`` attribute; later
    calls (a resumed study) read them from there. Each distinct point is enqueued with
    ``skip_if_exists`` (a point the study already holds, in any state, is not added again) and the
    user attribute ``baseline`` naming the baseline(s) it comes from. ``scoring`` returns the
    ``(importance, score)`` pair (default :func:`_seed_scoring`); a study group passes one shared
    by all its targets, so the parent is loaded and each candidate scored once per run.
    """
    seeds = study.user_attrs.get("baseline_seeds")
    if seeds is None:
        importance, score = (scoring or (lambda: _seed_scoring(config)))()
        seeds = baseline_seeds(config, target, parent, importance=importance, score=score, layer_order=layer_order)
        study.set_user_attr("baseline_seeds", seeds)
    by_point: dict[str, list[str]] = {}
    lines = []
    for name, seed in seeds.items():
        if "point" in seed:
            by_point.setdefault(json.dumps(seed["point"], sort_keys=True), []).append(name)
            snapped = "" if seed["point"] == seed["baseline_point"] else f" (snapped from {seed['baseline_point']})"
            lines.append(f"{name}: {seed['point']}{snapped}")
            if snapped:
                _log.warning("%s: baseline %s seeded as %s%s", config.study_name(target), name, seed["point"], snapped)
        else:
            lines.append(f"{name}: not seeded: {seed['skipped']}")
            _log.warning("%s: baseline %s not seeded: %s", config.study_name(target), name, seed["skipped"])
    for key, names in by_point.items():
        study.enqueue_trial(json.loads(key), user_attrs={"baseline": "+".join(names)}, skip_if_exists=True)
    return lines


def _seed_scoring(config: StudyConfig) -> tuple[Any, Any]:
    """``(importance, score)`` for :func:`baseline_seeds`: in weights mode the trials' own importance
    and the inner search's held-out KL on its held-out calibration rows (the parent is loaded here,
    then released); in plan mode the ``importance`` record if any, unscored; else neither."""
    if config.mode == "weights":
        from autocompress_opt.prune.baselines import masked_kl_scorer
        from autocompress_opt.search.study.weights_trial import TrialConfig, clear_trial_cache, parent_context

        trial = TrialConfig.from_dict(config.inner, seed=config.seed)
        context, _ = parent_context(config.model, trial, Path(driver_cache_dir(config.cache_dir)))
        rows = context.tokens[: trial.inner.val_samples]
        score = masked_kl_scorer(context.model, context.importance, rows) if rows.shape[0] else None
        clear_trial_cache()  # the scorer holds what it needs
        return context.importance, score
    if config.importance:
        from autocompress_opt.prune.importance import Importance

        return Importance.load(config.importance), None
    return None, None


# --------------------------------------------------------------------- runner
class _Progress:
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
            record = _record(study.study_name, trial)
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

    @property
    def completed_none(self) -> bool:
        """Trials were wanted and run, and none of them completed."""
        return self.complete == self.before and self.failed > 0


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


def _plugin_paths(plugins: Sequence[str]) -> list[str]:
    """Directories that make the plugin modules importable in Ray workers."""
    import importlib

    paths = []
    for name in plugins:
        module = importlib.import_module(name)
        top = Path(module.__file__ or "").resolve().parents[len(name.split(".")) - 1]
        paths.append(str(top))
    return paths


def _init_ray(address: str | None, concurrency: int | None, plugins: Sequence[str] = ()) -> None:
    """Connect to the Ray cluster at ``address`` (else at ``RAY_ADDRESS`` when set), or start a new
    local Ray with this machine's CPUs and GPUs (at least ``concurrency`` CPUs); nothing when Ray is
    already up. Without an address the local Ray is always a new one (``address="local"``): Ray's own
    default would attach to whatever cluster another process on this machine last started (its
    ``/tmp/ray/ray_current_cluster``), a test's two-node cluster included."""
    import logging

    import ray

    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no per-trial json/csv/tb files
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    extra = _plugin_paths(plugins)
    if extra:  # workers import plugins by name: put their directories on the workers' path
        path = os.pathsep.join(extra + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(address="local", num_cpus=max(concurrency or 1, os.cpu_count() or 1), **kwargs)


def _placement(config: StudyConfig, progress: bool = False) -> Placement:
    """GPUs and CPUs per trial and trials at once, from the connected cluster's nodes (not the
    driver's cores; :func:`~autocompress_opt.search.study.placement.plan_placement`). Plan trials take 1
    CPU; weights trials share each node's cores between the trials it holds (Ray sets
    OMP_NUM_THREADS, hence torch's threads, from this)."""
    placement = plan_placement(
        cluster_nodes(),
        mode=config.mode,
        device=str(config.inner.get("device", "auto")),
        gpus_per_trial=config.gpus_per_trial,
        concurrency=config.concurrency,
    )
    if progress and (placement.gpus_per_trial or config.address):
        print(f"placement: {placement.describe()}", file=sys.stderr, flush=True)
    return placement


def finished_trials(study: Any) -> tuple[int, int]:
    """``(complete, stopped)``: the study's COMPLETE trials and those the scheduler stopped early
    (:func:`~autocompress_opt.search.study.progress.is_stopped_early`); together, the trials evaluated,
    which ``StudyConfig.trials`` counts."""
    import optuna

    from autocompress_opt.search.study.progress import is_stopped_early

    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    return complete, sum(is_stopped_early(t) for t in trials)


def make_scheduler(config: StudyConfig, targets: int = 1) -> Any:
    """Ray Tune's trial scheduler for ``config.scheduler_name``: None for ``none``; for ``asha`` one
    ASHAScheduler per target (:func:`per_target_scheduler`; ``targets`` of them, the trials' config
    ``target_index`` choosing) over inner-search steps (:data:`~autocompress_opt.search.study.progress.STEP`)
    on the constraint-aware score (:data:`~autocompress_opt.search.study.progress.SCORE`, lower is better):
    a trial is only ever compared with trials of its own target, whose constraints it shares.

    Rungs at an eighth and at three eighths of the inner search's steps (3 and 9 of 24; where the
    trials measure their held-out KL, ``InnerConfig.measure_every``), reduction factor 3: at each
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
    from autocompress_opt.search.study.weights_trial import TrialConfig

    steps = TrialConfig.from_dict(config.inner, seed=config.seed).inner.steps
    grace = max(1, steps // 8)

    def asha() -> Any:
        return ASHAScheduler(
            time_attr=STEP,
            metric=SCORE,
            mode="min",
            grace_period=grace,
            max_t=max(grace, steps // 2),
            reduction_factor=3,
            stop_last_trials=False,
        )

    return per_target_scheduler([asha() for _ in range(targets)])


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


class StudyInterrupted(Exception):
    """Ctrl-C stopped :func:`run_study`: COMPLETE trials are kept, the trials it stopped were told
    FAIL and their points re-queued (the message names them); running the same command resumes."""


@dataclass
class _Interrupt:
    """What the SIGINT handler knows: whether Ctrl-C came, and how to stop the Ray Tune run in progress."""

    interrupted: bool = False
    stop: Callable[[], None] | None = None  # set while Ray Tune runs


@contextmanager
def _sigint(state: _Interrupt) -> Iterator[None]:
    """Ctrl-C handling for :func:`run_study` (main thread only; elsewhere Ray Tune's own applies).

    First SIGINT: a note on stderr, then, while Ray Tune runs, its own stop (no new trials; its loop
    ends and its trials are stopped), else KeyboardInterrupt. Second SIGINT: exit 130 at once (a
    RUNNING trial may be left; the next run repairs it). Ray Tune's SIGINT handler is disabled so the
    whole run stops, not only the current target's Tune run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if state.interrupted:
            os.write(2, b"\ninterrupted again: quitting now; rerun the same command to resume\n")
            os._exit(130)
        state.interrupted = True
        os.write(2, b"\ninterrupting: stopping the running trials (Ctrl-C again to quit at once)\n")
        if state.stop is None:
            raise KeyboardInterrupt
        state.stop()

    previous = signal.getsignal(signal.SIGINT)
    old_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if old_env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = old_env


def _fit(tuner: Any, searcher: Any, state: _Interrupt) -> None:
    """``tuner.fit()`` that Ctrl-C stops: the searcher asks for nothing more and Ray Tune's own stop
    (its SIGUSR1 handler, installed by ``fit``) ends its loop and stops the running trials; trials
    still in flight afterwards are told FAIL and re-queued (:meth:`StudySearcher.release`)."""
    from autocompress_opt.search.study.searcher import INTERRUPTED

    usr1 = signal.getsignal(signal.SIGUSR1)
    tune_logger = logging.getLogger("ray.tune")
    level = tune_logger.level

    def stop() -> None:
        searcher.stop()
        ray_stop = signal.getsignal(signal.SIGUSR1)
        if callable(ray_stop) and ray_stop is not usr1:  # Ray Tune's, once fit() has installed it
            tune_logger.setLevel(logging.CRITICAL)  # not its "resume with Tuner.restore(...)" advice
            ray_stop(signal.SIGUSR1, None)

    state.stop = stop
    try:
        tuner.fit()
    finally:
        state.stop = None
        tune_logger.setLevel(level)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, usr1)
        if state.interrupted:
            searcher.release(INTERRUPTED)
    if state.interrupted:
        raise KeyboardInterrupt


def run_study(
    config: StudyConfig, *, progress: bool = True, layer_order: Sequence[int] | None = None
) -> list[TargetOutcome]:
    """Run (or continue) every target's study to ``config.trials`` COMPLETE trials.

    Ctrl-C (in the main thread) stops the whole run: raises :class:`StudyInterrupted` with no
    RUNNING trial left behind (:func:`_sigint`)."""
    state = _Interrupt()
    interrupted: list[str] = []
    with _sigint(state):
        try:
            return _run_targets(config, progress, layer_order, state, interrupted)
        except KeyboardInterrupt:
            raise StudyInterrupted("; ".join(interrupted) or "no trial was running") from None


def _run_targets(
    config: StudyConfig,
    progress: bool,
    layer_order: Sequence[int] | None,
    state: _Interrupt,
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
    _init_ray(config.address, config.concurrency, config.plugins)
    placement = _placement(config, progress)  # checked against the cluster before any study is created
    deadline = time.monotonic() + 60 * config.time_budget if config.time_budget else None
    shared_scoring: list[tuple[Any, Any]] = []  # (importance, score) for seeds and proxy: built once, for all targets

    def scoring() -> tuple[Any, Any]:
        if not shared_scoring:
            shared_scoring.append(_seed_scoring(config))
        return shared_scoring[0]

    runs = [
        _prepare_target(config, target, parent, layer_order, scoring, progress, index, deadline)
        for index, target in enumerate(config.targets)
    ]
    try:
        _run_group(config, [r for r in runs if r.searcher is not None], placement, state, interrupted)
    finally:
        for run in runs:
            run.coordination.close()
            run.bar.close()
    return [_outcome(run) for run in runs]


@dataclass
class _TargetRun:
    """One target of a group run: its study and what its trials need and report to."""

    config: StudyConfig
    study: Any
    coordination: Coordination
    repaired: list[int]
    seeded: list[str]
    complete_before: int
    bar: _Progress
    searcher: Any  # StudySearcher, None when the study already holds its trials


def _prepare_target(
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    layer_order: Sequence[int] | None,
    scoring: Callable[[], tuple[Any, Any]],
    progress: bool,
    position: int,
    deadline: float | None,
) -> _TargetRun:
    """Open ``target``'s study, repair a stopped driver's trials, enqueue the seeds and the proxy's
    points, and make its searcher (none when the study is already done)."""
    study, parent_cost = open_study(config, target, parent)
    coordination = Coordination(study, config.storage_url)
    with coordination.lock():
        repaired = coordination.repair()
    objectives = config.objectives_for(target)
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
        "hardware": [dict(h) for h in config.hardware],  # user GPUs, registered in each trial's worker
        "serve_as": config.serve_as_for(target),  # trials keep shapes this engine loads
        # absolute: Ray Tune runs each trial in its own (scratch) working directory
        "cache_dir": driver_cache_dir(config.cache_dir),
    }
    complete_before, stopped_before = finished_trials(study)
    done = complete_before + stopped_before  # trials evaluated: COMPLETE or stopped early
    if progress and config.seeds_baselines and done < config.trials and "baseline_seeds" not in study.user_attrs:
        # Say what the silent minutes are: in weights mode the first target loads the parent and
        # scores the Minitron and best-uniform candidates (shared by the later targets).
        print(
            f"{config.study_name(target)}: choosing the {', '.join(SEEDED_BASELINES)} baselines to seed the study",
            file=sys.stderr,
            flush=True,
        )
    seeded = (
        seed_study(study, config, target, parent, layer_order, scoring)
        if config.seeds_baselines and done < config.trials
        else []
    )
    proxy = None
    if config.proxy_points and done < config.trials:
        proxy = _make_proxy(config, target, parent, parent_cost, layer_order, scoring)
        seeded += enqueue_proxy_points(study, proxy, config.proxy_points, config.seed)
    bar = _Progress(config.study_name(target), config.trials, min(done, config.trials), progress, position)
    bar.count_existing(study)
    searcher = None
    if done < config.trials:
        from autocompress_opt.search.study.searcher import StudySearcher  # needs Ray Tune and Optuna

        searcher = StudySearcher(
            study,
            distributions=config.space.distributions(),
            request=request,
            target=target,
            parent_cost=parent_cost,
            objectives=[o.metric for o in objectives],
            trials=config.trials,
            max_failures=config.max_failures if config.max_failures is not None else config.trials,
            progress=bar,
            coordination=coordination,
            early_stopping=config.scheduler_name != "none",
            proxy=proxy,
            deadline=deadline,
        )
    return _TargetRun(config, study, coordination, repaired, seeded, complete_before, bar, searcher)


def _make_proxy(
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    parent_cost: Mapping[str, float],
    layer_order: Sequence[int] | None,
    scoring: Callable[[], tuple[Any, Any]],
) -> Any:
    """The target's plan-mode proxy (:class:`~autocompress_opt.search.study.proxy.Proxy`) with the
    parent's importance (from ``scoring``, shared with the seeds)."""
    from autocompress_opt.search.study.proxy import Proxy

    importance, _ = scoring()
    return Proxy(
        parent,
        config.space,
        target,
        parent_cost,
        serve_as=config.serve_as_for(target),
        importance=importance,
        layer_order=layer_order,
    )


def enqueue_proxy_points(study: Any, proxy: Any, k: int, seed: int = 0) -> list[str]:
    """Enqueue the proxy's ``k`` best points (:meth:`~autocompress_opt.search.study.proxy.Proxy.rank`) in
    ``study`` once: the ranking is stored as the study's ``proxy_points`` attribute, and a resumed
    study reads it from there; each point is enqueued with ``skip_if_exists`` and the attribute
    ``proxy_rank``. Returns one line per point."""
    from autocompress_opt.search.study.proxy import PROXY_RANK_ATTR

    ranked = study.user_attrs.get("proxy_points")
    if ranked is None:
        ranked = [{"point": s.point, "quality": s.quality} for s in proxy.rank(k, seed=seed)]
        study.set_user_attr("proxy_points", ranked)
    lines = []
    for rank, item in enumerate(ranked, 1):
        study.enqueue_trial(item["point"], user_attrs={PROXY_RANK_ATTR: rank}, skip_if_exists=True)
        lines.append(f"proxy #{rank}: {item['point']} (proxy quality {item['quality']:.3f})")
    return lines


def _run_group(
    config: StudyConfig,
    runs: Sequence[_TargetRun],
    placement: Placement,
    state: _Interrupt,
    interrupted: list[str],
) -> None:
    """One Ray Tune run for the targets that still need trials (:class:`~.searcher.GroupSearcher`):
    the trial actors, each holding the parent once, serve every target (``reuse_actors``)."""
    if not runs:
        return
    import optuna
    from ray import tune

    from autocompress_opt.search.study.searcher import INTERRUPTED, GroupSearcher  # needs Ray Tune and Optuna

    searcher = GroupSearcher([run.searcher for run in runs])
    scratch = tempfile.mkdtemp(prefix="autocompress-tune-")
    try:
        tuner = tune.Tuner(
            tune.with_resources(_trainable, placement.resources()),
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
        _fit(tuner, searcher, state)
    except KeyboardInterrupt:
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
        shutil.rmtree(scratch, ignore_errors=True)


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
    records = [_record(study.study_name, t) for t in complete]
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
    )


def best_feasible(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The feasible COMPLETE record of highest ``quality`` (the lowest number on a tie); None when
    there is none."""
    feasible = [r for r in records if r.feasible and r.quality is not None]
    return max(feasible, key=lambda r: (r.quality, -r.number)) if feasible else None


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
