"""Cost model: golden values, scalar = numpy = torch, monotonicity, conformance, bad input."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from golden_cost import GOLD_ARCH, GOLD_ENGINE, GOLD_HW, GOLD_PROFILE, GOLD_SCENARIO
from hypothesis import given, settings
from hypothesis import strategies as st

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.serving.costmodel import METRICS, ArchArrays, Scenario, estimate_batch, estimate_cost
from autocompress_opt.serving.dtypes import WEIGHT_DTYPES
from autocompress_opt.serving.engine_models import ENGINES, get_engine
from autocompress_opt.serving.hardware import HARDWARE

GIB = 2**30


def test_golden_values_match_hand_computation() -> None:
    """Every metric of a 2-layer model equals the arithmetic worked out in the comments."""
    c = estimate_cost(GOLD_ARCH, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE)
    # GEMM params per layer: attention 64·16·(2·4 + 2·2) = 12288, FFN 3·64·128 = 24576 → 36864.
    # Params: 2·(36864 + 2 norms·64) + final norm 64 + embed 64000 + head 64000 = 202048; bf16 → 404096 B.
    assert GOLD_ARCH.num_params == 202048
    assert c.weights_gib == pytest.approx(404096 / GIB, rel=1e-12)
    # KV: 2 (K,V) · 2 bytes · (2 kv heads · 16) · 2 layers = 256 B/token.
    assert c.kv_bytes_per_token == 256
    # Decode at context 100 + 21/2 = 110.5, rates 5e12 FLOP/s and 5e10 B/s (50 % of peak):
    #   GEMM/layer max(2·36864/5e12, 73728 B/5e10) = 1.47456e-6 s
    #   attention/layer max(4·110.5·64/5e12, 2·2·111.5·32 B/5e10 = 2.8544e-7) = 2.8544e-7 s
    #   head max(2·64000/5e12, 128000 B/5e10) = 2.56e-6 s; 4 kernels·1 µs; step 10 µs
    #   → 2·(1.47456e-6 + 2.8544e-7) + 2.56e-6 + 4e-6 + 1e-5 = 2.008e-5 s
    assert c.tpot_ms == pytest.approx(0.02008, rel=1e-9)
    # Prefill of 100 tokens: GEMM max(2·100·36864/5e12, 73728/5e10) = 1.47456e-6;
    #   attention pairs 100·101/2 = 5050: max(4·5050·64/5e12 = 2.5856e-7, 2·2·100·32/5e10 = 2.56e-7);
    #   head (last token only) 2.56e-6; fixed 4e-6 + 1e-5 → 2.002624e-5 s
    assert c.ttft_ms == pytest.approx(0.02002624, rel=1e-9)
    assert c.e2e_latency_ms == pytest.approx(0.02002624 + 20 * 0.02008, rel=1e-9)
    assert c.output_throughput_tok_s == pytest.approx(21 / (c.e2e_latency_ms / 1e3), rel=1e-12)
    # Floors at 100 % of peak, no fixed costs: 2·(7.3728e-7 + 1.4272e-7) + 1.28e-6 = 3.04e-6 s.
    assert c.tpot_floor_ms == pytest.approx(0.00304, rel=1e-9)
    # Memory: weights 404096 + activations (100 tokens · widest layer (2·128 + 64 + 2·32 + 4·64 = 640)
    #   · 2 B = 128000, + logits 1·1000·4 B) + KV 256 B · 121 tokens = 567072 B.
    assert c.peak_memory_gib == pytest.approx(567072 / GIB, rel=1e-12)
    # Concurrency: (10 GiB − weights) // (KV per sequence 30976 + activations per sequence 132000).
    assert c.max_concurrency == (10 * GIB - 404096) // (30976 + 132000)


def _random_arch(draw: st.DrawFn) -> Architecture:
    hidden = draw(st.sampled_from([64, 128, 256]))
    layers = []
    for _ in range(draw(st.integers(1, 6))):
        kv = draw(st.sampled_from([1, 2, 4]))
        layers.append(
            LayerSpec(
                attention=draw(st.booleans()),
                num_heads=kv * draw(st.integers(1, 4)),
                num_kv_heads=kv,
                head_dim=draw(st.sampled_from([16, 32])),
                ffn=draw(st.booleans()),
                ffn_width=draw(st.integers(1, 8)) * 64,
                window=draw(
                    st.none() | st.sampled_from([16, 100, 4096])
                ),  # binding at the tests' 200-350 tokens, or not
            )
        )
    layers = [l if l.ffn else dataclasses.replace(l, ffn_width=0) for l in layers]
    return Architecture(
        vocab_size=draw(st.sampled_from([500, 32000])),
        hidden_size=hidden,
        layers=tuple(layers),
        tie_embeddings=draw(st.booleans()),
    )


architectures = st.composite(_random_arch)()
SETTINGS = dict(max_examples=25, deadline=None)


@settings(**SETTINGS)
@given(
    st.lists(architectures, min_size=1, max_size=4),
    st.sampled_from(["vllm", "trtllm", "llamacpp", "torch-eager"]),
    st.sampled_from(["h100-sxm", "rtx5070", "b200"]),
    st.sampled_from(["bf16", "fp8", "q4_k_m"]),
)
def test_scalar_numpy_and_torch_agree(archs: list[Architecture], engine: str, hardware: str, dtype: str) -> None:
    """The scalar API, the vectorised numpy batch and the torch batch give the same numbers."""
    scenario = Scenario(dtype=dtype, input_len=300, output_len=50, concurrency=1 if engine == "llamacpp" else 4)
    batch_np = estimate_batch(ArchArrays.from_architectures(archs), hardware, engine, scenario)
    batch_t = estimate_batch(ArchArrays.from_architectures(archs, backend="torch"), hardware, engine, scenario)
    for i, arch in enumerate(archs):
        scalar = estimate_cost(arch, hardware, engine, scenario).to_dict()
        for key in METRICS:
            assert batch_np[key][i] == pytest.approx(scalar[key], rel=1e-12), key
            assert float(batch_t[key][i]) == pytest.approx(scalar[key], rel=1e-9), key


@settings(**SETTINGS)
@given(architectures, st.data(), st.sampled_from(["vllm", "trtllm", "llamacpp", "torch-eager"]))
def test_cost_never_rises_when_a_width_shrinks(arch: Architecture, data: st.DataObject, engine: str) -> None:
    """At fixed concurrency, shrinking one layer's FFN or heads never raises latency or memory."""
    i = data.draw(st.integers(0, arch.num_layers - 1))
    layer = arch.layers[i]
    if layer.ffn and layer.ffn_width > 64 and data.draw(st.booleans()):
        smaller = dataclasses.replace(layer, ffn_width=layer.ffn_width - 64)
    elif layer.num_heads > layer.num_kv_heads:
        smaller = dataclasses.replace(layer, num_heads=layer.num_heads - layer.num_kv_heads)
    else:
        smaller = dataclasses.replace(layer, ffn=False, ffn_width=0)
    shrunk = dataclasses.replace(arch, layers=arch.layers[:i] + (smaller,) + arch.layers[i + 1 :])
    scenario = Scenario(dtype="bf16", input_len=200, output_len=40, concurrency=1)
    big, small = (estimate_cost(a, "rtx5080", engine, scenario).to_dict() for a in (arch, shrunk))
    for key in (
        "weights_gib",
        "kv_bytes_per_token",
        "peak_memory_gib",
        "ttft_ms",
        "tpot_ms",
        "e2e_latency_ms",
        "ttft_floor_ms",
        "tpot_floor_ms",
    ):
        assert small[key] <= big[key] * (1 + 1e-12), key
    assert small["output_throughput_tok_s"] >= big["output_throughput_tok_s"] * (1 - 1e-12)
    assert small["max_concurrency"] >= big["max_concurrency"]


def test_torch_path_is_differentiable_in_per_layer_widths() -> None:
    """Gradients of TPOT and memory w.r.t. continuous FFN widths and heads exist and are >= 0."""
    arrays = ArchArrays.from_architectures([known_architectures()["smollm2-135m"]], backend="torch")
    widths = arrays.ffn_width.clone().requires_grad_(True)
    heads = arrays.heads.clone().requires_grad_(True)
    arrays = dataclasses.replace(arrays, ffn_width=widths, heads=heads)
    out = estimate_batch(
        arrays, "h100-sxm", "vllm", Scenario(dtype="bf16", input_len=512, output_len=64, concurrency=8)
    )
    (out["tpot_ms"].sum() + out["peak_memory_gib"].sum() + out["ttft_ms"].sum()).backward()
    assert widths.grad is not None and torch.all(widths.grad >= 0) and widths.grad.abs().sum() > 0
    assert heads.grad is not None and torch.all(heads.grad >= 0) and heads.grad.abs().sum() > 0


@pytest.mark.parametrize("engine", ENGINES.names())
def test_engine_conformance(engine: str) -> None:
    """Every registered engine: all metrics finite and positive, floors below predictions,
    weights and KV consistent with the Architecture, more context never cheaper."""
    arch = known_architectures()["llama-3.1-8b"]
    concurrency = 1 if get_engine(engine).single_user else 16
    short = estimate_cost(arch, "h100-sxm", engine, Scenario("bf16", 512, 128, concurrency))
    long = estimate_cost(arch, "h100-sxm", engine, Scenario("bf16", 4096, 128, concurrency))
    for key, value in short.to_dict().items():
        assert math.isfinite(value) and value > 0, key
    assert short.weights_gib == pytest.approx(arch.num_params * 2 / GIB)
    assert short.kv_bytes_per_token == arch.kv_bytes_per_token(2)
    assert short.ttft_floor_ms <= short.ttft_ms and short.tpot_floor_ms <= short.tpot_ms
    assert (
        long.ttft_ms > short.ttft_ms and long.tpot_ms > short.tpot_ms and long.peak_memory_gib > short.peak_memory_gib
    )
    assert short.e2e_latency_ms == pytest.approx(short.ttft_ms + 127 * short.tpot_ms)


@pytest.mark.parametrize("hardware", list(HARDWARE.names()))
@pytest.mark.parametrize("dtype", WEIGHT_DTYPES.names())
def test_every_hardware_and_dtype_gives_a_cost(hardware: str, dtype: str) -> None:
    """Each catalog device prices each weight format (falling back to wider math where needed)."""
    c = estimate_cost(known_architectures()["smollm2-135m"], hardware, "vllm", Scenario(dtype, 256, 32, 2))
    assert c.tpot_ms > c.tpot_floor_ms > 0 and c.weights_gib > 0


def test_narrower_weights_are_smaller_and_faster_in_decode() -> None:
    arch = known_architectures()["llama-3.1-8b"]
    costs = {d: estimate_cost(arch, "b200", "trtllm", Scenario(d, 128, 128, 1)) for d in ("bf16", "fp8", "fp4")}
    assert costs["bf16"].weights_gib > costs["fp8"].weights_gib > costs["fp4"].weights_gib
    assert costs["bf16"].tpot_ms > costs["fp8"].tpot_ms > costs["fp4"].tpot_ms


def test_tensor_parallelism_splits_weights_and_adds_allreduce() -> None:
    arch = known_architectures()["llama-3.3-70b"]
    one = estimate_cost(arch, "h100-sxm", "trtllm", Scenario("fp8", 1000, 100, 1, tp=1))
    two = estimate_cost(arch, "h100-sxm", "trtllm", Scenario("fp8", 1000, 100, 1, tp=2))
    assert two.peak_memory_gib < one.peak_memory_gib
    assert one.tpot_ms / 2 < two.tpot_ms < one.tpot_ms  # all-reduce keeps it above a perfect split


def test_max_concurrency_is_memory_bound_and_used_by_max() -> None:
    """'max' serves as many sequences as the KV pool holds; longer sequences hold fewer."""
    arch = known_architectures()["llama-3.1-8b"]
    short = estimate_cost(arch, "h100-sxm", "trtllm", Scenario("fp8", 1000, 1000, "max"))
    long = estimate_cost(arch, "h100-sxm", "trtllm", Scenario("fp8", 8000, 8000, "max"))
    assert 1 <= long.max_concurrency < short.max_concurrency
    # the pool: 0.9·(80 GiB − weights − activations − fixed) / (KV/token · 2000 tokens) — in range
    assert short.max_concurrency * 2000 * short.kv_bytes_per_token <= 0.9 * 80 * GIB


def test_llamacpp_preallocates_the_whole_context() -> None:
    arch = known_architectures()["llama-3.1-8b"]
    engine = get_engine("llamacpp").with_options(context_tokens=131072)
    small = estimate_cost(arch, "rtx5090", "llamacpp", Scenario("q4_k_m", 512, 64, 1))
    full = estimate_cost(arch, "rtx5090", engine, Scenario("q4_k_m", 512, 64, 1))
    assert full.peak_memory_gib - small.peak_memory_gib == pytest.approx(
        (131072 - 768) * full.kv_bytes_per_token / GIB, rel=1e-9
    )  # 576 tokens round up to 768 (256-token blocks)
    # 128K tokens · 128 KiB of bf16 KV = 16 GiB, plus ~4.6 GiB of Q4_K_M weights: fits a 32 GiB card
    assert full.peak_memory_gib > 16 + small.weights_gib and full.max_concurrency == 1
    too_long = get_engine("llamacpp").with_options(context_tokens=4 * 131072)
    assert estimate_cost(arch, "rtx5090", too_long, Scenario("q4_k_m", 512, 64, 1)).max_concurrency == 0


# The published measurements (floors, fit, intervals) are checked in test_measurements.py.


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(hardware="h1000"), "unknown hardware 'h1000'"),
        (dict(engine="vlm"), "did you mean 'vllm'"),
    ],
)
def test_unknown_names_list_the_valid_ones(kwargs: dict, needle: str) -> None:
    args = dict(hardware="h100-sxm", engine="vllm", scenario=Scenario("bf16", 10, 10, 1)) | kwargs
    with pytest.raises(UnknownNameError) as info:
        estimate_cost(GOLD_ARCH, args["hardware"], args["engine"], args["scenario"])
    assert needle in str(info.value) and "available:" in str(info.value)


def test_bad_scenarios_name_the_value() -> None:
    with pytest.raises(
        UnknownNameError,
        match="int3.*available: bf16, fp16, fp32, fp4, fp8, iq4_xs, mxfp4, q4_0, q4_k_m, q5_k_m, q6_k, q8_0",
    ):
        Scenario(dtype="int3")
    with pytest.raises(ConfigError, match="input_len must be a positive int, got -5"):
        Scenario(input_len=-5)
    with pytest.raises(ConfigError, match="concurrency must be a positive int or 'max', got 'lots'"):
        Scenario(concurrency="lots")
    with pytest.raises(ConfigError, match="single user"):
        estimate_cost(GOLD_ARCH, "rtx5090", "llamacpp", Scenario("bf16", 10, 10, 4))
    with pytest.raises(ConfigError, match="no option 'gpu_mem'"):
        get_engine("vllm").with_options(gpu_mem=0.5)


def test_without_floors_every_other_metric_is_the_same_bit_for_bit() -> None:
    """``floors=False`` (what a constraint check reads) drops only the two roofline floors; every
    other metric is exactly what the full call gives, on numpy and torch; bounds need the floors."""
    for backend in ("numpy", "torch"):
        arrays = ArchArrays.from_architectures([GOLD_ARCH, dataclasses.replace(GOLD_ARCH, hidden_size=32)], backend)
        full = estimate_batch(arrays, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE)
        lean = estimate_batch(arrays, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE, floors=False)
        assert set(full) - set(lean) == {"ttft_floor_ms", "tpot_floor_ms"}
        for k, v in lean.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(full[k])), k
    with pytest.raises(ConfigError, match="bounds=True needs the floors"):
        estimate_batch(arrays, GOLD_HW, GOLD_ENGINE, GOLD_SCENARIO, GOLD_PROFILE, bounds=True, floors=False)
