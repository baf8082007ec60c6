"""Where a study group's trials are stored: resolving what the user named (a URL, a new or an
existing SQLite file, an Optuna journal file) without ever writing to a file that is not a study
storage, opening it (the trial heartbeats of an RDB storage), and reading or deleting the studies
in it.

Every function here takes and returns Optuna's public storage classes (``RDBStorage``,
``JournalStorage``): not the cache Optuna wraps around them inside a study.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError, suggest
from autocompress_opt.search.study.records import TrialRecord, first_line, trial_record

__all__ = [
    "default_storage",
    "delete_studies",
    "driver_lock_file",
    "group_members",
    "load_records",
    "make_storage",
    "resolve_storage",
    "study_exists",
]


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
    belongs to a driver that stopped (:func:`~.coordination.repair_orphans`)."""
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


def driver_lock_file(storage: Any, url: str) -> Path | None:
    """The ``<file>.driver-lock`` the drivers of a SQLite database or journal file lock (``storage``
    as :func:`make_storage` opened ``url``, ``url`` as resolved); None for an in-memory SQLite and
    for a server (it locks in the server instead)."""
    from optuna.storages.journal import JournalStorage

    engine = getattr(storage, "engine", None)  # RDBStorage's SQLAlchemy engine
    if engine is not None and engine.dialect.name == "sqlite":
        path = url.removeprefix("sqlite:///")
        if path in ("", ":memory:") or url.startswith("sqlite:///:memory:"):
            return None
        return Path(f"{Path(path).expanduser()}.driver-lock")
    if isinstance(storage, JournalStorage) and "://" not in url:  # a journal file
        return Path(f"{Path(url).expanduser()}.driver-lock")
    return None


def study_exists(storage: Any, name: str) -> bool:
    """Whether ``storage`` holds a study named ``name``."""
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


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
    return [trial_record(study_name, t) for t in study.get_trials(deepcopy=False)], dict(study.user_attrs)


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
    lock_file = driver_lock_file(storage, resolve_storage(storage_url))
    if lock_file is not None:
        lock_file.unlink(missing_ok=True)
