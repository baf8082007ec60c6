"""``autocompress plot``: Pareto fronts and per-layer structure of studies."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_verb, check_output_dir


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "plot",
        "Plot Pareto fronts (quality vs TTFT, TPOT, throughput, memory; one curve per "
        "hardware target, infeasible points apart) and the per-layer structure of each target's best "
        "feasible architecture beside the parent. Writes PNG and SVG.",
        """
  autocompress plot demo
  autocompress plot demo other --out plots/ --storage sqlite:///studies/demo.db""",
    )
    p.add_argument("names", nargs="+", metavar="NAME", help="study group name(s)")
    p.add_argument("--storage", help="storage URL (default sqlite:///studies/NAME.db per name)")
    p.add_argument("--out", type=Path, default=Path("plots"), help="output directory (default plots/)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study.plots import plot_pareto, plot_structure
    from autocompress_opt.search.study.studyio import load_group, quality_label_of
    from autocompress_opt.search.study.trials import quality_label

    check_output_dir(args.out)
    written = []
    for name in args.names:
        views = load_group(name, args.storage)
        studies = [{"label": v.label, "records": v.records, "parent": v.attrs.get("parent_metrics")} for v in views]
        quality = quality_label_of(r for v in views for r in v.records)
        written += plot_pareto(studies, args.out / f"{name}-pareto", title=f"Study '{name}': {quality} vs serving cost")
        for view in views:
            best, parent = view.best_feasible(), view.parent
            arch = best.arch() if best is not None else None
            if best is not None and parent is not None and arch is not None:
                written += plot_structure(
                    arch,
                    parent,
                    args.out / f"{view.name}-structure",
                    title=f"{view.label}: best feasible trial #{best.number} "
                    f"({quality_label(best.quality_kind)} {best.quality:.3f})\n{arch.summary()}",
                )
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
