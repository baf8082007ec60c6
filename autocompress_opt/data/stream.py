"""A token stream over one role's documents: rows read in order, no token repeated until the text runs out.

:func:`data_stream` (a user's ``--data`` specs, or the built-in sources) returns a
:class:`TokenStream`; :meth:`TokenStream.take` cuts the next rows of ``seq_len`` tokens from it.
Where :func:`~autocompress_opt.data.textdata.text_batches` draws a fixed number of rows at once,
a stream is read for as long as a run needs (distillation: :mod:`autocompress_opt.recover.distill`)
and holds only the current document's tokens of each group, however large the corpus.

**Groups.** Rows are shared among groups as in ``text_batches``: the domains present, equally, or
one group per source with ``weights``. Row ``k`` goes to the group whose row count is furthest below
its share, ``(k + 1)·w_g/Σw − n_g`` largest (ties to the earlier group): two equal groups alternate.

**Order.** Within a group, pass ``p`` visits the role's documents in an order hashed from
``(seed, p, document)``; each document is tokenised when it is reached, its ids followed by the
``"\\n\\n"`` separator, and rows are cut from that concatenation (a row may span documents; it is
led by BOS when the tokenizer adds one). A document's every token is read once per pass, so no
token position repeats until the group's text is used up; only then does pass ``p + 1`` begin, in
a new order, with a :class:`TextRepeatsWarning` on the first repeat (every pass is counted in
:meth:`TokenStream.summary`).

**Position.** :meth:`TokenStream.position` is a small JSON-safe record (per group: pass, document,
token offset, rows and tokens read); :meth:`TokenStream.seek` restores it, tokenising only the
document at the cursor, so a reader stopped and resumed reads exactly the rows an uninterrupted one
does. Everything is a pure function of the data, the tokenizer and the seeds.

A stream's documents are those of its role in the split, roles by content included; its rows are
not checked for n-grams shared with other roles as held-out rows of ``text_batches`` are (a stream
reads calibration text, for distillation).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from autocompress_opt.data.textdata import (
    _PIECE_SEPARATOR,
    DEFAULT_SPLIT_SEED,
    ROLES,
    SELECTION_FRACTION,
    TEST_FRACTION,
    DataSplit,
    TextSource,
    _bos_id,
    _digest,
    _groups,
    _renderings,
    _resolve_sources,
    _split,
)
from autocompress_opt.data.tokens import encode as _encode  # uncached: a stream holds one document per group
from autocompress_opt.data.tokens import tokenizer_label
from autocompress_opt.data.user import resolve_data
from autocompress_opt.errors import ConfigError, check_choice, check_int

__all__ = ["StreamRows", "TextRepeatsWarning", "TokenStream", "data_stream"]

_POSITION_FORMAT = "autocompress-token-stream/1"


class TextRepeatsWarning(UserWarning):
    """A stream used up its group's text and began reading it again (a new pass, in a new order)."""


@dataclass(frozen=True)
class StreamRows:
    """Rows read from a stream, with where each came from.

    Attributes:
        tokens: ``(n_rows, seq_len)`` int64 token ids.
        spans: for each row, ``(document, start, end)`` of the document tokens it holds (token
            offsets into the document's ids; separators and BOS are no document's tokens).
        passes: for each row, the pass (0-based) of its group that its last token came from.
    """

    tokens: torch.Tensor = field(repr=False)
    spans: tuple[tuple[tuple[str, int, int], ...], ...] = field(repr=False)
    passes: tuple[int, ...] = field(repr=False)


@dataclass
class _Cursor:
    """Where a group's reader stands: ``document`` indexes pass ``pass_``'s order, ``offset`` that
    document's ids-plus-separator; ``tokens`` counts document tokens read (all passes)."""

    pass_: int = 0
    document: int = 0
    offset: int = 0
    rows: int = 0
    tokens: int = 0
    pass_tokens: int | None = None  # document tokens in one whole pass, known once one was read


class _Group:
    """One group's documents read pass after pass, one document's tokens in memory at a time."""

    def __init__(
        self,
        label: str,
        documents: Sequence[str],
        sources: Mapping[str, TextSource],
        tokenizer: Any,
        seed: int,
        role: str,
        quiet: bool,
    ) -> None:
        self.label, self.documents, self.sources = label, tuple(documents), sources
        self.tokenizer, self.seed, self.role, self.quiet = tokenizer, seed, role, quiet
        self.separator = _encode(tokenizer, _PIECE_SEPARATOR)
        self.cursor = _Cursor()
        self._order: tuple[int, list[str]] | None = None  # (pass, its document order)
        self._unit: tuple[str, list[int], int] | None = None  # (document, ids + separator, len(ids))

    def order(self, pass_: int) -> list[str]:
        if self._order is None or self._order[0] != pass_:
            ranked = sorted(self.documents, key=lambda d: _digest(self.seed, "stream", pass_, d))
            self._order = (pass_, ranked)
        return self._order[1]

    def _current(self) -> tuple[str, list[int], int]:
        doc = self.order(self.cursor.pass_)[self.cursor.document]
        if self._unit is None or self._unit[0] != doc:
            source, key = doc.split(":", 1)
            ids = _encode(self.tokenizer, self.sources[source].text(key, self.tokenizer))
            self._unit = (doc, ids + self.separator, len(ids))
        return self._unit

    def read(self, body: int) -> tuple[list[int], tuple[tuple[str, int, int], ...]]:
        """The next ``body`` tokens and the document spans they come from."""
        cursor = self.cursor
        out: list[int] = []
        spans: list[tuple[str, int, int]] = []
        while len(out) < body:
            if cursor.document == len(self.documents):
                self._next_pass()
            doc, unit, n_ids = self._current()
            take = min(body - len(out), len(unit) - cursor.offset)
            end = cursor.offset + take
            if cursor.offset < n_ids:
                spans.append((doc, cursor.offset, min(end, n_ids)))
                cursor.tokens += min(end, n_ids) - cursor.offset
            out += unit[cursor.offset : end]
            cursor.offset = end
            if end == len(unit):
                cursor.document, cursor.offset, self._unit = cursor.document + 1, 0, None
        cursor.rows += 1
        return out, tuple(spans)

    def _next_pass(self) -> None:
        cursor = self.cursor
        if cursor.pass_tokens is None:
            cursor.pass_tokens = cursor.tokens  # the first pass read every document whole
        if cursor.pass_tokens == 0:
            raise ConfigError(f"the {self.role} {self.label} documents ({len(self.documents)}) hold no tokens")
        cursor.pass_, cursor.document, cursor.offset = cursor.pass_ + 1, 0, 0
        if not self.quiet and cursor.pass_ == 1:  # once: later passes are counted in summary()
            warnings.warn(
                f"the {self.role} {self.label} text ({len(self.documents)} documents, {cursor.pass_tokens:,} tokens) "
                f"is used up after {cursor.rows:,} of its rows; pass 2 reads it again in a new order, and so on: "
                "the run repeats text (give more text with --data, or fewer steps)",
                TextRepeatsWarning,
                stacklevel=4,
            )

    def summary(self) -> dict[str, Any]:
        cursor = self.cursor
        whole = cursor.pass_tokens
        if whole is None and cursor.document == len(self.documents):
            whole = cursor.tokens  # exactly one pass, read to its end
        return {
            "passes": cursor.pass_ + 1,
            "rows": cursor.rows,
            "text_tokens": cursor.tokens,
            "n_documents": len(self.documents),
            "pass_tokens": whole,
            "epochs": cursor.tokens / whole if whole else None,
        }


class TokenStream:
    """Rows of ``seq_len`` tokens read in order from the ``role`` documents of ``sources`` (see the module doc).

    Not thread-safe (it is a reader with a position). Two streams built with the same arguments
    read identical rows; ``quiet`` only silences :class:`TextRepeatsWarning` (a sharded run's
    processes other than rank 0 each read the same stream).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        role: str,
        seq_len: int,
        seed: int,
        sources: Sequence[str | TextSource] | None = None,
        weights: Sequence[float] | None = None,
        split_seed: int = DEFAULT_SPLIT_SEED,
        test_fraction: float = TEST_FRACTION,
        selection_fraction: float = SELECTION_FRACTION,
        quiet: bool = False,
    ) -> None:
        check_choice(role, "role", ROLES)
        check_int(seq_len, "seq_len", minimum=2)
        check_int(seed, "seed", minimum=None)
        resolved = _resolve_sources(sources)
        self.role, self.seq_len, self.seed = role, seq_len, seed
        self.split: DataSplit = _split(resolved, split_seed, test_fraction, selection_fraction)
        by_name = {s.name: s for s in resolved}
        self._bos = _bos_id(tokenizer)
        self._groups: list[_Group] = []
        self._weights: list[float] = []
        for label, members, weight in _groups(resolved, "mixed", weights):
            docs = [d for d in self.split.documents(role) if d.split(":", 1)[0] in members]
            if not docs:
                raise ConfigError(
                    f"no {label} documents in the {role} split; add {label} text (--data) or drop its source"
                )
            self._groups.append(_Group(label, docs, by_name, tokenizer, seed, role, quiet))
            self._weights.append(weight)
        self.tokenizer = tokenizer_label(tokenizer)
        self.renderings = dict(_renderings(resolved, tokenizer))  # how chat sources became text

    @property
    def rows(self) -> int:
        """Rows read so far."""
        return sum(g.cursor.rows for g in self._groups)

    @property
    def passes(self) -> int:
        """Passes begun by the group that has begun the most (1: no text read twice)."""
        return max(g.cursor.pass_ + 1 for g in self._groups)

    def take(self, n_rows: int) -> StreamRows:
        """The next ``n_rows`` rows (and the stream moves past them)."""
        check_int(n_rows, "n_rows")
        body = self.seq_len - (self._bos is not None)
        head = [] if self._bos is None else [self._bos]
        rows, spans, passes = [], [], []
        for _ in range(n_rows):
            group = self._groups[self._next_group()]
            ids, where = group.read(body)
            rows.append(head + ids)
            spans.append(where)
            passes.append(group.cursor.pass_)
        return StreamRows(torch.tensor(rows, dtype=torch.long), tuple(spans), tuple(passes))

    def _next_group(self) -> int:
        total, k = sum(self._weights), self.rows
        lag = [(k + 1) * w / total - g.cursor.rows for g, w in zip(self._groups, self._weights)]
        return lag.index(max(lag))

    def position(self) -> dict[str, Any]:
        """JSON-safe cursor of every group; :meth:`seek` returns a stream built alike to it."""
        return {"format": _POSITION_FORMAT, "groups": {g.label: asdict(g.cursor) for g in self._groups}}

    def seek(self, position: Mapping[str, Any]) -> None:
        """Move to ``position`` (from :meth:`position` of a stream built with the same arguments)."""
        labels = [g.label for g in self._groups]
        groups = position.get("groups") if isinstance(position, Mapping) else None
        if not isinstance(groups, Mapping) or position.get("format") != _POSITION_FORMAT or list(groups) != labels:
            raise ConfigError(
                f"not a position of this stream (format {_POSITION_FORMAT}, groups {labels}): {position!r:.200}"
            )
        for group in self._groups:
            try:
                cursor = _Cursor(**groups[group.label])
            except TypeError:
                raise ConfigError(f"stream position of {group.label} is malformed: {groups[group.label]!r}") from None
            if not 0 <= cursor.document <= len(group.documents) or min(cursor.pass_, cursor.offset) < 0:
                raise ConfigError(f"stream position of {group.label} out of range: {groups[group.label]!r}")
            group.cursor, group._unit = cursor, None

    def record(self) -> dict[str, Any]:
        """JSON-safe identity of the stream (no position): two equal records read the same rows."""
        return {
            "kind": "stream",
            "role": self.role,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "groups": [
                {"label": g.label, "weight": w, "n_documents": len(g.documents)}
                for g, w in zip(self._groups, self._weights)
            ],
            "tokenizer": self.tokenizer,
            **({"rendering": self.renderings} if self.renderings else {}),
            "split": self.split.to_dict(),
        }

    def summary(self) -> dict[str, Any]:
        """How much has been read: rows, passes (max over groups) and, per group, passes, rows,
        document tokens read, the tokens of one whole pass once known, and the epochs that makes."""
        return {"rows": self.rows, "passes": self.passes, "groups": {g.label: g.summary() for g in self._groups}}


def data_stream(tokenizer: Any, *, data: Sequence[str] | None = None, **kwargs: Any) -> TokenStream:
    """A :class:`TokenStream` of the user's ``data`` specs (their sources and weights); without specs,
    of ``kwargs``' sources (the built-in ones by default). ``kwargs``: :class:`TokenStream`'s."""
    if not data:
        return TokenStream(tokenizer, **kwargs)
    sources, weights = resolve_data(data)
    return TokenStream(tokenizer, sources=sources, weights=weights, **kwargs)
