"""Calibration, selection and test text: built-in sources read from what is installed, or a user's data.

By default nothing is downloaded and nothing is copied into the repository: every token comes from a
:class:`TextSource` that reads an installed package. A user's files and datasets (``--data``) are
sources too (:mod:`autocompress_opt.data.user`, domain ``user``).

========================  ======  ===========================================  ===============
source                    domain  what                                         licence
========================  ======  ===========================================  ===============
``python-stdlib``         code    the interpreter's standard-library ``.py``   PSF-2.0
                                  files (tests, site-packages, pydoc_data,
                                  generated codec tables and build config out)
``pydoc-topics``          prose   ``pydoc_data/topics.py`` (the language       PSF-2.0
                                  reference behind ``help()``), one per topic
``python-docs``           prose   Debian ``python3.X-doc`` reST sources         PSF-2.0
                                  (optional: ``apt-get install python3.11-doc``)
``bible-kjv``             prose   Debian ``bible-kjv``, one document per book   public domain
                                  (optional: ``apt-get install bible-kjv``)
========================  ======  ===========================================  ===============

The defaults (:data:`DEFAULT_SOURCES`) ship with every Python, so numbers are comparable across
machines; the optional sources are used only when named, and naming one that is not installed
raises a :class:`ConfigError` saying how to install it — never a silent fallback.

**Split.** Every *document* (a module file, a topic, a book, a row of a user's dataset) goes wholly
to one of three roles, decided by a hash ``u = hash(split_seed, *source.role_id(key))`` in ``[0, 1)``
(a built-in document's source and key; a user's document's text, so that appending rows moves no
earlier row and identical rows share a role):
``test`` when ``u < test_fraction``, ``selection`` when ``u < test_fraction + selection_fraction``,
else ``calibration``. Documents that hold the same text, or whose text (13 words or more) stands
inside another's, form a content group and all take the role of its largest member
(:mod:`~autocompress_opt.data.overlap`; pydoc topics nest inside each other). The roles never share a
document:

- ``calibration``: importance, the inner search's training steps, a baseline's own candidate scoring,
  distillation;
- ``selection``: every choice among candidates (the inner search's pick, a trial's objective, the
  comparison of seeded baselines);
- ``test``: what is reported (``eval``, exported models' cards), never used to choose anything.

``split_seed`` is separate from the sampling ``seed`` so that rows drawn with different seeds still
never cross roles; keep the default unless you mean to re-split. (The test documents are those the
two-way split of earlier versions held out for "evaluation"; selection takes a slice of what was
calibration.)

**Sampling.** Rows are shared among groups (the domains present, equally, by default; one group per
source with ``weights``) by largest remainder, ties to the earlier group. Within a group, documents
of the role are ordered by a hash of ``(seed, source, key)``;
each is tokenised and cut into ``seq_len``-token pieces (in a per-document hashed order). Pass
``k`` appends piece ``k`` of every document, separated by ``"\\n\\n"``, until the stream holds
enough tokens; the stream is then cut into consecutive rows (each led by BOS when the tokenizer
adds one). So rows spread over as many documents as possible. A selection row sharing
13 consecutive words with calibration text, or a test row sharing them with calibration or
selection text, is dropped (counted in :attr:`TextBatches.rows_dropped`) and the next row cut
instead. Everything is a pure function of the installed files, the tokenizer and the seeds.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.data import overlap as _overlap
from autocompress_opt.data import tokens as _tokens
from autocompress_opt.data.text_sources import (
    DEFAULT_SOURCES,
    DOMAINS,
    BibleKJVSource,
    PydocTopicsSource,
    PythonDocsSource,
    StdlibSource,
    TextSource,
    _resolve_sources,
    text_sources,
)
from autocompress_opt.errors import ConfigError, check_choice, check_fraction, check_int, check_number

__all__ = [
    "CONTENT_CHECK_MAX_DOCUMENTS",
    "DEFAULT_SOURCES",
    "DEFAULT_SPLIT_SEED",
    "DOMAINS",
    "ROLES",
    "SELECTION_FRACTION",
    "SPLIT_RULE",
    "TEST_FRACTION",
    "BibleKJVSource",
    "DataSplit",
    "PydocTopicsSource",
    "PythonDocsSource",
    "SourceInfo",
    "StdlibSource",
    "TextBatches",
    "TextSource",
    "calibration_batches",
    "check_token_ids",
    "data_split",
    "held_text_index",
    "test_batches",
    "text_batches",
    "text_sources",
]

ROLES: tuple[str, ...] = ("calibration", "selection", "test")
DEFAULT_SPLIT_SEED = 0
# A fifth of the documents is held out for test: ~146 stdlib files (~0.7M tokens) and ~16 pydoc
# topics (~20-30k tokens) — enough for a few hundred 256-token test rows. Selection takes 15%:
# ~110 stdlib files and ~12 topics (~15-25k tokens), enough for the trials' 8-16 selection rows of
# 128 tokens per domain; calibration keeps 65%.
TEST_FRACTION = 0.2
SELECTION_FRACTION = 0.15
_PIECE_SEPARATOR = "\n\n"
# The rule that assigns text to roles, recorded by studies (their trials' rows depend on it): bump it
# when a change of the rule gives other rows. "content/1": roles by content group, rows checked.
SPLIT_RULE = "content/1"
# Above this many documents (all sources of a split) the content checks are skipped: they hold every
# document's words in memory (about 16 bytes a word: a million rows of a page each would take ~5 GB).
CONTENT_CHECK_MAX_DOCUMENTS = 100_000
# The roles whose text a role's rows must not share an n-gram with (overlap.NGRAM_TOKENS words).
_CHECKED_AGAINST: dict[str, tuple[str, ...]] = {
    "calibration": (),
    "selection": ("calibration",),
    "test": ("calibration", "selection"),
}
_log = logging.getLogger(__name__)


# ------------------------------------------------------------------------ split
def _digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).hexdigest()


def _unit(*parts: object) -> float:
    """A uniform number in [0, 1) determined by ``parts`` (first 64 bits of a SHA-256)."""
    return int(_digest(*parts)[:16], 16) / 2.0**64


@dataclass(frozen=True)
class SourceInfo:
    """What a split drew from one source (for records).

    Attributes:
        n_documents: the source's documents (a user dataset's rows, a folder's files).
        sha256: :meth:`TextSource.content_sha256`, so a record names the exact data.
    """

    name: str
    domain: str
    licence: str
    origin: str
    n_documents: int
    sha256: str


@dataclass(frozen=True)
class DataSplit:
    """The partition of every document into calibration, selection and test.

    Attributes:
        split_seed: seed of the partition hash.
        test_fraction / selection_fraction: probability that a document is test / selection.
        sources: the sources split.
        calibration / selection / test: ``"source:key"`` of each document in the role, sorted; disjoint.
        grouped_documents: documents that took the role of another document of their content group
            (same words, or nested in it: :mod:`~autocompress_opt.data.overlap`).
        content_checked: whether the documents were grouped by content and held-out rows are checked
            for shared n-grams (False above :data:`CONTENT_CHECK_MAX_DOCUMENTS` documents).
    """

    split_seed: int
    test_fraction: float
    selection_fraction: float
    sources: tuple[SourceInfo, ...]
    calibration: tuple[str, ...] = field(repr=False)
    selection: tuple[str, ...] = field(repr=False)
    test: tuple[str, ...] = field(repr=False)
    grouped_documents: int = 0
    content_checked: bool = True

    def documents(self, role: str) -> tuple[str, ...]:
        """Documents of ``role`` (one of :data:`ROLES`)."""
        check_choice(role, "role", ROLES)
        return {"calibration": self.calibration, "selection": self.selection, "test": self.test}[role]

    @property
    def assignment_sha256(self) -> str:
        """Fingerprint of the whole partition: equal digests mean the same documents in each role."""
        return _digest("calibration", *self.calibration, "selection", *self.selection, "test", *self.test)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record (the document lists are summarised by their counts and digest)."""
        return {
            "split_seed": self.split_seed,
            "test_fraction": self.test_fraction,
            "selection_fraction": self.selection_fraction,
            "sources": [vars(s).copy() for s in self.sources],
            **{f"n_{role}_documents": len(self.documents(role)) for role in ROLES},
            "rule": SPLIT_RULE,
            "ngram_tokens": _overlap.NGRAM_TOKENS,
            "grouped_documents": self.grouped_documents,
            "content_checked": self.content_checked,
            "assignment_sha256": self.assignment_sha256,
        }


def data_split(
    sources: Sequence[str | TextSource] | None = None,
    *,
    split_seed: int = DEFAULT_SPLIT_SEED,
    test_fraction: float = TEST_FRACTION,
    selection_fraction: float = SELECTION_FRACTION,
) -> DataSplit:
    """Partition the documents of ``sources`` (default :data:`DEFAULT_SOURCES`) by document.

    Pure: the same data and ``split_seed`` give the same split; see the module doc for the rule.
    """
    return _split(_resolve_sources(sources), split_seed, test_fraction, selection_fraction)


def _split(
    sources: Sequence[TextSource], split_seed: int, test_fraction: float, selection_fraction: float
) -> DataSplit:
    check_fraction(test_fraction, "test_fraction", one=False)
    check_fraction(selection_fraction, "selection_fraction", one=False)
    check_int(split_seed, "split_seed", minimum=None)
    if test_fraction + selection_fraction >= 1:
        raise ConfigError(
            f"test_fraction={test_fraction} + selection_fraction={selection_fraction} leave no calibration "
            "documents; their sum must be below 1"
        )
    infos, docs, role_ids = [], [], []
    for source in sources:
        keys = source.keys()
        infos.append(
            SourceInfo(source.name, source.domain, source.licence, source.origin(), len(keys), source.content_sha256())
        )
        docs += [f"{source.name}:{key}" for key in keys]
        role_ids += list(source.role_ids())
    checked = len(docs) <= CONTENT_CHECK_MAX_DOCUMENTS
    if not checked:
        warnings.warn(
            f"the split's {len(docs):,} documents are more than CONTENT_CHECK_MAX_DOCUMENTS="
            f"{CONTENT_CHECK_MAX_DOCUMENTS:,}: documents nested in others are not grouped and held-out rows "
            "are not checked for text shared with calibration (identical documents still share a role)",
            stacklevel=3,
        )
    representatives = _content_representatives(sources) if checked else list(range(len(docs)))
    roles: dict[str, list[str]] = {role: [] for role in ROLES}
    for doc, representative in zip(docs, representatives):
        u = _unit(split_seed, *role_ids[representative])  # a group's role is its representative's
        role = "test" if u < test_fraction else "selection" if u < test_fraction + selection_fraction else "calibration"
        roles[role].append(doc)
    return DataSplit(
        split_seed,
        float(test_fraction),
        float(selection_fraction),
        tuple(infos),
        calibration=tuple(sorted(roles["calibration"])),
        selection=tuple(sorted(roles["selection"])),
        test=tuple(sorted(roles["test"])),
        grouped_documents=sum(i != r for i, r in enumerate(representatives)),
        content_checked=checked,
    )


_WORDS_CACHE_SIZE = 8  # sources' words kept per process (the built-in ones: about 10 MB each)
_WORDS: dict[tuple[str, str, str], tuple[_overlap.DocumentWords, ...]] = {}
_GROUPS: dict[tuple[tuple[str, str], ...], list[int]] = {}
_INDEXES: dict[tuple[object, ...], _overlap.NgramIndex] = {}


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """``value`` stored under ``key`` in a per-process cache of at most :data:`_WORDS_CACHE_SIZE` entries."""
    cache[key] = value
    while len(cache) > _WORDS_CACHE_SIZE:
        cache.pop(next(iter(cache)))
    return value


def _document_words(source: TextSource, tokenizer: Any = None) -> tuple[_overlap.DocumentWords, ...]:
    """:class:`~autocompress_opt.data.overlap.DocumentWords` of every document, in key order: of the
    text as read, or with ``tokenizer`` as the model sees it (they differ only for a chat source)."""
    key = _words_key(source, tokenizer)
    if key not in _WORDS:
        read = source.read if key[2] == "null" else lambda k: source.text(k, tokenizer)
        _remember(_WORDS, key, tuple(_overlap.DocumentWords.of(read(k)) for k in source.keys()))  # noqa: SIM118 (a TextSource, not a dict)
    return _WORDS[key]


def _words_key(source: TextSource, tokenizer: Any) -> tuple[str, str, str]:
    """What a source's words depend on: its name, its content and how ``tokenizer`` renders it."""
    rendering = source.rendering(tokenizer) if tokenizer is not None else None
    return source.name, source.content_sha256(), json.dumps(rendering, sort_keys=True, default=str)


def _content_representatives(sources: Sequence[TextSource]) -> list[int]:
    """For each document of ``sources`` (in source, then key order), the index of the document whose
    role it takes (:func:`~autocompress_opt.data.overlap.content_groups`)."""
    key = tuple((s.name, s.content_sha256()) for s in sources)
    if key not in _GROUPS:
        words = [w for s in sources for w in _document_words(s)]
        _remember(_GROUPS, key, _overlap.content_groups(words))
    return _GROUPS[key]


def _overlap_index(
    split: DataSplit, role: str, sources: Sequence[TextSource], tokenizer: Any
) -> _overlap.NgramIndex | None:
    """The n-grams that rows of ``role`` must not share: those of the calibration text for selection
    rows, of the calibration and selection text for test rows (None for calibration rows)."""
    against = _CHECKED_AGAINST[role]
    if not against or not split.content_checked:
        return None
    key = (split.assignment_sha256, role, *(_words_key(s, tokenizer) for s in sources))
    if key not in _INDEXES:
        found = {s.name: dict(zip(s.keys(), _document_words(s, tokenizer))) for s in sources}
        held = [doc.split(":", 1) for r in against for doc in split.documents(r)]
        _remember(_INDEXES, key, _overlap.NgramIndex([found[name][k].grams for name, k in held]))
    return _INDEXES[key]


def held_text_index(
    sources: Sequence[str | TextSource] | None = None, *, split_seed: int = DEFAULT_SPLIT_SEED
) -> _overlap.NgramIndex:
    """The n-grams of the calibration and selection text of ``sources`` (default
    :data:`DEFAULT_SOURCES`) under the split of ``split_seed``: the index test rows are checked
    against, for other held-out text (the evaluation tasks' items) to be checked the same way.
    Cached per process; raises :class:`ConfigError` when the split is too large to be checked."""
    resolved = _resolve_sources(sources)
    split = _split(resolved, split_seed, TEST_FRACTION, SELECTION_FRACTION)
    index = _overlap_index(split, "test", resolved, None)
    if index is None:
        raise ConfigError(
            f"the split of {len(split.calibration) + len(split.selection) + len(split.test):,} documents is above "
            f"CONTENT_CHECK_MAX_DOCUMENTS={CONTENT_CHECK_MAX_DOCUMENTS:,}: its text is not indexed for n-gram checks"
        )
    return index


# --------------------------------------------------------------------- batches
@dataclass(frozen=True)
class TextBatches:
    """Token rows for one role and domain, with the record of where they came from.

    Attributes:
        tokens: ``(n_samples, seq_len)`` int64 token ids.
        role: one of :data:`ROLES`.
        domain: ``code``, ``prose``, ``user`` or ``mixed`` (rows of each group interleaved).
        seed: the sampling seed.
        split: the partition the documents came from.
        documents: ``"source:key"`` of every document that contributed, in order of first use.
        row_documents: for each row, the documents its tokens come from (row identities: tests trace
            them to show that no document crosses roles).
        tokenizer: the tokenizer's class, fingerprint and vocabulary size
            (:func:`~autocompress_opt.data.tokens.tokenizer_label`: not the folder it was read from).
        weights: the groups' row weights (``{source: weight}`` with user weights, else by domain).
        renderings: ``(source, how its documents became text)`` for each source that renders them
            (a chat source: the template, and whether its default system prompt was removed).
        rows_dropped: rows of the role left out because they share an n-gram with the text of a
            role they are checked against (:data:`_CHECKED_AGAINST`; test rows: calibration and
            selection text); the rows kept were cut on after them.
    """

    tokens: torch.Tensor = field(repr=False)
    role: str
    domain: str
    seed: int
    split: DataSplit
    documents: tuple[str, ...] = field(repr=False)
    tokenizer: str
    row_documents: tuple[tuple[str, ...], ...] = field(repr=False, default=())
    weights: tuple[tuple[str, float], ...] = ()
    renderings: tuple[tuple[str, dict[str, Any]], ...] = ()
    rows_dropped: int = 0

    @property
    def n_samples(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def rows_by_source(self) -> dict[str, int]:
        """How many rows hold tokens of each source (a row spanning two sources counts for both)."""
        counts = {info.name: 0 for info in self.split.sources}
        for docs in self.row_documents:
            for name in {d.split(":", 1)[0] for d in docs}:
                counts[name] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record every result can embed (no tensors, document list as a digest)."""
        return {
            "role": self.role,
            "domain": self.domain,
            "seed": self.seed,
            "n_samples": self.n_samples,
            "seq_len": self.seq_len,
            "n_tokens": self.n_samples * self.seq_len,
            "n_documents": len(self.documents),
            "documents_sha256": _digest(*self.documents),
            "rows_by_source": self.rows_by_source(),
            "weights": dict(self.weights),
            **({"rendering": dict(self.renderings)} if self.renderings else {}),
            "overlap_check": {
                "ngram_tokens": _overlap.NGRAM_TOKENS,
                "against": list(_CHECKED_AGAINST[self.role]) if self.split.content_checked else [],
                "rows_dropped": self.rows_dropped,
            },
            "tokenizer": self.tokenizer,
            "split": self.split.to_dict(),
        }


def text_batches(
    tokenizer: Any,
    *,
    role: str,
    n_samples: int,
    seq_len: int,
    seed: int,
    domain: str = "mixed",
    sources: Sequence[str | TextSource] | None = None,
    weights: Sequence[float] | None = None,
    split_seed: int = DEFAULT_SPLIT_SEED,
    test_fraction: float = TEST_FRACTION,
    selection_fraction: float = SELECTION_FRACTION,
    token_cache: str | Path | bool = True,
) -> TextBatches:
    """``n_samples`` rows of ``seq_len`` tokens of ``role`` text, with their record.

    A user's ``--data`` specs: :func:`autocompress_opt.data.user.data_batches`. ``weights``: one per source, with
    ``domain="mixed"`` only: rows are shared by source in those proportions. Without weights,
    ``domain="mixed"`` shares rows equally among the domains present (built-ins: ``ceil(n/2)`` code
    rows and ``floor(n/2)`` prose rows, interleaved).
    Deterministic: the same data, tokenizer and arguments give identical tensors.
    ``token_cache``: where documents' token ids are kept between calls and processes
    (:mod:`~autocompress_opt.data.tokens`): True (default) the per-user folder
    :data:`~autocompress_opt.data.tokens.DEFAULT_TOKEN_CACHE`, a path that folder, False this process
    only. Cached or not, the tokens are identical.
    Raises :class:`ConfigError` for an invalid argument, a source that is not available, a
    domain with no selected source, or too little text for the request (saying how much there is).
    """
    check_choice(role, "role", ROLES)
    check_choice(domain, "domain", (*DOMAINS, "mixed"))
    check_int(n_samples, "n_samples")
    check_int(seq_len, "seq_len", minimum=2)
    check_int(seed, "seed", minimum=None)
    resolved = _resolve_sources(sources)
    split = _split(resolved, split_seed, test_fraction, selection_fraction)
    groups = _groups(resolved, domain, weights)
    by_name = {s.name: s for s in resolved}
    store = _tokens.TokenStore(tokenizer, _token_folder(token_cache))
    held_out = _overlap_index(split, role, resolved, tokenizer)
    rows: list[list[tuple[list[int], tuple[str, ...]]]] = []
    used: list[str] = []
    dropped = 0
    for (label, members, _), count in zip(groups, _shares(n_samples, [w for _, _, w in groups])):
        if not count:
            rows.append([])
            continue
        docs = [d for d in split.documents(role) if d.split(":", 1)[0] in members]
        group = _group_rows(store, docs, by_name, count, seq_len, seed, role, label, held_out)
        rows.append(group.rows)
        used += group.documents
        dropped += group.dropped
    store.save()
    if dropped:
        _log.info(
            "%d %s rows dropped: they share %d consecutive words with %s text",
            dropped,
            role,
            _overlap.NGRAM_TOKENS,
            " or ".join(_CHECKED_AGAINST[role]),
        )
    ordered = _interleave(rows)
    tokens = torch.tensor([r for r, _ in ordered], dtype=torch.long)
    name = _tokens.tokenizer_label(tokenizer)
    return TextBatches(
        tokens,
        role,
        domain,
        seed,
        split,
        tuple(used),
        name,
        tuple(d for _, d in ordered),
        tuple((label, float(w)) for label, _, w in groups),
        _renderings(resolved, tokenizer),
        dropped,
    )


def _renderings(sources: Sequence[TextSource], tokenizer: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    found = ((s.name, s.rendering(tokenizer)) for s in sources)
    return tuple((name, r) for name, r in found if r is not None)


def _token_folder(token_cache: str | Path | bool) -> str | Path | None:
    if token_cache is True:
        return _tokens.DEFAULT_TOKEN_CACHE  # read when called: tests point it elsewhere
    if token_cache is False:
        return None
    if not isinstance(token_cache, (str, Path)) or not str(token_cache):
        raise ConfigError(f"token_cache must be True, False or a folder path, got {token_cache!r}")
    return token_cache


def _groups(
    sources: Sequence[TextSource], domain: str, weights: Sequence[float] | None
) -> list[tuple[str, frozenset[str], float]]:
    """``(label, source names, weight)`` of each group rows are shared among."""
    if weights is not None:
        if domain != "mixed":
            raise ConfigError(f"source weights need domain='mixed', got domain={domain!r}")
        if len(weights) != len(sources):
            raise ConfigError(f"{len(weights)} weights given for {len(sources)} sources; give one per source")
        for w in weights:
            check_number(w, "data weight")
        return [(s.name, frozenset({s.name}), float(w)) for s, w in zip(sources, weights)]
    present = [d for d in DOMAINS if any(s.domain == d for s in sources)]
    if domain != "mixed":
        present = [domain]
    return [(d, frozenset(s.name for s in sources if s.domain == d), 1.0) for d in present]


def _shares(n: int, weights: Sequence[float]) -> list[int]:
    """``n`` split in proportion to ``weights`` by largest remainder, ties to the earlier entry."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))[: n - sum(counts)]:
        counts[i] += 1
    return counts


def calibration_batches(
    tokenizer: Any, *, n_samples: int, seq_len: int, seed: int, domain: str = "mixed", **kwargs: Any
) -> torch.Tensor:
    """``(n_samples, seq_len)`` int64 calibration tokens; see :func:`text_batches` for the contract."""
    return text_batches(
        tokenizer, role="calibration", n_samples=n_samples, seq_len=seq_len, seed=seed, domain=domain, **kwargs
    ).tokens


def test_batches(
    tokenizer: Any, *, n_samples: int, seq_len: int, seed: int, domain: str = "mixed", **kwargs: Any
) -> torch.Tensor:
    """``(n_samples, seq_len)`` int64 test tokens, never from a calibration or selection document."""
    return text_batches(
        tokenizer, role="test", n_samples=n_samples, seq_len=seq_len, seed=seed, domain=domain, **kwargs
    ).tokens


test_batches.__test__ = False  # type: ignore[attr-defined]  # pytest: not a test despite the name


@dataclass(frozen=True)
class _GroupRows:
    """One group's rows (token ids, documents), the documents used in order, and the rows dropped."""

    rows: list[tuple[list[int], tuple[str, ...]]]
    documents: list[str]
    dropped: int


def _group_rows(
    store: _tokens.TokenStore,
    docs: Sequence[str],
    sources: dict[str, TextSource],
    n_rows: int,
    seq_len: int,
    seed: int,
    role: str,
    label: str,
    held_out: _overlap.NgramIndex | None = None,
) -> _GroupRows:
    """Rows of one group, each with its documents, built by the piece-per-pass scheme of the module
    doc; with ``held_out``, a row sharing one of its n-grams is dropped and the next one cut instead."""
    if not docs:
        raise ConfigError(
            f"no {label} documents in the {role} split; add {label} text "
            f"(built-in sources: {', '.join(n for n, s in text_sources().items())}; or --data)"
        )
    tokenizer = store.tokenizer
    bos = _bos_id(tokenizer)
    body = seq_len - (bos is not None)
    separator = _tokens.encode(tokenizer, _PIECE_SEPARATOR)
    order = sorted(docs, key=lambda d: _digest(seed, "order", d))
    stream: list[int] = []
    starts: list[int] = []  # stream offset where each appended piece begins
    owners: list[str] = []  # ... and its document

    def appended() -> Iterator[None]:
        """Appends the next piece to the stream at each step (pass k: piece k of every document)."""
        pieces: dict[str, list[list[int]]] = {}
        for round_ in itertools.count():
            progressed = False
            for doc in order:
                if doc not in pieces:
                    pieces[doc] = _pieces(store, sources, doc, seq_len, seed)
                if round_ < len(pieces[doc]):
                    starts.append(len(stream))
                    owners.append(doc)
                    stream.extend(pieces[doc][round_] + separator)
                    progressed = True
                    yield None
            if not progressed:
                return

    growing = appended()
    head = [] if bos is None else [bos]
    rows: list[tuple[list[int], tuple[str, ...]]] = []
    dropped = 0
    for i in itertools.count():
        if len(rows) == n_rows:
            break
        more = True
        while more and len(stream) < (i + 1) * body:
            more = next(growing, False) is None
        if len(stream) < (i + 1) * body:
            shared = f" ({dropped} rows of it dropped for sharing text with another role)" if dropped else ""
            raise ConfigError(
                f"the {role} {label} text holds {len(stream):,} tokens from {len(docs)} documents{shared}; "
                f"{n_rows} rows of {seq_len} need {n_rows * body:,}: ask for fewer or shorter rows, or give more data"
            )
        ids = stream[i * body : (i + 1) * body]
        if held_out is not None and held_out.shares(tokenizer.decode(ids)):
            dropped += 1
            continue
        first, last = bisect.bisect_right(starts, i * body) - 1, bisect.bisect_left(starts, (i + 1) * body)
        rows.append((head + ids, tuple(dict.fromkeys(owners[first:last]))))
    return _GroupRows(rows, list(dict.fromkeys(owners)), dropped)


def _pieces(
    store: _tokens.TokenStore, sources: dict[str, TextSource], doc: str, size: int, seed: int
) -> list[list[int]]:
    """A document's tokens cut into ``size``-token pieces, in a hashed (seeded) order."""
    source, key = doc.split(":", 1)
    ids = store.ids(source, sources[source].text(key, store.tokenizer))
    chunks = [ids[i : i + size] for i in range(0, len(ids), size)]
    ranks = sorted(range(len(chunks)), key=lambda i: _digest(seed, "piece", doc, i))
    return [chunks[i] for i in ranks]


def _bos_id(tokenizer: Any) -> int | None:
    """The BOS id when the tokenizer prepends one by default (Gemma, Llama-2), else None (SmolLM2, Qwen2)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return int(bos) if ids and ids[0] == bos else None


def _interleave(groups: Sequence[Sequence[Any]]) -> list[Any]:
    """Round-robin over ``groups`` (code, prose, code, ...), then the rest of the longer ones."""
    out: list[Any] = []
    for i in range(max(len(g) for g in groups)):
        out += [g[i] for g in groups if i < len(g)]
    return out


# ------------------------------------------------------------------ validation
def check_token_ids(tokens: Any, name: str = "tokens", vocab_size: int | None = None) -> torch.Tensor:
    """Return ``tokens`` when it is a batch of token ids, else raise :class:`ConfigError` naming ``name``.

    A batch of token ids is an int64 tensor ``(n_samples, seq_len)`` with at least one row of at
    least 2 tokens (a next-token prediction needs two) and, given ``vocab_size``, every id in
    ``[0, vocab_size)``. The one check of token batches: quality metrics and importance both call it.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        got = (
            f"{tokens.dtype} tensor of shape {tuple(tokens.shape)}"
            if isinstance(tokens, torch.Tensor)
            else type(tokens).__name__
        )
        raise ConfigError(f"{name} must be a LongTensor: an (n_samples, seq_len) int64 tensor, got {got}")
    if tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise ConfigError(f"{name} need at least 1 row of 2 tokens, got shape {tuple(tokens.shape)}")
    if vocab_size is not None:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            raise ConfigError(f"token ids must lie in [0, {vocab_size}), got values from {low} to {high}")
    return tokens
