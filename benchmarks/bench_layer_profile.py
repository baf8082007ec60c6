"""Does the quality estimate's layer profile place per-layer cuts better than a uniform cut? Measured
on real weights, on the test split, for the model the profile was measured on and for one it was not.

    .venv/bin/python benchmarks/bench_layer_profile.py                          # SmolLM2-135M (in sample)
    .venv/bin/python benchmarks/bench_layer_profile.py --model gemma3-270m --rows 16   # another model

Plan mode's per-layer allotment (``--plan-quality estimate-per-layer``,
``autocompress_opt/quality/allocate.py``) moves each layer's cut by the estimate's ``ffn`` layer
profile, SmolLM2-135M's replace-one KL by relative depth. This benchmark checks that on dense FFN
widths, the axis the profile was measured on: at each fraction of the parent's FFN channels kept,
three children of equal size are cut from the parent by its Minitron importance
(``plan_pruning``, the trials' own slicing) and scored on the test split (``TestRows``: code and prose
rows no study reads), KL to the parent per row:

- ``uniform``: every layer at the same width;
- ``profile``: the widths :func:`~autocompress_opt.quality.allocate.per_layer_moe_plan`'s rule
  gives (each layer's cut on its own curve from the profile, snapped to multiples of 64 under the
  uniform total);
- ``inverse``: the same rule with the layers' sensitivities swapped end for end, most for least (a
  control: if the profile carries information, this is worse than uniform).

Differences are paired over rows (95 % bootstrap intervals), no recovery. Writes
``benchmarks/results/layer_profile[_<model>].json``. SmolLM2 is in sample for the profile's shape (its
own layers, though measured on 4 calibration rows at one cut); any other model tests the transfer
that plan mode relies on for Nemotron 3 Super.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(".autocompress")
STEP, LEAST = 64, 128


def widths(parent: Any, kept: float, curves: list[tuple[float, float]] | None) -> list[int]:
    """Per-layer FFN widths keeping ``kept`` of the channels: uniform (``curves`` None) or allotted by
    each layer's ``(k, p)`` curve as plan mode allots them (:func:`~autocompress_opt.quality.allocate.allot_sizes`)."""
    from autocompress_opt.quality.allocate import allot_sizes

    full = [layer.ffn_width for layer in parent.layers]
    uniform = [max(LEAST, round(w * kept / STEP) * STEP) for w in full]
    if curves is None:
        return uniform
    grids = [list(range(LEAST, w + 1, STEP)) for w in full]
    return allot_sizes(curves, parents=full, uniform=uniform, grids=grids, costs=[1.0] * len(full))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--kept", default="0.75,0.5,0.35", help="fractions of the FFN channels kept")
    parser.add_argument("--rows", type=int, default=32, help="test rows per domain (code, prose)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-boot", type=int, default=10000)
    parser.add_argument("--workload", default="datacenter", help="whose built-in calibration text the importance reads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from _h2h_test import TestRows, differences, summary
    from _util import provenance

    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize
    from autocompress_opt.quality.estimate import load_estimate
    from autocompress_opt.search.study.export import trial_parent

    began = time.perf_counter()
    context, _ = trial_parent(args.model, {}, cache_dir=CACHE, workload=args.workload)
    parent, estimate = context.architecture, load_estimate()
    profile = estimate.profiles["ffn"]
    n = len(parent.layers)
    curves = profile.curves([(i + 0.5) / n for i in range(n)], estimate.curve("ffn_width")[1])
    # the control: the same curves with the layers' sensitivities upside down (least sensitive <-> most)
    order = sorted(range(n), key=lambda i: curves[i][0])
    inverse = list(curves)
    for i, j in zip(order, reversed(order), strict=True):
        inverse[i] = (curves[j][0], curves[i][1])
    arms = {"uniform": None, "profile": curves, "inverse": inverse}
    test_rows = TestRows(context.model, context.tokenizer, rows=args.rows, seq_len=args.seq_len, seed=0)
    cells = []
    for kept in (float(k) for k in args.kept.split(",")):
        scores, built = {}, {}
        for arm, w in arms.items():
            sizes = widths(parent, kept, w)
            arch = replace(
                parent, layers=tuple(replace(l, ffn_width=s) for l, s in zip(parent.layers, sizes, strict=True))
            )
            child = materialize(context.model, plan_pruning(parent, context.importance, arch))
            scores[arm] = test_rows.score(child)
            del child
            built[arm] = {
                "ffn_widths": sizes,
                "params": arch.num_params,
                "estimated_kl": round(estimate.kl(arch, parent), 5),
                **{k: round(v, 5) for k, v in summary(scores[arm]).items()},
            }
            print(f"kept {kept}: {arm} {sizes} -> test KL {built[arm]['kl_to_parent']:.4f}", flush=True)
        diffs = {
            f"{arm} - uniform": differences([scores[arm]], [scores["uniform"]], n_boot=args.n_boot)["kl"]
            for arm in ("profile", "inverse")
        }
        cells.append({"ffn_kept": kept, "arms": built, "kl_differences": diffs})
        print(json.dumps(diffs), flush=True)
    record = {
        "benchmark": "layer_profile",
        "command": "python benchmarks/bench_layer_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model,
        "parent": {"layers": n, "ffn_width": parent.layers[0].ffn_width, "params": parent.num_params},
        "profile_source": profile.source,
        "in_sample": profile.source.startswith(args.model),
        "test_rows": test_rows.record(),
        "cells": cells,
        "seconds": round(time.perf_counter() - began, 1),
        "provenance": provenance(bootstrap=0),
    }
    out = args.out or ROOT / "benchmarks" / "results" / (
        "layer_profile.json" if args.model == "smollm2-135m" else f"layer_profile_{args.model}.json"
    )
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
