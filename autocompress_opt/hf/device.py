"""Where a model computes and in which floating format: the one place ``--device`` and
``--compute-dtype`` are resolved.

``device``: ``auto`` (the first CUDA GPU when torch sees one, else the CPU), ``cpu``, ``cuda`` or
``cuda:N``. CUDA asked for but absent is an error, never a silent fall-back to the CPU.

``compute_dtype``: ``auto`` (bf16 on CUDA, fp32 on the CPU), ``fp32``, ``bf16`` or ``fp16``: the
dtype the parent's weights are loaded in and its forward passes run in. Masks, KL divergences and
the Lagrangian stay in fp32 whatever it is. This is not the *serving* format (``--dtype`` of the
cost model: the weight format the engine would serve, e.g. ``q4_k_m``).
"""

from __future__ import annotations

import re

import torch

from autocompress_opt.errors import ConfigError

__all__ = [
    "COMPUTE_DTYPES",
    "DEVICES",
    "check_compute_dtype",
    "check_device",
    "dtype_name",
    "resolve_compute_dtype",
    "resolve_device",
]

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


_DEVICE_SYNTAX = re.compile(r"auto|cpu|cuda(?::\d+)?")


def check_device(spec: str) -> str:
    """``spec`` normalised (lower case) when it is a device name of :data:`DEVICES`, else a
    :class:`ConfigError`; whether the device exists here is :func:`resolve_device`'s concern (a
    driver may check a worker's setting without its GPU)."""
    text = str(spec).strip().lower()
    if not _DEVICE_SYNTAX.fullmatch(text):
        raise ConfigError(f"device {spec!r} is not one of {', '.join(DEVICES)}")
    return text


def check_compute_dtype(spec: str) -> str:
    """``spec`` normalised when it is ``auto`` or a name of :data:`COMPUTE_DTYPES`, else a :class:`ConfigError`."""
    text = str(spec).strip().lower()
    if text != "auto" and text not in COMPUTE_DTYPES:
        raise ConfigError(f"compute dtype {spec!r} is not one of auto, {', '.join(COMPUTE_DTYPES)}")
    return text


def resolve_device(spec: str) -> torch.device:
    """The :class:`torch.device` of ``spec`` (see the module doc); a :class:`ConfigError` naming the
    bad value and the valid ones, or saying that CUDA is not available here."""
    text = check_device(spec)
    if text == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    assert match is not None  # check_device
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {spec!r} asked for, but torch {torch.__version__} sees no CUDA GPU here "
            "(a CPU build of torch, or no driver); use --device cpu, or install the CUDA build of torch"
        )
    index = int(match[1] or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), cuda:0..")
    return torch.device("cuda", index)


def resolve_compute_dtype(spec: str, device: torch.device) -> torch.dtype:
    """The floating dtype of ``spec`` on ``device`` (``auto``: bf16 on CUDA, fp32 elsewhere)."""
    text = check_compute_dtype(spec)
    if text == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return COMPUTE_DTYPES[text]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bf16"`` (the names :func:`resolve_compute_dtype` takes)."""
    return next((n for n, d in COMPUTE_DTYPES.items() if d == dtype), str(dtype))
