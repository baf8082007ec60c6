"""The cost model's per-phase time: one roofline per kernel, over numpy or torch arrays.

Private machinery of :mod:`autocompress_opt.serving.costmodel` (whose module doc gives the
equations): :class:`_Ops` (the array operations, numpy or torch), the per-architecture structure
(parameters, bytes, KV heads), the achievable rates of one (hardware, engine, dtype, profile) and
:func:`_phase_ms`, the milliseconds of one prefill or decode phase. The arrival regimes
(:mod:`autocompress_opt.serving.regimes`) combine phases into TTFT, TPOT and throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autocompress_opt.serving.arch_arrays import ArchArrays, Array
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
    """Per-layer parameter groups and per-architecture byte counts, shared by every phase."""

    lin: Array  # (N, L) GEMM parameters every token runs per layer (attention, FFN, Mamba-2, MoE's shared part)
    expert_lin: Array  # (N, L) parameters of one routed expert, times the MoE keep gate (0 in a dense layer)
    experts: Array  # (N, L) routed experts E of each MoE layer (0 in a dense layer)
    experts_per_token: Array  # (N, L) experts k each token runs (0 in a dense layer)
    weight_bytes: Array  # (N,) all weights, at their storage formats
    active_params: Array  # (N,) parameters one token touches (Architecture.active_params)
    head_read_bytes: Array  # (N,) bytes of the LM-head matrix read per step
    kv_layer_bytes: Array  # (N, L) K+V bytes one cached token takes in each layer
    state_layer_bytes: Array  # (N, L) Mamba-2 state bytes one sequence keeps in each layer
    kv_heads_dim: Array  # (N, L) g_i · d_i · attn_i
    q_heads_dim: Array  # (N, L) h_i · d_i · attn_i
    act_width: Array  # (N,) widest per-token activation of any layer (elements)


def _structure(a: ArchArrays, dt: WeightDtype, kv_bytes: float, state_bytes: float, ops: _Ops) -> _Structure:
    d_model = a.hidden[:, None]
    hd = a.head_dim
    moe, mamba = a.moe, a.mamba
    lin_attn = a.attn * d_model * hd * (2 * a.heads + 2 * a.kv_heads)  # q, k, v, o
    lin_ffn = a.ffn * a.ffn_matrices[:, None] * d_model * a.ffn_width  # gate, up, down (or up, down)
    # Every token runs a MoE layer's router, latent projections and shared expert and a Mamba-2
    # mixer's projections; the columns hold norms, biases and the conv too (a few D), counted as GEMM.
    lin_always = moe * a.moe_shared_params + mamba * a.mamba_params
    expert_lin = moe * a.expert_params  # the gate once, here: E and k below are plain counts
    experts = a.experts * expert_lin
    active_experts = a.experts_per_token * expert_lin
    small = a.attn * (
        d_model
        + a.qkv_bias[:, None] * hd * (a.heads + 2 * a.kv_heads)
        + a.o_bias[:, None] * d_model
        + a.qk_norm[:, None] * 2 * hd
        + a.attention_sinks[:, None] * a.heads
    ) + a.ffn * (d_model + a.mlp_bias[:, None] * (2 * a.ffn_width + d_model))
    dense_body = (lin_attn + lin_ffn + small + lin_always).sum(-1) + a.hidden  # + final norm
    body = dense_body + experts.sum(-1)
    embed = a.vocab * a.hidden
    head = embed * (1 - a.tied)
    # A tied matrix is stored once, in the format the recipe gives a tied embedding (llama.cpp: the
    # output's); an untied head is read at the head's format.
    embed_bits = ops.where(a.tied > 0.5, dt.tied_embedding_bits, dt.embed_bits)
    # Routed experts at their own format where it has one (mxfp4: experts 4.25 bits, the rest BF16);
    # the correction is exactly 0 in a dense layer.
    expert_extra_bits = experts.sum(-1) * (dt.routed_expert_bits - dt.body_bits)
    weight_bytes = (body * dt.body_bits + expert_extra_bits + embed * embed_bits + head * dt.head_bits) / 8
    head_bits = ops.where(a.tied > 0.5, dt.tied_embedding_bits, dt.head_bits)
    kv_heads_dim = a.attn * a.kv_heads * hd
    q_heads_dim = a.attn * a.heads * hd
    act_width = (
        ops.amax(2 * a.ffn * a.ffn_width + q_heads_dim + 2 * kv_heads_dim + moe * a.moe_act + mamba * a.mamba_act)
        + 4 * a.hidden
    )
    return _Structure(
        lin=lin_attn + lin_ffn + lin_always,
        expert_lin=expert_lin,
        experts=a.experts,
        experts_per_token=a.experts_per_token,
        weight_bytes=weight_bytes,
        active_params=dense_body + active_experts.sum(-1) + embed + head,
        head_read_bytes=embed * head_bits / 8,
        kv_layer_bytes=kv_bytes * 2 * kv_heads_dim,
        state_layer_bytes=state_bytes * mamba * a.mamba_state,
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
    processed), ``logits_tokens`` (rows sent through the LM head), ``steps`` (engine steps) and
    ``sequences`` (sequence-steps: each sequence in each step reads and writes its Mamba-2 state
    once) are ``(N,)``.
    """

    tokens: Array
    pairs: Array
    kv_read_tokens: Array
    logits_tokens: Array
    steps: Array
    sequences: Array


def _phase_ms(setup: _Setup, rates: _Rates, phase: _Phase) -> Array:
    """Milliseconds, ``(N,)``, to run ``phase.steps`` engine steps that together process
    ``phase.tokens`` new tokens at ``rates``; weights are read once per step."""
    a, s, ops, tp = setup.arrays, setup.structure, setup.ops, setup.tp
    tok, stp = phase.tokens[:, None], phase.steps[:, None]
    # GEMMs: 2 FLOPs per parameter per token; weights streamed once per step. A MoE layer runs k
    # experts per token (grouped GEMM) and reads, per step of tok/stp tokens, the experts they touch.
    run = s.lin + s.experts_per_token * s.expert_lin
    touched = experts_touched(s.experts, s.experts_per_token, tok / stp) * s.expert_lin
    read = s.lin + touched
    bits, expert_bits = setup.dtype.body_bits, setup.dtype.routed_expert_bits
    # Bytes: everything at the body format, the touched experts corrected to theirs (0 when dense).
    per_device_s = tp * rates.bytes_s
    read_s = stp * read * bits / 8 / per_device_s + stp * touched * (expert_bits - bits) / 8 / per_device_s
    t_gemm = ops.max(2 * tok * run / (tp * rates.flops), read_s)
    eng = setup.engine
    if not eng.mmq and eng.fp16_accumulate and _is_block_quantised(setup.dtype):
        # llama.cpp without MMQ: a step of more than 32 tokens (its MMQ_MAX_BATCH_SIZE) dequantises
        # each matrix to FP16 for cuBLAS first: read the blocks, write the FP16 copy (Engine.mmq).
        dequant = stp * read * (setup.dtype.body_bits / 8 + 2) / (tp * rates.bytes_s)
        t_gemm = t_gemm + ops.where(tok > 32 * stp, dequant, 0.0)
    # Attention: QKᵀ and AV are 2·d FLOPs each per head per pair; K,V read for cached + new tokens
    # (every new token's K,V is written, window or not). A Mamba-2 mixer's scan is timed the same
    # way: its FLOPs per token, and each sequence's state read and written once per step.
    attn_flops = 4 * phase.pairs * s.q_heads_dim + tok * a.mamba * a.mamba_scan_flops
    attn_bytes = setup.kv_bytes * 2 * (phase.kv_read_tokens + tok) * s.kv_heads_dim
    attn_bytes = attn_bytes + 2 * phase.sequences[:, None] * s.state_layer_bytes
    t_attn = ops.max(attn_flops / (tp * rates.attn_flops), attn_bytes / (tp * rates.bytes_s))
    vocab_x_hidden = a.vocab * a.hidden
    t_head = ops.max(
        2 * phase.logits_tokens * vocab_x_hidden / (tp * rates.flops),
        phase.steps * s.head_read_bytes / (tp * rates.bytes_s),
    )
    # A Mamba-2 mixer launches as many kernels as an attention block, a MoE as many as an FFN.
    mixers, ffns = a.attn + a.mamba, a.ffn + a.moe
    kernels = (eng.kernels_per_attention * mixers + eng.kernels_per_ffn * ffns).sum(-1) + eng.kernels_per_step
    fixed = phase.steps * (kernels * rates.launch_s + rates.step_s)
    total = (t_gemm + t_attn).sum(-1) + t_head + fixed
    if tp > 1:
        blocks = (mixers + ffns).sum(-1)  # one all-reduce after each mixer and each FFN block
        message = phase.tokens * a.hidden * setup.dtype.activation_bytes * 2 * (tp - 1) / tp
        total = total + blocks * (phase.steps * rates.allreduce_s + message / rates.link_bytes_s)
    return 1e3 * total
