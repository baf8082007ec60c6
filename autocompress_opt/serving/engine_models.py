"""Serving engines: how each one schedules work and holds memory.

An :class:`Engine` carries *structure* (kernels per layer, prefill chunk size, how the KV cache is
reserved); the efficiency factors and fixed costs it reaches on a device are fitted numbers in a
:class:`~autocompress_opt.serving.profiles.CostProfile`. Memory methods work on numpy arrays and torch
tensors alike (``xp`` is the array module), so one set of equations serves every caller.

Sources for the defaults: vLLM ``EngineArgs`` (gpu_memory_utilization 0.9, block_size 16,
max_num_seqs 256, chunked prefill over max_num_batched_tokens 8192); TensorRT-LLM
``KvCacheConfig.free_gpu_memory_fraction`` 0.9, tokens_per_block 32, max_num_tokens 8192;
llama.cpp ``n_ubatch`` 512 and a KV cache allocated for the whole ``n_ctx`` at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from autocompress_opt.errors import ConfigError, check_fraction
from autocompress_opt.registry import Registry

__all__ = ["ENGINES", "Engine", "get_engine"]

GIB = 2**30


@dataclass(frozen=True)
class Engine:
    """Structure of a serving engine (what is counted), independent of the device.

    Attributes:
        name: registry name.
        description: one line for ``--help`` and reports.
        kernels_per_attention / kernels_per_ffn / kernels_per_step: kernel launches per attention
            block, per FFN block (norm included) and per engine step outside the layers.
        kernels_per_moe: kernel launches per mixture-of-experts block (norm, router, top-k, the
            permute and grouped-GEMM kernels, the weighted combine), counted from the engine's MoE
            path; None: as many as an FFN block (an engine whose MoE path is not counted here).
        chunk_tokens: prefill tokens per engine step (chunked prefill); 0 = the whole prompt batch.
        kv_block_tokens: KV-cache allocation granularity in tokens (1 = exact).
        memory_policy: ``pool_of_total`` (vLLM: a fraction of *total* memory is the budget),
            ``pool_of_free`` (TensorRT-LLM: a fraction of what is free after weights),
            ``preallocated_context`` (llama.cpp: KV for the whole context, one user),
            ``dynamic`` (transformers: KV grows with the requests, no pool).
        memory_fraction: the fraction used by the pool policies.
        max_seqs: the engine's cap on concurrent sequences.
        framework_gib: fixed memory outside weights/KV/activations (CUDA context, allocator).
        cuda_graph_gib: memory held by captured CUDA graphs.
        logits_all_tokens: prefill computes logits for every prompt token rather than for the
            last one only (serving engines and transformers' ``generate`` keep only the last).
        attention_scores_materialised: eager attention holds (batch, heads, P, P) scores.
        single_user: the engine serves one sequence at a time.
        fp16_accumulate: the GEMMs of FP16 and block-quantised (GGUF) weights run at the device's
            FP16-with-FP16-accumulate tensor rate (``Hardware.half_accumulate_flops``): llama.cpp's
            cuBLAS path multiplies in FP16 with ``CUBLAS_COMPUTE_16F`` (PR #3816 to switch it to
            32F was closed unmerged), and its MMQ kernels use INT8 tensor cores whose peak is twice
            that rate but which also dequantise every block; both are timed at this one peak with the
            profile's MFU. BF16 weights still take the ``bf16`` (FP32-accumulate) rate.
        mmq: llama.cpp's matrix multiplication for quantised weights in prefill: 1 = its MMQ kernels
            (the default on Turing and newer since builds of June 2024, PRs #7676/#7860); 0 = each
            weight matrix dequantised to FP16 and multiplied by cuBLAS (earlier builds for batches
            over 32 tokens, or ``GGML_CUDA_FORCE_CUBLAS``): an extra pass reading the quantised
            matrix and writing an FP16 copy, once per prefill step.
        mamba_state_dtype: the format of a Mamba-2 layer's per-sequence state (SSM state and conv
            window), a KV-cache dtype name. float32 by default: vLLM's ``mamba_ssm_cache_dtype``
            is float32 for Nemotron-H (its model config asks for it) and llama.cpp keeps its
            recurrent state (``r_l``/``s_l``) in F32.
        options: engine options a user may override (``--engine-option k=v``).
    """

    name: str
    description: str
    kernels_per_attention: int
    kernels_per_ffn: int
    kernels_per_step: int
    chunk_tokens: int
    kv_block_tokens: int
    memory_policy: str
    memory_fraction: float = 0.9
    max_seqs: int = 256
    framework_gib: float = 0.5
    cuda_graph_gib: float = 0.0
    logits_all_tokens: bool = False
    attention_scores_materialised: bool = False
    single_user: bool = False
    context_tokens: int = 0  # llama.cpp n_ctx; 0 = input + output rounded up to kv_block_tokens
    fp16_accumulate: bool = False
    mmq: int = 1
    mamba_state_dtype: str = "fp32"
    kernels_per_moe: int | None = None
    options: tuple[str, ...] = field(default=("memory_fraction", "max_seqs", "chunk_tokens", "context_tokens"))

    @property
    def moe_kernels(self) -> int:
        """Kernel launches per MoE block: ``kernels_per_moe``, or an FFN block's when it is None."""
        return self.kernels_per_ffn if self.kernels_per_moe is None else self.kernels_per_moe

    def with_options(self, **values: Any) -> Engine:
        """A copy with user overrides, e.g. ``memory_fraction=0.5`` (vLLM gpu_memory_utilization).

        Raises :class:`ConfigError` naming the option and value for an option the engine lacks or a
        value out of range: ``memory_fraction`` a number in (0, 1], ``max_seqs`` a whole number
        >= 1, ``chunk_tokens`` and ``context_tokens`` whole numbers >= 0 (0: the engine's default),
        ``mmq`` 0 or 1."""
        for key, value in values.items():
            if key not in self.options:
                raise ConfigError(f"engine {self.name!r} has no option {key!r}; valid: {', '.join(self.options)}")
            values[key] = _checked_option(key, value)
        return replace(self, **values)

    def default_kv_dtype(self, weight_dtype: str) -> str:
        """KV-cache format when the user does not choose one."""
        if weight_dtype == "fp32":
            return "fp32"
        if self.name == "trtllm" and weight_dtype in ("fp8", "fp4"):
            return "fp8"  # NVIDIA's FP8/NVFP4 checkpoints quantise the KV cache to FP8 too
        return "bf16"

    # ------------------------------------------------------------------ memory
    def kv_tokens_per_sequence(self, input_len: int, output_len: int) -> int:
        """KV tokens reserved per sequence, rounded up to whole blocks."""
        tokens = (
            self.context_tokens
            if self.memory_policy == "preallocated_context" and self.context_tokens
            else input_len + output_len
        )
        block = self.kv_block_tokens
        return -(-tokens // block) * block

    def kv_budget_bytes(self, total_bytes: float, non_kv: Any) -> Any:
        """Bytes available for KV given device memory and the non-KV footprint (array-generic)."""
        if self.memory_policy == "pool_of_total":
            return self.memory_fraction * total_bytes - non_kv
        if self.memory_policy == "pool_of_free":
            return self.memory_fraction * (total_bytes - non_kv)
        return total_bytes - non_kv


ENGINES: Registry[Engine] = Registry("serving engine")

ENGINES.register(
    "vllm",
    Engine(
        name="vllm",
        description="vLLM: paged KV pool = gpu_memory_utilization x total - non-KV; chunked prefill; CUDA graphs",
        kernels_per_attention=6,  # fused add+RMSNorm, QKV GEMM, RoPE, cache write, attention, O GEMM
        kernels_per_ffn=4,  # fused add+RMSNorm, gate_up GEMM, SiLU*mul, down GEMM
        kernels_per_step=8,  # embedding, final norm, lm_head, logits processing and sampling
        # fused add+RMSNorm, router GEMM, then fused_moe's Triton path (model_executor/layers/fused_moe/
        # fused_moe.py: fused_topk's topk_softmax, moe_align_block_size, fused_moe_kernel for w13,
        # silu_and_mul, fused_moe_kernel for w2, moe_sum): 8
        kernels_per_moe=8,
        chunk_tokens=8192,
        kv_block_tokens=16,
        memory_policy="pool_of_total",
        memory_fraction=0.9,
        max_seqs=256,
        framework_gib=0.5,
        cuda_graph_gib=0.5,
    ),
    aliases=("vLLM",),
)
ENGINES.register(
    "trtllm",
    Engine(
        name="trtllm",
        description="TensorRT-LLM: paged KV pool = free_gpu_memory_fraction x memory left after weights",
        kernels_per_attention=4,  # fused norm+quant, QKV GEMM, fused RoPE+attention, O GEMM
        kernels_per_ffn=3,  # fused norm, gate_up GEMM with fused activation, down GEMM
        kernels_per_step=6,
        # fused norm, router GEMM, routing top-k, then CutlassMoeFCRunner::runMoe (cutlass_kernels/
        # moe_gemm/moe_kernels.cu): fusedBuildExpertMapsSortFirstToken, expandInputRowsKernel (the
        # permute), computeStridesTmaWarpSpecialized, grouped GEMM 1, the gated activation (a separate
        # kernel on the SM90+ TMA warp-specialised path), grouped GEMM 2 with the finalize (unpermute and
        # weighted combine) fused in its epilogue: 9
        kernels_per_moe=9,
        chunk_tokens=8192,
        kv_block_tokens=32,
        memory_policy="pool_of_free",
        memory_fraction=0.9,
        max_seqs=2048,
        framework_gib=0.5,
        cuda_graph_gib=0.5,
    ),
    aliases=("tensorrt-llm", "tensorrt_llm"),
)
ENGINES.register(
    "llamacpp",
    Engine(
        name="llamacpp",
        description="llama.cpp: one user, KV for the whole n_ctx allocated up front",
        kernels_per_attention=9,  # norm, mul, Q/K/V mat-vecs, RoPE x2, cache copy, attention, O
        kernels_per_ffn=6,  # norm, mul, gate, up, SiLU*mul, down
        kernels_per_step=6,
        chunk_tokens=512,
        kv_block_tokens=256,
        memory_policy="preallocated_context",
        max_seqs=1,
        framework_gib=0.3,
        single_user=True,
        fp16_accumulate=True,
        options=("memory_fraction", "max_seqs", "chunk_tokens", "context_tokens", "mmq"),
    ),
    aliases=("llama.cpp", "llama-cpp"),
)
ENGINES.register(
    "torch-eager",
    Engine(
        name="torch-eager",
        description="transformers eager forward (DynamicCache), the engine measurable on any machine",
        # Eager ops per block in transformers' Llama: RMSNorm (6), q/k/v/o linears (4), views and
        # transposes (5), RoPE (10), cache update (2), repeat_kv (4), matmul-softmax-matmul (5).
        kernels_per_attention=36,
        kernels_per_ffn=10,  # RMSNorm (6), gate, up, SiLU, mul, down (residual adds included)
        kernels_per_step=12,
        chunk_tokens=0,
        kv_block_tokens=1,
        memory_policy="dynamic",
        memory_fraction=1.0,
        max_seqs=1 << 20,
        framework_gib=0.0,
        attention_scores_materialised=True,
    ),
    aliases=("torch", "eager", "transformers"),
)


# option -> (lowest whole value allowed); memory_fraction is the one fractional option.
_WHOLE_OPTIONS = {"max_seqs": 1, "chunk_tokens": 0, "context_tokens": 0, "mmq": 0}
_HIGHEST = {"mmq": 1}


def _checked_option(key: str, value: Any) -> Any:
    """``value`` for engine option ``key`` (a whole number as ``int``), or :class:`ConfigError`."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "memory_fraction":
        return check_fraction(value, "engine option memory_fraction")
    if key in _WHOLE_OPTIONS:
        lowest = _WHOLE_OPTIONS[key]
        highest = _HIGHEST.get(key)
        if not number or value != int(value) or value < lowest or (highest is not None and value > highest):
            allowed = f"{lowest} or {highest}" if highest == lowest + 1 else f"a whole number >= {lowest}"
            raise ConfigError(f"engine option {key} must be {allowed}, got {value!r}")
        return int(value)
    return value


def get_engine(name: str) -> Engine:
    return ENGINES.get(name)
