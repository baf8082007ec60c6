"""Weight and KV-cache number formats: bytes per element and the tensor math they run on."""

from __future__ import annotations

from dataclasses import dataclass

from autocompress_opt.errors import UnknownNameError
from autocompress_opt.registry import Registry

__all__ = [
    "GGUF_BLOCK_BITS",
    "KV_DTYPE_BYTES",
    "WEIGHT_DTYPES",
    "WeightDtype",
    "get_weight_dtype",
    "kv_dtype_bytes",
    "weight_dtype_names",
]


@dataclass(frozen=True)
class WeightDtype:
    """How a checkpoint stores its weights.

    Attributes:
        name: registry key (``bf16``, ``fp8``, ``q4_k_m``...).
        body_bits: bits per parameter of the decoder layers, scales included.
        embed_bits: bits per parameter of the token embedding.
        head_bits: bits per parameter of an untied LM head.
        tied_bits: bits per parameter of a *tied* embedding/LM-head matrix (None: ``embed_bits``).
            llama.cpp quantises a tied ``token_embd`` like ``output.weight``.
        embed_format / head_format: the storage format the recipe keeps for the token embedding and
            the LM head (``Q6_K``, ``BF16``...), for reports.
        compute: the tensor-math format its GEMMs run at (see ``Hardware.compute_dtype``).
        activation_bytes: bytes per activation element.
        expert_bits: bits per parameter of a mixture-of-experts layer's *routed experts* where the
            format quantises only them (None: ``body_bits``, like every other decoder matrix).
        source: where the bit counts come from.
    """

    name: str
    body_bits: float
    embed_bits: float
    head_bits: float
    compute: str
    activation_bytes: int = 2
    source: str = ""
    tied_bits: float | None = None
    embed_format: str = ""
    head_format: str = ""
    expert_bits: float | None = None

    @property
    def tied_embedding_bits(self) -> float:
        return self.embed_bits if self.tied_bits is None else self.tied_bits

    @property
    def routed_expert_bits(self) -> float:
        """Bits per parameter of a routed expert (``expert_bits``, else ``body_bits``)."""
        return self.body_bits if self.expert_bits is None else self.expert_bits


# Bits per weight of ggml's block formats: block bytes x 8 / block elements (ggml/src/ggml-common.h:
# block_q4_0 = 2 + 16 bytes per 32, block_q8_0 = 2 + 32 per 32, block_q4_K = 144 per 256,
# block_q5_K = 176 per 256, block_q6_K = 210 per 256, block_iq4_xs = 136 per 256).
GGUF_BLOCK_BITS: dict[str, float] = {
    "Q4_0": 18 * 8 / 32,
    "Q8_0": 34 * 8 / 32,
    "Q4_K": 144 * 8 / 256,
    "Q5_K": 176 * 8 / 256,
    "Q6_K": 210 * 8 / 256,
    "IQ4_XS": 136 * 8 / 256,
}

# Llama-3.1-8B, the model of llama.cpp's quantize table: 8,030,261,248 parameters, of which the
# token embedding and the (untied) output matrix are 128256 x 4096 each.
_TABLE_PARAMS = 8_030_261_248
_TABLE_EMBED = 128_256 * 4_096
_QUANTIZE_TABLE = "llama.cpp tools/quantize/README.md (Llama-3.1-8B table)"
_TENSOR_TYPES = "src/llama-quant.cpp llama_tensor_get_type"


def _gguf(name: str, model_bpw: float | None, base: str, head: str, note: str) -> WeightDtype:
    """A llama.cpp file type. ``model_bpw``: the whole-file bits per weight of llama.cpp's quantize
    table (Llama-3.1-8B); the decoder layers' bits are what remains after the token embedding
    (``base`` format) and ``output.weight`` (``head``) are taken out. ``None``: a pure format
    (every decoder matrix in ``base``). A tied embedding is quantised like ``output.weight``
    (``llama_tensor_get_type``: the OUTPUT rule applies to ``token_embd`` when there is no output)."""
    embed_bits, head_bits = GGUF_BLOCK_BITS[base], GGUF_BLOCK_BITS[head]
    if model_bpw is None:
        body_bits = embed_bits
        source = f"pure {base} body ({_TENSOR_TYPES}); {note}"
    else:
        body_params = _TABLE_PARAMS - 2 * _TABLE_EMBED
        body_bits = (model_bpw * _TABLE_PARAMS - _TABLE_EMBED * (embed_bits + head_bits)) / body_params
        source = f"{_QUANTIZE_TABLE}: {model_bpw} bpw whole file; {note}"
    return WeightDtype(
        name,
        round(body_bits, 4),
        embed_bits,
        head_bits,
        "bf16",
        source=source,
        tied_bits=head_bits,
        embed_format=base,
        head_format=head,
    )


WEIGHT_DTYPES: Registry[WeightDtype] = Registry("weight dtype")

for _dtype in (
    WeightDtype("fp32", 32, 32, 32, "fp32", activation_bytes=4, embed_format="FP32", head_format="FP32"),
    WeightDtype("bf16", 16, 16, 16, "bf16", embed_format="BF16", head_format="BF16"),
    WeightDtype(
        "fp16",
        16,
        16,
        16,
        "bf16",
        source="FP16 tensor math runs at the BF16 rate",
        embed_format="FP16",
        head_format="FP16",
    ),
    # ModelOpt/vLLM FP8 checkpoints quantise the linear layers (per-tensor scales, negligible) and
    # keep the embedding and lm_head in BF16.
    WeightDtype(
        "fp8",
        8,
        16,
        16,
        "fp8",
        source="NVIDIA ModelOpt FP8 recipe: lm_head excluded from quantisation",
        embed_format="BF16",
        head_format="BF16",
    ),
    # NVFP4: 4-bit E2M1 values plus one FP8 scale per 16 elements = 4.5 bits.
    WeightDtype(
        "fp4",
        4.5,
        16,
        16,
        "fp4",
        source="NVFP4 format: 16-element blocks with an FP8 E4M3 scale",
        embed_format="BF16",
        head_format="BF16",
    ),
    # MXFP4 weight-only (W4A16): the routed experts in 4-bit E2M1 values plus one E8M0 scale per 32
    # elements = 4.25 bits, dequantised for BF16 tensor math; every other matrix (attention, router,
    # embedding, head) stays BF16. This is gpt-oss's checkpoint ("MoE weights quantized with mxfp4. All
    # the other weights are in bf16": TensorRT-LLM examples/models/core/gpt_oss/README.md, activations
    # BF16 on Hopper) and what vLLM's Mxfp4Config quantises (FusedMoE layers only; linear layers
    # unquantised). Hopper has no FP4 tensor cores: the math runs at the BF16 rate.
    WeightDtype(
        "mxfp4",
        16,
        16,
        16,
        "bf16",
        source="OCP Microscaling MXFP4 (32-element blocks, E8M0 scale) on routed experts only; gpt-oss model card",
        embed_format="BF16",
        head_format="BF16",
        expert_bits=4.25,
    ),
    # llama.cpp file types. Kernels dequantise for the math (the FP16/BF16 tensor rate is modelled).
    # The K-quant mixes (_M) give attn_v and ffn_down of half the layers (use_more_bits) Q6_K;
    # output.weight is Q6_K unless the base type is Q8_0 (llama_tensor_get_type).
    _gguf("q8_0", 8.5008, "Q8_0", "Q8_0", "output.weight stays Q8_0"),
    _gguf("q6_k", 6.5633, "Q6_K", "Q6_K", "every matrix Q6_K"),
    _gguf("q5_k_m", 5.7036, "Q5_K", "Q6_K", "Q5_K with Q6_K attn_v/ffn_down in half the layers"),
    _gguf("q4_k_m", 4.8944, "Q4_K", "Q6_K", "Q4_K with Q6_K attn_v/ffn_down in half the layers"),
    _gguf("iq4_xs", 4.4597, "IQ4_XS", "Q6_K", "IQ4_XS with Q5_K attn_v (GQA >= 4)"),
    _gguf("q4_0", None, "Q4_0", "Q6_K", "no Q4_0 row in the quantize table; Q4_1 ffn_down only with an imatrix"),
):
    WEIGHT_DTYPES.register(_dtype.name, _dtype)

# Bytes per cached K or V element. fp8 (E4M3/E5M2) is vLLM's --kv-cache-dtype fp8 and TensorRT-LLM's
# FP8 KV cache; q8_0 / q4_0 are llama.cpp's --cache-type-k/-v (block formats, scales included).
KV_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "q8_0": GGUF_BLOCK_BITS["Q8_0"] / 8,
    "q4_0": GGUF_BLOCK_BITS["Q4_0"] / 8,
}


def get_weight_dtype(name: str) -> WeightDtype:
    """The weight format ``name``; :class:`UnknownNameError` lists the valid ones."""
    return WEIGHT_DTYPES.get(name)


def weight_dtype_names() -> list[str]:
    return list(WEIGHT_DTYPES.names())


def kv_dtype_bytes(name: str) -> float:
    """Bytes per cached K or V element for a KV-cache dtype name."""
    if name.lower() not in KV_DTYPE_BYTES:
        raise UnknownNameError("KV-cache dtype", name, KV_DTYPE_BYTES)
    return KV_DTYPE_BYTES[name.lower()]
