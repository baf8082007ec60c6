"""Error bars: intervals from held-out residuals, pooled by regime and phase; a target's
confidence makes its constraints bind at the pessimistic end; leave-one-source-out fitting."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.inner.budget import CostGoal
from autocompress_opt.serving import targets as targets_module
from autocompress_opt.serving.costmodel import Scenario, cost_intervals, estimate_cost, regime_of
from autocompress_opt.serving.profiles import CostProfile, time_ratio
from autocompress_opt.serving.targets import Target, all_satisfied
from autocompress_opt.serving.validation import free_parameters, load_measurements


def residuals(regime: str, phase: str, ratios: list[float]) -> list[dict[str, Any]]:
    return [{"id": f"{regime}{i}", "regime": regime, "phase": phase, "time_ratio": r} for i, r in enumerate(ratios)]


# 5 steady decode rows (measured 0.9x..1.3x the predicted time), 2 single-stream prefill rows.
PROFILE = CostProfile(
    "vllm",
    fit={
        "heldout": residuals("steady", "decode", [0.9, 1.0, 1.1, 1.2, 1.3])
        + residuals("single", "prefill", [0.8, 1.25])
    },
)


def test_time_ratio_inverts_throughputs() -> None:
    assert time_ratio("tpot_ms", 12.0, 10.0) == pytest.approx(1.2)
    assert time_ratio("output_throughput_tok_s", 800.0, 1000.0) == pytest.approx(1.25)  # 25 % more time


def test_interval_takes_quantiles_of_the_narrowest_pool_with_enough_rows() -> None:
    band = PROFILE.interval("tpot_ms", "steady", 0.5)
    assert band is not None and (band.pool, band.rows) == ("steady/decode", 5)
    logs = np.log([0.9, 1.0, 1.1, 1.2, 1.3])
    assert band.low == pytest.approx(math.exp(np.quantile(logs, 0.25)))
    assert band.high == pytest.approx(math.exp(np.quantile(logs, 0.75)))
    # burst TPOT: no burst rows, the decode pool (same 5) serves
    assert PROFILE.interval("tpot_ms", "burst", 0.5).pool == "decode"  # type: ignore[union-attr]
    # single-stream TTFT: 2 prefill rows are too few for a pool of their own; all 7 rows serve
    wide = PROFILE.interval("ttft_ms", "single", 0.9)
    assert wide is not None and (wide.pool, wide.rows) == ("all", 7)
    assert wide.low < 0.9 and wide.high > 1.2
    assert CostProfile("vllm").interval("tpot_ms", "single", 0.9) is None
    with pytest.raises(ConfigError, match=r"confidence must be a number in \(0, 1\), got"):
        PROFILE.interval("tpot_ms", "steady", 1.0)


def test_a_sparse_model_takes_the_moe_rows_residuals() -> None:
    """Issue 44: a MoE/hybrid model's interval comes from the MoE rows' held-out residuals (their pool
    named 'moe ...'), a dense model's from the dense rows'; a profile with fewer than two MoE residuals
    falls back to the dense ones."""
    moe = residuals("steady", "decode", [0.6, 0.8, 1.0, 1.4, 1.9])
    profile = CostProfile("vllm", fit={**PROFILE.fit, "heldout_moe": moe})
    dense_band = profile.interval("tpot_ms", "steady", 0.9)
    moe_band = profile.interval("tpot_ms", "steady", 0.9, sparse=True)
    assert dense_band is not None and moe_band is not None
    assert (moe_band.pool, moe_band.rows) == ("moe steady/decode", 5) and dense_band.pool == "steady/decode"
    assert moe_band.high / moe_band.low > dense_band.high / dense_band.low  # the wider MoE errors show
    assert PROFILE.interval("tpot_ms", "steady", 0.9, sparse=True) == dense_band
    arch = known_architectures()["qwen3-30b-a3b"]
    scenario = Scenario("bf16", 1000, 100, 32, arrival="steady")
    cost = estimate_cost(arch, "h100-sxm", "vllm", scenario, profile).to_dict()
    bands = cost_intervals(cost, scenario, profile, 0.9, sparse=True)
    assert bands["tpot_ms_high"] == pytest.approx(cost["tpot_ms"] * moe_band.high)


def test_cost_intervals_bound_latencies_and_throughputs_the_right_way() -> None:
    arch = known_architectures()["llama-3.1-8b"]
    scenario = Scenario("bf16", 1000, 100, 32, arrival="steady")
    cost = estimate_cost(arch, "h100-sxm", "vllm", scenario, PROFILE).to_dict()
    bands = cost_intervals(cost, scenario, PROFILE, 0.9)
    assert bands["tpot_ms_low"] < cost["tpot_ms"] < bands["tpot_ms_high"]
    assert bands["tpot_ms_low"] >= cost["tpot_floor_ms"]
    # a throughput's low end is the time's high end
    band = PROFILE.interval("output_throughput_tok_s", "steady", 0.9)
    assert band is not None
    assert bands["output_throughput_tok_s_low"] == pytest.approx(cost["output_throughput_tok_s"] / band.high)
    # residuals 100x below the prediction cannot push a latency under its roofline floor
    silly = CostProfile("vllm", fit={"heldout": residuals("steady", "decode", [0.01] * 4 + [0.02])})
    floored = cost_intervals(cost, scenario, silly, 0.9)
    assert floored["tpot_ms_low"] == floored["tpot_ms_high"] == cost["tpot_floor_ms"]


def test_regime_labels() -> None:
    assert (
        regime_of(Scenario("bf16", 10, 10, 1)) == regime_of(Scenario("bf16", 10, 10, 1, arrival="steady")) == "single"
    )
    assert regime_of(Scenario("bf16", 10, 10, 1, requests=50)) == "burst"
    assert regime_of(Scenario("bf16", 10, 10, 8, arrival="steady")) == "steady"
    assert regime_of(Scenario("bf16", 10, 10, arrival="poisson", rate=1.0)) == "poisson"


def test_a_point_feasible_at_the_median_is_infeasible_at_confidence_0_9(monkeypatch: Any) -> None:
    """TPOT limit 3 % above the median prediction; the 90 % interval reaches ~25 % above it."""
    monkeypatch.setattr(targets_module, "get_profile", lambda engine, hardware: PROFILE)
    arch = known_architectures()["llama-3.1-8b"]
    kwargs = dict(
        hardware="h100-sxm", workload="in-game", engine="vllm", concurrency=32, input_len=1000, output_len=100
    )
    median = Target(**kwargs).cost_metrics(arch)  # type: ignore[arg-type]
    limit = {"tpot_ms": f"{1.03 * median['tpot_ms']:.6f}", "ttft_ms": "1e9", "peak_memory_gib": "1e9"}
    plain = Target(**kwargs, constraints=limit)  # type: ignore[arg-type]
    sure = Target(**kwargs, constraints=limit, confidence=0.9)  # type: ignore[arg-type]
    parent = plain.cost_metrics(arch)
    assert plain.feasible(arch, parent)
    assert not sure.feasible(arch, parent)
    violations, _ = sure.check(arch, parent)
    high = PROFILE.interval("tpot_ms", "single", 0.9).high  # type: ignore[union-attr]
    assert violations[next(k for k in violations if k.startswith("tpot_ms"))] == pytest.approx(
        high / 1.03 - 1, rel=1e-4
    )
    # a looser limit (past the pessimistic end) is met at 0.9 too
    loose = Target(**kwargs, constraints={**limit, "tpot_ms": f"{1.5 * median['tpot_ms']:.6f}"}, confidence=0.9)  # type: ignore[arg-type]
    assert all_satisfied(loose.check(arch, parent)[0])


def test_a_sparse_models_constraints_bind_at_the_moe_rows_end(monkeypatch: Any) -> None:
    """Issue 44: a MoE model's constraint check (Target.check, the inner search's CostGoal) takes the
    pessimistic end from the MoE rows' residuals, a dense model's from the dense rows'."""
    moe_rows = residuals("single", "decode", [0.7, 1.0, 1.3, 1.6, 2.0])
    profile = CostProfile("vllm", fit={**PROFILE.fit, "heldout_moe": moe_rows})
    monkeypatch.setattr(targets_module, "get_profile", lambda engine, hardware: profile)
    moe = known_architectures()["qwen3-30b-a3b"]
    kwargs = dict(hardware="h100-sxm", workload="in-game", engine="vllm", concurrency=1, input_len=1000, output_len=100)
    median = Target(**kwargs).cost_metrics(moe)  # type: ignore[arg-type]
    limit = {"tpot_ms": f"{median['tpot_ms']:.6f}", "ttft_ms": "1e9", "peak_memory_gib": "1e9"}
    sure = Target(**kwargs, constraints=limit, confidence=0.9)  # type: ignore[arg-type]
    violations, _ = sure.check(moe, median)
    tpot = next(k for k in violations if k.startswith("tpot_ms"))
    band = profile.interval("tpot_ms", "single", 0.9, sparse=True)
    dense = profile.interval("tpot_ms", "single", 0.9)
    assert band is not None and dense is not None and band.high > dense.high
    assert violations[tpot] == pytest.approx(band.high - 1, rel=1e-4)
    assert sure.violations(median, median)[tpot] == pytest.approx(dense.high - 1, rel=1e-4)  # dense by default
    goal = CostGoal.for_target(sure, moe)
    assert goal.sparse and goal.violations(median)[tpot] == pytest.approx(band.high - 1, rel=1e-4)


def test_confidence_is_validated_and_omitted_from_dicts_when_unset() -> None:
    with pytest.raises(ConfigError, match=r"confidence must be a number in \(0, 1\)"):
        Target(hardware="h100-sxm", workload="datacenter", confidence=1.5)
    assert "confidence" not in Target(hardware="h100-sxm", workload="datacenter").to_dict()
    target = Target(hardware="h100-sxm", workload="datacenter", confidence=0.9)
    assert Target.from_dict(target.to_dict()) == target


def test_free_parameters_stay_below_the_rows() -> None:
    rows = [obs for obs, _ in load_measurements()]
    for n in range(1, len(rows) + 1):
        free, fp4 = free_parameters(rows[:n])
        assert len(free) + len(fp4) < n


def test_cost_report_rows_carry_the_intervals_they_plot(tmp_path: Any) -> None:
    from autocompress_opt.serving.report import INTERVAL_CONFIDENCE, cost_report, save_report
    from autocompress_opt.serving.workloads import get_workload

    arch = known_architectures()["smollm2-135m"]
    rows = cost_report(arch, [get_workload("datacenter")], ["h100-sxm"])
    (row,) = rows
    profile = targets_module.get_profile("vllm", "h100-sxm")
    band = profile.interval("tpot_ms", "burst", INTERVAL_CONFIDENCE)
    assert band is not None
    assert row.bounds["tpot_ms_high"] == pytest.approx(max(row.cost.tpot_ms * band.high, row.cost.tpot_floor_ms))
    assert row.to_dict()["tpot_ms_low"] == row.bounds["tpot_ms_low"]
    paths = save_report(rows, arch, tmp_path)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
