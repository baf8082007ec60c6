"""Shipped engine profiles vs published measurements: in-sample and leave-one-source-out errors per
engine and per arrival regime, and the roofline check of every row.

Each engine's profile is refitted to the dense rows of that engine (the shipped fit), and, for the
held-out errors, refitted without each publication in turn (rows sharing a ``source`` are left out
together) and scored on the rows it did not see. The mixture-of-experts and hybrid Mamba-2 rows fit
one parameter per engine, ``routed_passes`` (how many times a routed (token, expert) pair's
activations cross memory), with the dense parameters held, inside the same leave-one-source-out loop:
a held-out publication's MoE rows never fit it, nor do other publications' rows of the same
(model, device, engine), and an engine left without MoE rows takes every other engine's. Their
errors are reported per model family under ``moe_hybrid``, per publication under
``per_publication`` with the median of the publications' medians, and the fitted values per fold
under ``routed_passes``. Free parameters stay below each profile's row count
(``serving.validation.free_parameters``).

The weight-only experts' dequantisation term (``roofline.DEQUANT_OPS_PER_ELEMENT``, set from the
kernels, not fitted) is also scored at other values under ``dequant_sensitivity``: what the MoE/hybrid
publications' held-out medians would be had another value been chosen (``--no-sensitivity`` skips it).

.venv/bin/python benchmarks/bench_validation.py [--measurements CSV]   # ~7 min on 2 CPU threads
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import provenance, write

from autocompress_opt.serving import roofline
from autocompress_opt.serving.profiles import time_ratio
from autocompress_opt.serving.validation import (
    SHIPPED_MEASUREMENTS,
    ValidationRow,
    family_of,
    fit_published,
    is_moe,
    leave_one_source_out,
    load_measurements,
    median_of_medians,
    per_publication,
    validate,
)


def summary(rows: Sequence[ValidationRow]) -> dict[str, float | int]:
    """Median and max |relative error|; ``optimistic_rows``: rows whose predicted time is below the
    measured one (a throughput over-predicted, a latency under-predicted)."""
    errors = [abs(r.error) for r in rows]
    return {
        "rows": len(rows),
        "median_abs_error": round(statistics.median(errors), 4),
        "max_abs_error": round(max(errors), 4),
        "optimistic_rows": sum(time_ratio(r.metric, r.measured, r.predicted) > 1 for r in rows),
    }


def table(
    in_sample: Sequence[ValidationRow],
    held_out: Sequence[ValidationRow],
    key: str,
    families: dict[str, str] | None = None,
) -> dict[str, dict]:
    """Errors grouped by ``key`` (``engine``, ``regime``, ``engine/regime`` or ``family``: the
    model family, from ``families`` row id → family)."""

    def group(row: ValidationRow) -> str:
        return "/".join((families or {})[row.id] if part == "family" else getattr(row, part) for part in key.split("/"))

    out = {}
    for name in sorted({group(r) for r in in_sample}):
        out[name] = {
            "in_sample": summary([r for r in in_sample if group(r) == name]),
            "held_out": summary([r for r in held_out if group(r) == name]),
        }
    return out


SENSITIVITY_OPS = (0.0, 1.0, 2.0, 4.0)


def dequant_sensitivity(rows: list, moe: set[str], shipped_held: list[ValidationRow]) -> dict:
    """Held-out MoE/hybrid errors with ``roofline.DEQUANT_OPS_PER_ELEMENT`` at each of
    :data:`SENSITIVITY_OPS` (0: the term off), the shipped value marked: per publication, the median
    of their medians, the pooled row median and the dense median of medians (which must not move).
    ``shipped_held``: the held-out rows :func:`main` already scored at the shipped value (not redone)."""
    shipped = roofline.DEQUANT_OPS_PER_ELEMENT
    out = []
    try:
        for ops in SENSITIVITY_OPS:
            roofline.DEQUANT_OPS_PER_ELEMENT = ops
            held = shipped_held if ops == shipped else leave_one_source_out(rows)
            pubs = per_publication(held, moe)
            out.append(
                {
                    "ops_per_element": ops,
                    "shipped": ops == shipped,
                    "moe_median_of_publication_medians": median_of_medians(pubs, moe=True),
                    "dense_median_of_publication_medians": median_of_medians(pubs, moe=False),
                    "moe_row_median": summary([r for r in held if r.id in moe])["median_abs_error"],
                    "moe_publications": {p.source: p.median for p in pubs if p.moe},
                }
            )
            median = out[-1]["moe_median_of_publication_medians"]
            print(f"dequant ops/element {ops:g}: MoE median of publication medians {median:.1%}")
    finally:
        roofline.DEQUANT_OPS_PER_ELEMENT = shipped
    return {"tile_tokens": roofline.DEQUANT_TILE_TOKENS, "shipped_ops_per_element": shipped, "rows": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measurements", type=Path, default=SHIPPED_MEASUREMENTS)
    parser.add_argument(
        "--no-sensitivity", action="store_true", help="skip rescoring at other dequantisation costs (~1.5 min each)"
    )
    args = parser.parse_args()
    rows = load_measurements(args.measurements)
    profiles = {p.engine: p for p in fit_published(rows, holdout=False)}
    in_sample = [r for obs, src in rows for r in validate([(obs, src)], profiles[obs.engine.name])]
    held_out = leave_one_source_out(rows)
    for fit, out in zip(in_sample, held_out):
        print(
            f"{fit.id:<6} {fit.engine:<9} {fit.regime:<8} {fit.metric:<25} measured {fit.measured:>11,.2f} "
            f"fit {fit.error:+7.1%} held-out {out.error:+7.1%} bound {fit.bound:>11,.2f} "
            f"{'ok' if fit.bound_ok else 'VIOLATED'}"
        )
    families = {obs.label: family_of(obs) for obs, _ in rows}
    moe = {obs.label for obs, _ in rows if is_moe(obs)}
    publications = per_publication(held_out, moe)
    split = {
        kind: ([r for r in in_sample if (r.id in moe) == want], [r for r in held_out if (r.id in moe) == want])
        for kind, want in (("dense", False), ("moe_hybrid", True))
    }
    result = {
        "command": "python benchmarks/bench_validation.py",
        "measurements": args.measurements.name,
        # "overall" is the dense rows' score; the MoE/hybrid rows fit only routed_passes (0 for a dense row).
        "overall": {"in_sample": summary(split["dense"][0]), "held_out": summary(split["dense"][1])},
        "moe_hybrid": {
            "overall": {"in_sample": summary(split["moe_hybrid"][0]), "held_out": summary(split["moe_hybrid"][1])},
            "by_family": table(*split["moe_hybrid"], "family", families),
        }
        if moe
        else None,
        "all_rows": {"in_sample": summary(in_sample), "held_out": summary(held_out)},
        "by_family": table(in_sample, held_out, "family", families),
        "by_engine": table(*split["dense"], "engine"),
        "by_regime": table(*split["dense"], "regime"),
        "by_engine_and_regime": table(*split["dense"], "engine/regime"),
        "all_bounds_ok": all(r.bound_ok for r in in_sample),  # every row, MoE/hybrid too
        "free_parameters": {e: list(p.fit["free"]) for e, p in profiles.items()},
        # routed_passes fitted to each engine's MoE/hybrid rows: all of them (the shipped fit), and per
        # held-out publication the value fitted without it (its fold).
        "routed_passes": {
            e: {
                "all_moe_rows": p.routed_passes,
                "folds": {r.source: r.routed_passes for r in held_out if r.id in moe and r.engine == e},
            }
            for e, p in profiles.items()
        },
        # One figure per publication (a long sweep weighs as much as a one-row table), held out.
        "per_publication": [vars(p) for p in publications],
        "median_of_publication_medians": {
            "dense": median_of_medians(publications, moe=False),
            "moe_hybrid": median_of_medians(publications, moe=True),
        },
        "dequant_sensitivity": None if args.no_sensitivity else dequant_sensitivity(rows, moe, held_out),
        "per_row": [
            {**fit.to_dict(), "held_out_predicted": out.predicted, "held_out_error": out.error}
            for fit, out in zip(in_sample, held_out)
        ],
        "provenance": provenance(),
    }
    for name, groups in (("engine", result["by_engine"]), ("regime", result["by_regime"])):
        for key, value in groups.items():
            fit, out = value["in_sample"], value["held_out"]
            print(
                f"{name} {key:<9} rows {fit['rows']:>3}  in-sample MdAPE {fit['median_abs_error']:.1%}  "
                f"held-out MdAPE {out['median_abs_error']:.1%}"
            )
    print(f"overall: {result['overall']}")
    write("validation_published", result)


if __name__ == "__main__":
    main()
