"""llama.cpp's GEMM peak and its two paths for quantised prefill, worked by hand on the golden
device: FP16 and GGUF weights multiply at the FP16-accumulate rate, and the cuBLAS path (mmq=0)
adds one dequantisation pass over the weights per prefill step."""

from __future__ import annotations

from dataclasses import replace

import pytest
from golden_cost import GOLD_ARCH, GOLD_ENGINE, GOLD_HW, GOLD_PROFILE

from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.costmodel import Scenario, estimate_cost
from autocompress_opt.serving.dtypes import get_weight_dtype
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.hardware import get_hardware

# The golden device as a GeForce card: FP16 with FP16 accumulate at twice the BF16 rate.
GEFORCE = replace(GOLD_HW, name="gold-geforce", fp16_acc_tflops=20.0)
HALF_ENGINE = replace(GOLD_ENGINE, fp16_accumulate=True)
# GEMM parameters of GOLD_ARCH: per layer 64·16·(2·4 + 2·2) + 3·64·128 = 36,864; two layers.
LIN = 2 * 36_864


def floor_ms(engine, dtype: str, input_len: int = 1000, output_len: int = 2) -> tuple[float, float]:
    cost = estimate_cost(GOLD_ARCH, GEFORCE, engine, Scenario(dtype, input_len, output_len, 1), GOLD_PROFILE)
    return cost.ttft_floor_ms, cost.tpot_floor_ms


def test_fp16_gemms_run_at_the_fp16_accumulate_rate() -> None:
    # 1000 prompt tokens are compute bound: 2·1000·LIN FLOPs at 10 vs 20 TFLOP/s.
    saved_ms = 2 * 1000 * LIN * (1 / 10e12 - 1 / 20e12) * 1e3
    bf16, _ = floor_ms(HALF_ENGINE, "bf16")
    fp16, _ = floor_ms(HALF_ENGINE, "fp16")
    assert bf16 - fp16 == pytest.approx(saved_ms, rel=1e-9)  # BF16 keeps the FP32-accumulate rate
    # An engine without FP16 accumulation times FP16 like BF16.
    assert floor_ms(GOLD_ENGINE, "fp16")[0] == pytest.approx(floor_ms(GOLD_ENGINE, "bf16")[0], rel=1e-12)


def test_the_cublas_path_adds_a_dequantisation_pass_to_prefill_only() -> None:
    bits = get_weight_dtype("q8_0").body_bits
    extra_ms = LIN * (bits / 8 + 2) / 100e9 * 1e3  # read the blocks, write FP16; one step (no chunking)
    mmq_ttft, mmq_tpot = floor_ms(replace(HALF_ENGINE, mmq=1), "q8_0")
    cublas_ttft, cublas_tpot = floor_ms(replace(HALF_ENGINE, mmq=0), "q8_0")
    assert cublas_ttft - mmq_ttft == pytest.approx(extra_ms, rel=1e-9)
    assert cublas_tpot == pytest.approx(mmq_tpot, rel=1e-12)  # one token a step: mat-vec kernels
    # 32 tokens or fewer go through MMQ even on the cuBLAS path; FP16 weights have nothing to dequantise.
    assert floor_ms(replace(HALF_ENGINE, mmq=0), "q8_0", input_len=32)[0] == pytest.approx(
        floor_ms(HALF_ENGINE, "q8_0", input_len=32)[0], rel=1e-12
    )
    assert floor_ms(replace(HALF_ENGINE, mmq=0), "fp16")[0] == pytest.approx(floor_ms(HALF_ENGINE, "fp16")[0])


def test_catalog_fp16_accumulate_rates() -> None:
    assert get_hardware("rtx4090").half_accumulate_flops() == pytest.approx(330.3e12)
    rtx3090 = get_hardware("rtx3090")  # Ampere GeForce: FP16 accumulate at twice the FP32-accumulate rate
    assert rtx3090.half_accumulate_flops() == pytest.approx(2 * rtx3090.peak_flops("bf16"))
    h100 = get_hardware("h100")  # datacenter: FP16 at the BF16 rate whatever the accumulator
    assert h100.half_accumulate_flops() == h100.peak_flops("bf16")
    assert get_engine("llamacpp").fp16_accumulate and not get_engine("vllm").fp16_accumulate


def test_mmq_option_is_zero_or_one() -> None:
    assert get_engine("llamacpp").mmq == 1
    assert get_engine("llamacpp").with_options(mmq=0).mmq == 0
    with pytest.raises(ConfigError, match=r"mmq must be 0 or 1, got 2"):
        get_engine("llamacpp").with_options(mmq=2)
    with pytest.raises(ConfigError, match="has no option 'mmq'"):
        get_engine("vllm").with_options(mmq=0)
