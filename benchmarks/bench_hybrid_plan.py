"""The paper's headline case in plan mode: Nemotron 3 Super (120.7B hybrid Mamba-2 + latent MoE) for
one B200 in BF16 at 128K context, timed end to end, with the front of what it found.

    .venv/bin/python benchmarks/bench_hybrid_plan.py            # runs studies/nemotron3-super-b200.yaml
    .venv/bin/python benchmarks/bench_hybrid_plan.py --limit-b 80

Runs ``autocompress study run --config studies/nemotron3-super-b200.yaml`` and ``autocompress plot``
as subprocesses (a fresh study: the old database is moved aside first), times each phase, and writes
``benchmarks/results/nemotron3_super_plan.json``: the wall time, the trial counts, the best feasible
trial, the best feasible trial at or below ``--limit-b`` billion total parameters, and the feasible
trials on the (total parameters, quality) front — each with total and active parameters, peak
memory, TTFT/TPOT and what it keeps per layer kind. ``benchmarks/render.py`` renders the README's
line from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from demo_result import autocompress, code_version, machine, run_phases, study_of

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "nemotron3_super_plan.json"


def point(record: Any) -> dict[str, Any]:
    """One trial as the JSON keeps it."""
    arch = record.arch()
    metrics = record.metrics or {}
    moe = next((layer.moe for layer in arch.layers if layer.moe is not None), None)
    mamba = next((layer.mamba for layer in arch.layers if layer.mamba is not None), None)
    moe_layers = [(i, layer.moe) for i, layer in enumerate(arch.layers) if layer.moe is not None]
    return {
        "trial": record.number,
        "architecture": arch.summary(),
        "params": arch.num_params,
        "active_params": arch.active_params(),
        "layers": arch.num_active_layers,
        "hidden_size": arch.hidden_size,
        "experts": moe.num_experts if moe else None,
        "experts_per_token": moe.experts_per_token if moe else None,
        "expert_width": moe.expert_width if moe else None,
        "mamba_heads": mamba.num_heads if mamba else None,
        # each MoE layer's own sizes (the Puzzle form): [layer, expert width, experts per token]
        "moe_layers": [[i, m.expert_width, m.experts_per_token] for i, m in moe_layers],
        "quality": record.quality,
        "peak_memory_gib": metrics.get("peak_memory_gib"),
        "ttft_ms": metrics.get("ttft_ms"),
        "tpot_ms": metrics.get("tpot_ms"),
    }


def uniform_quality(record: Any, parent: Any) -> float | None:
    """The estimate's quality of the record's point with every MoE layer at the point's own sizes (the
    uniform plan a per-layer trial starts from), or None when the record is not a per-layer plan."""
    from dataclasses import replace

    from autocompress_opt.arch.hybrid import per_layer_moe
    from autocompress_opt.quality.estimate import load_estimate

    arch = record.arch()
    if not per_layer_moe(arch):
        return None
    width, top = int(record.params["expert_width"]), int(record.params["experts_per_token"])
    layers = tuple(
        replace(l, moe=replace(l.moe, expert_width=width, experts_per_token=min(top, l.moe.num_experts)))
        if l.moe is not None
        else l
        for l in arch.layers
    )
    return load_estimate().quality(replace(arch, layers=layers), parent)


def front(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The feasible points no other beats on both fewer parameters and higher quality, by size."""
    keep = [
        p
        for p in points
        if not any(
            q["params"] <= p["params"]
            and q["quality"] >= p["quality"]
            and (q["params"], q["quality"]) != (p["params"], p["quality"])
            for q in points
        )
    ]
    return sorted(keep, key=lambda p: p["params"], reverse=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "studies" / "nemotron3-super-b200.yaml")
    p.add_argument(
        "--limit-b",
        type=float,
        default=80.0,
        help="report the best feasible point at or below this many billion params",
    )
    p.add_argument("--plots", default="plots/")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    name, storage = study_of(args.config)
    db = Path("studies") / f"{name}.db"
    if storage is None and db.exists():  # a fresh study: what is timed is a full run
        db.rename(db.with_suffix(f".db.{int(time.time())}.bak"))
    store = ["--storage", storage] if storage else []
    timings, code = run_phases(
        [
            ("study_run", [autocompress(), "study", "run", "--config", str(args.config)]),
            ("plot", [autocompress(), "plot", name, *store, "--out", args.plots]),
        ]
    )
    if code:
        return code
    from autocompress_opt.search.study.studyio import load_group

    (view,) = load_group(name, storage)
    points = [point(r) for r in view.records if r.feasible]
    for q, r in zip(points, [r for r in view.records if r.feasible], strict=True):
        q["uniform_quality"] = uniform_quality(r, view.parent)
    under = [q for q in points if q["params"] <= args.limit_b * 1e9]
    parent = view.parent
    result = {
        "benchmark": "hybrid_plan",
        "command": "python benchmarks/bench_hybrid_plan.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "code_version": code_version(),
        "machine": machine(),
        "study": name,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "parent": {"params": parent.num_params, "active_params": parent.active_params()} if parent else None,
        "trials": len(view.records),
        "feasible": len(points),
        "limit_params": args.limit_b * 1e9,
        "best": max(points, key=lambda q: q["quality"]) if points else None,
        "best_under_limit": max(under, key=lambda q: q["quality"]) if under else None,
        "front": front(points),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
