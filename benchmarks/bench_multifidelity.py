"""Multi-fidelity vs single-fidelity weights-mode studies at equal wall clock (issue 17, item 6).

What it measures: the weights-mode study group of studies/smollm2-weights.yaml (SmolLM2-135M on
rtx5070:in-game, rtx5080:local-coding, h100-sxm:datacenter, b200:datacenter), run twice per seed
for the same wall-clock budget:

  multi-fidelity   study run --scheduler asha --proxy 4   (ASHA stops losing trials early; the
                   plan-mode proxy enqueues its 4 best points per target and screens out points
                   it finds infeasible)
  single-fidelity  study run --scheduler none --proxy 0   (every trial runs its full inner search)

Both arms: --no-seed-baselines (the seeded depth/minitron baselines are the same points in both
arms and would only add the same cost to each), --trials 1000 (the budget decides), --time-budget
BUDGET (no trial starts after it; trials in flight finish), --parallel, --seed, their own sqlite
storage and their own --cache-dir. The quality cache is never shared between runs (a run would get
another run's architectures for free); the parent's importance and teacher log-probs are computed
once before the timed runs and copied into every run's cache, so neither arm pays them.

Per run and target it reports the points evaluated within the budget (COMPLETE trials plus trials
ASHA stopped early, completed by start + budget, the start being the moment the `autocompress`
process was launched, Ray start-up included), and the best feasible held-out KL to the parent
(nats, KL = -log(quality)) over time; per target, the median over seeds of each arm's best KL at
the budget (a run without a feasible point counts as worse than any run with one).

Writes benchmarks/results/multifidelity.json and multifidelity.png (2x2: best feasible KL vs
minutes per target, arms as colours, seeds as line styles). Runs are interleaved (per seed:
single, then multi), so drift in the machine's load hits both arms alike.

Takes about 2 arms x seeds x (BUDGET + ~1 minute of start-up and the last trials finishing) plus
~2 minutes of warm-up: about 40 minutes with the defaults (8 minutes, 2 seeds).

    .venv/bin/python benchmarks/bench_multifidelity.py                       # the real run
    .venv/bin/python benchmarks/bench_multifidelity.py --budget 1.5 --seeds 0 \\
        --targets rtx5070:in-game,b200:datacenter --results /tmp/mf.json     # a smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import RESULTS, machine, provenance

ROOT = Path(__file__).parent.parent
CONFIG = ROOT / "studies" / "smollm2-weights.yaml"
STUDY_NAME = "mf"
TRIALS = 1000  # more than any budget allows: the time budget decides
ARMS: dict[str, list[str]] = {  # run order within a seed: single first, then multi
    "single-fidelity": ["--scheduler", "none", "--proxy", "0"],
    "multi-fidelity": ["--scheduler", "asha", "--proxy", "4"],
}
PROXY_ATTR = "proxy_infeasible"  # user attribute of a point the proxy kept from running
OK_EXIT = (0, 1, 3)  # 1: a target completed nothing, 3: nothing feasible; both are results at a tiny budget

Event = tuple[float, float | None, bool]  # (seconds since run start, KL or None, feasible)


# ----------------------------------------------------------------------------- pure helpers
def kl_of(quality: Any) -> float | None:
    """Held-out KL to the parent (nats) from a trial's ``quality`` = exp(-KL); None if absent."""
    if quality is None:
        return None
    q = float(quality)
    return -math.log(q) if q > 0 else math.inf


def best_curve(events: Iterable[Event]) -> list[tuple[float, float]]:
    """``(t, best feasible KL completed by t)`` at each feasible completion, in time order."""
    curve: list[tuple[float, float]] = []
    best = math.inf
    for t, kl, feasible in sorted(events, key=lambda e: e[0]):
        if feasible and kl is not None:
            best = min(best, kl)
            curve.append((t, best))
    return curve


def best_at(curve: Sequence[tuple[float, float]], t: float) -> float | None:
    """The best feasible KL completed by ``t`` (None: no feasible point yet)."""
    done = [kl for when, kl in curve if when <= t]
    return min(done) if done else None


def worse_last(value: float | None) -> float:
    """A best KL for comparisons: no feasible point (None) is worse than any KL."""
    return math.inf if value is None else value


def median_best(values: Sequence[float | None]) -> float | None:
    """Median over seeds of the best KL, a missing one counting as worse than any; None if the median
    itself is missing."""
    if not values:
        return None
    m = statistics.median(sorted(worse_last(v) for v in values))
    return None if math.isinf(m) or math.isnan(m) else m


def is_better(multi: float | None, single: float | None) -> bool:
    """Whether the multi-fidelity best KL is lower (None: worse than any; both None: not better)."""
    return worse_last(multi) < worse_last(single)


# ----------------------------------------------------------------------------- running
def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def study_inner(config: Path) -> dict[str, Any]:
    """The ``inner`` settings the study's trials get from ``config`` (what the caches are keyed by)."""
    import yaml

    from autocompress_opt.search.study import inner_settings

    data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    return inner_settings(data.get("inner"), mode="weights")


def warm_caches(model: str, inner: dict[str, Any], where: Path) -> float:
    """Build the parent's importance and teacher caches under ``where`` (a subprocess, as a trial would);
    returns the seconds it took."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from autocompress_opt.search.study.weights_trial import TrialConfig, parent_context\n"
        "parent_context(sys.argv[1], TrialConfig.from_dict(json.loads(sys.argv[2]), seed=0), Path(sys.argv[3]))\n"
    )
    began = time.time()
    subprocess.run([sys.executable, "-c", code, model, json.dumps(inner), str(where)], check=True, cwd=ROOT)
    for sub in ("importance", "teacher"):
        if not (where / sub).is_dir():
            raise SystemExit(f"warm-up left no {where / sub}; cannot give the runs a warm cache")
    return time.time() - began


def run_arm(
    arm: str, seed: int, args: argparse.Namespace, warm: Path, out: Path
) -> tuple[float, float, int, list[str], Path]:
    """One timed ``study run`` of ``arm``; returns (start, end, exit status, command, storage file)."""
    run_dir = out / f"{arm}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cache = run_dir / "cache"
    cache.mkdir(parents=True)
    for sub in ("importance", "teacher"):  # never quality/: each run evaluates its own points
        shutil.copytree(warm / sub, cache / sub)
    db = run_dir / "study.db"
    cli = Path(sys.executable).parent / "autocompress"
    cmd = [
        str(cli),
        "study",
        "run",
        "--config",
        str(args.config),
        "--targets",
        ",".join(args.targets),
        "--name",
        STUDY_NAME,
        "--storage",
        f"sqlite:///{db}",
        "--cache-dir",
        str(cache),
        "--trials",
        str(TRIALS),
        "--time-budget",
        f"{args.budget:g}",
        "--parallel",
        str(args.parallel),
        "--seed",
        str(seed),
        "--no-seed-baselines",
        "--quiet",
        *ARMS[arm],
    ]
    logfile = run_dir / "run.log"
    start = time.time()
    with logfile.open("w") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    end = time.time()
    if rc not in OK_EXIT:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"{arm} seed {seed}: 'autocompress study run' exited {rc}; log {logfile}:\n{tail}")
    return start, end, rc, cmd, db


def read_target(db: Path, hardware: str, start: float, budget_s: float) -> dict[str, Any]:
    """One target's study of a run: counts within the budget, best KL at the budget, the curve."""
    import optuna

    from autocompress_opt.search.study.progress import is_stopped_early

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=f"{STUDY_NAME}.{hardware}", storage=f"sqlite:///{db}")
    events: list[Event] = []
    complete = stopped = screened = after = 0
    first_start: float | None = None
    for t in study.get_trials(deepcopy=False):
        if t.datetime_start is not None and PROXY_ATTR not in t.user_attrs:
            began = t.datetime_start.timestamp() - start  # naive local datetimes, as time.time() is read
            first_start = began if first_start is None else min(first_start, began)
        if t.state == optuna.trial.TrialState.PRUNED and PROXY_ATTR in t.user_attrs:
            screened += 1
            continue
        counted = t.state == optuna.trial.TrialState.COMPLETE or is_stopped_early(t)
        if not counted or t.datetime_complete is None:
            continue  # duplicates, failures, trials still queued
        done = t.datetime_complete.timestamp() - start
        if done > budget_s:
            after += 1
        elif t.state == optuna.trial.TrialState.COMPLETE:
            complete += 1
        else:
            stopped += 1
        if t.state == optuna.trial.TrialState.COMPLETE:
            events.append((done, kl_of(t.user_attrs.get("quality")), bool(t.user_attrs.get("feasible"))))
    curve = best_curve(events)
    best = best_at(curve, budget_s)
    return {
        "points": complete + stopped,
        "complete": complete,
        "stopped_early": stopped,
        "screened": screened,
        "points_after_budget": after,
        "feasible_complete": sum(1 for e in events if e[2] and e[0] <= budget_s),
        "first_trial_start_s": None if first_start is None else round(first_start, 1),
        "best_kl_at_budget": None if best is None else round(best, 4),
        "best_kl_at_end": round(curve[-1][1], 4) if curve else None,  # trials in flight at the budget included
        "curve": [[round(t, 1), round(kl, 4)] for t, kl in curve],
    }


# ----------------------------------------------------------------------------- summary, plot, table
def summarise(runs: list[dict[str, Any]], targets: Sequence[str]) -> dict[str, Any]:
    per_target: dict[str, Any] = {}
    for target in targets:
        row: dict[str, Any] = {}
        for arm in ARMS:
            mine = [r["targets"][target] for r in runs if r["arm"] == arm]
            row[arm] = {
                "median_best_kl": median_best([m["best_kl_at_budget"] for m in mine]),
                "best_kl_per_seed": [m["best_kl_at_budget"] for m in mine],
                "points_mean": statistics.mean(m["points"] for m in mine) if mine else 0,
            }
        row["multi_fidelity_better"] = is_better(
            row["multi-fidelity"]["median_best_kl"], row["single-fidelity"]["median_best_kl"]
        )
        per_target[target] = row
    points = {arm: sum(r["targets"][t]["points"] for r in runs if r["arm"] == arm for t in targets) for arm in ARMS}
    return {
        "per_target": per_target,
        "targets_better": sum(row["multi_fidelity_better"] for row in per_target.values()),
        "targets": len(targets),
        "points_total": points,
        "points_ratio": round(points["multi-fidelity"] / points["single-fidelity"], 2)
        if points["single-fidelity"]
        else None,
    }


def plot(runs: list[dict[str, Any]], targets: Sequence[str], budget_min: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    colours = {"single-fidelity": "tab:gray", "multi-fidelity": "tab:blue"}
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r["seed"] for r in runs})
    cols = 2 if len(targets) > 1 else 1
    rows = math.ceil(len(targets) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, target in zip(axes.flat, targets):
        counts = []
        for arm in ARMS:
            mine = [r for r in runs if r["arm"] == arm]
            counts.append(f"{arm.split('-')[0]} {'/'.join(str(r['targets'][target]['points']) for r in mine)}")
            for r in mine:
                curve = r["targets"][target]["curve"]
                if not curve:
                    continue
                end = max(r["wall_s"], curve[-1][0]) / 60
                xs = [t / 60 for t, _ in curve] + [end]
                ys = [kl for _, kl in curve] + [curve[-1][1]]
                ax.step(
                    xs,
                    ys,
                    where="post",
                    color=colours[arm],
                    ls=styles[seeds.index(r["seed"]) % len(styles)],
                    label=f"{arm}, seed {r['seed']}",
                )
        ax.axvline(budget_min, color="black", lw=0.8, label=f"budget ({budget_min:g} min)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%.3g"))
        ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%.3g"))
        ax.set_xlim(left=0)
        ax.set_xlabel("minutes since the run started")
        ax.set_ylabel("best feasible held-out KL (nats)")
        ax.set_title(f"{target}\npoints in budget: {'; '.join(counts)}", fontsize=9)
        ax.legend(fontsize=6, frameon=False)
    for ax in list(axes.flat)[len(targets) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(summary: dict[str, Any]) -> str:
    def fmt(kl: float | None) -> str:
        return "none" if kl is None else f"{kl:.3f}"

    lines = [
        f"{'target':24} {'KL single':>10} {'KL multi':>10} {'pts single':>11} {'pts multi':>10}  better",
    ]
    for target, row in summary["per_target"].items():
        s, m = row["single-fidelity"], row["multi-fidelity"]
        lines.append(
            f"{target:24} {fmt(s['median_best_kl']):>10} {fmt(m['median_best_kl']):>10} "
            f"{s['points_mean']:>11.1f} {m['points_mean']:>10.1f}  {'yes' if row['multi_fidelity_better'] else 'no'}"
        )
    lines.append(
        f"multi-fidelity better on {summary['targets_better']}/{summary['targets']} targets; "
        f"points multi/single = {summary['points_ratio']} ({summary['points_total']['multi-fidelity']} / "
        f"{summary['points_total']['single-fidelity']})"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__.split("\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--budget", type=float, default=8.0, help="wall-clock minutes per run (default 8)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated sampler seeds (default 0,1)")
    parser.add_argument(
        "--targets", help="comma-separated hardware:workload (default: the targets of studies/smollm2-weights.yaml)"
    )
    parser.add_argument("--parallel", type=int, default=2, help="trials at once in every run (default 2)")
    parser.add_argument(
        "--config", type=Path, default=CONFIG, help="the study YAML (default studies/smollm2-weights.yaml)"
    )
    parser.add_argument(
        "--out-dir", type=Path, help="where the runs' storage and caches go (default: a new temporary folder)"
    )
    parser.add_argument("--keep", action="store_true", help="keep --out-dir's studies and caches afterwards")
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS / "multifidelity.json",
        help="the JSON to write; the plot goes beside it as .png (default benchmarks/results/multifidelity.json)",
    )
    args = parser.parse_args(argv)
    if not (math.isfinite(args.budget) and args.budget > 0):
        parser.error(f"--budget must be minutes > 0, got {args.budget}")
    try:
        args.seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers >= 0, got {args.seeds!r}")
    if not args.seeds or any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct integers >= 0, got {args.seeds}")
    if args.parallel < 1:
        parser.error(f"--parallel must be >= 1, got {args.parallel}")
    if not args.config.is_file():
        parser.error(f"--config {str(args.config)!r} does not exist")
    import yaml

    data = yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}
    if str(data.get("mode")) != "weights":
        parser.error(f"--config {str(args.config)!r} is not a weights-mode study (mode: {data.get('mode')!r})")
    args.model = str(data.get("model", "smollm2-135m"))
    raw = args.targets or data.get("targets") or ""
    args.targets = [t.strip() for t in (raw if isinstance(raw, list) else str(raw).split(",")) if t.strip()]
    if not args.targets:
        parser.error("--targets is empty; give e.g. rtx5070:in-game,b200:datacenter")
    hardware = [t.partition(":")[0] for t in args.targets]
    if len(set(hardware)) != len(hardware):
        parser.error(f"--targets names a hardware twice ({','.join(args.targets)}); one study per hardware")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out_dir or Path(tempfile.mkdtemp(prefix="bench-mf-"))
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget_s = 60 * args.budget
    began = time.time()
    try:
        warm = out / "warm-cache"
        log(f"warming the importance and teacher caches under {warm} …")
        warm_s = warm_caches(args.model, study_inner(args.config), warm)
        log(f"warm-up: {warm_s:.0f} s")
        runs: list[dict[str, Any]] = []
        for seed in args.seeds:
            for arm in ARMS:
                start, end, rc, cmd, db = run_arm(arm, seed, args, warm, out)
                per_target = {t: read_target(db, t.partition(":")[0], start, budget_s) for t in args.targets}
                runs.append(
                    {
                        "arm": arm,
                        "seed": seed,
                        "exit_status": rc,
                        "wall_s": round(end - start, 1),
                        "command": cmd,
                        "targets": per_target,
                    }
                )
                points = sum(v["points"] for v in per_target.values())
                log(f"{arm:16} seed {seed}: {end - start:6.0f} s, {points} points in budget (exit {rc})")
    finally:
        if not args.keep and args.out_dir is None:
            shutil.rmtree(out, ignore_errors=True)
    summary = summarise(runs, args.targets)
    data = {
        "benchmark": "multifidelity",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "provenance": provenance(sampler=args.seeds),
        "command": "python benchmarks/bench_multifidelity.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model,
        "config": str(args.config.resolve().relative_to(ROOT))
        if args.config.resolve().is_relative_to(ROOT)
        else str(args.config),
        "targets": args.targets,
        "budget_minutes": args.budget,
        "parallel": args.parallel,
        "arms": {arm: " ".join(flags) for arm, flags in ARMS.items()},
        "warmup_s": round(warm_s, 1),
        "total_s": round(time.time() - began, 1),
        "notes": [
            "Both arms run with --no-seed-baselines: the seeded depth/minitron baselines are the same points in "
            "both arms and would only add the same cost to each.",
            f"--trials {TRIALS} so --time-budget decides; no trial starts after the budget (counted by the study from "
            "after Ray start-up), trials in flight finish. Points and best KL here count only trials completed "
            "within the budget measured from the launch of the process (Ray start-up included, both arms alike).",
            "points = COMPLETE trials + trials ASHA stopped early; proxy-screened points (never run) and duplicate "
            "points are not counted. Best KL = min over COMPLETE feasible trials of -log(quality), nats.",
            "Each run has its own storage and quality cache; the importance and teacher caches were built once "
            "before the timed runs and copied into each run's cache (neither arm pays them). The multi-fidelity "
            "arm's driver loads the parent for the proxy's importance inside its budget.",
            "A target without a feasible point in a run has best_kl_at_budget null and counts as worse than any "
            "KL in the medians and the comparison.",
        ],
        "runs": runs,
        "summary": summary,
    }
    results: Path = args.results
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=2) + "\n")
    png = results.with_suffix(".png")
    plot(runs, args.targets, args.budget, png)
    print(table(summary))
    print(f"wrote {results} and {png}")


if __name__ == "__main__":
    main()
