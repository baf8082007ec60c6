"""Issue 47's compression sweep: does the search beat the best uniform model, replicated over study seeds?

A **cell** is (target, budget, study seed). A *budget* keeps a fraction of the parent's cost on the
target's primary metric (:data:`BUDGETS`: ``light`` 85 %, ``middle`` 60 %, ``aggressive`` 40 %):
time to first token for ``in-game`` and ``local-coding`` (``ttft_ms <= keep·x``), output throughput
for ``datacenter`` (``output_throughput_tok_s >= x/keep``). The workload's other latency and
throughput limits are held at the parent's own (``1x``), its memory limits stay as it states them, so
one number sets how hard the cell is (:func:`budget_constraints`). A *study seed* is the Optuna
sampler's seed and the inner search's seed (``study run --seed``); the data and the baselines do not
depend on it, so three seeds measure study-to-study variance.

Each cell, on SmolLM2-135M:

1. **Baselines and the space.** ``depth``, ``minitron`` and ``best-uniform`` choose as a study's
   seeding does (:func:`~autocompress_opt.search.study.seeding.choose_baseline`: the target's exact
   constraints, the engine's loadable shapes, KL on the inner search's choice rows of the selection
   split, :class:`~autocompress_opt.search.study.seeding.SeedScoring`). The study's search space is
   the bundled one with each floor lowered to the lowest value any of the three chose
   (:func:`budget_space`): at an aggressive budget the baselines fall below the bundled 10-layer
   floor (issue 47: at b200 ``--min-throughput 2.5x`` nothing was seeded) and would not be seeded.
2. **The study**: ``autocompress study run --mode weights`` for that target, budget, space and seed
   (its defaults: the three baselines and best-uniform's two runners-up seeded, the proxy's points,
   ASHA),
   ``--trials`` trials (the counts completed, stopped early and failed are recorded); its best
   feasible trial (lowest KL on the selection rows) is the ``searched`` arm, cut with the indices the
   trial kept.
3. **Scoring**: ``searched`` and ``best-uniform`` cut from the parent, per-row KL to the parent on
   the **test** split (``--test-rows`` rows per domain, code and prose: documents no search step
   reads), then **equal recovery** (``--distill-steps`` distillation steps, one recipe, each of
   ``--recovery-seeds``) and scored again. Searched − best-uniform gets a 95 % interval paired over
   rows (and resampled over recovery seeds), before and after recovery. Each arm's constraint margin
   by the cost model is kept too, at its median prediction and at the pessimistic end of its 90 %
   interval.

Every finished cell is written at once into ``results/sweep.json`` (atomically, keyed by cell, merged
with whatever the file holds), with the command, the code version, timings and trial counts; a rerun
skips finished cells and resumes an unfinished study from its storage. With ``--tasks`` every
recovered model is also scored on accuracy tasks that can resolve a few points (clean items, a dev
block that screens out tasks at chance or ceiling, one fresh block per recovery seed:
``benchmarks/_sweep_tasks.py``), in a file of its own (``--results``). A recovered model two cells
share (best-uniform is the same model at every study seed) is trained once. Holm's correction runs
over every comparison of the file: each cell before and after recovery, and, per (target, budget)
with two or more seeds, the seeds pooled. ``benchmarks/_render_sweep.py`` renders the file
(docs/results/sweep.md) and draws ``results/sweep.png``.

Examples::

    .venv/bin/python benchmarks/bench_sweep.py --plan            # the cells, in the order they run
    .venv/bin/python benchmarks/bench_sweep.py                   # the whole sweep (days on 2 cores)
    .venv/bin/python benchmarks/bench_sweep.py --cells rtx5070:in-game/middle/0
    .venv/bin/python benchmarks/bench_sweep.py --targets h100-sxm:datacenter --budgets light,aggressive --seeds 0
    .venv/bin/python benchmarks/bench_sweep.py --trials 2 --distill-steps 2 --results /tmp/sweep-smoke \\
        --cells rtx5070:in-game/middle/0                        # a smoke run into a scratch folder
    .venv/bin/python benchmarks/bench_sweep.py --summarise       # Holm again over the file, nothing runs
    .venv/bin/python benchmarks/bench_sweep.py --tasks --results benchmarks/results/sweep_tasks \\
        --cells rtx5070:in-game/middle/0                        # accuracy too, on fresh clean items
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _sweep_tasks

MODEL = "smollm2-135m"
NAME = "sweep"
RESULTS = Path(__file__).parent / "results"
CACHE = Path(".autocompress")
# The fraction of the parent's cost each budget keeps on the target's primary metric.
BUDGETS = {"light": 0.85, "middle": 0.6, "aggressive": 0.4}
TARGETS = ("rtx5070:in-game", "h100-sxm:datacenter")  # every budget: one consumer, one datacenter target
MIDDLE_TARGETS = ("rtx5080:local-coding", "b200:datacenter")  # the other head-to-head targets, middle only
SEEDS = (0, 1, 2)
# The metric a budget sets, per workload: what the workload's cost is on its hardware.
PRIMARY = {"in-game": "ttft_ms", "local-coding": "ttft_ms", "datacenter": "output_throughput_tok_s"}
HELD = ("ttft_ms", "tpot_ms", "e2e_latency_ms", "output_throughput_tok_s")  # held at 1x unless primary
FLAGS = {  # `study run`'s flag of each constrainable metric
    "ttft_ms": "--max-ttft-ms",
    "tpot_ms": "--max-tpot-ms",
    "output_throughput_tok_s": "--min-throughput",
    "peak_memory_gib": "--max-memory-gib",
}
# A study that exits with an error is run again (it resumes from its storage) this many times: one
# crash in a long sweep (a trial killed for memory on a shared host: the study exits 1) should not
# cost the cell.
STUDY_RETRIES = 3
CONFIDENCE = 0.9  # the cost model's interval a margin is also judged at
ARMS = ("searched", "best-uniform")
VERDICTS = ("searched better", "best-uniform better", "not resolved after correction")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (target, budget, study seed); ``key`` names it in the results file."""

    target: str  # hardware:workload
    budget: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.target}/{self.budget}/s{self.seed}"

    @property
    def group(self) -> str:
        """The study group's name (one study per cell: its target's hardware within the group)."""
        return f"sweep-{self.target.split(':')[1]}-{self.budget}-s{self.seed}"

    @classmethod
    def parse(cls, text: str) -> Cell:
        """``rtx5070:in-game/middle/0`` (or ``.../s0``)."""
        parts = text.strip().split("/")
        if len(parts) != 3 or ":" not in parts[0] or parts[1] not in BUDGETS:
            raise SystemExit(f"--cells: {text!r} is not hardware:workload/budget/seed with a budget of {list(BUDGETS)}")
        try:
            return cls(parts[0], parts[1], int(parts[2].removeprefix("s")))
        except ValueError:
            raise SystemExit(f"--cells: {text!r}: the seed {parts[2]!r} is not an integer") from None


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The examples as written, and every option's default."""


def trial_counts(records: list[Any], asked: int) -> dict[str, int]:
    """Trials per state (lower case) with ``pruned`` the trials a scheduler stopped early only; the
    points the proxy screened out without running (PRUNED too, with a ``proxy_infeasible`` record)
    counted apart as ``proxy_infeasible``; ``asked`` and ``feasible`` (complete and feasible)."""
    screened = sum(r.state == "PRUNED" and r.proxy_infeasible is not None for r in records)
    states = [r.state for r in records]
    counts = {s.lower(): states.count(s) for s in sorted(set(states))}
    if screened:
        counts["pruned"] -= screened
        counts["proxy_infeasible"] = screened
    counts.update(asked=asked, feasible=sum(r.state == "COMPLETE" and bool(r.feasible) for r in records))
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="examples:" + __doc__.split("Examples::", 1)[1],
        formatter_class=_Formatter,
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="hardware:workload list, run at every budget")
    p.add_argument(
        "--middle-targets",
        default=",".join(MIDDLE_TARGETS),
        help="targets run at the middle budget only ('' for none)",
    )
    p.add_argument(
        "--budgets",
        default=",".join(BUDGETS),
        help=f"of {', '.join(f'{k} (keeps {100 * v:.0f} %% of the cost)' for k, v in BUDGETS.items())}",
    )
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="study seeds (sampler and inner search)")
    p.add_argument("--cells", default="", help="only these cells, target/budget/seed,... (overrides the three above)")
    p.add_argument("--trials", type=int, default=12, help="weights-mode trials per study")
    p.add_argument("--test-rows", type=int, default=32, help="test-split rows per domain (code, prose)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per test and recovery row")
    p.add_argument("--recovery-seeds", default="0,1", help="distillation seeds per arm (at least two)")
    p.add_argument("--distill-steps", type=int, default=30, help="recovery steps, every arm")
    p.add_argument("--distill-batch", type=int, default=4, help="rows per recovery step")
    p.add_argument("--distill-lr", type=float, default=1e-4, help="recovery learning rate")
    p.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples of each interval and p-value")
    _sweep_tasks.add_arguments(p)
    p.add_argument(
        "--results", type=Path, default=RESULTS, help="folder of sweep.json / sweep.png (scratch: a test run)"
    )
    p.add_argument("--work", type=Path, default=None, help="study storage, spaces, logs (None: <results>/h2h-sweep)")
    p.add_argument("--plan", action="store_true", help="print the cells in the order they would run, run nothing")
    p.add_argument(
        "--summarise", action="store_true", help="recompute the pooled intervals, Holm and the plot, run nothing"
    )
    args = p.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.recovery_seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--recovery-seeds: {args.recovery_seeds!r} is not a list of integers") from None
    args.work = args.work or args.results / "h2h-sweep"
    return args


def planned(args: argparse.Namespace) -> list[Cell]:
    """The cells to run, most informative first: seed 0 before the replicates, the middle budget before
    the others, the every-budget targets before the middle-only ones."""
    if args.cells:
        return [Cell.parse(c) for c in args.cells.split(",") if c.strip()]
    budgets = [b for b in args.budgets.split(",") if b]
    unknown = [b for b in budgets if b not in BUDGETS]
    if unknown:
        raise SystemExit(f"--budgets: {unknown} not among {', '.join(BUDGETS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    main = [t for t in args.targets.split(",") if t]
    middle = [t for t in args.middle_targets.split(",") if t and t not in main]
    cells = [Cell(t, b, s) for t in main for b in budgets for s in seeds]
    cells += [Cell(t, "middle", s) for t in middle for s in seeds if "middle" in budgets]
    rank = list(BUDGETS).index

    def priority(c: Cell) -> tuple[int, int, int, int]:
        extra = c.target not in main
        return (
            extra,
            c.seed,
            0 if c.budget == "middle" else 1 + rank(c.budget),
            (middle if extra else main).index(c.target),
        )

    return sorted(cells, key=priority)


# ------------------------------------------------------------------------- budget and space
def budget_constraints(workload: str, keep: float) -> dict[str, str]:
    """The constraint overrides of a budget keeping ``keep`` of the parent's cost: the workload's
    :data:`PRIMARY` metric at ``keep`` (``1/keep`` for throughput), its other latency and throughput
    limits at ``1x``, its memory limits as they are."""
    from autocompress_opt.serving.workloads import get_workload

    if workload not in PRIMARY:
        raise SystemExit(f"no budget metric for workload {workload!r}; known: {', '.join(PRIMARY)}")
    out: dict[str, str] = {}
    for c in get_workload(workload).constraints:
        if c.metric == PRIMARY[workload]:
            out[c.metric] = f"{(keep if c.upper else 1 / keep):.4g}x"
        elif c.metric in HELD:
            out[c.metric] = "1x"
    return out


def budget_target(cell: Cell) -> Any:
    from autocompress_opt.serving.targets import Target

    hardware, workload = cell.target.split(":", 1)
    return Target(hardware, workload, constraints=budget_constraints(workload, BUDGETS[cell.budget]))


def budget_space(base: Any, points: list[dict[str, int]], grid: dict[str, tuple[int, ...]]) -> Any:
    """``base`` with each choice's floor lowered to the lowest value of ``points`` (the baselines'
    choices), through the uniform grid's values below it (``grid``: the same steps); a choice no point
    goes below keeps its values."""
    from autocompress_opt.arch.search_space import Choice, SearchSpace

    choices = []
    for choice in base.choices:
        lowest = min((p[choice.name] for p in points), default=min(choice.values))
        extra = [v for v in grid[choice.name] if lowest <= v < min(choice.values)]
        choices.append(Choice(choice.name, tuple(sorted({*choice.values, *extra}))))
    return SearchSpace(tuple(choices), sampler=base.sampler)


def baselines_and_space(target: Any, parent: Any, scoring: tuple[Any, Any], where: Path) -> dict[str, Any]:
    """The three seeded baselines on the whole uniform grid, the space that follows them (written to
    ``where`` as YAML) and best-uniform chosen again on that space, exactly as the study seeds it."""
    import yaml

    from autocompress_opt.arch.search_space import SearchSpace, load_search_space
    from autocompress_opt.prune.loadability import rules_engine_for
    from autocompress_opt.prune.uniform_grid import grid_values
    from autocompress_opt.search.study.config import SEEDED_BASELINES
    from autocompress_opt.search.study.seeding import choose_baseline

    importance, score = scoring
    engine = rules_engine_for(target.engine_name)
    grid = grid_values(parent)
    anywhere = SearchSpace.from_dict({"sampler": "tpe", **{k: list(v) for k, v in grid.items()}})
    choose = lambda name, space: choose_baseline(
        name, target, parent, space, importance=importance, score=score, serve_as=engine
    )
    chosen = {name: choose(name, anywhere) for name in SEEDED_BASELINES}
    base = load_search_space(MODEL)
    space = budget_space(base, [s.point for s in chosen.values() if s.point is not None], grid)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(yaml.safe_dump(space.to_dict(), sort_keys=False), encoding="utf-8")
    best = choose("best-uniform", space)
    return {
        "space": {c.name: [min(c.values), max(c.values)] for c in space.choices},
        "space_lowered": [c.name for c in space.choices if min(c.values) < min(base[c.name].values)],
        "baselines": {
            n: {"point": s.point, "finding": s.result.finding, "skipped": s.skipped} for n, s in chosen.items()
        },
        "best_uniform": best,
    }


def study_config(seed: int, target: Any) -> Any:
    """The study config whose seeding :class:`SeedScoring` reproduces: the defaults of `study run
    --mode weights` with ``seed`` (the space and trial count do not enter the scoring)."""
    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.search.study.config import StudyConfig

    return StudyConfig(
        name=NAME,
        model=MODEL,
        targets=(target,),
        space=load_search_space(MODEL),
        trials=1,
        mode="weights",
        seed=seed,
        cache_dir=str(CACHE),
    )


def margins(arch: Any, target: Any, parent: Any) -> dict[str, Any]:
    """Each constraint's slack (``-violation``: the fraction of the limit left; below 0 it is missed)
    by the cost model at its median prediction, and at the pessimistic end of its :data:`CONFIDENCE`
    interval (the engine's profile's held-out residuals; equal where it has none)."""
    from autocompress_opt.serving.targets import parent_metrics

    reference = parent_metrics(parent, target)
    median, _ = target.check(arch, reference)
    try:
        pessimistic, _ = dataclasses.replace(target, confidence=CONFIDENCE).check(arch, reference)
    except Exception as exc:  # no profile for this engine and hardware: no interval to judge at
        pessimistic, why = {}, f"{type(exc).__name__}: {exc}"
    else:
        why = None
    return {
        "median": {k: -v for k, v in median.items()},
        f"at_{CONFIDENCE:g}": {k: -v for k, v in pessimistic.items()},
        "inside_interval": bool(pessimistic)
        and min(-v for v in pessimistic.values()) < 0 <= min(-v for v in median.values()),
        **({"interval_unavailable": why} if why else {}),
    }


# ----------------------------------------------------------------------------------- a cell
def run_study(cell: Cell, target: Any, space: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The cell's weights-mode study (a rerun resumes it), its output in ``<work>/logs``; the best
    feasible trial (None when there is none) and the study's trial counts."""
    from bench_head_to_head import best_feasible, study_command

    from autocompress_opt.search.study import load_records

    storage = f"sqlite:///{(args.work / 'study.db').resolve()}"
    extra = ["--seed", str(cell.seed), "--space", str(space.resolve())]
    for metric, limit in target.constraints.items():
        extra += [FLAGS[metric], limit]
    cmd = study_command(MODEL, cell.target, args.trials, cell.group, storage, *extra, "--quiet")
    rc = run_logged(cmd, args.work / "logs" / f"{cell.group}.log", cell.key)
    records, attrs = load_records(storage, f"{cell.group}.{target.hardware}")
    counts = trial_counts(records, args.trials)
    try:
        pick: dict[str, Any] | None = best_feasible(storage, target, cell.group)
    except RuntimeError:
        pick = None
    return {"exit_status": rc, "trials": counts, "pick": pick, "seeds": attrs.get("baseline_seeds") or {}}


def run_logged(cmd: list[str], log: Path, label: str) -> int:
    """``cmd`` (a ``study run``, which resumes) with its output appended to ``log``, retried up to
    :data:`STUDY_RETRIES` times; its exit status (0, or 3: trials completed, none feasible)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"{label}: $ {' '.join(cmd[1:])}  (log {log})", flush=True)
    for attempt in range(1 + STUDY_RETRIES):
        with log.open("a", encoding="utf-8") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
        if rc in (0, 3):  # 3: trials completed, none feasible: a result, not a failure
            return rc
        print(f"{label}: study run exited {rc} (attempt {attempt + 1}); see {log}", flush=True)
    raise RuntimeError(f"study run exited {rc} {1 + STUDY_RETRIES} times; see {log}")


def model_key(plan: Any) -> str:
    """What identifies a cut model: its architecture as built and every kept index."""
    from bench_head_to_head import _key

    return _key(plan.architecture.to_dict() | {"name": ""}, plan.kept())


def score_before(context: Any, plan: Any, test_rows: Any) -> dict[str, Any]:
    from autocompress_opt.prune.slicing import materialize

    child = materialize(context.model, plan)
    scores = test_rows.score(child)
    del child
    return scores


def recovered(
    context: Any,
    arm: dict[str, Any],
    plan: Any,
    test_rows: Any,
    args: argparse.Namespace,
    known: dict[Any, Any],
    label: str,
    tasks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``arm`` distilled with each recovery seed and scored on the test rows (and on ``tasks``' block of
    the seed, :mod:`_sweep_tasks`); a (model, seed) recovered before (``known``, from this file) is reused."""
    from bench_inner_arms import recovered_once

    recipe = {
        "steps": args.distill_steps,
        "batch_size": args.distill_batch,
        "seq_len": args.seq_len,
        "lr": args.distill_lr,
    }
    runs = {}
    for seed in args.seed_list:
        if (arm["model_key"], seed) in known:
            runs[str(seed)] = {**known[(arm["model_key"], seed)], "reused": True}
            print(f"{label} seed {seed}: recovered before, reused", flush=True)
            continue
        began = time.perf_counter()
        extra = _sweep_tasks.scorer(tasks, 1 + args.seed_list.index(seed)) if tasks else None
        run = recovered_once(context, plan.architecture, seed, recipe, test_rows, plan=plan, extra=extra)
        runs[str(seed)] = known[(arm["model_key"], seed)] = run
        print(
            f"{label} seed {seed}: test KL {run['test']['kl_to_parent']:.4f} ({time.perf_counter() - began:.0f} s)",
            flush=True,
        )
    return runs


def run_cell(cell: Cell, args: argparse.Namespace, shared: dict[str, Any], known: dict[Any, Any]) -> dict[str, Any]:
    """Everything of one cell (module doc), as its record in the results file."""
    from _h2h_test import differences, summary
    from bench_head_to_head import arm_plan
    from bench_inner_arms import per_layer

    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.search.study.export import trial_parent
    from autocompress_opt.search.study.seeding import SeedScoring

    target, seconds, began = budget_target(cell), {}, time.perf_counter()
    context, _ = trial_parent(MODEL, {}, cache_dir=CACHE, workload=target.workload)
    parent = context.architecture
    limits = ", ".join(f"{k} {v}" for k, v in target.constraints.items())
    print(f"{cell.key}: baselines and the budget's space ({limits})", flush=True)
    t0 = time.perf_counter()
    seeding = SeedScoring(study_config(cell.seed, target))
    space = args.work / "spaces" / f"{cell.target.replace(':', '-')}-{cell.budget}.yaml"
    chosen = baselines_and_space(target, parent, seeding(target), space)
    seeding.release()  # every score it made is on disk, where the study's own seeding finds it
    best = chosen.pop("best_uniform")
    seconds["baselines"] = time.perf_counter() - t0
    lowered = chosen["space_lowered"] or "none"
    print(f"{cell.key}: space {chosen['space']} (lowered: {lowered}); best-uniform {best.result.finding}", flush=True)
    t0 = time.perf_counter()
    study = run_study(cell, target, space, args)
    seconds["study"] = time.perf_counter() - t0
    pick = study.pop("pick")
    found = f"trial {pick['trial']}, {Architecture.from_dict(pick['architecture']).summary()}" if pick else "none"
    print(f"{cell.key}: study trials {study['trials']}; best feasible: {found}", flush=True)
    record: dict[str, Any] = {
        "target": cell.target,
        "budget": cell.budget,
        "keep": BUDGETS[cell.budget],
        "study_seed": cell.seed,
        "constraints": dict(target.constraints),
        **chosen,
        "study": {k: v for k, v in study.items() if k != "seeds"},
        "best_uniform_as_study_seeded": (study["seeds"].get("best-uniform") or {}).get("point") == best.point,
        "arms": {},
    }
    archs = {"best-uniform": best.architecture}
    if pick is not None:
        archs["searched"] = Architecture.from_dict(pick["architecture"])
        record["study"]["best"] = {k: v for k, v in pick.items() if k not in ("architecture", "kept")}
    if archs["best-uniform"] is None or pick is None:
        record["unavailable"] = "no feasible trial" if pick is None else f"no best-uniform model: {best.skipped}"
    plans = {
        arm: arm_plan(context, arch, pick["kept"] if arm == "searched" and pick else None)
        for arm, arch in archs.items()
        if arch is not None
    }
    t0 = time.perf_counter()
    scores = {}
    for arm, plan in plans.items():
        built = plan.architecture
        scores[arm] = score_before(context, plan, shared["test_rows"])
        record["arms"][arm] = {
            "summary": built.summary(),
            "params": built.num_params,
            "uniform": built.active().is_uniform,
            "layers": per_layer(built),
            "model_key": model_key(plan),
            "margins": margins(built, target, parent),
            "test": summary(scores[arm]),
            "rows": {d: scores[arm][d] for d in ("code", "prose")},
        }
        print(
            f"{cell.key}: {arm} {built.summary()}: test KL before recovery {summary(scores[arm])['kl_to_parent']:.4f}",
            flush=True,
        )
    seconds["test_before"] = time.perf_counter() - t0
    if "unavailable" in record:
        record["seconds"] = {**seconds, "cell": time.perf_counter() - began}
        return record
    record["same_model"] = record["arms"]["searched"]["model_key"] == record["arms"]["best-uniform"]["model_key"]
    t0 = time.perf_counter()
    for arm, plan in plans.items():
        record["arms"][arm]["recovered"] = recovered(
            context, record["arms"][arm], plan, shared["test_rows"], args, known, f"{cell.key}: {arm}", shared["tasks"]
        )
    seconds["recovery"] = time.perf_counter() - t0
    runs = {arm: [r["rows"] for r in _after(record, arm)] for arm in ARMS}
    record["difference"] = {
        "before": differences([scores["searched"]], [scores["best-uniform"]], n_boot=args.n_boot)["kl"],
        "after": differences(runs["searched"], runs["best-uniform"], n_boot=args.n_boot)["kl"],
    }
    if shared["tasks"]:
        record["tasks"] = _sweep_tasks.compare(record, shared["tasks"], ARMS, args.n_boot)
    record["seconds"] = {**seconds, "cell": time.perf_counter() - began}
    return record


# -------------------------------------------------------------------------------- the file
def _kl_runs(runs: list[dict[str, Any]]) -> list[dict[str, list[float]]]:
    return [{d: r["rows"][d]["kl"] for d in ("code", "prose")} for r in runs]


def _after(cell: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    return [r for _, r in sorted(cell["arms"][arm]["recovered"].items())]


def pooled(cells: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """Per (target, budget) with two or more finished seeds: searched − best-uniform after recovery,
    every study seed's recovered runs pooled (paired over rows, resampled over runs), the spread of the
    per-seed differences across study seeds, and the mean spread across recovery seeds within a cell."""
    from _h2h_test import differences

    groups: dict[str, list[str]] = {}
    for key, c in cells.items():
        if "difference" in c:
            groups.setdefault(f"{c['target']}/{c['budget']}", []).append(key)
    out = {}
    for group, keys in sorted(groups.items()):
        if len(keys) < 2:
            continue
        searched = [r["rows"] for k in keys for r in _after(cells[k], "searched")]
        baseline = [r["rows"] for k in keys for r in _after(cells[k], "best-uniform")]
        by_seed = [cells[k]["difference"]["after"]["mean"] for k in keys]
        within = [statistics.stdev(_per_recovery_seed(cells[k])) for k in keys if len(_per_recovery_seed(cells[k])) > 1]
        out[group] = {
            "cells": keys,
            "after": differences(searched, baseline, n_boot=n_boot)["kl"],
            "by_study_seed": by_seed,
            "sd_across_study_seeds": statistics.stdev(by_seed),
            "sd_across_recovery_seeds": statistics.fmean(within) if within else None,
        }
    return out


def _per_recovery_seed(cell: dict[str, Any]) -> list[float]:
    """searched − best-uniform test KL per recovery seed (the seeds both arms share)."""
    a, b = cell["arms"]["searched"]["recovered"], cell["arms"]["best-uniform"]["recovered"]
    return [a[s]["test"]["kl_to_parent"] - b[s]["test"]["kl_to_parent"] for s in sorted(a) if s in b]


def corrected(cells: dict[str, Any], groups: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """Holm over every comparison of the file: each cell's searched − best-uniform before and after
    recovery, and each pooled (target, budget) after recovery; two-sided bootstrap p-values from the
    intervals' replicates (:func:`~autocompress_opt.tasks.scoring.seeded_bootstrap_p`)."""
    from _h2h_test import holm_comparisons

    from autocompress_opt.tasks.scoring import seeded_bootstrap_p

    raw: dict[str, float] = {}
    diffs: dict[str, float] = {}
    for key, c in cells.items():
        if "difference" not in c:
            continue
        for when in ("before", "after"):
            pair = [[c["arms"][a]] for a in ARMS] if when == "before" else [_after(c, a) for a in ARMS]
            name = f"{key}: searched vs best-uniform, {when} recovery"
            raw[name] = seeded_bootstrap_p(_kl_runs(pair[0]), _kl_runs(pair[1]), n_boot=n_boot, seed=0)
            diffs[name] = c["difference"][when]["mean"]
    for group, g in groups.items():
        name = f"{group}: searched vs best-uniform, after recovery, {len(g['cells'])} study seeds pooled"
        runs = [[r for k in g["cells"] for r in _after(cells[k], a)] for a in ARMS]
        raw[name] = seeded_bootstrap_p(_kl_runs(runs[0]), _kl_runs(runs[1]), n_boot=n_boot, seed=0)
        diffs[name] = g["after"]["mean"]
    accuracy = {}
    for name, (p, points) in _sweep_tasks.family(cells).items():
        raw[name], accuracy[name] = p, points
    tasks = " and each cell's mean task accuracy after recovery" if accuracy else ""
    return {
        "family": len(raw),
        "method": "Holm over every comparison of the file (each cell before and after recovery, each (target, budget) "
        f"with its study seeds pooled{tasks}); bootstrap over test rows (task items) and recovery seeds",
        "comparisons": holm_comparisons(raw, diffs, VERDICTS, accuracy),
    }


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What every cell of one file shares (a file made with other settings is not extended)."""
    from autocompress_opt.search.study.config import RUNNERS_UP

    return {
        "model": MODEL,
        "budgets": BUDGETS,
        "primary_metric": PRIMARY,
        "trials": args.trials,
        "test_rows": args.test_rows,
        "seq_len": args.seq_len,
        "recovery": {
            "steps": args.distill_steps,
            "batch_size": args.distill_batch,
            "lr": args.distill_lr,
            "seeds": args.seed_list,
        },
        "n_boot": args.n_boot,
        "runners_up": RUNNERS_UP,  # best-uniform's next-best candidates each study seeds (the study's default)
        **_sweep_tasks.settings(args),
    }


def read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def save(
    path: Path, settings: dict[str, Any], header: dict[str, Any], key: str | None, record: dict[str, Any] | None
) -> dict[str, Any]:
    """Merge ``record`` as cell ``key`` into the file at ``path`` as it is now (another process may have
    added cells), recompute the pooled intervals and Holm, and replace the file atomically."""
    from _util import machine

    from autocompress_opt.cache import publish

    data = read(path) or {"cells": {}}
    if data.get("settings", settings) != settings:
        raise SystemExit(
            f"{path} holds cells made with other settings: {data['settings']} (now {settings}); use --results"
        )
    if key is not None:
        data["cells"][key] = record
    data.update(header, benchmark=NAME, settings=settings, date=f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}")
    data["machine"] = machine()
    data["pooled"] = pooled(data["cells"], settings["n_boot"])
    data["corrected"] = corrected(data["cells"], data["pooled"], settings["n_boot"])
    publish(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8"))
    return data


def describe() -> str:
    """``git describe --always --dirty`` of this checkout (the code a cell ran), "" without git."""
    try:
        cmd = ["git", "describe", "--always", "--dirty", "--tags"]
        return subprocess.run(cmd, cwd=Path(__file__).parent, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    path = args.results / f"{NAME}.json"
    cells = planned(args)
    if args.plan:
        for i, cell in enumerate(cells, 1):
            print(f"{i:2d}. {cell.key}: {budget_constraints(cell.target.split(':')[1], BUDGETS[cell.budget])}")
        return
    if args.summarise:
        data = read(path)
        if data is None:
            raise SystemExit(f"no {path} to summarise")
        data = save(path, data["settings"], {}, None, None)
        for name, v in data["corrected"]["comparisons"].items():
            diff = f"{v['kl_diff']:+.4f} nats" if "kl_diff" in v else f"{v['acc_diff_pts']:+.2f} pts"
            print(f"{name}: {diff}, p {v['p']:.4f}, Holm {v['p_holm']:.4f}: {v['verdict']}")
        __import__("_render_sweep").plot(data, *pictures(args.results))
        return
    if len(args.seed_list) < 2:
        raise SystemExit("--recovery-seeds: at least two, so that recovery's own spread is measured")
    from _h2h_test import TestRows
    from _render_sweep import plot
    from _util import provenance

    from autocompress_opt.search.study.export import trial_parent

    settings = settings_of(args)
    done = (read(path) or {}).get("cells", {})
    if (read(path) or {}).get("settings", settings) != settings:
        raise SystemExit(f"{path} holds cells made with other settings; give another --results")
    header = {
        "provenance": provenance(study_seeds=sorted({c.seed for c in cells}), recovery=args.seed_list, bootstrap=0)
    }
    # the parent as the first cell's trials load it (one model per process: every context shares it)
    context, _ = trial_parent(MODEL, {}, cache_dir=CACHE, workload=cells[0].target.split(":")[1] if cells else None)
    test_rows = TestRows(context.model, context.tokenizer, rows=args.test_rows, seq_len=args.seq_len, seed=0)
    header["test_rows"] = test_rows.record()
    shared = {"test_rows": test_rows, "tasks": _sweep_tasks.build(args)}
    known = {
        (arm["model_key"], int(s)): run
        for c in done.values()
        for arm in c.get("arms", {}).values()
        for s, run in arm.get("recovered", {}).items()
        if not run.get("reused")
    }
    code = {"describe": describe(), **header["provenance"]["code"]}
    for i, cell in enumerate(cells, 1):
        if cell.key in done:
            print(f"[{i}/{len(cells)}] {cell.key}: done already", flush=True)
            continue
        print(f"[{i}/{len(cells)}] {cell.key}: running", flush=True)
        try:
            record = run_cell(cell, args, shared, known)
        except Exception as exc:  # one cell's failure (a study that crashed) does not stop the sweep
            print(f"{cell.key}: FAILED: {type(exc).__name__}: {exc}; rerun to retry", flush=True)
            continue
        record.update(command=shlex.join([Path(sys.executable).name, *sys.argv]), code=code)
        data = save(path, settings, header, cell.key, record)
        diff = record.get("difference", {}).get("after")
        line = (
            f"{diff['mean']:+.4f} nats [{diff['ci95'][0]:+.4f}, {diff['ci95'][1]:+.4f}]"
            if diff
            else record.get("unavailable")
        )
        print(
            f"{cell.key}: searched - best-uniform after recovery {line} ({record['seconds']['cell'] / 60:.1f} min)",
            flush=True,
        )
        acc = (record.get("tasks") or {}).get("difference")
        if acc:
            kept = ", ".join(record["tasks"]["kept"])
            print(f"{cell.key}: mean accuracy ({kept}) {acc['mean']:+.2f} pts {acc['ci95']}", flush=True)
        plot(data, *pictures(args.results))


def pictures(results: Path) -> list[Path]:
    """Where the plot goes: <results>/sweep.png, and for the committed file also the docs page's
    picture and plots/ (git-ignored: the user's copy)."""
    paths = [results / f"{NAME}.png"]
    root = results.resolve().parent.parent
    if results.resolve().parent.name == "benchmarks" and (root / "docs" / "results").is_dir():
        paths += [root / "docs" / "results" / f"{NAME}.png", root / "plots" / f"{NAME}.png"]
    return paths


if __name__ == "__main__":
    main()
