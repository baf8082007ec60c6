"""The one disk-cache scheme (autocompress_opt.cache): keys follow the code version and the content,
an entry appears whole or not at all, and two writers of one entry compute it once."""

from __future__ import annotations

import errno
import hashlib
import itertools
import multiprocessing
import multiprocessing.queues
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import autocompress_opt
from autocompress_opt import cache
from autocompress_opt.cache import cache_key, content_digest, fetch, file_digest, publish


def _visible(folder: Path) -> list[str]:
    """What a reader could mistake for an entry: every name except the lock files."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def _write_bytes(value: bytes, tmp: Path) -> None:
    tmp.write_bytes(value)


def _read_bytes(path: Path) -> bytes:
    return path.read_bytes()


# ------------------------------------------------------------------------------ keys
def test_key_changes_with_the_code_version_the_package_version_and_the_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = ("model", {"b": 1, "a": [1, 2]})
    key = cache_key("quality/1", *parts)
    assert key == cache_key("quality/1", "model", {"a": [1, 2], "b": 1})  # canonical JSON: key order is no part
    assert len(key) == 24 and int(key, 16) >= 0
    assert cache_key("quality/2", *parts) != key  # the computation changed
    assert cache_key("quality/1", "model", {"b": 2, "a": [1, 2]}) != key  # the inputs changed
    monkeypatch.setattr(autocompress_opt, "__version__", "999.0")
    assert cache_key("quality/1", *parts) != key  # another release of the package
    with pytest.raises(ValueError, match="non-empty version"):
        cache_key("", *parts)


def test_content_digest_ignores_place_and_mtime_but_not_bytes(tmp_path: Path) -> None:
    """Two copies of a model folder (other paths, other modification times) share a digest; one
    changed byte, even at the same size, or a renamed file gives another."""
    one = tmp_path / "node1" / "model"
    one.mkdir(parents=True)
    (one / "config.json").write_text('{"hidden_size": 32}')
    (one / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (one / "README.md").write_text("not part of the weights")
    two = tmp_path / "node2" / "copy-of-model"
    shutil.copytree(one, two)
    os.utime(two / "model.safetensors", ns=(1, 1))
    weights = (".json", ".safetensors")
    assert content_digest(one, weights) == content_digest(two, weights)
    (two / "checkpoints").mkdir()
    (two / "checkpoints" / "step1.safetensors").write_bytes(b"later")
    assert content_digest(one, weights, recursive=False) == content_digest(two, weights, recursive=False)
    assert content_digest(one, weights) != content_digest(two, weights)  # subfolders count by default
    shutil.rmtree(two / "checkpoints")
    (two / "README.md").write_text("edited")
    assert content_digest(one, weights) == content_digest(two, weights)  # not among the suffixes
    assert content_digest(one) != content_digest(two)  # all files

    data = bytearray((two / "model.safetensors").read_bytes())
    data[1000] ^= 0xFF
    (two / "model.safetensors").write_bytes(bytes(data))  # same size: only the memo's mtime/inode notice
    assert content_digest(one, weights) != content_digest(two, weights)
    assert content_digest(one / "config.json") == content_digest(two / "config.json")  # a single file
    (two / "config.json").rename(two / "other.json")
    assert content_digest(one, weights) != content_digest(two, weights)
    with pytest.raises(FileNotFoundError, match="no file or directory"):
        content_digest(tmp_path / "missing")


# ------------------------------------------------------------------- file digests on disk
OLD_NS = 1_000_000_000_000_000_000  # 2001-09-09: a modification time long past


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The files file_digest opens to hash, recorded; its on-disk store in a fresh folder, its
    in-process memo cleared (as in a new process), and its clock 10 s ahead, so that files written
    by the test count as settled."""
    monkeypatch.setenv(cache.DIGEST_CACHE_ENV, str(tmp_path / "digests"))
    monkeypatch.setattr(cache, "_FILE_DIGESTS", {})
    monkeypatch.setattr(cache, "time", SimpleNamespace(time_ns=lambda: time.time_ns() + 10 * 10**9))
    opened: list[str] = []

    def recording_open(file: str, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(cache, "open", recording_open, raising=False)
    return opened


def _write_old(path: Path, data: bytes) -> Path:
    """``data`` written to ``path`` in a later clock tick than its last status change (so that even
    these same-size rewrites stamp a new one), its modification time put far in the past."""
    before = path.stat().st_ctime_ns if path.exists() else None
    while True:
        path.write_bytes(data)
        os.utime(path, ns=(OLD_NS, OLD_NS))
        if path.stat().st_ctime_ns != before:
            return path
        time.sleep(0.01)


def _new_process() -> None:
    cache._FILE_DIGESTS.clear()


def test_a_settled_file_is_hashed_once_then_read_from_disk_by_later_processes(tmp_path: Path, reads: list[str]) -> None:
    weights = _write_old(tmp_path / "model.safetensors", bytes(range(256)) * 64)
    expected = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert file_digest(weights) == expected and len(reads) == 1
    assert file_digest(weights) == expected and len(reads) == 1  # this process: its memo
    _new_process()
    assert file_digest(str(weights)) == expected and len(reads) == 1  # another process: the entry on disk
    assert content_digest(tmp_path, (".safetensors",)) and len(reads) == 1  # folders go through it too
    assert len(list(cache.digest_cache_dir().glob("*.json"))) == 1


def test_a_modified_or_touched_file_is_hashed_again(tmp_path: Path, reads: list[str]) -> None:
    """Same size and even the same modification time after a write: the status-change time (which a
    write always sets) tells them apart; a touch with the same bytes re-reads and gives the same digest."""
    weights = _write_old(tmp_path / "w.bin", b"a" * 4096)
    first = file_digest(weights)
    _new_process()
    _write_old(weights, b"b" * 4096)  # rewritten in place, same size, same (old) modification time
    assert file_digest(weights) == hashlib.sha256(b"b" * 4096).hexdigest() != first and len(reads) == 2
    _new_process()
    os.utime(weights, ns=(OLD_NS + 1, OLD_NS + 1))  # touched: the same bytes
    assert file_digest(weights) == hashlib.sha256(b"b" * 4096).hexdigest() and len(reads) == 3


def test_a_just_written_file_is_not_remembered(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written within the last 2 s (even with an old modification time): a second write in the same
    clock tick could keep its stamps, so every call hashes it, and nothing is stored."""
    monkeypatch.setattr(cache, "time", time)  # the real clock
    fresh = _write_old(tmp_path / "fresh.json", b"{}")
    assert file_digest(fresh) == file_digest(fresh) == hashlib.sha256(b"{}").hexdigest()
    assert len(reads) == 2 and not cache.digest_cache_dir().exists()


def test_an_unwritable_store_or_a_damaged_entry_only_means_hashing(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = _write_old(tmp_path / "w.bin", b"weights")
    expected = hashlib.sha256(b"weights").hexdigest()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cache.DIGEST_CACHE_ENV, str(blocker / "digests"))  # no folder can be made there, even by root
    assert file_digest(weights) == expected
    _new_process()
    assert file_digest(weights) == expected and len(reads) == 2  # nothing stored: hashed again

    monkeypatch.setenv(cache.DIGEST_CACHE_ENV, str(tmp_path / "digests"))
    _new_process()
    file_digest(weights)
    (entry,) = cache.digest_cache_dir().glob("*.json")
    for damage in ("not json", '{"key": [], "sha256": "00"}', '{"sha256": "' + "0" * 64 + '"}'):
        entry.write_text(damage)
        _new_process()
        assert file_digest(weights) == expected  # read again, and the entry repaired
    assert len(reads) == 6 and f'"sha256": "{expected}"' in entry.read_text()
    with pytest.raises(FileNotFoundError, match="file_digest: no file at"):
        file_digest(tmp_path / "missing")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        file_digest(tmp_path)


# ----------------------------------------------------------------------- publication
class _Crash(RuntimeError):
    pass


@pytest.mark.parametrize("as_directory", [False, True])
def test_a_writer_that_crashes_leaves_no_entry_and_no_litter(tmp_path: Path, as_directory: bool) -> None:
    """The writer dies half way (raises after writing part of the entry): no entry, no temporary a
    reader could take; the next fetch computes and publishes the whole entry."""
    entry = tmp_path / "cache" / ("entry" if as_directory else "entry.json")

    def half_write(value: bytes, tmp: Path) -> None:
        if as_directory:
            tmp.mkdir()
            (tmp / "part1").write_bytes(value[:3])
        else:
            tmp.write_bytes(value[:3])
        raise _Crash("killed mid-write")

    def write(value: bytes, tmp: Path) -> None:
        if as_directory:
            tmp.mkdir()
            (tmp / "part1").write_bytes(value[:3])
            (tmp / "part2").write_bytes(value[3:])
        else:
            tmp.write_bytes(value)

    def read(path: Path) -> bytes:
        return (path / "part1").read_bytes() + (path / "part2").read_bytes() if as_directory else path.read_bytes()

    with pytest.raises(_Crash):
        fetch(entry, lambda: b"payload", half_write, read)
    assert not entry.exists()
    assert _visible(entry.parent) == []
    assert fetch(entry, lambda: b"payload", write, read) == (b"payload", False)
    assert fetch(entry, lambda: b"other", write, read) == (b"payload", True)
    assert _visible(entry.parent) == [entry.name]


def _dead_pid() -> int:
    """The id of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_litter_of_a_killed_writer_is_never_read_and_is_swept(tmp_path: Path) -> None:
    """A process killed mid-write (no chance to clean up) leaves a hidden temporary named by its host
    and process: readers do not take it for the entry, and the next writer of that entry on that host
    removes it once the process is gone."""
    entry = tmp_path / "abc.json"
    litter = tmp_path / f".abc.json.tmp-{cache._host()}-{_dead_pid()}-deadbeef"
    litter.write_bytes(b"hal")
    assert fetch(entry, lambda: b"whole", _write_bytes, _read_bytes) == (b"whole", False)
    assert _visible(tmp_path) == ["abc.json"]


def test_the_sweep_leaves_other_hosts_and_live_writers_temporaries_alone(tmp_path: Path) -> None:
    """In a cache folder shared by several nodes, a temporary of another host (whose writer this host
    cannot see), of a live process here, or of an older naming is its owner's: never swept."""
    entry = tmp_path / "abc.json"
    kept = [
        f".abc.json.tmp-other-node.example-{_dead_pid()}-deadbeef",
        f".abc.json.tmp-{cache._host()}-{os.getppid()}-cafe",  # a live process of this host
        ".abc.json.tmp-12345-deadbeef",  # no host in the name
        f".abc.json.old-other-node-{_dead_pid()}-beef",
    ]
    for name in kept:
        (tmp_path / name).write_bytes(b"being written")
    assert fetch(entry, lambda: b"whole", _write_bytes, _read_bytes) == (b"whole", False)
    assert _visible(tmp_path) == sorted(["abc.json", *kept])
    publish(tmp_path / "x.json", lambda tmp: tmp.write_text(tmp.name))
    host, pid, _ = (tmp_path / "x.json").read_text().removeprefix(".x.json.tmp-").rsplit("-", 2)
    assert (host, int(pid)) == (cache._host(), os.getpid())  # temporaries are named by host and process


def test_a_stale_entry_is_recomputed_and_replaced(tmp_path: Path) -> None:
    """``read`` returning None (an entry made under another key) means compute and replace, for a
    file and for a directory entry."""
    entry = tmp_path / "stage.json"
    entry.write_bytes(b"key=old")
    read = lambda p: p.read_bytes() if p.read_bytes().startswith(b"key=new") else None
    assert fetch(entry, lambda: b"key=new", _write_bytes, read) == (b"key=new", False)
    assert entry.read_bytes() == b"key=new"

    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "old-only").write_text("x")
    publish(folder, lambda tmp: (tmp.mkdir(), (tmp / "new").write_text("y")))
    assert sorted(p.name for p in folder.iterdir()) == ["new"]
    assert _visible(tmp_path) == ["export", "stage.json"]


def test_publish_refuses_a_writer_that_wrote_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="created nothing"):
        publish(tmp_path / "entry", lambda tmp: None)
    assert _visible(tmp_path) == []


# ------------------------------------------------------------------- two writers at once
def _slow_writer(entry: str, log: str, started: float, out: multiprocessing.queues.Queue) -> None:
    """Fetch ``entry``; the computation takes 1 s and records itself in ``log``. Puts
    ``(pid, value, was_cached)`` on ``out``."""

    def compute() -> bytes:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return f"computed by {os.getpid()}".encode()

    time.sleep(max(0.0, started - time.time()))  # both processes start fetching at the same moment
    out.put((os.getpid(), *fetch(Path(entry), compute, _write_bytes, _read_bytes)))


def test_two_writers_at_once_compute_once_and_read_the_same_bytes(tmp_path: Path) -> None:
    """Two processes fetch one missing entry at the same time: one computes (the other waits on the
    lock), and both return the same bytes, the waiter's read back from the published entry."""
    entry, log = tmp_path / "cache" / "entry.bin", tmp_path / "computations.log"
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 3.0  # after both spawned interpreters have imported this module
    writers = [context.Process(target=_slow_writer, args=(str(entry), str(log), start_at, out)) for _ in range(2)]
    for w in writers:
        w.start()
    results = [out.get(timeout=60) for _ in writers]
    for w in writers:
        w.join(timeout=10)
        assert w.exitcode == 0
    assert time.time() > start_at  # neither finished before the common start: they overlapped
    assert len(log.read_text().split()) == 1  # computed once
    (pid_a, value_a, cached_a), (pid_b, value_b, cached_b) = results
    assert pid_a != pid_b
    assert value_a == value_b == entry.read_bytes()
    assert value_a.startswith(b"computed by ")
    assert sorted([cached_a, cached_b]) == [False, True]
    assert _visible(entry.parent) == ["entry.bin"]


# ------------------------------------------------------------- file systems without flock
@pytest.fixture
def no_flock(monkeypatch: pytest.MonkeyPatch) -> None:
    """flock refused as on Lustre mounted without ``-o flock`` (ENOSYS); the fallback's warning not yet given."""

    def refuse(fd: Any, operation: int) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(cache.fcntl, "flock", refuse)
    monkeypatch.setattr(cache, "_warned", threading.Event())


@pytest.mark.usefixtures("no_flock")
def test_without_flock_two_writers_still_compute_once_and_one_warning_says_why(tmp_path: Path) -> None:
    """Two threads fetch one missing entry where flock fails with ENOSYS: the lock file created
    exclusively serialises them (one computes, the other reads its entry), and the process warns
    once, naming the folder and the error."""
    entry, computed = tmp_path / "cache" / "entry.bin", []
    barrier = threading.Barrier(2)

    def compute() -> bytes:
        computed.append(threading.get_ident())
        time.sleep(0.3)
        return b"computed once"

    def writer(out: list[Any]) -> None:
        barrier.wait()
        out.append(fetch(entry, compute, _write_bytes, _read_bytes))

    results: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=writer, args=(results,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        fetch(tmp_path / "cache" / "another.bin", lambda: b"x", _write_bytes, _read_bytes)
    assert len(computed) == 1
    assert sorted(results) == [(b"computed once", False), (b"computed once", True)]
    notes = [w for w in caught if issubclass(w.category, RuntimeWarning) and "refuses flock" in str(w.message)]
    assert len(notes) == 1 and "ENOSYS" in str(notes[0].message) and str(entry.parent) in str(notes[0].message)
    assert not list(entry.parent.glob("*.held"))  # released: no lock file left held


@pytest.mark.usefixtures("no_flock")
def test_without_flock_the_lock_serialises_holders(tmp_path: Path) -> None:
    """Four threads take one lock: their critical sections never overlap."""
    spans: list[tuple[float, float]] = []

    def hold() -> None:
        with cache.file_lock(tmp_path / "study.db.driver-lock"):
            began = time.monotonic()
            time.sleep(0.05)
            spans.append((began, time.monotonic()))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        threads = [threading.Thread(target=hold) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    spans.sort()
    assert len(spans) == 4
    assert all(end <= later for (_, end), (later, _) in itertools.pairwise(spans))


@pytest.mark.usefixtures("no_flock")
def test_a_dead_holder_s_lock_is_taken_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock file left by a dead process of this host is taken at once; one of another host once it
    has not changed for the stale period (here 0.3 s instead of 2 minutes); a live holder's is not."""
    lock = tmp_path / "entry.lock"
    held = tmp_path / "entry.lock.held"
    monkeypatch.setattr(cache, "_STALE_S", 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        held.write_text(f"{cache._host()} {_dead_pid()} token")
        began = time.monotonic()
        with cache.file_lock(lock):
            assert held.read_text().startswith(f"{cache._host()} {os.getpid()} ")
        assert time.monotonic() - began < 0.25 and not held.exists()

        held.write_text("other-node 1 token")
        began = time.monotonic()
        with cache.file_lock(lock):
            pass
        assert 0.3 <= time.monotonic() - began < 5

        monkeypatch.setattr(cache, "_STALE_S", 60.0)
        held.write_text(f"{cache._host()} {os.getppid()} token")  # alive: waited for
        waiter = threading.Thread(target=_take_and_release, args=(lock,))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive()
        held.unlink()  # the holder releases
        waiter.join(timeout=5)
        assert not waiter.is_alive()


def _take_and_release(lock: Path) -> None:
    with cache.file_lock(lock):
        pass


def test_other_flock_errors_are_not_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: Any, operation: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(cache.fcntl, "flock", broken)
    with pytest.raises(OSError, match="I/O error"), cache.file_lock(tmp_path / "x.lock"):
        pass


def _refuse_flock(fd: Any, operation: int) -> None:
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))


def _slow_writer_without_flock(entry: str, log: str, started: float, out: multiprocessing.queues.Queue) -> None:
    """:func:`_slow_writer` in a process whose file system refuses flock."""
    cache.fcntl.flock = _refuse_flock  # type: ignore[assignment]  # this spawned process only
    warnings.simplefilter("ignore")
    _slow_writer(entry, log, started, out)


def test_without_flock_two_processes_compute_once(tmp_path: Path) -> None:
    """Two processes where flock fails with ENOSYS fetch one missing entry at once: one computes, the
    other waits on the lock file and reads the entry."""
    entry, log = tmp_path / "cache" / "entry.bin", tmp_path / "computations.log"
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 3.0
    args = (str(entry), str(log), start_at, out)
    writers = [context.Process(target=_slow_writer_without_flock, args=args) for _ in range(2)]
    for w in writers:
        w.start()
    results = [out.get(timeout=60) for _ in writers]
    for w in writers:
        w.join(timeout=10)
        assert w.exitcode == 0
    assert len(log.read_text().split()) == 1
    assert sorted(cached for _, _, cached in results) == [False, True]
    assert len({value for _, value, _ in results}) == 1
    assert _visible(entry.parent) == ["entry.bin"]
