"""The cost model on mixture-of-experts and Mamba-2 layers (issue 30): hand-worked golden numbers on a
tiny MoE and a tiny hybrid, the experts-touched formula's limits, monotonicity in experts and expert
width, the torch backend, and `autocompress cost` on Nemotron 3 Super."""

from __future__ import annotations

import dataclasses
import json

import hypothesis.strategies as st
import numpy as np
import pytest
from golden_cost import GOLD_ARCH, GOLD_ENGINE, GOLD_HW, GOLD_PROFILE, GOLD_SCENARIO
from hypothesis import given, settings

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.moe import MambaSpec, MoESpec
from autocompress_opt.cli import main
from autocompress_opt.serving.costmodel import (
    ArchArrays,
    Scenario,
    estimate_batch,
    estimate_cost,
    experts_touched,
)
from autocompress_opt.serving.engine_models import GIB
from autocompress_opt.serving.fitting import Observation, fit_routed_passes
from autocompress_opt.serving.hardware import Hardware

ATTENTION = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16}  # GOLD_ARCH's attention


def tiny_moe(num_experts: int = 8, experts_per_token: int = 2, expert_width: int = 32) -> Architecture:
    """2 layers of GOLD_ARCH's attention, each with a gated MoE FFN (no shared expert)."""
    moe = MoESpec(num_experts=num_experts, experts_per_token=experts_per_token, expert_width=expert_width)
    layer = LayerSpec(**ATTENTION, ffn=False, moe=moe)
    return Architecture(vocab_size=1000, hidden_size=64, layers=(layer, layer), family="mixtral", name="tiny-moe")


TINY_MAMBA = MambaSpec(num_heads=4, head_dim=16, state_size=8, groups=1, conv_width=4)


def tiny_hybrid() -> Architecture:
    """Nemotron-H style: a Mamba-2 layer then an attention layer, each with a relu² (2-matrix) FFN of 128."""
    layers = (
        LayerSpec(attention=False, mamba=TINY_MAMBA, ffn=True, ffn_width=128),
        LayerSpec(**ATTENTION, ffn=True, ffn_width=128),
    )
    return Architecture(vocab_size=1000, hidden_size=64, layers=layers, family="nemotron_h", name="tiny-hybrid")


def test_tiny_moe_golden_values() -> None:
    """Every cost of a 2-layer MoE equals the arithmetic in the comments (rates 5e12 FLOP/s, 5e10 B/s)."""
    arch = tiny_moe()
    c = estimate_cost(arch, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE)
    # Per layer: attention 12288 + norm 64; one expert 3·32·64 = 6144, 8 of them 49152; router 8·64 = 512
    # + norm 64 = 576. Layer 62080; ×2 + final norm 64 + embed 64000 + head 64000 = 252224.
    assert arch.num_params == 252224
    assert c.weights_gib == pytest.approx(2 * 252224 / GIB, rel=1e-12)
    # Active: 2 of 8 experts → layer 12352 + 12288 + 576 = 25216; ×2 + 64 + 128000 = 178496.
    assert c.active_params == arch.active_params() == 178496
    assert c.kv_bytes_per_token == 256  # as GOLD_ARCH: the experts hold no cache
    # Decode (1 token): 8·(1 − (6/8)^1) = 2 experts read, as a token runs 2. GEMM/layer: run and read
    #   12288 + 576 + 2·6144 = 25152 params: max(2·25152/5e12, 50304 B/5e10) = 1.00608e-6 s;
    #   attention 2.8544e-7 (GOLD); head 2.56e-6; 4 kernels 4e-6; step 1e-5
    #   → 2·(1.00608e-6 + 2.8544e-7) + 2.56e-6 + 4e-6 + 1e-5 = 1.914304e-5 s.
    assert c.tpot_ms == pytest.approx(0.01914304, rel=1e-9)
    # Prefill (100 tokens, one step): 8·(1 − 0.75^100) ≈ 8 experts read (0.75^100 = 3e-13):
    #   read 12864 + 8·6144 = 62016 params = 124032 B / 5e10 = 2.48064e-6 s > FLOPs 2·100·25152/5e12 = 1.00608e-6;
    #   attention 2.5856e-7 (GOLD); head 2.56e-6; fixed 1.4e-5 → 2·(2.48064e-6 + 2.5856e-7) + 1.656e-5 = 2.20384e-5 s.
    assert c.ttft_ms == pytest.approx(0.0220384, rel=1e-9)
    # Memory: weights 504448 + activations 100 tokens · (q 64 + k,v 64 + 2 experts·(gate + up 2·32) = 128, + 4·64)
    #   = 512 elements · 2 B = 102400, + logits 4000; KV 256 B · 121 tokens = 30976 → 641824 B.
    assert c.peak_memory_gib == pytest.approx(641824 / GIB, rel=1e-12)


def test_mxfp4_quantises_only_the_routed_experts() -> None:
    """mxfp4 (gpt-oss's checkpoint, vLLM's Mxfp4Config): routed experts at 4.25 bits, every other weight
    BF16, BF16 math; a dense model in mxfp4 therefore costs what it costs in bf16."""
    arch = tiny_moe()
    scenario = dataclasses.replace(GOLD_SCENARIO, dtype="mxfp4")
    c = estimate_cost(arch, GOLD_HW, GOLD_ENGINE, scenario, GOLD_PROFILE)
    # 2 layers × 8 experts × 6144 = 98304 expert params at 4.25 bits = 52224 B; the other
    # 252224 − 98304 = 153920 at 2 B = 307840 B → 360064 B.
    assert c.weights_gib == pytest.approx(360064 / GIB, rel=1e-12)
    # Decode reads 2 experts per layer: GEMM/layer 12864 params · 2 B + 2·6144 · 4.25/8 B = 32256 B
    #   / 5e10 = 6.4512e-7 s (FLOPs 2·25152/5e12 = 1.006e-8 s); the rest as in the bf16 golden
    #   → 2·(6.4512e-7 + 2.8544e-7) + 2.56e-6 + 4e-6 + 1e-5 = 1.842112e-5 s.
    assert c.tpot_ms == pytest.approx(0.01842112, rel=1e-9)
    dense = Architecture(vocab_size=1000, hidden_size=64, layers=(LayerSpec(**ATTENTION, ffn_width=64),) * 2)
    as_bf16 = estimate_cost(dense, GOLD_HW, GOLD_ENGINE, dataclasses.replace(GOLD_SCENARIO, dtype="bf16"), GOLD_PROFILE)
    assert estimate_cost(dense, GOLD_HW, GOLD_ENGINE, scenario, GOLD_PROFILE) == as_bf16


def test_tiny_hybrid_golden_values() -> None:
    """A Mamba-2 + attention model: state instead of KV in the Mamba layer, its scan and state traffic."""
    arch = tiny_hybrid()
    c = estimate_cost(arch, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE)
    # Mamba-2: inner I = 4·16 = 64, conv channels C = 64 + 2·1·8 = 80; in_proj 64·(64 + 80 + 4) = 9472,
    #   conv 80·4 + 80 = 400, dt_bias/A_log/D 12, gated norm 64, out_proj 64·64 = 4096 → 14044, + pre-norm 64.
    # relu² FFN: 2·64·128 = 16384 + norm 64. Layers 14108 + 16448 = 30556 and 12352 + 16448 = 28800;
    #   + 64 + 128000 → 187420.
    assert arch.num_params == c.active_params == 187420
    assert c.weights_gib == pytest.approx(2 * 187420 / GIB, rel=1e-12)
    assert c.kv_bytes_per_token == 128  # the attention layer alone: 2·2 B·(2 kv heads·16)
    # State per sequence: 64·8 + 80·(4 − 1) = 752 elements, fp32 → 3008 B.
    assert arch.state_elements_per_sequence() == 752
    # Decode: Mamba layer GEMM 30492 params → 60984 B / 5e10 = 1.21968e-6 s; its scan
    #   max(3200 FLOPs (5·64·8 + 2·80·4)/5e12, state read + write 2·3008 B/5e10 = 1.2032e-7) = 1.2032e-7;
    #   attention layer GEMM 28672 params → 1.14688e-6, attention 2.8544e-7 (GOLD); head 2.56e-6;
    #   4 kernels 4e-6; step 1e-5 → 1.933232e-5 s.
    assert c.tpot_ms == pytest.approx(0.01933232, rel=1e-9)
    # Prefill of 100 tokens: GEMMs as in decode (FLOPs 2·100·params/5e12 equal the bytes' time);
    #   scan max(100·3200/5e12 = 6.4e-8, 6016/5e10 = 1.2032e-7); attention 2.5856e-7
    #   → 1.21968e-6 + 1.2032e-7 + 1.14688e-6 + 2.5856e-7 + 2.56e-6 + 1.4e-5 = 1.930544e-5 s.
    assert c.ttft_ms == pytest.approx(0.01930544, rel=1e-9)
    # Memory: weights 374840 + activations 100·(max(2·128 + in_proj out 148, 2·128 + 64 + 64) + 4·64 = 660)·2 B
    #   = 132000, + logits 4000; KV 128·121 = 15488 + state 3008 → 529336 B.
    assert c.peak_memory_gib == pytest.approx(529336 / GIB, rel=1e-12)
    # max concurrency: (10 GiB − weights) // (KV + state 18496 + activations 136000)
    assert c.max_concurrency == (10 * GIB - 374840) // (18496 + 136000)


def test_experts_touched_limits() -> None:
    """k experts for one token, all E for many, never above min(E, k·B), rising in B."""
    for experts, k in ((8, 2), (128, 8), (512, 22)):
        assert experts_touched(experts, k, 1) == pytest.approx(k, rel=1e-12)
        assert experts_touched(experts, k, 1e6) == pytest.approx(experts, rel=1e-12)
        batches = np.array([1, 2, 3, 8, 64, 1024], dtype=float)
        touched = experts_touched(float(experts), float(k), batches)
        assert np.all(np.diff(touched) > 0)
        assert np.all(touched <= np.minimum(experts, k * batches) * (1 + 1e-12))
    assert experts_touched(0.0, 0.0, 5.0) == 0.0  # a dense layer reads no expert


moe_shapes = st.tuples(st.integers(2, 64), st.integers(1, 8), st.integers(1, 8)).map(
    lambda t: (t[0], min(t[1], t[0]), 16 * t[2])
)
SCENARIOS = (
    Scenario(input_len=200, output_len=50, concurrency=4),
    Scenario(input_len=300, output_len=40, concurrency=16, arrival="steady"),
)
LOWER_IS_BETTER = ("weights_gib", "peak_memory_gib", "ttft_ms", "tpot_ms", "e2e_latency_ms", "active_params")


def _assert_not_worse(small: dict[str, float], big: dict[str, float]) -> None:
    for key in LOWER_IS_BETTER + ("ttft_floor_ms", "tpot_floor_ms"):
        assert small[key] <= big[key] * (1 + 1e-12), key
    assert small["output_throughput_tok_s"] >= big["output_throughput_tok_s"] * (1 - 1e-12)


@settings(max_examples=25, deadline=None)
@given(shape=moe_shapes, fewer=st.integers(1, 63), narrower=st.integers(1, 7), hybrid=st.booleans())
def test_cost_never_rises_when_experts_or_expert_width_shrink(
    shape: tuple[int, int, int], fewer: int, narrower: int, hybrid: bool
) -> None:
    experts, k, width = shape
    big = tiny_moe(experts, k, width)
    if hybrid:  # a Mamba-2 mixer in the first layer
        big = dataclasses.replace(
            big,
            layers=(
                dataclasses.replace(
                    big.layers[0], attention=False, num_heads=0, num_kv_heads=0, head_dim=0, mamba=TINY_MAMBA
                ),
                big.layers[1],
            ),
        )
    kept = max(experts - fewer, k)
    for small in (
        _with_moe(big, num_experts=kept),
        _with_moe(big, expert_width=max(width - 16 * narrower, 16)),
        _with_moe(big, experts_per_token=max(k - 1, 1)),
    ):
        for scenario in SCENARIOS:
            args = ("h100-sxm", "vllm", scenario)
            _assert_not_worse(estimate_cost(small, *args).to_dict(), estimate_cost(big, *args).to_dict())


def _with_moe(arch: Architecture, **sizes: int) -> Architecture:
    layers = tuple(
        dataclasses.replace(layer, moe=dataclasses.replace(layer.moe, **sizes)) if layer.moe else layer
        for layer in arch.layers
    )
    return dataclasses.replace(arch, layers=layers)


def test_torch_backend_matches_numpy_on_moe_and_hybrid() -> None:
    """The differentiable path gives the numpy numbers on MoE and Mamba-2 layers too."""
    archs = [tiny_moe(), tiny_hybrid(), tiny_moe(64, 6, 48)]
    scenario = Scenario(input_len=300, output_len=40, concurrency=8, arrival="steady")
    n = estimate_batch(ArchArrays.from_architectures(archs), "h100-sxm", "vllm", scenario)
    arrays = ArchArrays.from_architectures(archs, backend="torch")
    t = estimate_batch(arrays, "h100-sxm", "vllm", scenario)
    for metric, values in n.items():
        np.testing.assert_allclose(t[metric].detach().numpy(), values, rtol=1e-12, err_msg=metric)


def test_cli_cost_on_nemotron_3_super_reports_active_params_and_experts(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's numbers: 120.7B in BF16 ≈ 241 GB (more than a B200), 128K context ≈ 1 GiB of KV and
    160 MiB of SSM state per sequence (+ 4.7 MiB of conv window), 22 of 512 experts per token."""
    code = main(
        ["cost", "--model", "nemotron-3-super-120b-a12b", "--hardware", "b200", "--engine", "vllm", "--dtype",
         "bf16", "--input-len", "130048", "--output-len", "1024", "--json"]
    )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["weights_gib"] * GIB / 1e9 == pytest.approx(241.3, rel=1e-3)
    assert out["active_params"] == pytest.approx(12.8e9, rel=5e-3)
    assert not out["fits"] and out["max_concurrency"] == 0
    sparse = out["sparse"]
    assert sparse["kv_gib_per_sequence"] == 1.0  # 8 layers · 2 (K,V) · 2 heads · 128 · 2 B · 131072
    # SSM 40·128·64·128·4 B = 160 MiB, conv window 40·(8192 + 2·8·128)·3·4 B = 4.6875 MiB.
    assert sparse["state_mib_per_sequence"] == 160 + 4.6875
    assert sparse["decode_batch"] == 1
    assert sparse["experts_touched_per_step"] == [
        {"moe_layers": 40, "experts": 512, "experts_per_token": 22, "touched": pytest.approx(22, rel=1e-12)}
    ]


def test_cli_cost_text_shows_experts_read_at_the_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["cost", "--model", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--engine", "vllm", "--dtype", "bf16",
         "--input-len", "1000", "--output-len", "100", "--concurrency", "16"]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    touched = experts_touched(128, 8, 16)  # 128·(1 − (120/128)^16) ≈ 82.0
    assert f"experts read per decode step at batch 16: {touched:,.2f} of 128 (top-8) in each of 48 MoE layers" in text
    assert "active_params" in text and "3,353,032,704" in text


def test_active_params_is_a_constraint_of_a_target() -> None:
    """``active_params`` is constrained like any metric, relative to the parent or absolute."""
    from autocompress_opt.serving.targets import Target, parent_metrics

    parent = tiny_moe(16, 4, 64)
    target = Target("h100-sxm", "datacenter", constraints={"active_params": "0.85x"})
    reference = parent_metrics(parent, target)
    fewer_per_token = _with_moe(parent, experts_per_token=2)
    assert target.violations(target.cost_metrics(parent), reference)["active_params <= 0.85x"] > 0
    assert target.violations(target.cost_metrics(fewer_per_token), reference)["active_params <= 0.85x"] <= 0


def test_moe_kernels_and_routed_pair_time_golden_values() -> None:
    """A MoE block's own kernel count (Engine.kernels_per_moe) and the routed pairs' activation
    traffic (CostProfile.routed_passes over ArchArrays.expert_io) add exactly the arithmetic in the
    comments to the tiny MoE."""
    engine = dataclasses.replace(GOLD_ENGINE, kernels_per_moe=5)
    profile = GOLD_PROFILE.with_parameters(routed_passes=50.0)
    c = estimate_cost(tiny_moe(), GOLD_HW, engine, GOLD_SCENARIO, profile)
    # Kernels: 2 layers · (attention 1 + MoE 5) = 12 (was 4) → +8 µs per step. A routed pair moves
    # 4·64 + 6·32 = 448 activation elements (gated, D 64, F 32) = 896 bytes, 50 times, at 100 GB/s ·
    # mbu 0.5: 8.96e-7 s; 2 layers · k 2 = 4 pairs a token: 3.584e-6 s.
    # Decode (1 token): 1.914304e-5 (golden above) + 8e-6 + 3.584e-6 = 3.072704e-5 s.
    assert c.tpot_ms == pytest.approx(0.03072704, rel=1e-9)
    # Prefill (100 tokens, one step): 2.20384e-5 + 8e-6 + 100 · 3.584e-6 = 3.884384e-4 s.
    assert c.ttft_ms == pytest.approx(0.3884384, rel=1e-9)


def test_routed_pair_time_follows_the_expert_shape_and_the_bandwidth() -> None:
    """The routed pairs' time is traffic, not a constant: twice the expert width adds 6·32 more
    elements a pair (448 → 640), and a device with twice the bandwidth halves it."""
    profile = GOLD_PROFILE.with_parameters(routed_passes=50.0)

    def routed_s(arch: Architecture, hw: Hardware) -> float:
        with_pairs = estimate_cost(arch, hw, GOLD_ENGINE, GOLD_SCENARIO, profile).ttft_ms
        without = estimate_cost(arch, hw, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE).ttft_ms
        return (with_pairs - without) / 1e3

    base = routed_s(tiny_moe(), GOLD_HW)
    assert base == pytest.approx(100 * 4 * 896 * 50 / 50e9, rel=1e-6)
    assert routed_s(tiny_moe(expert_width=64), GOLD_HW) == pytest.approx(base * 640 / 448, rel=1e-6)
    faster = dataclasses.replace(GOLD_HW, bandwidth_gb_s=200)
    assert routed_s(tiny_moe(), faster) == pytest.approx(base / 2, rel=1e-6)


def test_moe_terms_leave_a_dense_model_unchanged() -> None:
    """A dense model has no MoE block and no routed pair: the MoE kernel count and the time per pair
    change none of its costs, bit for bit."""
    engine = dataclasses.replace(GOLD_ENGINE, kernels_per_moe=9)
    profile = GOLD_PROFILE.with_parameters(routed_passes=50.0)
    arch = tiny_hybrid()  # Mamba-2 and attention, dense FFNs: the sparse path, no MoE layer
    for a in (arch, GOLD_ARCH):
        plain = estimate_cost(a, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE)
        assert estimate_cost(a, GOLD_HW, engine, GOLD_SCENARIO, profile) == plain


def test_fit_routed_passes_recovers_the_value_that_made_the_rows() -> None:
    """Rows predicted at 20 passes are fitted back to 20 from a start of 0; no rows keep the start."""
    truth = GOLD_PROFILE.with_parameters(routed_passes=20.0)
    observations = []
    for concurrency, metric in ((1, "tpot_ms"), (8, "output_throughput_tok_s"), (64, "output_throughput_tok_s")):
        scenario = dataclasses.replace(GOLD_SCENARIO, concurrency=concurrency)
        value = estimate_cost(tiny_moe(), GOLD_HW, GOLD_ENGINE, scenario, truth)
        observations.append(
            Observation(tiny_moe(), GOLD_HW, GOLD_ENGINE, scenario, metric, float(getattr(value, metric)))
        )
    fitted = fit_routed_passes(observations, GOLD_PROFILE)
    assert fitted.routed_passes == pytest.approx(20.0, rel=1e-3)
    assert fitted.mfu == GOLD_PROFILE.mfu and fitted.kernel_launch_us == GOLD_PROFILE.kernel_launch_us
    assert fit_routed_passes([], GOLD_PROFILE) is GOLD_PROFILE
