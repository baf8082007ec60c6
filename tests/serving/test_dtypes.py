"""Weight and KV formats: llama.cpp's GGUF file types priced from its quantize table, the formats
each recipe keeps for the embedding and the LM head, and FP8 / GGUF KV caches."""

from __future__ import annotations

import pytest

from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.errors import UnknownNameError
from autocompress_opt.serving.costmodel import Scenario, estimate_cost
from autocompress_opt.serving.dtypes import GGUF_BLOCK_BITS, get_weight_dtype, kv_dtype_bytes, weight_dtype_names

GGUF = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "iq4_xs")  # most bits first
LLAMA_8B_PARAMS = 8_030_261_248  # the model of llama.cpp's quantize table
# Whole-file bits per weight in llama.cpp tools/quantize/README.md (Llama-3.1-8B).
TABLE_BPW = {"q8_0": 8.5008, "q6_k": 6.5633, "q5_k_m": 5.7036, "q4_k_m": 4.8944, "iq4_xs": 4.4597}


def test_block_formats_have_ggml_sizes() -> None:
    # block_q4_K: 2 fp16 scales + 12 bytes of 6-bit sub-scales + 128 bytes of nibbles per 256 weights
    assert GGUF_BLOCK_BITS["Q4_K"] == (2 * 2 + 12 + 128) * 8 / 256 == 4.5
    assert GGUF_BLOCK_BITS["Q8_0"] == 8.5 and GGUF_BLOCK_BITS["Q6_K"] == 6.5625 and GGUF_BLOCK_BITS["IQ4_XS"] == 4.25


@pytest.mark.parametrize("name", list(TABLE_BPW))
def test_gguf_weights_reproduce_the_quantize_table_size(name: str) -> None:
    """Llama-3.1-8B priced in each format weighs what llama.cpp's table says (bits/weight x params)."""
    arch = known_architectures()["llama-3.1-8b"]
    assert arch.num_params == LLAMA_8B_PARAMS
    cost = estimate_cost(arch, "rtx5090", "llamacpp", Scenario(name, 128, 128, 1))
    assert cost.weights_gib * 2**30 * 8 / LLAMA_8B_PARAMS == pytest.approx(TABLE_BPW[name], rel=1e-4)


def test_recipes_keep_their_embedding_and_output_formats() -> None:
    # llama_tensor_get_type: output.weight is Q6_K unless the base type is Q8_0; token_embd keeps the base type
    assert (get_weight_dtype("q4_k_m").embed_format, get_weight_dtype("q4_k_m").head_format) == ("Q4_K", "Q6_K")
    assert (get_weight_dtype("q8_0").embed_format, get_weight_dtype("q8_0").head_format) == ("Q8_0", "Q8_0")
    assert get_weight_dtype("iq4_xs").head_format == "Q6_K" and get_weight_dtype("q4_0").body_bits == 4.5
    # FP8 / NVFP4 checkpoints keep the embedding and lm_head in BF16
    assert get_weight_dtype("fp8").head_format == get_weight_dtype("fp4").embed_format == "BF16"


def test_a_tied_gguf_embedding_is_stored_as_the_output() -> None:
    """SmolLM2 ties its embedding: in q4_k_m the one matrix is Q6_K (6.5625 bits), not Q4_K."""
    arch = known_architectures()["smollm2-135m"]
    assert arch.tie_embeddings
    q4 = estimate_cost(arch, "rtx5070", "llamacpp", Scenario("q4_k_m", 128, 16, 1)).weights_gib
    dt = get_weight_dtype("q4_k_m")
    embed = arch.vocab_size * arch.hidden_size
    body = arch.num_params - embed
    assert q4 * 2**30 == pytest.approx((body * dt.body_bits + embed * 6.5625) / 8, rel=1e-9)


def test_fewer_bits_mean_smaller_weights_and_faster_decode() -> None:
    arch = known_architectures()["qwen3-8b"]
    costs = [estimate_cost(arch, "rtx5080", "llamacpp", Scenario(d, 512, 128, 1)) for d in GGUF]
    weights = [c.weights_gib for c in costs]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == len(weights)
    assert [c.tpot_ms for c in costs] == sorted((c.tpot_ms for c in costs), reverse=True)


def test_fp8_kv_cache_halves_the_kv_bytes() -> None:
    arch = known_architectures()["llama-3.1-8b"]
    bf16 = estimate_cost(arch, "h100-sxm", "vllm", Scenario("fp8", 1000, 1000, "max", kv_dtype="bf16"))
    fp8 = estimate_cost(arch, "h100-sxm", "vllm", Scenario("fp8", 1000, 1000, "max", kv_dtype="fp8"))
    assert fp8.kv_bytes_per_token == pytest.approx(bf16.kv_bytes_per_token / 2)
    assert fp8.max_concurrency > 1.9 * bf16.max_concurrency or fp8.max_concurrency == 256
    assert kv_dtype_bytes("q8_0") == 8.5 / 8 and kv_dtype_bytes("FP8_E4M3") == 1.0


def test_unknown_formats_list_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"q3_k.*available: .*iq4_xs, mxfp4, q4_0, q4_k_m, q5_k_m, q6_k, q8_0"):
        get_weight_dtype("q3_k")
    with pytest.raises(UnknownNameError, match="available: .*fp8.*q8_0"):
        kv_dtype_bytes("int2")
    assert set(GGUF) <= set(weight_dtype_names())
