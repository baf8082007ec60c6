"""Read a GGUF file's metadata (never its weights) into an
:class:`~autocompress_opt.arch.architecture.Architecture`; the ``gguf`` package only, no torch."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.families import family, family_for_gguf_arch, family_names
from autocompress_opt.errors import ConfigError

__all__ = ["GGUF_ARCH_TO_FAMILY", "architecture_from_gguf"]


# ------------------------------------------------------------------------ GGUF
# GGUF metadata → HF config keys. Source: llama.cpp gguf-py constants (LLM_KV_*), e.g.
# "{arch}.block_count", "{arch}.attention.head_count_kv"; tensor names from gguf-py MODEL_TENSOR
# ("output.weight" is the untied LM head). The Gemma 3 text decoder's key_length = head_dim = 256,
# independent of the hidden size.
# "{arch}.attention.sliding_window" is the window; which layers use it is the family's rule, as in
# transformers' GGUF loader (its Gemma 3 config gets layer_types from the default pattern of 6, and
# llama.cpp hard-codes that pattern for "gemma3"): see hf_layer_windows.
# Which GGUF architecture is which family: each family's ``gguf_archs`` (arch/families.py).
GGUF_ARCH_TO_FAMILY: dict[str, str] = {arch: f.name for f in map(family, family_names()) for arch in f.gguf_archs}


def architecture_from_gguf(path: str | Path) -> Architecture:
    """Read a GGUF file's metadata (not its weights) into an :class:`Architecture`.

    Raises :class:`ConfigError` for a file that is not GGUF, an unsupported architecture, or
    metadata that is missing or per-layer (heterogeneous GGUFs are not read yet). Results are
    cached per file (path, size, modification time): parsing takes seconds because the reader
    decodes every tokenizer string.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(f"no such GGUF file: {str(path)!r}")
    stat = resolved.stat()
    return _read_gguf(resolved, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_gguf(path: Path, size: int, mtime_ns: int) -> Architecture:
    """Uncached body of :func:`architecture_from_gguf`; ``size`` and ``mtime_ns`` only key the cache."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path), "r")
    except (ValueError, IndexError, KeyError, OSError) as exc:  # numpy/mmap errors of a cut or garbled file
        raise ConfigError(f"{path} is not a readable GGUF file: {exc}") from None
    meta = {key: f.contents() for key, f in reader.fields.items() if not key.startswith("tokenizer.ggml.")}
    arch = str(meta.get("general.architecture"))
    fam = family_for_gguf_arch(arch)
    if fam is None:
        supported = [a for f in map(family, family_names()) for a in f.gguf_archs]
        raise ConfigError(f"GGUF architecture {arch!r} in {path} is not supported; supported: {', '.join(supported)}")
    tensor_names = {t.name for t in reader.tensors}
    if f"{arch}.vocab_size" not in meta:
        meta[f"{arch}.vocab_size"] = _gguf_vocab_size(reader)
    cfg = _gguf_to_hf_config(meta, arch, fam.name, tensor_names, path)
    return Architecture.from_hf_config(cfg, name=str(meta.get("general.name") or Path(path).stem))


def _gguf_vocab_size(reader: Any) -> int | None:
    """Vocabulary from the token list, else from ``token_embd.weight`` (ggml shape [D, V])."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        return len(tokens.data)  # one entry per token string
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    return None if embd is None else int(embd.shape[-1])


_REQUIRED = object()


def _gguf_to_hf_config(
    meta: Mapping[str, Any], arch: str, model_type: str, tensor_names: set[str], path: str | Path
) -> dict[str, Any]:
    """The HF config dict (of ``model_type``) equivalent to GGUF metadata ``meta`` of architecture ``arch``."""

    def scalar(key: str, default: Any = _REQUIRED) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is _REQUIRED or (value is None and default is _REQUIRED):
            raise ConfigError(f"GGUF {path} lacks metadata {arch}.{key}")
        if isinstance(value, list):
            raise ConfigError(f"GGUF {path} has per-layer {arch}.{key}; heterogeneous GGUFs are not supported")
        return value

    experts = scalar("expert_count", None)
    if experts:  # llama.cpp writes Mixtral as "llama" with llama.expert_count: not a dense Llama
        raise ConfigError(
            f"GGUF {path} is a mixture of experts ({arch}.expert_count={experts}): MoE GGUFs are described "
            "but not yet read: issue 30; read its config.json instead"
        )
    hidden, heads = int(scalar("embedding_length")), int(scalar("attention.head_count"))
    window = scalar("attention.sliding_window", None)
    return {
        **({} if window is None else {"sliding_window": int(window)}),  # absent: the family's default
        "model_type": model_type,
        "vocab_size": int(scalar("vocab_size")),
        "hidden_size": hidden,
        "num_hidden_layers": int(scalar("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(scalar("attention.head_count_kv", None) or heads),
        "head_dim": int(scalar("attention.key_length", None) or hidden // heads),
        "intermediate_size": int(scalar("feed_forward_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "max_position_embeddings": scalar("context_length", None),
        "attention_bias": "blk.0.attn_output.bias" in tensor_names,
        "mlp_bias": "blk.0.ffn_up.bias" in tensor_names,
    }
