"""Profile one weights trial on SmolLM2-135M, cold then warm, under cProfile (CPU seconds).

The trial is the one a study sends a Ray worker (``run_weights_trial`` with the study's request:
parent, bundled search space, target, default ``inner`` settings, the target engine's shapes), run
in this process without Ray, at one fixed mid-size point for ``b200:datacenter``:

* **cold**: a fresh cache directory and an empty in-process parent cache, so the trial loads the
  parent and computes importance, the teacher log-probs and the held-out quality;
* **warm**: the same request again in the same process, as a study worker's next trial runs it
  (the parent context is held in the process; the quality of the same architecture is on disk).

Each run records the trial's own wall-clock seconds per phase (``timings_s``), the process CPU
seconds (``time.process_time``) per phase reported through ``search.study.progress.reporting``,
and the top functions by cumulative and by own CPU time (cProfile with ``time.process_time`` as
its clock). Torch runs one thread, so CPU seconds hardly depend on how loaded the machine is;
wall-clock seconds do.

Run it once per code version; ``--tree`` names the checkout whose ``autocompress_opt`` it imports
(default: this one), ``--label`` the key it writes under in the JSON (other keys are kept)::

    .venv/bin/python benchmarks/bench_trial_profile.py --label after
    .venv/bin/python benchmarks/bench_trial_profile.py --tree ../old-checkout --label before
    .venv/bin/python benchmarks/bench_trial_profile.py --demo --label demo   # the demo's trial settings
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import git_in, import_tree, top_functions

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "trial_profile.json"
MODEL = "smollm2-135m"
TARGET = "b200:datacenter"
DEMO_RUNGS = [3, 9]  # schedulers.rung_steps of the demo's study (ASHA over 24 inner steps)
# A mid-size point of the bundled SmolLM2 space (layers 10-30, hidden 384-576, FFN 256-1536, KV 1-3, q/KV 1-3).
POINT = {"num_layers": 20, "hidden_size": 512, "ffn_width": 896, "num_kv_heads": 3, "q_per_kv": 2}
TOP = 25


def build_request(cache_dir: Path, demo: bool = False) -> dict[str, Any]:
    """The request a weights study of ``MODEL`` sends its trial of ``POINT`` on ``TARGET`` (search.study.run);
    ``demo``: with the demo's settings (``compute_dtype: fast``, measured at its ASHA rungs only)."""
    from autocompress_opt._data import REPO_SEARCH_SPACES
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.prune.loadability import rules_engine_for
    from autocompress_opt.serving.targets import Target

    hardware, _, workload = TARGET.partition(":")
    target = Target(hardware=hardware, workload=workload)
    return {
        "mode": "weights",
        "params": dict(POINT),
        "parent": load_architecture(MODEL).to_dict(),
        "space": load_search_space(REPO_SEARCH_SPACES / f"{MODEL}.yaml").to_dict(),
        "target": target.to_dict(),
        "layer_order": None,
        "seed": 0,
        "inner": {"compute_dtype": "fast"} if demo else {},  # else TrialConfig / InnerConfig defaults
        "parent_model": MODEL,
        "serve_as": rules_engine_for(target.engine_name),
        "cache_dir": str(cache_dir),
        **({"measure_at": DEMO_RUNGS} if demo else {}),
    }


def profile_trial(request: dict[str, Any], tree: Path) -> dict[str, Any]:
    """Run the trial once under cProfile; its phases (wall and CPU), totals, top functions and outcome."""
    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.search.study.progress import reporting
    from autocompress_opt.search.study.weights_trial import run_weights_trial

    marks: list[tuple[str, float, float]] = []  # (phase, process_time, perf_counter) at each phase change

    def listen(progress: Any) -> None:
        if not marks or marks[-1][0] != progress.phase:
            marks.append((progress.phase, time.process_time(), time.perf_counter()))

    profiler = cProfile.Profile(time.process_time)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with reporting(listen):
        profiler.enable()
        result = run_weights_trial(request)
        profiler.disable()
    cpu1, wall1 = time.process_time(), time.perf_counter()
    marks.append(("end", cpu1, wall1))
    phase_cpu: dict[str, float] = {"before first report": marks[0][1] - cpu0}
    phase_wall: dict[str, float] = {"before first report": marks[0][2] - wall0}
    for (phase, c, w), (_, c_next, w_next) in itertools.pairwise(marks):
        phase_cpu[phase] = phase_cpu.get(phase, 0.0) + c_next - c
        phase_wall[phase] = phase_wall.get(phase, 0.0) + w_next - w
    stats = pstats.Stats(profiler)
    return {
        "cpu_s": round(cpu1 - cpu0, 2),
        "wall_s": round(wall1 - wall0, 2),
        "phase_cpu_s": {k: round(v, 2) for k, v in phase_cpu.items()},
        "phase_wall_s": {k: round(v, 2) for k, v in phase_wall.items()},
        "timings_s": {k: round(v, 2) for k, v in result["timings_s"].items()},  # the trial's own (wall)
        "top_cumulative": top_functions(stats, "cumulative", tree, TOP),
        "top_tottime": top_functions(stats, "tottime", tree, TOP),
        "outcome": {
            "architecture": Architecture.from_dict(result["architecture"]).summary(),
            "quality": round(result["quality"], 5),
            "kl_to_parent": round(result["kl_to_parent"], 5),
            "chosen": result["selection"]["chosen"],
            "quality_cached": result["quality_cached"],
            "feasible": result["inner"].get("feasible"),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent, help="checkout whose autocompress_opt runs")
    parser.add_argument("--label", default="after", help="key in the JSON (e.g. before / after)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--demo",
        action="store_true",
        help="the demo study's trial settings: compute_dtype fast (bf16 on a CPU with bf16 instructions) and "
        "held-out KL measured at its ASHA rungs only (steps 3 and 9 of 24)",
    )
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    torch = import_tree(tree)
    from autocompress_opt.search.study.weights_trial import clear_trial_cache

    load_start = os.getloadavg()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with tempfile.TemporaryDirectory(prefix="trial-profile-") as cache:
        request = build_request(Path(cache), args.demo)
        clear_trial_cache()
        cold = profile_trial(request, tree)
        warm = profile_trial(request, tree)
    record = {
        "date": started,
        "commit": git_in(tree, "rev-parse", "HEAD") or None,
        "dirty": bool(git_in(tree, "status", "--porcelain", "--", "autocompress_opt")),
        "command": " ".join(["python", "benchmarks/bench_trial_profile.py", *(argv or sys.argv[1:])]),
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
        },
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "model": MODEL,
        "target": TARGET,
        "point": POINT,
        "request_inner": request["inner"],
        "measure_at": request.get("measure_at"),
        "cold": cold,
        "warm": warm,
    }
    data = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data[args.label] = record
    data["benchmark"] = "trial_profile"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for name, run in (("cold", cold), ("warm", warm)):
        print(f"{args.label} {name}: CPU {run['cpu_s']} s, wall {run['wall_s']} s, phases CPU {run['phase_cpu_s']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
