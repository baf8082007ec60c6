"""The block library and its exact solver on the real SmolLM2-135M (issue 49, items 2 and 3).

Builds the library (:func:`~autocompress_opt.prune.block_library.build_block_library`) at the full
hidden size on calibration rows of the built-in data, in the toolkit's ``fast`` compute dtype, and
reports its build time, its size and how far the layers' scores spread for one kind of cut (the
issue: layers of one shape differ 10-60x in how much their cuts hurt). Then, for each demo target,
it solves (:func:`~autocompress_opt.search.inner.block_solver.solve_block_library`) two budgets at
hidden 576 — the feasible uniform point of the bundled space with the most parameters (``plan``) and
an aggressive one at about 40 % of the parent's FFN channels and depth (``aggressive``) — under the
target's engine rules, and measures on fresh selection rows the KL of the answer and of the uniform
model of the same budget (masks over the parent). Writes ``benchmarks/results/block_library.json``.

    PYTHONPATH=.:benchmarks nice -n 19 python benchmarks/bench_block_library.py [--rows 4 --seq-len 64]
        [--scoring replace-one-kl+refit]   (writes block_library_refit.json)

Run from the repository root: the importance and the library are cached under ``.autocompress/``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _util import provenance, write

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.search_space import CHOICES, load_search_space
from autocompress_opt.prune.block_library import BlockLibrary, BlockVariant, build_block_library, library_path
from autocompress_opt.prune.loadability import rules_engine_for, shape_rules
from autocompress_opt.search.inner.block_solver import solve_block_library
from autocompress_opt.search.inner.budget import Budget, CostGoal, exact_violations
from autocompress_opt.serving.costmodel import ArchArrays, estimate_batch
from autocompress_opt.serving.targets import Target, all_satisfied

MODEL = "smollm2-135m"
TARGETS = (("rtx5070", "in-game"), ("rtx5080", "local-coding"), ("h100-sxm", "datacenter"), ("b200", "datacenter"))
CACHE = Path(".autocompress")
HIDDEN = 576


def plan_point(parent: Architecture, target: Target, order: list[int]) -> dict[str, int] | None:
    """The feasible uniform point of the bundled space at hidden 576 with the most parameters."""
    space = load_search_space(MODEL)
    values = [space[c].values if c != "hidden_size" else (HIDDEN,) for c in CHOICES]
    points = [dict(zip(CHOICES, v)) for v in itertools.product(*values)]
    archs = [space.architecture(p, parent, order) for p in points]
    goal = CostGoal.for_target(target, parent)
    metrics = estimate_batch(
        ArchArrays.from_architectures(archs), target.hardware, target.engine_obj(), target.scenario()
    )
    viol = goal.violations(metrics)
    ok = np.all(np.stack([np.asarray(v) <= 0 for v in viol.values()]), axis=0)
    params = np.where(ok, [a.num_params for a in archs], -1)
    best = int(np.argmax(params))
    return points[best] if ok[best] else None


def uniform_variant(arch: Architecture, i: int) -> BlockVariant:
    s = arch.layers[i]
    return BlockVariant(s.num_kv_heads, s.num_heads // s.num_kv_heads if s.attention else 0, s.ffn_width)


def spread_table(lib: BlockLibrary) -> dict[str, Any]:
    """Per-layer scores of four cuts and their spread over layers (max / min)."""
    full = lib.parent.layers[0]
    r = full.num_heads // full.num_kv_heads
    cuts = {
        "skip": BlockVariant(0, 0, 0),
        "drop_attention": BlockVariant(0, 0, full.ffn_width),
        "drop_ffn": BlockVariant(full.num_kv_heads, r, 0),
        "ffn_768": BlockVariant(full.num_kv_heads, r, 768),
        "kv_1x3": BlockVariant(1, r, full.ffn_width),
    }
    out: dict[str, Any] = {}
    for name, v in cuts.items():
        scores = [lib.score(i, v) for i in range(lib.num_layers)]
        positive = [s for s in scores if s > 0]
        out[name] = {
            "per_layer": [round(s, 5) for s in scores],
            "min": min(scores),
            "max": max(scores),
            "max_over_min": max(scores) / min(positive) if positive else None,
            "max_over_median": max(scores) / float(np.median(scores)) if np.median(scores) > 0 else None,
        }
    return out


def masked_kl(
    model: Any, parent: Architecture, importance: Any, arch: Architecture, rows: torch.Tensor, teacher: Any
) -> float:
    from autocompress_opt.prune.masking import apply_masks
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.quality.metrics import log_probs, token_kl

    with apply_masks(model, plan_pruning(parent, importance, arch).masks()), torch.inference_mode():
        return float(token_kl(log_probs(model(input_ids=rows, use_cache=False).logits), teacher).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4, help="calibration rows of the library (default 4)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per row (default 64)")
    parser.add_argument("--eval-rows", type=int, default=4, help="selection rows the answers' KL is measured on")
    parser.add_argument("--scoring", default="replace-one-kl", help="replace-one-kl or replace-one-kl+refit")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from autocompress_opt.data.user import data_batches
    from autocompress_opt.hf.device import resolve_compute_dtype
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.quality.metrics import log_probs
    from autocompress_opt.search.study.weights_trial import TrialConfig, parent_importance

    began = time.perf_counter()
    dtype = resolve_compute_dtype("fast", torch.device("cpu"))
    loaded = load_model(MODEL, dtype=dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    load_s = time.perf_counter() - began
    began = time.perf_counter()
    importance = parent_importance(model, tokenizer, MODEL, TrialConfig(compute_dtype="fast"), CACHE)
    importance_s = time.perf_counter() - began
    rows = data_batches(tokenizer, role="calibration", n_samples=args.rows, seq_len=args.seq_len, seed=0).tokens

    began = time.perf_counter()
    lib, cached = build_block_library(
        model,
        importance,
        rows,
        model_id=MODEL,
        scoring=args.scoring,
        cache_dir=CACHE / "block-library",
        progress=True,
        batch_tokens=4096,
    )
    wall_s = time.perf_counter() - began
    size = library_path(CACHE / "block-library", lib.meta).stat().st_size
    print(
        f"library: {lib.meta.passes} passes, built in {lib.meta.build_seconds:.1f} s "
        f"(this call {wall_s:.1f} s, cached={cached}), {size / 1024:.1f} KiB"
    )
    spread = spread_table(lib)
    for name, s in spread.items():
        print(f"  {name:15s} min {s['min']:.4f} max {s['max']:.4f} max/min {s['max_over_min']}")

    parent = lib.parent
    order = importance.layer_order()
    evals = data_batches(tokenizer, role="selection", n_samples=args.eval_rows, seq_len=args.seq_len, seed=0).tokens
    with torch.inference_mode():
        teacher = log_probs(model(input_ids=evals, use_cache=False).logits)
    targets = []
    for hardware, workload in TARGETS:
        target = Target(hardware, workload)
        goal = CostGoal.for_target(target, parent)
        point = plan_point(parent, target, order)
        budgets: dict[str, dict[str, int]] = {}
        if point is not None:
            budgets["plan"] = point
            aggressive = dict(point, num_layers=max(10, round(0.6 * point["num_layers"])), ffn_width=640)
            budgets["aggressive"] = aggressive
        row: dict[str, Any] = {"hardware": hardware, "workload": workload, "budgets": {}}
        for label, p in budgets.items():
            budget = Budget.from_params(p)
            heads = budget.num_kv_heads * budget.q_per_kv
            rules = shape_rules(rules_engine_for(target.engine_name), parent, hidden_size=HIDDEN, query_heads=heads)
            sol = solve_block_library(lib, budget, goal, rules=rules)
            uniform = load_search_space(MODEL).architecture(p, parent, order)
            u_viol, _ = exact_violations(uniform, budget, goal)
            try:
                u_score = sum(lib.score(i, uniform_variant(uniform, i)) for i in range(parent.num_layers))
            except Exception:  # a width off the library's step (the space steps FFN by 64)
                u_score = None
            entry: dict[str, Any] = {
                "budget": p,
                "rules": None if rules is None else rules.to_dict(),
                "solve_ms": round(sol.seconds * 1e3, 2),
                "rounds": sol.rounds,
                "optimal": sol.optimal,
                "feasible": sol.feasible,
                "violations": sol.violations,
                "library_score": sol.score,
                "uniform_library_score": u_score,
                "uniform_feasible": all_satisfied(u_viol),
                "per_layer": [v.label() for v in sol.variants],
                "uniform_per_layer": [uniform_variant(uniform, i).label() for i in range(parent.num_layers)],
                "params": sol.architecture.num_params,
                "uniform_params": uniform.num_params,
            }
            entry["kl_selection"] = masked_kl(model, parent, importance, sol.architecture, evals, teacher)
            entry["uniform_kl_selection"] = masked_kl(model, parent, importance, uniform, evals, teacher)
            row["budgets"][label] = entry
            print(
                f"{hardware}:{workload} {label} {p}: solved in {entry['solve_ms']} ms ({sol.rounds} rounds, "
                f"optimal={sol.optimal}, feasible={sol.feasible}); library score {sol.score:.3f} vs uniform {u_score}; "
                f"KL on selection rows "
                f"{entry['kl_selection']:.3f} vs uniform {entry['uniform_kl_selection']:.3f}"
            )
            print("  layer " + " ".join(f"{i:>8d}" for i in range(parent.num_layers)))
            print("  block " + " ".join(f"{v:>8s}" for v in entry["per_layer"]))
            print("  unif. " + " ".join(f"{v:>8s}" for v in entry["uniform_per_layer"]))
        targets.append(row)

    write(
        "block_library" if args.scoring == "replace-one-kl" else "block_library_refit",
        {
            "model": MODEL,
            "compute_dtype": str(dtype),
            "library": {
                "rows": args.rows,
                "seq_len": args.seq_len,
                "hidden_size": lib.hidden_size,
                "ffn_step": lib.meta.ffn_step,
                "scoring": lib.meta.scoring,
                "passes": lib.meta.passes,
                "build_seconds": lib.meta.build_seconds,
                "was_cached": cached,
                "bytes": size,
                "variants_per_layer": len(lib.variants(0)),
            },
            "load_s": load_s,
            "importance_s": importance_s,
            "spread": spread,
            "targets": targets,
            "provenance": provenance(data_seed=0),
        },
    )


if __name__ == "__main__":
    main()
