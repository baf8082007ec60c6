"""The one disk-cache scheme (autocompress_opt.cache): keys follow the code version and the content,
an entry appears whole or not at all, and two writers of one entry compute it once."""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.queues
import os
import shutil
import time
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


def test_litter_of_a_killed_writer_is_never_read_and_is_swept(tmp_path: Path) -> None:
    """A process killed mid-write (no chance to clean up) leaves a hidden temporary: readers do not
    take it for the entry, and the next writer of that entry removes it."""
    entry = tmp_path / "abc.json"
    litter = tmp_path / ".abc.json.tmp-12345-deadbeef"
    litter.write_bytes(b"hal")
    assert fetch(entry, lambda: b"whole", _write_bytes, _read_bytes) == (b"whole", False)
    assert _visible(tmp_path) == ["abc.json"]


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
