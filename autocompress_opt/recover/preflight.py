"""Checks and set-up a distillation run does before it trains: the student's directory, the device
and the precision (compute dtype over master weights), activation checkpointing of the decoder
layers, and whether student and teacher can be distilled at all (vocabulary, context)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.errors import ConfigError

__all__ = ["check_compatible", "checkpoint_layers", "resolve_student_dir", "training_device", "training_dtypes"]


def resolve_student_dir(ref: str | Path) -> Path:
    path = Path(ref).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"student directory {str(ref)!r} does not exist; pass a checkpoint directory "
            "(e.g. the --out of `autocompress prune`)"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(f"student directory {str(ref)!r} has no config.json; expected an exported checkpoint")
    return path.resolve()


def training_device(device: str, bf16: bool) -> tuple[torch.device, str]:
    """The training device of ``device`` (:func:`~autocompress_opt.hf.device.resolve_device`: cpu,
    cuda, cuda:N or auto) and the precision label of ``bf16`` autocast, which is for CUDA only.

    Under torchrun (``LOCAL_RANK`` set), ``auto`` or ``cuda`` on a CUDA machine is this process's
    local GPU, ``cuda:LOCAL_RANK``, with or without FSDP: every rank on ``cuda:0`` would share one
    GPU's memory. An explicit ``cuda:N`` is kept."""
    from autocompress_opt.hf.device import check_device, resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cuda" and check_device(device) in ("auto", "cuda") and "LOCAL_RANK" in os.environ:
        resolved = _local_rank_gpu(os.environ["LOCAL_RANK"])
    if bf16 and resolved.type != "cuda":
        raise ConfigError(f"bf16 autocast is for CUDA only; on {device!r} training runs in float32")
    return resolved, "bf16-autocast" if bf16 else "fp32"


def _local_rank_gpu(local_rank: str) -> torch.device:
    """``cuda:LOCAL_RANK``, or a :class:`ConfigError` when this node has fewer GPUs than ranks."""
    try:
        index = int(local_rank)
    except ValueError:
        raise ConfigError(f"LOCAL_RANK must be a whole number (torchrun sets it), got {local_rank!r}") from None
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ConfigError(
            f"LOCAL_RANK {index}: this node has {count} CUDA GPU(s); start at most {count} processes per node "
            "(torchrun --nproc_per_node)"
        )
    return torch.device("cuda", index)


def training_dtypes(
    spec: str, device: torch.device, precision: str, pure_bf16: bool = False
) -> tuple[torch.dtype, torch.dtype, str]:
    """The student's and the teacher's weight dtypes for ``compute_dtype`` on ``device``, and the
    run's precision label: ``fp32``, ``bf16-autocast`` (``bf16=True``), ``bf16-mixed`` (bf16
    compute, fp32 master weights) or ``bf16`` (``pure_bf16``)."""
    from autocompress_opt.hf.device import resolve_compute_dtype

    # No fp16 training (it needs loss scaling): a GPU without bf16 trains `auto` in fp32.
    dtype = resolve_compute_dtype(spec, device, without_bf16=torch.float32)
    if dtype == torch.float16:
        raise ConfigError(
            f"compute dtype {spec!r} (fp16) is not supported for training (it needs loss scaling); use bf16 or fp32"
        )
    if dtype == torch.float32:
        if pure_bf16:
            raise ConfigError(
                f"pure_bf16 (--pure-bf16) keeps bf16 weights: it needs compute_dtype 'bf16', got {spec!r}"
            )
        return dtype, dtype, precision
    if precision == "bf16-autocast":
        raise ConfigError(
            "pass either bf16=True (--bf16: autocast on CUDA) or compute_dtype='bf16', not both (they "
            "both compute in bf16 over float32 weights)"
        )
    if pure_bf16:
        return torch.bfloat16, torch.bfloat16, "bf16"
    return torch.float32, torch.bfloat16, "bf16-mixed"


def checkpoint_layers(model: Any) -> None:
    """Activation checkpointing of every decoder layer (non-reentrant ``torch.utils.checkpoint``):
    transformers' own switch where the model has it, else each layer's forward wrapped alike."""
    import functools

    from torch.utils.checkpoint import checkpoint

    if getattr(model, "supports_gradient_checkpointing", False):
        model.activation_checkpointing_enable()
        return
    from autocompress_opt.hf.adapters import adapter_for

    for part in adapter_for(model).all_layer_parts(model):
        layer = part.layer
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)


def check_compatible(student: Any, teacher: Any, student_dir: Path, teacher_ref: str | Path, seq_len: int) -> None:
    """The student and teacher modules share a vocabulary and hold ``seq_len`` positions (a meta-device
    student does: only shapes and the config are read)."""
    vocab_s = student.get_output_embeddings().weight.shape[0]
    vocab_t = teacher.get_output_embeddings().weight.shape[0]
    if vocab_s != vocab_t:
        raise ConfigError(
            f"teacher {str(teacher_ref)!r} has a vocabulary of {vocab_t:,} tokens but student "
            f"{str(student_dir)!r} has {vocab_s:,}; distillation compares next-token distributions, "
            "so both must share one tokenizer"
        )
    for who, loaded in (("student", student), ("teacher", teacher)):
        context = getattr(loaded.config, "max_position_embeddings", None)
        if context is not None and seq_len > context:
            raise ConfigError(f"seq_len {seq_len} exceeds the {who}'s context of {context} positions")
