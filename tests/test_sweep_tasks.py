"""The sweep's task comparison (benchmarks/_sweep_tasks.py) on synthetic recovered runs: tasks the
screen drops do not count, the difference is paired per recovery seed's block, and the cell's
comparison joins the file's Holm family in points of accuracy with its own verdict direction."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _render_sweep  # noqa: E402
import _sweep_tasks  # noqa: E402
import bench_sweep  # noqa: E402
import render  # noqa: E402

from autocompress_opt.tasks.items import TaskSpec  # noqa: E402
from autocompress_opt.tasks.report import ReportTask  # noqa: E402


def _task(name: str, chance: float) -> ReportTask:
    blocks = tuple(TaskSpec(name, "acc_norm", (), {"file": "x"}, chance) for _ in range(3))
    return ReportTask(name, "acc_norm", chance, blocks, 2400, 0, False)


def _run(seed: int, correct: dict[str, np.ndarray], dev: dict[str, float]) -> dict:
    tasks = {
        n: {
            "block": 1 + seed,
            "dev": dev[n],
            "score": float(c.mean()),
            "dev_correct": "",
            "correct": "".join("1" if x else "0" for x in c),
        }
        for n, c in correct.items()
    }
    return {"seed": seed, "tasks": tasks}


def test_a_cells_task_comparison_counts_only_screened_tasks_and_joins_holm(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    tasks = {"good": _task("good", 0.25), "flat": _task("flat", 0.25)}
    arms: dict[str, dict] = {"searched": {"recovered": {}}, "best-uniform": {"recovered": {}}}
    for seed in (0, 1):
        base = {"good": rng.random(600) < 0.4, "flat": rng.random(600) < 0.25}
        lifted = {"good": base["good"] | (rng.random(600) < 0.08), "flat": base["flat"]}
        arms["best-uniform"]["recovered"][str(seed)] = _run(seed, base, {"good": 0.4, "flat": 0.26})
        arms["searched"]["recovered"][str(seed)] = _run(seed, lifted, {"good": 0.45, "flat": 0.27})
    record = {"arms": arms}
    out = _sweep_tasks.compare(record, tasks, bench_sweep.ARMS, n_boot=2000)
    assert out["screen"] == {"good": None, "flat": "at chance"} and out["kept"] == ["good"]
    assert out["difference"]["mean"] > 0 and out["difference"]["ci95"][0] > 0
    assert out["difference"] == out["per_task"]["good"]  # one kept task: the mean is that task
    assert out["scores"]["searched"]["good"] > out["scores"]["best-uniform"]["good"]

    cells = {"rtx5070:in-game/middle/s0": {**record, "tasks": out}}
    fam = _sweep_tasks.family(cells)
    [(name, (p, points))] = fam.items()
    assert "mean accuracy over 1 tasks" in name and points == out["difference"]["mean"] and p < 0.05
    corrected = bench_sweep.corrected(cells, {}, n_boot=2000)
    assert corrected["family"] == 1
    entry = corrected["comparisons"][name]
    assert entry["acc_diff_pts"] == pytest.approx(points) and entry["verdict"] == "searched better"

    # the docs block: a row per task, the screen's word, and the mean bold (Holm keeps it)
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    assert _render_sweep.sweep_tasks().startswith("Not yet measured")
    arm = {"summary": "x: 10/10 layers", "uniform": True}
    cell = {"target": "rtx5070:in-game", "budget": "middle", "study_seed": 0, "tasks": out}
    cell["difference"] = {"after": {"mean": -0.3, "ci95": [-0.35, -0.25]}}
    cell["arms"] = {a: {**arm, **arms[a]} for a in arms}
    settings = {"model": "m", "trials": 12, "recovery": {"steps": 30, "seeds": [0, 1]}, "n_boot": 2000}
    settings["tasks"] = {"floor_margin": 0.05, "ceiling": 0.95}
    data = {"cells": {"rtx5070:in-game/middle/s0": cell}, "settings": settings, "date": "2026-12-07"}
    data |= {"machine": {"cpus": 2}, "corrected": corrected, "provenance": {"code": {"commit": "abc1234"}}}
    (tmp_path / "sweep_tasks").mkdir()
    (tmp_path / "sweep_tasks" / "sweep.json").write_text(__import__("json").dumps(data))
    text = _render_sweep.sweep_tasks()
    assert "| good | 0 / 0 | 0 of 2,400 | kept |" in text and "| flat | 0 / 0 | 0 of 2,400 | at chance |" in text
    assert f"**{out['difference']['mean']:+.1f} pts" in text and "searched better" in text
    verdict = _render_sweep.sweep_tasks_verdict()
    assert "(1 cell so far" in verdict and f"is {out['difference']['mean']:+.1f} points" in verdict
    assert "over 1 tasks (searched better), beside -0.300 nats [-0.350, -0.250] of test KL" in verdict


def test_no_kept_task_gives_no_difference() -> None:
    tasks = {"flat": _task("flat", 0.25)}
    flat = {"flat": np.zeros(50, dtype=bool)}
    arms = {a: {"recovered": {"0": _run(0, flat, {"flat": 0.25})}} for a in bench_sweep.ARMS}
    out = _sweep_tasks.compare({"arms": arms}, tasks, bench_sweep.ARMS, n_boot=100)
    assert out["kept"] == [] and out["difference"] is None
    assert _sweep_tasks.family({"c": {"tasks": out}}) == {}
