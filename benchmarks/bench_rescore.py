"""Rescore a weights study's completed trials on fresh selection rows: does a trial's reported quality
depend on which rows chose its inner-search candidate?

A weights trial's objective is the KL to the parent on its selection rows (``eval_seed`` 0). Before
issue 49 the inner search chose among its candidates on the first 4 of those same rows, so a
heterogeneous trial (whose candidates differ) reported a KL lowered by its own pick, while a uniform
trial (whose candidates are one model) did not. This script measures every completed trial's
architecture again on selection rows no trial read (``eval_seed`` 1, the same count and length) and
reports, per target and for heterogeneous and uniform trials apart, the mean of ``reported − fresh``
KL with a 95 % interval. With clean rows the two groups' gaps agree (both are the rows' own
difficulty); a selection effect shows as a more negative gap for the heterogeneous group.

    .venv/bin/python benchmarks/bench_rescore.py smollm2-weights --storage sqlite:///studies/smollm2-weights.db
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import git_in, import_tree

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "rescore.json"


def _interval(values: list[float]) -> dict[str, float | int]:
    n = len(values)
    mean = statistics.fmean(values) if values else math.nan
    half = 1.959964 * statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="the study group's name (e.g. smollm2-weights)")
    parser.add_argument("--storage", default=None, help="Optuna storage URL (default: studies/<name>.db)")
    parser.add_argument("--fresh-seed", type=int, default=1, help="eval_seed of the fresh selection rows")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    import_tree(HERE.parent)
    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.search.study.studyio import load_group
    from autocompress_opt.search.study.weights_trial import evaluate_architecture

    storage = args.storage or f"sqlite:///studies/{args.study}.db"
    targets: dict[str, Any] = {}
    for view in load_group(args.study, storage):
        inner = dict(view.attrs.get("identity", {}).get("inner") or {})
        workload = view.target.get("workload")
        rows = []
        for record in view.records:
            if record.state != "COMPLETE" or record.architecture is None or record.quality is None:
                continue
            arch = Architecture.from_dict(record.architecture)
            fresh = evaluate_architecture(
                arch, view.attrs.get("identity", {}).get("model") or "smollm2-135m",
                inner={**inner, "eval_seed": args.fresh_seed}, workload=workload,
            )  # fmt: skip
            reported = -math.log(record.quality)
            rows.append(
                {
                    "trial": record.number,
                    "uniform": arch.active().is_uniform,
                    "chosen": (record.selection or {}).get("chosen"),
                    "kl_reported": reported,
                    "kl_fresh": fresh["kl_to_parent"],
                    "gap": reported - fresh["kl_to_parent"],
                }
            )
            print(f"{view.label} trial {record.number}: reported {reported:.4f}, fresh {fresh['kl_to_parent']:.4f}")
        targets[view.label] = {
            "trials": rows,
            "gap_uniform": _interval([r["gap"] for r in rows if r["uniform"]]),
            "gap_heterogeneous": _interval([r["gap"] for r in rows if not r["uniform"]]),
        }
    everything = [r for t in targets.values() for r in t["trials"]]
    record = {
        "benchmark": "rescore",
        "command": " ".join(["python", "benchmarks/bench_rescore.py", *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_in(HERE.parent, "rev-parse", "HEAD") or None,
        "study": args.study,
        "fresh_seed": args.fresh_seed,
        "targets": targets,
        "gap_uniform": _interval([r["gap"] for r in everything if r["uniform"]]),
        "gap_heterogeneous": _interval([r["gap"] for r in everything if not r["uniform"]]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("gap_uniform", "gap_heterogeneous")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
