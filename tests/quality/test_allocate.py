"""Per-layer plans from the quality estimate's layer profile (autocompress_opt/quality/allocate.py) and
the estimate's per-layer term (estimate.py, **Layers**)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.hybrid import per_layer_moe
from autocompress_opt.arch.search_space import default_space
from autocompress_opt.quality.allocate import allocate_cuts, per_layer_moe_plan, snap_to_grid
from autocompress_opt.quality.estimate import LayerProfile, QualityEstimate, load_estimate
from autocompress_opt.search.study.trials import plan_trial
from autocompress_opt.serving.targets import Target


def test_cuts_keep_their_mean_and_spare_the_sensitive_layers() -> None:
    weights = [4.0, 1.0, 1.0, 0.25]
    cuts = allocate_cuts(weights, 0.4, 2.0, 0.9)
    assert math.isclose(sum(cuts) / 4, 0.4, rel_tol=1e-6)
    assert cuts[0] < cuts[1] < cuts[3] <= 0.9 and cuts[1] == pytest.approx(cuts[2])
    assert cuts[1] == pytest.approx(4 * cuts[0], rel=1e-4)  # p = 2: cut ∝ 1 / weight
    flat = allocate_cuts([1.0] * 3, 0.3, 1.5, 1.0)
    assert flat == pytest.approx([0.3] * 3)
    concave = allocate_cuts(weights, 0.4, 0.75, 0.9)  # p <= 1: least sensitive first, fully
    assert concave == pytest.approx([0.0, 0.7, 0.0, 0.9]) or concave == pytest.approx([0.0, 0.0, 0.7, 0.9])
    assert allocate_cuts(weights, 0.0, 2.0, 0.9) == [0.0] * 4
    steep = allocate_cuts([4.0, 64.0], 0.5, [2.0, 6.0], 1.0)  # equally hurt at a cut of 0.5, one grows faster
    assert sum(steep) / 2 == pytest.approx(0.5, rel=1e-6) and steep[1] < 0.5 < steep[0]
    assert allocate_cuts([1.0, 1.0], 2.0, 2.0, 0.5) == pytest.approx([0.5, 0.5])  # clipped to max_cut


def test_snapped_sizes_lie_on_the_grid_within_the_budget() -> None:
    grid = [256, 512, 768, 1024]
    sizes = snap_to_grid([1000.0, 300.0, 700.0], [grid] * 3, [1.0] * 3, budget=1800)
    assert all(s in grid for s in sizes) and sum(sizes) <= 1800
    assert sizes[0] >= sizes[2] >= sizes[1]
    weighted = snap_to_grid([8.0, 8.0], [[1, 2, 4, 8]] * 2, [3.0, 1.0], budget=20)
    assert 3 * weighted[0] + weighted[1] <= 20
    assert snap_to_grid([10.0], [[4, 8]], [1.0], budget=1) == [4]  # nothing smaller: the grid's least


def test_a_uniform_cut_costs_the_pooled_term_and_a_per_layer_one_is_priced_by_each_layers_curve() -> None:
    parent = load_architecture("smollm2-135m")
    shipped = load_estimate()
    assert set(shipped.profiles) == {"ffn", "mixer"}
    pooled = QualityEstimate(shipped.coefficients, shipped.fitted_on, shipped.borrowed)
    uniform = replace(parent, layers=tuple(replace(l, ffn_width=768) for l in parent.layers))
    assert shipped.kl(uniform, parent) == pytest.approx(pooled.kl(uniform, parent), rel=1e-9)
    curves = shipped.profiles["ffn"].curves([(i + 0.5) / 30 for i in range(30)], shipped.curve("ffn_width")[1])
    harm = [k * (1 / 3) ** p for k, p in curves]  # each layer's curve at the cut below (1536 -> 512 channels)
    order = sorted(range(30), key=lambda i: harm[i])
    low, high = set(order[:10]), set(order[-10:])

    def cut(layers: set[int]) -> Architecture:
        return replace(
            parent, layers=tuple(replace(l, ffn_width=512) if i in layers else l for i, l in enumerate(parent.layers))
        )

    # the same cut in the layers the profile finds least hurt costs less than in the most hurt; the
    # pooled estimate cannot tell them apart
    assert shipped.kl(cut(low), parent) < shipped.kl(cut(high), parent)
    assert pooled.kl(cut(low), parent) == pytest.approx(pooled.kl(cut(high), parent))
    again = QualityEstimate.from_dict(shipped.to_dict())
    assert again.profiles == shipped.profiles
    with pytest.raises(ValueError, match="positive finite"):
        LayerProfile((1.0, 0.0))
    with pytest.raises(ValueError, match="one positive exponent per value"):
        LayerProfile((1.0, 2.0), exponents=(2.0,))
    with pytest.raises(ValueError, match="unknown layer profiles"):
        QualityEstimate.from_dict({**shipped.to_dict(), "layer_profiles": {"moe": {"values": [1.0]}}})


def _request(parent: Architecture, serve_as: str, stand_in: str) -> dict:
    space = default_space(parent)
    point = {n: space[n].values[len(space[n].values) // 2] for n in space.names}
    point["num_layers"] = space["num_layers"].values[-1]
    return {
        "params": point,
        "parent": parent.to_dict(),
        "space": space.to_dict(),
        "target": Target("b200", "local-coding").to_dict(),
        "serve_as": serve_as,
        "plan_quality": stand_in,
    }


def test_plan_mode_per_layer_gives_each_moe_layer_its_own_sizes_within_the_uniform_plans_totals() -> None:
    parent = load_architecture("nemotron-3-super-120b-a12b")
    uniform = plan_trial(_request(parent, "any", "estimate"))
    per_layer = plan_trial(_request(parent, "any", "estimate-per-layer"))
    a, b = Architecture.from_dict(uniform["architecture"]), Architecture.from_dict(per_layer["architecture"])
    assert per_layer["quality_kind"] == "estimated_kl" and per_layer["quality"] > uniform["quality"]
    assert per_layer_moe(b) and not per_layer_moe(a)
    assert len({l.moe.expert_width for l in b.layers if l.moe}) > 1
    assert len({l.moe.experts_per_token for l in b.layers if l.moe}) > 1
    assert b.num_params <= a.num_params and b.active_params() <= a.active_params()
    assert [l.mamba for l in b.layers] == [l.mamba for l in a.layers]  # only the Puzzle form's axes move
    # vLLM does not read this package's per-layer export: the plan stays uniform and ranks as estimate
    by_vllm = plan_trial(_request(parent, "vllm", "estimate-per-layer"))
    assert by_vllm["architecture"] == plan_trial(_request(parent, "vllm", "estimate"))["architecture"]


def test_a_plan_the_estimate_cannot_improve_is_returned_as_it_is() -> None:
    parent = load_architecture("nemotron-3-super-120b-a12b")
    shipped = load_estimate()
    flat = QualityEstimate(shipped.coefficients)  # no profile: nothing to allot by
    assert per_layer_moe_plan(parent, parent, flat, (1024, 2688), (4, 22)) is parent
    assert per_layer_moe_plan(parent, parent, shipped, (1024, 2688), (4, 22)) is parent  # uncut: nothing to move


@pytest.mark.parametrize("serve_as", ["any", "vllm"])
def test_plan_mode_per_layer_gives_a_dense_parents_ffns_their_own_widths_the_engine_loads(serve_as: str) -> None:
    """A dense parent's FFN widths allotted per layer (the DeciLM form): at equal parameters and cost the
    estimate prefers them; under vLLM's DeciLM reader every width is a multiple of 256."""
    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.search.study.trials import engine_loads

    parent, space = load_architecture("smollm2-135m"), load_search_space("smollm2-135m")
    point = {"num_layers": 24, "hidden_size": 576, "ffn_width": 768, "num_kv_heads": 3, "q_per_kv": 3}
    request = {
        "params": point,
        "parent": parent.to_dict(),
        "space": space.to_dict(),
        "target": Target("h100-sxm", "datacenter").to_dict(),
        "serve_as": serve_as,
    }
    uniform = plan_trial({**request, "plan_quality": "estimate"})
    per_layer = plan_trial({**request, "plan_quality": "estimate-per-layer"})
    a, b = Architecture.from_dict(uniform["architecture"]), Architecture.from_dict(per_layer["architecture"])
    widths = [layer.ffn_width for layer in b.layers if layer.ffn]
    assert len(set(widths)) > 1 and per_layer["quality"] > uniform["quality"]
    assert b.num_params <= a.num_params and b.num_active_layers == a.num_active_layers
    assert per_layer["metrics"]["tpot_ms"] == pytest.approx(uniform["metrics"]["tpot_ms"], rel=1e-3)
    assert engine_loads(parent, serve_as)(b)
    if serve_as == "vllm":
        assert all(w % 256 == 0 for w in widths)
