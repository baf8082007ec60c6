"""Where a demo trial's time goes, per phase, on the demo's four targets (CPU seconds, no profiler).

Every trial is the one the demo study (``studies/smollm2-weights.yaml``) sends a Ray worker: the
real SmolLM2-135M, ``compute_dtype: fast``, the target engine's shapes, held-out KL measured at the
study's ASHA rungs (steps 3 and 9 of 24). Per target it runs a few points of the bundled search
space in one process, as a study worker does: the first trial of a data setting builds the parent
context (load, importance, teacher log-probs, the selection rows' logits); the others find it held.

For each trial it records the process CPU seconds (``time.process_time``, torch on one thread, so
hardly dependent on the machine's load) of every phase the trial reports (``load parent``,
``importance``, ``teacher``, ``baseline``, ``inner search``, ``materialise``, ``quality``), the
CPU seconds at which the inner search reached each ASHA rung (what a trial that the scheduler stops
there costs), the inner search's own split (start, train, discretise, select) and the outcome.
A study's trials are warm (the context is held by the worker process), so the summary's
``median_warm_trial_cpu_s`` is the median over the warm trials, complete; ``median_to_rung_cpu_s``
the same up to each rung.

Run it once per code version, ``--tree`` naming the checkout to import (default: this one) and
``--label`` the key it writes under (other keys are kept), both versions in one session so the
ratio is measured on one machine::

    .venv/bin/python benchmarks/bench_trial_phases.py --tree /tmp/before --label before
    .venv/bin/python benchmarks/bench_trial_phases.py --label after
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import git_in, import_tree

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "trial_phases.json"
MODEL = "smollm2-135m"
TARGETS = ("rtx5070:in-game", "rtx5080:local-coding", "h100-sxm:datacenter", "b200:datacenter")
RUNGS = (3, 9)  # schedulers.rung_steps of the demo's study (ASHA over 24 inner steps)
# Points of the bundled SmolLM2 space (layers 10-30, hidden 384-576, FFN 256-1536, KV 1-3, q/KV 1-3),
# light to aggressive; the target engine's legal_point maps each onto a shape it loads.
POINTS = (
    {"num_layers": 26, "hidden_size": 576, "ffn_width": 1280, "num_kv_heads": 3, "q_per_kv": 3},
    {"num_layers": 20, "hidden_size": 512, "ffn_width": 896, "num_kv_heads": 3, "q_per_kv": 2},
    {"num_layers": 16, "hidden_size": 448, "ffn_width": 768, "num_kv_heads": 1, "q_per_kv": 3},
)


def build_request(target_name: str, point: dict[str, int], cache_dir: Path) -> dict[str, Any]:
    """The request the demo study sends its trial of ``point`` on ``target_name`` (search.study.run)."""
    from autocompress_opt._data import REPO_SEARCH_SPACES
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.prune.loadability import rules_engine_for
    from autocompress_opt.serving.targets import Target

    hardware, _, workload = target_name.partition(":")
    target = Target(hardware=hardware, workload=workload)
    return {
        "mode": "weights",
        "params": dict(point),
        "parent": load_architecture(MODEL).to_dict(),
        "space": load_search_space(REPO_SEARCH_SPACES / f"{MODEL}.yaml").to_dict(),
        "target": target.to_dict(),
        "layer_order": None,
        "seed": 0,
        "inner": {"compute_dtype": "fast"},
        "parent_model": MODEL,
        "serve_as": rules_engine_for(target.engine_name),
        "cache_dir": str(cache_dir),
        "measure_at": list(RUNGS),
    }


def timed_trial(request: dict[str, Any]) -> dict[str, Any]:
    """Run one trial; its CPU seconds per phase, at each rung, in all, and its outcome."""
    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.search.study.progress import reporting
    from autocompress_opt.search.study.weights_trial import run_weights_trial

    marks: list[tuple[str, float]] = []  # (phase, process_time) at each phase change
    rungs: dict[str, float] = {}
    cpu0 = time.process_time()

    def listen(progress: Any) -> None:
        now = time.process_time()
        if not marks or marks[-1][0] != progress.phase:
            marks.append((progress.phase, now))
        if progress.phase == "inner search" and progress.inner_step in RUNGS and not progress.stale:
            rungs.setdefault(str(progress.inner_step), round(now - cpu0, 2))

    with reporting(listen):
        result = run_weights_trial(request)
    cpu1 = time.process_time()
    marks.append(("end", cpu1))
    phases: dict[str, float] = {}
    if marks[0][1] > cpu0:
        phases["before first report"] = marks[0][1] - cpu0
    for (phase, c), (_, c_next) in itertools.pairwise(marks):
        phases[phase] = phases.get(phase, 0.0) + c_next - c
    return {
        "point": request["params"],
        "cpu_s": round(cpu1 - cpu0, 2),
        "phase_cpu_s": {k: round(v, 2) for k, v in phases.items()},
        "to_rung_cpu_s": rungs,
        "inner_seconds": {k: round(v, 2) for k, v in result["inner"].get("seconds", {}).items()},
        "outcome": {
            "architecture": Architecture.from_dict(result["architecture"]).summary(),
            "kl_to_parent": result["kl_to_parent"],
            "chosen": result["selection"]["chosen"],
            "quality_cached": result["quality_cached"],
        },
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent, help="checkout whose autocompress_opt runs")
    parser.add_argument("--label", default="after", help="key in the JSON (e.g. before / after)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated HARDWARE:WORKLOAD")
    parser.add_argument("--points", type=int, default=len(POINTS), help=f"how many of the {len(POINTS)} points")
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    torch = import_tree(tree)
    from autocompress_opt.search.study.weights_trial import clear_trial_cache

    load_start = os.getloadavg()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    per_target: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="trial-phases-") as cache:
        clear_trial_cache()
        for name in args.targets.split(","):
            per_target[name] = []
            for point in POINTS[: args.points]:
                run = timed_trial(build_request(name, point, Path(cache)))
                per_target[name].append(run)
                print(f"{args.label} {name} {point}: CPU {run['cpu_s']} s", run["phase_cpu_s"], run["to_rung_cpu_s"])
    context = {"load parent", "importance", "teacher"}  # phases of the first trial of a data setting
    warm = [r for runs in per_target.values() for r in runs if not context & set(r["phase_cpu_s"])]
    summary = {
        "trials": sum(len(r) for r in per_target.values()),
        "warm_trials": len(warm),
        "median_warm_trial_cpu_s": _median([r["cpu_s"] for r in warm]),
        "median_to_rung_cpu_s": {
            str(s): _median([r["to_rung_cpu_s"][str(s)] for r in warm if str(s) in r["to_rung_cpu_s"]]) for s in RUNGS
        },
        "median_warm_phase_cpu_s": {
            phase: _median([r["phase_cpu_s"].get(phase, 0.0) for r in warm])
            for phase in sorted({p for r in warm for p in r["phase_cpu_s"]})
        },
    }
    record = {
        "date": started,
        "commit": git_in(tree, "rev-parse", "HEAD") or None,
        "dirty": bool(git_in(tree, "status", "--porcelain", "--", "autocompress_opt")),
        "command": " ".join(["python", "benchmarks/bench_trial_phases.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "model": MODEL,
        "rungs": list(RUNGS),
        "summary": summary,
        "targets": per_target,
    }
    data = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data[args.label] = record
    data["benchmark"] = "trial_phases"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
