"""What a study run prints about its answers: each target's best feasible point, the constraints
that bind it, and why two targets that end with the same architecture do."""

from __future__ import annotations

from typing import Any

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import uniform_allocation
from autocompress_opt.search.study import (
    TargetOutcome,
    TrialRecord,
    best_feasible,
    binding_constraints,
    shared_answers,
)

PARENT = load_architecture("smollm2-135m")


def record(number: int, quality: float, constraints: dict[str, float], arch: Any = PARENT, **kw: Any) -> TrialRecord:
    return TrialRecord(
        study="s",
        number=number,
        state=kw.get("state", "COMPLETE"),
        params={},
        values=[quality],
        feasible=kw.get("feasible", all(v <= 0 for v in constraints.values())),
        quality=quality,
        metrics={},
        constraints=constraints,
        architecture=arch.to_dict() if arch is not None else None,
    )


def test_the_best_is_the_feasible_trial_of_highest_quality() -> None:
    records = [record(0, 0.5, {"a": -0.1}), record(1, 0.9, {"a": 0.2}), record(2, 0.7, {"a": -0.3})]
    assert best_feasible(records).number == 2  # type: ignore[union-attr]  # 1 is better but infeasible
    assert best_feasible([record(0, 0.9, {"a": 0.2})]) is None


def test_binding_constraints_are_those_within_the_slack_tightest_first() -> None:
    r = record(0, 0.5, {"ttft": -0.2, "tpot": -0.001, "mem": -0.04})
    assert binding_constraints(r) == ["tpot (slack 0.001)", "mem (slack 0.040)"]
    loose = binding_constraints(record(0, 0.5, {"ttft": -0.2, "mem": -0.7}))
    assert loose == ["none within 0.05 of its limit (tightest: ttft, slack 0.200)"]


def test_targets_with_the_same_best_architecture_are_named_with_what_binds_each() -> None:
    same = record(3, 0.4, {"throughput >= 1.5x": -0.01})
    smaller = uniform_allocation(
        {"num_layers": 20, "hidden_size": 576, "ffn_width": 1536, "num_kv_heads": 3, "q_per_kv": 3}, PARENT
    )
    other = record(1, 0.3, {"tpot <= 0.8x": -0.002}, arch=smaller)
    outcomes = [
        TargetOutcome("g.h100-sxm", 4, best=same),
        TargetOutcome("g.b200", 4, best=record(5, 0.4, {"throughput >= 1.5x": -0.02})),
        TargetOutcome("g.rtx5070", 4, best=other),
        TargetOutcome("g.rtx5080", 4, best=None),
    ]
    [line] = shared_answers(outcomes)
    assert line.startswith("g.h100-sxm and g.b200 end with the same architecture; binding constraints: ")
    assert "g.h100-sxm: throughput >= 1.5x (slack 0.010)" in line and "g.b200: throughput >= 1.5x (slack 0.020)" in line
    assert shared_answers(outcomes[2:]) == []
