"""Sliding-window attention: the cost model's windowed KV cache, prefill pairs and decode reads, and
every place that builds a child architecture keeping its parent layers' windows."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
import torch
from golden_cost import GOLD_ARCH, GOLD_ENGINE, GOLD_HW, GOLD_PROFILE

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.costmodel import METRICS, ArchArrays, Scenario, estimate_batch, estimate_cost
from autocompress_opt.serving.engine_models import ENGINES, get_engine
from autocompress_opt.serving.hardware import Hardware

GEMMA3_270M_WINDOWS = ([512] * 5 + [None]) * 3

# GOLD_ARCH (2 layers, hidden 64, 4 query / 2 KV heads of 16, FFN 128, vocab 1000, untied) with its
# second layer sliding over 4 tokens.
WINDOWED = replace(GOLD_ARCH, layers=(GOLD_ARCH.layers[0], replace(GOLD_ARCH.layers[1], window=4)))
# GOLD_HW with a memory bandwidth so high that every roofline is compute-bound: times show FLOPs alone.
COMPUTE_BOUND_HW = replace(GOLD_HW, name="compute-bound", bandwidth_gb_s=1e9)


def cost(arch: Architecture, scenario: Scenario, hardware: Hardware = GOLD_HW) -> dict[str, float]:
    return estimate_cost(arch, hardware, GOLD_ENGINE, scenario, GOLD_PROFILE).to_dict()


# ------------------------------------------------------------------------------ cost model
def test_prefill_attends_the_windowed_number_of_pairs() -> None:
    """Prompt of 10 tokens: the full layer attends Σ t = 10·11/2 = 55 pairs, the 4-token window
    Σ min(t, 4) = 1+2+3+4 + 6·4 = 34. Compute-bound at 5e12 FLOP/s (10 TFLOP/s · mfu 0.5):
    GEMMs 2 layers · 2·10·36864 FLOPs, attention 4·(55 + 34)·(4 heads·16), LM head 2·64000 (last
    token), fixed 4 kernels · 1 µs + 10 µs per step."""
    scenario = Scenario(dtype="bf16", input_len=10, output_len=2, concurrency=1)
    gemm, head, fixed = 2 * 2 * 10 * 36864 / 5e12, 2 * 64000 / 5e12, 4e-6 + 1e-5
    windowed = cost(WINDOWED, scenario, COMPUTE_BOUND_HW)["ttft_ms"]
    assert windowed == pytest.approx(1e3 * (gemm + 4 * (55 + 34) * 64 / 5e12 + head + fixed), rel=1e-9)
    full = cost(GOLD_ARCH, scenario, COMPUTE_BOUND_HW)["ttft_ms"]
    assert full == pytest.approx(1e3 * (gemm + 4 * (55 + 55) * 64 / 5e12 + head + fixed), rel=1e-9)


def test_kv_cache_and_decode_reads_stop_at_the_window() -> None:
    """10 + 2 tokens: S = 12 reserved KV tokens per sequence (1-token blocks); each layer caches
    K and V of 2 heads · 16 channels in bf16 = 128 B per token: 12 tokens in the full layer, 4 in
    the sliding one → 2048 B, i.e. 2048/12 B per reserved token. Decode at the mean context
    10 + 2/2 = 11 is memory-bound at 5e10 B/s: the sliding layer reads 4 cached + 1 new token's K,V
    (2·2·5·32 B) instead of 12 (2·2·12·32 B), 896 B less."""
    scenario = Scenario(dtype="bf16", input_len=10, output_len=2, concurrency=1)
    full, windowed = cost(GOLD_ARCH, scenario), cost(WINDOWED, scenario)
    assert full["kv_bytes_per_token"] == 256 == GOLD_ARCH.kv_bytes_per_token(2)
    assert windowed["kv_bytes_per_token"] == pytest.approx((12 + 4) * 128 / 12, rel=1e-12)
    assert windowed["kv_bytes_per_token"] * 12 == pytest.approx(WINDOWED.kv_bytes(12), rel=1e-12)
    assert full["peak_memory_gib"] - windowed["peak_memory_gib"] == pytest.approx(128 * (12 - 4) / 2**30, rel=1e-9)
    assert full["tpot_ms"] - windowed["tpot_ms"] == pytest.approx(
        1e3 * (2 * 2 * 12 * 32 - 2 * 2 * 5 * 32) / 5e10, rel=1e-9
    )


@pytest.mark.parametrize("engine", ENGINES.names())
def test_windows_longer_than_the_context_change_nothing(engine: str) -> None:
    """A window as long as the request (or longer) is full attention: every metric equal, in the
    numpy batch and the torch batch."""
    arch = load_architecture("llama-3.2-1b")
    scenario = Scenario("bf16", 700, 100, 1 if get_engine(engine).single_user else 4)
    context = get_engine(engine).kv_tokens_per_sequence(700, 100)
    for window in (800, context, 10**7):
        windowed = replace(arch, layers=tuple(replace(layer, window=window) for layer in arch.layers))
        for backend in ("numpy", "torch"):
            a, b = (
                estimate_batch(ArchArrays.from_architectures([x], backend=backend), "h100-sxm", engine, scenario)
                for x in (arch, windowed)
            )
            for key in METRICS:
                assert float(a[key][0]) == pytest.approx(float(b[key][0]), rel=1e-12), (key, window, backend)


def test_scalar_numpy_and_torch_agree_with_windows() -> None:
    """Gemma 3 270M (windows 512 and full) beside a full-attention model, at 32K tokens."""
    archs = [load_architecture("gemma3-270m"), load_architecture("smollm2-135m")]
    scenario = Scenario("bf16", 32768, 512, 1)
    batch_np = estimate_batch(ArchArrays.from_architectures(archs), "rtx5080", "llamacpp", scenario)
    batch_t = estimate_batch(ArchArrays.from_architectures(archs, backend="torch"), "rtx5080", "llamacpp", scenario)
    for i, arch in enumerate(archs):
        scalar = estimate_cost(arch, "rtx5080", "llamacpp", scenario).to_dict()
        for key in METRICS:
            assert batch_np[key][i] == pytest.approx(scalar[key], rel=1e-12), key
            assert float(batch_t[key][i]) == pytest.approx(scalar[key], rel=1e-9), key


def test_gemma3_long_context_costs_follow_its_windows() -> None:
    """At 32K tokens Gemma 3 270M caches the whole context in 3 layers and 512 tokens in 15: its KV
    per sequence is that of the 3 full layers plus 15 windows (llama.cpp: 33,280 reserved tokens,
    1 KV head · 256 · K,V · 2 B = 1024 B per token and layer), far below all 18 layers at full length."""
    arch = load_architecture("gemma3-270m")
    full = replace(arch, layers=tuple(replace(layer, window=None) for layer in arch.layers))
    scenario = Scenario("bf16", 32768, 512, 1)
    sliding, dense = (estimate_cost(a, "rtx5080", "llamacpp", scenario) for a in (arch, full))
    assert dense.kv_bytes_per_token == 18 * 1024
    assert sliding.kv_bytes_per_token == pytest.approx((3 * 33280 + 15 * 512) * 1024 / 33280, rel=1e-12)
    assert dense.peak_memory_gib - sliding.peak_memory_gib == pytest.approx(15 * (33280 - 512) * 1024 / 2**30, rel=1e-9)
    assert sliding.ttft_ms < dense.ttft_ms and sliding.tpot_ms < dense.tpot_ms


def test_torch_path_stays_differentiable_with_windows() -> None:
    """Gradients of latency and memory w.r.t. FFN widths, heads and KV heads are finite and >= 0 for a
    windowed model at a context far past its window."""
    arrays = ArchArrays.from_architectures([load_architecture("gemma3-270m")], backend="torch")
    widths, heads, kv = (t.clone().requires_grad_(True) for t in (arrays.ffn_width, arrays.heads, arrays.kv_heads))
    arrays = dataclasses.replace(arrays, ffn_width=widths, heads=heads, kv_heads=kv)
    out = estimate_batch(arrays, "rtx5080", "llamacpp", Scenario("bf16", 32768, 512, 1))
    (out["tpot_ms"].sum() + out["peak_memory_gib"].sum() + out["ttft_ms"].sum()).backward()
    for grad in (widths.grad, heads.grad, kv.grad):
        assert grad is not None and torch.isfinite(grad).all() and (grad >= 0).all() and grad.abs().sum() > 0
    # A sliding layer's KV heads cost less than a full layer's at this length.
    assert float(kv.grad[0, 0]) < float(kv.grad[0, 5])


def test_arch_arrays_without_windows_mean_full_attention() -> None:
    """ArchArrays built by hand without a window array (older callers) price every layer as full."""
    scenario = Scenario("bf16", 2048, 128, 1)
    packed = ArchArrays.from_architectures([GOLD_ARCH])
    assert np.all(packed.window >= 2**40)
    bare = dataclasses.replace(packed, window=None)
    a, b = (estimate_batch(x, "h100-sxm", "vllm", scenario) for x in (packed, bare))
    assert all(float(a[k][0]) == float(b[k][0]) for k in METRICS)


# ------------------------------------------------------------------- child architectures
def test_inner_search_cost_arrays_carry_the_parents_windows() -> None:
    """cost_arrays (the inner loop's differentiable cost) prices a discrete point exactly as
    estimate_cost prices its architecture, windows included, a dropped attention too."""
    from autocompress_opt.search.inner.budget import cost_arrays, expected_of
    from autocompress_opt.serving.targets import Target

    parent = load_architecture("gemma3-270m")
    layers = list(parent.layers)
    layers[0] = LayerSpec(attention=False, ffn=True, ffn_width=1024)
    layers[5] = replace(layers[5], ffn_width=512)
    arch = replace(parent, hidden_size=512, layers=tuple(layers))
    target = Target("rtx5080", "local-coding")
    exact = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
    relaxed = estimate_batch(
        cost_arrays(parent, 512, expected_of(arch)), target.hardware, target.engine_obj(), target.scenario()
    )
    for key in METRICS:
        assert float(relaxed[key][0]) == pytest.approx(exact[key], rel=1e-12), key


def test_search_space_and_uniform_allocation_keep_each_layers_window() -> None:
    """A plan-mode point keeps parent layer i's window for every kept layer i."""
    from autocompress_opt.arch.search_space import default_space, uniform_allocation

    parent = load_architecture("gemma3-270m")
    params = {"num_layers": 12, "hidden_size": 512, "ffn_width": 1024, "num_kv_heads": 1, "q_per_kv": 2}
    order = list(range(17, -1, -1))  # the deepest 12 layers are "most important"
    for arch in (default_space(parent).architecture(params, parent), uniform_allocation(params, parent, order)):
        assert [s.window for s in arch.layers] == [
            p.window if s.attention else None for s, p in zip(arch.layers, parent.layers)
        ]
    kept = [i for i, s in enumerate(arch.layers) if not s.is_noop]
    assert kept == list(range(6, 18)) and [arch.layers[i].window for i in (11, 17)] == [None, None]


def test_uniform_baseline_lists_the_windows_of_the_layers_it_most_likely_keeps() -> None:
    """Gemma 3 270M is uniform despite its windows; an n-layer baseline takes the windows of parent
    layers 0..n-2 and 17 (the search space's default drop order)."""
    from autocompress_opt.prune.baselines import uniform_baseline

    parent = load_architecture("gemma3-270m")
    target = uniform_baseline(parent, 0.9)
    n = target.num_layers
    assert target.is_uniform and n < 18
    assert [s.window for s in target.layers] == GEMMA3_270M_WINDOWS[: n - 1] + [None]
    assert target.num_params == replace(target, layers=tuple(replace(s, window=None) for s in target.layers)).num_params


def test_plan_pruning_gives_kept_layers_their_parent_windows() -> None:
    """A tiny Gemma 3 (sliding, full, sliding over 4 tokens) cut to 2 layers: whatever windows the
    target lists, each kept layer computes and reports its parent layer's; the built model agrees."""
    from tiny_families import tiny_model, tokens

    from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize

    model = tiny_model("gemma3_text")
    parent = adapter_for(model).architecture(model)
    assert [s.window for s in parent.layers] == [4, None, 4]
    importance = estimate_importance(model, tokens(2, 10, seed=1), model_id="gemma-windows", progress=False)
    for listed in (None, 4, 99):
        target = replace(parent, layers=tuple(replace(parent.layers[1], window=listed, ffn_width=24) for _ in range(2)))
        plan = plan_pruning(parent, importance, target)
        assert [s.window for s in plan.architecture.layers] == [
            parent.layers[lp.parent_index].window for lp in plan.layers
        ]
    child = materialize(model, plan)
    assert architecture_mismatch(plan.architecture, adapter_for(child).architecture(child)) is None


def test_hetero_config_maps_windows_both_ways() -> None:
    """AutocompressDeciLMConfig stores a layer's window as its block's window_length and reads it back;
    it refuses two window sizes, a conflicting sliding_window and a layer_types argument."""
    from tiny_families import hetero_arch

    from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig

    arch = hetero_arch("gemma3_text")
    assert [s.window for s in arch.layers] == [None, 4, None, None]
    config = AutocompressDeciLMConfig.from_architecture(arch, max_position_embeddings=64)
    assert [b["attention"]["window_length"] for b in config.block_configs] == [None, 4, None, None]
    assert config.layer_types == ["mlp", "sliding_attention", "mlp", "full_attention"] and config.sliding_window == 4
    assert config.architecture() == replace(arch, max_context=64)
    assert AutocompressDeciLMConfig.from_architecture(hetero_arch("llama"), sliding_window=4).sliding_window is None
    two = replace(arch, layers=(*arch.layers[:3], replace(arch.layers[3], window=8)))
    with pytest.raises(ConfigError, match=r"windows \[4, 8\].*one sliding-window size per model"):
        AutocompressDeciLMConfig.from_architecture(two)
    with pytest.raises(ConfigError, match="sliding_window=16"):
        AutocompressDeciLMConfig.from_architecture(arch, sliding_window=16)
    with pytest.raises(ConfigError, match="pass no layer_types"):
        AutocompressDeciLMConfig.from_architecture(arch, layer_types=["full_attention"] * 4)


def test_parent_masks_architecture_keeps_windows() -> None:
    """The inner search's discrete architectures (ParentMasks.architecture) keep each kept attention's window."""
    from tiny_families import tiny_model, tokens

    from autocompress_opt.hf.adapters import adapter_for
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.search.inner.relaxation import ParentMasks

    model = tiny_model("gemma3_text")
    parent = adapter_for(model).architecture(model)
    importance = estimate_importance(model, tokens(2, 10, seed=1), model_id="gemma-masks", progress=False)
    masks = ParentMasks(parent, importance)
    arch = masks.architecture(masks.discrete())
    assert [s.window for s in arch.layers] == [
        p.window if s.attention else None for s, p in zip(arch.layers, parent.layers)
    ]
    dropped = [replace(d, attention=False) for d in masks.discrete()]
    assert all(s.window is None for s in masks.architecture(dropped).layers)
