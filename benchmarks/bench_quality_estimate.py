"""Fit plan mode's quality estimate on measured KL and check it (issue 44, item 3).

Measures, on the real parent (SmolLM2-135M), the KL of its uniform children to it on the selection
split's choice rows, scored exactly as the seeded baselines score their candidates
(:class:`~autocompress_opt.search.study.seeding.SeedScoring`; the scores are cached on disk and
shared with the studies): single-axis cuts (depth, hidden, FFN, KV heads, query heads per group)
and random mixed points of the uniform grid. The expert axes come from the real-weights MoE made
from the same model (``benchmarks/results/moe_axes.json``: experts kept, expert width, experts per
token, KL to the MoE on the test split).

Then :func:`~autocompress_opt.quality.estimate.fit_estimate` is fitted on the single-axis rows and
half of the mixed ones, and judged on the other half (Spearman's rank correlation with measured KL,
95 % bootstrap interval over those rows), beside the stand-in plan mode used so far (the fraction of
parameters kept) and the weights study's proxy (the importance kept); the expert axes leave one MoE
child out at a time. A last check ranks the
published single-axis sensitivities of Qwen3-30B-A3B before distillation (ModelOpt's Minitron PR
#467, MMLU, base 0.787) by the estimate. The fit on every row is written to
``autocompress_opt/data/quality_estimate.json`` (what plan mode's ``--plan-quality estimate``
reads) and the whole record to ``benchmarks/results/quality_estimate.json``.

    .venv/bin/python benchmarks/bench_quality_estimate.py            # ~15 min on 2 cores, cold cache
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

MODEL = "smollm2-135m"
TARGET = "h100-sxm:datacenter"  # the scorer's data (the built-in text of this workload); no constraint is used
CACHE = Path(".autocompress")
SINGLE = {  # one axis cut at a time, the others at the parent's
    "num_layers": (26, 22, 18, 14),
    "hidden_size": (512, 448, 384),
    "ffn_width": (1280, 1024, 768, 512),
    "num_kv_heads": (2, 1),
    "q_per_kv": (2, 1),
}
# Qwen3-30B-A3B before distillation (ModelOpt Minitron PR #467), MMLU of the parent 0.787.
PUBLISHED = {
    "base": 0.787,
    "source": "NVIDIA ModelOpt, Minitron pruning of Qwen3-30B-A3B, PR #467 (MMLU before distillation)",
    "cuts": [
        {"what": "experts 128 -> 96", "cuts": {"experts": 0.25}, "mmlu": 0.740},
        {"what": "layers 48 -> 40", "cuts": {"depth": 8 / 48}, "mmlu": 0.652},
        {"what": "expert FFN 768 -> 512", "cuts": {"expert_width": 1 / 3}, "mmlu": 0.630},
        {"what": "hidden 2048 -> 1536", "cuts": {"hidden": 0.25}, "mmlu": 0.436},
    ],
}
N_BOOT = 2000


def ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties: their mean rank
        r[x == v] = r[x == v].mean()
    return r


def spearman(a: Any, b: Any) -> float:
    ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def spearman_ci(a: Any, b: Any, seed: int = 0) -> dict[str, Any]:
    """Spearman's rho with a 95 % percentile bootstrap interval over the rows."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    rng = np.random.default_rng(seed)
    boot = [spearman(a[i], b[i]) for i in (rng.integers(0, len(a), len(a)) for _ in range(N_BOOT))]
    boot = [x for x in boot if math.isfinite(x)]
    return {
        "rho": round(spearman(a, b), 4),
        "ci95": [round(float(np.percentile(boot, 2.5)), 4), round(float(np.percentile(boot, 97.5)), 4)],
        "n": len(a),
    }


def paired_difference(a: Any, b: Any, truth: Any, seed: int = 0) -> dict[str, Any]:
    """rho(a, truth) − rho(b, truth) with a 95 % bootstrap interval, the rows resampled together."""
    a, b, truth = (np.asarray(x, float) for x in (a, b, truth))
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(N_BOOT):
        i = rng.integers(0, len(a), len(a))
        d = spearman(a[i], truth[i]) - spearman(b[i], truth[i])
        if math.isfinite(d):
            diffs.append(d)
    return {
        "diff": round(spearman(a, truth) - spearman(b, truth), 4),
        "ci95": [round(float(np.percentile(diffs, 2.5)), 4), round(float(np.percentile(diffs, 97.5)), 4)],
    }


def points(parent: Any, mixed: int, seed: int) -> list[dict[str, Any]]:
    """The single-axis points, then ``mixed`` random points of the uniform grid (every axis cut with
    probability one half, to a value drawn from its grid's upper half), distinct."""
    from autocompress_opt.arch.search_space import CHOICES
    from autocompress_opt.prune.uniform_grid import grid_values

    grid = grid_values(parent)
    full = {c: max(grid[c]) for c in CHOICES}
    out = [
        {"kind": "single", "axis": name, "point": {**full, name: v}} for name, values in SINGLE.items() for v in values
    ]
    rng, seen = random.Random(seed), {json.dumps(p["point"], sort_keys=True) for p in out}
    floors = {"num_layers": 12, "hidden_size": 384, "ffn_width": 384, "num_kv_heads": 1, "q_per_kv": 1}
    while len(out) < sum(map(len, SINGLE.values())) + mixed:
        point = {
            c: rng.choice([v for v in grid[c] if v >= floors[c]]) if rng.random() < 0.5 else full[c] for c in CHOICES
        }
        key = json.dumps(point, sort_keys=True)
        if point != full and key not in seen:
            seen.add(key)
            out.append({"kind": "mixed", "point": point})
    return out


def moe_rows(path: Path) -> list[dict[str, Any]]:
    """The real-weights MoE's children (``moe_axes.json``) as cut rows: 8 experts × 192 wide, top-4."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = []
    for name, child in data["children"].items():
        p = child["point"]
        cuts = {
            "experts": 1 - p.get("num_experts", 8) / 8,
            "expert_width": 1 - p.get("expert_width", 192) / 192,
            "experts_per_token": 1 - p.get("experts_per_token", 4) / 4,
        }
        rows.append({"name": name, "cuts": cuts, "kl": child["kl_to_moe"]})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixed", type=int, default=40, help="random mixed points of the uniform grid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--no-ship", action="store_true", help="do not write the package's quality_estimate.json")
    args = parser.parse_args(argv)

    import bench_sweep
    from _util import provenance, write

    from autocompress_opt._data import DATA_DIR
    from autocompress_opt.prune.uniform_grid import UniformCandidate
    from autocompress_opt.quality.estimate import ESTIMATE_FILE, axis_cuts, fit_estimate
    from autocompress_opt.search.study.seeding import SeedScoring
    from autocompress_opt.search.study.trials import plan_quality
    from autocompress_opt.serving.targets import Target

    began = time.perf_counter()
    hardware, workload = TARGET.split(":")
    target = Target(hardware, workload)
    seeding = SeedScoring(bench_sweep.study_config(args.seed, target))
    importance, score = seeding(target)
    from autocompress_opt.search.study.export import trial_parent

    context, _ = trial_parent(MODEL, {}, cache_dir=CACHE, workload=workload)
    parent = context.architecture
    order = importance.layer_order()
    measured = []
    todo = points(parent, args.mixed, args.seed)
    for i, item in enumerate(todo, 1):
        candidate = UniformCandidate.build(item["point"], parent, order)
        kl = float(score(candidate.architecture))
        measured.append(
            {
                **item,
                "kl": round(kl, 5),
                "params_kept": round(candidate.num_params / parent.num_params, 5),
                # the weights study's proxy ranks points by this (plan_quality with the parent's importance)
                "importance_kept": round(plan_quality(candidate.architecture, parent, importance)[0], 5),
                "cuts": {k: round(v, 5) for k, v in axis_cuts(candidate.architecture, parent).items() if v},
            }
        )
        print(f"[{i}/{len(todo)}] {candidate.label()}: KL {kl:.4f}", flush=True)
    seeding.release()

    moe = moe_rows(args.results / "moe_axes.json")
    mixed = [m for m in measured if m["kind"] == "mixed"]
    fit_rows = [m for m in measured if m["kind"] == "single"] + mixed[0::2]
    held = mixed[1::2]
    dense_source = f"{MODEL}: {len(measured)} uniform children, KL to the parent on the selection split's choice rows"
    moe_source = "the real-weights MoE from SmolLM2-135M (8 experts x 192, top-4): 8 children, KL to it (moe_axes.json)"
    fitted = fit_estimate(
        [(m["cuts"], m["kl"]) for m in fit_rows] + [(r["cuts"], r["kl"]) for r in moe],
        fitted_on=(dense_source + " (fit half)", moe_source),
    )
    est, params, kept, kl = (
        [fitted.kl_of_cuts(m["cuts"]) for m in held],
        [-m["params_kept"] for m in held],  # plan mode's stand-in: more parameters kept, lower KL expected
        [-m["importance_kept"] for m in held],  # the weights study's proxy: more importance kept
        [m["kl"] for m in held],
    )
    judged = {
        "estimate": spearman_ci(est, kl),
        "params_kept": spearman_ci(params, kl),
        "importance_kept": spearman_ci(kept, kl),
        "estimate_minus_params_kept": paired_difference(est, params, kl),
        "estimate_minus_importance_kept": paired_difference(est, kept, kl),
    }
    loo = []
    for i, r in enumerate(moe):
        rest = [(x["cuts"], x["kl"]) for j, x in enumerate(moe) if j != i]
        loo.append(fit_estimate(rest).kl_of_cuts(r["cuts"]))
    moe_active = json.loads((args.results / "moe_axes.json").read_text(encoding="utf-8"))["children"]
    moe_check = {
        "estimate_leave_one_out": spearman_ci(loo, [r["kl"] for r in moe]),
        "active_params": spearman_ci([-moe_active[r["name"]]["active_params"] for r in moe], [r["kl"] for r in moe]),
        "rows": [{**r, "kl_loo": round(p, 4)} for r, p in zip(moe, loo)],
    }
    final = fit_estimate(
        [(m["cuts"], m["kl"]) for m in measured] + [(r["cuts"], r["kl"]) for r in moe],
        fitted_on=(dense_source, moe_source),
    )
    published = [
        {**c, "drop": round(PUBLISHED["base"] - c["mmlu"], 3), "estimate_kl": round(final.kl_of_cuts(c["cuts"]), 4)}
        for c in PUBLISHED["cuts"]
    ]
    record = {
        "benchmark": "quality_estimate",
        "model": MODEL,
        "scorer": "seeded baselines' candidate score (SeedScoring), data of " + TARGET,
        "measured": measured,
        "moe": moe_check,
        "fit_half": {
            "estimate": fitted.to_dict(),
            "held_out_rows": len(held),
            "spearman_held_out": judged,
        },
        "estimate": final.to_dict(),
        "published": {
            "source": PUBLISHED["source"],
            "base": PUBLISHED["base"],
            "cuts": published,
            "spearman_drop_vs_estimate": round(
                spearman([c["drop"] for c in published], [c["estimate_kl"] for c in published]), 4
            ),
        },
        "seconds": round(time.perf_counter() - began, 1),
        "provenance": provenance(seed=args.seed, bootstrap=0),
    }
    write("quality_estimate", record, args.results)
    if not args.no_ship:
        path = DATA_DIR / ESTIMATE_FILE
        shipped = json.loads(path.read_text(encoding="utf-8"))
        # the layer profiles are fit_layer_profile.py's, not this fit's: keep them
        kept = {"layer_profiles": shipped["layer_profiles"]} if "layer_profiles" in shipped else {}
        path.write_text(json.dumps({**final.to_dict(), **kept}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {DATA_DIR / ESTIMATE_FILE}")
    print(json.dumps({"held_out": judged, "moe": {k: v for k, v in moe_check.items() if k != "rows"}}, indent=1))
    print(json.dumps(record["published"], indent=1))


if __name__ == "__main__":
    main()
