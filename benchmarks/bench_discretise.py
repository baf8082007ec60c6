"""Discretisation (round, repair, fill) of one inner search at 30, 80 and 126 layers, before vs after.

The parent is Llama-3.1-70B-shaped (hidden 8192; 64 query heads of 128 channels in 8 KV groups;
FFN 28672, i.e. 448 units of 64; vocabulary 128256) at 30, 80 (Llama-3.1-70B itself) and 126
(Llama-3.1-405B's depth) layers, architecture only: random importance scores and random masks,
as the tests build them. The trial's global choices bind (three quarters of the layers, FFN 16384,
4 KV groups of 8 query heads) and so does a latency limit (vLLM on 8 H100s, ``tpot_ms <= 0.6x``).
Each depth is timed by the code under test and by an earlier implementation (extracted with
``git archive``), each in its own process (``--worker``), one after the other in the same run;
the architectures and move counts both return are compared. Wall-clock and CPU seconds (the
process's own, less sensitive to a shared machine's load) are recorded, with the load average.

Writes ``results/discretise.json``. By default the earlier code is :data:`PREVIOUS_COMMIT` (fill
rebuilding only the moved layer's candidates, the goal evaluated in two rounds, two cost-model calls
a move; repair rebuilding every candidate each move) and the rows go to ``after``, with
:data:`CHANGE`; ``--original`` times :data:`OLD_COMMIT` (an ``Architecture`` built per
candidate; minutes a run beyond 30 layers) and rewrites ``depths``. Each mode keeps the other's rows.

    .venv/bin/python benchmarks/bench_discretise.py              # about 5 minutes on 2 idle cores
    .venv/bin/python benchmarks/bench_discretise.py --depths 30  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import provenance, write

ROOT = Path(__file__).resolve().parent.parent
OLD_COMMIT = "c4314df15d4567258e574f6b9260e912b7fb13c7"  # discretise building an Architecture per candidate
PREVIOUS_COMMIT = "e61b50e22c73bda41e9e0c55944e1f0be6aeb2c3"  # fill in two goal rounds a move (module doc)
CHANGE = (
    "Then fill evaluated the goal in one cost-model call a move (every row whose budget bound reaches the best"
    " last score), kept its candidates in flat arrays and sorted the FFN scores with numpy, and repair rebuilt"
    " only the changed layers' candidates"
)
REPAIR_BEFORE = "288b078a8ebf6fb264c473e9888b080607e8aa9b"  # repair scoring every candidate through (N, L) arrays
REPAIR_CHANGE = (
    "Then repair scored every candidate by per-layer deltas of the cost model's sums over layers"
    " (O(1) a candidate) and scored exactly only those that could decide the move"
)
DEPTHS = (30, 80, 126)
TARGET_S = 2.0  # the goal: one discretisation of a 126-layer parent within 2 s on 2 cores


def _case(depth: int, seed: int = 0, full: bool = False) -> tuple[Any, ...]:
    """(masks, importance, budget, goal) of a synthetic Llama-3.1-70B-shaped parent (module doc);
    ``full``: near-full masks (most gates open, widths over half the parent's), so repair works."""
    import torch

    from autocompress_opt.arch.architecture import Architecture, LayerSpec
    from autocompress_opt.prune.importance import Importance, ImportanceMeta
    from autocompress_opt.search.inner.budget import Budget, CostGoal
    from autocompress_opt.search.inner.relaxation import ParentMasks
    from autocompress_opt.serving.targets import Target

    layer = LayerSpec(True, 64, 8, 128, True, 28672)
    parent = Architecture(family="llama", vocab_size=128256, hidden_size=8192, layers=(layer,) * depth, name="synth")
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> torch.Tensor:
        return torch.rand(n, generator=gen, dtype=torch.float64)

    importance = Importance(
        parent,
        tuple(rand(s.num_heads) for s in parent.layers),
        tuple(rand(s.num_kv_heads) for s in parent.layers),
        tuple(rand(s.ffn_width) for s in parent.layers),
        rand(parent.hidden_size),
        rand(depth),
        rand(depth),
        ImportanceMeta("synthetic", "none", "minitron", 1, 1, 1),
    )
    masks = ParentMasks(parent, importance, hidden_size=parent.hidden_size)
    with torch.no_grad():
        for p in (masks.kv_keep, masks.q_keep, masks.ffn_keep):
            p.copy_(torch.rand(depth, generator=gen) / (2 if full else 1) + (0.5 if full else 0.0))
        masks.attn_log_alpha.copy_(torch.randn(depth, generator=gen) * 3 + (4.0 if full else 0.0))
        masks.ffn_log_alpha.copy_(torch.randn(depth, generator=gen) * 3 + (4.0 if full else 0.0))
    budget = Budget(num_layers=depth * 3 // 4, hidden_size=8192, ffn_width=16384, num_kv_heads=4, q_per_kv=8)
    goal = CostGoal.for_target(Target("h100-sxm", "datacenter", tp=8, constraints={"tpot_ms": "0.6x"}), parent)
    return masks, importance, budget, goal


def worker(depth: int, repeats: int, full: bool = False) -> dict[str, Any]:
    """Time ``repeats`` discretisations of the ``depth``-layer case with whatever
    ``autocompress_opt`` this process imports; the result's layers and moves."""
    from autocompress_opt.search.inner.discretise import discretise

    masks, importance, budget, goal = _case(depth, full=full)
    seconds, cpu, out = [], [], None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = discretise(masks, importance, budget, goal)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    assert out is not None
    layers = [[s.num_heads, s.num_kv_heads, s.ffn_width] for s in out.architecture.layers]
    return {"seconds": seconds, "cpu": cpu, "layers": layers, "moves": out.moves, "feasible": out.feasible}


def _run(code: Path, depth: int, repeats: int, full: bool = False) -> dict[str, Any]:
    """:func:`worker` in a fresh process importing the package from ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, __file__, "--worker", str(depth), "--repeats", str(repeats)] + (["--repair"] if full else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=code)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(depth: int, before: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    old_s, new_s = statistics.median(before["seconds"]), statistics.median(new["seconds"])
    return {
        "depth": depth,
        "old_s": round(old_s, 4),
        "new_s": round(new_s, 4),
        "ratio": round(old_s / new_s, 2),
        "old_cpu_s": round(statistics.median(before["cpu"]), 4) if "cpu" in before else None,
        "new_cpu_s": round(statistics.median(new["cpu"]), 4),
        "identical": all(before[k] == new[k] for k in ("layers", "moves", "feasible")),
        "moves": new["moves"],
        "feasible": new["feasible"],
        "old_runs": len(before["seconds"]),
        "new_runs": len(new["seconds"]),
    }


def main_repair(depths: list[int], repeats: int, old_repeats: int) -> None:
    """The repair-heavy case (near-full masks) by the code under test and by :data:`REPAIR_BEFORE`,
    each depth one after the other; written to ``repair`` in ``results/discretise.json``."""
    rows, load = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp)
        archive = subprocess.run(["git", "archive", REPAIR_BEFORE, "autocompress_opt"], cwd=ROOT, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        for depth in depths:
            new = _run(ROOT, depth, repeats, full=True)
            before = _run(old, depth, old_repeats if depth > 30 else repeats, full=True)
            rows.append(_row(depth, before, new))
            load.append(os.getloadavg()[0])
            r = rows[-1]
            print(
                f"{depth:4d} layers (repair): old {r['old_s']:8.2f} s  new {r['new_s']:6.3f} s  "
                f"cpu {r['old_cpu_s']} -> {r['new_cpu_s']} s  identical={r['identical']}  moves={r['moves']}",
                flush=True,
            )
    path = ROOT / "benchmarks" / "results" / "discretise.json"
    data = json.loads(path.read_text())
    data.setdefault("date_original", data.get("date"))
    for key in ("benchmark", "date", "machine"):  # write() sets them again
        data.pop(key, None)
    data["repair"] = {
        "case": "the same parent and limits from near-full masks (keep probabilities 0.5-1, gates mostly open)",
        "old_code": REPAIR_BEFORE,
        "change": REPAIR_CHANGE,
        "provenance": provenance(masks=0),
        "load_average_1min": load,
        "date": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}",
        "depths": rows,
    }
    write("discretise", data)


def main(depths: list[int], repeats: int, old_repeats: int, original: bool) -> None:
    commit = OLD_COMMIT if original else PREVIOUS_COMMIT
    rows, load = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp)
        archive = subprocess.run(["git", "archive", commit, "autocompress_opt"], cwd=ROOT, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        for depth in depths:
            new = _run(ROOT, depth, repeats)
            # the original code is timed fewer times beyond 30 layers: minutes per run
            before = _run(old, depth, old_repeats if original and depth > 30 else repeats)
            rows.append(_row(depth, before, new))
            load.append(os.getloadavg()[0])
            r = rows[-1]
            print(
                f"{depth:4d} layers: old {r['old_s']:8.2f} s  new {r['new_s']:6.3f} s  x{r['ratio']:7.1f}  "
                f"cpu {r['old_cpu_s']} -> {r['new_cpu_s']} s  identical={r['identical']}  moves={r['moves']}",
                flush=True,
            )
    path = ROOT / "benchmarks" / "results" / "discretise.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    run = {"old_code": commit, "provenance": provenance(masks=0), "load_average_1min": load, "depths": rows}
    data = {
        "case": "Llama-3.1-70B-shaped parent, random masks; budgets 3/4 layers, FFN 16384, 4x8 heads; "
        "vLLM on 8 H100 (datacenter, tpot_ms <= 0.6x)",
        "target_s_at_126": TARGET_S,
    }
    if original:
        data |= {**run, "after": kept.get("after")}
    else:
        data |= {k: kept.get(k) for k in ("old_code", "provenance", "depths")}
        data["date_original"] = kept.get("date_original", kept.get("date"))
        data["after"] = {**run, "change": CHANGE, "date": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"}
    write("discretise", data)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the new code (median)")
    parser.add_argument("--old-repeats", type=int, default=1, help="timed runs of the old code beyond 30 layers")
    parser.add_argument("--original", action="store_true", help="time OLD_COMMIT instead of PREVIOUS_COMMIT")
    parser.add_argument(
        "--repair", action="store_true", help="the repair-heavy case (near-full masks), vs REPAIR_BEFORE"
    )
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.repeats, args.repair)))
    elif args.repair:
        main_repair(args.depths, args.repeats, args.old_repeats)
    else:
        main(args.depths, args.repeats, args.old_repeats, args.original)
