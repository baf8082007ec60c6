"""A user's own text as :class:`~autocompress_opt.data.textdata.TextSource` s: the ``--data SPEC`` of every verb.

**Grammar.** ``SOURCE[#OPTION]...``, each option ``key=value``:

==================================  ==================================================================
``SOURCE``                          read as
==================================  ==================================================================
``rows.jsonl``                      JSON Lines, streamed (:mod:`~autocompress_opt.data.tables`); each
                                    row a document (:mod:`~autocompress_opt.data.rows`: ``text`` or
                                    ``content``, OpenAI ``messages``, ShareGPT ``conversations``,
                                    ``prompt`` + ``completion``, or the fields named)
``rows.json``                       a JSON array of rows (or JSON Lines); rows as above
``rows.parquet``                    pyarrow, a row group at a time; rows as above
a ``save_to_disk`` folder           ``datasets.load_from_disk`` (a ``DatasetDict``: ``#split=``, else
                                    its ``train`` split, or its only one); rows as above
a folder of ``.parquet`` files      a Hub dataset's files on disk: their rows, not its README
any other folder                    every ``.txt``/``.md``/``.rst`` and code file under it (hidden
                                    folders skipped); each file is a document, its key the relative path
``hf:NAME[:CONFIG[:SPLIT[:FIELD]]]`` ``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train")``
a built-in source's name            that source (``python-stdlib``, ``pydoc-topics``, ...)
==================================  ==================================================================

==========================  ======================================================================
option                      meaning
==========================  ======================================================================
``#field=A[,B...]``         the row fields that make the text, joined by a newline in this order
                            (a field holding chat messages makes a chat)
``#weight=W``               the source's share of rows (every spec weighted, or none); ``PATH:W``
                            is the short form for a file or folder, never for ``hf:`` (whose
                            ``:`` parts are config and split)
``#config=C``, ``#split=S`` a Hub dataset's config and split (``hf:`` and ``save_to_disk`` folders)
``#template=model|plain``   chats: the model's chat template without its default system prompt
                            (default), or ``role: content`` paragraphs (:mod:`~autocompress_opt.data.chat`)
==========================  ======================================================================

Examples: ``sft.jsonl#field=instruction,output``, ``chat.jsonl#template=plain#weight=0.3``,
``hf:wikitext#config=wikitext-2-raw-v1#split=test``, ``hf:org/ds-2024#weight=2``.

**Checked first.** :func:`resolve_data` parses every spec and reads every source once (a JSONL
file's index is then cached), so a bad spec is one line naming the file, the line or field and what
would be valid — the CLI calls it before any model loads (exit 2). An ``hf:`` source offline fails
at once unless the dataset is in the local cache.

A document is the unit of the calibration / selection / test split, so a row never has tokens in
two roles; a row's role is hashed from its text (appending rows moves no earlier row; equal rows
share a role; a row nested in another takes its role: :mod:`~autocompress_opt.data.overlap`). A
source's name (part of each document id) is the file or folder's name, not its path. ``datasets``
is imported only when a ``save_to_disk`` folder or a Hub dataset is read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autocompress_opt.data.chat import TEMPLATES
from autocompress_opt.data.rows import RowReader
from autocompress_opt.data.tables import (
    USER_DOMAIN,
    DatasetRowsSource,
    JsonlSource,
    JsonRowsSource,
    ParquetSource,
    RowsSource,
)
from autocompress_opt.data.textdata import TextBatches, TextSource, text_batches, text_sources
from autocompress_opt.errors import ConfigError, check_choice, check_number, one_line, suggest

__all__ = [
    "DataSpec",
    "DatasetRowsSource",
    "FolderSource",
    "data_batches",
    "data_changes",
    "data_record",
    "load_source",
    "parse_data_spec",
    "resolve_data",
]

# Files a folder source reads: prose and the common code languages (the rest — binaries, data — is skipped).
TEXT_SUFFIXES = frozenset(
    {
        ".txt", ".md", ".rst", ".py", ".pyi", ".js", ".ts", ".tsx", ".jsx", ".java", ".kt", ".scala", ".go",
        ".rs", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".rb", ".php", ".swift", ".m", ".sh", ".bash", ".lua",
        ".pl", ".r", ".jl", ".sql", ".html", ".css", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".tex",
    }
)  # fmt: skip
_FILE_KINDS = (".jsonl", ".json", ".parquet")
_DATA_FOLDER_SUFFIX = ".parquet"  # a folder holding these is a dataset's files (a Hub snapshot), read as rows
_SAVED_MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")  # what save_to_disk writes
_OPTIONS = ("field", "weight", "config", "split", "template")
_VALID = (
    "a .jsonl/.json/.parquet file, a save_to_disk folder, a folder of text files, hf:NAME, or a built-in source; "
    "options #field=A,B #weight=W #config=C #split=S #template=model|plain"
)
# How long a spec's hf: check waits for the Hub before calling it unreachable (an offline machine fails
# DNS at once; a silently dropped connection waits this long).
HUB_CHECK_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class DataSpec:
    """One ``--data`` entry (module doc): ``source`` (a path, ``hf:NAME`` or a built-in name), its
    row ``weight``, the ``fields`` that make a row's text, a Hub ``config`` / ``split``, and the chat
    ``template`` rendering."""

    source: str
    weight: float | None = None
    fields: tuple[str, ...] = ()
    config: str | None = None
    split: str | None = None
    template: str = "model"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "weight": self.weight,
            "fields": list(self.fields),
            "config": self.config,
            "split": self.split,
            "template": self.template,
        }


def parse_data_spec(spec: str) -> DataSpec:
    """``"sft.jsonl#field=instruction,output#weight=0.7"`` → its :class:`DataSpec` (module doc).

    ``PATH:W`` is read as a weight only for a path (never ``hf:``, whose ``:`` parts are config,
    split and field) and only when ``PATH:W`` itself is not an existing file. Raises
    :class:`ConfigError` naming the spec and what would be valid.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"a --data spec must be a non-empty string ({_VALID}), got {spec!r}")
    if "#" in spec and Path(spec).expanduser().exists():
        return DataSpec(spec)  # a path with "#" in its name, given without options
    source, *options = spec.split("#")
    values: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if key not in _OPTIONS:
            raise ConfigError(
                f"--data {spec!r}: unknown option {key!r}{suggest(key, _OPTIONS)}; valid: "
                + ", ".join(f"#{o}=" for o in _OPTIONS)
            )
        if not sep or not value.strip():
            raise ConfigError(f"--data {spec!r}: option #{key} needs a value (#{key}=...)")
        if key in values:
            raise ConfigError(f"--data {spec!r}: option #{key} given twice")
        values[key] = value.strip()
    parsed = DataSpec(source.strip())
    if "weight" in values:
        parsed = replace(parsed, weight=_weight(values["weight"], spec))
    elif not source.startswith("hf:"):
        head, sep, tail = source.rpartition(":")
        if sep and head and not tail.startswith(("/", "\\")) and not Path(source).expanduser().exists():
            try:
                weight = float(tail)
            except ValueError:
                pass
            else:
                parsed = replace(parsed, source=head, weight=check_number(weight, f"the weight of --data {spec!r}"))
    fields = tuple(f.strip() for f in values.get("field", "").split(",") if f.strip())
    if "field" in values and not fields:
        raise ConfigError(f"--data {spec!r}: #field= needs field names, e.g. #field=instruction,output")
    template = check_choice(values.get("template", "model"), f"--data {spec!r}: #template", TEMPLATES)
    parsed = replace(parsed, fields=fields, config=values.get("config"), split=values.get("split"), template=template)
    return _hub_parts(parsed, spec) if parsed.source.startswith("hf:") else parsed


def _weight(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"the weight of --data {spec!r} must be a finite number > 0, got {text!r}") from None
    return check_number(value, f"the weight of --data {spec!r}")


def _hub_parts(spec: DataSpec, text: str) -> DataSpec:
    """``hf:NAME:CONFIG:SPLIT:FIELD`` (the positional form) merged with the options."""
    parts = spec.source[3:].split(":")
    if not parts[0] or len(parts) > 4 or any(not p for p in parts[1:]):
        raise ConfigError(f"--data {text!r}: expected hf:NAME[:CONFIG[:SPLIT[:FIELD]]] or hf:NAME#config=C#split=S")
    name, config, split, field = (parts + [None, None, None])[:4]
    for option, positional in (("config", config), ("split", split), ("field", field)):
        if positional and getattr(spec, option if option != "field" else "fields"):
            raise ConfigError(f"--data {text!r}: {option} given twice (as :{positional} and as #{option}=)")
    return replace(
        spec,
        source=f"hf:{name}",
        config=spec.config or config,
        split=spec.split or split,
        fields=spec.fields or ((field,) if field else ()),
    )


def resolve_data(specs: Sequence[str]) -> tuple[tuple[TextSource, ...], tuple[float, ...] | None]:
    """Sources and weights of ``specs``, each source read once (so malformed input fails here, with
    one line): weights all given, or none (then rows go equally to each domain,
    :func:`~autocompress_opt.data.textdata.text_batches`). A mix of weighted and unweighted specs is
    refused, naming them. Every verb's CLI calls it before loading a model."""
    parsed = [parse_data_spec(s) for s in specs]
    if not parsed:
        raise ConfigError("no --data specs given")
    weighted = [p.weight is not None for p in parsed]
    if any(weighted) and not all(weighted):
        missing = [p.source for p in parsed if p.weight is None]
        raise ConfigError(f"give a weight to every --data spec or to none; no weight on: {', '.join(missing)}")
    sources = tuple(load_source(p) for p in parsed)
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--data names the source {twice[0]!r} twice (sources are named by file or folder name)")
    return sources, (tuple(float(p.weight) for p in parsed if p.weight is not None) if all(weighted) else None)


def data_record(specs: Sequence[str]) -> list[dict[str, Any]]:
    """What ``specs`` hold, for a study's identity: each source's name, documents and content SHA-256
    (equal records: equal data, whatever the file's path or modification time)."""
    sources, _ = resolve_data(specs)
    return [{"source": s.name, "documents": len(s.keys()), "sha256": s.content_sha256()} for s in sources]


def data_changes(stored: Sequence[dict[str, Any]] | None, now: Sequence[dict[str, Any]] | None) -> str:
    """One line saying how the data of ``now`` differs from ``stored`` (:func:`data_record` s), or ""."""
    if stored is None and now:
        return (
            "the study recorded no digest of its data (it began before studies did, when a row's role was "
            "hashed from its row number; now from its text)"
        )
    old = {r["source"]: r for r in stored or ()}
    new = {r["source"]: r for r in now or ()}
    parts = [f"{n} removed" for n in old if n not in new] + [f"{n} added" for n in new if n not in old]
    for name in (n for n in new if n in old and old[n]["sha256"] != new[n]["sha256"]):
        a, b = old[name], new[name]
        parts.append(
            f"{name} changed ({a['documents']} documents, sha256 {a['sha256'][:12]}... -> "
            f"{b['documents']}, {b['sha256'][:12]}...)"
        )
    return "; ".join(parts)


def data_batches(tokenizer: Any, *, data: Sequence[str] | None = None, **kwargs: Any) -> TextBatches:
    """:func:`~autocompress_opt.data.textdata.text_batches` of the user's ``data`` specs (their sources
    and weights); without specs, of ``kwargs``' sources (the built-in ones by default)."""
    if not data:
        return text_batches(tokenizer, **kwargs)
    sources, weights = resolve_data(data)
    return text_batches(tokenizer, sources=sources, weights=weights, **kwargs)


def load_source(spec: str | DataSpec) -> TextSource:
    """The source a spec names, read once (rows parsed, hashed, checked); loaded once per process per
    spec and file state."""
    parsed = parse_data_spec(spec) if isinstance(spec, str) else spec
    builtin = text_sources()
    if parsed.source in builtin:
        if parsed.fields or parsed.config or parsed.split:
            raise ConfigError(f"--data {parsed.source!r} is a built-in source: it takes only #weight=")
        return builtin[parsed.source]
    if parsed.source.startswith("hf:"):
        return _cached(parsed, (), lambda: _hub_source(parsed))
    path = Path(parsed.source).expanduser()
    if not path.exists():
        near = suggest(parsed.source, list(builtin))
        raise ConfigError(f"--data {parsed.source!r}: no such file or folder{near}; valid: {_VALID}")
    stat = path.stat()
    return _cached(parsed, (stat.st_size, stat.st_mtime_ns, stat.st_ino), lambda: _path_source(path, parsed))


_LOADED: dict[tuple[DataSpec, tuple[int, ...]], TextSource] = {}


def _cached(spec: DataSpec, stamp: tuple[int, ...], build: Callable[[], TextSource]) -> TextSource:
    if (spec, stamp) not in _LOADED:
        source = build()
        if isinstance(source, RowsSource):
            source.validate()
        _LOADED[(spec, stamp)] = source
    return _LOADED[(spec, stamp)]


def _path_source(path: Path, spec: DataSpec) -> TextSource:
    reader = RowReader(str(path), spec.fields)
    if path.is_dir():
        if any((path / m).is_file() for m in _SAVED_MARKERS):
            return _disk_source(path, spec, reader)
        data_files = sorted(p for p in path.rglob(f"*{_DATA_FOLDER_SUFFIX}") if not _hidden(p, path))
        if data_files:
            return _parquet_folder_source(path, data_files, spec)
        _only(spec, path, ())
        return FolderSource(path)
    if spec.config:
        raise ConfigError(f"--data {str(path)!r}: #config= applies to hf: datasets only")
    if spec.split:
        raise ConfigError(f"--data {str(path)!r}: #split= applies to hf: datasets and save_to_disk folders only")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return JsonlSource(path, reader, spec.template)
    if suffix == ".json":
        return _json_source(path, reader, spec.template)
    if suffix == ".parquet":
        return ParquetSource(path, reader, spec.template)
    raise ConfigError(
        f"--data {str(path)!r}: cannot read {path.suffix or 'a file without suffix'}; "
        f"valid: {', '.join(_FILE_KINDS)} files, a folder, or hf:NAME"
    )


def _only(spec: DataSpec, path: Path, allowed: tuple[str, ...]) -> None:
    """Refuse row options on a source that has no rows (a folder of text files)."""
    for option, value in (("field", spec.fields), ("config", spec.config), ("split", spec.split)):
        if value and option not in allowed:
            raise ConfigError(
                f"--data {str(path)!r}: a folder of text files has no #{option}= (each file is a document)"
            )


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _json_source(path: Path, reader: RowReader, template: str) -> TextSource:
    """A ``.json`` file: an array of rows, or JSON Lines under another suffix."""
    with open(path, "rb") as handle:
        first = handle.read(4096).lstrip()[:1]
    if first != b"[":
        return JsonlSource(path, reader, template)
    try:
        rows = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        where = f" line {error.lineno}, column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
        raise ConfigError(
            f"{path}{where}: not valid JSON ({getattr(error, 'msg', 'not UTF-8')}); a .json file must hold one "
            "array of row objects, or one object per line"
        ) from None
    return JsonRowsSource(path, rows, reader, template)


class FolderSource(TextSource):
    """Text and code files under a folder (:data:`TEXT_SUFFIXES`); key = path relative to it; a
    file's role is hashed from its text."""

    domain, licence = USER_DOMAIN, "user-supplied"

    def __init__(self, root: Path):
        self.root = root
        self.name = root.resolve().name.replace(":", "_")  # ":" separates a document id's source and key
        found = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [
                (Path(folder) / f).relative_to(root).as_posix()
                for f in files
                if Path(f).suffix.lower() in TEXT_SUFFIXES and not f.startswith(".")
            ]
        if not found:
            raise ConfigError(
                f"--data {str(root)!r}: no text or code files ({', '.join(sorted(TEXT_SUFFIXES))}) and no "
                "dataset files (.parquet, a save_to_disk folder)"
            )
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

    def role_id(self, key: str) -> tuple[object, ...]:
        return ("text", self._text_digest(key))

    @functools.cache  # noqa: B019 - one source per folder and process (load_source caches it)
    def _text_digest(self, key: str) -> str:
        return hashlib.sha256(self.read(key).encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


def _disk_source(path: Path, spec: DataSpec, reader: RowReader) -> TextSource:
    import datasets

    if spec.config:
        raise ConfigError(f"--data {str(path)!r}: #config= applies to hf: datasets only")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:  # a damaged folder: datasets raises several kinds
        raise ConfigError(
            f"--data {str(path)!r}: not a readable save_to_disk folder ({one_line(str(error))})"
        ) from None
    label = path.resolve().name
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        split = spec.split or ("train" if "train" in loaded else names[0] if len(names) == 1 else None)
        if split not in loaded:
            raise ConfigError(
                f"--data {str(path)!r} holds splits {', '.join(names)}; "
                + (f"none is {spec.split!r}" if spec.split else "none is 'train'")
                + f": choose one with #split={names[0]}"
            )
        loaded = loaded[split]
        label = f"{label}[{split}]" if spec.split else label
    elif spec.split:
        raise ConfigError(f"--data {str(path)!r} holds one dataset, no splits: drop #split=")
    return DatasetRowsSource(label, f"save_to_disk folder {path}", loaded, reader, spec.template)


def _parquet_folder_source(path: Path, files: Sequence[Path], spec: DataSpec) -> TextSource:
    """A folder of parquet files (a Hub dataset as downloaded): their rows, in file order."""
    import datasets

    if spec.split or spec.config:
        raise ConfigError(f"--data {str(path)!r}: a folder of parquet files takes #field= and #weight= only")
    try:
        loaded = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    except Exception as error:
        raise ConfigError(
            f"--data {str(path)!r}: its parquet files could not be read ({one_line(str(error))})"
        ) from None
    reader = RowReader(str(path), spec.fields)
    return DatasetRowsSource(path.resolve().name, f"parquet files under {path}", loaded, reader, spec.template)


def _hub_source(spec: DataSpec) -> TextSource:
    """``hf:NAME`` through ``load_dataset``; offline and not in the local cache, one line at once."""
    name = spec.source[3:]
    config, split = spec.config, spec.split or "train"
    what = f"Hugging Face dataset {name!r} (config {config or 'default'}, split {split})"
    offline = _hub_offline()
    if offline and not _hub_cached(name):
        raise ConfigError(
            f"could not fetch {what}: the Hub is not reachable from here and the dataset is not in the local "
            "cache; download it where there is a network (or save_to_disk it there) and give the folder"
        )
    import datasets

    from autocompress_opt.hf.hub import hub_offline_unless_reachable

    with hub_offline_unless_reachable(HUB_CHECK_TIMEOUT_S) as offline:
        try:
            dataset = datasets.load_dataset(name, config or None, split=split)
        except Exception as error:  # offline, unknown name, bad config: the library raises many kinds
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            where = " (the Hub is not reachable from here: only a dataset in the local cache loads)" if offline else ""
            raise ConfigError(f"could not fetch {what}{where}: {first}") from None
    label = name + "".join(f"[{p}]" for p in (config, spec.split) if p)  # no ":": it ends a document's source
    reader = RowReader(f"hf:{name}", spec.fields)
    return DatasetRowsSource(
        label, f"Hugging Face dataset {name} {config or ''} [{split}]", dataset, reader, spec.template
    )


def _hub_offline() -> bool:
    """The Hub libraries' offline flags, or a failed probe of the Hub (at most :data:`HUB_CHECK_TIMEOUT_S`)."""
    from autocompress_opt.hf.hub import hub_reachable

    if any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    ):
        return True
    try:
        from datasets import config as datasets_config

        if datasets_config.HF_HUB_OFFLINE:
            return True
    except ImportError:
        pass
    return not hub_reachable(HUB_CHECK_TIMEOUT_S)


def _hub_cached(name: str) -> bool:
    """Whether ``datasets`` or ``huggingface_hub`` keep a copy of dataset ``name`` on this machine."""
    from huggingface_hub import constants

    home = Path(constants.HF_HOME)
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets")
    hub_cache = Path(constants.HF_HUB_CACHE)
    return (datasets_cache / name.replace("/", "___")).is_dir() or (
        hub_cache / f"datasets--{name.replace('/', '--')}"
    ).is_dir()
