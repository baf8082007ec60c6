"""The own cost model's efficiency factors fitted to AIConfigurator's per-layer sums (issue 45).

The inner search prices candidates with the differentiable roofline model (:mod:`.costmodel`), whose
per-(hardware, engine) factors (``mfu``, ``mbu``, ``kernel_launch_us``, ``step_overhead_ms``) come
from a :class:`~autocompress_opt.serving.profiles.CostProfile`. Where the optional backend
(:mod:`.aic`) is installed it prices the same architectures from measured kernels. This module
fits a profile's factors to the backend's prices over the shapes a search visits, so the
differentiable model agrees with the backend without losing its speed or its gradients:

* :func:`pruned_children`: per-layer pruned children of a parent, as the search makes them (query
  heads in whole KV groups, KV heads, FFN widths, attention or FFN blocks removed);
* :func:`backend_observations`: the backend's TTFT (one prefill of a static batch) and TPOT (its
  mean decode step) of each child at each batch, as :class:`~.fitting.Observation` values, with the
  own model's engine prefilling the batch in one step (``chunk_tokens=0``) so that both models time
  the same schedule and only the factors differ;
* :func:`fit_to_backend`: :func:`~.fitting.fit_profile` of the factors to those observations.

The fitted profile is an ordinary profile (``save_profile`` / ``load_profiles``): put in the user
profile folder it is what ``get_profile(engine, hardware)`` returns for that pair, in the inner
search as everywhere else. It holds no held-out residuals (it was fitted to the backend, not to
measurements), so predictions with it have no interval. ``benchmarks/bench_aic_fit.py`` writes
one per covered (hardware, engine) and the error before and after on held-out children.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.costmodel import Scenario
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.fitting import Observation, fit_profile
from autocompress_opt.serving.hardware import get_hardware
from autocompress_opt.serving.profiles import CostProfile

__all__ = ["FREE", "backend_observations", "fit_to_backend", "pruned_children"]

# The factors fitted: the roofline's two efficiencies and the fixed costs per kernel and per step.
# The all-reduce latency stays (the sample is tp=1), and so does the online front end's latency
# (the backend prices the engine's steps, not an HTTP server).
FREE: tuple[str, ...] = ("mfu", "mbu", "kernel_launch_us", "step_overhead_ms")
# KV-head counts per rank the backend's grouped-query attention tables hold (measured on its 0.12
# databases: 3, 5, 6 and 7 KV heads with more query heads than KV heads are missing).
_KV_HEADS = (1, 2, 4, 8)
_FFN_STEP = 256  # FFN widths in multiples of 256, as the search spaces' per-layer shapes


def pruned_children(parent: Architecture, n: int, seed: int) -> list[Architecture]:
    """``n`` per-layer pruned children of ``parent`` (a dense model); the same seed gives the same list.

    A third keep one drawn shape in every layer; the others draw each layer's own. A layer keeps
    ``g`` KV heads (at most the parent's, one of :data:`_KV_HEADS`), ``1..h/g`` query heads per
    KV head (``h/g`` the parent's group size), an FFN width in multiples of 256 from a quarter of
    the parent's to all of it, and drops its attention or its FFN with probability 0.1 each."""
    rng = random.Random(seed)
    head = parent.layers[0]
    kv_choices = [g for g in _KV_HEADS if g <= head.num_kv_heads] or [head.num_kv_heads]
    group = head.num_heads // head.num_kv_heads
    widths = range(max(head.ffn_width // 4 // _FFN_STEP, 1) * _FFN_STEP, head.ffn_width + 1, _FFN_STEP)

    def layer(drops: float) -> LayerSpec:
        kv = rng.choice(kv_choices)
        attention, ffn = rng.random() >= drops, rng.random() >= drops
        if not (attention or ffn):
            attention = True
        return LayerSpec(attention, kv * rng.randint(1, group), kv, head.head_dim, ffn, rng.choice(widths))

    children = []
    for i in range(n):
        if rng.random() < 1 / 3:
            layers = (layer(0.0),) * parent.num_layers
        else:
            layers = tuple(layer(0.1) for _ in range(parent.num_layers))
        children.append(replace(parent, layers=layers, name=f"{parent.name}-child{seed}-{i}"))
    return children


def backend_observations(
    archs: Sequence[Architecture],
    hardware: str,
    engine: str,
    dtype: str,
    batches: Sequence[int],
    input_len: int,
    output_len: int,
) -> tuple[list[Observation], int]:
    """The backend's ``ttft_ms`` and ``tpot_ms`` of every architecture at every batch (a static
    batch: ``batch`` prompts of ``input_len`` tokens prefilled together, then decoded together for
    ``output_len`` tokens), labelled ``<arch name>/b<batch>``; and how many (architecture, batch)
    pairs were left out because the backend's database lacks one of their shapes. The observations'
    engine prefills the batch in one step (``chunk_tokens=0``), the schedule the backend prices."""
    from autocompress_opt.serving.aic import AicPricer

    pricer = AicPricer(hardware, engine, dtype)
    hw, eng = get_hardware(hardware), get_engine(engine).with_options(chunk_tokens=0)
    out: list[Observation] = []
    missing = 0
    for arch in archs:
        for batch in batches:
            try:
                ttft = pricer.prefill_ms(arch, batch, input_len)
                tpot = pricer.tpot_ms(arch, batch, input_len, output_len)
            except ConfigError:
                missing += 1
                continue
            scenario = Scenario(dtype, input_len, output_len, batch)
            label = f"{arch.name}/b{batch}"
            out.append(Observation(arch, hw, eng, scenario, "ttft_ms", ttft, label))
            out.append(Observation(arch, hw, eng, scenario, "tpot_ms", tpot, label))
    return out, missing


def fit_to_backend(observations: Sequence[Observation], start: CostProfile, hardware: str) -> CostProfile:
    """``start``'s :data:`FREE` factors fitted to the backend's ``observations`` (log-space least
    squares, :func:`~.fitting.fit_profile`, with a weak pull toward ``start``), as the profile of
    ``hardware``; its other fields are ``start``'s, and ``fit`` is left for the caller to fill."""
    if not observations:
        raise ConfigError(f"no backend observations to fit the {start.engine} profile of {hardware} to")
    fitted = fit_profile(observations, replace(start, hardware=hardware, fit={}), free=FREE, prior_weight=1e-3)
    sig = lambda v: float(f"{v:.4g}")  # the fit is not more precise than four significant digits
    return fitted.with_parameters(**{k: sig(getattr(fitted, k)) for k in FREE})
