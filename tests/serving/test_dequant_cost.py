"""Weight-only routed experts (mxfp4, W4A16 on a device without FP4 tensor math) are dequantised on
the CUDA cores once per M-tile of tokens (issue 44): the term's hand-worked value, where it applies
and where it must not, and its size on gpt-oss-120b, the model whose published rows it was added for."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from golden_cost import GOLD_ENGINE, GOLD_HW, GOLD_PROFILE
from test_moe_mamba_cost import tiny_moe

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.serving import roofline
from autocompress_opt.serving.costmodel import ArchArrays, Scenario, estimate_batch, estimate_cost
from autocompress_opt.serving.hardware import get_hardware

# GOLD_HW (10 TFLOP/s BF16, 100 GB/s) with CUDA cores at 1 TFLOP/s FP32: 0.5e12 lane operations/s.
CORES_HW = dataclasses.replace(GOLD_HW, fp32_tflops=1.0)
# One prompt of 512 tokens, one output token: a single compute-bound prefill step.
PREFILL = Scenario(dtype="mxfp4", input_len=512, output_len=1, concurrency=1)


def test_prefill_pays_the_dequantisation_by_hand() -> None:
    """tiny_moe: 2 layers of 8 experts of 6144 parameters, 2 per token. 512 tokens touch all 8
    experts (8·(1 − (6/8)^512) = 8), 512·2/8 = 128 tokens each: ½ + 128/64 = 2.5 M-tiles. Dequantised
    elements per layer 8 · 6144 · 2.5 = 122880, at 2 operations each over 0.5e12 · mfu 0.5 = 2.5e11
    operations/s: 9.8304e-7 s a layer, 1.96608e-6 s for the two. The GEMMs stay compute-bound
    (their time only grows), so TTFT grows by exactly that."""
    arch = tiny_moe()
    without = estimate_cost(arch, GOLD_HW, GOLD_ENGINE, PREFILL, GOLD_PROFILE)
    with_cores = estimate_cost(arch, CORES_HW, GOLD_ENGINE, PREFILL, GOLD_PROFILE)
    assert with_cores.ttft_ms - without.ttft_ms == pytest.approx(1.96608e-3, rel=1e-6)
    # The roofline floor is the physical limit at 100 % of the tensor and memory peaks: unchanged.
    assert with_cores.ttft_floor_ms == without.ttft_floor_ms


def test_the_term_is_absent_where_nothing_is_dequantised() -> None:
    """BF16 experts, a dense model in mxfp4 (nothing routed), and a device with FP4 tensor math
    (it multiplies MXFP4 natively) cost what they cost without CUDA-core rates."""
    arch = tiny_moe()
    bf16 = dataclasses.replace(PREFILL, dtype="bf16")
    assert estimate_cost(arch, CORES_HW, GOLD_ENGINE, bf16, GOLD_PROFILE) == estimate_cost(
        arch, GOLD_HW, GOLD_ENGINE, bf16, GOLD_PROFILE
    )
    dense = Architecture(
        vocab_size=1000,
        hidden_size=64,
        layers=(LayerSpec(num_heads=4, num_kv_heads=2, head_dim=16, ffn_width=64),) * 2,
    )
    assert estimate_cost(dense, CORES_HW, GOLD_ENGINE, PREFILL, GOLD_PROFILE) == estimate_cost(
        dense, GOLD_HW, GOLD_ENGINE, PREFILL, GOLD_PROFILE
    )
    fp4_device = dataclasses.replace(CORES_HW, peak_tflops={"bf16": 10, "fp4": 40})
    assert estimate_cost(arch, fp4_device, GOLD_ENGINE, PREFILL, GOLD_PROFILE) == estimate_cost(
        arch, dataclasses.replace(fp4_device, fp32_tflops=None), GOLD_ENGINE, PREFILL, GOLD_PROFILE
    )


def test_decode_at_one_sequence_stays_memory_bound() -> None:
    """One token a step touches 2 experts once: 2 · 6144 · 2 = 24576 operations (~1e-7 s) against
    the weights' read (~6.5e-7 s a layer): the decode step does not change."""
    arch = tiny_moe()
    decode = Scenario(dtype="mxfp4", input_len=100, output_len=21, concurrency=1)
    assert (
        estimate_cost(arch, CORES_HW, GOLD_ENGINE, decode, GOLD_PROFILE).tpot_ms
        == estimate_cost(arch, GOLD_HW, GOLD_ENGINE, decode, GOLD_PROFILE).tpot_ms
    )


def test_gpt_oss_on_hopper_prefill_slows_by_a_physical_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss-120b on an H100 (FP32 67 TFLOP/s): a prefill-bound request loses a sizeable but
    bounded share of its throughput to the dequantisation (the published rows were predicted 21-50 %
    too fast without it); the same request in BF16 is untouched, and the term grows with the
    operations per element."""
    arch = load_architecture("gpt-oss-120b")
    hw = get_hardware("h100-sxm")
    assert hw.fp32_tflops == 67
    scenario = Scenario(dtype="mxfp4", input_len=4000, output_len=200, concurrency=64)

    def ttft(ops: float, dtype: str = "mxfp4") -> float:
        monkeypatch.setattr(roofline, "DEQUANT_OPS_PER_ELEMENT", ops)
        return estimate_cost(arch, hw, "vllm", dataclasses.replace(scenario, dtype=dtype)).ttft_ms

    off, shipped, heavier = ttft(0.0), ttft(2.0), ttft(4.0)
    assert 1.1 < shipped / off < 1.8
    assert heavier > shipped
    assert ttft(2.0, "bf16") == ttft(0.0, "bf16")


def test_torch_backend_matches_numpy_with_the_term() -> None:
    """The differentiable path carries the dequantisation too, to the numpy value."""
    archs = [tiny_moe(), tiny_moe(64, 6, 48)]
    scenario = Scenario(dtype="mxfp4", input_len=300, output_len=40, concurrency=8, arrival="steady")
    n = estimate_batch(ArchArrays.from_architectures(archs), "h100-sxm", "vllm", scenario)
    t = estimate_batch(ArchArrays.from_architectures(archs, backend="torch"), "h100-sxm", "vllm", scenario)
    for metric, values in n.items():
        np.testing.assert_allclose(t[metric].detach().numpy(), values, rtol=1e-12, err_msg=metric)
