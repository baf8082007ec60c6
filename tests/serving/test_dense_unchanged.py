"""Dense costs are bit-identical to the code before MoE and Mamba-2 layers were costed (issue 30): the
new per-layer columns of ArchArrays are zero for dense layers and add exactly nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dense_cost_golden import CASES, GOLDEN, architectures, compute

from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.serving.costmodel import ArchArrays, estimate_batch


def test_golden_covers_every_case() -> None:
    assert len(json.loads(GOLDEN.read_text())["cases"]) == len(CASES)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_dense_costs_equal_the_pre_moe_golden_exactly(index: int) -> None:
    golden = json.loads(GOLDEN.read_text())["cases"][index]
    now = compute()["cases"][index]
    assert now["scenario"] == golden["scenario"]
    assert set(now["metrics"]) - set(golden["metrics"]) == {"active_params"}  # the one new metric
    # A dense model's active parameters are all of them (Gemma's post-norms, D per dense sub-block,
    # are not counted by the cost model: ArchArrays' doc).
    post_norms = [a.hidden_size * sum(layer.attention + layer.ffn for layer in a.layers) for a in architectures()]
    expected = [a.num_params - (a.family == "gemma3_text") * extra for a, extra in zip(architectures(), post_norms)]
    assert now["metrics"]["active_params"] == [float(x) for x in expected]
    for metric, values in golden["metrics"].items():
        np.testing.assert_array_equal(now["metrics"][metric], values, err_msg=metric)  # exact, inf included
    for single_now, single_golden in zip(now["single"], golden["single"], strict=True):
        for metric, value in single_golden.items():  # estimate_cost may report more metrics now
            assert single_now[metric] == value, metric


@pytest.mark.parametrize("index", range(len(CASES)))
def test_a_dense_batch_costs_the_same_on_the_fast_path_as_beside_a_moe_model(index: int) -> None:
    """A numpy batch without MoE or Mamba-2 layers skips their zero terms (roofline._dense_structure,
    the inner search's case); packed beside a MoE model the same rows take the full path: equal bit
    for bit."""
    hardware, engine, scenario = CASES[index]
    dense = architectures()
    alone = estimate_batch(ArchArrays.from_architectures(dense), hardware, engine, scenario, bounds=True)
    mixed_archs = dense + [known_architectures()["qwen3-30b-a3b"]]
    mixed = estimate_batch(ArchArrays.from_architectures(mixed_archs), hardware, engine, scenario, bounds=True)
    n = len(dense)
    for metric, values in alone.items():
        np.testing.assert_array_equal(np.asarray(values).reshape(-1), np.asarray(mixed[metric]).reshape(-1)[:n], metric)
