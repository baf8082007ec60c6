"""The per-axis quality estimate plan mode can rank by: its cuts, its fit, the shipped fit, its use."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.hybrid import hybrid_child
from autocompress_opt.arch.search_space import uniform_allocation
from autocompress_opt.quality.estimate import AXES, QualityEstimate, axis_cuts, fit_estimate, load_estimate, nnls

FULL = {"num_layers": 30, "hidden_size": 576, "ffn_width": 1536, "num_kv_heads": 3, "q_per_kv": 3}  # SmolLM2-135M


def uniform_child(parent, **point):  # SmolLM2-135M's uniform child at ``point`` (the rest at the parent's)
    return uniform_allocation({**FULL, **point}, parent)


def test_a_dense_childs_cuts_are_the_fractions_it_removes_along_each_axis() -> None:
    parent = load_architecture("smollm2-135m")  # 30 layers, hidden 576, FFN 1536, 3 KV x 3 query heads
    assert axis_cuts(parent, parent) == dict.fromkeys(AXES, 0.0)
    child = uniform_child(parent, num_layers=24, hidden_size=448, ffn_width=1024, num_kv_heads=1, q_per_kv=3)
    cuts = axis_cuts(child, parent)
    assert cuts["depth"] == pytest.approx(6 / 30)  # six layers: 12 of 60 sub-blocks
    assert cuts["hidden"] == pytest.approx(1 - 448 / 576)
    assert cuts["ffn_width"] == pytest.approx(1 - 1024 / 1536)
    assert cuts["kv_heads"] == pytest.approx(2 / 3) and cuts["q_per_kv"] == 0  # whole groups cut
    assert axis_cuts(uniform_child(parent, q_per_kv=2), parent)["q_per_kv"] == pytest.approx(1 / 3)
    assert all(cuts[a] == 0 for a in ("experts", "expert_width", "experts_per_token", "mamba_heads"))
    with pytest.raises(ValueError, match="one layer of the architecture per parent layer"):
        axis_cuts(replace(parent, layers=parent.layers[:5]), parent)


def test_a_hybrid_childs_cuts_price_experts_width_top_k_and_mamba_heads_apart() -> None:
    parent = load_architecture("nemotron-3-super-120b-a12b")
    moe = next(layer.moe for layer in parent.layers if layer.moe is not None)
    mamba = next(layer.mamba for layer in parent.layers if layer.mamba is not None)
    point = {
        "num_experts": moe.num_experts * 3 // 4,
        "experts_per_token": moe.experts_per_token // 2,
        "expert_width": moe.expert_width // 2,
        "mamba_heads": mamba.num_heads // 2,
    }
    kept = [i for i, layer in enumerate(parent.layers) if not layer.is_noop]
    cuts = axis_cuts(hybrid_child(parent, kept_layers=kept, point=point), parent)
    assert cuts["depth"] == 0 and cuts["hidden"] == 0
    assert cuts["experts"] == pytest.approx(0.25) and cuts["experts_per_token"] == pytest.approx(0.5)
    assert cuts["expert_width"] == pytest.approx(0.5) and cuts["mamba_heads"] == pytest.approx(0.5)
    fewer = axis_cuts(hybrid_child(parent, kept_layers=kept[:-8], point={}), parent)
    blocks = sum((layer.mixer != "none") + (layer.ffn_kind != "none") for layer in parent.layers)
    dropped = sum((parent.layers[i].mixer != "none") + (parent.layers[i].ffn_kind != "none") for i in kept[-8:])
    assert fewer["depth"] == pytest.approx(dropped / blocks)


def test_the_fit_recovers_known_per_axis_curves_and_keeps_coefficients_non_negative() -> None:
    truth = {"depth": (3.0, 1.5), "hidden": (8.0, 2.0), "experts_per_token": (12.0, 1.0)}
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(40):
        cuts = {axis: float(rng.uniform(0, 0.6)) * (rng.random() < 0.6) for axis in truth}
        kl = sum(a * cuts[axis] ** p for axis, (a, p) in truth.items())
        if kl > 0:
            rows.append((cuts, kl))
    fitted = fit_estimate(rows, fitted_on=("synthetic",))
    for axis, (a, p) in truth.items():
        assert fitted.coefficients[axis][1] == p
        assert fitted.coefficients[axis][0] == pytest.approx(a, rel=1e-6)
    assert set(fitted.coefficients) == set(truth)  # axes no row cuts are not fitted...
    assert fitted.borrowed == {}  # ... and borrow only from a fitted axis (FALLBACKS)
    mamba = fit_estimate([({"kv_heads": 0.5}, 1.0)])
    assert mamba.borrowed == {"mamba_heads": "kv_heads"}
    assert mamba.kl_of_cuts({"mamba_heads": 0.5}) == pytest.approx(mamba.kl_of_cuts({"kv_heads": 0.5}))
    a = rng.normal(size=(12, 4))
    assert (nnls(a, a @ np.array([1.0, -2.0, 0.5, 3.0])) >= 0).all()
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_estimate([({"depth": 0.1}, 0.0)])


def test_the_shipped_estimate_loads_round_trips_and_ranks_deeper_cuts_as_worse(tmp_path: Path) -> None:
    estimate = load_estimate()
    assert {"depth", "hidden", "ffn_width", "experts", "expert_width", "experts_per_token"} <= set(
        estimate.coefficients
    )
    assert all(a >= 0 for a, _ in estimate.coefficients.values()) and estimate.fitted_on
    path = tmp_path / "e.json"
    path.write_text(json.dumps(estimate.to_dict()))
    assert load_estimate(path) == estimate
    parent = load_architecture("smollm2-135m")
    assert estimate.kl(parent, parent) == 0 and estimate.quality(parent, parent) == 1.0
    kls = [estimate.kl(uniform_child(parent, num_layers=n), parent) for n in (28, 24, 20, 16)]
    assert kls == sorted(kls) and kls[0] > 0
    assert 0 < estimate.quality(uniform_child(parent, num_layers=16), parent) < 1
    with pytest.raises(ValueError, match="unknown axes"):
        QualityEstimate.from_dict({"coefficients": {"width": {"a": 1, "p": 1}}})


def test_plan_mode_ranks_by_the_estimate_when_asked_and_refuses_it_elsewhere() -> None:
    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.search.study import StudyConfig
    from autocompress_opt.search.study.trials import plan_trial
    from autocompress_opt.serving.targets import Target

    parent, target = load_architecture("smollm2-135m"), Target("rtx5070", "in-game")
    space = load_search_space("smollm2-135m")
    point = {"num_layers": 20, "hidden_size": 512, "ffn_width": 1024, "num_kv_heads": 3, "q_per_kv": 3}
    request = {"params": point, "parent": parent.to_dict(), "space": space.to_dict(), "target": target.to_dict()}
    by_params = plan_trial(request)
    by_estimate = plan_trial({**request, "plan_quality": "estimate"})
    assert by_params["quality_kind"] == "retained_params" and by_estimate["quality_kind"] == "estimated_kl"
    assert by_estimate["architecture"] == by_params["architecture"]
    assert math.isclose(
        by_estimate["quality"], load_estimate().quality(parent.from_dict(by_estimate["architecture"]), parent)
    )
    base = dict(name="x", model="smollm2-135m", targets=(target,), space=space, trials=1)
    assert StudyConfig(**base, plan_quality="estimate").plan_quality == "estimate"
    with pytest.raises(ConfigError, match="plan_quality must be one of params, estimate"):
        StudyConfig(**base, plan_quality="kl")
    with pytest.raises(ConfigError, match="plan_quality estimate: the stand-in of plan-mode trials"):
        StudyConfig(**base, plan_quality="estimate", mode="weights")
