"""Calibrate the ``torch-eager`` cost profile of a machine against real timings.

1. Measure the device: peak dense FLOP/s (a large matmul) and memory bandwidth (streaming a
   buffer far larger than the caches) — for ``cpu`` these become the catalog's figures; a catalog
   GPU keeps its datasheet figures.
2. Time transformers' eager forward over a deterministic sweep of synthetic heterogeneous
   architectures (random depths, per-layer FFN widths and head counts), each built as the model
   export writes for it (:func:`~autocompress_opt.serving.timing.build_torch_model`): prefill
   (TTFT) and decode (time per output token with a KV cache), medians over repeats.
3. Fit the profile's efficiency factors and fixed costs (:func:`~autocompress_opt.serving.fitting.fit_profile`)
   on a training part of the sweep and report the median absolute percentage error (MdAPE) on the
   held-out part, for prefill and for decode separately.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.serving.costmodel import Scenario
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.fitting import Observation, fit_profile, heldout_split, mdape, relative_errors
from autocompress_opt.serving.hardware import Hardware, get_hardware
from autocompress_opt.serving.profiles import PRIORS, CostProfile, clear_cache, save_profile, user_profile_dir

__all__ = [
    "CalibrationResult",
    "calibrate",
    "fit_sweep",
    "interleaved_passes",
    "measure_cpu_figures",
    "measure_device",
]

ENGINE = "torch-eager"
DECODE_STEPS = 8


@dataclass(frozen=True)
class CalibrationResult:
    hardware: Hardware
    profile: CostProfile
    path: Path | None
    heldout_mdape: dict[str, float]  # {"prefill": 0.05, "decode": 0.04}
    train_mdape: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)


def measure_device(device: str = "cpu", dtype: Any = None, seconds: float = 1.0) -> tuple[float, float]:
    """(peak TFLOP/s of a large matmul, streaming bandwidth GB/s) measured on ``device``.

    Both are the *best* of repeated runs (a peak: on a shared machine other work only slows a run
    down); the matmul is 2048² fp32, the bandwidth a read of a 256 MiB buffer (bytes read / time).
    """
    import torch

    dtype = dtype or torch.float32
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    best_time = lambda fn: _best_time(fn, seconds, sync)
    n = 2048
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    with torch.inference_mode():
        tflops = 2 * n**3 / best_time(lambda: torch.mm(a, b)) / 1e12
        buf = torch.ones(256 * 2**20 // 4, dtype=torch.float32, device=device)
        gb_s = buf.numel() * 4 / best_time(lambda: buf.sum()) / 1e9
    return tflops, gb_s


def measure_cpu_figures(seconds: float = 1.0) -> dict[str, Any]:
    """Peak figures of the host CPU as a profile's ``reference`` (``peak_tflops`` per compute dtype,
    ``bandwidth_gb_s``): the best of several probes, because one library's kernel is not the
    machine's peak (torch's MKL matmul reaches less of an AMD CPU than OpenBLAS, ``sum`` streams
    faster than a matrix-vector product). fp32: torch's and numpy's 2048² matmul; bf16: torch's bf16
    matmul (AVX512-BF16/AMX where the CPU has them), at least the fp32 rate; bandwidth: torch's
    ``sum`` and numpy's matrix-vector product over 256 MiB. Each probe keeps its fastest run."""
    import torch

    fp32, gb_s = measure_device("cpu", torch.float32, seconds)
    bf16, _ = measure_device("cpu", torch.bfloat16, seconds)
    n = 2048
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    fp32 = max(fp32, 2 * n**3 / _best_time(lambda: a @ b, seconds) / 1e12)
    w = rng.standard_normal((8192, 8192), dtype=np.float32)  # 256 MiB
    x = rng.standard_normal(8192, dtype=np.float32)
    gb_s = max(gb_s, w.nbytes / _best_time(lambda: w @ x, seconds) / 1e9)
    return {
        "peak_tflops": {"fp32": round(fp32, 4), "bf16": round(max(bf16, fp32), 4)},
        "bandwidth_gb_s": round(gb_s, 2),
    }


def _best_time(fn: Callable[[], Any], seconds: float, sync: Callable[[], Any] = lambda: None) -> float:
    """The fastest of repeated runs of ``fn`` (at least 5, for at least ``seconds``) after one warm-up;
    ``sync`` waits for the device after each."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.min(times))


def _sweep(archs: list[Any], passes: int, progress: bool, desc: str, **kwargs: Any) -> list[Any]:
    """Time every architecture ``passes`` times, alternating forward and reverse order, and keep
    each point's fastest prefill and decode. On a shared machine other work only ever slows a run
    down, and drifts over minutes: interleaved passes and the minimum cancel most of it."""
    from tqdm.auto import tqdm

    from autocompress_opt.serving.timing import measure

    best: list[Any] = [None] * len(archs)
    bar = tqdm(total=passes * len(archs), desc=desc, disable=not progress)
    for _, i in interleaved_passes(len(archs), passes):
        t = measure(
            archs[i],
            decode_steps=DECODE_STEPS,
            seed=kwargs["seed"] + i,
            **{k: v for k, v in kwargs.items() if k != "seed"},
        )
        if best[i] is not None:
            t = replace(
                t,
                prefill_ms=min(t.prefill_ms, best[i].prefill_ms),
                decode_ms_per_token=min(t.decode_ms_per_token, best[i].decode_ms_per_token),
            )
        best[i] = t
        bar.update()
    bar.close()
    return best


def interleaved_passes(n: int, passes: int) -> list[tuple[int, int]]:
    """(pass, index) of ``passes`` timing passes over ``n`` models, forward then reverse order in
    turn, so that a slow spell of a shared machine falls on different models in each pass."""
    forward = list(range(n))
    return [(p, i) for p in range(passes) for i in (forward if p % 2 == 0 else forward[::-1])]


def calibrate(
    hardware: str = "cpu",
    *,
    n_archs: int = 48,
    prompt_len: int = 128,
    decode_context: int = 128,
    batch: int = 1,
    seed: int = 0,
    heldout_fraction: float = 0.25,
    passes: int = 2,
    device: str | None = None,
    compute_dtype: str = "auto",
    out: Path | None = None,
    progress: bool = True,
) -> CalibrationResult:
    """Measure, fit and save the ``torch-eager`` profile of ``hardware``; see the module doc.

    ``device`` (default ``cpu`` for ``hardware="cpu"``, else ``cuda``) and ``compute_dtype``
    (``auto``: bf16 on CUDA, fp32 on the CPU) are resolved by :mod:`autocompress_opt.hf.device`
    (CUDA asked for but absent is a :class:`ConfigError`); the sweep's models are built and timed in
    that dtype, which is also the serving format the fitted observations are costed in."""
    import torch

    from autocompress_opt.hf.device import dtype_name, resolve_compute_dtype, resolve_device
    from autocompress_opt.serving.timing import random_architectures

    resolved = resolve_device(device or ("cpu" if hardware == "cpu" else "cuda"))
    dtype = resolve_compute_dtype(compute_dtype, resolved)
    device, dtype_label = str(resolved), dtype_name(dtype)
    if hardware == "cpu":
        tflops, gb_s = measure_device("cpu")
        hw = Hardware(
            name="cpu",
            memory_gib=_host_memory_gib(),
            bandwidth_gb_s=round(gb_s, 2),
            peak_tflops={"fp32": round(tflops, 4), "bf16": round(tflops, 4)},
            note=f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
            source=f"measured by 'autocompress calibrate' on {datetime.now(timezone.utc):%Y-%m-%d}",
        )
    else:
        hw = get_hardware(hardware)

    archs = random_architectures(n_archs, seed=seed)
    rows: list[dict[str, Any]] = []
    timings = _sweep(
        archs,
        passes,
        progress,
        f"timing torch-eager on {hw.name}",
        batch=batch,
        prompt_len=prompt_len,
        decode_context=decode_context,
        seed=seed,
        device=device,
        dtype=dtype,
    )
    for i, (arch, timing) in enumerate(zip(archs, timings)):
        rows.append(
            {
                "arch": i,
                "summary": arch.summary(),
                "prefill_ms": timing.prefill_ms,
                "decode_ms_per_token": timing.decode_ms_per_token,
            }
        )
    profile, errs, heldout = fit_sweep(
        archs,
        hw,
        [row["prefill_ms"] for row in rows],
        [row["decode_ms_per_token"] for row in rows],
        dtype=dtype_label,
        prompt_len=prompt_len,
        decode_context=decode_context,
        batch=batch,
        heldout_fraction=heldout_fraction,
        seed=seed,
    )
    for i, row in enumerate(rows):
        row["split"] = "heldout" if i in heldout else "train"
    profile = replace(
        profile,
        fit={
            "method": "log-space least squares (L-BFGS) on real torch-eager timings",
            "date": f"{datetime.now(timezone.utc):%Y-%m-%d}",
            "device": device,
            "dtype": dtype_label,
            "threads": torch.get_num_threads(),
            "torch": str(torch.__version__),
            "sweep": {
                "n_archs": n_archs,
                "passes": passes,
                "seed": seed,
                "batch": batch,
                "prompt_len": prompt_len,
                "decode_context": decode_context,
            },
            "train_mdape": errs["train"],
            "heldout_mdape": errs["heldout"],
        },
    )
    path = out or user_profile_dir() / f"{hw.name}-{ENGINE}.yaml"
    save_profile(
        path,
        [profile],
        hardware=hw.to_dict() if hardware == "cpu" else None,
        header=f"torch-eager profile of {hw.name}, written by 'autocompress calibrate'.\n"
        f"held-out MdAPE: prefill {errs['heldout']['prefill']:.1%}, decode {errs['heldout']['decode']:.1%}",
    )
    clear_cache()
    return CalibrationResult(hw, profile, path, errs["heldout"], errs["train"], rows)


def fit_sweep(
    archs: list[Any],
    hw: Hardware,
    prefill_ms: list[float],
    decode_ms_per_token: list[float],
    *,
    dtype: str,
    prompt_len: int,
    decode_context: int,
    batch: int,
    heldout_fraction: float,
    seed: int,
) -> tuple[CostProfile, dict[str, dict[str, float]], list[int]]:
    """Fit the ``torch-eager`` profile of ``hw`` to a sweep's timings (step 3 of the module doc).

    ``prefill_ms[i]`` and ``decode_ms_per_token[i]`` are the timings of ``archs[i]`` (served as
    ``dtype``); a seeded ``heldout_fraction`` of the models is held out (:func:`heldout_split`).
    Returns the fitted profile (``fit`` not yet filled in), the MdAPE of prefill and decode on each
    split (``{"train": {...}, "heldout": {...}}``) and the held-out indices. Deterministic: the same
    timings give the same profile, so a committed sweep can be refitted and checked."""
    engine = get_engine(ENGINE)
    prefill_sc = Scenario(dtype=dtype, input_len=prompt_len, output_len=1, concurrency=batch)
    # measure.time_decode times DECODE_STEPS steps after the context: mean context ≈ context + steps/2.
    decode_sc = Scenario(dtype=dtype, input_len=decode_context + DECODE_STEPS // 2, output_len=1, concurrency=batch)
    prefill_obs = [
        Observation(arch, hw, engine, prefill_sc, "ttft_ms", ms, label=f"arch{i}")
        for i, (arch, ms) in enumerate(zip(archs, prefill_ms))
    ]
    decode_obs = [
        Observation(arch, hw, engine, decode_sc, "tpot_ms", ms, label=f"arch{i}")
        for i, (arch, ms) in enumerate(zip(archs, decode_ms_per_token))
    ]
    train, heldout = heldout_split(len(archs), heldout_fraction, seed)
    train_obs = [prefill_obs[i] for i in train] + [decode_obs[i] for i in train]
    profile = fit_profile(
        train_obs,
        replace(PRIORS[ENGINE], hardware=hw.name),
        free=("mfu", "mbu", "kernel_launch_us", "step_overhead_ms"),
        prior_weight=1e-4,
    )
    errs = {
        split: {
            "prefill": mdape(relative_errors([prefill_obs[i] for i in idx], profile)),
            "decode": mdape(relative_errors([decode_obs[i] for i in idx], profile)),
        }
        for split, idx in (("train", train), ("heldout", heldout))
    }
    return profile, errs, heldout


def _host_memory_gib() -> float:
    return round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
