"""Where a model computes and in which floating format: the one place ``--device`` and
``--compute-dtype`` are resolved.

``device``: ``auto`` (the first CUDA GPU when torch sees one, else the CPU), ``cpu``, ``cuda`` or
``cuda:N``. CUDA asked for but absent is an error, never a silent fall-back to the CPU.

``compute_dtype``: ``auto`` (bf16 on a CUDA GPU that computes in bf16 natively, fp32 on the CPU),
``fast`` (as ``auto``, and bf16 on a CPU with bf16 instructions too: AVX512-BF16 or AMX, where
SmolLM2's forward and backward passes take about 0.45x the CPU time of fp32 and its pruned
children's KL to the parent moved by 0.2 % at most; fp32 on other CPUs), ``fp32``, ``bf16`` or
``fp16``: the dtype the parent's weights are loaded in and its forward passes run in. A GPU older
than Ampere (compute capability < 8.0: V100, T4) has no bf16 arithmetic; there ``auto`` falls back
to fp16 (or to fp32 where the caller cannot use fp16, e.g. training) with a warning naming the GPU,
and an explicit ``bf16`` runs (emulated, slowly) with the same warning.
Masks, KL divergences and the Lagrangian stay in fp32 whatever it is. This is not the *serving*
format (``--dtype`` of the cost model: the weight format the engine would serve, e.g. ``q4_k_m``).

``gpus``: how many GPUs a model is spread over, layer by layer, from ``device`` on (``cuda:N`` to
``cuda:N+gpus-1``); 1 keeps it whole on ``device``. :func:`placement_kwargs` turns a device and a GPU
count into what ``from_pretrained`` needs to stream the weights straight there (``device_map``; for
several GPUs accelerate's balanced map under a per-GPU ``max_memory``), so no copy of the model is
ever staged in host memory.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from autocompress_opt.errors import ConfigError, check_int

__all__ = [
    "COMPUTE_DTYPES",
    "DEVICES",
    "WEIGHT_SHARE",
    "bf16_supported",
    "check_compute_dtype",
    "check_device",
    "check_gpus",
    "cpu_bf16_native",
    "dtype_name",
    "free_gpu_bytes",
    "placement_kwargs",
    "resolve_compute_dtype",
    "resolve_device",
]

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# Share of each GPU's free memory a spread model's weights may take; the rest holds activations,
# teacher outputs and the child (transformers keeps the same 10 % for a single device).
WEIGHT_SHARE = 0.9

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
    """``spec`` normalised when it is ``auto``, ``fast`` or a name of :data:`COMPUTE_DTYPES`, else a
    :class:`ConfigError`."""
    text = str(spec).strip().lower()
    if text not in ("auto", "fast") and text not in COMPUTE_DTYPES:
        raise ConfigError(f"compute dtype {spec!r} is not one of auto, fast, {', '.join(COMPUTE_DTYPES)}")
    return text


def cpu_bf16_native() -> bool:
    """Whether this CPU has bf16 arithmetic instructions torch uses (x86 AVX512-BF16 or AMX tiles);
    elsewhere torch emulates bf16 on the CPU, slower than fp32."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


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


# bf16 arithmetic in hardware starts with Ampere (sm_80); torch.cuda.is_bf16_supported(including_emulation=False)
# applies the same rule to the current device only, so the rule is applied here to the device asked for.
_BF16_MIN_CAPABILITY = 8


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively: the CPU and ROCm GPUs always, a CUDA GPU from
    compute capability 8.0 (Ampere) on. Asks the driver about that GPU only."""
    if device.type != "cuda" or torch.version.hip:
        return True
    major, _ = torch.cuda.get_device_capability(device.index or 0)
    return major >= _BF16_MIN_CAPABILITY


def resolve_compute_dtype(spec: str, device: torch.device, *, without_bf16: torch.dtype = torch.float16) -> torch.dtype:
    """The floating dtype of ``spec`` on ``device``.

    ``auto``: bf16 on a CUDA GPU with native bf16 (:func:`bf16_supported`), else ``without_bf16``
    (fp16 by default; fp32 for a caller that cannot use fp16, e.g. training without loss scaling)
    with a ``UserWarning`` naming the GPU; fp32 on the CPU. ``fast``: as ``auto``, but bf16 on a CPU
    with bf16 instructions (:func:`cpu_bf16_native`). An explicit ``bf16`` on such a GPU is
    kept (torch emulates it) with a warning saying so.
    """
    text = check_compute_dtype(spec)
    if text == "fast":  # auto, plus bf16 on a CPU that computes it natively
        text = "bf16" if device.type == "cpu" and cpu_bf16_native() else "auto"
    wants_bf16 = text == "bf16" or (text == "auto" and device.type == "cuda")
    if wants_bf16 and device.type == "cuda" and not bf16_supported(device):
        gpu = _gpu_name(device)
        if text == "auto":
            warnings.warn(
                f"{gpu} has no native bf16 (compute capability < {_BF16_MIN_CAPABILITY}.0): compute dtype "
                f"'auto' uses {dtype_name(without_bf16)}; pass --compute-dtype to choose",
                stacklevel=2,
            )
            return without_bf16
        warnings.warn(
            f"{gpu} has no native bf16 (compute capability < {_BF16_MIN_CAPABILITY}.0): bf16 is emulated "
            "and slow there; fp16 or fp32 (--compute-dtype) run at the GPU's speed",
            stacklevel=2,
        )
    if text == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return COMPUTE_DTYPES[text]


def _gpu_name(device: torch.device) -> str:
    index = device.index or 0
    major, minor = torch.cuda.get_device_capability(index)
    return f"{str(device)!r} ({torch.cuda.get_device_name(index)}, sm_{major}{minor})"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bf16"`` (the names :func:`resolve_compute_dtype` takes)."""
    return next((n for n, d in COMPUTE_DTYPES.items() if d == dtype), str(dtype))


def check_gpus(gpus: Any) -> int:
    """``gpus`` when it is a positive int, else a :class:`ConfigError` naming it."""
    return check_int(gpus, "gpus (the GPUs a model is spread over)")


def free_gpu_bytes(indices: Sequence[int]) -> dict[int, int]:
    """Free memory in bytes of the CUDA GPUs ``indices`` (``torch.cuda.mem_get_info``, which opens a
    CUDA context on each: ask only about the GPUs a model is going to)."""
    return {i: int(torch.cuda.mem_get_info(i)[0]) for i in indices}


def placement_kwargs(
    device: torch.device,
    gpus: int = 1,
    *,
    free_bytes: Sequence[int] | None = None,
    weight_bytes: int | None = None,
) -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments that load a model straight onto ``device``, or
    spread it over ``gpus`` GPUs from ``device`` on. ``free_bytes``: the free memory of each GPU
    this process sees, ``cuda:0`` first (None: ask torch about the GPUs used, :func:`free_gpu_bytes`;
    given, the function is pure).

    - the CPU: ``{}`` (from_pretrained's own host load);
    - one GPU: ``{"device_map": {"": "cuda:N"}}``: each tensor read from the file goes to the GPU
      in the load dtype, never via a host copy of the model;
    - ``gpus = k > 1``: ``{"device_map": "balanced", "max_memory": {N: b, ..., N+k-1: b'}}``, each
      ``b`` :data:`WEIGHT_SHARE` of that GPU's free bytes and no CPU or disk entry, so nothing is
      offloaded: transformers gives each GPU about ``1/k`` of the layers and hooks that move the
      activations between them.

    ``weight_bytes`` (the model's parameters × the dtype's size), when given, must fit: one GPU's
    free memory, or the budgets of the ``k``. Raises :class:`ConfigError` naming the bad value:
    ``gpus`` not a whole number >= 1, ``gpus > 1`` off CUDA, more GPUs than this process sees, or
    weights that do not fit.
    """
    gpus = check_gpus(gpus)
    if gpus > 1 and device.type != "cuda":
        raise ConfigError(f"gpus={gpus}: only CUDA devices spread a model over GPUs, got device {str(device)!r}")
    if device.type != "cuda":
        return {} if device.type == "cpu" else {"device_map": {"": str(device)}}
    first = device.index or 0
    used = range(first, first + gpus)
    visible = len(free_bytes) if free_bytes is not None else torch.cuda.device_count()
    if gpus > 1 and used.stop > visible:
        raise ConfigError(
            f"gpus={gpus} from {str(device)!r}: this process sees {visible} CUDA GPU(s) (cuda:0..), "
            f"so at most {max(0, visible - first)} from there"
        )
    if free_bytes is not None:
        free = {i: int(free_bytes[i]) for i in used if i < visible}
    else:
        free = free_gpu_bytes([i for i in used if i < visible]) if weight_bytes is not None or gpus > 1 else {}
    if gpus == 1:
        if weight_bytes is not None and first in free and weight_bytes > free[first]:
            raise ConfigError(
                f"the model's weights need {weight_bytes / 2**30:.1f} GiB but {str(device)!r} has "
                f"{free[first] / 2**30:.1f} GiB free; spread it over several GPUs (--gpus-per-trial k) "
                "or use a smaller compute dtype"
            )
        return {"device_map": {"": str(device)}}
    budget = {i: int(free[i] * WEIGHT_SHARE) for i in used}
    if weight_bytes is not None and weight_bytes > sum(budget.values()):
        raise ConfigError(
            f"the model's weights need {weight_bytes / 2**30:.1f} GiB but {gpus} GPUs from {str(device)!r} have "
            f"{sum(budget.values()) / 2**30:.1f} GiB for them ({WEIGHT_SHARE:.0%} of their free memory); "
            "use more GPUs or a smaller compute dtype"
        )
    return {"device_map": "balanced", "max_memory": budget}
