"""The cost model's metrics from sums over layers: ``estimate_batch`` is ``estimate_from_sums`` of the
summed per-layer terms, and a stack with one layer swapped per row (``LayerSums.one_layer_changed``)
gives the metrics of those architectures up to the rounding of the sums."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.serving.costmodel import (
    ArchArrays,
    LayerSums,
    Scenario,
    estimate_batch,
    estimate_from_sums,
    layer_terms,
    max_concurrency_from_sums,
)
from autocompress_opt.serving.roofline import _Ops


def _stack(depth: int = 12) -> Architecture:
    """FFN widths 512/768/1024, GQA of 2 or 4 KV groups, every third layer sliding (window 96)."""
    layers = [
        LayerSpec(True, 8, 2 if i % 2 else 4, 32, True, (512, 768, 1024)[i % 3], 96 if i % 3 == 2 else None)
        for i in range(depth)
    ]
    return Architecture(family="llama", vocab_size=512, hidden_size=256, layers=tuple(layers), qkv_bias=True)


def _changes(arch: Architecture, rng: np.random.Generator, n: int) -> tuple[np.ndarray, list[Architecture]]:
    """``n`` one-layer shrinks of ``arch``: a layer's FFN narrowed or dropped, or its KV groups halved."""
    where, archs = rng.integers(0, arch.num_layers, n), []
    for i in where.tolist():
        spec, kind = arch.layers[i], rng.integers(0, 4)
        if kind == 0:
            new = replace(spec, ffn_width=int(spec.ffn_width - 256))
        elif kind == 1:
            new = replace(spec, ffn=False, ffn_width=0)
        elif kind == 2:
            new = replace(spec, num_kv_heads=spec.num_kv_heads // 2, num_heads=spec.num_heads // 2)
        else:
            new = replace(spec, attention=False)
        archs.append(replace(arch, layers=arch.layers[:i] + (new,) + arch.layers[i + 1 :]))
    return where, archs


SCENARIOS = [
    ("h100-sxm", "vllm", Scenario(concurrency="max", tp=2)),
    ("h100-sxm", "vllm", Scenario(concurrency=8, arrival="steady")),
    ("h100-sxm", "vllm", Scenario(concurrency=4, requests=10)),
    ("rtx5070", "llamacpp", Scenario(input_len=2048, output_len=64)),
    ("h100-sxm", "vllm", Scenario(concurrency="max", arrival="poisson", rate=50.0)),
]


@pytest.mark.parametrize(("hardware", "engine", "scenario"), SCENARIOS)
def test_estimate_batch_is_estimate_from_sums_of_the_summed_terms(
    hardware: str, engine: str, scenario: Scenario
) -> None:
    arrays = ArchArrays.from_architectures(_changes(_stack(), np.random.default_rng(0), 6)[1])
    sums = LayerSums.of(layer_terms(arrays, engine, scenario), _Ops(arrays.hidden))
    direct = estimate_batch(arrays, hardware, engine, scenario)
    via = estimate_from_sums(arrays, sums, hardware, engine, scenario)
    for k, v in direct.items():
        np.testing.assert_array_equal(via[k], v, err_msg=k)
    np.testing.assert_array_equal(
        max_concurrency_from_sums(arrays, sums, hardware, engine, scenario), direct["max_concurrency"]
    )


@pytest.mark.parametrize(("hardware", "engine", "scenario"), SCENARIOS)
def test_one_layer_changed_gives_each_rows_metrics_up_to_rounding(
    hardware: str, engine: str, scenario: Scenario
) -> None:
    """Every metric of 40 one-layer shrinks of a 12-layer stack, from the stack's sums with one
    layer's terms swapped, within 1e-12 of the metrics of the shrunk architectures themselves
    (max_concurrency, a floor, exactly)."""
    stack = _stack()
    where, archs = _changes(stack, np.random.default_rng(1), 40)
    exact = estimate_batch(ArchArrays.from_architectures(archs), hardware, engine, scenario)
    base = ArchArrays.from_architectures([stack])
    columns = ArchArrays.from_architectures(archs)
    # each row's changed layer alone: a batch of one-layer architectures
    one = ArchArrays(
        **{k: getattr(columns, k) for k in ("vocab", "hidden", "tied", "qkv_bias", "o_bias", "mlp_bias", "qk_norm")},
        **{
            k: getattr(columns, k)[np.arange(len(archs)), where][:, None]
            for k in ("attn", "heads", "kv_heads", "head_dim", "ffn", "ffn_width", "window")
        },
    )
    sums = LayerSums.one_layer_changed(layer_terms(base, engine, scenario), where, layer_terms(one, engine, scenario))
    delta = estimate_from_sums(one, sums, hardware, engine, scenario)
    assert set(delta) == set(exact)
    np.testing.assert_array_equal(delta["max_concurrency"], exact["max_concurrency"])
    for k, v in exact.items():
        np.testing.assert_allclose(delta[k], v, rtol=1e-12, atol=0, err_msg=k)
    # the shrinks change the metrics: the test can tell a right sum from the stack's own
    stack_metrics = estimate_batch(base, hardware, engine, scenario)
    assert np.any(exact["weights_gib"] != stack_metrics["weights_gib"][0])
