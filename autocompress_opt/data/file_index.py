"""What one pass over a user's data file found, kept on disk by the file's (path, size, mtime).

A large JSONL file is read once — parsed, each row's text hashed, the whole file's digest taken — and
the result (:class:`RowIndex`: each row's line and byte offset, a 16-byte hash of each row's text,
the digest) is published under a key of the file's resolved path, size, modification time and inode
and the reader's settings, so every later process (a trial, a distillation rank, the next command)
reads the index instead of the file. A rewritten file changes its size, mtime or inode and so its
key: a stale index is never read.

This is the data package's own small cache of a file's digest; :func:`index_key` and
:func:`cached_row_index` are the parts a shared ``file_digest`` in :mod:`autocompress_opt.cache`
would replace.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.cache import cache_key, fetch

__all__ = ["INDEX_VERSION", "RowIndex", "cached_row_index", "index_folder", "index_key"]

# Bump when what an index holds, or how rows are read into text, changes.
INDEX_VERSION = "row-index/1"
HASH_BYTES = 16  # of a row text's SHA-256: enough to tell rows apart and to hash roles from


@dataclass(frozen=True)
class RowIndex:
    """One pass over a file: for each document (a row with text), its 1-based ``lines`` and byte
    ``offsets`` (int64), and ``hashes`` (``(n, 16)`` uint8, the first bytes of its text's SHA-256);
    ``sha256``: over every document's key and text in order; ``chat``: whether the documents are
    chats; ``fields``: the fields read; ``skipped``: rows with no text."""

    lines: np.ndarray
    offsets: np.ndarray
    hashes: np.ndarray
    sha256: str
    chat: bool
    fields: tuple[str, ...]
    skipped: int

    def __len__(self) -> int:
        return len(self.lines)


def index_folder() -> Path:
    """Where indexes are kept: beside the token cache (``~/.cache/autocompress_opt/row-index`` by default)."""
    from autocompress_opt.data import tokens

    return Path(tokens.DEFAULT_TOKEN_CACHE).expanduser().parent / "row-index"


def index_key(path: Path, *settings: Any) -> str:
    """The cache key of ``path`` as it is now (resolved path, size, mtime_ns, inode) read with ``settings``."""
    stat = path.stat()
    return cache_key(INDEX_VERSION, str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino, *settings)


def cached_row_index(path: Path, settings: tuple[Any, ...], build: Callable[[], RowIndex]) -> tuple[RowIndex, bool]:
    """The index of ``path`` read with ``settings``: from disk, else ``build()`` and published;
    returns ``(index, was_cached)``. A folder that cannot be written costs only the reuse."""
    entry = index_folder() / f"{index_key(path, *settings)}.npz"
    try:
        return fetch(entry, build, _write, _read)
    except OSError:
        return build(), False


def _write(index: RowIndex, tmp: Path) -> None:
    meta = {"sha256": index.sha256, "chat": index.chat, "fields": list(index.fields), "skipped": index.skipped}
    with open(tmp, "wb") as handle:
        np.savez(
            handle,
            lines=index.lines,
            offsets=index.offsets,
            hashes=index.hashes,
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        )


def _read(entry: Path) -> RowIndex | None:
    if not entry.is_file():
        return None
    try:
        with np.load(entry, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            return RowIndex(
                data["lines"],
                data["offsets"],
                data["hashes"],
                str(meta["sha256"]),
                bool(meta["chat"]),
                tuple(meta["fields"]),
                int(meta["skipped"]),
            )
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None  # a damaged entry is rebuilt
