"""Serving cost model: latency, throughput and memory of an architecture on (hardware, engine).

One set of equations (DESIGN.md §3), written once over an array module, serves three callers:

* :func:`estimate_cost` — one :class:`Architecture`, Python floats (reports, the CLI);
* :func:`estimate_batch` with numpy arrays — thousands of candidates at once (outer-loop filter);
* :func:`estimate_batch` with torch tensors — differentiable with respect to continuous per-layer
  widths (``heads``, ``kv_heads``, ``ffn_width``) and soft keep gates (``attn``, ``ffn``).

Every layer is summed on its own (never ``layers x one layer``). Per layer, the GEMMs and the
attention are separate kernels, each timed by its own roofline::

    t = max(FLOPs / (peak · mfu), bytes / (bandwidth · mbu))

plus ``kernel_launch_us`` per kernel, ``step_overhead_ms`` per engine step and, with tensor
parallelism, two all-reduces per layer (latency + 2(tp-1)/tp · message / one-way link bandwidth).
The *floors* use the same equations at 100 % of peak with no fixed costs: the physical limit.
``peak`` for a GEMM is the rate of the weight format's compute dtype (``Hardware.compute_dtype``),
except that llama.cpp (``Engine.fp16_accumulate``) multiplies FP16 and GGUF block-quantised weights
at the device's FP16-with-FP16-accumulate rate (``Hardware.half_accumulate_flops``: twice the BF16
rate on GeForce cards), and with ``mmq=0`` (its cuBLAS path) first dequantises every matrix to FP16
in each prefill step of more than 32 tokens: one more memory pass of ``lin·(bits/8 + 2)`` bytes.

Attention, per layer ``i`` with ``g_i`` KV heads, ``h_i`` query heads of ``d`` channels and a window
of ``w_i`` tokens (``LayerSpec.window``; a full-attention layer has ``w_i = ∞``), batch ``B``, prompt
``P``, ``S`` KV tokens reserved per sequence (``P + O`` in blocks; llama.cpp: its whole ``n_ctx``),
decode at the mean context ``c = P + O/2``, ``b_kv`` bytes per cached element::

    KV bytes per sequence   = Σ_i 2·b_kv·g_i·d·min(S, ⌈w_i⌉)     (⌈w_i⌉: w_i in whole KV blocks)
    prefill (query, key) pairs of layer i = B·Σ_{t=1..P} min(t, w_i)
                                          = B·(m(m+1)/2 + (P − m)·w_i),  m = min(P, w_i)
    decode pairs = KV tokens read per step of layer i = B·min(c, w_i)

and attention FLOPs = ``4·pairs·h_i·d``. Every supported engine caches only the window of a
sliding layer (see :func:`estimate_batch`). The ``kv_bytes_per_token`` metric is the KV bytes per
sequence divided by ``S``: the mean bytes a reserved token costs at the scenario's length. Without
windows that is the familiar ``2·b_kv·d·Σ_i g_i``; a sliding layer adds ``2·b_kv·g_i·d·min(1, ⌈w_i⌉/S)``.

Mixture-of-experts and Mamba-2 layers (issue 30; :class:`ArchArrays` columns that are zero in a
dense layer, so dense costs are unchanged bit for bit). A MoE layer of ``E`` routed experts of
``p_e`` parameters, ``k`` per token, and ``p_s`` parameters every token runs (router, latent
projections, shared expert) computes ``2·(p_s + k·p_e)`` FLOPs per token (grouped GEMM) and, in a
step of ``T`` tokens (a decode step: the batch ``B``; a prefill step: its chunk of prompt tokens),
reads ``p_s + E·(1 − (1 − k/E)^T)·p_e`` parameters: the expected distinct experts the step's
tokens touch (:func:`experts_touched`; ``k`` at ``T = 1``, all ``E`` as ``T`` grows). Every expert
is resident. A Mamba-2 mixer's projections are GEMMs every token runs; its scan and depthwise
convolution (``5·H·P·N + 2·C·K`` FLOPs per token) and the read and write of each sequence's
state in every step are timed like attention; the state (``H·P·N + C·(K − 1)`` elements per
layer, at ``Engine.mamba_state_dtype``, float32 by default) is held per sequence beside the KV
cache, which only attention layers have. ``active_params`` is the parameters one token touches
(:meth:`Architecture.active_params`; all of them in a dense model).

Arrival regimes (``Scenario.arrival``; DESIGN.md §3), with ``B`` sequences running at once
(``concurrency``, or the memory limit for ``"max"``), ``Pf(b)`` the time to prefill a wave of ``b``
prompts together in ``K = ⌈b·P / chunk_tokens⌉`` steps (with the decodes those steps carry, below),
``t(n)`` one decode step of ``n`` sequences and ``T_w(b) = Pf(b) + (O − 1)·t(b − M/(O − 1))`` the
wave's time until its last token::

    burst    N requests (default B) arrive at once and run in waves of b = min(N, B):
             n = ⌊N / b⌋ full waves, r = N − n·b left for a last one;
             makespan = n·T_w(b) + T_w(r);  throughput = N·O / makespan (everyone's prefill inside);
             mean TTFT = [b·(T_w(b)·n(n−1)/2 + n·TTFT(b)) + r·(n·T_w(b) + TTFT(r))] / N, where a
             wave's mean TTFT(b) = (b + 1)/(2b)·Pf(b) when prefill is chunked (the prompts finish
             first come first served, K/b steps apart) and Pf(b) when a whole batch is prefilled in
             one step.  With chunking, a request that has its first token decodes in each later
             prefill step of its wave: the K steps carry M = Σ_{i<b} min(i·K/b, O − 1) decode tokens
             beside the prompts (Pf(b) times the prompts and them, weights read once a step), and
             the O − 1 decode-only steps after them run b − M/(O − 1) sequences on average (the
             earliest requests finish first).  Per request TPOT = (E2E − TTFT)/(O − 1), as
             benchmark tools measure it, so a wave's mean
                 TPOT(b) = t(b − M/(O − 1)) + (M/b)·(Pf(b)/K − t(b − M/(O − 1))) / (O − 1):
             M/b of a request's steps are prefill steps of the later prompts.  Without chunking, or
             at b = 1, M = 0 and TPOT(b) = t(b).  mean TPOT = (n·b·TPOT(b) + r·TPOT(r)) / N and
             mean E2E = TTFT + (O − 1)·TPOT.  N = B is the plain batch (and N = B = 1
             single-stream latency).
    steady   B requests always in flight (one replaces each that finishes); a new prompt's prefill
             runs in k = ⌈P / c⌉ chunks of c = min(P, chunk_tokens − (B − 1)) tokens, each step
             shared with the others' decodes. A request lives L = k + O − 1 steps, so D = (B−1)(O−1)/L
             other sequences decode beside it and F = (B−1)·P/L other prefill tokens ride on each of
             its decode steps: a fraction q = min(1, F/c) of them carry a chunk.
             TTFT = t(k steps: P + k·D tokens);  TPOT = q·t(1 + D + c tokens) + (1 − q)·t(1 + D);
             throughput = B·O / (TTFT + (O − 1)·TPOT).  At B = 1 this is single-stream latency.
    poisson  requests arrive at ``rate`` λ per second: the steady regime at the mean number in
             flight B = λ·E2E(B) (Little's law; a fixed point, no queueing while B fits the memory).
             Past the capacity (B beyond ``max_concurrency``) latencies are infinite. A one-user
             engine (llama.cpp) is an M/D/1 queue: each request waits ρ·S / (2(1 − ρ)) before it
             starts, S its single-stream E2E and ρ = λ·S.

Contract: costs are pure functions of their inputs; at fixed concurrency no latency or memory
metric rises, and throughput does not fall, when any width shrinks (property-tested).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError, check_bool, check_choice, check_int, check_number
from autocompress_opt.serving.arch_arrays import FULL_WINDOW, ArchArrays, Array
from autocompress_opt.serving.dtypes import get_weight_dtype, kv_dtype_bytes
from autocompress_opt.serving.engine_models import GIB, Engine, get_engine
from autocompress_opt.serving.hardware import Hardware, get_hardware
from autocompress_opt.serving.profiles import CostProfile, get_profile
from autocompress_opt.serving.regimes import _burst, _poisson, _steady
from autocompress_opt.serving.roofline import (
    LayerSums,
    _Bytes,
    _bytes,
    _Ops,
    _rates,
    _Setup,
    _structure,
    experts_touched,
)
from autocompress_opt.serving.roofline import _Structure as LayerTerms

# The equations live in three modules (this doc covers them all): serving.arch_arrays (the input
# arrays), serving.roofline (one phase's time) and serving.regimes (the arrival regimes); this one
# holds the scenario, the estimate and the public functions, and re-exports FULL_WINDOW and ArchArrays.
__all__ = [
    "ARRIVALS",
    "FULL_WINDOW",
    "METRICS",
    "ArchArrays",
    "CostEstimate",
    "LayerSums",
    "LayerTerms",
    "Scenario",
    "cost_intervals",
    "describe_regime",
    "estimate_batch",
    "estimate_cost",
    "estimate_from_sums",
    "experts_touched",
    "layer_terms",
    "max_concurrency_from_sums",
    "regime_of",
]

# How requests reach the engine (module doc): all at once, a constant number in flight, or at random
# times at a mean rate.
ARRIVALS: tuple[str, ...] = ("burst", "steady", "poisson")

METRICS: tuple[str, ...] = (
    "weights_gib",
    "kv_bytes_per_token",
    "peak_memory_gib",
    "max_concurrency",
    "ttft_ms",
    "tpot_ms",
    "e2e_latency_ms",
    "output_throughput_tok_s",
    "ttft_floor_ms",
    "tpot_floor_ms",
    "active_params",
)


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Scenario:
    """What is served: weight/KV formats, tensor parallelism and the request shape.

    ``concurrency`` is a number of simultaneous sequences or ``"max"`` (as many as memory and the
    engine allow). ``kv_dtype=None`` takes the engine's default for the weight format. ``arrival``,
    ``requests`` and ``rate`` choose the regime (module doc). ``online``: requests come through the
    engine's HTTP front end (``vllm serve``, ``trtllm-serve``, Triton, NIM), which adds the profile's
    ``request_overhead_ms`` to TTFT and E2E; False is an in-process engine or a bare benchmark loop.
    """

    dtype: str = "bf16"
    input_len: int = 1024
    output_len: int = 256
    concurrency: int | str = 1
    tp: int = 1
    kv_dtype: str | None = None
    arrival: str = "burst"
    requests: int | None = None
    rate: float | None = None
    online: bool = False

    def __post_init__(self) -> None:
        get_weight_dtype(self.dtype)
        if self.kv_dtype is not None:
            kv_dtype_bytes(self.kv_dtype)
        for name in ("input_len", "output_len", "tp"):
            check_int(getattr(self, name), name)
        check_int(self.concurrency, "concurrency", also=("max",))
        check_bool(self.online, "online")
        check_choice(self.arrival, "arrival", ARRIVALS)
        r = self.requests
        if r is not None:
            check_int(r, "requests (a burst's size)")
            if self.arrival != "burst":
                raise ConfigError(f"requests (a burst's size) is for arrival 'burst', got arrival {self.arrival!r}")
        if self.arrival == "poisson":
            check_number(self.rate, "rate (requests/s; arrival 'poisson' needs one)")
        elif self.rate is not None:
            raise ConfigError(f"a rate is for arrival 'poisson'; arrival {self.arrival!r} takes concurrency instead")


@dataclass(frozen=True)
class CostEstimate:
    """The cost of serving one architecture in one scenario (units in the names)."""

    weights_gib: float
    kv_bytes_per_token: float
    peak_memory_gib: float
    max_concurrency: int
    ttft_ms: float
    tpot_ms: float
    e2e_latency_ms: float
    output_throughput_tok_s: float
    ttft_floor_ms: float
    tpot_floor_ms: float
    active_params: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def regime_of(scenario: Scenario) -> str:
    """The regime label residuals are pooled by: ``single`` (one request at a time, whatever the
    arrival), else the arrival (``burst``, ``steady``, ``poisson``)."""
    one_at_a_time = scenario.concurrency == 1 and (scenario.requests or 1) == 1
    if scenario.arrival != "poisson" and one_at_a_time:
        return "single"
    return scenario.arrival


def cost_intervals(
    metrics: Mapping[str, Any], scenario: Scenario, profile: CostProfile, confidence: float, sparse: bool = False
) -> dict[str, Any]:
    """``<metric>_low`` / ``<metric>_high`` for TTFT, TPOT, E2E and output throughput: the
    prediction scaled by the held-out time ratios of ``profile`` in this scenario's regime
    (:meth:`CostProfile.interval`); neither end of a latency's interval below its roofline floor. Values have
    the type of ``metrics``' (floats, numpy or torch arrays); None where the profile holds no
    residuals (e.g. an unfitted or CPU-calibrated profile). ``sparse``: the model has MoE or Mamba-2
    layers, whose intervals come from the MoE/hybrid rows' residuals where the profile has them."""
    regime = regime_of(scenario)
    out: dict[str, Any] = {}
    for metric in ("ttft_ms", "tpot_ms", "e2e_latency_ms", "output_throughput_tok_s"):
        bounds = profile.interval(metric, regime, confidence, sparse)
        value = metrics[metric]
        if bounds is None:
            out[f"{metric}_low"] = out[f"{metric}_high"] = None
        elif metric.endswith("_ms"):
            floor = metrics.get(metric.replace("_ms", "_floor_ms").replace("e2e_latency", "e2e"))
            low, high = value * bounds.low, value * bounds.high
            if floor is not None:  # no end below the physical limit (so low <= high still)
                low, high = _Ops(low).max(low, floor), _Ops(high).max(high, floor)
            out[f"{metric}_low"], out[f"{metric}_high"] = low, high
        else:  # a throughput: the time bounds inverted
            out[f"{metric}_low"], out[f"{metric}_high"] = value / bounds.high, value / bounds.low
    return out


def describe_regime(scenario: Scenario, cost: CostEstimate) -> str:
    """One line saying which arrival regime ``cost`` was computed for, with its numbers."""
    fitting = max(cost.max_concurrency, 1)
    batch = fitting if scenario.concurrency == "max" else int(scenario.concurrency)
    if scenario.arrival == "poisson":
        rate = float(scenario.rate or 0.0)
        if not np.isfinite(cost.e2e_latency_ms):
            capacity = cost.output_throughput_tok_s / scenario.output_len
            return (
                f"poisson arrivals at {rate:g} requests/s: beyond the capacity of about {capacity:.3g} requests/s "
                f"({fitting:,} in flight at most); the queue grows without bound, latencies are infinite"
            )
        return (
            f"poisson arrivals at {rate:g} requests/s: {rate * cost.e2e_latency_ms / 1e3:.2f} requests in flight on "
            f"average (Little's law); prefill chunks interleave with decode at that concurrency"
        )
    if scenario.arrival == "steady":
        if batch == 1:
            return "single stream: one request in flight at a time (steady concurrency 1)"
        return (
            f"steady concurrency: {batch:,} requests always in flight; each new prompt's prefill is chunked into "
            f"steps shared with the others' decode, which lengthens both TTFT and TPOT"
        )
    requests = scenario.requests or batch
    wave = min(requests, batch)
    if requests == 1:
        return "single stream: one request (burst of 1)"
    waves = -(-requests // wave)
    return (
        f"burst: {requests:,} requests arrive at once and run in {waves:,} wave(s) of up to {wave:,}, each "
        f"prefilled together then decoded; throughput over the whole run, everyone's prefill included; "
        f"TTFT/TPOT/E2E are means over the requests"
    )


# ------------------------------------------------------------------------ the model
def estimate_batch(
    arrays: ArchArrays,
    hardware: Hardware | str,
    engine: Engine | str,
    scenario: Scenario,
    profile: CostProfile | None = None,
    bounds: bool = False,
    floors: bool = True,
) -> dict[str, Array]:
    """Every metric of :data:`METRICS` for a batch of architectures, as ``(N,)`` arrays.

    ``floors=False`` leaves out the roofline floors (``ttft_floor_ms``, ``tpot_floor_ms``), which
    take half the time: for callers that only judge constraints (a constraint never names a floor);
    every other metric is the same, bit for bit. ``bounds=True`` needs the floors.

    ``bounds=True`` adds what validation compares measurements with: ``e2e_floor_ms``,
    ``decode_throughput_tok_s`` (sequences decoding x 1000 / TPOT), ``prefill_throughput_tok_s``
    (prompt tokens of one wave x 1000 / its TTFT), the physical ceilings of the three throughputs
    (``*_ceiling_tok_s``) and ``running`` (sequences in flight: the wave, B, or Little's B).

    Works on numpy arrays and on torch tensors (differentiable through widths and gates; the
    integer-valued ``max_concurrency`` carries no gradient). See the module doc for the equations.

    Sliding-window layers cache at most ``window`` tokens per sequence in every engine modelled:
    vLLM's hybrid KV-cache manager frees a sliding layer's blocks that leave the window, llama.cpp
    (``llama_kv_cache_iswa``, unless ``--swa-full``) sizes a separate SWA cache, TensorRT-LLM
    keeps a cyclic cache of ``max_attention_window`` tokens, and transformers' ``DynamicCache``
    a sliding layer per window. vLLM and llama.cpp also hold up to one prefill chunk (``n_ubatch``)
    beyond the window while it is written; that slack is not modelled.
    """
    eng = get_engine(engine) if isinstance(engine, str) else engine
    return estimate_from_sums(
        arrays,
        LayerSums.of(layer_terms(arrays, eng, scenario), _Ops(arrays.hidden)),
        hardware,
        eng,
        scenario,
        profile,
        bounds,
        floors,
    )


def layer_terms(arrays: ArchArrays, engine: Engine | str, scenario: Scenario) -> LayerTerms:
    """Each layer's own terms ``(N, L)`` of the cost model for ``arrays`` served by ``engine`` in
    ``scenario`` (parameters, KV bytes, activation width, what a phase's roofline reads): the
    contributions :class:`LayerSums` adds up. Elementwise in the layers: a layer's terms depend on
    its columns and the per-architecture fields only, whatever the other layers are."""
    eng = get_engine(engine) if isinstance(engine, str) else engine
    dt = get_weight_dtype(scenario.dtype)
    kv_bytes = kv_dtype_bytes(scenario.kv_dtype or eng.default_kv_dtype(dt.name))
    seq_tokens = eng.kv_tokens_per_sequence(scenario.input_len, scenario.output_len)
    return _structure(arrays, kv_bytes, kv_dtype_bytes(eng.mamba_state_dtype), eng, seq_tokens, _Ops(arrays.hidden))


def estimate_from_sums(
    arrays: ArchArrays,
    sums: LayerSums,
    hardware: Hardware | str,
    engine: Engine | str,
    scenario: Scenario,
    profile: CostProfile | None = None,
    bounds: bool = False,
    floors: bool = True,
) -> dict[str, Array]:
    """:func:`estimate_batch`'s metrics from the sums over layers (``sums``, :class:`LayerSums`) and
    ``arrays``' per-architecture fields (its per-layer ones are not read): the memory, the
    concurrency it allows and the regimes' timings are functions of these alone. The one
    implementation of the non-additive step: :func:`estimate_batch` is this of
    ``LayerSums.of(layer_terms(arrays, ...))``."""
    if bounds and not floors:
        raise ConfigError("estimate_batch: bounds=True needs the floors; got floors=False")
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    eng = get_engine(engine) if isinstance(engine, str) else engine
    prof = profile or get_profile(eng.name, hw.name)
    _check_scenario(hw, eng, scenario)
    dt = get_weight_dtype(scenario.dtype)
    kv_bytes = kv_dtype_bytes(scenario.kv_dtype or eng.default_kv_dtype(dt.name))
    ops = _Ops(arrays.hidden)
    tp, p_len, o_len = scenario.tp, scenario.input_len, scenario.output_len
    seq_tokens = eng.kv_tokens_per_sequence(p_len, o_len)
    m = _memory(arrays, sums, hw, eng, scenario, ops)
    sizes, max_conc, kv_seq, fixed_gib, weights_dev = m.sizes, m.max_conc, m.kv_seq, m.fixed_gib, m.weights_dev
    kv_seq_bytes, activation_bytes = sums.kv_seq_bytes, m.activation_bytes
    batch = max_conc if scenario.concurrency == "max" else max_conc * 0 + float(scenario.concurrency)
    batch_pos = ops.max(batch, 1.0)  # time a sequence even where none fits; memory flags it
    setup = _Setup(arrays, sums, sizes, dt, kv_bytes, eng, tp, ops, float(p_len), float(o_len))

    out: dict[str, Array] = {}
    for floor in (False, True) if floors else (False,):
        rates = _rates(hw, eng, dt, prof, floor)
        if scenario.arrival == "burst":
            requests = batch_pos if scenario.requests is None else batch_pos * 0 + float(scenario.requests)
            timing = _burst(setup, rates, batch_pos, requests)
        elif scenario.arrival == "steady":
            timing = _steady(setup, rates, batch_pos)
        else:
            timing = _poisson(setup, rates, float(scenario.rate or 0.0), ops.max(max_conc, 1.0))
        suffix = "_floor" if floor else ""
        out[f"ttft{suffix}_ms"], out[f"tpot{suffix}_ms"] = timing.ttft, timing.tpot
        out["e2e_floor_ms" if floor else "e2e_latency_ms"] = timing.e2e
        tput = "{}_throughput_ceiling_tok_s" if floor else "{}_throughput_tok_s"
        out[tput.format("output")] = timing.throughput
        out[tput.format("decode")] = timing.running * 1e3 / timing.tpot
        out[tput.format("prefill")] = timing.prefilled * p_len * 1e3 / timing.wave_ttft
        if not floor:
            out["running"] = timing.running
    # An online request's fixed latency in the HTTP front end (CostProfile.request_overhead_ms): in
    # TTFT and E2E, not in a run's throughput (it overlaps the GPU's work), not in the floors.
    if scenario.online:
        out["ttft_ms"] = out["ttft_ms"] + prof.request_overhead_ms
        out["e2e_latency_ms"] = out["e2e_latency_ms"] + prof.request_overhead_ms
    in_flight = ops.max(out["running"], 1.0)  # a wave, B, or (poisson) the mean in flight, at most the capacity
    peak_memory = weights_dev + fixed_gib + activation_bytes(in_flight) + in_flight * kv_seq
    out["weights_gib"] = sizes.weight_bytes / GIB
    out["kv_bytes_per_token"] = kv_seq_bytes / seq_tokens  # mean over the S reserved tokens (module doc)
    out["peak_memory_gib"] = peak_memory / GIB
    out["max_concurrency"] = max_conc
    out["active_params"] = sizes.active_params
    return out if bounds else {k: out[k] for k in METRICS if k in out}


@dataclass(frozen=True)
class _Memory:
    """Per-device memory of a batch from its sums over layers, and the sequences that fit."""

    sizes: _Bytes
    weights_dev: Array
    fixed_gib: float
    kv_seq: Array  # one sequence's KV cache and Mamba-2 state, per device
    activation_bytes: Callable[[Array], Array]  # of a batch of sequences
    max_conc: Array


def _memory(arrays: ArchArrays, sums: LayerSums, hw: Hardware, eng: Engine, scenario: Scenario, ops: _Ops) -> _Memory:
    dt = get_weight_dtype(scenario.dtype)
    sizes = _bytes(arrays, sums, dt, ops)
    tp, p_len = scenario.tp, scenario.input_len

    # Memory (per device). Activation peak: the widest layer over one prefill chunk, plus logits.
    kv_seq_bytes = sums.kv_seq_bytes  # (N,) one sequence, all devices
    # A Mamba-2 layer keeps a constant-size state per sequence instead (in the same pool in vLLM).
    kv_seq = (kv_seq_bytes + sums.state_bytes) / tp
    fixed_gib = (eng.framework_gib + eng.cuda_graph_gib) * GIB

    def activation_bytes(batch: Array) -> Array:
        prompt_tokens = batch * p_len
        chunk = prompt_tokens if eng.chunk_tokens == 0 else ops.min(prompt_tokens, eng.chunk_tokens)
        logits_rows = prompt_tokens if eng.logits_all_tokens else batch
        act = chunk * sizes.act_width * dt.activation_bytes / tp + logits_rows * arrays.vocab * 4 / tp
        if eng.attention_scores_materialised:  # eager attention holds (batch, heads, P, P) scores
            act = act + batch * sums.heads * p_len * p_len * dt.activation_bytes / tp
        return act

    total_bytes = hw.memory_bytes
    weights_dev = sizes.weight_bytes / tp
    if eng.single_user:
        max_conc = ops.where(weights_dev + activation_bytes(1.0) + fixed_gib + kv_seq <= total_bytes, 1.0, 0.0)
    else:
        # Per-sequence activation memory grows with the batch only where no chunking bounds it.
        per_seq_act = activation_bytes(1.0) if eng.memory_policy == "dynamic" else 0.0
        non_kv = (
            weights_dev + fixed_gib + (0.0 if eng.memory_policy == "dynamic" else activation_bytes(float(eng.max_seqs)))
        )
        budget = eng.kv_budget_bytes(total_bytes, non_kv)
        max_conc = ops.min(ops.max(ops.floor(budget / ops.max(kv_seq + per_seq_act, 1.0)), 0.0), float(eng.max_seqs))
    return _Memory(sizes, weights_dev, fixed_gib, kv_seq, activation_bytes, max_conc)


def max_concurrency_from_sums(
    arrays: ArchArrays, sums: LayerSums, hardware: Hardware | str, engine: Engine | str, scenario: Scenario
) -> Array:
    """:func:`estimate_from_sums`' ``max_concurrency`` alone (the memory part, no timings)."""
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    eng = get_engine(engine) if isinstance(engine, str) else engine
    return _memory(arrays, sums, hw, eng, scenario, _Ops(arrays.hidden)).max_conc


def _check_scenario(hw: Hardware, eng: Engine, sc: Scenario) -> None:
    if sc.tp > 1 and hw.interconnect_gb_s <= 0:
        raise ConfigError(f"tp={sc.tp} needs an interconnect, and hardware {hw.name!r} lists none")
    if eng.single_user and sc.concurrency not in (1, "max"):
        raise ConfigError(f"engine {eng.name!r} serves a single user; concurrency must be 1, got {sc.concurrency!r}")


def estimate_cost(
    arch: Architecture,
    hardware: Hardware | str,
    engine: Engine | str,
    scenario: Scenario,
    profile: CostProfile | None = None,
) -> CostEstimate:
    """The cost of one architecture: :func:`estimate_batch` on a batch of one, as floats."""
    values = estimate_batch(ArchArrays.from_architectures([arch]), hardware, engine, scenario, profile)
    row: dict[str, Any] = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in values.items()}
    row["max_concurrency"] = int(row["max_concurrency"])
    return CostEstimate(**row)
