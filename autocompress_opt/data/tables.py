"""A user's rows (JSONL, JSON, parquet, ``datasets``) as a :class:`~autocompress_opt.data.textdata.TextSource`.

Every row source is read the same way (:class:`RowsSource`): one pass over the rows turns each into
its document text (:class:`~autocompress_opt.data.rows.RowReader`: a text field, named fields, a
chat), hashes it, and adds it to the source's digest; what the pass found is a
:class:`~autocompress_opt.data.file_index.RowIndex`. A document's key is its row's line (JSONL) or
row number, zero-padded to :data:`KEY_DIGITS` so keys sort as rows do and never change when rows are
appended; its **role** is hashed from its text (:meth:`RowsSource.role_id`), so appending rows never
moves an earlier row to another role (unless the new row holds it: rows nested in others take their
role, :mod:`~autocompress_opt.data.overlap`) and identical rows share one.

A JSONL file is streamed: the pass holds one line at a time, the index (about 40 bytes a row) is kept
on disk by the file's (path, size, mtime) for every later process, and a document is read back by
seeking to its line. A malformed line stops the pass with one line naming the file, the line and
what is wrong; a last line cut short (no newline at its end) says the file looks truncated.
"""

from __future__ import annotations

import functools
import hashlib
import json
from array import array
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.data.chat import TEMPLATES, chat_rendering, render_chat
from autocompress_opt.data.file_index import HASH_BYTES, RowIndex, cached_row_index
from autocompress_opt.data.rows import RowReader, chat_messages
from autocompress_opt.data.textdata import TextSource
from autocompress_opt.errors import ConfigError, check_choice, one_line

__all__ = [
    "KEY_DIGITS",
    "USER_DOMAIN",
    "DatasetRowsSource",
    "JsonRowsSource",
    "JsonlSource",
    "ParquetSource",
    "RowsSource",
]

USER_DOMAIN = "user"
KEY_DIGITS = 9  # keys of up to a billion rows sort as the rows do


class RowsSource(TextSource):
    """Rows of a table, one document each (module doc). Subclasses give :meth:`_scan` (every row
    with its line or number and position) and :meth:`_row` (one row by position)."""

    domain, licence = USER_DOMAIN, "user-supplied"
    unit = "row"  # how a row is named in messages: "line 12" (JSONL) or "row 12"

    def __init__(self, name: str, where: str, reader: RowReader, template: str = "model") -> None:
        # ":" separates a document id's source from its key ("rows.jsonl:000000012"): never in a name
        self.name, self.where, self.reader = name.replace(":", "_"), where, reader
        self.template = check_choice(template, f"{where}: #template", TEMPLATES)

    # ----------------------------------------------------------------- the pass
    @functools.cached_property
    def index(self) -> RowIndex:
        return self._build_index()

    def _build_index(self) -> RowIndex:
        return index_rows(self._scan(), self.reader, self.where, self.unit)

    def _scan(self) -> Iterator[tuple[int, int, Any]]:
        """``(line or row number, position for :meth:`_row`, row)`` of every row, in order."""
        raise NotImplementedError

    def _row(self, position: int) -> Any:
        raise NotImplementedError

    def validate(self) -> None:
        """Read every row once (or its cached index): raises :class:`ConfigError` for a malformed one."""
        if not len(self.index):
            raise ConfigError(
                f"{self.where}: no row holds text ({self.index.skipped} rows, fields {', '.join(self.index.fields)})"
            )

    # ----------------------------------------------------------- TextSource
    def available(self) -> bool:
        return True

    def install_hint(self) -> str:
        return ""

    def origin(self) -> str:
        skipped = f", {self.index.skipped} rows without text skipped" if self.index.skipped else ""
        kind = "chat" if self.index.chat else "text"
        return f"{self.where} ({kind} from field {'+'.join(self.index.fields)}, {len(self.index)} rows{skipped})"

    @functools.cached_property
    def _reader(self) -> RowReader:
        return RowReader(self.where, self.index.fields)  # the fields the pass chose

    @functools.cached_property
    def _keys(self) -> tuple[str, ...]:
        return tuple(f"{int(line):0{KEY_DIGITS}d}" for line in self.index.lines)

    def keys(self) -> tuple[str, ...]:
        return self._keys

    def _position(self, key: str) -> int:
        i = int(np.searchsorted(self.index.lines, int(key)))
        if i >= len(self.index) or int(self.index.lines[i]) != int(key):
            raise KeyError(f"{self.name} has no row {key}")
        return i

    def read(self, key: str) -> str:
        i = self._position(key)
        found = self._reader.text(self._row(int(self.index.offsets[i])), f"{self.unit} {int(key)}")
        if found is None:
            raise ConfigError(f"{self.where} row {int(key)} changed since it was indexed; run again")
        return found[0]

    def text(self, key: str, tokenizer: Any) -> str:
        if not self.index.chat:
            return self.read(key)
        return render_chat(chat_messages(self.read(key)), tokenizer, self.template)

    def rendering(self, tokenizer: Any) -> dict[str, Any] | None:
        """How chat documents become text for ``tokenizer`` (None: plain text documents)."""
        return chat_rendering(tokenizer, self.template) if self.index.chat else None

    def role_id(self, key: str) -> tuple[object, ...]:
        return ("text", bytes(self.index.hashes[self._position(key)]).hex())

    def role_ids(self) -> Iterator[tuple[object, ...]]:
        flat = self.index.hashes.tobytes()
        return (("text", flat[i : i + HASH_BYTES].hex()) for i in range(0, len(flat), HASH_BYTES))

    def content_sha256(self) -> str:
        return self.index.sha256


def index_rows(rows: Iterable[tuple[int, int, Any]], reader: RowReader, where: str, unit: str = "row") -> RowIndex:
    """The one pass (module doc) over ``(line, position, row)``: texts hashed, digest taken; ``unit``
    names a row in messages ("line", "row")."""
    lines, offsets, hashes = array("q"), array("q"), bytearray()  # ~40 bytes a row, however many rows
    digest = hashlib.sha256()
    chosen: RowReader | None = None
    chat: bool | None = None
    skipped = 0
    seen: set[str] = set()  # the named fields some row holds
    for line, position, row in rows:
        label = f"{unit} {line}"
        if chosen is None:
            if not isinstance(row, Mapping):
                reader.text(row, label)  # raises: not an object
            chosen = reader.choose(list(row), label, schema=False)
        seen.update(f for f in chosen.fields if f in row)
        found = chosen.text(row, label)
        if found is None:
            skipped += 1
            continue
        text, is_chat = found
        if chat is None:
            chat = is_chat
        elif chat != is_chat:
            kinds = ("plain text", "a chat")
            raise ConfigError(
                f"{where} {label}: holds {kinds[is_chat]} where earlier rows hold {kinds[chat]}; "
                "a file's rows must all be text or all chats (name the fields with #field=...)"
            )
        encoded = text.encode("utf-8", errors="surrogatepass")
        key = f"{line:0{KEY_DIGITS}d}"
        digest.update(key.encode() + b"\x1f" + encoded + b"\x1e")
        hashes += hashlib.sha256(encoded).digest()[:HASH_BYTES]
        lines.append(line)
        offsets.append(position)
    never = [f for f in (chosen.fields if chosen else ()) if f not in seen]
    if never:
        raise ConfigError(f"{where}: no row has the field {never[0]!r}; name the fields its rows hold with #field=a,b")
    return RowIndex(
        np.frombuffer(lines, dtype=np.int64).copy(),
        np.frombuffer(offsets, dtype=np.int64).copy(),
        np.frombuffer(bytes(hashes), dtype=np.uint8).reshape(-1, HASH_BYTES),
        digest.hexdigest(),
        bool(chat),
        (chosen or reader).fields,
        skipped,
    )


class JsonlSource(RowsSource):
    """A JSON Lines file, streamed (module doc); key = the row's line number."""

    unit = "line"

    def __init__(self, path: Path, reader: RowReader, template: str = "model") -> None:
        super().__init__(path.name, str(path), reader, template)
        self.path = path

    def _build_index(self) -> RowIndex:
        index, _ = cached_row_index(self.path, (self.reader.fields,), lambda: super(JsonlSource, self)._build_index())
        return index

    def _scan(self) -> Iterator[tuple[int, int, Any]]:
        offset = 0
        with open(self.path, "rb") as handle:
            for line, raw in enumerate(handle, start=1):
                start, offset = offset, offset + len(raw)
                if raw.strip():
                    yield line, start, self._parse(raw, line, last=not raw.endswith(b"\n"))

    def _parse(self, raw: bytes, line: int, last: bool = False) -> Any:
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            why = getattr(error, "msg", None) or "not UTF-8 text"
            column = f": column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
            cut = " (its last line has no newline: the file looks truncated; complete or delete that line)"
            raise ConfigError(
                f"{self.path} line {line}: not a JSON object ({why}{column}){cut if last else ''}; "
                'each line must be one JSON object such as {"text": "..."}'
            ) from None

    def _row(self, position: int) -> Any:
        with open(self.path, "rb") as handle:  # ~10 µs: cheaper than a tokeniser's pass over the row
            handle.seek(position)
            return self._parse(handle.readline(), -1)


class JsonRowsSource(RowsSource):
    """A ``.json`` file holding one array of row objects (read whole: JSON arrays are not streamed);
    key = the row's number, from 1."""

    def __init__(self, path: Path, rows: list[Any], reader: RowReader, template: str = "model") -> None:
        super().__init__(path.name, str(path), reader, template)
        self._rows = rows

    def _scan(self) -> Iterator[tuple[int, int, Any]]:
        for i, row in enumerate(self._rows):
            yield i + 1, i, row

    def _row(self, position: int) -> Any:
        return self._rows[position]


class DatasetRowsSource(RowsSource):
    """Rows of a ``datasets.Dataset`` (parquet, a ``save_to_disk`` folder, the Hub), Arrow-backed and
    memory-mapped; key = the row's number, from 1."""

    def __init__(self, name: str, where: str, dataset: Any, reader: RowReader, template: str = "model") -> None:
        super().__init__(name, where, reader.choose(list(dataset.column_names)), template)
        self._rows = dataset.select_columns(list(self.reader.fields))

    def _scan(self) -> Iterator[tuple[int, int, Any]]:
        position = 0
        for batch in self._rows.iter(batch_size=1024):
            columns = list(batch)
            for values in zip(*(batch[c] for c in columns)):
                yield position + 1, position, dict(zip(columns, values))
                position += 1

    def _row(self, position: int) -> Any:
        return self._rows[position]


class ParquetSource(RowsSource):
    """A parquet file read with pyarrow a row group at a time (only the named fields' columns);
    key = the row's number, from 1. Its index is kept on disk like a JSONL file's."""

    def __init__(self, path: Path, reader: RowReader, template: str = "model") -> None:
        import pyarrow.parquet as pq

        try:
            self._file = pq.ParquetFile(path)
        except Exception as error:  # pyarrow raises ArrowInvalid, OSError...: all mean "not parquet"
            raise ConfigError(f"{path}: not a readable parquet file ({one_line(str(error))})") from None
        columns = list(self._file.schema_arrow.names)
        super().__init__(path.name, str(path), reader.choose(columns), template)
        self.path = path
        sizes = [self._file.metadata.row_group(g).num_rows for g in range(self._file.num_row_groups)]
        self._starts = np.cumsum([0, *sizes])
        self._group: tuple[int, list[dict[str, Any]]] | None = None

    def _build_index(self) -> RowIndex:
        index, _ = cached_row_index(
            self.path, ("parquet", self.reader.fields), lambda: super(ParquetSource, self)._build_index()
        )
        return index

    def _scan(self) -> Iterator[tuple[int, int, Any]]:
        position = 0
        for batch in self._file.iter_batches(batch_size=1024, columns=list(self.reader.fields)):
            for row in batch.to_pylist():
                yield position + 1, position, row
                position += 1

    def _row(self, position: int) -> Any:
        group = int(np.searchsorted(self._starts, position, side="right")) - 1
        if self._group is None or self._group[0] != group:
            table = self._file.read_row_group(group, columns=list(self.reader.fields))
            self._group = (group, table.to_pylist())  # one row group in memory at a time
        return self._group[1][position - int(self._starts[group])]
