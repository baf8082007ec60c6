"""Head-to-head at the same hardware constraint: our Pareto study's best point vs the Minitron-style baseline.

For each target (hardware × its paper workload, whose constraints are relative to the parent so they
bind for SmolLM2-135M):

* (a) **searched** — the best feasible point (highest held-out quality) of a weights-mode Pareto
  study (``autocompress study run``: outer Optuna/Ray loop + inner per-layer mask search);
* (b) **minitron** — the uniform, parameter-targeted architecture a practitioner would pick
  (:func:`~autocompress_opt.prune.baselines.uniform_baseline`): the largest parameter fraction, in
  0.25 % steps, whose architecture meets the same constraints by the same cost model; of its two
  width recipes (FFN alone, or hidden size and FFN by one ratio) the one with more parameters
  (:func:`~autocompress_opt.prune.baselines.minitron_picks`);
* (c) **minitron_other** — the other recipe's pick, where it has one (``--no-other-recipe`` skips
  it): the search should beat the Minitron-style baseline whichever recipe a practitioner chose.

All arms are cut from the same parent with the same importance scores, exported, given the **same**
distillation recovery budget (``autocompress distill``: same steps × batch × tokens, seed, data),
and evaluated on the offline eight-task suite (seven accuracy tasks + held-out perplexity). The
difference in average accuracy gets a paired bootstrap 95 % interval (items resampled within each
task, tasks weighted equally).

Every stage is cached under ``benchmarks/results/h2h/`` (``h2h-<model>/`` for a ``--model`` other
than SmolLM2-135M; git-ignored models, studies, per-arm JSON), so an interrupted run resumes where it
stopped; ``results/head_to_head.json`` and ``results/head_to_head.png`` (``head_to_head_<model>.*``)
are the summary.

Run: ``.venv/bin/python benchmarks/bench_head_to_head.py`` (``--help`` for the budgets).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import write

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.prune.baselines import minitron_picks
from autocompress_opt.search.budget import CostGoal
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import Target

MODEL = "smollm2-135m"
TARGETS = (("rtx5070", "in-game"), ("rtx5080", "local-coding"), ("h100-sxm", "datacenter"), ("b200", "datacenter"))
ROOT = Path(__file__).parent / "results" / "h2h"
CACHE = Path(".autocompress")
ARMS = ("searched", "minitron", "minitron_other")
LABELS = {
    "searched": "hardware-guided search (study's best)",
    "minitron": "Minitron-style, largest meeting the constraint",
    "minitron_other": "Minitron-style, the other width recipe",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--model", default=MODEL, help="parent model")
    p.add_argument("--targets", default=",".join(f"{h}:{w}" for h, w in TARGETS), help="hardware:workload list")
    p.add_argument("--trials", type=int, default=3, help="weights-mode study trials per target")
    p.add_argument("--distill-steps", type=int, default=30, help="recovery steps, both arms")
    p.add_argument("--distill-batch", type=int, default=4, help="rows per recovery step")
    p.add_argument("--distill-seq-len", type=int, default=128, help="tokens per recovery row")
    p.add_argument("--distill-lr", type=float, default=1e-4, help="recovery learning rate")
    p.add_argument("--items", type=int, default=60, help="items per task")
    p.add_argument("--task-seed", type=int, default=0, help="seed of the task builders")
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help=f"cache of every stage (models, study, per-arm JSON); default {ROOT} for {MODEL}, "
        f"{ROOT}-MODEL for another model",
    )
    p.add_argument("--boot", type=int, default=10000, help="bootstrap resamples")
    p.add_argument(
        "--no-other-recipe",
        action="store_true",
        help="skip the third arm: the Minitron-style pick of the width recipe with fewer parameters",
    )
    p.add_argument(
        "--other-recipe-targets",
        default=None,
        help="comma-separated hardware names that get the third arm (default: every target)",
    )
    p.add_argument(
        "--no-study",
        action="store_true",
        help="use the study storage as it is (e.g. while another process runs the study)",
    )
    args = p.parse_args(argv)
    if args.work is None:
        args.work = ROOT if args.model == MODEL else ROOT.with_name(f"{ROOT.name}-{args.model}")
    return args


def result_name(model: str) -> str:
    """``head_to_head`` for the default model, ``head_to_head_<model>`` for another (one summary each)."""
    return "head_to_head" if model == MODEL else f"head_to_head_{model}"


# ---------------------------------------------------------------------------------- stages
def run_study(args: argparse.Namespace, targets: list[Target]) -> str:
    """The weights-mode study group (resumes when the storage already holds trials)."""
    storage = f"sqlite:///{(args.work / 'study.db').resolve()}"
    cmd = [
        sys.executable,
        "-m",
        "autocompress_opt",
        "study",
        "run",
        "--model",
        args.model,
        "--mode",
        "weights",
        "--targets",
        ",".join(f"{t.hardware}:{t.workload}" for t in targets),
        "--trials",
        str(args.trials),
        "--name",
        "h2h",
        "--storage",
        storage,
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return storage


def best_feasible(storage: str, target: Target) -> dict[str, Any]:
    """The feasible COMPLETE trial with the highest quality (ties: the earlier trial)."""
    from autocompress_opt.search.study import load_records

    records, _ = load_records(storage, f"h2h.{target.hardware}")
    pool = [r for r in records if r.feasible and r.quality is not None]
    if not pool:
        raise RuntimeError(f"the study of {target.hardware} has no feasible trial; run more trials")
    best = max(pool, key=lambda r: (r.quality, -r.number))
    return {
        "trial": best.number,
        "quality": best.quality,
        "params": best.params,
        "architecture": best.architecture,
        "n_trials": len(records),
        "n_feasible": len(pool),
    }


def fresh_stage(where: Path, arch: Architecture) -> None:
    """Forget an arm's cached stages when its architecture changed (e.g. the study found a better point)."""
    import shutil

    record = where / "architecture.json"
    wanted = json.dumps(arch.to_dict(), sort_keys=True)
    if record.is_file() and record.read_text(encoding="utf-8") != wanted:
        shutil.rmtree(where)
    where.mkdir(parents=True, exist_ok=True)
    record.write_text(wanted, encoding="utf-8")


def export_arm(args: argparse.Namespace, arch: Architecture, out: Path, card: dict[str, Any]) -> Architecture:
    """Cut ``arch`` from the parent with the trials' importance scores and export it to ``out``
    (skipped when done). Returns the built architecture: ``arch`` with each kept layer's actual
    attention window (a sliding or full parent layer; the uniform baseline only guesses them)."""
    built = out.parent / "built_architecture.json"
    if (out / "config.json").is_file() and built.is_file():
        return Architecture.from_json(built.read_text(encoding="utf-8"))
    from autocompress_opt.prune.export import export_model
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize
    from autocompress_opt.search.weights_trial import TrialConfig, parent_context

    context, _ = parent_context(args.model, TrialConfig(), CACHE)
    plan = plan_pruning(context.architecture, context.importance, arch)
    if not (out / "config.json").is_file():
        export_model(
            materialize(context.model, plan),
            plan.architecture,
            out,
            parent={"model": args.model},
            card=card,
            tokenizer=context.tokenizer,
            force=True,
        )
    plan.architecture.save(built)
    return plan.architecture


def distill_arm(args: argparse.Namespace, student: Path, out: Path) -> dict[str, Any]:
    """The recovery budget, identical for every arm (resumes from its own checkpoint)."""
    from autocompress_opt.recover.distill import DistillRecipe, distill

    recipe = DistillRecipe(
        steps=args.distill_steps,
        batch_size=args.distill_batch,
        seq_len=args.distill_seq_len,
        lr=args.distill_lr,
        seed=0,
    )
    from autocompress_opt.recover.distill import RecipeMismatchError

    try:
        result = distill(str(student), args.model, out, recipe, progress=True)
    except RecipeMismatchError as exc:  # the budget flags changed since the cached run: start over
        print(f"{out}: {exc}; restarting", flush=True)
        result = distill(str(student), args.model, out, recipe, progress=True, restart=True)
    if result.resumed_from_step < recipe.steps:  # trained now: an earlier evaluation is stale
        (out.parent / "eval.json").unlink(missing_ok=True)
    record = result.to_dict()
    record.pop("losses", None)
    return {
        **record,
        "first_loss": result.losses[0] if result.losses else None,
        "last_loss": result.losses[-1] if result.losses else None,
    }


def evaluate_arm(args: argparse.Namespace, model_ref: str, out: Path) -> dict[str, Any]:
    """The eight-task suite on one model (cached as JSON)."""
    if out.is_file():
        cached = json.loads(out.read_text(encoding="utf-8"))
        if (cached["settings"].get("n_items"), cached["settings"].get("seed")) == (args.items, args.task_seed):
            return cached
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.tasks.builders import TASK_NAMES
    from autocompress_opt.tasks.scoring import evaluate_tasks

    loaded = load_model(model_ref)
    report = evaluate_tasks(
        loaded.model,
        loaded.tokenizer,
        list(TASK_NAMES),
        n_items=args.items,
        seed=args.task_seed,
        batch_size=8,
        progress=True,
        ppl_samples=8,
        ppl_seq_len=256,
    ).to_dict()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def same_global_choices(args: argparse.Namespace, pick: dict[str, Any], searched: Architecture) -> dict[str, Any]:
    """Held-out KL (before recovery) of the study's pick vs the uniform allocation of the same global
    choices (what the inner search is for), measured as every weights trial measures quality."""
    import math

    from autocompress_opt.arch.search_space import uniform_allocation
    from autocompress_opt.search.weights_trial import TrialConfig, evaluate_architecture, parent_context

    context, _ = parent_context(args.model, TrialConfig(), CACHE)
    uniform = uniform_allocation(pick["params"], context.architecture, context.importance.layer_order())
    searched_q = evaluate_architecture(searched, args.model, cache_dir=CACHE)
    uniform_q = evaluate_architecture(uniform, args.model, cache_dir=CACHE)
    return {
        "global_choices": pick["params"],
        "searched_kl": searched_q["kl_to_parent"],
        "uniform_kl": uniform_q["kl_to_parent"],
        "uniform": uniform.summary(),
        "searched_quality_in_study": pick["quality"],
        "study_kl": -math.log(pick["quality"]),
    }


def costs(arch: Architecture, target: Target) -> dict[str, float]:
    constrained = {c.metric for c in target.resolved_workload().constraints} | {"peak_memory_gib"}
    metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
    return {k: v for k, v in metrics.items() if k in constrained}


def correctness(report: dict[str, Any]) -> dict[str, list[bool]]:
    """Per-task item correctness under each task's metric (averaged tasks), for the paired bootstrap."""
    return {t["name"]: t["correct"] for t in report["tasks"] if t["name"] in report["averaged_tasks"]}


def scores(report: dict[str, Any]) -> dict[str, float]:
    return {t["name"]: t["score"] for t in report["tasks"]}


def perplexity(report: dict[str, Any]) -> dict[str, float] | None:
    held = report.get("heldout_perplexity")
    return {k: held[k] for k in ("ppl_code", "ppl_prose")} if held else None


def plot(rows: list[dict[str, Any]], parent_accuracy: float, path: Path, model: str) -> None:
    """Average accuracy per target, searched vs Minitron-style, with the parent as a line; the paired
    bootstrap interval of the difference is written above each pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    x = range(len(rows))
    arms = [a for a in ARMS if any(a in r for r in rows)]
    width = 0.8 / len(arms)
    for arm, colour in zip(arms, ("tab:blue", "tab:gray", "silver")):
        at, heights = [], []
        for i, r in zip(x, rows):  # the arms a target has, centred on it
            present = [a for a in arms if a in r]
            if arm in present:
                at.append(i + (present.index(arm) - (len(present) - 1) / 2) * width)
                heights.append(100 * r[arm]["average_accuracy"])
        ax.bar(at, heights, width=width, color=colour, label=LABELS[arm])
    for i, r in zip(x, rows):
        d = r["difference_points"]
        top = 100 * max(r[a]["average_accuracy"] for a in ARMS if a in r)
        ax.text(i, top + 1, f"{d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]", ha="center", fontsize=8)
    ax.axhline(100 * parent_accuracy, color="black", lw=0.8, ls="--", label="parent (unpruned)")
    ax.set_xticks(list(x), [f"{r['hardware']}\n{r['workload']}" for r in rows])
    ax.set_ylabel("average accuracy, 7 tasks (%)")
    ax.set_title(f"{model}, same constraint, same recovery budget")
    highest = max([100 * parent_accuracy] + [100 * r[a]["average_accuracy"] for r in rows for a in ARMS if a in r])
    ax.set_ylim(0, highest + 16)
    ax.legend(fontsize=7, loc="upper center", ncol=2 if len(arms) > 2 else 3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    began = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.tasks.scoring import paired_bootstrap

    targets = [Target(h, w) for h, _, w in (t.partition(":") for t in args.targets.split(","))]
    parent = load_architecture(args.model)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    storage = f"sqlite:///{(args.work / 'study.db').resolve()}" if args.no_study else run_study(args, targets)
    seconds["study"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    parent_report = evaluate_arm(args, args.model, args.work / "parent" / "eval.json")
    seconds["eval_parent"] = time.perf_counter() - t0
    rows = []
    for target in targets:
        goal = CostGoal.for_target(target, parent)
        pick = best_feasible(storage, target)
        picks = minitron_picks(parent, lambda arch, goal=goal: goal.target.feasible(arch, goal.parent_metrics))
        if not picks:
            raise RuntimeError(f"no parameter target meets the constraints of {target}")
        best, *others = picks
        archs = {"searched": Architecture.from_dict(pick["architecture"]), "minitron": best.architecture}
        wanted = args.other_recipe_targets is None or target.hardware in args.other_recipe_targets.split(",")
        if others and wanted and not args.no_other_recipe:
            archs["minitron_other"] = others[0].architecture
        same = same_global_choices(args, pick, archs["searched"])
        row: dict[str, Any] = {
            "hardware": target.hardware,
            "workload": target.workload,
            "constraints": [str(c) for c in target.resolved_workload().constraints],
            "parent_costs": costs(parent, target),
            "study_pick": {k: v for k, v in pick.items() if k != "architecture"},
            "minitron_param_fraction": best.param_fraction,
            "minitron_width_recipe": best.width,
            "minitron_other_recipe": {"width_recipe": others[0].width, "param_fraction": others[0].param_fraction}
            if others
            else None,
            "same_global_choices": same,
        }
        reports = {}
        for arm in archs:
            arch, where = archs[arm], args.work / target.hardware / arm
            fresh_stage(where, arch)
            t0 = time.perf_counter()
            built = export_arm(
                args, arch, where / "export", {"benchmark": "head_to_head", "arm": arm, "target": target.to_dict()}
            )
            distilled = distill_arm(args, where / "export", where / "distilled")
            t1 = time.perf_counter()
            reports[arm] = evaluate_arm(args, str(where / "distilled"), where / "eval.json")
            row[arm] = {
                "summary": arch.summary(),
                "params": arch.num_params,
                "costs": costs(built, target),
                "feasible_as_built": goal.target.feasible(built, goal.parent_metrics),
                "attention_layers": sum(s.attention for s in arch.layers),
                "ffn_layers": sum(s.ffn for s in arch.layers),
                "average_accuracy": reports[arm]["average_accuracy"],
                "tasks": scores(reports[arm]),
                "perplexity": perplexity(reports[arm]),
                "distill": distilled,
                "seconds": {"export_distill": t1 - t0, "eval": time.perf_counter() - t1},
            }
        diff, lo, hi = paired_bootstrap(
            correctness(reports["searched"]), correctness(reports["minitron"]), n_boot=args.boot, seed=0
        )
        row["difference_points"] = {"mean": diff, "ci95": [lo, hi]}
        if "minitron_other" in reports:
            d2, lo2, hi2 = paired_bootstrap(
                correctness(reports["searched"]), correctness(reports["minitron_other"]), n_boot=args.boot, seed=0
            )
            row["difference_vs_other_recipe_points"] = {"mean": d2, "ci95": [lo2, hi2]}
        print(
            f"{target.hardware:9s} searched {row['searched']['average_accuracy']:.4f} "
            f"minitron {row['minitron']['average_accuracy']:.4f}  diff {diff:+.2f} pts [{lo:+.2f}, {hi:+.2f}]",
            flush=True,
        )
        rows.append(row)
        summarise(
            args,
            parent,
            parent_report,
            rows,
            {**seconds, "total": time.perf_counter() - began},
            complete=len(rows) == len(targets),
        )


def summarise(
    args: argparse.Namespace,
    parent: Architecture,
    parent_report: dict[str, Any],
    rows: list[dict[str, Any]],
    seconds: dict[str, float],
    *,
    complete: bool,
) -> None:
    """Write the summary JSON and plot; called after every target, so an interrupted run keeps the
    targets it finished (``"complete": false`` until the last). Targets of an earlier run with the
    same budgets that this run does not cover are kept, so ``--targets`` can add one at a time."""
    name = result_name(args.model)
    budgets = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    same = ("items", "task_seed", "distill_steps", "distill_batch", "distill_seq_len", "distill_lr", "work")
    earlier = Path(__file__).parent / "results" / f"{name}.json"
    if earlier.is_file():
        old = json.loads(earlier.read_text(encoding="utf-8"))
        if all(old.get("budgets", {}).get(k) == budgets.get(k) for k in same):
            mine = {r["hardware"] for r in rows}
            order = [h for h, _ in TARGETS]
            rows = sorted(
                [r for r in old["targets"] if r["hardware"] not in mine] + rows,
                key=lambda r: order.index(r["hardware"]) if r["hardware"] in order else len(order),
            )
    plot(rows, parent_report["average_accuracy"], Path(__file__).parent / "results" / f"{name}.png", parent.name)
    write(
        name,
        {
            "model": args.model,
            "complete": complete,
            "budgets": budgets,
            "parent": {
                "summary": parent.summary(),
                "params": parent.num_params,
                "average_accuracy": parent_report["average_accuracy"],
                "tasks": scores(parent_report),
                "perplexity": perplexity(parent_report),
            },
            "targets": rows,
            "seconds": seconds,
        },
    )


if __name__ == "__main__":
    main()
