"""A user's own text as :class:`~autocompress_opt.data.textdata.TextSource` s: the ``--data SPEC`` of every verb.

A spec names one source and an optional weight, ``SPEC[:WEIGHT]`` (``code.jsonl:0.7``):

==================================  ==================================================================
spec                                read as
==================================  ==================================================================
``rows.jsonl`` / ``rows.json``      ``datasets`` ``json`` builder; each row is a document: its ``text``
                                    field, or its chat ``messages`` rendered with the tokenizer's chat
                                    template
``rows.parquet``                    ``datasets`` ``parquet`` builder; rows as above
a ``save_to_disk`` folder           ``datasets.load_from_disk`` (a ``DatasetDict``: its ``train`` split,
                                    or its only one); rows as above
any other folder                    every ``.txt``/``.md``/``.rst`` and code file under it (hidden
                                    folders skipped); each file is a document, its key the relative path
``hf:NAME[:CONFIG][:SPLIT][:FIELD]`` ``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train")``;
                                    field ``FIELD`` (default: ``text`` or ``messages``); offline, one
                                    line naming what could not be fetched
a built-in source's name            that source (``python-stdlib``, ``pydoc-topics``, ...)
==================================  ==================================================================

A document is the unit of the calibration / selection / test split, so a row of a dataset never has
tokens in two roles. A source's name (part of each document id, and so of the split's hash) is the
file or folder's name, not its path, so the same data gives the same split wherever it lies.
``datasets`` is imported only when a user source is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocompress_opt.data.textdata import TextBatches, TextSource, text_batches, text_sources
from autocompress_opt.errors import ConfigError, check_number

__all__ = [
    "DataSpec",
    "DatasetSource",
    "FolderSource",
    "data_batches",
    "load_source",
    "parse_data_spec",
    "resolve_data",
]

USER_DOMAIN = "user"
# Files a folder source reads: prose and the common code languages (the rest — binaries, data — is skipped).
TEXT_SUFFIXES = frozenset(
    {
        ".txt",
        ".md",
        ".rst",
        ".py",
        ".pyi",
        ".js",
        ".ts",
        ".tsx",
        ".jsx",
        ".java",
        ".kt",
        ".scala",
        ".go",
        ".rs",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".hpp",
        ".cs",
        ".rb",
        ".php",
        ".swift",
        ".m",
        ".sh",
        ".bash",
        ".lua",
        ".pl",
        ".r",
        ".jl",
        ".sql",
        ".html",
        ".css",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".tex",
    }
)
_TABLE_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_TEXT_FIELDS = ("text", "content")  # the text field tried when none is named, in order
_CHAT_FIELD = "messages"


@dataclass(frozen=True)
class DataSpec:
    """One ``--data`` entry: ``source`` (a path, ``hf:...`` or a built-in name) and its row ``weight``."""

    source: str
    weight: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "weight": self.weight}


def parse_data_spec(spec: str) -> DataSpec:
    """``"code.jsonl:0.7"`` → ``DataSpec("code.jsonl", 0.7)``; no trailing number → no weight.

    Raises :class:`ConfigError` for an empty spec or a weight that is not a positive number.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"a --data spec must be a path, hf:NAME or a built-in source name, got {spec!r}")
    head, sep, tail = spec.rpartition(":")
    if sep and head and not tail.startswith(("/", "\\")):
        try:
            weight = float(tail)
        except ValueError:
            return DataSpec(spec)
        return DataSpec(head, check_number(weight, f"the weight of --data {spec!r}"))
    return DataSpec(spec)


def resolve_data(specs: Sequence[str]) -> tuple[tuple[TextSource, ...], tuple[float, ...] | None]:
    """Sources and weights of ``specs``: weights all given, or none (then rows go equally to each
    domain, :func:`~autocompress_opt.data.textdata.text_batches`). A mix of weighted and unweighted
    specs is refused, naming them."""
    parsed = [parse_data_spec(s) for s in specs]
    if not parsed:
        raise ConfigError("no --data specs given")
    weighted = [p.weight is not None for p in parsed]
    if any(weighted) and not all(weighted):
        missing = [p.source for p in parsed if p.weight is None]
        raise ConfigError(f"give a weight to every --data spec or to none; no weight on: {', '.join(missing)}")
    sources = tuple(load_source(p.source) for p in parsed)
    return sources, (tuple(float(p.weight) for p in parsed if p.weight is not None) if all(weighted) else None)


def data_batches(tokenizer: Any, *, data: Sequence[str] | None = None, **kwargs: Any) -> TextBatches:
    """:func:`~autocompress_opt.data.textdata.text_batches` of the user's ``data`` specs (their sources
    and weights); without specs, of ``kwargs``' sources (the built-in ones by default)."""
    if not data:
        return text_batches(tokenizer, **kwargs)
    sources, weights = resolve_data(data)
    return text_batches(tokenizer, sources=sources, weights=weights, **kwargs)


def load_source(spec: str) -> TextSource:
    """The source a spec (without weight) names; loaded once per process per spec and file state."""
    builtin = text_sources()
    if spec in builtin:
        return builtin[spec]
    if spec.startswith("hf:"):
        return _cached(spec, 0.0, lambda: _hub_source(spec))
    path = Path(spec).expanduser()
    if not path.exists():
        raise ConfigError(
            f"--data {spec!r}: no such file or folder; give a .jsonl/.json/.parquet file, a folder, "
            f"hf:NAME[:CONFIG][:SPLIT][:FIELD], or a built-in source ({', '.join(builtin)})"
        )
    stamp = path.stat().st_mtime
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            return _cached(spec, stamp, lambda: _disk_source(path))
        return _cached(spec, stamp, lambda: FolderSource(path))
    builder = _TABLE_SUFFIXES.get(path.suffix.lower())
    if builder is None:
        raise ConfigError(
            f"--data {spec!r}: cannot read {path.suffix or 'a file without suffix'}; "
            f"valid: {', '.join(sorted(_TABLE_SUFFIXES))}, a folder, or hf:NAME"
        )
    return _cached(spec, stamp, lambda: _table_source(path, builder))


_LOADED: dict[tuple[str, float], TextSource] = {}


def _cached(spec: str, stamp: float, build: Callable[[], TextSource]) -> TextSource:
    if (spec, stamp) not in _LOADED:
        _LOADED[(spec, stamp)] = build()
    return _LOADED[(spec, stamp)]


# ------------------------------------------------------------------------------ sources
class DatasetSource(TextSource):
    """Rows of a ``datasets.Dataset``; key = row index (zero-padded, so keys sort as rows do).

    A row's text is its ``field``; when ``field`` is ``messages`` (a list of ``{"role", "content"}``),
    :meth:`text` renders it with the tokenizer's chat template, so the model sees the conversation
    as it will be served.
    """

    domain, licence = USER_DOMAIN, "user-supplied"

    def __init__(self, name: str, dataset: Any, origin: str, field: str | None = None):
        self.name = name
        self._origin = origin
        self.field = _pick_field(dataset.column_names, field, origin)
        # The Arrow-backed column (memory-mapped from the datasets cache), read a row at a time:
        # the corpus is never copied into Python objects as a whole.
        self._rows = dataset.select_columns([self.field])
        self._width = len(str(max(len(self._rows) - 1, 0)))

    def available(self) -> bool:
        return True

    def install_hint(self) -> str:
        return ""

    def origin(self) -> str:
        return f"{self._origin} (field {self.field!r}, {len(self._rows)} rows)"

    def keys(self) -> tuple[str, ...]:
        return tuple(f"{i:0{self._width}d}" for i in range(len(self._rows)))

    def read(self, key: str) -> str:
        value = self._row(key)
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)

    def text(self, key: str, tokenizer: Any) -> str:
        if self.field != _CHAT_FIELD:
            return self.read(key)
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"{self._origin} holds chat messages but the tokenizer "
                f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r} has no chat template; "
                "give a text field instead, or a model whose tokenizer has one"
            )
        return str(tokenizer.apply_chat_template(self._row(key), tokenize=False))

    def _row(self, key: str) -> Any:
        return self._rows[int(key)][self.field]


class FolderSource(TextSource):
    """Text and code files under a folder (:data:`TEXT_SUFFIXES`); key = path relative to it."""

    domain, licence = USER_DOMAIN, "user-supplied"

    def __init__(self, root: Path):
        self.root = root
        self.name = root.resolve().name
        found = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [
                (Path(folder) / f).relative_to(root).as_posix()
                for f in files
                if Path(f).suffix.lower() in TEXT_SUFFIXES and not f.startswith(".")
            ]
        if not found:
            raise ConfigError(f"--data {str(root)!r}: no text or code files ({', '.join(sorted(TEXT_SUFFIXES))})")
        self._keys = tuple(sorted(found))

    def available(self) -> bool:
        return self.root.is_dir()

    def install_hint(self) -> str:
        return f"the folder {str(self.root)!r} does not exist"

    def origin(self) -> str:
        return f"files under {self.root}"

    def keys(self) -> tuple[str, ...]:
        return self._keys

    def read(self, key: str) -> str:
        return (self.root / key).read_text(encoding="utf-8", errors="replace")


def _pick_field(columns: Sequence[str], field: str | None, origin: str) -> str:
    if field is not None:
        if field not in columns:
            raise ConfigError(f"{origin} has no field {field!r}; its fields: {', '.join(columns)}")
        return field
    for name in (*_TEXT_FIELDS, _CHAT_FIELD):
        if name in columns:
            return name
    raise ConfigError(
        f"{origin} has neither a text field ({', '.join(_TEXT_FIELDS)}) nor chat {_CHAT_FIELD!r}; "
        f"its fields: {', '.join(columns)} (name one with hf:NAME:CONFIG:SPLIT:FIELD, or rename it)"
    )


def _table_source(path: Path, builder: str) -> TextSource:
    import datasets

    dataset = datasets.load_dataset(builder, data_files=str(path), split="train")
    return DatasetSource(path.name, dataset, f"{path}")


def _disk_source(path: Path) -> TextSource:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if "train" not in loaded and len(names) != 1:
            raise ConfigError(f"{path} holds splits {', '.join(names)}; none is 'train': save the one to use alone")
        loaded = loaded["train" if "train" in loaded else names[0]]
    return DatasetSource(path.resolve().name, loaded, f"save_to_disk folder {path}")


def _hub_source(spec: str) -> TextSource:
    """``hf:NAME[:CONFIG][:SPLIT][:FIELD]`` through ``load_dataset``; any failure to fetch is one line."""
    parts = spec[3:].split(":")
    if not parts[0] or len(parts) > 4:
        raise ConfigError(f"--data {spec!r}: expected hf:NAME[:CONFIG][:SPLIT][:FIELD]")
    name, config, split, field = (parts + ["", "", ""])[:4]
    import datasets

    from autocompress_opt.hf.hub import hub_offline_unless_reachable

    # Offline, the probe turns the Hub libraries' offline mode on, so load_dataset reads its local
    # cache or fails at once instead of waiting out huggingface_hub's retries (~25 s).
    with hub_offline_unless_reachable() as offline:
        try:
            dataset = datasets.load_dataset(name, config or None, split=split or "train")
        except Exception as error:  # offline, unknown name, bad config: the library raises many kinds
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            where = " (the Hub is not reachable from here: only a dataset in the local cache loads)" if offline else ""
            raise ConfigError(
                f"could not fetch Hugging Face dataset {name!r} (config {config or 'default'}, "
                f"split {split or 'train'}){where}: {first}"
            ) from None
    label = ":".join(p for p in ("hf", name, config, split) if p)
    return DatasetSource(label, dataset, f"Hugging Face dataset {name} {config} [{split or 'train'}]", field or None)
