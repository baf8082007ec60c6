"""Ray Tune + Optuna overhead per trial, and the 120B plan-mode case's wall time.

Overhead: a plan-mode study (a trial costs ~1 ms of cost-model arithmetic) at concurrency 1 on a
local Ray already started; per-trial overhead = wall time of the study run / trials, median of
three studies (target < 0.5 s). 120B: the whole `study run --config studies/large-120b-b200.yaml`
equivalent, Ray start-up included (target < 2 minutes).

    .venv/bin/python benchmarks/bench_study.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import write

from autocompress_opt.arch.search_space import load_search_space
from autocompress_opt.search.study import Objective, StudyConfig, init_ray, load_records, run_study
from autocompress_opt.serving.targets import Target

TRIALS = 40


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-study-"))
    t0 = time.perf_counter()
    init_ray(None, 1)
    ray_start = time.perf_counter() - t0
    per_trial = []
    for i in range(3):
        cfg = StudyConfig(
            name=f"o{i}",
            model="smollm2-135m",
            targets=(Target("h100-sxm", "datacenter"),),
            space=load_search_space("smollm2-135m"),
            trials=TRIALS,
            storage=f"sqlite:///{tmp}/o.db",
            concurrency=1,
            seed=i,
        )
        start = time.perf_counter()
        run_study(cfg, progress=False)
        per_trial.append((time.perf_counter() - start) / TRIALS)
        print(f"study {i}: {per_trial[-1]:.3f} s per trial")
    big = StudyConfig(
        name="big",
        model="mistral-large-2",
        space=load_search_space("mistral-large-2"),
        trials=60,
        targets=(
            Target(
                "b200",
                "local-coding",
                engine="vllm",
                dtype="bf16",
                input_len=126976,
                output_len=4096,
                concurrency=1,
                constraints={"ttft_ms": "1x", "tpot_ms": "1x"},
            ),
        ),
        objectives=(Objective("quality", "maximize"), Objective("peak_memory_gib", "minimize")),
        storage=f"sqlite:///{tmp}/big.db",
    )
    start = time.perf_counter()
    run_study(big, progress=False)
    big_s = time.perf_counter() - start + ray_start
    records, attrs = load_records(big.storage_url, "big.b200")
    feasible = [r for r in records if r.feasible]
    best = max(feasible, key=lambda r: r.quality)
    summary = {
        "command": "python benchmarks/bench_study.py",
        "ray_start_s": round(ray_start, 2),
        "overhead_per_trial_s": {
            "median": round(statistics.median(per_trial), 4),
            "runs": [round(x, 4) for x in per_trial],
            "trials_per_run": TRIALS,
            "concurrency": 1,
            "target_s": 0.5,
        },
        "large_120b": {
            "seconds_including_ray_start": round(big_s, 1),
            "trials": 60,
            "target_s": 120,
            "parent_peak_memory_gib": round(attrs["parent_metrics"]["peak_memory_gib"], 1),
            "feasible": len(feasible),
            "best_feasible": {
                "summary": best.arch().summary(),
                "quality": round(best.quality, 4),
                "peak_memory_gib": round(best.metrics["peak_memory_gib"], 1),
            },
        },
    }
    print(summary)
    write("study_overhead", summary)


if __name__ == "__main__":
    main()
