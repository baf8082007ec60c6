"""One on-disk cache scheme for every computed artefact (importance scores, teacher targets,
held-out quality, the benchmarks' stages).

Three parts, each usable alone:

* **Keys** — :func:`cache_key` hashes the caller's inputs together with the version of the code
  that computes the entry (a per-cache string the caller bumps when its computation changes) and
  the package version, so changed code never reads a stale entry: it computes a new one under a new
  key. :func:`content_digest` identifies files by their bytes (not their path or modification
  time), so two copies of one model on two nodes share their entries; :func:`file_digest` hashes
  each file once per version of it (remembered on disk, see its contract), not once per process.
* **Atomic publication** — :func:`publish` lets a writer fill a uniquely named temporary file or
  directory beside the entry and then renames it into place (``os.replace``, atomic within one
  file system): a reader sees the whole entry or none, and a writer that raises leaves nothing a
  reader would take (its temporary is removed; one left by a killed process is swept by the next
  writer of that entry on its host).
* **One computation per entry** — :func:`fetch` takes an exclusive lock (:func:`file_lock`) on a
  lock file beside the entry before computing, so concurrent writers on one node (Ray trials sharing
  a cache folder) compute once: the second waits for the first and then reads its entry. The lock is
  an ``fcntl.flock``, advisory; on a network file system it may not exclude writers on other nodes,
  which then compute twice but still publish atomically (the last rename wins; the entries are
  equal). Where ``flock`` is refused (Lustre or NFS mounted without locks: ENOSYS, EOPNOTSUPP,
  ENOLCK) the lock is a file created exclusively (``O_CREAT | O_EXCL``) naming its holder's host
  and process, kept fresh by its holder and taken over once its holder is gone; one warning per
  process says so.
* **Temporaries have owners** — a temporary's name carries its writer's host and process id; the
  sweep of a killed writer's leftovers removes only those of this host whose process is gone, never
  another node's in a shared folder (its writer may still be writing).

Stdlib only (this module sits in the package's bottom layer). Linux/macOS: ``fcntl`` is POSIX.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import shutil
import socket
import stat
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "DIGEST_CACHE_ENV",
    "cache_key",
    "content_digest",
    "digest_cache_dir",
    "entry_lock",
    "fetch",
    "file_digest",
    "file_lock",
    "process_alive",
    "publish",
]

T = TypeVar("T")

_CHUNK_BYTES = 8 << 20  # read size while hashing a file: large enough to stay near hashlib's throughput
_TMP, _OLD = ".tmp-", ".old-"  # markers in the hidden names of temporaries and of entries being replaced


# ------------------------------------------------------------------------------ keys
def cache_key(version: str, *parts: Any, length: int = 24) -> str:
    """A hex key of ``parts`` computed by code at ``version``: the first ``length`` hex digits of
    the SHA-256 of ``[package version, version, *parts]`` as canonical JSON (sorted keys; values
    JSON does not know are written with ``str``).

    ``version`` names the cache and its computation (``"importance/2"``); bump it whenever the
    computation changes, and old entries are no longer read (they are recomputed under the new key).
    Pure and deterministic across processes and machines for equal ``parts``.
    """
    if not version:
        raise ValueError("cache_key needs a non-empty version string, e.g. 'importance/2'")
    payload = json.dumps([_package_version(), version, *parts], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:length]


def _package_version() -> str:
    """``autocompress_opt.__version__``. Read from the already imported parent package: an
    ``import autocompress_opt`` here would make import-linter see the root's lazily exported API
    (its TYPE_CHECKING imports of every layer) as imports of this bottom-layer module."""
    return str(sys.modules[__name__.rpartition(".")[0]].__version__)


# Where file_digest remembers digests across processes: beside the package's other per-user caches
# (~/.cache/autocompress_opt/data, .../tokens, .../profiles), never beside the hashed files (a model
# folder may be read-only or shared, and a digest file in it would change that folder's content_digest).
# The environment variable moves it for a process and every process it starts (Ray workers).
DIGEST_CACHE_ENV = "AUTOCOMPRESS_DIGEST_CACHE"
_DEFAULT_DIGEST_CACHE = "~/.cache/autocompress_opt/digests"
# A file written (modification or status-change time) this shortly before its hashing began is not
# remembered: file systems stamp both times from a coarse clock (a kernel tick, up to 2 s on FAT), so a
# second write of the same size within one tick would keep the stamps and the remembered digest would
# be stale (git's "racy clean" problem, solved the same way).
_RACY_NS = 2_000_000_000
_DIGEST_ENTRY_VERSION = "file-digest/1"

# (resolved path, size, mtime_ns, ctime_ns, inode): what identifies one version of a file. Any write
# changes the ctime (which no user call can set back), a replacement the inode too.
_StatKey = tuple[str, int, int, int, int]
# _StatKey -> SHA-256 of the file's bytes, for this process.
_FILE_DIGESTS: dict[_StatKey, str] = {}


def content_digest(path: str | Path, suffixes: Iterable[str] | None = None, *, recursive: bool = True) -> str:
    """The SHA-256 (hex) of what ``path`` holds: a file's bytes, or for a directory the names
    (relative to it), sizes and byte digests of its files in sorted order, in its subfolders too
    unless ``recursive`` is false; ``suffixes`` (e.g. ``(".json", ".safetensors")``) keeps only the
    files whose names end in one.

    Independent of where the files live and of their modification times: copies of one model in
    two places have one digest. Each file is read only when :func:`file_digest` has not seen that
    version of it, in this process or an earlier one. Raises ``FileNotFoundError`` for a missing ``path``.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"content_digest: no file or directory at {str(root)!r}")
    if root.is_file():
        return file_digest(root)
    keep = tuple(suffixes) if suffixes is not None else None
    candidates = root.rglob("*") if recursive else root.iterdir()
    files = sorted(p for p in candidates if p.is_file() and (keep is None or p.name.endswith(keep)))
    digest = hashlib.sha256()
    for f in files:
        record = [f.relative_to(root).as_posix(), f.stat().st_size, file_digest(f)]
        digest.update(json.dumps(record).encode())
    return digest.hexdigest()


def file_digest(path: str | Path) -> str:
    """The SHA-256 (hex) of the bytes of the file at ``path`` (a symlink: of its target).

    Each version of a file is read once: the digest is remembered in this process and on disk under
    :func:`digest_cache_dir`, keyed by the file's resolved absolute path, size, modification and
    status-change times (ns) and inode, so a later call — here, in another process, after a restart
    — returns it from a ~100-byte entry without opening the file. Any write to the file changes
    that key, so a modified, replaced or touched file is hashed again; so is a file written less
    than 2 s before its hashing began (coarse file-system clocks), or one that changed while it was
    read, whose digest is not remembered. Never fails because of the store: an unreadable or
    unwritable location, or a damaged entry, only means hashing. Thread- and process-safe (entries
    are published whole; writers of one key write the same digest). Raises ``FileNotFoundError``
    for a missing path and ``IsADirectoryError`` for a directory (:func:`content_digest` hashes those).
    """
    started_ns = time.time_ns()
    key = _stat_key(Path(path))
    if key in _FILE_DIGESTS:
        return _FILE_DIGESTS[key]
    stored = _stored_digest(key)
    if stored is not None:
        _FILE_DIGESTS[key] = stored
        return stored
    digest = hashlib.sha256()
    with open(key[0], "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    hex_digest = digest.hexdigest()
    settled = max(key[2], key[3]) < started_ns - _RACY_NS  # neither time stamped in the last ticks
    if settled and _stat_key(Path(key[0])) == key:  # and unchanged while read
        _FILE_DIGESTS[key] = hex_digest
        _store_digest(key, hex_digest)
    return hex_digest


def digest_cache_dir() -> Path:
    """Where :func:`file_digest` keeps its entries: ``$AUTOCOMPRESS_DIGEST_CACHE``, else
    ``~/.cache/autocompress_opt/digests`` (read at each call; created when first written)."""
    return Path(os.environ.get(DIGEST_CACHE_ENV) or _DEFAULT_DIGEST_CACHE).expanduser()


def _stat_key(path: Path) -> _StatKey:
    resolved = path.resolve()
    try:
        st = resolved.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"file_digest: no file at {str(path)!r}") from None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"file_digest: {str(path)!r} is a directory; content_digest hashes a folder")
    return (str(resolved), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _digest_entry(key: _StatKey) -> Path:
    return digest_cache_dir() / f"{cache_key(_DIGEST_ENTRY_VERSION, *key, length=32)}.json"


def _stored_digest(key: _StatKey) -> str | None:
    """The digest an earlier call stored for ``key``, or None (no entry, unreadable, or not this key's)."""
    try:
        record = json.loads(_digest_entry(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, damaged (ValueError: bad JSON or text)
        return None
    if not isinstance(record, dict) or record.get("key") != list(key):
        return None
    digest = record.get("sha256")
    valid = isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    return digest if valid else None


def _store_digest(key: _StatKey, digest: str) -> None:
    """Publish ``digest`` for ``key``; a location that cannot be written is skipped (the next process hashes)."""
    text = json.dumps({"key": list(key), "sha256": digest})
    with contextlib.suppress(OSError):
        publish(_digest_entry(key), lambda tmp: tmp.write_text(text, encoding="utf-8"))


# ------------------------------------------------------------------- lock and publication
# What flock raises on a file system that does not lock: ENOSYS (Lustre mounted without -o flock),
# EOPNOTSUPP/ENOTSUP (some FUSE and network file systems), ENOLCK (NFS without a lock daemon, `nolock`).
_NO_FLOCK = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK})
_HELD = ".held"  # suffix of the lock file held by creation where flock is refused
# The holder of a created lock rewrites its time every _HEARTBEAT_S; a waiter that sees it unchanged
# for _STALE_S (by its own clock: hosts' clocks may differ) takes the lock over. A holder on this
# host whose process is gone is taken over at once.
_HEARTBEAT_S, _STALE_S = 10.0, 120.0
_POLL_S = (0.02, 0.5)  # a waiter's first and longest pause between tries
_warned = threading.Event()  # the fallback's warning, once per process


def _host() -> str:
    """This host's name as it appears in lock and temporary file names (no path separator or '-')."""
    return "".join(c if c.isalnum() or c in "._" else "_" for c in socket.gethostname()) or "localhost"


def process_alive(pid: object) -> bool:
    """Whether process ``pid`` exists on this host (one of another user counts as alive; anything but
    an int is no process)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created, with its folder, if missing).

    An ``fcntl.flock`` where the file system has one: released by the kernel when the process dies.
    Where ``flock`` is refused (:data:`_NO_FLOCK`: Lustre, NFS without locks) a lock file
    ``<path>.held`` is created exclusively instead, holding ``host pid token``; its holder refreshes
    it every 10 s and removes it on release, and a waiter takes it over when its holder is a dead
    process of this host or it has not changed for 2 minutes (a holder on another host that died).
    A ``RuntimeWarning`` says so once per process. Blocks until the lock is held; threads exclude
    each other too. Not re-entrant. The file at ``path`` stays.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
            refused = exc
        else:
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
            return
    _warn_no_flock(path, refused)
    with _created_lock(path.with_name(path.name + _HELD)):
        yield


def _warn_no_flock(path: Path, exc: OSError) -> None:
    if not _warned.is_set():
        _warned.set()
        warnings.warn(
            f"the file system of {str(path.parent)!r} refuses flock ({errno.errorcode.get(exc.errno or 0, exc.errno)}: "
            f"{exc.strerror}); autocompress_opt locks its caches and studies there with lock files "
            f"(<name>{_HELD}, naming host and process) instead. Mount it with locks (Lustre: -o flock; NFS: "
            "with lockd) for kernel locks, which a killed process releases at once",
            RuntimeWarning,
            stacklevel=4,
        )


@contextlib.contextmanager
def _created_lock(held: Path) -> Iterator[None]:
    """Hold the lock file ``held``, created exclusively (see :func:`file_lock`)."""
    mine = f"{_host()} {os.getpid()} {uuid.uuid4().hex}"
    _acquire_created(held, mine)
    stop = threading.Event()
    beat = threading.Thread(target=_keep_fresh, args=(held, mine, stop), name="autocompress-lock", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        if _holder(held) == mine:
            held.unlink(missing_ok=True)


def _acquire_created(held: Path, mine: str) -> None:
    pause, seen, since = _POLL_S[0], None, time.monotonic()
    while True:
        try:
            fd = os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as out:
                out.write(mine)
            return
        holder, state = _holder(held), _lock_state(held)
        if (holder, state) != seen:  # a new holder, or the holder's heartbeat: wait afresh
            seen, since = (holder, state), time.monotonic()
        if holder is not None and (_dead_here(holder) or time.monotonic() - since > _STALE_S):
            _take_over(held, holder)
            continue
        time.sleep(pause)
        pause = min(pause * 2, _POLL_S[1])


def _holder(held: Path) -> str | None:
    with contextlib.suppress(OSError):
        return held.read_text(encoding="utf-8").strip() or None
    return None


def _lock_state(held: Path) -> int | None:
    with contextlib.suppress(OSError):
        return held.stat().st_mtime_ns
    return None


def _dead_here(holder: str) -> bool:
    host, _, rest = holder.partition(" ")
    pid = rest.partition(" ")[0]
    return host == _host() and pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid))


def _take_over(held: Path, holder: str) -> None:
    """Remove the stale lock file of ``holder``: renamed aside first, so that of two waiters taking
    it over at once only one removes it; a fresh holder's file renamed by mistake is put back."""
    aside = held.with_name(f"{held.name}.stale-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(held, aside)
    except FileNotFoundError:
        return
    if _holder(aside) != holder:  # another waiter took it over and a new holder created it meanwhile
        with contextlib.suppress(OSError):
            os.link(aside, held)  # back, unless yet another holder exists by now
    aside.unlink(missing_ok=True)


def _keep_fresh(held: Path, mine: str, stop: threading.Event) -> None:
    while not stop.wait(_HEARTBEAT_S):
        if _holder(held) != mine:
            return
        with contextlib.suppress(OSError):
            os.utime(held)


@contextlib.contextmanager
def entry_lock(entry: str | Path) -> Iterator[None]:
    """Hold an exclusive lock (:func:`file_lock`) on ``.<name>.lock`` beside ``entry`` (the folder is created).

    Blocks until no other holder is left, in this or another process (each call opens its own file
    description, so threads exclude each other too). Not re-entrant: taking the lock of an entry
    while holding it deadlocks. The lock file stays (removing it would race with a waiter).
    """
    entry = Path(entry)
    with file_lock(entry.parent / f".{entry.name}.lock"):
        yield


def _owned_name(entry: Path, marker: str) -> Path:
    """A fresh hidden name beside ``entry``: ``.<name><marker><host>-<pid>-<random>``."""
    return entry.parent / f".{entry.name}{marker}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _leftover_of_dead_writer(name: str) -> bool:
    """Whether a temporary named by :func:`_owned_name` was left by a process of this host that is gone
    (one of another host, of a live process, or named otherwise is never swept here)."""
    host_pid, _, token = name.rpartition("-")
    host, _, pid = host_pid.rpartition("-")
    if not (host and pid.isdigit() and token):
        return False
    return host == _host() and int(pid) != os.getpid() and not process_alive(int(pid))


def publish(entry: str | Path, write: Callable[[Path], object]) -> Path:
    """Make ``entry`` appear whole: ``write(tmp)`` creates a file or a directory at ``tmp`` (a
    fresh hidden name in ``entry``'s folder, nothing there yet; its return value is ignored), which
    is then renamed to ``entry``; returns ``entry``.

    An existing ``entry`` is replaced (a file atomically; a directory is first renamed aside and then
    removed, so a concurrent reader of the old directory may fail, never read a mix). If ``write``
    raises, the temporary is removed and the exception propagates; ``entry`` is untouched. Call it
    under :func:`entry_lock` when several writers may publish one entry.
    """
    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = _owned_name(entry, _TMP)
    try:
        write(tmp)
        if not tmp.exists():
            raise FileNotFoundError(f"the cache writer of {str(entry)!r} created nothing at {str(tmp)!r}")
        _replace(tmp, entry)
    finally:
        _remove(tmp)
    return entry


def _replace(new: Path, entry: Path) -> None:
    """Rename ``new`` to ``entry``; ``os.replace`` cannot replace a non-empty directory, so an
    existing directory (or a file where ``new`` is a directory) is renamed aside first."""
    if (entry.is_dir() and not entry.is_symlink()) or (new.is_dir() and entry.exists()):
        old = _owned_name(entry, _OLD)
        os.replace(entry, old)
        os.replace(new, entry)
        _remove(old)
    else:
        os.replace(new, entry)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _sweep(entry: Path) -> None:
    """Remove temporaries of ``entry`` left by writers of this host that died mid-write (called
    under its lock). Another host's temporaries in a shared folder are left alone: that host's
    lock may not exclude this one, so their writer may still be writing."""
    pattern = glob.escape(f".{entry.name}")
    for marker in (_TMP, _OLD):
        for leftover in entry.parent.glob(f"{pattern}{marker}*"):
            if _leftover_of_dead_writer(leftover.name[len(f".{entry.name}{marker}") :]):
                _remove(leftover)


# --------------------------------------------------------------------------------- fetch
def fetch(
    entry: str | Path,
    compute: Callable[[], T],
    write: Callable[[T, Path], object],
    read: Callable[[Path], T | None],
) -> tuple[T, bool]:
    """The value cached at ``entry``, computed and published once; returns ``(value, was_cached)``.

    ``read(entry)`` loads an existing entry, or returns None for one that must not be used (made
    under another key, where the entry's name is not itself the key); ``compute()`` makes the
    value; ``write(value, tmp)`` serialises it to a file or a directory at ``tmp``
    (:func:`publish`). An entry is read without the lock (it is only ever replaced whole); on a
    miss the lock is taken (:func:`entry_lock`), the entry checked again — a writer that waited
    reads the entry its predecessor published — and only then computed and published. Whatever
    ``compute``, ``write`` or ``read`` raise propagates, after the lock is released and the
    temporary removed.
    """
    entry = Path(entry)
    if entry.exists():
        value = read(entry)
        if value is not None:
            return value, True
    with entry_lock(entry):
        if entry.exists():
            value = read(entry)
            if value is not None:
                return value, True
        _sweep(entry)
        value = compute()
        publish(entry, lambda tmp: write(value, tmp))
    return value, False
