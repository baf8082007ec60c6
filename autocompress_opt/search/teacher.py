"""The parent's next-token log-probabilities on calibration tokens, computed once per (parent, data)
and cached in process (a small LRU) and on disk (``.autocompress/teacher/``).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.importance import tokens_id

__all__ = ["clear_teacher_memory", "teacher_log_probs"]


# ---------------------------------------------------------------------- teacher cache
_TEACHER_MEMORY: OrderedDict[str, torch.Tensor] = OrderedDict()
_TEACHER_MEMORY_SIZE = 2  # entries (SmolLM2, 16 x 128 tokens, fp16: 0.2 GB each)


def teacher_log_probs(
    model: Any,
    tokens: torch.Tensor,
    *,
    parent_id: str,
    data_id: str | None = None,
    cache_dir: str | Path | None = None,
    batch_size: int = 4,
    dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """The parent's next-token log-probabilities ``(n, T, V)`` on ``tokens``, computed once.

    Cached in process and, with ``cache_dir``, as safetensors under it, keyed by ``parent_id``,
    ``data_id`` (e.g. a hash of the data record) and the tokens' content hash. Stored in
    ``dtype`` (float16 halves memory; its rounding moves a KL by ~1e-3 nats).
    """
    from autocompress_opt.quality.metrics import cache_teacher_logits
    from autocompress_opt.quality.metrics import log_probs as normalise

    key = hashlib.sha256(json.dumps([parent_id, data_id, tokens_id(tokens), str(dtype)]).encode()).hexdigest()[:24]
    if key in _TEACHER_MEMORY:
        _TEACHER_MEMORY.move_to_end(key)
        return _TEACHER_MEMORY[key]
    path = Path(cache_dir) / f"{key}.safetensors" if cache_dir is not None else None
    if path is not None and path.is_file():
        from safetensors.torch import load_file

        log_probs = load_file(str(path))["log_probs"]
    else:
        logits = cache_teacher_logits(model, tokens, batch_size=batch_size, progress=False)
        log_probs = normalise(logits).to(dtype)
        del logits
        if path is not None:
            from safetensors.torch import save_file

            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            save_file(
                {"log_probs": log_probs.contiguous()},
                str(tmp),
                metadata={"parent_id": parent_id, "data_id": str(data_id)},
            )
            tmp.replace(path)
    if tuple(log_probs.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"cached teacher log-probs {tuple(log_probs.shape)} do not fit tokens {tuple(tokens.shape)}")
    _TEACHER_MEMORY[key] = log_probs
    while len(_TEACHER_MEMORY) > _TEACHER_MEMORY_SIZE:
        _TEACHER_MEMORY.popitem(last=False)
    return log_probs


def clear_teacher_memory() -> None:
    """Forget the in-process cache (the files on disk stay)."""
    _TEACHER_MEMORY.clear()
