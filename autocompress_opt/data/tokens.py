"""Token ids of documents, tokenised once per (tokenizer, document text) and kept in this process and on disk.

:func:`~autocompress_opt.data.textdata.text_batches` tokenises every document it draws from; a trial
calls it several times, the driver more, every CLI verb again. A :class:`TokenStore` answers each
document's ids from

* an in-process memo, keyed by the tokenizer's fingerprint and the SHA-256 of the document's text;
* an on-disk entry per (tokenizer, source) under a cache folder (default :data:`DEFAULT_TOKEN_CACHE`):
  one ``.npz`` holding every document of that source tokenised so far (all ids as one int32 array,
  the offsets of each document, the documents' text digests), so a source's thousands of documents
  make one file, not thousands. The entry's name is :func:`~autocompress_opt.cache.cache_key` of
  :data:`TOKEN_CACHE_VERSION`, the tokenizer's fingerprint and the source's name; documents are found
  in it by the digest of their text, so a changed document misses (and is tokenised and added), a
  changed tokenizer reads another entry. An entry grows: documents tokenised by a later call are
  merged in under the entry's lock and the whole entry republished atomically
  (:func:`~autocompress_opt.cache.entry_lock`, :func:`~autocompress_opt.cache.publish`).

The ids a store returns are those :func:`encode` gives for the text, bit for bit. A tokenizer whose
behaviour cannot be fingerprinted (neither a fast tokenizer nor a SentencePiece one) is not cached.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.cache import cache_key, entry_lock, publish

__all__ = [
    "DEFAULT_TOKEN_CACHE",
    "TOKEN_CACHE_ENV",
    "TOKEN_CACHE_VERSION",
    "TokenStore",
    "clear_token_memo",
    "encode",
    "tokenizer_fingerprint",
    "tokenizer_label",
]

# Bump when the stored ids could differ for the same tokenizer and text (the encode call, the format).
TOKEN_CACHE_VERSION = "tokens/1"
# Beside the package's other per-user caches (~/.cache/autocompress_opt/data, .../profiles); expanded when used.
# The environment variable moves it for a process and every process it starts (Ray workers, a CLI run).
TOKEN_CACHE_ENV = "AUTOCOMPRESS_TOKEN_CACHE"
DEFAULT_TOKEN_CACHE = os.environ.get(TOKEN_CACHE_ENV) or "~/.cache/autocompress_opt/tokens"

# fingerprint -> {document text digest -> ids}: every document tokenised or read in this process.
_MEMO: dict[str, dict[str, np.ndarray]] = {}
# entry path -> (stat stamp when last read, digests the entry held then)
_ON_DISK: dict[Path, tuple[tuple[int, int, int], frozenset[str]]] = {}
# tokenizer -> (len(tokenizer) when fingerprinted, fingerprint); computing one takes ~0.07 s for SmolLM2
_FINGERPRINTS: weakref.WeakKeyDictionary[Any, tuple[int, str | None]] = weakref.WeakKeyDictionary()


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (no length warning: documents are cut later)."""
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """SHA-256 (hex) of everything that decides what :func:`encode` returns, or None when that
    cannot be read (then nothing is cached).

    A fast tokenizer: its backend's full serialisation (normaliser, pre-tokeniser, model with its
    vocabulary and merges, added tokens); a SentencePiece one: its model proto and added tokens. Both
    with the class name and ``split_special_tokens``. Independent of where the files were loaded
    from: one tokenizer in two folders has one fingerprint. Memoised per tokenizer object (and its
    length, which adding tokens changes).
    """
    size = len(tokenizer)
    try:
        memo = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # neither weak-referenceable nor hashable: computed every time
        return _fingerprint(tokenizer)
    if memo is None or memo[0] != size:
        memo = (size, _fingerprint(tokenizer))
        _FINGERPRINTS[tokenizer] = memo
    return memo[1]


def tokenizer_label(tokenizer: Any) -> str:
    """How a rows' record names ``tokenizer``: its class, the first 16 hex digits of its
    :func:`tokenizer_fingerprint` and its vocabulary size, so one tokenizer read from two folders (a
    GGUF and its dequantised copy, per-node copies) gives one record, and the importance, teacher
    and seed-score caches keyed by the record are shared. A tokenizer without a fingerprint is named
    by its ``name_or_path`` (or class) instead."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    else:
        name = f"{type(tokenizer).__name__} sha256:{fingerprint[:16]}"
    return f"{name} (vocab {len(tokenizer)})"


def _fingerprint(tokenizer: Any) -> str | None:
    digest = hashlib.sha256()
    settings = [type(tokenizer).__qualname__, getattr(tokenizer, "split_special_tokens", None)]
    digest.update(json.dumps(settings).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        digest.update(b"fast\x1f" + backend.to_str().encode())
        return digest.hexdigest()
    sp_model = getattr(tokenizer, "sp_model", None)
    if sp_model is not None and hasattr(sp_model, "serialized_model_proto"):
        added = sorted((str(k), int(v)) for k, v in getattr(tokenizer, "get_added_vocab", dict)().items())
        digest.update(b"sentencepiece\x1f" + sp_model.serialized_model_proto() + json.dumps(added).encode())
        return digest.hexdigest()
    return None


def clear_token_memo() -> None:
    """Forget the in-process memo (the on-disk entries stay)."""
    _MEMO.clear()
    _ON_DISK.clear()


class TokenStore:
    """The token ids of documents for one tokenizer, from the memo, the disk entry or the tokenizer.

    ``directory``: the on-disk cache folder (created on the first write), or None for the
    in-process memo only. Use one store per batch-building call: :meth:`ids` for each document,
    then :meth:`save` to add what was tokenised to the disk entries. Not thread-safe (one store per
    thread); safe across processes (entries are merged under their lock and published whole).
    """

    def __init__(self, tokenizer: Any, directory: str | Path | None):
        self.tokenizer = tokenizer
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.directory = Path(directory).expanduser() if directory is not None else None
        self._pending: dict[Path, set[str]] = {}
        self._checked: set[Path] = set()
        self.n_tokenised = 0  # documents this store had to tokenise (memo and disk missed)

    def ids(self, shard: str, text: str) -> list[int]:
        """Token ids of ``text`` (:func:`encode`); ``shard`` (the source's name) picks the disk entry."""
        if self.fingerprint is None:
            self.n_tokenised += 1
            return encode(self.tokenizer, text)
        entry = self._entry(shard)
        if entry is not None and entry not in self._checked:
            _refresh(entry, self.fingerprint)  # once per store: another process may have added documents
            self._checked.add(entry)
        memo = _MEMO.setdefault(self.fingerprint, {})
        digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
        if digest not in memo:
            memo[digest] = np.asarray(encode(self.tokenizer, text), dtype=np.int32)
            self.n_tokenised += 1
        if entry is not None and digest not in _ON_DISK[entry][1]:
            self._pending.setdefault(entry, set()).add(digest)
        return memo[digest].tolist()

    def save(self) -> None:
        """Merge the documents tokenised since the last save into their disk entries. A folder that
        cannot be written is reported with a warning (the ids were returned all the same)."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        assert self.fingerprint is not None  # pending entries exist only for a fingerprinted tokenizer
        memo = _MEMO[self.fingerprint]
        for entry, digests in pending.items():
            try:
                with entry_lock(entry):
                    _refresh(entry, self.fingerprint)
                    held = _ON_DISK[entry][1]
                    if digests <= held:
                        continue  # another process published them meanwhile
                    merged = sorted(held | digests)
                    publish(entry, functools.partial(_write, digests=merged, memo=memo))
                    _ON_DISK[entry] = (_stamp(entry), frozenset(merged))
            except OSError as exc:
                warnings.warn(f"token cache {str(entry)!r} not written: {exc}", RuntimeWarning, stacklevel=2)

    def _entry(self, shard: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / f"{cache_key(TOKEN_CACHE_VERSION, self.fingerprint, shard)}.npz"


_MISSING = (-1, -1, -1)


def _refresh(entry: Path, fingerprint: str) -> None:
    """Read ``entry`` into the memo of ``fingerprint`` when it changed since this process last read it."""
    stamp = _stamp(entry)
    if entry in _ON_DISK and _ON_DISK[entry][0] == stamp:
        return
    found = _read(entry) if stamp != _MISSING else {}
    memo = _MEMO.setdefault(fingerprint, {})
    for digest, ids in found.items():
        memo.setdefault(digest, ids)
    _ON_DISK[entry] = (stamp, frozenset(found))


def _stamp(entry: Path) -> tuple[int, int, int]:
    try:
        stat = entry.stat()
    except FileNotFoundError:
        return _MISSING
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def _write(tmp: Path, digests: list[str], memo: dict[str, np.ndarray]) -> None:
    """One entry: ``ids`` (every document's ids, concatenated, int32), ``offsets`` (``n + 1``
    int64: document ``i`` is ``ids[offsets[i]:offsets[i + 1]]``) and ``digests`` (``n`` text SHA-256s)."""
    arrays = [memo[d] for d in digests]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
    with open(tmp, "wb") as handle:  # a handle: np.savez would add ".npz" to the temporary's name
        np.savez(handle, ids=ids, offsets=offsets, digests=np.array(digests, dtype="U64"))


def _read(entry: Path) -> dict[str, np.ndarray]:
    """``{digest: ids}`` of an entry; an unreadable or inconsistent one reads as empty (and is
    rewritten whole by the next save)."""
    try:
        with np.load(entry, allow_pickle=False) as data:
            ids, offsets, digests = data["ids"], data["offsets"], data["digests"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return {}
    if ids.dtype != np.int32 or offsets.shape != (len(digests) + 1,) or offsets[-1] != ids.size or offsets[0] != 0:
        return {}
    return {str(d): ids[offsets[i] : offsets[i + 1]] for i, d in enumerate(digests)}
