"""AIConfigurator's per-layer lookups (``serving/aic.py``) beside this toolkit's held-out predictions
on the published rows the backend can express, and the speed of each (issue 45).

For every row of ``autocompress_opt/data/measurements.csv`` on H100-SXM, H200 or B200 with vLLM or
TensorRT-LLM, a dense model, offline, arrival ``burst`` in one wave: the published value, the own
model's leave-one-source-out prediction (``serving.validation.leave_one_source_out``) and the aic
backend's (``serving.aic.estimate_cost_aic``: one static batch, prefilled then decoded together).
Rows it cannot express are counted with the reason. Needs the extra: pip install 'autocompress-opt[aic]'.

PYTHONPATH=. /path/to/venv-with-aic/bin/python benchmarks/bench_aic.py   # ~1 min on 2 CPU threads
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import provenance, write

from autocompress_opt.errors import ConfigError
from autocompress_opt.serving import aic
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.validation import is_moe, leave_one_source_out, load_measurements


def _median_abs(errors: list[float]) -> float | None:
    return statistics.median(abs(e) for e in errors) if errors else None


def side_by_side() -> tuple[list[dict[str, Any]], Counter[str]]:
    rows = load_measurements()
    held = {row.id: row for row in leave_one_source_out(rows)}
    priced = aic.predict_rows(rows)
    out, skipped = [], Counter()
    for obs, source in rows:
        if obs.label not in priced:
            try:
                aic.check_covered(obs.arch, obs.hardware.name, obs.engine.name, obs.scenario)
                reason = f"metric {obs.metric}"
            except ConfigError as exc:
                reason = "MoE / Mamba-2 model" if is_moe(obs) else str(exc).split(";")[0].split(":")[0]
            skipped[reason] += 1
            continue
        row, value = held[obs.label], priced[obs.label]
        out.append(
            {
                "id": obs.label,
                "model": row.model,
                "hardware": row.hardware,
                "engine": row.engine,
                "dtype": obs.scenario.dtype,
                "concurrency": obs.scenario.concurrency,
                "metric": obs.metric,
                "measured": obs.value,
                "own_held_out": row.predicted,
                "aic": value,
                "own_error": row.error,
                "aic_error": value / obs.value - 1,
                "source": source,
            }
        )
    return out, skipped


def speed(n: int = 200) -> dict[str, float]:
    """Predictions per second of one decode step + one prefill for Llama-3.1-8B on H200/TRT-LLM."""
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.serving.costmodel import Scenario

    arch = load_architecture("llama-3.1-8b")
    pricer = aic.AicPricer("h200", "trtllm", "fp8")
    t = time.perf_counter()
    for i in range(n):  # distinct contexts so nothing is answered from a cache of ours
        pricer.prefill_ms(arch, 1, 1000 + i)
        pricer.decode_step_ms(arch, 8, 2000 + i)
    aic_s = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for i in range(n):
        estimate_cost(arch, "h200", "trtllm", Scenario("fp8", 1000 + i, 1000, 8))
    own_s = (time.perf_counter() - t) / n
    return {"aic_prefill_plus_decode_per_s": 1 / aic_s, "own_estimate_cost_per_s": 1 / own_s}


def main() -> None:
    rows, skipped = side_by_side()
    by_engine: dict[str, dict[str, Any]] = {}
    for engine in sorted({r["engine"] for r in rows}):
        these = [r for r in rows if r["engine"] == engine]
        by_engine[engine] = {
            "rows": len(these),
            "own_median_abs_error": _median_abs([r["own_error"] for r in these]),
            "aic_median_abs_error": _median_abs([r["aic_error"] for r in these]),
        }
    summary = {
        "rows": len(rows),
        "own_median_abs_error": _median_abs([r["own_error"] for r in rows]),
        "aic_median_abs_error": _median_abs([r["aic_error"] for r in rows]),
        "aic_better_on": sum(abs(r["aic_error"]) < abs(r["own_error"]) for r in rows),
        "by_engine": by_engine,
        "skipped": dict(skipped),
    }
    for r in rows:
        print(
            f"{r['id']:<8} {r['model']:<16} {r['hardware']:<9} {r['engine']:<7} {r['metric']:<24} "
            f"{r['measured']:>10.1f}  own {r['own_error']:+7.1%}  aic {r['aic_error']:+7.1%}"
        )
    print(summary)
    write(
        "aic_side_by_side",
        {
            "aiconfigurator_core": metadata.version("aiconfigurator-core"),
            "summary": summary,
            "speed": speed(),
            "rows": rows,
            **provenance(),
        },
    )


if __name__ == "__main__":
    main()
