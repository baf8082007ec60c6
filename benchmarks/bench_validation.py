"""Shipped profiles vs published measurements: every row within 25 %, no floor above a measurement.

.venv/bin/python benchmarks/bench_validation.py [--measurements CSV]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import write

from autocompress_opt.serving.profiles import PRIORS
from autocompress_opt.serving.validation import SHIPPED_MEASUREMENTS, fit_published, load_measurements, validate


def leave_one_out(measurements: list) -> list:
    """Refit the engine profiles without each row in turn and predict that row: out-of-sample
    error. An engine left with no rows falls back to its prior (typical published efficiencies)."""
    out = []
    for i, row in enumerate(measurements):
        rest = measurements[:i] + measurements[i + 1 :]
        fitted = {p.engine: p for p in fit_published(rest)}
        engine = row[0].engine.name
        out.append(validate([row], fitted.get(engine, PRIORS[engine]))[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measurements", type=Path, default=SHIPPED_MEASUREMENTS)
    args = parser.parse_args()
    rows = validate(load_measurements(args.measurements))
    for r in rows:
        print(
            f"{r.id:<6} {r.model:<14} {r.hardware:<9} {r.engine:<9} {r.metric:<24} predicted {r.predicted:>10,.2f} "
            f"measured {r.measured:>10,.2f} error {r.error:+7.1%} bound {r.bound:>10,.2f} "
            f"{'ok' if r.bound_ok else 'VIOLATED'}"
        )
    errors = [abs(r.error) for r in rows]
    summary = {
        "rows": len(rows),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "all_within_25pct": max(errors) <= 0.25,
        "all_bounds_ok": all(r.bound_ok for r in rows),
    }
    loo = leave_one_out(load_measurements(args.measurements))
    for r in loo:
        print(
            f"leave-one-out {r.id:<6} predicted {r.predicted:>10,.2f} measured {r.measured:>10,.2f} "
            f"error {r.error:+7.1%}"
        )
    loo_errors = [abs(r.error) for r in loo]
    summary["leave_one_out"] = {
        "median_abs_error": statistics.median(loo_errors),
        "max_abs_error": max(loo_errors),
        "per_row": {r.id: round(r.error, 4) for r in loo},
    }
    print(summary)
    write(
        "validation_published",
        {
            "command": "python benchmarks/bench_validation.py",
            "measurements": args.measurements.name,
            **summary,
            "per_row": [r.to_dict() for r in rows],
        },
    )


if __name__ == "__main__":
    main()
