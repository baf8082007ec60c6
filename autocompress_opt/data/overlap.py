"""Text shared across roles: documents grouped by content, and held-out rows checked for long shared spans.

The split (:mod:`~autocompress_opt.data.textdata`) is by document, but documents can hold each
other's text: pydoc's ``if`` topic is a paragraph of its ``compound`` topic, a dataset repeats a row
inside a longer one. Two checks keep such text in one role:

**Content groups** (:func:`content_groups`). A document's *words* are its lowercase ``\\w+`` runs
(punctuation, case and spacing ignored). Documents with the same words, or whose words (at least
:data:`NGRAM_TOKENS` of them) appear contiguously inside another document's, are in one group, joined
transitively; every document of a group takes the role of its representative, the member with the
most words (ties: the first in source and key order). A document alone in its group keeps the role
its own hash gives.

**Shared n-grams** (:class:`NgramIndex`). A test row that shares :data:`NGRAM_TOKENS` consecutive
words with calibration or selection text, and a selection row that shares them with calibration
text, is dropped and counted (:func:`~autocompress_opt.data.textdata.text_batches`); rows are cut
on until enough pass.

N-grams are compared by a 64-bit hash (words hashed with BLAKE2b, then a polynomial over the
window): deterministic across processes and machines; a false match needs a 64-bit collision.
Cost: one pass of a regular expression and NumPy over every document (the built-in sources: about
1.5 s and 10 MB, once per process).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["NGRAM_TOKENS", "DocumentWords", "NgramIndex", "content_groups", "ngram_hashes", "words"]

# GPT-3's contamination n-gram (Brown et al. 2020, "Language Models are Few-Shot Learners", appendix
# C): long enough that a shared one is copied text, not a common phrase.
NGRAM_TOKENS = 13

_WORD = re.compile(r"\w+")
_BASE = np.uint64(0x100000001B3)  # odd multiplier of the window polynomial (the FNV-1a 64-bit prime)
_WORD_HASHES: dict[str, int] = {}  # word -> its 64-bit hash, shared by every call (a vocabulary's worth)


def words(text: str) -> list[str]:
    """The document's words: lowercase ``\\w+`` runs, in order."""
    return _WORD.findall(text.lower())


def _word_hash(word: str) -> int:
    found = _WORD_HASHES.get(word)
    if found is None:
        found = int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
        _WORD_HASHES[word] = found
    return found


def ngram_hashes(tokens: Sequence[str], n: int = NGRAM_TOKENS) -> np.ndarray:
    """``(len(tokens) - n + 1,)`` uint64 hashes of every window of ``n`` consecutive words (empty when shorter)."""
    if len(tokens) < n:
        return np.zeros(0, dtype=np.uint64)
    hashed = np.fromiter((_word_hash(w) for w in tokens), dtype=np.uint64, count=len(tokens))
    out = np.zeros(len(tokens) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2**64 is the point
        for j in range(n):
            out = out * _BASE + hashed[j : j + len(out)]
    return out


@dataclass(frozen=True)
class DocumentWords:
    """A document as both checks see it: its words joined by single spaces, their count, and the
    hashes of its ``NGRAM_TOKENS``-grams (kept instead of the words: 8 bytes a position)."""

    text: str = field(repr=False)
    n_words: int
    grams: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, text: str, n: int = NGRAM_TOKENS) -> DocumentWords:
        found = words(text)
        return cls(" ".join(found), len(found), ngram_hashes(found, n))


class NgramIndex:
    """The set of ``n``-gram hashes of some texts; :meth:`shares` says whether a text has one of them."""

    def __init__(self, hashes: Sequence[np.ndarray], n: int = NGRAM_TOKENS) -> None:
        self.n = n
        self._sorted = np.unique(np.concatenate([np.zeros(0, dtype=np.uint64), *hashes]))

    def __len__(self) -> int:
        return len(self._sorted)

    def shares(self, text: str) -> bool:
        """Whether ``text`` holds ``n`` consecutive words that the indexed texts hold."""
        probe = ngram_hashes(words(text), self.n)
        if not len(probe) or not len(self._sorted):
            return False
        at = np.minimum(np.searchsorted(self._sorted, probe), len(self._sorted) - 1)
        return bool((self._sorted[at] == probe).any())


def content_groups(documents: Sequence[DocumentWords]) -> list[int]:
    """For each document, the index of its group's representative (module doc): a document with no
    twin and no nesting of ``NGRAM_TOKENS`` words or more (the length its ``grams`` were taken at)
    is its own representative. Pure and deterministic.

    Nesting is found by probes: a document with an n-gram can lie inside another only if the other
    holds its first and its last n-gram; each candidate pair is then checked exactly."""
    parent = list(range(len(documents)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(a: int, b: int) -> None:
        a, b = root(a), root(b)
        if a != b:
            parent[max(a, b)] = min(a, b)

    first_seen: dict[str, int] = {}
    for i, doc in enumerate(documents):
        if doc.text:  # documents without words hold nothing to share
            join(i, first_seen.setdefault(doc.text, i))
    for inner, outer in _nesting_candidates(documents):
        if root(inner) != root(outer) and f" {documents[inner].text} " in f" {documents[outer].text} ":
            join(inner, outer)
    members: dict[int, list[int]] = {}
    for i in range(len(documents)):
        members.setdefault(root(i), []).append(i)
    out = list(range(len(documents)))
    for group in members.values():
        representative = max(group, key=lambda i: (documents[i].n_words, -i))
        for i in group:
            out[i] = representative
    return out


def _nesting_candidates(documents: Sequence[DocumentWords]) -> list[tuple[int, int]]:
    """``(inner, outer)`` pairs where ``outer`` holds both the first and the last n-gram of ``inner``."""
    grams = [d.grams for d in documents]
    probes = {i: (int(g[0]), int(g[-1])) for i, g in enumerate(grams) if len(g)}
    if not probes:
        return []
    wanted = np.unique(np.array([h for pair in probes.values() for h in pair], dtype=np.uint64))
    holders: dict[int, set[int]] = {}  # probe hash -> documents holding it
    for j, g in enumerate(grams):
        for h in np.unique(g[np.isin(g, wanted)]):
            holders.setdefault(int(h), set()).add(j)
    pairs = []
    for i, (head, tail) in probes.items():
        for j in sorted(holders.get(head, set()) & holders.get(tail, set())):
            if j != i and documents[j].n_words >= documents[i].n_words:
                pairs.append((i, j))
    return pairs
