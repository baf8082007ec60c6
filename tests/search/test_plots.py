"""Pareto plots: weights-mode fronts are drawn on the held-out KL (log, lower is better), not on
exp(-KL), where every pruned model sat at 0.00-0.05 against the parent's 1.0."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autocompress_opt.search.study import TrialRecord, plots

METRICS = {"ttft_ms": 10.0, "tpot_ms": 2.0, "output_throughput_tok_s": 500.0, "peak_memory_gib": 1.0}


def record(number: int, quality: float, kind: str, feasible: bool = True, scale: float = 1.0) -> TrialRecord:
    metrics = {k: v * scale for k, v in METRICS.items()}
    return TrialRecord(
        "s.rtx5070", number, "COMPLETE", {}, [quality], feasible, quality, metrics, {}, None, quality_kind=kind
    )


def drawn(monkeypatch: pytest.MonkeyPatch, records: list[TrialRecord], tmp_path: Path) -> Any:
    """The figure plot_pareto builds (kept open instead of saved)."""
    figures: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, stem: figures.append(fig) or [])
    plots.plot_pareto([{"label": "rtx5070", "records": records, "parent": METRICS}], tmp_path / "p")
    return figures[0]


def test_weights_mode_fronts_are_drawn_on_kl_with_a_log_axis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kls = [0.8, 2.5, 6.0]
    records = [record(i, math.exp(-kl), "exp_neg_kl", scale=0.5 + 0.2 * i) for i, kl in enumerate(kls)]
    fig = drawn(monkeypatch, records, tmp_path)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and "KL" in ax.get_ylabel() and "better" in ax.get_ylabel()
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections if len(c.get_offsets())])
    assert sorted(ys.tolist()) == pytest.approx(sorted(kls))  # the KL itself, not exp(-KL)
    assert any(line.get_linestyle() == ":" for line in ax.lines)  # the parent's cost, KL 0 off the log axis


def test_other_quality_kinds_keep_the_linear_quality_axis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    records = [record(i, q, "retained_params", scale=0.5 + 0.2 * i) for i, q in enumerate((0.5, 0.7))]
    fig = drawn(monkeypatch, records, tmp_path)
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear" and "higher is better" in ax.get_ylabel()
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections if len(c.get_offsets())])
    assert 1.0 in ys.tolist() and {0.5, 0.7} <= set(ys.tolist())  # the parent's star at 1.0
