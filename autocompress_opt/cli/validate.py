"""``autocompress validate``: predicted vs published measurements, per row."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_verb, check_output_file, print_json, table
from autocompress_opt.errors import ConfigError


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "validate",
        "Compare cost-model predictions with measurements (CSV in the columns of "
        "shared/reference/measurements.csv): prediction, measurement, error, roofline bound.",
        """
  autocompress validate                                 # the shipped published measurements
  autocompress validate --measurements mine.csv --json
  autocompress validate --held-out                      # each source predicted by profiles fitted without it
  autocompress validate --fit --out autocompress_opt/data/profiles/published.yaml   # refit engine profiles""",
    )
    p.add_argument("--measurements", type=Path, default=None, help="CSV of measurements (default: the shipped file)")
    p.add_argument("--fit", action="store_true", help="first fit one profile per engine to these rows")
    p.add_argument("--out", type=Path, default=None, help="with --fit: where to write the fitted profiles (YAML)")
    p.add_argument(
        "--held-out",
        action="store_true",
        help="predict each row with its engine's profile refitted without the row's whole source (the "
        "publication it came from): out-of-sample errors, per row and per model family (about 2 minutes)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.serving.profiles import clear_cache, save_profile
    from autocompress_opt.serving.validation import (
        SEGMENTS,
        SHIPPED_MEASUREMENTS,
        family_of,
        fit_published,
        is_moe,
        leave_one_source_out,
        load_measurements,
        validate,
    )

    source = args.measurements or SHIPPED_MEASUREMENTS
    if args.out is not None:
        if not args.fit:
            raise ConfigError(f"--out {str(args.out)!r} is where --fit writes the fitted profiles; add --fit")
        check_output_file(args.out)
    if args.held_out and args.fit:
        raise ConfigError("--held-out refits a profile per held-out source itself; drop --fit (or --held-out)")
    if source.is_file():
        try:
            source.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"measurements file {str(source)!r} is not UTF-8 text: {exc}") from None
    rows = load_measurements(source)
    if args.fit:
        profiles = fit_published(rows)
        if args.out:
            save_profile(
                args.out,
                profiles,
                header=f"Engine-wide profiles fitted to {source.name} by 'autocompress validate --fit'.",
            )
            clear_cache()
        results = []
        for prof in profiles:
            results += validate([r for r in rows if r[0].engine.name == prof.engine], prof)
    elif args.held_out:
        results = leave_one_source_out(rows)
    else:
        results = validate(rows)
    # Beside each row, AIConfigurator's per-layer price where the optional backend is installed and
    # can express the row (serving/aic.py); without the extra the output is as before.
    aic = _aic_predictions(rows)
    if args.json:
        print_json([{**r.to_dict(), **_aic_fields(aic, r)} for r in results])
        return 0
    body = [
        [
            r.id,
            r.model,
            r.hardware,
            r.engine,
            r.metric,
            f"{r.predicted:,.2f}",
            f"{r.measured:,.2f}",
            f"{r.error:+.1%}",
            f"{r.bound:,.2f}",
            "ok" if r.bound_ok else "VIOLATED",
            *(
                [f"{aic[r.id]:,.2f}", f"{aic[r.id] / r.measured - 1:+.1%}"]
                if r.id in aic
                else ["—", "—"]
                if aic
                else []
            ),
        ]
        for r in results
    ]
    head = ["id", "model", "hardware", "engine", "metric", "predicted", "measured", "error", "bound", "bound"]
    print(table(body, head + (["aic", "aic error"] if aic else [])))
    errors = [abs(r.error) for r in results]
    kind = "held-out median |error|" if args.held_out else "median |error|"
    if errors:
        print(
            f"\n{len(errors)} rows: {kind} {statistics.median(errors):.1%}, max {max(errors):.1%}; "
            f"bounds respected: {sum(r.bound_ok for r in results)}/{len(results)}"
        )
    # Per model family: the engine profiles' dense parameters are fitted to the dense rows and their
    # routed_passes to the MoE/hybrid rows; --held-out says how far each carries to a source it never saw.
    # Dense and MoE/hybrid rows apart (each kind's profile parameters are fitted on that kind's rows).
    moe = {obs.label for obs, _ in rows if is_moe(obs)}
    for label, want in (("dense", False), ("MoE/hybrid", True)):
        mine = [abs(r.error) for r in results if (r.id in moe) == want]
        if mine:
            print(f"{label:<17} {len(mine):>3} rows: {kind} {statistics.median(mine):.1%}, max {max(mine):.1%}")
    # Datacenter and consumer rows apart (issue 45): consumer GPUs and llama.cpp keep the own calibrated
    # model, so a gain on the datacenter rows must not average away a loss on them.
    for segment in SEGMENTS:
        mine = [abs(r.error) for r in results if r.segment == segment]
        if mine:
            print(f"{segment:<24} {len(mine):>3} rows: {kind} {statistics.median(mine):.1%}, max {max(mine):.1%}")
    if aic:
        _print_side_by_side(results, aic, kind)
    families = {obs.label: family_of(obs) for obs, _ in rows}
    for family in sorted({families[r.id] for r in results}):
        mine = [abs(r.error) for r in results if families[r.id] == family]
        median, worst = statistics.median(mine), max(mine)
        print(f"family {family:<12} {len(mine):>3} rows: {kind} {median:.1%}, max {worst:.1%}")
    _print_publications(results, moe, kind)
    return 0


def _print_publications(results: Any, moe: set[str], kind: str) -> None:
    """Each source's median |error|, dense and MoE/hybrid rows apart, and the median of those
    medians: a long sweep from one publication counts once, as one publication."""
    from autocompress_opt.serving.validation import median_of_medians, per_publication

    publications = per_publication(results, moe)
    if not publications:
        return
    print(f"\nper publication ({kind}):")
    for p in publications:
        label = "MoE/hybrid" if p.moe else "dense"
        source = p.source if len(p.source) <= 88 else p.source[:85] + "..."
        print(f"  {label:<10} {p.rows:>3} rows  median {p.median:6.1%}  max {p.worst:6.1%}  {source or '(no source)'}")
    for label, want in (("dense", False), ("MoE/hybrid", True)):
        value = median_of_medians(publications, want)
        if value is not None:
            n = sum(p.moe == want for p in publications)
            print(f"{label:<17} median of {n} publication medians: {value:.1%}")


def _aic_predictions(rows: Any) -> dict[str, float]:
    """Row label -> AIConfigurator's prediction; empty when the ``aic`` extra is not installed."""
    from autocompress_opt.serving import aic

    return aic.predict_rows(rows) if aic.aic_installed() else {}


def _aic_fields(aic: dict[str, float], row: Any) -> dict[str, float | None]:
    if not aic:
        return {}
    value = aic.get(row.id)
    return {"aic_predicted": value, "aic_error": None if value is None else value / row.measured - 1}


def _print_side_by_side(results: Any, aic: dict[str, float], kind: str) -> None:
    """Median |error| of both models on the rows both express, in all and per engine and hardware."""
    both = [r for r in results if r.id in aic]
    groups = [("rows both express", both)]
    groups += [(f"engine {e}", [r for r in both if r.engine == e]) for e in sorted({r.engine for r in both})]
    groups += [(f"hardware {h}", [r for r in both if r.hardware == h]) for h in sorted({r.hardware for r in both})]
    for label, mine in groups:
        own = statistics.median(abs(r.error) for r in mine)
        theirs = statistics.median(abs(aic[r.id] / r.measured - 1) for r in mine)
        closer = sum(abs(aic[r.id] / r.measured - 1) < abs(r.error) for r in mine)
        print(f"{label:<17} {len(mine):>3} rows: own {kind} {own:.1%}, aic {theirs:.1%} (aic closer on {closer})")
