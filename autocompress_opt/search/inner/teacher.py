"""The parent's next-token distributions on calibration tokens (the inner search's targets),
computed once per (parent, data, form) and cached in process (a small LRU) and on disk
(``.autocompress/teacher/``, :mod:`autocompress_opt.cache`).

Two forms: the full vocabulary of log-probabilities ``(n, T, V)`` (``V·2`` bytes a token in
float16: 98 KB for SmolLM2, 257 KB for Llama-3), or, where that would not fit a memory budget,
the top-k tokens of each position plus the mass of the rest
(:class:`~autocompress_opt.quality.metrics.TeacherTargets`, ``6k + 4`` bytes a token); the KL
against the latter is a lower bound of the full one (:func:`~autocompress_opt.quality.metrics.sparse_token_kl`).
:func:`teacher_form` chooses by the budget (:func:`~autocompress_opt.hf.memory.teacher_top_k`).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.cache import cache_key, fetch
from autocompress_opt.errors import ConfigError, check_int
from autocompress_opt.hf.memory import teacher_top_k
from autocompress_opt.prune.importance import tokens_id
from autocompress_opt.quality.metrics import Teacher, TeacherTargets, teacher_targets

__all__ = ["CACHE_VERSION", "clear_teacher_memory", "teacher_form", "teacher_log_probs"]


# ---------------------------------------------------------------------- teacher cache
_TEACHER_MEMORY: OrderedDict[str, Teacher] = OrderedDict()
_TEACHER_MEMORY_SIZE = 2  # entries (SmolLM2, 20 x 128 tokens, fp16, full: 0.25 GB each)
# The version of the targets' computation (quality.metrics.teacher_targets and this file's storage),
# part of every key: bump it when they change. (1: keys without a version.)
CACHE_VERSION = "teacher/2"


def teacher_form(teacher: Teacher) -> dict[str, Any]:
    """JSON-safe record of a teacher's form: ``form`` (``"full"`` or ``"top-k"``), ``k`` (None in
    full), ``bytes`` it takes and ``bytes_per_token``."""
    if isinstance(teacher, TeacherTargets):
        positions, form, k = teacher.ids.shape[:-1].numel(), "top-k", teacher.k
        nbytes = teacher.nbytes
    else:
        positions, form, k = teacher.shape[:-1].numel(), "full", None
        nbytes = teacher.numel() * teacher.element_size()
    return {"form": form, "k": k, "bytes": nbytes, "bytes_per_token": nbytes // max(positions, 1)}


def teacher_log_probs(
    model: Any,
    tokens: torch.Tensor,
    *,
    parent_id: str,
    data_id: str | None = None,
    cache_dir: str | Path | None = None,
    batch_size: int = 4,
    dtype: torch.dtype = torch.float16,
    top_k: int | None = None,
    budget_gib: float | None = None,
) -> Teacher:
    """The parent's next-token targets on ``tokens`` ``(n, T)``, computed once: the full
    log-probabilities ``(n, T, V)`` or, with ``top_k``, :class:`TeacherTargets` of the ``top_k``
    most likely tokens and the tail mass. ``budget_gib`` instead of ``top_k``: the full form when
    it fits that many GiB, else the largest ``k`` that fits (:func:`~autocompress_opt.hf.memory.teacher_top_k`;
    a :class:`ConfigError` when not even 64 do).

    Cached in process and, with ``cache_dir``, as safetensors under it, keyed by ``parent_id``,
    ``data_id`` (e.g. a hash of the data record), the tokens' content hash, ``dtype``, the form
    (``top_k``) and :data:`CACHE_VERSION` (:func:`~autocompress_opt.cache.fetch`: published whole,
    computed once by the processes of one host that want it at once). Values in ``dtype``
    (float16 halves memory; its rounding moves a KL by ~1e-3 nats). The parent runs
    ``batch_size`` rows at a time and only the kept form of each batch is held, so the full
    ``(n, T, V)`` float32 logits never exist at once.
    """
    check_int(batch_size, "batch_size")
    if budget_gib is not None:
        if top_k is not None:
            raise ConfigError("give teacher_log_probs either top_k or budget_gib, not both")
        top_k = teacher_top_k(tokens.numel(), _vocab(model), budget_gib, dtype.itemsize)
    if top_k is not None:
        top_k = min(check_int(top_k, "top_k"), _vocab(model))
    parts: list[Any] = [parent_id, data_id, tokens_id(tokens), str(dtype)]
    key = cache_key(CACHE_VERSION, *parts, *([f"top{top_k}"] if top_k else []))
    if key in _TEACHER_MEMORY:
        _TEACHER_MEMORY.move_to_end(key)
        return _TEACHER_MEMORY[key]
    compute = lambda: teacher_targets(model, tokens, batch_size=batch_size, dtype=dtype, top_k=top_k)
    if cache_dir is None:
        teacher = compute()
    else:
        write = lambda value, tmp: _save(value, tmp, parent_id, data_id)
        teacher, _ = fetch(Path(cache_dir) / f"{key}.safetensors", compute, write, _load)
    if tuple(teacher.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"cached teacher targets {tuple(teacher.shape)} do not fit tokens {tuple(tokens.shape)}")
    _TEACHER_MEMORY[key] = teacher
    while len(_TEACHER_MEMORY) > _TEACHER_MEMORY_SIZE:
        _TEACHER_MEMORY.popitem(last=False)
    return teacher


def clear_teacher_memory() -> None:
    """Forget the in-process cache (the files on disk stay)."""
    _TEACHER_MEMORY.clear()


def _save(teacher: Teacher, path: Path, parent_id: str, data_id: str | None) -> None:
    """Write ``teacher`` as one safetensors file at ``path`` (a cache temporary; see :func:`fetch`)."""
    from safetensors.torch import save_file

    tensors = teacher.as_dict() if isinstance(teacher, TeacherTargets) else {"log_probs": teacher.contiguous()}
    save_file(tensors, str(path), metadata={"parent_id": parent_id, "data_id": str(data_id), **_form_meta(teacher)})


def _form_meta(teacher: Teacher) -> dict[str, str]:
    record = teacher_form(teacher)
    return {"form": record["form"], "k": str(record["k"])}


def _load(path: Path) -> Teacher:
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    if "ids" in tensors:
        return TeacherTargets(tensors["ids"], tensors["log_probs"], tensors["tail_log_mass"])
    return tensors["log_probs"]


def _vocab(model: Any) -> int:
    """The width of the model's logits: its output embedding's rows (the config's vocabulary size
    for a model without one)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
