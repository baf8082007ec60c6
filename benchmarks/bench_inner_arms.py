"""Issue 49's ablation of the inner search's arms on the real model, scored on the test split.

For each target (hardware × workload, its engine's shape rules) and each budget (global choices at
the parent's hidden size, so one block library serves every cell: ``light`` keeps about 85 % of the
parent's decoder, ``aggressive`` about 45 %), five arms meet the same budgets and constraints:

* **uniform**: the uniform allocation of the global choices (every kept layer alike; the layers kept
  by importance), the model a Minitron-style cut of those choices gives;
* **importance**: the inner search's importance start (the uniform allocation repaired and filled by
  activation importance per unit of cost), today's start point;
* **block-library**: the exact solver's answer over the per-layer block library (replace-one KL of
  every engine-legal variant of every layer, :mod:`autocompress_opt.prune.block_library`);
* **trained**: today's differentiable search (masks from the importance start, trained, discretised);
* **trained-from-library**: the same search started at the solver's answer (``start_from``).

Each arm is cut from the parent and scored on the **test** rows (``--rows`` per domain, code and
prose: documents no search step reads) by per-row KL to the parent; every arm's difference to
``uniform`` gets a 95 % interval paired over rows (:func:`_h2h_test.differences`). Recorded too: what
each inner search would itself have returned (its choice on its own choice rows), each arm's
per-layer structure, parameters and cost-model metrics, and the seconds of every stage.

Resumable: every finished cell is written at once to ``results/<name>.json`` and skipped by the next
run with the same settings. The library build is cached under ``.autocompress/block_library``.
Run: ``.venv/bin/python benchmarks/bench_inner_arms.py`` (``--help``); on 2 cores in fp32 the library
takes about 15 minutes once, each cell about 4 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _h2h_test import TestRows, differences, summary
from _util import provenance, write
from bench_ablation import _overrides, engine_for

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.prune.slicing import materialize
from autocompress_opt.search.study.weights_trial import (
    TrialConfig,
    _block_library_answer,
    inner_search,
    parent_context,
)
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import Target

MODEL = "smollm2-135m"
CACHE = Path(".autocompress")
RESULTS = Path(__file__).parent / "results"
TARGETS = ("h100-sxm:datacenter", "rtx5070:in-game")
# Global choices at SmolLM2's hidden size (576): one block library for every cell.
BUDGETS = {
    "light": {"num_layers": 26, "hidden_size": 576, "ffn_width": 1280, "num_kv_heads": 3, "q_per_kv": 3},
    "aggressive": {"num_layers": 18, "hidden_size": 576, "ffn_width": 768, "num_kv_heads": 2, "q_per_kv": 3},
}
ARMS = ("uniform", "importance", "block-library", "trained", "trained-from-library")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="hardware:workload list")
    p.add_argument("--budgets", default=",".join(BUDGETS), help=f"budgets, of {', '.join(BUDGETS)}")
    p.add_argument("--rows", type=int, default=16, help="test rows per domain (code, prose)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per test row")
    p.add_argument("--seed", type=int, default=0, help="inner-search seed")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of each interval")
    p.add_argument(
        "--inner",
        default="",
        help="inner-search overrides of the trained arms, key=value,... (e.g. width_step=shared)",
    )
    p.add_argument("--name", default="inner_arms", help="results/<name>.json")
    p.add_argument(
        "--summarise",
        action="store_true",
        help="only recompute the p-values and the Holm correction of an existing results/<name>.json",
    )
    return p.parse_args(argv)


def per_layer(arch: Architecture) -> list[dict[str, int]]:
    """Each parent layer's kept structure: query heads, KV heads, FFN width (0: dropped)."""
    return [
        {
            "heads": layer.num_heads if layer.attention else 0,
            "kv_heads": layer.num_kv_heads if layer.attention else 0,
            "ffn": layer.ffn_width if layer.ffn else 0,
        }
        for layer in arch.layers
    ]


def cell(
    context: Any,
    target: Target,
    params: dict[str, int],
    seed: int,
    test_rows: TestRows,
    n_boot: int,
    inner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The five arms of one (target, budget): searched, cut, scored on the test rows; ``inner``
    overrides the inner search's settings (the data settings stay the defaults)."""
    config = TrialConfig.from_dict(inner or None, seed=seed)
    engine = engine_for(target, "target")
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    solved = _block_library_answer(context, params, target, config, CACHE, engine)
    seconds["library_and_solve"] = time.perf_counter() - began
    extra = {"block-library": solved} if solved is not None else {}
    began = time.perf_counter()
    today = inner_search(context, params, target, config, serve_as=engine, extra=extra)
    seconds["search_from_importance"] = time.perf_counter() - began
    began = time.perf_counter()
    refined = (
        inner_search(context, params, target, config, serve_as=engine, extra=extra, start_from="block-library")
        if solved is not None
        else None
    )
    seconds["search_from_library"] = time.perf_counter() - began
    archs: dict[str, Architecture | None] = {
        "uniform": today.candidates.get("uniform"),
        "importance": today.candidates.get("start"),
        "block-library": solved,
        "trained": today.candidates.get("trained"),
        "trained-from-library": refined.candidates.get("trained") if refined else None,
    }
    arms: dict[str, Any] = {}
    scores: dict[str, Any] = {}
    for name, arch in archs.items():
        if arch is None:
            arms[name] = {"available": False}
            continue
        began = time.perf_counter()
        plan = plan_pruning(context.architecture, context.importance, arch)
        child = materialize(context.model, plan)
        scores[name] = test_rows.score(child)
        del child
        metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
        arms[name] = {
            "available": True,
            "summary": arch.summary(),
            "params": arch.num_params,
            "layers": per_layer(arch),
            "metrics": {k: metrics[k] for k in ("ttft_ms", "tpot_ms", "output_throughput_tok_s") if k in metrics},
            "test": summary(scores[name]),
            "rows": scores[name],
            "score_s": time.perf_counter() - began,
        }
    versus = {
        name: differences([scores[name]], [scores["uniform"]], n_boot=n_boot, seed=0)["kl"]
        for name in scores
        if name != "uniform" and "uniform" in scores
    }
    return {
        "target": f"{target.hardware}:{target.workload}",
        "engine": engine,
        "params": params,
        "seed": seed,
        "arms": arms,
        "vs_uniform_kl": versus,
        "search_chose": {
            "from_importance": today.choice(),
            "from_library": refined.choice() if refined else None,
        },
        "seconds": seconds,
    }


def _kl_runs(arm: dict[str, Any]) -> list[dict[str, list[float]]]:
    """One arm's per-row test KL by domain, as the one run :func:`seeded_bootstrap_p` takes."""
    return [{dom: arm["rows"][dom]["kl"] for dom in ("code", "prose")}]


def corrected(cells: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """Every arm-vs-uniform KL difference of every cell as one family: its two-sided bootstrap
    p-value over the test rows (:func:`seeded_bootstrap_p`, the interval's replicates) and Holm's
    adjustment across the family; ``verdict`` says whether it is resolved at 5 % after correction."""
    from autocompress_opt.tasks.scoring import holm, seeded_bootstrap_p

    raw: dict[str, float] = {}
    for key, c in cells.items():
        uniform = c["arms"].get("uniform", {})
        if not uniform.get("available"):
            continue
        for name, arm in c["arms"].items():
            if name == "uniform" or not arm.get("available"):
                continue
            raw[f"{key}/{name}"] = seeded_bootstrap_p(_kl_runs(arm), _kl_runs(uniform), n_boot=n_boot, seed=0)
    adjusted = holm(raw)
    out = {}
    for comparison, p in raw.items():
        key, _, name = comparison.rpartition("/")
        diff = cells[key]["vs_uniform_kl"][name]["mean"]
        resolved = adjusted[comparison] < 0.05
        verdict = ("arm better" if diff < 0 else "uniform better") if resolved else "not resolved after correction"
        out[comparison] = {"kl_diff": diff, "p": p, "p_holm": adjusted[comparison], "verdict": verdict}
    return {
        "family": len(raw),
        "method": "Holm over every arm-vs-uniform comparison; bootstrap over test rows",
        "comparisons": out,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.summarise:
        path = RESULTS / f"{args.name}.json"
        data = json.loads(path.read_text())
        data["corrected"] = corrected(data["cells"], data["settings"]["n_boot"])
        write(args.name, data)
        for comparison, v in data["corrected"]["comparisons"].items():
            print(f"{comparison}: {v['kl_diff']:+.4f} nats, p {v['p']:.4f}, Holm {v['p_holm']:.4f}: {v['verdict']}")
        return
    unknown = [b for b in args.budgets.split(",") if b not in BUDGETS]
    if unknown:
        raise SystemExit(f"--budgets: {unknown} not among {', '.join(BUDGETS)}")
    targets = [Target(*t.split(":", 1)) for t in args.targets.split(",")]
    path = RESULTS / f"{args.name}.json"
    inner = _overrides(args.inner)
    settings: dict[str, Any] = {"rows": args.rows, "seq_len": args.seq_len, "seed": args.seed, "n_boot": args.n_boot}
    if inner:  # only when given: results written before the option resume as they were
        settings["inner"] = inner
    done: dict[str, Any] = {}
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("settings") == settings:
            done = old.get("cells", {})
    context, _ = parent_context(MODEL, TrialConfig.from_dict(None, seed=args.seed), CACHE)
    test_rows = TestRows(context.model, context.tokenizer, rows=args.rows, seq_len=args.seq_len, seed=0)
    for target in targets:
        for budget in args.budgets.split(","):
            key = f"{target.hardware}:{target.workload}/{budget}"
            if key in done:
                print(f"{key}: done already", flush=True)
                continue
            print(f"{key}: running", flush=True)
            began = time.perf_counter()
            done[key] = {
                "budget": budget,
                **cell(context, target, dict(BUDGETS[budget]), args.seed, test_rows, args.n_boot, inner),
            }
            done[key]["seconds"]["cell"] = time.perf_counter() - began
            line = ", ".join(
                f"{n} {a['test']['kl_to_parent']:.4f}" for n, a in done[key]["arms"].items() if a["available"]
            )
            print(f"{key}: test KL {line}", flush=True)
            write(
                args.name,
                {
                    "benchmark": "inner_arms",
                    **provenance(seed=args.seed),
                    "model": MODEL,
                    "settings": settings,
                    "test_rows": test_rows.record(),
                    "cells": done,
                    "corrected": corrected(done, args.n_boot),
                },
            )


if __name__ == "__main__":
    main()
