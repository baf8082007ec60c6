"""The cost model's per-phase time: one roofline per kernel, over numpy or torch arrays.

Private machinery of :mod:`autocompress_opt.serving.costmodel` (whose module doc gives the
equations): :class:`_Ops` (the array operations, numpy or torch), the per-architecture structure
(parameters, bytes, KV heads), the achievable rates of one (hardware, engine, dtype, profile) and
:func:`_phase_ms`, the milliseconds of one prefill or decode phase. The arrival regimes
(:mod:`autocompress_opt.serving.regimes`) combine phases into TTFT, TPOT and throughput.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autocompress_opt.serving.arch_arrays import FULL_WINDOW, ArchArrays, Array
from autocompress_opt.serving.dtypes import GGUF_BLOCK_BITS, WeightDtype
from autocompress_opt.serving.engine_models import Engine
from autocompress_opt.serving.hardware import Hardware
from autocompress_opt.serving.profiles import CostProfile


class _Ops:
    """The handful of array operations the equations need, for numpy or torch."""

    def __init__(self, like: Array):
        self.torch = type(like).__module__.startswith("torch")
        if self.torch:
            import torch

            self._t = torch
            # Constants join ``like``'s device and float dtype (float64 for an integer ``like``):
            # the inner search's cost runs on the parent's device, in float32 on an accelerator.
            dtype = like.dtype if like.is_floating_point() else torch.float64
            self._as = {"dtype": dtype, "device": like.device}

    def _tensor(self, a: Array) -> Array:
        return self._t.as_tensor(a, **self._as)

    def max(self, a: Array, b: Array) -> Array:
        if self.torch:
            return self._t.maximum(self._tensor(a), self._tensor(b))
        return np.maximum(a, b)

    def min(self, a: Array, b: Array) -> Array:
        if self.torch:
            return self._t.minimum(self._tensor(a), self._tensor(b))
        return np.minimum(a, b)

    def amax(self, a: Array) -> Array:
        return a.amax(-1) if self.torch else a.max(-1)

    def floor(self, a: Array) -> Array:
        return self._t.floor(a) if self.torch else np.floor(a)

    def ceil(self, a: Array) -> Array:
        return self._t.ceil(a) if self.torch else np.ceil(a)

    def where(self, cond: Array, a: Array, b: Array) -> Array:
        if self.torch:
            return self._t.where(cond, self._tensor(a), self._tensor(b))
        return np.where(cond, a, b)


def experts_touched(experts: Array, per_token: Array, tokens: Array) -> Array:
    """Expected distinct experts a step of ``tokens`` tokens reads in a MoE layer of ``experts``
    routed experts, ``per_token`` per token: ``E·(1 − (1 − k/E)^B)``.

    Each token picks ``k`` of ``E`` experts; with routing independent across tokens and uniform,
    an expert escapes one token with probability ``1 − k/E`` and all ``B`` with ``(1 − k/E)^B``.
    ``k`` at ``B = 1``, rising to ``E`` as ``B → ∞``; never rises when ``E``, ``k`` or ``B``
    shrinks. Real routers are skewed, so this is an upper bound on the experts read. Floats,
    numpy or torch arrays alike; ``E = 0`` (a dense layer) gives 0.
    """
    safe = experts + (experts == 0)  # E = 0: any positive E; the product is 0 anyway
    return experts * (1 - (1 - per_token / safe) ** tokens)


@dataclass(frozen=True)
class _Structure:
    """Per-layer terms ``(N, L)`` (each layer's own, from its columns and the per-architecture
    fields alone) and per-architecture fields ``(N,)``, shared by every phase.

    The per-architecture sums and maxima over layers (:class:`LayerSums`) are reductions of the
    per-layer terms, so a batch whose rows differ from one stack in one layer each can take them
    as the stack's with that layer's terms swapped (:meth:`LayerSums.one_layer_changed`)."""

    lin: Array  # (N, L) GEMM parameters every token runs per layer (attention, FFN, Mamba-2, MoE's shared part)
    expert_lin: Array  # (N, L) parameters of one routed expert, times the MoE keep gate (0 in a dense layer)
    experts: Array  # (N, L) routed experts E of each MoE layer (0 in a dense layer)
    experts_per_token: Array  # (N, L) experts k each token runs (0 in a dense layer)
    dense_params: Array  # (N, L) every parameter but the routed experts' (norms and biases included)
    expert_params: Array  # (N, L) all routed experts' parameters
    active_expert_params: Array  # (N, L) the k routed experts' parameters a token runs
    kv_layer_bytes: Array  # (N, L) K+V bytes one cached token takes in each layer
    kv_seq_layer_bytes: Array  # (N, L) K+V bytes one sequence caches in each layer (min(S, ⌈w_i⌉) tokens)
    state_layer_bytes: Array  # (N, L) Mamba-2 state bytes one sequence keeps in each layer
    kv_heads_dim: Array  # (N, L) g_i · d_i · attn_i
    q_heads_dim: Array  # (N, L) h_i · d_i · attn_i
    layer_act_width: Array  # (N, L) per-token activation elements of each layer
    routed_io: Array  # (N, L) activation elements routed pairs move per token: k·expert_io times the MoE gate (0 dense)
    kernels: Array  # (N, L) launches: a Mamba-2 mixer an attention block's, a MoE block Engine.moe_kernels
    blocks: Array  # (N, L) mixer and FFN blocks kept (one all-reduce after each under tensor parallelism)
    mamba: Array  # (N, L) Mamba-2 mixer kept
    mamba_scan_flops: Array  # (N, L) its scan FLOPs per token
    heads: Array  # (N, L) query heads (the eager attention's score memory)
    window: Array  # (N, L) or a float: each layer's attention window (FULL_WINDOW: full)
    sparse: bool = True  # some layer has a MoE or Mamba-2 block (False: their terms are all 0 and skipped)


def _structure(
    a: ArchArrays, kv_bytes: float, state_bytes: float, eng: Engine, seq_tokens: int, ops: _Ops
) -> _Structure:
    """The per-layer terms of ``a`` (class doc): ``kv_bytes`` per cached element, ``state_bytes`` per
    Mamba-2 state element, ``eng``'s KV blocks and kernels, ``seq_tokens`` reserved per sequence."""
    kv_block_tokens = eng.kv_block_tokens
    if a.window is None:  # every layer full
        kv_window = FULL_WINDOW
    else:  # (N, L); a sliding layer holds its window in whole KV blocks
        kv_window = ops.ceil(a.window / kv_block_tokens) * kv_block_tokens
    d_model = a.hidden[:, None]
    hd = a.head_dim
    moe, mamba = a.moe, a.mamba
    lin_attn = a.attn * d_model * hd * (2 * a.heads + 2 * a.kv_heads)  # q, k, v, o
    lin_ffn = a.ffn * a.ffn_matrices[:, None] * d_model * a.ffn_width  # gate, up, down (or up, down)
    kv_heads_dim = a.attn * a.kv_heads * hd
    q_heads_dim = a.attn * a.heads * hd
    if not ops.torch and not (moe.any() or mamba.any()):
        lin = lin_attn + lin_ffn
        return _dense_structure(a, kv_bytes, kv_window, seq_tokens, eng, ops, lin, kv_heads_dim, q_heads_dim)
    # Every token runs a MoE layer's router, latent projections and shared expert and a Mamba-2
    # mixer's projections; the columns hold norms, biases and the conv too (a few D), counted as GEMM.
    lin_always = moe * a.moe_shared_params + mamba * a.mamba_params
    expert_lin = moe * a.expert_params  # the gate once, here: E and k below are plain counts
    small = _small_params(a)
    return _Structure(
        lin=lin_attn + lin_ffn + lin_always,
        expert_lin=expert_lin,
        experts=a.experts,
        experts_per_token=a.experts_per_token,
        dense_params=lin_attn + lin_ffn + small + lin_always,
        expert_params=a.experts * expert_lin,
        active_expert_params=a.experts_per_token * expert_lin,
        kv_layer_bytes=kv_bytes * 2 * kv_heads_dim,
        # A layer caches min(S, w_i) of a sequence's S reserved tokens.
        kv_seq_layer_bytes=kv_bytes * 2 * kv_heads_dim * ops.min(kv_window, float(seq_tokens)),
        state_layer_bytes=state_bytes * mamba * a.mamba_state,
        kv_heads_dim=kv_heads_dim,
        q_heads_dim=q_heads_dim,
        layer_act_width=2 * a.ffn * a.ffn_width
        + q_heads_dim
        + 2 * kv_heads_dim
        + moe * a.moe_act
        + mamba * a.mamba_act,
        routed_io=moe * a.experts_per_token * a.expert_io,
        kernels=eng.kernels_per_attention * (a.attn + mamba) + eng.kernels_per_ffn * a.ffn + eng.moe_kernels * moe,
        blocks=(a.attn + mamba) + (a.ffn + moe),
        mamba=mamba,
        mamba_scan_flops=a.mamba_scan_flops,
        heads=a.heads,
        window=FULL_WINDOW if a.window is None else a.window,
    )


def _small_params(a: ArchArrays) -> Array:
    """``(N, L)`` parameters of each layer's norms, biases, QK-norms and sinks (no GEMM)."""
    d_model, hd = a.hidden[:, None], a.head_dim
    return a.attn * (
        d_model
        + a.qkv_bias[:, None] * hd * (a.heads + 2 * a.kv_heads)
        + a.o_bias[:, None] * d_model
        + a.qk_norm[:, None] * 2 * hd
        + a.attention_sinks[:, None] * a.heads
    ) + a.ffn * (d_model + a.mlp_bias[:, None] * (2 * a.ffn_width + d_model))


def _dense_structure(
    a: ArchArrays,
    kv_bytes: float,
    kv_window: Array,
    seq_tokens: int,
    eng: Engine,
    ops: _Ops,
    lin: Array,
    kv_heads_dim: Array,
    q_heads_dim: Array,
) -> _Structure:
    """:func:`_structure` of a numpy batch without MoE or Mamba-2 layers, the inner search's case
    (its candidates are scored by the thousand per trial): the same terms with the zero MoE and
    Mamba-2 ones left out, bit for bit the same values (``x + 0.0 == x``), in about half the array
    operations."""
    small = _small_params(a)
    zero = a.moe  # all zeros (the batch has no MoE layer)
    return _Structure(
        lin=lin,
        expert_lin=zero,
        experts=zero,
        experts_per_token=zero,
        dense_params=lin + small,
        expert_params=zero,
        active_expert_params=zero,
        kv_layer_bytes=kv_bytes * 2 * kv_heads_dim,
        kv_seq_layer_bytes=kv_bytes * 2 * kv_heads_dim * ops.min(kv_window, float(seq_tokens)),
        state_layer_bytes=zero,
        kv_heads_dim=kv_heads_dim,
        q_heads_dim=q_heads_dim,
        layer_act_width=2 * a.ffn * a.ffn_width + q_heads_dim + 2 * kv_heads_dim,
        routed_io=zero,
        kernels=eng.kernels_per_attention * a.attn + eng.kernels_per_ffn * a.ffn,
        blocks=a.attn + a.ffn,
        mamba=zero,
        mamba_scan_flops=zero,
        heads=a.heads,
        window=FULL_WINDOW if a.window is None else a.window,
        sparse=False,
    )


@dataclass(frozen=True)
class _Bytes:
    """Per-architecture weight and activation sizes ``(N,)`` from the sums over layers."""

    weight_bytes: Array  # all weights, at their storage formats
    active_params: Array  # parameters one token touches (Architecture.active_params)
    head_read_bytes: Array  # bytes of the LM-head matrix read per step
    act_width: Array  # widest per-token activation of any layer (elements)


def _bytes(a: ArchArrays, sums: LayerSums, dt: WeightDtype, ops: _Ops) -> _Bytes:
    """Weights and activations of ``a``'s per-architecture fields and ``sums``' sums over layers."""
    dense_body = sums.dense_params + a.hidden  # + final norm
    body = dense_body + sums.expert_params
    embed = a.vocab * a.hidden
    head = embed * (1 - a.tied)
    # A tied matrix is stored once, in the format the recipe gives a tied embedding (llama.cpp: the
    # output's); an untied head is read at the head's format.
    embed_bits = ops.where(a.tied > 0.5, dt.tied_embedding_bits, dt.embed_bits)
    # Routed experts at their own format where it has one (mxfp4: experts 4.25 bits, the rest BF16);
    # the correction is exactly 0 in a dense layer.
    expert_extra_bits = sums.expert_params * (dt.routed_expert_bits - dt.body_bits)
    weight_bytes = (body * dt.body_bits + expert_extra_bits + embed * embed_bits + head * dt.head_bits) / 8
    head_bits = ops.where(a.tied > 0.5, dt.tied_embedding_bits, dt.head_bits)
    return _Bytes(
        weight_bytes=weight_bytes,
        active_params=dense_body + sums.active_expert_params + embed + head,
        head_read_bytes=embed * head_bits / 8,
        act_width=sums.act_width + 4 * a.hidden,
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
    routed_byte_s: float  # seconds per byte of routed pairs' activations (CostProfile.routed_passes / bytes_s)
    # Lane operations/s of the CUDA cores at the GEMMs' efficiency, for a weight-only expert format's
    # dequantisation (_dequant_s); inf where it is not timed (see _alu_ops_s).
    alu_ops_s: float = float("inf")


def _is_block_quantised(dt: WeightDtype) -> bool:
    """A llama.cpp block format (q4_k_m, q8_0...): its decoder matrices are stored in GGUF blocks."""
    return dt.embed_format in GGUF_BLOCK_BITS


def _gemm_peak(hw: Hardware, eng: Engine, dt: WeightDtype, compute: str) -> float:
    """Peak FLOP/s of the GEMMs: the compute dtype's rate, except that an engine multiplying FP16
    and block-quantised weights with FP16 accumulation (llama.cpp, ``Engine.fp16_accumulate``) runs
    them at the device's FP16-accumulate rate (twice the BF16 rate on GeForce cards)."""
    half = eng.fp16_accumulate and compute == "bf16" and (dt.name == "fp16" or _is_block_quantised(dt))
    return hw.half_accumulate_flops() if half else hw.peak_flops(compute)


# A weight-only routed-expert format (mxfp4: W4A16 on a device without FP4 tensor math) is
# dequantised to BF16 on the CUDA cores inside the grouped GEMM, once per weight element per M-tile
# of tokens, before the tensor cores multiply it. Lane operations per element: Marlin's FP4 → BF16
# conversion unpacks 8 values with about 6 bit operations (lop3/shift) and scales pairs with one
# packed BF16x2 multiply (~1.25), plus the converted tile's store to shared memory for the
# warpgroup MMA (Hopper's wgmma reads B from shared memory): about 2. M-tile: 64 tokens, the
# BLOCK_SIZE_M vLLM's fused-MoE default config takes once an expert gets more tokens than there
# are experts (fused_moe.get_default_config). Set from the kernels, not fitted (issue 44); the
# cost-model page shows the held-out errors at other values.
DEQUANT_OPS_PER_ELEMENT = 2.0
DEQUANT_TILE_TOKENS = 64.0


def _alu_ops_s(hw: Hardware, dt: WeightDtype, mfu: float, floor: bool) -> float:
    """Lane operations/s ``dt``'s routed experts are dequantised at on ``hw``: half the CUDA cores'
    FP32 FLOP/s (an FMA is 2 FLOPs, one operation) at the GEMMs' efficiency. inf (not timed) for
    the physical floor, a format without a weight-only expert part, a device with FP4 tensor math
    (it multiplies FP4 natively) or one whose entry has no ``fp32_tflops``."""
    if floor or dt.expert_bits is None or "fp4" in hw.peak_tflops or hw.fp32_tflops is None:
        return float("inf")
    return hw.fp32_tflops * 1e12 / 2 * mfu


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
        routed_byte_s=0.0 if floor else profile.routed_passes / (hw.bandwidth_gb_s * 1e9 * mbu),
        alu_ops_s=_alu_ops_s(hw, dt, mfu, floor),
    )


# Σ over layers of each layer's seconds in one phase, (N,): the phase's layer time (LayerSums).
LayerSeconds = Callable[["_Setup", _Rates, "_Phase"], Array]


@dataclass(frozen=True)
class LayerSums:
    """A batch's per-architecture sums and maxima over layers ``(N,)``: everything the cost model
    reads of the per-layer terms (:class:`_Structure`), so the metrics are a function of these and
    the per-architecture fields alone (:func:`~autocompress_opt.serving.costmodel.estimate_batch`).

    The time terms are sums over layers too, but of each layer's roofline at the phase's batch
    (which follows from the memory, hence from these sums): ``layer_seconds`` gives that sum for a
    phase. :meth:`of` sums a full batch's terms; :meth:`one_layer_changed` takes a stack's sums with
    one layer's terms swapped per row (``O(1)`` per row: a sum differs by ``new − old``, a maximum
    is the stack's best other layer's or the new one)."""

    dense_params: Array
    expert_params: Array
    active_expert_params: Array
    kv_seq_bytes: Array  # one sequence's K+V bytes, all devices
    state_bytes: Array  # one sequence's Mamba-2 state bytes, all devices
    act_width: Array  # widest layer's per-token activation elements (a maximum)
    heads: Array  # most query heads of a layer (a maximum)
    routed_io: Array  # routed pairs' activation elements per token, summed over the MoE layers
    kernels: Array
    blocks: Array
    layer_seconds: LayerSeconds

    @classmethod
    def of(cls, s: _Structure, ops: _Ops) -> LayerSums:
        """The sums over ``s``'s layers, in layer order (what the cost model always summed)."""
        return cls(
            dense_params=s.dense_params.sum(-1),
            expert_params=s.expert_params.sum(-1),
            active_expert_params=s.active_expert_params.sum(-1),
            kv_seq_bytes=s.kv_seq_layer_bytes.sum(-1),
            state_bytes=s.state_layer_bytes.sum(-1),
            act_width=ops.amax(s.layer_act_width),
            heads=ops.amax(s.heads),
            routed_io=s.routed_io.sum(-1),
            kernels=s.kernels.sum(-1),
            blocks=s.blocks.sum(-1),
            layer_seconds=lambda setup, rates, phase: _layer_s(s, setup, rates, phase).sum(-1),
        )

    @classmethod
    def one_layer_changed(cls, stack: _Structure, where: np.ndarray, new: _Structure) -> LayerSums:
        """Numpy sums of ``N`` rows, row ``n`` being ``stack`` (one row, ``L`` layers) with layer
        ``where[n]`` replaced by ``new``'s row ``n`` (``N`` rows of one layer): ``O(N + L)``.

        Each sum is the stack's ``− old + new``, summed in another order than :meth:`of` would sum the
        row: equal up to float64 rounding (a relative ``~L·2⁻⁵³`` of the positive terms), not bit
        for bit. A phase's layer time groups the rows by the phase's per-architecture values (the
        batch, usually a handful of distinct values) and times the stack once per group."""
        old = _Structure(**{k: _column(getattr(stack, k), where) for k in _STRUCTURE_FIELDS})

        def changed(name: str) -> np.ndarray:
            return getattr(stack, name).sum(-1) - getattr(old, name)[:, 0] + getattr(new, name)[:, 0]

        def maximum(name: str) -> np.ndarray:
            row = np.asarray(getattr(stack, name), dtype=float)[0]
            top = np.argsort(-row, kind="stable")[:2]
            second = row[top[1]] if len(top) > 1 else -np.inf
            others = np.where(where == top[0], second, row[top[0]])  # the best layer left unchanged
            return np.maximum(others, getattr(new, name)[:, 0])

        def layer_seconds(setup: _Setup, rates: _Rates, phase: _Phase) -> np.ndarray:
            delta = _layer_s(new, setup, rates, phase)[:, 0] - _layer_s(old, setup, rates, phase)[:, 0]
            fields = [getattr(phase, k) for k in _Phase.__dataclass_fields__]
            if all(v is None or np.ndim(v) == 0 or np.all(v == v[0]) for v in fields):  # one batch size: one group
                first, inverse = np.zeros(1, dtype=np.intp), np.zeros(len(where), dtype=np.intp)
            else:
                values = [
                    np.broadcast_to(np.asarray(-1.0 if v is None else v, dtype=float), where.shape) for v in fields
                ]
                _, first, inverse = np.unique(np.stack(values), axis=1, return_index=True, return_inverse=True)
            stack_phase = _Phase(*(None if v is None else _take(v, first) for v in fields))
            totals = _layer_s(stack, setup, rates, stack_phase).sum(-1)  # (groups,)
            return totals[inverse.reshape(-1)] + delta

        return cls(
            dense_params=changed("dense_params"),
            expert_params=changed("expert_params"),
            active_expert_params=changed("active_expert_params"),
            kv_seq_bytes=changed("kv_seq_layer_bytes"),
            state_bytes=changed("state_layer_bytes"),
            act_width=maximum("layer_act_width"),
            heads=maximum("heads"),
            routed_io=changed("routed_io"),
            kernels=changed("kernels"),
            blocks=changed("blocks"),
            layer_seconds=layer_seconds,
        )


_STRUCTURE_FIELDS = tuple(_Structure.__dataclass_fields__)


def _column(x: Array, where: np.ndarray) -> Array:
    """Column ``where[n]`` of a one-row ``(1, L)`` term as row ``n`` of ``(N, 1)`` (a float stays)."""
    return x[0, where][:, None] if np.ndim(x) == 2 else x


def _take(x: Array, rows: np.ndarray) -> Array:
    return x[rows] if np.ndim(x) else x


@dataclass(frozen=True)
class _Setup:
    """What stays fixed across the phases of one :func:`estimate_batch` call: the per-architecture
    fields (``arrays``' ``(N,)`` ones are read), the sums over layers and the sizes derived from
    them, the weight format and KV bytes per element, the engine, tensor parallelism, the request
    shape (``p_len`` prompt and ``o_len`` output tokens) and the array backend."""

    arrays: ArchArrays
    sums: LayerSums
    bytes: _Bytes
    dtype: WeightDtype
    kv_bytes: float
    engine: Engine
    tp: int
    ops: _Ops
    p_len: float
    o_len: float


@dataclass(frozen=True)
class _Phase:
    """The work of one serving phase (prefill or decode) for a batch of ``N`` architectures, as
    per-architecture values (``(N,)`` arrays or floats).

    Per layer of window ``w``, with ``pp(w)`` the (query, key) pairs of one causal prompt
    (:func:`_prompt_pairs`) and ``ctx(w)`` the cached tokens one decode step reads
    (:func:`_context`), the phase attends ``pp(w)·prompt/prompt_div + ctx(w)·context`` pairs and
    reads ``ctx(w)·read`` cached tokens (a term whose coefficient is None is absent: a sliding layer
    attends and reads within its window). ``tokens`` (new tokens processed), ``logits_tokens``
    (rows sent through the LM head), ``steps`` (engine steps) and ``sequences`` (sequence-steps:
    each sequence in each step reads and writes its Mamba-2 state once).
    """

    tokens: Array
    logits_tokens: Array
    steps: Array
    sequences: Array
    prompt: Array | None = None
    prompt_div: Array = 1.0
    context: Array | None = None
    read: Array | None = None


def _per_layer(x: Array) -> Array:
    """A per-architecture value ``(N,)`` against ``(N, L)`` per-layer terms."""
    return x[:, None] if np.ndim(x) else x


def _prompt_pairs(window: Array, p_len: float, ops: _Ops) -> Array:
    """(query, key) pairs of one causal prompt per layer: Σ_{t=1..P} min(t, w) = m(m+1)/2 + (P − m)·w,
    m = min(P, w)."""
    seen = ops.min(window, p_len)
    return seen * (seen + 1) / 2 + (p_len - seen) * window


def _context(window: Array, p_len: float, o_len: float, ops: _Ops) -> Array:
    """Cached tokens a decode step reads per layer: the generation's mean context ``P + O/2``,
    capped by a sliding layer's window."""
    return ops.min(window, p_len + o_len / 2)


def _layer_s(s: _Structure, setup: _Setup, rates: _Rates, phase: _Phase) -> Array:
    """Seconds, ``(N, L)``, each layer's GEMMs and attention (or Mamba-2 scan) take in ``phase``:
    each kernel's own roofline (module doc)."""
    ops, tp = setup.ops, setup.tp
    tok, stp = _per_layer(phase.tokens), _per_layer(phase.steps)
    # GEMMs: 2 FLOPs per parameter per token; weights streamed once per step. A MoE layer runs k
    # experts per token (grouped GEMM) and reads, per step of tok/stp tokens, the experts they touch.
    bits, expert_bits = setup.dtype.body_bits, setup.dtype.routed_expert_bits
    per_device_s = tp * rates.bytes_s
    if s.sparse:
        run = s.lin + s.experts_per_token * s.expert_lin
        experts = experts_touched(s.experts, s.experts_per_token, tok / stp)
        touched = experts * s.expert_lin
        read = s.lin + touched
        # Bytes: everything at the body format, the touched experts corrected to theirs (0 when dense).
        read_s = stp * read * bits / 8 / per_device_s + stp * touched * (expert_bits - bits) / 8 / per_device_s
    else:  # the same values without the zero MoE terms (_dense_structure)
        run = read = s.lin
        read_s = stp * read * bits / 8 / per_device_s
    t_compute = 2 * tok * run / (tp * rates.flops)
    if s.sparse and rates.alu_ops_s != float("inf"):
        t_compute = t_compute + _dequant_s(s, experts, tok, stp, rates, ops) / tp
    t_gemm = ops.max(t_compute, read_s)
    eng = setup.engine
    if not eng.mmq and eng.fp16_accumulate and _is_block_quantised(setup.dtype):
        # llama.cpp without MMQ: a step of more than 32 tokens (its MMQ_MAX_BATCH_SIZE) dequantises
        # each matrix to FP16 for cuBLAS first: read the blocks, write the FP16 copy (Engine.mmq).
        dequant = stp * read * (setup.dtype.body_bits / 8 + 2) / (tp * rates.bytes_s)
        t_gemm = t_gemm + ops.where(tok > 32 * stp, dequant, 0.0)
    # Attention: QKᵀ and AV are 2·d FLOPs each per head per pair; K,V read for cached + new tokens
    # (every new token's K,V is written, window or not). A Mamba-2 mixer's scan is timed the same
    # way: its FLOPs per token, and each sequence's state read and written once per step.
    pairs, kv_read = _pairs(s.window, setup, phase)
    attn_flops = 4 * pairs * s.q_heads_dim
    attn_bytes = setup.kv_bytes * 2 * (kv_read + tok) * s.kv_heads_dim
    if s.sparse:
        attn_flops = attn_flops + tok * s.mamba * s.mamba_scan_flops
        attn_bytes = attn_bytes + 2 * _per_layer(phase.sequences) * s.state_layer_bytes
    t_attn = ops.max(attn_flops / (tp * rates.attn_flops), attn_bytes / (tp * rates.bytes_s))
    return t_gemm + t_attn


def _dequant_s(s: _Structure, touched: Array, tok: Array, stp: Array, rates: _Rates, ops: _Ops) -> Array:
    """Seconds one device's CUDA cores spend dequantising routed experts in ``stp`` steps of
    ``tok`` tokens, ``touched`` experts a step (:func:`experts_touched`, as the weights' read counts
    them), at a whole-model width (divide by tensor parallelism): each touched expert's
    weights once per M-tile of its tokens, ``max(1, ½ + m/BLOCK_M)`` tiles for ``m`` tokens (the
    last tile partly filled), :data:`DEQUANT_OPS_PER_ELEMENT` operations an element. Added to the
    GEMMs' tensor time, not overlapped with it; small against the weights' read at decode sizes."""
    per_expert = tok / stp * s.experts_per_token / (touched + (touched == 0))
    tiles = ops.max(0.5 + per_expert / DEQUANT_TILE_TOKENS, 1.0)
    return stp * touched * s.expert_lin * tiles * DEQUANT_OPS_PER_ELEMENT / rates.alu_ops_s


def _pairs(window: Array, setup: _Setup, phase: _Phase) -> tuple[Array, Array]:
    """(query, key) pairs attended and cached tokens read per layer in ``phase`` (:class:`_Phase`)."""
    ops = setup.ops
    pairs: Array = 0.0
    if phase.prompt is not None:
        pp = _prompt_pairs(window, setup.p_len, ops)
        pairs = _per_layer(phase.prompt) * pp / _per_layer(phase.prompt_div)
    ctx = _context(window, setup.p_len, setup.o_len, ops)
    if phase.context is not None:
        pairs = pairs + _per_layer(phase.context) * ctx
    kv_read = _per_layer(phase.read) * ctx if phase.read is not None else 0.0
    return pairs, kv_read


def _phase_ms(setup: _Setup, rates: _Rates, phase: _Phase) -> Array:
    """Milliseconds, ``(N,)``, to run ``phase.steps`` engine steps that together process
    ``phase.tokens`` new tokens at ``rates``; weights are read once per step."""
    a, sums, ops, tp, eng = setup.arrays, setup.sums, setup.ops, setup.tp, setup.engine
    vocab_x_hidden = a.vocab * a.hidden
    t_head = ops.max(
        2 * phase.logits_tokens * vocab_x_hidden / (tp * rates.flops),
        phase.steps * setup.bytes.head_read_bytes / (tp * rates.bytes_s),
    )
    kernels = sums.kernels + eng.kernels_per_step
    fixed = phase.steps * (kernels * rates.launch_s + rates.step_s)
    # Each routed (token, expert) pair's gather, activation and combine, beyond its GEMM roofline:
    # its activations cross memory routed_passes times, on every device (tensor parallelism splits
    # the expert width, not the tokens; the whole pair is counted); 0 in a dense model.
    routed = phase.tokens * sums.routed_io * setup.dtype.activation_bytes * rates.routed_byte_s
    total = sums.layer_seconds(setup, rates, phase) + t_head + fixed + routed
    if tp > 1:
        blocks = sums.blocks  # one all-reduce after each mixer and each FFN block
        message = phase.tokens * a.hidden * setup.dtype.activation_bytes * 2 * (tp - 1) / tp
        total = total + blocks * (phase.steps * rates.allreduce_s + message / rates.link_bytes_s)
    return 1e3 * total
