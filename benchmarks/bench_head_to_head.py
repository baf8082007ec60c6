"""Head-to-head at the same hardware constraint: the study's best point against the strongest baselines.

For each target (hardware × its workload, whose constraints are relative to the parent so they bind
for SmolLM2-135M), four arms, all cut from the same parent with the importance scores the target's
trials used (its workload's calibration rows, :meth:`TrialConfig.for_workload`), checked by the
same exact cost model, exported, recovered and evaluated identically:

* **searched** — the best feasible point (lowest KL on the study's *selection* rows) of a
  weights-mode study (``autocompress study run --mode weights``: outer Optuna/Ray loop + inner
  per-layer mask search; the study is seeded with the depth and Minitron picks, so its best is
  never worse than them on its own objective). The exported model is the one the trial built: cut
  with the kept layers, heads and channels the trial stored (``kept``,
  :func:`~autocompress_opt.prune.plan.plan_from_kept`);
* **minitron** — ModelOpt's Minitron candidate search
  (:func:`~autocompress_opt.prune.baselines.minitron_search`): uniform candidates within its limits
  (≤ 40 % cut per width, ≤ 20 % of depth), the top 10 by parameters scored by KL after pruning on
  calibration rows exactly as the study's seeding scores them
  (:class:`~autocompress_opt.search.study.seeding.SeedScoring`), the best kept; where nothing
  within the limits is feasible the table says so and the same search runs with the limits lifted;
* **depth** — static depth pruning at full width (ShortGPT block-influence order): the deepest
  feasible model;
* **best-uniform** — the best uniform model on the whole grid by the same KL score, no limits.

Each arm is recovered with the same distillation budget under ``--recovery-seeds`` (default 3
seeds) and evaluated on the offline eight-task suite (seven accuracy tasks + held-out perplexity)
plus its KL to the parent and perplexity before and after recovery on the **test** split
(``--test-rows`` rows of ``--test-seq-len`` tokens per domain, code and prose: documents that the
study, the importance scores, the baselines' scoring and distillation never read; ``_h2h_test``).
The difference in average accuracy, searched minus each baseline, gets a bootstrap 95 % interval
over items (paired) and recovery seeds; the differences in test KL (nats) and perplexity (as a
ratio) get one over test rows (paired) and recovery seeds — one bootstrap,
:func:`~autocompress_opt.tasks.scoring.seeded_bootstrap`. A win or loss is claimed only where the
interval excludes zero. Every reported KL and perplexity names its split (role, document counts,
digests) in the JSON (``quality_split``); the KL the study chose by (selection rows) is kept apart
as ``kl_before_selection``. Per task: its chance level, and a flag where the parent itself is at
the floor (within 5 points of chance) or the ceiling (≥ 95 %).

Every stage is cached under ``--work`` (git-ignored) in a folder per architecture, keyed by the
hash of the package code that computes it (export: arch/hf/prune; recovery: recover/hf/quality;
evaluation: tasks/hf/quality) and by its budget and seed, so a code change recomputes it instead of
reusing a stale result. The summary ``results/head_to_head.json`` (``head_to_head_<model>.json``)
carries the git commit, package versions and seeds; ``results/head_to_head.png`` plots it. It is
written after every target, and targets of an earlier run with the same budgets are kept.

Run: ``.venv/bin/python benchmarks/bench_head_to_head.py`` (``--help`` for the budgets);
``--tables`` prints the README's tables from the summary JSON (no run).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _h2h_tables import ARMS, tables
from _h2h_test import TestRows, corrected, differences
from _h2h_test import summary as test_summary
from _util import code_hash, provenance, write

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.cache import fetch, publish
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import Target

MODEL = "smollm2-135m"
TARGETS = (("rtx5070", "in-game"), ("rtx5080", "local-coding"), ("h100-sxm", "datacenter"), ("b200", "datacenter"))
RESULTS = Path(__file__).parent / "results"
ROOT = RESULTS / "h2h-v2"
CACHE = Path(".autocompress")
BASELINES = ARMS[1:]
LABELS = {
    "searched": "study's best (hardware-guided search)",
    "minitron": "Minitron candidate search",
    "depth": "depth pruning, full width",
    "best-uniform": "best uniform model",
}
FLOOR_POINTS, CEILING = 0.05, 0.95


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--model", default=MODEL, help="parent model")
    p.add_argument("--targets", default=",".join(f"{h}:{w}" for h, w in TARGETS), help="hardware:workload list")
    p.add_argument("--trials", type=int, default=12, help="weights-mode study trials per target")
    p.add_argument("--recovery-seeds", default="0,1,2", help="distillation seeds per arm (comma-separated)")
    p.add_argument("--distill-steps", type=int, default=30, help="recovery steps, every arm")
    p.add_argument("--distill-batch", type=int, default=4, help="rows per recovery step")
    p.add_argument("--distill-seq-len", type=int, default=128, help="tokens per recovery row")
    p.add_argument("--distill-lr", type=float, default=1e-4, help="recovery learning rate")
    p.add_argument("--items", type=int, default=60, help="items per task")
    p.add_argument("--task-seed", type=int, default=0, help="seed of the task builders")
    p.add_argument("--boot", type=int, default=10000, help="bootstrap resamples")
    p.add_argument(
        "--test-rows", type=int, default=32, help="test-split rows per domain (code, prose) for KL/perplexity"
    )
    p.add_argument("--test-seq-len", type=int, default=128, help="tokens per test row")
    p.add_argument("--test-seed", type=int, default=0, help="seed of the test rows")
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help=f"cache of every stage; default {ROOT} for {MODEL}, {ROOT}-MODEL for another model",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where the summary JSON and plot go (a scratch folder for a trial run, so the committed one stays)",
    )
    p.add_argument("--no-study", action="store_true", help="use the study storage as it is (no study run)")
    p.add_argument(
        "--keep-models", action="store_true", help="keep the recovered weights (default: deleted once scored)"
    )
    p.add_argument(
        "--summarise",
        action="store_true",
        help="only recompute the Holm-corrected p-values of the summary JSON of --model (runs nothing)",
    )
    p.add_argument(
        "--tables",
        action="store_true",
        help="print the README's markdown tables from the summary JSON of --model (runs nothing)",
    )
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.recovery_seeds.split(",")]
    if args.work is None:
        args.work = ROOT if args.model == MODEL else ROOT.with_name(f"{ROOT.name}-{args.model}")
    return args


def result_name(model: str) -> str:
    """``head_to_head`` for the default model, ``head_to_head_<model>`` for another (one summary each)."""
    return "head_to_head" if model == MODEL else f"head_to_head_{Path(model).name}"  # a path: its folder's name


# ---------------------------------------------------------------------------------- stages
def study_command(model: str, targets: str, trials: int, name: str, storage: str, *extra: str) -> list[str]:
    """``autocompress study run`` of a weights-mode study group ``name`` over ``targets``
    (``hardware:workload,...``) in ``storage``, ``extra`` flags appended; rerun, it resumes."""
    cmd = [sys.executable, "-m", "autocompress_opt", "study", "run", "--model", model, "--mode", "weights"]
    return cmd + ["--targets", targets, "--trials", str(trials), "--name", name, "--storage", storage, *extra]


def run_study(args: argparse.Namespace, targets: list[Target]) -> str:
    """The weights-mode study group (resumes when the storage already holds trials)."""
    storage = f"sqlite:///{(args.work / 'study.db').resolve()}"
    spec = ",".join(f"{t.hardware}:{t.workload}" for t in targets)
    cmd = study_command(args.model, spec, args.trials, "h2h", storage)
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return storage


def best_feasible(storage: str, target: Target, group: str = "h2h") -> dict[str, Any]:
    """The feasible COMPLETE trial with the lowest held-out KL (ties: the earlier trial) of the
    study of ``target`` in the study group ``group``."""
    from autocompress_opt.search.study import load_records

    records, _ = load_records(storage, f"{group}.{target.hardware}")
    pool = [r for r in records if r.state == "COMPLETE" and r.feasible and r.quality is not None]
    if not pool:
        raise RuntimeError(f"the study of {target.hardware} has no feasible trial; run more trials")
    best = max(pool, key=lambda r: (r.quality, -r.number))
    return {
        "trial": best.number,
        "kl_in_study": -math.log(best.quality),
        "params": best.params,
        "architecture": best.architecture,
        "selection": best.selection,
        "baseline": best.baseline,
        "kept": best.kept,
        "n_complete": sum(r.state == "COMPLETE" for r in records),
        "n_feasible": len(pool),
    }


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _cached(path: Path, key: str) -> dict[str, Any] | None:
    """The stage record at ``path`` when it was made under ``key`` (same code and budget), else None."""
    if path.is_file():
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("key") == key:
            return record
    return None


def _write_record(record: dict[str, Any], tmp: Path) -> None:
    tmp.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")


def _save(path: Path, key: str, record: dict[str, Any]) -> dict[str, Any]:
    """Publish ``record`` under ``key`` at ``path`` whole (:func:`autocompress_opt.cache.publish`); returns it."""
    record = {"key": key, **record}
    publish(path, lambda tmp: _write_record(record, tmp))
    return record


def _stage(path: Path, key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The stage record at ``path`` made under ``key``, else ``compute()``'s record published there
    under ``key`` (one stage file a stage, replaced when its key changes); concurrent runs on one
    host compute it once (:func:`autocompress_opt.cache.fetch`)."""
    record, _ = fetch(path, lambda: {"key": key, **compute()}, _write_record, lambda p: _cached(p, key))
    return record


def arm_plan(context: Any, arch: Architecture, kept: dict[str, Any] | None) -> Any:
    """The plan ``arch`` is cut by: the trial's stored ``kept`` indices, else ``context``'s importance."""
    from autocompress_opt.prune.plan import plan_from_kept, plan_pruning

    if kept is not None:
        return plan_from_kept(context.architecture, arch, kept)
    return plan_pruning(context.architecture, context.importance, arch)


def arm_folder(args: argparse.Namespace, plan: Any) -> Path:
    """An arm's stage folder, named by what its export keeps (the architecture as built and every
    kept index): two arms that cut the same model share it and are recovered once."""
    return args.work / "models" / _key(plan.architecture.to_dict() | {"name": ""}, plan.kept())


def export_arm(
    args: argparse.Namespace,
    context: Any,
    arch: Architecture,
    where: Path,
    target: Target,
    kept: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Cut ``arch`` from the parent (the trial's ``kept`` indices for the searched arm, else the
    target's importance: the plan the baselines' scoring used) and export it; returns the built
    architecture and the KL before recovery on the target's selection rows."""
    from autocompress_opt.search.study import export_trial
    from autocompress_opt.search.study.weights_trial import evaluate_architecture

    parent = context.architecture
    same_model = {**arch.to_dict(), "name": f"{parent.name or parent.family}-pruned"}
    key = _key("export/2", code_hash("arch", "hf", "prune", "quality", "search"), same_model, where.name)
    stage = where / "export.json"
    done = _cached(stage, key)
    if done and (where / "export" / "config.json").is_file():
        return done
    plan = export_trial(
        context,
        arch,
        where / "export",
        kept=kept,
        parent={"model": args.model},
        card={"benchmark": "head_to_head"},
        force=True,
    ).plan
    # the selection rows of the target's workload: the rows the study chose its best by
    before = evaluate_architecture(arch, args.model, cache_dir=CACHE, workload=target.workload)
    return _save(
        stage,
        key,
        {
            "built": plan.architecture.to_dict(),
            "kept_parent_layers": [lp.parent_index for lp in plan.layers],
            "kept_from": "trial" if kept is not None else "importance",
            "before": {k: before[k] for k in ("kl_to_parent", "ppl_code", "ppl_prose") if k in before},
        },
    )


def test_before(test_rows: TestRows, where: Path) -> dict[str, Any]:
    """The export (before recovery) scored on the test rows, per row (its own stage)."""
    from autocompress_opt.hf.loading import load_model

    export_key = json.loads((where / "export.json").read_text(encoding="utf-8"))["key"]
    key = _key("test-before", export_key, code_hash("quality", "data", "hf"), test_rows.key())

    def compute() -> dict[str, Any]:
        loaded = load_model(str(where / "export"))
        return {"test": test_rows.score(loaded.model)}

    return _stage(where / "test-before.json", key, compute)


def recover_and_score(args: argparse.Namespace, test_rows: TestRows, where: Path, seed: int) -> dict[str, Any]:
    """Distil the export with ``seed``, then score it: the eight tasks and, per test row, KL and CE."""
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.recover.distill import DistillRecipe, distill

    recipe = DistillRecipe(
        steps=args.distill_steps,
        batch_size=args.distill_batch,
        seq_len=args.distill_seq_len,
        lr=args.distill_lr,
        seed=seed,
    )
    export_key = json.loads((where / "export.json").read_text(encoding="utf-8"))["key"]
    key = _key(
        "recover+score",
        export_key,
        code_hash("recover", "hf", "quality", "tasks", "data"),
        recipe.to_dict(),
        args.items,
        args.task_seed,
        test_rows.key(),
    )

    def compute() -> dict[str, Any]:
        out = where / f"distilled-s{seed}"
        t0 = time.perf_counter()
        result = distill(str(where / "export"), args.model, out, recipe, progress=False, restart=True)
        t1 = time.perf_counter()
        loaded = load_model(str(out))
        report = suite(args, loaded, progress=False)
        t2 = time.perf_counter()
        test = test_rows.score(loaded.model)
        del loaded
        gc.collect()
        if not args.keep_models:
            shutil.rmtree(out, ignore_errors=True)
        return {
            "seed": seed,
            "distill": {
                "first_loss": result.losses[0] if result.losses else None,
                "last_loss": result.losses[-1] if result.losses else None,
            },
            "test": test,
            "report": report,
            "seconds": {"distill": t1 - t0, "tasks": t2 - t1, "test": time.perf_counter() - t2},
        }

    return _stage(where / f"seed{seed}.json", key, compute)


def suite(args: argparse.Namespace, loaded: Any, *, progress: bool) -> dict[str, Any]:
    """The eight-task suite (seven accuracy tasks + held-out perplexity) on a loaded model."""
    from autocompress_opt.tasks.builders import TASK_NAMES
    from autocompress_opt.tasks.scoring import evaluate_tasks

    report = evaluate_tasks(
        loaded.model,
        loaded.tokenizer,
        list(TASK_NAMES),
        n_items=args.items,
        seed=args.task_seed,
        batch_size=8,
        progress=progress,
        ppl_samples=8,
        ppl_seq_len=256,
    )
    return report.to_dict()


def parent_test(args: argparse.Namespace, test_rows: TestRows) -> dict[str, float]:
    """The parent's perplexity on the test rows (its KL to itself is 0), cached like a stage."""
    key = _key("parent-test", code_hash("quality", "data", "hf"), args.model, test_rows.key())
    record = _stage(args.work / "parent-test.json", key, lambda: {"test": test_rows.score(test_rows.parent)})
    return test_summary(record["test"])


def parent_scores(args: argparse.Namespace) -> dict[str, Any]:
    """The eight-task suite on the parent (cached by the evaluation code and budget)."""
    from autocompress_opt.hf.loading import load_model

    key = _key("parent", code_hash("tasks", "hf", "quality"), args.model, args.items, args.task_seed)
    compute = lambda: {"report": suite(args, load_model(args.model), progress=True)}
    return _stage(args.work / "parent.json", key, compute)


# ---------------------------------------------------------------------------------- tables
def costs(arch: Architecture, target: Target) -> dict[str, float]:
    constrained = {c.metric for c in target.resolved_workload().constraints} | {"peak_memory_gib"}
    metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
    return {k: v for k, v in metrics.items() if k in constrained}


def correctness(report: dict[str, Any]) -> dict[str, list[bool]]:
    """Per-task item correctness under each task's metric (averaged tasks), for the bootstrap."""
    return {t["name"]: t["correct"] for t in report["tasks"] if t["name"] in report["averaged_tasks"]}


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def task_table(parent_report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per task: chance level, the parent's score and whether the parent is at the floor or ceiling."""
    out = {}
    for t in parent_report["tasks"]:
        chance = t.get("chance", 0.0)
        flag = None
        if t["score"] <= chance + FLOOR_POINTS:
            flag = "floor"
        elif t["score"] >= CEILING:
            flag = "ceiling"
        out[t["name"]] = {"chance": chance, "parent": t["score"], "flag": flag, "metric": t.get("metric")}
    return out


def verdict(lo: float, hi: float) -> str:
    if lo > 0:
        return "searched better"
    if hi < 0:
        return "baseline better"
    return "no difference resolved (interval includes 0)"


def servable(arch: Architecture, target: Target) -> str:
    """Whether the target's serving engine loads an export of ``arch``, by its rules
    (:func:`~autocompress_opt.prune.loadability.loadable_problems`): a plain checkpoint or the DeciLM form."""
    from autocompress_opt.prune.loadability import SERVE_AS_ANY, loadable_problems, rules_engine_for

    engine = rules_engine_for(target.engine_name)
    if engine == SERVE_AS_ANY:
        return f"{target.engine_name}: no loading rules"
    problems = loadable_problems(arch, engine)
    form = "plain checkpoint" if arch.active().is_uniform else "DeciLM form"
    return f"{engine}: loads ({form})" if not problems else f"{engine}: not loadable: {'; '.join(problems)}"


def _scores(test: dict[str, Any]) -> dict[str, Any]:
    """Per-row test scores without their timings."""
    return {k: v for k, v in test.items() if k not in ("seconds", "teacher_s")}


def arm_row(
    arch: Architecture,
    built: Architecture,
    target: Target,
    export: dict[str, Any],
    before: dict[str, Any],
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    """One arm's summary: KL and perplexity on the test rows before recovery (``before``: the export
    scored) and after (``runs``: one per recovery seed), task accuracy, costs, and the per-row values."""
    reports = [r["report"] for r in runs]
    tasks = sorted({t["name"] for t in reports[0]["tasks"]})
    test_before, test_after = test_summary(before), [test_summary(r["test"]) for r in runs]
    return {
        "summary": arch.summary(),
        "params": arch.num_params,
        "uniform": arch.active().is_uniform,  # dropped layers removed: a depth-pruned model is uniform
        "servable": servable(arch, target),
        "costs": costs(built, target),
        "kept_parent_layers": export["kept_parent_layers"],
        "kl_before_selection": export["before"]["kl_to_parent"],  # selection rows: what the study chose by
        "kl_before": test_before["kl_to_parent"],  # this and the next three: the test rows
        "ppl_before": {k: test_before[k] for k in ("ppl_code", "ppl_prose")},
        "kl_after": _spread([t["kl_to_parent"] for t in test_after]),
        "ppl_after": {k: _spread([t[k] for t in test_after]) for k in ("ppl_code", "ppl_prose")},
        "average_accuracy": _spread([r["report"]["average_accuracy"] for r in runs]),
        "tasks": {
            n: _spread([next(t["score"] for t in rep["tasks"] if t["name"] == n) for rep in reports]) for n in tasks
        },
        "seeds": [r["seed"] for r in runs],
        "seconds": [{**r["seconds"], "test_score": r["test"]["seconds"]} for r in runs],
        "test_rows": {"before": _scores(before), "after": [_scores(r["test"]) for r in runs]},
    }


def plot(rows: list[dict[str, Any]], parent_accuracy: float, path: Path, model: str) -> None:
    """Average accuracy per target and arm (mean over recovery seeds, the seeds as dots), the parent as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    width = 0.8 / len(ARMS)
    colours = ("tab:blue", "tab:gray", "tab:orange", "tab:green")
    for j, (arm, colour) in enumerate(zip(ARMS, colours)):
        at = [i + (j - (len(ARMS) - 1) / 2) * width for i in range(len(rows))]
        means = [100 * r["arms"][arm]["average_accuracy"]["mean"] if arm in r["arms"] else 0 for r in rows]
        ax.bar(at, means, width=width, color=colour, label=LABELS[arm])
        for x, r in zip(at, rows):
            if arm in r["arms"]:
                vals = r["arms"][arm]["average_accuracy"]["values"]
                ax.plot([x] * len(vals), [100 * v for v in vals], "k.", ms=3)
    ax.axhline(100 * parent_accuracy, color="black", lw=0.8, ls="--", label="parent (unpruned)")
    ax.set_xticks(range(len(rows)), [f"{r['hardware']}\n{r['workload']}" for r in rows])
    ax.set_ylabel("average accuracy, 7 tasks (%)")
    ax.set_title(f"{model}: same constraint, same recovery budget (bars: mean of seeds; dots: seeds)")
    ax.set_ylim(0, 100 * parent_accuracy + 15)
    ax.legend(fontsize=7, loc="upper center", ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.summarise:
        path = args.results / f"{result_name(args.model)}.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        data["corrected"] = corrected(data["targets"], n_boot=data["budgets"]["boot"])
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}: Holm over {data['corrected']['family']} comparisons")
        return
    if args.tables:
        path = args.results / f"{result_name(args.model)}.json"
        if not path.is_file():
            raise SystemExit(f"no summary at {path}: run the benchmark for --model {args.model} first")
        print(tables(json.loads(path.read_text(encoding="utf-8"))))
        return
    began = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    args.started_code = provenance()["code"]  # the code this run imports (modules load once)
    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.prune.baselines import target_feasibility
    from autocompress_opt.prune.loadability import rules_engine_for
    from autocompress_opt.search.study.export import trial_parent
    from autocompress_opt.search.study.seeding import SeedScoring, choose_baseline
    from autocompress_opt.tasks.scoring import seeded_bootstrap

    targets = [Target(h, w) for h, _, w in (t.partition(":") for t in args.targets.split(","))]
    t0 = time.perf_counter()
    storage = f"sqlite:///{(args.work / 'study.db').resolve()}" if args.no_study else run_study(args, targets)
    seconds = {"study": time.perf_counter() - t0}
    parent_report = parent_scores(args)["report"]
    tasks = task_table(parent_report)
    # Each target's arms are cut with the importance its trials used (its workload's calibration
    # rows); the baselines score their candidates as the study's seeding does (SeedScoring: KL on
    # the inner search's calibration rows), so a baseline here is the one the study was seeded with.
    # SeedScoring reads only these fields of a study config; the study ran with the defaults.
    seeding = SeedScoring(SimpleNamespace(mode="weights", inner={}, seed=0, model=args.model, cache_dir=str(CACHE)))
    context, _ = trial_parent(args.model, {}, cache_dir=CACHE, workload=targets[0].workload)
    parent = context.architecture
    test_rows = TestRows(
        context.model, context.tokenizer, rows=args.test_rows, seq_len=args.test_seq_len, seed=args.test_seed
    )
    args.quality_split = test_rows.record()
    args.parent_test = parent_test(args, test_rows)
    rows = []
    for target in targets:
        feasible = target_feasibility(target, parent)
        pick = best_feasible(storage, target)
        context, _ = trial_parent(args.model, {}, cache_dir=CACHE, workload=target.workload)
        importance, score = seeding(target)
        assert importance.meta.data_id == context.importance.meta.data_id, "seeding and trials read other rows"
        archs = {"searched": Architecture.from_dict(pick["architecture"])}
        kept = {"searched": pick["kept"]}
        findings: dict[str, Any] = {}
        # The one implementation the study's seeding and `prune --baseline` use (seeding.choose_baseline):
        # the target's constraints, the engine's loadable shapes, the choice snapped onto the study's space.
        space = load_search_space(args.model)
        for name in BASELINES:
            seed = choose_baseline(
                name,
                target,
                parent,
                space,
                importance=importance,
                score=score,
                serve_as=rules_engine_for(target.engine_name),
            )
            result = seed.result
            findings[name] = {
                "finding": result.finding,
                "lifted_from": result.lifted_from,
                "point": seed.point,
                "snapped": seed.snapped,
                "skipped": seed.skipped,
            }
            if seed.architecture is not None:
                archs[name] = seed.architecture
        row: dict[str, Any] = {
            "code": args.started_code,  # a resumed run may add targets at a later commit
            "hardware": target.hardware,
            "workload": target.workload,
            "constraints": [str(c) for c in target.resolved_workload().constraints],
            "parent_costs": costs(parent, target),
            "study": {k: v for k, v in pick.items() if k not in ("architecture", "kept")},
            "kept_from_trial": pick["kept"] is not None,
            "importance_data": context.importance.meta.data_id,
            "baseline_findings": findings,
            "arms": {},
        }
        runs: dict[str, list[dict[str, Any]]] = {}
        befores: dict[str, dict[str, Any]] = {}
        folders: dict[str, Path] = {}
        for arm, arch in archs.items():
            where = folders[arm] = arm_folder(args, arm_plan(context, arch, kept.get(arm)))
            export = export_arm(args, context, arch, where, target, kept.get(arm))
            befores[arm] = test_before(test_rows, where)["test"]
            kl_before = test_summary(befores[arm])["kl_to_parent"]
            runs[arm] = []
            for seed in args.seeds:
                t0 = time.perf_counter()
                run = recover_and_score(args, test_rows, where, seed)
                runs[arm].append(run)
                print(
                    f"{target.hardware:9s} {arm:12s} seed {seed}: acc {run['report']['average_accuracy']:.4f} "
                    f"test KL {kl_before:.3f} -> {test_summary(run['test'])['kl_to_parent']:.3f} "
                    f"({time.perf_counter() - t0:.0f}s)  {arch.summary()}",
                    flush=True,
                )
            built = Architecture.from_dict(export["built"])
            row["arms"][arm] = {
                **arm_row(arch, built, target, export, befores[arm], runs[arm]),
                "feasible_as_built": feasible(built),
                "same_model_as": [a for a in row["arms"] if folders[a] == where],
            }
        before = {arm: row["arms"][arm]["kl_before_selection"] for arm in row["arms"]}
        best_baseline = min((before[a] for a in BASELINES if a in before), default=math.inf)
        # the study starts from the depth and minitron picks and its inner search keeps the uniform
        # allocation as a candidate: before recovery its best should not be worse than the baselines
        row["searched_no_worse_before_recovery"] = before["searched"] <= best_baseline + 1e-9
        row["differences_points"], row["differences_test"] = {}, {}
        for name in BASELINES:
            if name not in runs:
                continue
            diff, lo, hi = seeded_bootstrap(
                [correctness(r["report"]) for r in runs["searched"]],
                [correctness(r["report"]) for r in runs[name]],
                n_boot=args.boot,
                seed=0,
            )
            row["differences_points"][name] = {"mean": diff, "ci95": [lo, hi], "verdict": verdict(lo, hi)}
            row["differences_test"][name] = {
                "before": differences([befores["searched"]], [befores[name]], n_boot=args.boot),
                "after": differences(
                    [r["test"] for r in runs["searched"]], [r["test"] for r in runs[name]], n_boot=args.boot
                ),
            }
            kl = row["differences_test"][name]["after"]["kl"]
            print(
                f"{target.hardware:9s} searched - {name}: {diff:+.2f} pts [{lo:+.2f}, {hi:+.2f}]; test KL after "
                f"{kl['mean']:+.3f} nats [{kl['ci95'][0]:+.3f}, {kl['ci95'][1]:+.3f}]",
                flush=True,
            )
        rows.append(row)
        summarise(
            args,
            parent,
            parent_report,
            tasks,
            rows,
            {**seconds, "total": time.perf_counter() - began},
            complete=len(rows) == len(targets),
        )


def summarise(
    args: argparse.Namespace,
    parent: Architecture,
    parent_report: dict[str, Any],
    tasks: dict[str, Any],
    rows: list[dict[str, Any]],
    seconds: dict[str, float],
    *,
    complete: bool,
) -> None:
    """Write the summary JSON and plot after every target (``"complete": false`` until the last);
    targets of an earlier run with the same budgets that this run does not cover are kept."""
    name = result_name(args.model)
    skip = ("quality_split", "parent_test", "results")
    budgets = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in skip}
    same = (
        "items",
        "task_seed",
        "distill_steps",
        "distill_batch",
        "distill_seq_len",
        "distill_lr",
        "recovery_seeds",
        "trials",
        "test_rows",
        "test_seq_len",
        "test_seed",
    )
    earlier = args.results / f"{name}.json"
    if earlier.is_file():
        old = json.loads(earlier.read_text(encoding="utf-8"))
        if "arms" in (old.get("targets") or [{}])[0] and all(
            old.get("budgets", {}).get(k) == budgets.get(k) for k in same
        ):
            mine = {r["hardware"] for r in rows}
            order = [h for h, _ in TARGETS]
            rows = sorted(
                [r for r in old["targets"] if r["hardware"] not in mine] + rows,
                key=lambda r: order.index(r["hardware"]) if r["hardware"] in order else len(order),
            )
    args.results.mkdir(parents=True, exist_ok=True)
    plot(rows, parent_report["average_accuracy"], args.results / f"{name}.png", parent.name)
    write(
        name,
        {
            **provenance(recovery=args.seeds, tasks=args.task_seed, study=0, bootstrap=0),
            "code_at_start": args.started_code,
            "model": args.model,
            "complete": complete,
            "budgets": budgets,
            "parent": {
                "summary": parent.summary(),
                "params": parent.num_params,
                "average_accuracy": parent_report["average_accuracy"],
                "perplexity": parent_report.get("heldout_perplexity"),
                "test": args.parent_test,
            },
            "quality_split": args.quality_split,
            "tasks": tasks,
            "targets": rows,
            "corrected": corrected(rows, n_boot=args.boot),
            "seconds": seconds,
        },
        args.results,
    )


if __name__ == "__main__":
    main()
