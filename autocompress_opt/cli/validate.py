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
  autocompress validate --fit --out autocompress_opt/data/profiles/published.yaml   # refit engine profiles""",
    )
    p.add_argument("--measurements", type=Path, default=None, help="CSV of measurements (default: the shipped file)")
    p.add_argument("--fit", action="store_true", help="first fit one profile per engine to these rows")
    p.add_argument("--out", type=Path, default=None, help="with --fit: where to write the fitted profiles (YAML)")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.serving.profiles import clear_cache, save_profile
    from autocompress_opt.serving.validation import (
        SHIPPED_MEASUREMENTS,
        family_of,
        fit_published,
        load_measurements,
        validate,
    )

    source = args.measurements or SHIPPED_MEASUREMENTS
    if args.out is not None:
        if not args.fit:
            raise ConfigError(f"--out {str(args.out)!r} is where --fit writes the fitted profiles; add --fit")
        check_output_file(args.out)
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
    else:
        results = validate(rows)
    if args.json:
        print_json([r.to_dict() for r in results])
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
        ]
        for r in results
    ]
    print(
        table(body, ["id", "model", "hardware", "engine", "metric", "predicted", "measured", "error", "bound", "bound"])
    )
    errors = [abs(r.error) for r in results]
    if errors:
        print(
            f"\n{len(errors)} rows: median |error| {statistics.median(errors):.1%}, max {max(errors):.1%}; "
            f"bounds respected: {sum(r.bound_ok for r in results)}/{len(results)}"
        )
    # Per model family: the engine profiles are fitted to dense rows, so the MoE/hybrid families'
    # errors say how far the roofline's expert and Mamba-2 terms carry without a parameter of their own.
    families = {obs.label: family_of(obs) for obs, _ in rows}
    for family in sorted({families[r.id] for r in results}):
        mine = [abs(r.error) for r in results if families[r.id] == family]
        median, worst = statistics.median(mine), max(mine)
        print(f"family {family:<12} {len(mine):>3} rows: median |error| {median:.1%}, max {worst:.1%}")
    return 0
