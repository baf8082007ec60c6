"""docs/results/inner-arms.md's block (benchmarks/_render_arms.py): one row per arm the results carry,
the best uniform model as the reference, bold only for a difference resolved after Holm's correction,
and the cells not yet run named as such."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _render_arms  # noqa: E402
import render  # noqa: E402


def _cell(ffn: list[int], before: dict, after: dict) -> dict:
    arm = {
        "available": True,
        "summary": "m: 3/3 layers, hidden 8, heads 2, ffn 16, 1.0M params",
        "layers": [{"heads": 2, "kv_heads": 1, "ffn": w} for w in ffn],
        "test": {"kl_to_parent": 1.25},
    }
    return {
        "target": "rtx5070:in-game",
        "budget": "aggressive",
        "engine": "vllm",
        "params": {"num_layers": 3, "hidden_size": 8, "ffn_width": 16, "num_kv_heads": 1, "q_per_kv": 2},
        "best_uniform_finding": "chose the only one",
        "arms": {"best-uniform": dict(arm, layers=[{"ffn": 16}] * 3), "block-library": arm},
        "vs_best_uniform_kl": {"block-library": before},
        "recovered": {
            "best-uniform": {"0": {"test": {"kl_to_parent": 0.9}}},
            "block-library": {"0": {"test": {"kl_to_parent": 0.8}}, "1": {"test": {"kl_to_parent": 0.85}}},
        },
        "vs_best_uniform_kl_recovered": {"block-library": after},
    }


def _results(tmp_path: Path, cell: dict, p_before: float, p_after: float) -> None:
    key = "rtx5070:in-game/aggressive"
    data = {
        "date": "2026-12-06T00:00:00Z",
        "machine": {"cpus": 2},
        "code": {"commit": "0" * 40, "dirty": False},
        "model": "tiny",
        "settings": {"seed": 0, "n_boot": 100},
        "recovery": {"steps": 3, "batch_size": 2, "lr": 1e-4, "seeds": [0, 1], "top": 1},
        "test_rows": {"rows_per_domain": 4, "seq_len": 16},
        "cells": {key: cell},
        "corrected": {
            "family": 2,
            "comparisons": {
                f"{key}/block-library vs best-uniform": {"p_holm": p_before},
                f"{key}/block-library vs best-uniform, after recovery": {"p_holm": p_after},
            },
        },
    }
    (tmp_path / "inner_arms.json").write_text(json.dumps(data))


def test_a_cell_renders_each_arm_with_its_spread_and_bolds_only_what_survives_holm(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    resolved = {"mean": -0.3, "ci95": [-0.4, -0.2]}
    unresolved = {"mean": -0.02, "ci95": [-0.07, 0.04]}
    _results(tmp_path, _cell([0, 8, 24], resolved, unresolved), p_before=0.01, p_after=1.0)
    text = _render_arms.inner_arms()
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert set(rows) == {"| arm", "| best-uniform", "| block-library"}
    assert "| 16, 3/3 | 1.250 | (reference) | 0.900 | (reference) |" in rows["| best-uniform"]
    library = rows["| block-library"]
    assert "| 8..24, 2/3 |" in library  # widths of the layers that keep an FFN, and how many do
    assert "**-0.300 [-0.400, -0.200], p_holm 0.01**" in library
    assert "| 0.800 / 0.850 | -0.020 [-0.070, +0.040], p_holm 1 |" in library  # not bold: interval spans 0
    assert text.count("not yet measured") == 3  # the three other planned cells


def test_a_resolved_interval_is_not_bold_when_holm_does_not_keep_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    resolved = {"mean": -0.3, "ci95": [-0.4, -0.2]}
    _results(tmp_path, _cell([16, 16, 16], resolved, resolved), p_before=0.2, p_after=0.01)
    text = _render_arms.inner_arms()
    assert "-0.300 [-0.400, -0.200], p_holm 0.2 |" in text and "**-0.300 [-0.400, -0.200], p_holm 0.2**" not in text
    assert "**-0.300 [-0.400, -0.200], p_holm 0.01**" in text


def test_without_results_the_page_says_not_yet_measured(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    assert "not yet measured" in _render_arms.inner_arms()
