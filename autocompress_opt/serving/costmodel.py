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

Arrival regimes (``Scenario.arrival``; DESIGN.md §3), with ``B`` sequences running at once
(``concurrency``, or the memory limit for ``"max"``), ``Pf(b)`` the time to prefill a wave of ``b``
prompts together (in ``chunk_tokens`` steps) and ``T_w(b) = Pf(b) + (O − 1)·TPOT(b)`` the wave's time
until its last token::

    burst    N requests (default B) arrive at once and run in waves of b = min(N, B):
             n = ⌊N / b⌋ full waves, r = N − n·b left for a last one;
             makespan = n·T_w(b) + T_w(r);  throughput = N·O / makespan (everyone's prefill inside);
             mean TTFT = [b·(T_w(b)·n(n−1)/2 + n·TTFT(b)) + r·(n·T_w(b) + TTFT(r))] / N, where a
             wave's mean TTFT(b) = (b + 1)/(2b)·Pf(b) when prefill is chunked (the prompts finish
             first come first served) and Pf(b) when a whole batch is prefilled in one step.
             N = B is the plain batch (and N = B = 1 single-stream latency).
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

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError, check_bool, check_choice, check_int, check_number
from autocompress_opt.serving.dtypes import GGUF_BLOCK_BITS, WeightDtype, get_weight_dtype, kv_dtype_bytes
from autocompress_opt.serving.engine_models import GIB, Engine, get_engine
from autocompress_opt.serving.hardware import Hardware, get_hardware
from autocompress_opt.serving.profiles import CostProfile, get_profile

__all__ = [
    "ARRIVALS",
    "FULL_WINDOW",
    "METRICS",
    "ArchArrays",
    "CostEstimate",
    "Scenario",
    "cost_intervals",
    "describe_regime",
    "estimate_batch",
    "estimate_cost",
    "regime_of",
]

Array = Any  # numpy.ndarray or torch.Tensor

# The window of a full-attention layer in ArchArrays: larger than any context, yet finite, so that
# min(tokens, window) and the windowed pair count stay plain arithmetic (finite values and gradients)
# in numpy and torch alike.
FULL_WINDOW = float(2**40)

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
class ArchArrays:
    """A batch of ``N`` architectures padded to ``L`` layers, as numpy arrays or torch tensors.

    Per-architecture fields have shape ``(N,)``; per-layer fields ``(N, L)``. ``attn`` and ``ffn``
    are keep gates (1 = present, 0 = dropped; fractions are allowed in the differentiable path);
    padding layers have both gates at 0. Widths may be non-integer in the torch path. ``window``
    is each layer's attention window in tokens (:data:`FULL_WINDOW` for full attention; a
    constant, not a search variable); None means every layer attends to the whole context.
    """

    vocab: Array
    hidden: Array
    tied: Array
    attn: Array
    heads: Array
    kv_heads: Array
    head_dim: Array
    ffn: Array
    ffn_width: Array
    qkv_bias: Array
    o_bias: Array
    mlp_bias: Array
    qk_norm: Array
    window: Array | None = None

    @classmethod
    def from_architectures(cls, archs: Sequence[Architecture], backend: str = "numpy") -> ArchArrays:
        """Pack architectures into arrays (``backend`` = ``"numpy"`` or ``"torch"``, float64)."""
        if not archs:
            raise ConfigError("need at least one architecture")
        n, depth = len(archs), max(a.num_layers for a in archs)
        per_layer = {k: np.zeros((n, depth)) for k in ("attn", "heads", "kv_heads", "head_dim", "ffn", "ffn_width")}
        per_layer["window"] = np.full((n, depth), FULL_WINDOW)
        for i, arch in enumerate(archs):
            for j, layer in enumerate(arch.layers):
                per_layer["window"][i, j] = layer.window or FULL_WINDOW
                per_layer["attn"][i, j] = layer.attention
                per_layer["heads"][i, j] = layer.num_heads if layer.attention else 0
                per_layer["kv_heads"][i, j] = layer.num_kv_heads if layer.attention else 0
                per_layer["head_dim"][i, j] = layer.head_dim
                per_layer["ffn"][i, j] = layer.ffn
                per_layer["ffn_width"][i, j] = layer.ffn_width if layer.ffn else 0
        per_arch = {
            k: np.array([float(getattr(a, attr)) for a in archs])
            for k, attr in (
                ("vocab", "vocab_size"),
                ("hidden", "hidden_size"),
                ("tied", "tie_embeddings"),
                ("qkv_bias", "qkv_bias"),
                ("o_bias", "o_bias"),
                ("mlp_bias", "mlp_bias"),
                ("qk_norm", "qk_norm"),
            )
        }
        arrays = {**per_arch, **per_layer}
        if backend == "torch":
            import torch

            arrays = {k: torch.from_numpy(v) for k, v in arrays.items()}  # type: ignore[misc]
        elif backend != "numpy":
            raise ConfigError(f"backend must be 'numpy' or 'torch', got {backend!r}")
        return cls(**arrays)


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

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


# ------------------------------------------------------------------ array helpers
class _Ops:
    """The handful of array operations the equations need, for numpy or torch."""

    def __init__(self, like: Array):
        self.torch = type(like).__module__.startswith("torch")
        if self.torch:
            import torch

            self._t = torch

    def max(self, a: Array, b: Array) -> Array:
        if self.torch:
            return self._t.maximum(
                self._t.as_tensor(a, dtype=self._t.float64), self._t.as_tensor(b, dtype=self._t.float64)
            )
        return np.maximum(a, b)

    def min(self, a: Array, b: Array) -> Array:
        if self.torch:
            return self._t.minimum(
                self._t.as_tensor(a, dtype=self._t.float64), self._t.as_tensor(b, dtype=self._t.float64)
            )
        return np.minimum(a, b)

    def amax(self, a: Array) -> Array:
        return a.amax(-1) if self.torch else a.max(-1)

    def floor(self, a: Array) -> Array:
        return self._t.floor(a) if self.torch else np.floor(a)

    def ceil(self, a: Array) -> Array:
        return self._t.ceil(a) if self.torch else np.ceil(a)

    def where(self, cond: Array, a: Array, b: Array) -> Array:
        if self.torch:
            return self._t.where(
                cond, self._t.as_tensor(a, dtype=self._t.float64), self._t.as_tensor(b, dtype=self._t.float64)
            )
        return np.where(cond, a, b)


@dataclass(frozen=True)
class _Structure:
    """Per-layer parameter groups and per-architecture byte counts, shared by every phase."""

    lin: Array  # (N, L) GEMM parameters per layer (attention + FFN projections)
    weight_bytes: Array  # (N,) all weights, at their storage formats
    head_read_bytes: Array  # (N,) bytes of the LM-head matrix read per step
    kv_layer_bytes: Array  # (N, L) K+V bytes one cached token takes in each layer
    kv_heads_dim: Array  # (N, L) g_i · d_i · attn_i
    q_heads_dim: Array  # (N, L) h_i · d_i · attn_i
    act_width: Array  # (N,) widest per-token activation of any layer (elements)


def _structure(a: ArchArrays, dt: WeightDtype, kv_bytes: float, ops: _Ops) -> _Structure:
    d_model = a.hidden[:, None]
    hd = a.head_dim
    lin_attn = a.attn * d_model * hd * (2 * a.heads + 2 * a.kv_heads)  # q, k, v, o
    lin_ffn = a.ffn * 3 * d_model * a.ffn_width  # gate, up, down
    small = a.attn * (
        d_model
        + a.qkv_bias[:, None] * hd * (a.heads + 2 * a.kv_heads)
        + a.o_bias[:, None] * d_model
        + a.qk_norm[:, None] * 2 * hd
    ) + a.ffn * (d_model + a.mlp_bias[:, None] * (2 * a.ffn_width + d_model))
    body = (lin_attn + lin_ffn + small).sum(-1) + a.hidden  # + final norm
    embed = a.vocab * a.hidden
    head = embed * (1 - a.tied)
    # A tied matrix is stored once, in the format the recipe gives a tied embedding (llama.cpp: the
    # output's); an untied head is read at the head's format.
    embed_bits = ops.where(a.tied > 0.5, dt.tied_embedding_bits, dt.embed_bits)
    weight_bytes = (body * dt.body_bits + embed * embed_bits + head * dt.head_bits) / 8
    head_bits = ops.where(a.tied > 0.5, dt.tied_embedding_bits, dt.head_bits)
    kv_heads_dim = a.attn * a.kv_heads * hd
    q_heads_dim = a.attn * a.heads * hd
    act_width = ops.amax(2 * a.ffn * a.ffn_width + q_heads_dim + 2 * kv_heads_dim) + 4 * a.hidden
    return _Structure(
        lin=lin_attn + lin_ffn,
        weight_bytes=weight_bytes,
        head_read_bytes=embed * head_bits / 8,
        kv_layer_bytes=kv_bytes * 2 * kv_heads_dim,
        kv_heads_dim=kv_heads_dim,
        q_heads_dim=q_heads_dim,
        act_width=act_width,
    )


@dataclass(frozen=True)
class _Rates:
    """Achievable rates for one scenario; ``floor=True`` gives the 100 %-of-peak physical limit."""

    flops: float  # GEMM FLOP/s per device
    attn_flops: float  # attention FLOP/s per device (BF16 math)
    bytes_s: float  # memory bytes/s per device
    launch_s: float
    step_s: float
    allreduce_s: float
    link_bytes_s: float  # one-way interconnect bytes/s


def _is_block_quantised(dt: WeightDtype) -> bool:
    """A llama.cpp block format (q4_k_m, q8_0...): its decoder matrices are stored in GGUF blocks."""
    return dt.embed_format in GGUF_BLOCK_BITS


def _gemm_peak(hw: Hardware, eng: Engine, dt: WeightDtype, compute: str) -> float:
    """Peak FLOP/s of the GEMMs: the compute dtype's rate, except that an engine multiplying FP16
    and block-quantised weights with FP16 accumulation (llama.cpp, ``Engine.fp16_accumulate``) runs
    them at the device's FP16-accumulate rate (twice the BF16 rate on GeForce cards)."""
    half = eng.fp16_accumulate and compute == "bf16" and (dt.name == "fp16" or _is_block_quantised(dt))
    return hw.half_accumulate_flops() if half else hw.peak_flops(compute)


def _rates(hw: Hardware, eng: Engine, dt: WeightDtype, profile: CostProfile, floor: bool) -> _Rates:
    hw = hw.with_figures(profile.reference)  # the figures the profile's efficiencies are fractions of
    compute = hw.compute_dtype(dt.compute)
    attn_compute = hw.compute_dtype("bf16" if compute != "fp32" else "fp32")
    mfu = 1.0 if floor else profile.mfu_for(compute)
    mfu_attn = 1.0 if floor else profile.mfu_for(attn_compute)
    mbu = 1.0 if floor else profile.mbu
    return _Rates(
        flops=_gemm_peak(hw, eng, dt, compute) * mfu,
        attn_flops=hw.peak_flops(attn_compute) * mfu_attn,
        bytes_s=hw.bandwidth_gb_s * 1e9 * mbu,
        launch_s=0.0 if floor else profile.kernel_launch_us * 1e-6,
        step_s=0.0 if floor else profile.step_overhead_ms * 1e-3,
        allreduce_s=0.0 if floor else profile.allreduce_latency_us * 1e-6,
        link_bytes_s=hw.interconnect_gb_s * 1e9 / 2,
    )


@dataclass(frozen=True)
class _Setup:
    """What stays fixed across the phases of one :func:`estimate_batch` call: the architectures (as
    arrays and derived structure), the weight format and KV bytes per element, the engine, tensor
    parallelism, and the array backend."""

    arrays: ArchArrays
    structure: _Structure
    dtype: WeightDtype
    kv_bytes: float
    engine: Engine
    tp: int
    ops: _Ops


@dataclass(frozen=True)
class _Phase:
    """The work of one serving phase (prefill or decode) for a batch of ``N`` architectures.

    ``pairs`` counts (query, key) pairs attended and ``kv_read_tokens`` cached tokens read, per
    layer ``(N, L)`` (a sliding layer attends and reads within its window); ``tokens`` (new tokens
    processed), ``logits_tokens`` (rows sent through the LM head) and ``steps`` (engine steps) are
    ``(N,)``.
    """

    tokens: Array
    pairs: Array
    kv_read_tokens: Array
    logits_tokens: Array
    steps: Array


def _phase_ms(setup: _Setup, rates: _Rates, phase: _Phase) -> Array:
    """Milliseconds, ``(N,)``, to run ``phase.steps`` engine steps that together process
    ``phase.tokens`` new tokens at ``rates``; weights are read once per step."""
    a, s, ops, tp = setup.arrays, setup.structure, setup.ops, setup.tp
    tok, stp = phase.tokens[:, None], phase.steps[:, None]
    # GEMMs: 2 FLOPs per parameter per token; weights streamed once per step.
    t_gemm = ops.max(
        2 * tok * s.lin / (tp * rates.flops), stp * s.lin * setup.dtype.body_bits / 8 / (tp * rates.bytes_s)
    )
    eng = setup.engine
    if not eng.mmq and eng.fp16_accumulate and _is_block_quantised(setup.dtype):
        # llama.cpp without MMQ: a step of more than 32 tokens (its MMQ_MAX_BATCH_SIZE) dequantises
        # each matrix to FP16 for cuBLAS first: read the blocks, write the FP16 copy (Engine.mmq).
        dequant = stp * s.lin * (setup.dtype.body_bits / 8 + 2) / (tp * rates.bytes_s)
        t_gemm = t_gemm + ops.where(tok > 32 * stp, dequant, 0.0)
    # Attention: QKᵀ and AV are 2·d FLOPs each per head per pair; K,V read for cached + new tokens
    # (every new token's K,V is written, window or not).
    attn_flops = 4 * phase.pairs * s.q_heads_dim
    attn_bytes = setup.kv_bytes * 2 * (phase.kv_read_tokens + tok) * s.kv_heads_dim
    t_attn = ops.max(attn_flops / (tp * rates.attn_flops), attn_bytes / (tp * rates.bytes_s))
    vocab_x_hidden = a.vocab * a.hidden
    t_head = ops.max(
        2 * phase.logits_tokens * vocab_x_hidden / (tp * rates.flops),
        phase.steps * s.head_read_bytes / (tp * rates.bytes_s),
    )
    kernels = (eng.kernels_per_attention * a.attn + eng.kernels_per_ffn * a.ffn).sum(-1) + eng.kernels_per_step
    fixed = phase.steps * (kernels * rates.launch_s + rates.step_s)
    total = (t_gemm + t_attn).sum(-1) + t_head + fixed
    if tp > 1:
        blocks = (a.attn + a.ffn).sum(-1)  # one all-reduce after each attention and each FFN block
        message = phase.tokens * a.hidden * setup.dtype.activation_bytes * 2 * (tp - 1) / tp
        total = total + blocks * (phase.steps * rates.allreduce_s + message / rates.link_bytes_s)
    return 1e3 * total


# ------------------------------------------------------------------ arrival regimes
@dataclass(frozen=True)
class _Shape:
    """The request shape: ``P`` prompt and ``O`` output tokens, each layer's window ``(N, L)`` (or
    :data:`FULL_WINDOW` for every layer)."""

    p_len: float
    o_len: float
    window: Array

    def prompt_pairs(self, ops: _Ops) -> Array:
        """(query, key) pairs of one causal prompt per layer: Σ_{t=1..P} min(t, w) = m(m+1)/2 + (P − m)·w,
        m = min(P, w)."""
        seen = ops.min(self.window, self.p_len)
        return seen * (seen + 1) / 2 + (self.p_len - seen) * self.window

    def context(self, ops: _Ops) -> Array:
        """Cached tokens a decode step reads per layer: the generation's mean context ``P + O/2``,
        capped by a sliding layer's window."""
        return ops.min(self.window, self.p_len + self.o_len / 2)


@dataclass(frozen=True)
class _Timing:
    """One regime's result for ``N`` architectures, ``(N,)`` each: mean TTFT, TPOT and E2E per
    request (ms), output tokens/s over the run, sequences decoding at once, and the prompts
    prefilled together in one wave with the time that took (the prefill-throughput numerator and
    denominator)."""

    ttft: Array
    tpot: Array
    e2e: Array
    throughput: Array
    running: Array
    prefilled: Array
    wave_ttft: Array


def _wave(setup: _Setup, rates: _Rates, shape: _Shape, b: Array) -> tuple[Array, Array, Array]:
    """(prefill time, mean TTFT, TPOT) of ``b`` prompts prefilled together in ``chunk_tokens``
    steps, logits for the last token (or all), then decoded together at the mean context.

    With chunked prefill the scheduler takes the prompts first come first served, so prompt j
    (0-based) has its first token after (j + 1)/b of the wave's prefill: the mean TTFT is
    (b + 1)/(2b) of it (all of it at b = 1, or when an engine prefills the batch in one step)."""
    ops, eng = setup.ops, setup.engine
    prompt_tokens = b * shape.p_len
    steps = 1.0 + b * 0 if eng.chunk_tokens == 0 else ops.ceil(prompt_tokens / eng.chunk_tokens)
    prefill = _Phase(
        tokens=prompt_tokens,
        pairs=b[:, None] * shape.prompt_pairs(ops),
        kv_read_tokens=b[:, None] * 0.0,
        logits_tokens=prompt_tokens if eng.logits_all_tokens else b,
        steps=steps,
    )
    context = b[:, None] * shape.context(ops)  # (N, L)
    decode = _Phase(tokens=b, pairs=context, kv_read_tokens=context, logits_tokens=b, steps=b * 0 + 1.0)
    prefill_ms = _phase_ms(setup, rates, prefill)
    staggered = 1.0 if eng.chunk_tokens == 0 else (b + 1) / (2 * b)
    return prefill_ms, prefill_ms * staggered, _phase_ms(setup, rates, decode)


def _burst(setup: _Setup, rates: _Rates, shape: _Shape, batch: Array, requests: Array) -> _Timing:
    """``requests`` arrive at once; waves of ``b = min(requests, batch)`` (module doc)."""
    ops, o_len = setup.ops, shape.o_len
    b = ops.min(requests, batch)
    full = ops.floor(requests / b)
    rest = requests - full * b
    prefill_b, ttft_b, tpot_b = _wave(setup, rates, shape, b)
    prefill_r, ttft_r, tpot_r = _wave(setup, rates, shape, ops.max(rest, 1.0))
    wave_b = prefill_b + (o_len - 1) * tpot_b
    wave_r = ops.where(rest > 0, prefill_r + (o_len - 1) * tpot_r, 0.0)
    share_b, share_r = b * full / requests, rest / requests
    # Requests of wave j (0-based) wait j·T_w(b) for the waves before theirs; the last wave n·T_w(b).
    waiting = (b * wave_b * full * (full - 1) / 2 + rest * full * wave_b) / requests
    ttft = share_b * ttft_b + share_r * ttft_r + waiting
    tpot = share_b * tpot_b + share_r * tpot_r
    makespan = full * wave_b + wave_r
    return _Timing(
        ttft=ttft,
        tpot=tpot,
        e2e=ttft + (o_len - 1) * tpot,
        throughput=requests * o_len / (makespan / 1e3),
        running=b,
        prefilled=b,
        wave_ttft=prefill_b,
    )


def _steady(setup: _Setup, rates: _Rates, shape: _Shape, batch: Array) -> _Timing:
    """``batch`` requests always in flight, chunked prefill interleaved with decode (module doc)."""
    ops, eng = setup.ops, setup.engine
    p_len, o_len = shape.p_len, shape.o_len
    others = batch - 1.0
    # Each step's token budget goes to the running decodes first (vLLM's scheduler), the rest to a
    # prompt chunk; no chunking (0) prefills a whole prompt in one step.
    chunk = batch * 0 + p_len if eng.chunk_tokens == 0 else ops.min(ops.max(eng.chunk_tokens - others, 1.0), p_len)
    k = ops.ceil(p_len / chunk)
    life = k + o_len - 1  # engine steps of one request: its prefill chunks, then O − 1 decodes
    beside = others * (o_len - 1) / life  # others decoding in any one step
    share = ops.min(others * p_len / life / chunk, 1.0)  # of my decode steps, those carrying a chunk
    pairs, ctx = shape.prompt_pairs(ops), shape.context(ops)
    logits_per_prompt = p_len if eng.logits_all_tokens else 1.0
    carried = (k * beside)[:, None] * ctx
    prefill = _Phase(
        tokens=p_len + k * beside,
        pairs=pairs + carried,
        kv_read_tokens=carried,
        logits_tokens=logits_per_prompt + k * beside,
        steps=k,
    )
    running = 1.0 + beside
    one = batch * 0 + 1.0
    read = running[:, None] * ctx
    decode = _Phase(tokens=running, pairs=read, kv_read_tokens=read, logits_tokens=running, steps=one)
    mixed = _Phase(
        tokens=running + chunk,
        pairs=read + pairs / k[:, None],
        kv_read_tokens=read,
        logits_tokens=running + (chunk if eng.logits_all_tokens else 1.0),
        steps=one,
    )
    ttft = _phase_ms(setup, rates, prefill)
    tpot = share * _phase_ms(setup, rates, mixed) + (1 - share) * _phase_ms(setup, rates, decode)
    e2e = ttft + (o_len - 1) * tpot
    return _Timing(ttft, tpot, e2e, batch * o_len / (e2e / 1e3), running=batch, prefilled=one, wave_ttft=ttft)


# Fixed-point iterations of Little's law; B rises monotonically from 1 toward the smallest solution.
_POISSON_ITERATIONS = 60


def _littles_fixed_point(setup: _Setup, rates: _Rates, shape: _Shape, rate: float, capacity: Array) -> Array:
    """B = min(1 + λ·E2E(B), capacity), iterated from 1. On torch it runs without a graph: the
    gradient flows through the steady-state cost at the fixed point, not through the iterations
    (60 unrolled steady-state evaluations would dominate a fit's time)."""
    ops = setup.ops

    def iterate() -> Array:
        batch = capacity * 0 + 1.0
        for _ in range(_POISSON_ITERATIONS):
            batch = ops.min(1.0 + rate * _steady(setup, rates, shape, batch).e2e / 1e3, capacity)
        return batch

    if not ops.torch:
        return iterate()
    with ops._t.no_grad():
        return iterate().detach()


def _poisson(setup: _Setup, rates: _Rates, shape: _Shape, rate: float, capacity: Array) -> _Timing:
    """Arrivals at ``rate`` requests/s (module doc). An arriving request finds λ·E2E others in
    flight on average (Poisson arrivals see time averages), so ``B = 1 + λ·E2E(B)``."""
    ops, o_len = setup.ops, shape.o_len
    one = capacity * 0 + 1.0
    if setup.engine.single_user:  # M/D/1: service S = single-stream E2E, wait ρS / (2(1 − ρ))
        alone = _steady(setup, rates, shape, one)
        rho = rate * alone.e2e / 1e3
        stable = rho < 1
        wait = ops.where(stable, rho * alone.e2e / (2 * (1 - ops.where(stable, rho, 0.0))), float("inf"))
        return _Timing(
            ttft=alone.ttft + wait,
            tpot=alone.tpot,
            e2e=alone.e2e + wait,
            throughput=ops.where(stable, one * rate * o_len, alone.throughput),
            running=ops.min(rho, 1.0),
            prefilled=one,
            wave_ttft=alone.ttft,
        )
    batch = _littles_fixed_point(setup, rates, shape, rate, capacity)
    timing = _steady(setup, rates, shape, batch)
    overloaded = 1.0 + rate * timing.e2e / 1e3 > capacity * (1 + 1e-6)
    inf = float("inf")
    return _Timing(
        ttft=ops.where(overloaded, inf, timing.ttft),
        tpot=timing.tpot,
        e2e=ops.where(overloaded, inf, timing.e2e),
        throughput=ops.where(overloaded, timing.throughput, one * rate * o_len),
        running=ops.where(overloaded, capacity, rate * timing.e2e / 1e3),
        prefilled=one,
        wave_ttft=timing.ttft,
    )


def regime_of(scenario: Scenario) -> str:
    """The regime label residuals are pooled by: ``single`` (one request at a time, whatever the
    arrival), else the arrival (``burst``, ``steady``, ``poisson``)."""
    one_at_a_time = scenario.concurrency == 1 and (scenario.requests or 1) == 1
    if scenario.arrival != "poisson" and one_at_a_time:
        return "single"
    return scenario.arrival


def cost_intervals(
    metrics: Mapping[str, Any], scenario: Scenario, profile: CostProfile, confidence: float
) -> dict[str, Any]:
    """``<metric>_low`` / ``<metric>_high`` for TTFT, TPOT, E2E and output throughput: the
    prediction scaled by the held-out time ratios of ``profile`` in this scenario's regime
    (:meth:`CostProfile.interval`); neither end of a latency's interval below its roofline floor. Values have
    the type of ``metrics``' (floats, numpy or torch arrays); None where the profile holds no
    residuals (e.g. an unfitted or CPU-calibrated profile)."""
    regime = regime_of(scenario)
    out: dict[str, Any] = {}
    for metric in ("ttft_ms", "tpot_ms", "e2e_latency_ms", "output_throughput_tok_s"):
        bounds = profile.interval(metric, regime, confidence)
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
) -> dict[str, Array]:
    """Every metric of :data:`METRICS` for a batch of architectures, as ``(N,)`` arrays.

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
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    eng = get_engine(engine) if isinstance(engine, str) else engine
    prof = profile or get_profile(eng.name, hw.name)
    _check_scenario(hw, eng, scenario)
    dt = get_weight_dtype(scenario.dtype)
    kv_bytes = kv_dtype_bytes(scenario.kv_dtype or eng.default_kv_dtype(dt.name))
    ops = _Ops(arrays.hidden)
    s = _structure(arrays, dt, kv_bytes, ops)
    tp, p_len, o_len = scenario.tp, scenario.input_len, scenario.output_len
    if arrays.window is None:  # every layer full
        window = kv_window = FULL_WINDOW
    else:  # (N, L); a sliding layer holds its window in whole KV blocks
        window = arrays.window
        kv_window = ops.ceil(window / eng.kv_block_tokens) * eng.kv_block_tokens

    # Memory (per device). Activation peak: the widest layer over one prefill chunk, plus logits.
    # A layer caches min(S, w_i) of a sequence's S reserved tokens.
    seq_tokens = eng.kv_tokens_per_sequence(p_len, o_len)
    kv_seq_bytes = (s.kv_layer_bytes * ops.min(kv_window, float(seq_tokens))).sum(-1)  # (N,) one sequence, all devices
    kv_seq = kv_seq_bytes / tp
    fixed_gib = (eng.framework_gib + eng.cuda_graph_gib) * GIB

    def activation_bytes(batch: Array) -> Array:
        prompt_tokens = batch * p_len
        chunk = prompt_tokens if eng.chunk_tokens == 0 else ops.min(prompt_tokens, eng.chunk_tokens)
        logits_rows = prompt_tokens if eng.logits_all_tokens else batch
        act = chunk * s.act_width * dt.activation_bytes / tp + logits_rows * arrays.vocab * 4 / tp
        if eng.attention_scores_materialised:  # eager attention holds (batch, heads, P, P) scores
            act = act + batch * ops.amax(arrays.heads) * p_len * p_len * dt.activation_bytes / tp
        return act

    total_bytes = hw.memory_bytes
    weights_dev = s.weight_bytes / tp
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
    batch = max_conc if scenario.concurrency == "max" else max_conc * 0 + float(scenario.concurrency)
    batch_pos = ops.max(batch, 1.0)  # time a sequence even where none fits; memory flags it
    setup = _Setup(arrays, s, dt, kv_bytes, eng, tp, ops)
    shape = _Shape(float(p_len), float(o_len), window)

    out: dict[str, Array] = {}
    for floor in (False, True):
        rates = _rates(hw, eng, dt, prof, floor)
        if scenario.arrival == "burst":
            requests = batch_pos if scenario.requests is None else batch_pos * 0 + float(scenario.requests)
            timing = _burst(setup, rates, shape, batch_pos, requests)
        elif scenario.arrival == "steady":
            timing = _steady(setup, rates, shape, batch_pos)
        else:
            timing = _poisson(setup, rates, shape, float(scenario.rate or 0.0), ops.max(max_conc, 1.0))
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
    out["weights_gib"] = s.weight_bytes / GIB
    out["kv_bytes_per_token"] = kv_seq_bytes / seq_tokens  # mean over the S reserved tokens (module doc)
    out["peak_memory_gib"] = peak_memory / GIB
    out["max_concurrency"] = max_conc
    return out if bounds else {k: out[k] for k in METRICS}


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
