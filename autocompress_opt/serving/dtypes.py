"""Weight and KV-cache number formats: bytes per element and the tensor math they run on."""

from __future__ import annotations

from dataclasses import dataclass

from autocompress_opt.errors import UnknownNameError
from autocompress_opt.registry import Registry

__all__ = ["KV_DTYPE_BYTES", "WEIGHT_DTYPES", "WeightDtype", "get_weight_dtype", "kv_dtype_bytes"]


@dataclass(frozen=True)
class WeightDtype:
    """How a checkpoint stores its weights.

    Attributes:
        name: registry key (``bf16``, ``fp8``, ``q4_k_m``...).
        body_bits: bits per parameter of the decoder layers, scales included.
        embed_bits: bits per parameter of the token embedding.
        head_bits: bits per parameter of an untied LM head.
        compute: the tensor-math format its GEMMs run at (see ``Hardware.compute_dtype``).
        activation_bytes: bytes per activation element.
        source: where the bit counts come from.
    """

    name: str
    body_bits: float
    embed_bits: float
    head_bits: float
    compute: str
    activation_bytes: int = 2
    source: str = ""


WEIGHT_DTYPES: Registry[WeightDtype] = Registry("weight dtype")

for _dtype in (
    WeightDtype("fp32", 32, 32, 32, "fp32", activation_bytes=4),
    WeightDtype("bf16", 16, 16, 16, "bf16"),
    WeightDtype("fp16", 16, 16, 16, "bf16", source="FP16 tensor math runs at the BF16 rate"),
    # ModelOpt/vLLM FP8 checkpoints quantise the linear layers (per-tensor scales, negligible) and
    # keep the embedding and lm_head in BF16.
    WeightDtype("fp8", 8, 16, 16, "fp8", source="NVIDIA ModelOpt FP8 recipe: lm_head excluded from quantisation"),
    # NVFP4: 4-bit E2M1 values plus one FP8 scale per 16 elements = 4.5 bits.
    WeightDtype("fp4", 4.5, 16, 16, "fp4", source="NVFP4 format: 16-element blocks with an FP8 E4M3 scale"),
    # llama.cpp Q4_K_M: a mix of Q4_K and Q6_K blocks, 4.89 bits per weight on Llama-3.1-8B;
    # token_embd is Q4_K (4.5 bpw) and output.weight Q6_K (6.5625 bpw). Kernels dequantise to
    # FP16 for the math.
    WeightDtype("q4_k_m", 4.89, 4.5, 6.5625, "bf16", source="llama.cpp tools/quantize README (Q4_K_M 4.89 bpw)"),
):
    WEIGHT_DTYPES.register(_dtype.name, _dtype)

KV_DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


def get_weight_dtype(name: str) -> WeightDtype:
    return WEIGHT_DTYPES.get(name)


def kv_dtype_bytes(name: str) -> float:
    """Bytes per cached K or V element for a KV-cache dtype name."""
    if name.lower() not in KV_DTYPE_BYTES:
        raise UnknownNameError("KV-cache dtype", name, KV_DTYPE_BYTES)
    return KV_DTYPE_BYTES[name.lower()]
