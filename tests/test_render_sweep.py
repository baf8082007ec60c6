"""docs/results/sweep.md's blocks (benchmarks/_render_sweep.py) and the sweep's statistics
(benchmarks/bench_sweep.py) on a small synthetic results file: no model, no study. A row per cell,
bold only where Holm keeps an interval that excludes 0, the study seeds pooled per (target, budget),
a one-sentence verdict naming where the search wins and where it does not, and the plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _render_sweep  # noqa: E402
import bench_sweep  # noqa: E402
import render  # noqa: E402

BASE = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95]  # per-row test KL of the best uniform model (nats)


def _rows(shift: float, wobble: float = 0.0) -> dict:
    """Per-row scores: the best uniform model's KL moved by ``shift`` (plus a per-row ``wobble``)."""
    kl = [v + shift + wobble * (-1) ** i for i, v in enumerate(BASE)]
    return {dom: {"kl": kl, "ce": [2.0] * len(kl)} for dom in ("code", "prose")}


def _arm(name: str, shift_before: float, shifts_after: list[float], uniform: bool, slack: float) -> dict:
    from _h2h_test import summary

    before = _rows(shift_before)
    runs = {
        str(s): {"rows": _rows(d, 0.01 * s), "test": summary(_rows(d, 0.01 * s))} for s, d in enumerate(shifts_after)
    }
    return {
        "summary": f"{name}: 20/30 layers, hidden 576, heads 9, ffn 1024, 90.0M params",
        "params": 90_000_000,
        "uniform": uniform,
        "margins": {
            "median": {"ttft_ms <= 0.6x": slack},
            "at_0.9": {"ttft_ms <= 0.6x": slack - 0.05},
            "inside_interval": 0 <= slack < 0.05,
        },
        "test": summary(before),
        "rows": before,
        "recovered": runs,
    }


def _cell(target: str, budget: str, seed: int, gain: float) -> dict:
    """A finished cell whose searched model is ``gain`` nats closer to the parent after recovery."""
    from _h2h_test import differences

    arms = {
        "searched": _arm("searched", -0.3, [-gain, -gain], uniform=False, slack=0.02),
        "best-uniform": _arm("best-uniform", 0.0, [0.0, 0.0], uniform=True, slack=0.1),
    }
    after = [[r["rows"] for _, r in sorted(arms[a]["recovered"].items())] for a in ("searched", "best-uniform")]
    return {
        "target": target,
        "budget": budget,
        "keep": bench_sweep.BUDGETS[budget],
        "study_seed": seed,
        "study": {"trials": {"asked": 12, "complete": 7, "pruned": 5, "feasible": 7}},
        "arms": arms,
        "same_model": False,
        "difference": {
            "before": differences([arms["searched"]["rows"]], [arms["best-uniform"]["rows"]], n_boot=300)["kl"],
            "after": differences(*after, n_boot=300)["kl"],
        },
        "seconds": {"cell": 1200.0, "study": 700.0, "recovery": 400.0, "baselines": 60.0},
    }


def _results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    cells = {
        "rtx5070:in-game/middle/s0": _cell("rtx5070:in-game", "middle", 0, gain=0.2),
        "rtx5070:in-game/middle/s1": _cell("rtx5070:in-game", "middle", 1, gain=0.25),
        "h100-sxm:datacenter/light/s0": _cell("h100-sxm:datacenter", "light", 0, gain=0.0),
        "h100-sxm:datacenter/aggressive/s0": {
            "target": "h100-sxm:datacenter",
            "budget": "aggressive",
            "keep": 0.4,
            "study_seed": 0,
            "study": {"trials": {"asked": 12, "complete": 0}},
            "arms": {},
            "unavailable": "no feasible trial",
            "seconds": {"cell": 900.0, "study": 800.0, "baselines": 60.0},
        },
    }
    pooled = bench_sweep.pooled(cells, n_boot=300)
    data = {
        "benchmark": "sweep",
        "date": "2026-12-06T00:00:00Z",
        "machine": {"cpus": 2},
        "provenance": {"code": {"commit": "0" * 40, "dirty": False}},
        "settings": {
            "model": "tiny",
            "trials": 12,
            "test_rows": 6,
            "seq_len": 16,
            "recovery": {"steps": 3, "batch_size": 2, "lr": 1e-4, "seeds": [0, 1]},
            "n_boot": 300,
        },
        "test_rows": {"rows_per_domain": 6},
        "cells": cells,
        "pooled": pooled,
        "corrected": bench_sweep.corrected(cells, pooled, n_boot=300),
    }
    (tmp_path / "sweep.json").write_text(json.dumps(data))
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    return data


def test_the_statistics_pool_the_seeds_and_put_every_comparison_in_one_holm_family(tmp_path, monkeypatch) -> None:
    data = _results(tmp_path, monkeypatch)
    assert list(data["pooled"]) == ["rtx5070:in-game/middle"]  # the only (target, budget) with two seeds
    group = data["pooled"]["rtx5070:in-game/middle"]
    assert group["by_study_seed"] == pytest.approx([-0.2, -0.25])
    assert group["sd_across_study_seeds"] == pytest.approx(0.0353553, abs=1e-6)  # stdev of -0.2, -0.25
    assert group["after"]["mean"] == pytest.approx(-0.225)
    # three finished cells before and after recovery, and the pooled group: 7 in the family
    assert data["corrected"]["family"] == 7
    flat = data["corrected"]["comparisons"]["h100-sxm:datacenter/light/s0: searched vs best-uniform, after recovery"]
    assert flat["verdict"] == "not resolved after correction"


def test_a_row_per_cell_bold_only_where_holm_keeps_it(tmp_path, monkeypatch) -> None:
    _results(tmp_path, monkeypatch)
    text = _render_sweep.sweep()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| rtx5070:in-game"] * 2 + ["| h100-sxm:datacenter"] * 2
    won = next(row for row in rows if "middle (60 %) | 0 |" in row)
    assert (
        "**-0.200 [" in won and "searched better" in won and "7 + 5 stopped early of 12" in won and "(per-layer)" in won
    )
    assert "+2.0 % † / +10.0 %" in won  # the searched model's slack is inside the cost model's interval
    tie = next(row for row in rows if "light (85 %)" in row)
    assert "**" not in tie.split(" | ")[8] and "not resolved after correction" in tie
    assert "no feasible trial" in next(row for row in rows if "aggressive (40 %)" in row)
    assert "Holm-corrected over all 7 comparisons" in text


def test_the_seed_table_and_the_verdict_say_where_the_search_wins_and_where_not(tmp_path, monkeypatch) -> None:
    _results(tmp_path, monkeypatch)
    seeds = _render_sweep.sweep_seeds()
    assert "| rtx5070:in-game, middle | 2 | -0.200, -0.250 | 0.035 |" in seeds
    verdict = _render_sweep.sweep_verdict()
    assert verdict.startswith("After Holm's correction over all 7 comparisons")
    assert (
        "beats the best uniform model after equal recovery at rtx5070:in-game at the middle budget (2 study" in verdict
    )
    assert "no difference is resolved at h100-sxm:datacenter at the light budget" in verdict
    assert "no feasible model at h100-sxm:datacenter at the aggressive budget" in verdict
    assert verdict.count(".") == 1 + verdict.count("e.g.")  # one sentence
    assert "a cell took 20 minutes (median" in _render_sweep.sweep_timing()


def test_the_plot_is_drawn_from_the_file(tmp_path, monkeypatch) -> None:
    data = _results(tmp_path, monkeypatch)
    out = _render_sweep.plot(data, tmp_path / "sweep.png", tmp_path / "copy" / "sweep.png")
    assert out.stat().st_size > 1000 and (tmp_path / "copy" / "sweep.png").is_file()


def test_without_a_results_file_every_block_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    assert render.NOT_MEASURED in _render_sweep.sweep()
    assert "no finished cell" in _render_sweep.sweep_verdict()
    assert set(_render_sweep.RENDERERS) <= set(render.RENDERERS)


def test_a_budget_sets_the_primary_metric_and_holds_the_others_at_the_parents() -> None:
    assert bench_sweep.budget_constraints("in-game", 0.6) == {"ttft_ms": "0.6x", "tpot_ms": "1x"}
    assert bench_sweep.budget_constraints("datacenter", 0.4) == {"output_throughput_tok_s": "2.5x", "tpot_ms": "1x"}


def test_the_space_follows_the_baselines_below_the_bundled_floors() -> None:
    from autocompress_opt.arch.search_space import load_search_space

    base = load_search_space("smollm2-135m")
    grid = {c.name: tuple(range(1, 31)) if c.name == "num_layers" else c.values for c in base.choices}
    deep = {"num_layers": 12, "hidden_size": 576, "ffn_width": 1536, "num_kv_heads": 3, "q_per_kv": 3}
    assert bench_sweep.budget_space(base, [deep], grid) == base  # nothing below the floors: the bundled space
    space = bench_sweep.budget_space(base, [deep, {**deep, "num_layers": 7}], grid)
    assert space["num_layers"].values == tuple(range(7, 31))
    assert space["hidden_size"] == base["hidden_size"]


def test_the_cells_run_most_informative_first() -> None:
    args = bench_sweep.parse_args(["--seeds", "0,1", "--budgets", "light,middle"])
    keys = [c.key for c in bench_sweep.planned(args)]
    assert keys[:3] == ["rtx5070:in-game/middle/s0", "h100-sxm:datacenter/middle/s0", "rtx5070:in-game/light/s0"]
    assert keys.index("h100-sxm:datacenter/light/s0") < keys.index("rtx5070:in-game/middle/s1")
    assert keys[-1] == "b200:datacenter/middle/s1"  # the middle-only targets come last
    assert bench_sweep.Cell.parse("rtx5070:in-game/middle/s2") == bench_sweep.Cell("rtx5070:in-game", "middle", 2)
