"""The built-in text sources (:class:`TextSource` and the packages they read) and the registry that
names them. What each reads, its domain and licence: :mod:`autocompress_opt.data.textdata`, which
splits their documents into roles and makes rows of them, and re-exports every public name here.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tokenize
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError
from autocompress_opt.registry import Registry

__all__ = [
    "DEFAULT_SOURCES",
    "DOMAINS",
    "BibleKJVSource",
    "PydocTopicsSource",
    "PythonDocsSource",
    "StdlibSource",
    "TextSource",
    "parse_bible_output",
    "text_sources",
]

# code / prose: the built-in sources; user: a user's data (--data), whatever it holds.
DOMAINS: tuple[str, ...] = ("code", "prose", "user")
DEFAULT_SOURCES: tuple[str, ...] = ("python-stdlib", "pydoc-topics")


class TextSource(ABC):
    """A collection of installed documents of one domain.

    Contract: :meth:`keys` is sorted, stable for a given installation and cheap (no tokenising);
    :meth:`read` of a key always returns the same text. Methods other than :meth:`available`,
    :meth:`install_hint` and :meth:`describe` may raise :class:`ConfigError` when the source is
    not available.
    """

    name: str
    domain: str
    licence: str

    @abstractmethod
    def available(self) -> bool:
        """Whether the installed files this source reads are present."""

    @abstractmethod
    def install_hint(self) -> str:
        """How to make the source available (shown in the error when it is not)."""

    @abstractmethod
    def origin(self) -> str:
        """Where the text comes from on this machine (path and version), for records."""

    @abstractmethod
    def keys(self) -> tuple[str, ...]:
        """Document keys, sorted."""

    @abstractmethod
    def read(self, key: str) -> str:
        """Text of one document."""

    def text(self, key: str, tokenizer: Any) -> str:
        """The text of one document as the model sees it (a chat source renders it with
        ``tokenizer``'s chat template); plain sources return :meth:`read`."""
        return self.read(key)

    def content_sha256(self) -> str:
        """SHA-256 of every document's key and text, in key order: equal digests mean equal data."""
        return _content_sha256(self)

    def role_id(self, key: str) -> tuple[object, ...]:
        """What a document's role is hashed from (with the split seed): ``(name, key)`` for a built-in
        source; a user's source hashes ``("text", digest of the text)``, so that a document keeps its
        role wherever it lies and identical documents share one."""
        return (self.name, key)

    def role_ids(self) -> Iterable[tuple[object, ...]]:
        """:meth:`role_id` of every key, in :meth:`keys` order (a large source gives them in bulk)."""
        return (self.role_id(key) for key in self.keys())

    def rendering(self, tokenizer: Any) -> dict[str, Any] | None:
        """How :meth:`text` turns documents into the model's text, for records (None: as read)."""
        return None

    def require(self) -> None:
        """Raise :class:`ConfigError` naming the source and the fix when it is not available."""
        if not self.available():
            raise ConfigError(f"text source {self.name!r} is not available on this machine: {self.install_hint()}")

    def describe(self) -> str:
        return f"{self.name} ({self.domain}, {self.licence})"


# Directories of the standard library that are not its own module sources: tests, third-party
# packages, and pydoc_data (the prose of the pydoc-topics source — kept out of code).
_STDLIB_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}
)
# Files that are data rather than code, or that differ from build to build: the build's own
# config (_sysconfigdata*, config-3.X-<platform>/) and the 65 charmap tables of encodings/ that
# Tools/unicode/gencodec.py generated (their first lines say so).
_STDLIB_EXCLUDED_PREFIXES = ("_sysconfigdata", "config-")
_GENERATED_MARK = b"gencodec.py"


class StdlibSource(TextSource):
    """``.py`` files of the running interpreter's standard library; key = path relative to it."""

    name, domain, licence = "python-stdlib", "code", "PSF-2.0"

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])

    def available(self) -> bool:
        return self.root.is_dir()

    def install_hint(self) -> str:
        return f"the standard library directory {str(self.root)!r} does not exist"

    def origin(self) -> str:
        return f"Python {sys.version.split()[0]} standard library at {self.root}"

    @functools.cached_property
    def _keys(self) -> tuple[str, ...]:
        self.require()
        found = []
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if d not in _STDLIB_EXCLUDED_DIRS]
            found += [(Path(folder) / f).relative_to(self.root).as_posix() for f in files if f.endswith(".py")]
        return tuple(sorted(k for k in found if self._is_module_source(k)))

    def _is_module_source(self, key: str) -> bool:
        if key.startswith(_STDLIB_EXCLUDED_PREFIXES) or Path(key).name.startswith("test_"):
            return False
        if key.startswith("encodings/"):
            with open(self.root / key, "rb") as handle:
                return _GENERATED_MARK not in handle.read(1024)
        return True

    def keys(self) -> tuple[str, ...]:
        return self._keys

    def read(self, key: str) -> str:
        path = self.root / key
        try:
            with tokenize.open(path) as handle:  # honours PEP 263 encoding cookies
                return handle.read()
        except SyntaxError:  # an undecodable cookie: keep what can be read
            return path.read_text(encoding="utf-8", errors="replace")


class PydocTopicsSource(TextSource):
    """``pydoc_data.topics.topics``: the language reference text ``help()`` shows; key = topic."""

    name, domain, licence = "pydoc-topics", "prose", "PSF-2.0"

    def available(self) -> bool:
        return self._topics() is not None

    def install_hint(self) -> str:
        return "this Python has no pydoc_data.topics module (some minimal builds strip it)"

    def origin(self) -> str:
        return f"pydoc_data.topics of Python {sys.version.split()[0]}"

    def keys(self) -> tuple[str, ...]:
        self.require()
        return tuple(sorted(self._topics() or {}))

    def read(self, key: str) -> str:
        self.require()
        return (self._topics() or {})[key]

    @staticmethod
    @functools.cache
    def _topics() -> dict[str, str] | None:
        try:
            from pydoc_data.topics import topics
        except ImportError:
            return None
        return dict(topics)


class PythonDocsSource(TextSource):
    """Debian ``python3.X-doc``: the documentation's reST sources; key = path under ``_sources``."""

    name, domain, licence = "python-docs", "prose", "PSF-2.0"

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else self._default_root()

    @staticmethod
    def _default_root() -> Path:
        own = Path(f"/usr/share/doc/python{sys.version_info[0]}.{sys.version_info[1]}/html/_sources")
        if own.is_dir():
            return own
        others = sorted(Path("/usr/share/doc").glob("python3*/html/_sources"))
        return others[-1] if others else own

    def available(self) -> bool:
        return bool(self._keys)

    def install_hint(self) -> str:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return f"no reST sources under {str(self.root)!r}; install them with `apt-get install python{version}-doc`"

    def origin(self) -> str:
        return f"Python documentation reST sources at {self.root}"

    @functools.cached_property
    def _keys(self) -> tuple[str, ...]:
        if not self.root.is_dir():
            return ()
        return tuple(sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*.txt") if p.is_file()))

    def keys(self) -> tuple[str, ...]:
        self.require()
        return self._keys

    def read(self, key: str) -> str:
        return (self.root / key).read_text(encoding="utf-8", errors="replace")


# A verse line of `bible -f`: "<book abbreviation><chapter>:<verse> <text>", e.g. "1Sm1:1 Now ...".
_VERSE = re.compile(r"^([1-3]?[A-Za-z]+)\d+:\d+ (.*)$")
_WHOLE_BIBLE = "Gen1:1-Rev22:21"


class BibleKJVSource(TextSource):
    """Debian ``bible-kjv`` (King James Version, public domain); key = book abbreviation."""

    name, domain, licence = "bible-kjv", "prose", "public-domain"

    def __init__(self, executable: str = "bible"):
        self.executable = executable

    def available(self) -> bool:
        return shutil.which(self.executable) is not None

    def install_hint(self) -> str:
        return f"the {self.executable!r} program is not installed; install it with `apt-get install bible-kjv`"

    def origin(self) -> str:
        return f"`{self.executable} -f {_WHOLE_BIBLE}` (Debian bible-kjv)"

    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self._books))

    def read(self, key: str) -> str:
        return self._books[key]

    @functools.cached_property
    def _books(self) -> dict[str, str]:
        """The whole text in one run of the program (~0.1 s, 4.4 MB)."""
        self.require()
        result = subprocess.run([self.executable, "-f", _WHOLE_BIBLE], capture_output=True, text=True, check=True)
        return parse_bible_output(result.stdout)


def parse_bible_output(text: str) -> dict[str, str]:
    """``bible -f`` output → {book abbreviation: its verses' text, one verse per line}.

    A line that is not a verse line continues the previous verse (wrapped output).
    """
    books: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _VERSE.match(line)
        if match:
            current = books.setdefault(match.group(1), [])
            current.append(match.group(2).strip())
        elif current is not None and line.strip():
            current[-1] += " " + line.strip()
    return {book: "\n".join(verses) for book, verses in books.items()}


# source -> digest, computed once per process (reading every document of a built-in source takes ~0.3 s)
_CONTENT_SHA: weakref.WeakKeyDictionary[TextSource, str] = weakref.WeakKeyDictionary()


def _content_sha256(source: TextSource) -> str:
    if source not in _CONTENT_SHA:
        digest = hashlib.sha256()
        for key in source.keys():  # noqa: SIM118 (a TextSource, not a dict)
            digest.update(f"{key}\x1f{source.read(key)}\x1e".encode("utf-8", errors="replace"))
        _CONTENT_SHA[source] = digest.hexdigest()
    return _CONTENT_SHA[source]


_SOURCES: Registry[TextSource] = Registry("text source")
for _source in (StdlibSource(), PydocTopicsSource(), PythonDocsSource(), BibleKJVSource()):
    _SOURCES.register(_source.name, _source)


def text_sources() -> dict[str, TextSource]:
    """Every registered source by name (available or not: check :meth:`TextSource.available`)."""
    return {name: _SOURCES.get(name) for name in _SOURCES.names()}


def _resolve_sources(sources: Sequence[str | TextSource] | None) -> tuple[TextSource, ...]:
    """Sources by name or instance; raises for an unknown name, a duplicate or a missing install."""
    chosen = [_SOURCES.get(s) if isinstance(s, str) else s for s in (DEFAULT_SOURCES if sources is None else sources)]
    if not chosen:
        raise ConfigError(f"no text sources given; registered: {', '.join(_SOURCES.names())}")
    names = [s.name for s in chosen]
    if len(set(names)) != len(names):
        raise ConfigError(f"text sources listed twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    for source in chosen:
        if source.domain not in DOMAINS:
            raise ConfigError(f"text source {source.name!r} has domain {source.domain!r}; valid: {', '.join(DOMAINS)}")
        source.require()
    return tuple(chosen)
