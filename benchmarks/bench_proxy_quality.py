"""Which points would a weights study's proxy seed, ranked by the importance they keep or by the
per-axis quality estimate? The proxy's points of the compression sweep's cells, scored.

For each (target, budget) of the sweep (``bench_sweep.py``: the budget's constraints and the search
space that follows its baselines), the weights study's proxy
(:class:`~autocompress_opt.search.study.proxy.Proxy`) ranks the space and returns the ``--k`` points a
study would enqueue, once with ``quality="importance"`` (the default: the parent's importance kept)
and once with ``quality="estimate"`` (:mod:`autocompress_opt.quality.estimate`). Each point's uniform
model is then scored as the seeded baselines score their candidates (KL to the parent on the choice
rows; the scores are cached and shared with the studies), beside best-uniform's own score. Writes
``benchmarks/results/proxy_quality.json``.

    .venv/bin/python benchmarks/bench_proxy_quality.py                 # the h100-sxm datacenter budgets
    .venv/bin/python benchmarks/bench_proxy_quality.py --cells rtx5070:in-game/middle/0
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

DEFAULT_CELLS = "h100-sxm:datacenter/light/0,h100-sxm:datacenter/middle/0,h100-sxm:datacenter/aggressive/0"
QUALITIES = ("importance", "estimate")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=DEFAULT_CELLS, help="comma-separated sweep cells (TARGET/BUDGET/SEED)")
    parser.add_argument("--k", type=int, default=4, help="points the proxy enqueues (the study's default)")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)

    import bench_sweep
    from _util import provenance, write

    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.prune.loadability import rules_engine_for
    from autocompress_opt.prune.uniform_grid import UniformCandidate
    from autocompress_opt.search.study.export import trial_parent
    from autocompress_opt.search.study.proxy import Proxy
    from autocompress_opt.search.study.seeding import SeedScoring
    from autocompress_opt.serving.targets import parent_metrics

    began, cells = time.perf_counter(), []
    scratch = tempfile.mkdtemp(prefix="proxy-quality-")
    for key in args.cells.split(","):
        cell = bench_sweep.Cell.parse(key)
        target = bench_sweep.budget_target(cell)
        context, _ = trial_parent(bench_sweep.MODEL, {}, cache_dir=bench_sweep.CACHE, workload=target.workload)
        parent = context.architecture
        seeding = SeedScoring(bench_sweep.study_config(cell.seed, target))
        importance, score = seeding(target)
        where = Path(scratch) / f"{cell.group}.yaml"  # the budget's space, as the sweep writes it
        chosen = bench_sweep.baselines_and_space(target, parent, (importance, score), where)
        best = chosen["best_uniform"]
        space = load_search_space(where)
        order = importance.layer_order()
        record: dict[str, Any] = {
            "cell": cell.key,
            "constraints": dict(target.constraints),
            "best_uniform": {"point": best.point, "kl": best.result.score},
        }
        for quality in QUALITIES:
            proxy = Proxy(
                parent,
                space,
                target,
                parent_metrics(parent, target),
                serve_as=rules_engine_for(target.engine_name),
                importance=importance,
                quality=quality,
            )
            points = []
            for ranked in proxy.rank(args.k, seed=cell.seed):
                candidate = UniformCandidate.build(ranked.point, parent, order)
                points.append({"point": ranked.point, "kl": round(float(score(candidate.architecture)), 4)})
            kls = [p["kl"] for p in points]
            record[quality] = {
                "points": points,
                "best_kl": min(kls) if kls else None,
                "median_kl": statistics.median(kls) if kls else None,
                "within_0_5_nats_of_best_uniform": sum(k <= best.result.score + 0.5 for k in kls),
            }
            print(f"{cell.key} {quality}: {kls} (best-uniform {best.result.score:.4f})", flush=True)
        seeding.release()
        cells.append(record)
    shutil.rmtree(scratch, ignore_errors=True)
    write(
        "proxy_quality",
        {
            "benchmark": "proxy_quality",
            "k": args.k,
            "cells": cells,
            "seconds": round(time.perf_counter() - began, 1),
            "provenance": provenance(bootstrap=0),
        },
        args.results,
    )


if __name__ == "__main__":
    main()
