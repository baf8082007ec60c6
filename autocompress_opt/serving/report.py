"""A cost report: one model under every workload on every catalog GPU (the pre-study main job)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_sparse
from autocompress_opt.serving.costmodel import CostEstimate, cost_intervals, estimate_cost
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.hardware import HARDWARE
from autocompress_opt.serving.profiles import get_profile
from autocompress_opt.serving.workloads import WORKLOADS, Workload

__all__ = ["INTERVAL_CONFIDENCE", "ReportRow", "cost_report", "plot_report"]

# Level of the intervals a report carries and draws (the engine profile's held-out residuals).
INTERVAL_CONFIDENCE = 0.9


@dataclass(frozen=True)
class ReportRow:
    workload: str
    hardware: str
    engine: str
    dtype: str
    cost: CostEstimate
    error: str = ""
    bounds: dict[str, float | None] = field(default_factory=dict)  # <metric>_low/_high at INTERVAL_CONFIDENCE

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "hardware": self.hardware,
            "engine": self.engine,
            "dtype": self.dtype,
            **({"error": self.error} if self.error else {**self.cost.to_dict(), **self.bounds}),
        }


def cost_report(
    arch: Architecture, workloads: list[Workload] | None = None, hardware: list[str] | None = None
) -> list[ReportRow]:
    """Cost of ``arch`` for each workload (its default engine and dtype) on each GPU."""
    from autocompress_opt.errors import AutocompressError

    workloads = workloads or [WORKLOADS.get(n) for n in WORKLOADS.names()]
    hardware = hardware or [n for n in HARDWARE.names() if n != "cpu"]
    rows = []
    for wl in workloads:
        for hw in hardware:
            try:
                scenario = wl.scenario()
                profile = get_profile(wl.engine, hw)
                cost = estimate_cost(arch, hw, get_engine(wl.engine), scenario, profile)
                bands = cost_intervals(cost.to_dict(), scenario, profile, INTERVAL_CONFIDENCE, is_sparse(arch))
                bounds = {k: None if v is None else float(v) for k, v in bands.items()}
                rows.append(ReportRow(wl.name, hw, wl.engine, wl.dtype, cost, bounds=bounds))
            except AutocompressError as exc:  # e.g. a device without the dtype: report, go on
                rows.append(ReportRow(wl.name, hw, wl.engine, wl.dtype, None, str(exc)))  # type: ignore[arg-type]
    return rows


def save_report(rows: list[ReportRow], arch: Architecture, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = (arch.name or arch.family).lower().replace(" ", "-")
    json_path = out_dir / f"cost-report-{stem}.json"
    json_path.write_text(
        json.dumps({"model": arch.name, "params": arch.num_params, "rows": [r.to_dict() for r in rows]}, indent=2)
    )
    return [json_path, *plot_report(rows, arch, out_dir / f"cost-report-{stem}")]


def _error_bars(rows: list[ReportRow], key: str, values: list[float]) -> list[list[float]] | None:
    """matplotlib ``yerr`` (distances below and above each bar) from the rows' intervals; None for
    a metric without intervals. An interval that does not hold its bar (a biased engine) is drawn
    from the bar to the interval's far end."""
    lows = [r.bounds.get(f"{key}_low") for r in rows]
    highs = [r.bounds.get(f"{key}_high") for r in rows]
    if any(v is None for v in lows + highs):
        return None
    below = [max(v - lo, 0.0) for v, lo in zip(values, lows)]  # type: ignore[operator]
    above = [max(hi - v, 0.0) for v, hi in zip(values, highs)]  # type: ignore[operator]
    return [below, above]


def plot_report(rows: list[ReportRow], arch: Architecture, stem: Path) -> list[Path]:
    """Bars of TTFT, TPOT, throughput and memory per GPU, one row of panels per workload; latency and
    throughput bars carry their :data:`INTERVAL_CONFIDENCE` intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    metrics = [
        ("ttft_ms", "TTFT (ms)"),
        ("tpot_ms", "TPOT (ms)"),
        ("output_throughput_tok_s", "output tok/s"),
        ("peak_memory_gib", "peak memory (GiB)"),
    ]
    fig, axes = plt.subplots(
        len(workloads), len(metrics), figsize=(4 * len(metrics), 2.8 * len(workloads)), squeeze=False
    )
    for i, wl in enumerate(workloads):
        sub = [r for r in rows if r.workload == wl and not r.error]
        for j, (key, label) in enumerate(metrics):
            ax = axes[i][j]
            values = [getattr(r.cost, key) for r in sub]
            ax.bar([r.hardware for r in sub], values, color="tab:blue", yerr=_error_bars(sub, key, values))
            ax.set_yscale("log")
            ax.set_title(
                f"{wl}: {label}" + (f" [{sub[0].engine}, {sub[0].dtype}]" if sub and j == 0 else ""), fontsize=9
            )
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    fig.suptitle(f"Predicted serving cost of {arch.summary()}", fontsize=10)
    fig.tight_layout()
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    for path in paths:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return paths
