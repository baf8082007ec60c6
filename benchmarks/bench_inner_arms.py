"""Issue 49's ablation of the inner search's arms on the real model, scored on the test split.

For each target (hardware × workload, its engine's shape rules) and each budget (global choices at
the parent's hidden size, so one block library serves every cell: ``light`` keeps about 85 % of the
parent's decoder, ``aggressive`` about 45 %), six arms meet the same budgets and constraints:

* **best-uniform**: the best uniform model at that cost, the comparator every verdict is against:
  :func:`~autocompress_opt.prune.baselines.make_baseline` ``best-uniform`` over the parent's uniform
  grid (any depth, width, FFN and heads), among the models that meet the target's constraints, that
  its engine loads and that have no more parameters than the budget's uniform model, ranked by KL on
  the inner search's choice rows (selection split) as a study's seeded baseline is;
* **uniform**: the uniform allocation of the budget's global choices (every kept layer alike; the
  layers kept by importance), the model a Minitron-style cut of those choices gives (absent where it
  breaks the target's constraints: the searched arms repair that, a uniform model cannot);
* **importance**: the inner search's importance start (the uniform allocation repaired and filled by
  activation importance per unit of cost), today's start point;
* **block-library**: the exact solver's answer over the per-layer block library (replace-one KL of
  every engine-legal variant of every layer, :mod:`autocompress_opt.prune.block_library`);
* **trained**: today's differentiable search (masks from the importance start, trained, discretised);
* **trained-from-library**: the same search started at the solver's answer (``start_from``).

Each arm is cut from the parent and scored on the **test** rows (``--rows`` per domain, code and
prose: documents no search step reads) by per-row KL to the parent; every arm's difference to
``best-uniform`` and to ``uniform`` gets a 95 % interval paired over rows (:func:`_h2h_test.differences`).
Then **equal recovery**: ``best-uniform`` and the ``--recover-top`` searched arms with the lowest test
KL are exported, distilled from the parent with one recipe (``--distill-steps`` steps on calibration
rows, each of ``--recovery-seeds``) and scored on the same test rows; their differences to
``best-uniform`` get intervals paired over rows and resampled over seeds. Every comparison of the file
is one family: bootstrap p-values, Holm-corrected (``corrected``). Recorded too: what each inner search
would itself have returned (its choice on its own choice rows), each arm's per-layer structure,
parameters and cost-model metrics, and the seconds of every stage. ``--plot`` draws each arm's
per-layer widths (``results/<name>.png``).

Resumable: every finished cell, and every recovered (arm, seed), is written at once to
``results/<name>.json`` and skipped by the next run with the same settings; a model two cells share
(same per-layer structure) is recovered once. The library build is cached under
``.autocompress/block_library``. Run: ``.venv/bin/python benchmarks/bench_inner_arms.py`` (``--help``);
on 2 cores in fp32 the library takes about 15 minutes once, each cell about 5 minutes before recovery
and about 1 minute per recovered (arm, seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _h2h_test import TestRows, differences, holm_comparisons, summary
from _util import provenance, write
from bench_ablation import _overrides, engine_for

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.prune.slicing import materialize
from autocompress_opt.search.study.weights_trial import (
    TrialConfig,
    _block_library_answer,
    inner_search,
    parent_context,
)
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import Target

MODEL = "smollm2-135m"
CACHE = Path(".autocompress")
RESULTS = Path(__file__).parent / "results"
DOCS_PICTURE = Path(__file__).resolve().parent.parent / "docs" / "results" / "inner-arms.png"
TARGETS = ("h100-sxm:datacenter", "rtx5070:in-game")
# Global choices at SmolLM2's hidden size (576): one block library for every cell.
BUDGETS = {
    "light": {"num_layers": 26, "hidden_size": 576, "ffn_width": 1280, "num_kv_heads": 3, "q_per_kv": 3},
    "aggressive": {"num_layers": 18, "hidden_size": 576, "ffn_width": 768, "num_kv_heads": 2, "q_per_kv": 3},
}
ARMS = ("best-uniform", "uniform", "importance", "block-library", "trained", "trained-from-library")
UNIFORM_ARMS = ("best-uniform", "uniform")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="hardware:workload list")
    p.add_argument("--budgets", default=",".join(BUDGETS), help=f"budgets, of {', '.join(BUDGETS)}")
    p.add_argument("--rows", type=int, default=16, help="test rows per domain (code, prose)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per test row")
    p.add_argument("--seed", type=int, default=0, help="inner-search seed")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of each interval")
    p.add_argument(
        "--inner",
        default="",
        help="inner-search overrides of the trained arms, key=value,... (e.g. width_step=shared)",
    )
    p.add_argument(
        "--recover-top", type=int, default=2, help="searched arms (lowest test KL) recovered beside best-uniform"
    )
    p.add_argument("--recovery-seeds", default="0,1", help="distillation seeds per recovered arm (comma-separated)")
    p.add_argument("--distill-steps", type=int, default=30, help="recovery steps, every recovered arm")
    p.add_argument("--distill-batch", type=int, default=4, help="rows per recovery step")
    p.add_argument("--distill-lr", type=float, default=1e-4, help="recovery learning rate")
    p.add_argument("--no-recover", action="store_true", help="stop after the scores before recovery")
    p.add_argument("--plot", action="store_true", help="only draw results/<name>.png from an existing file")
    p.add_argument("--name", default="inner_arms", help="results/<name>.json")
    p.add_argument(
        "--summarise",
        action="store_true",
        help="only recompute the p-values and the Holm correction of an existing results/<name>.json",
    )
    return p.parse_args(argv)


def per_layer(arch: Architecture) -> list[dict[str, int]]:
    """Each parent layer's kept structure: query heads, KV heads, FFN width (0: dropped)."""
    return [
        {
            "heads": layer.num_heads if layer.attention else 0,
            "kv_heads": layer.num_kv_heads if layer.attention else 0,
            "ffn": layer.ffn_width if layer.ffn else 0,
        }
        for layer in arch.layers
    ]


def cell(
    context: Any,
    target: Target,
    params: dict[str, int],
    seed: int,
    test_rows: TestRows,
    n_boot: int,
    inner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The five arms of one (target, budget): searched, cut, scored on the test rows; ``inner``
    overrides the inner search's settings (the data settings stay the defaults)."""
    config = TrialConfig.from_dict(inner or None, seed=seed)
    engine = engine_for(target, "target")
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    solved = _block_library_answer(context, params, target, config, CACHE, engine)
    seconds["library_and_solve"] = time.perf_counter() - began
    extra = {"block-library": solved} if solved is not None else {}
    began = time.perf_counter()
    today = inner_search(context, params, target, config, serve_as=engine, extra=extra)
    seconds["search_from_importance"] = time.perf_counter() - began
    began = time.perf_counter()
    refined = (
        inner_search(context, params, target, config, serve_as=engine, extra=extra, start_from="block-library")
        if solved is not None
        else None
    )
    seconds["search_from_library"] = time.perf_counter() - began
    began = time.perf_counter()
    best_uniform, best_uniform_finding = best_uniform_at(context, target, engine, params, config)
    seconds["best_uniform"] = time.perf_counter() - began
    archs: dict[str, Architecture | None] = {
        "best-uniform": best_uniform,
        "uniform": today.candidates.get("uniform"),
        "importance": today.candidates.get("start"),
        "block-library": solved,
        "trained": today.candidates.get("trained"),
        "trained-from-library": refined.candidates.get("trained") if refined else None,
    }
    arms: dict[str, Any] = {}
    scores: dict[str, Any] = {}
    for name, arch in archs.items():
        if arch is None:
            arms[name] = {"available": False}
            continue
        began = time.perf_counter()
        plan = plan_pruning(context.architecture, context.importance, arch)
        child = materialize(context.model, plan)
        scores[name] = test_rows.score(child)
        del child
        metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
        arms[name] = {
            "available": True,
            "summary": arch.summary(),
            "params": arch.num_params,
            "layers": per_layer(arch),
            "architecture": arch.to_dict(),
            "metrics": {k: metrics[k] for k in ("ttft_ms", "tpot_ms", "output_throughput_tok_s") if k in metrics},
            "test": summary(scores[name]),
            "rows": scores[name],
            "score_s": time.perf_counter() - began,
        }
    versus = {
        base: {
            name: differences([scores[name]], [scores[base]], n_boot=n_boot, seed=0)["kl"]
            for name in scores
            if name not in UNIFORM_ARMS and base in scores
        }
        for base in UNIFORM_ARMS
    }
    return {
        "target": f"{target.hardware}:{target.workload}",
        "engine": engine,
        "params": params,
        "seed": seed,
        "arms": arms,
        "best_uniform_finding": best_uniform_finding,
        "vs_best_uniform_kl": versus["best-uniform"],
        "vs_uniform_kl": versus["uniform"],
        "search_chose": {
            "from_importance": today.choice(),
            "from_library": refined.choice() if refined else None,
        },
        "seconds": seconds,
    }


def best_uniform_at(
    context: Any, target: Target, engine: str, params: dict[str, int], config: TrialConfig
) -> tuple[Architecture | None, str]:
    """The best uniform model at the budget's cost: ``best-uniform`` over the parent's uniform grid among
    the models that meet ``target``'s constraints, that ``engine`` loads and that have no more
    parameters than the uniform allocation of ``params``; ranked by KL on the inner search's choice
    rows (a study's seeded-baseline scoring). Returns the model (None: nothing qualifies) and the finding."""
    from autocompress_opt.arch.search_space import uniform_allocation
    from autocompress_opt.prune.baselines import make_baseline, target_feasibility
    from autocompress_opt.search.study.seeding import baseline_rows, baseline_scorer
    from autocompress_opt.search.study.trials import engine_loads

    parent = context.architecture
    cap = uniform_allocation(params, parent, context.importance.layer_order()).num_params
    meets, loads = target_feasibility(target, parent), engine_loads(parent, engine)
    accept = lambda arch: arch.num_params <= cap and loads(arch) and meets(arch)
    rows = baseline_rows(context.tokenizer, config)
    score = baseline_scorer(context.model, context.importance, rows) if rows is not None else None
    result = make_baseline("best-uniform", parent, accept, importance=context.importance, score=score)
    finding = f"{result.finding} (at most {cap:,} parameters: the budget's uniform model)"
    return (result.choice.architecture if result.choice is not None else None), finding


def to_recover(c: dict[str, Any], top: int) -> list[str]:
    """The arms one cell recovers: ``best-uniform`` and the ``top`` searched arms of lowest test KL."""
    searched = [n for n, a in c["arms"].items() if n not in UNIFORM_ARMS and a.get("available")]
    searched.sort(key=lambda n: c["arms"][n]["test"]["kl_to_parent"])
    return (["best-uniform"] if c["arms"].get("best-uniform", {}).get("available") else []) + searched[:top]


def recovered_once(
    context: Any,
    arch: Architecture,
    seed: int,
    recipe: dict[str, Any],
    test_rows: TestRows,
    plan: Any = None,
    extra: Any = None,
) -> dict[str, Any]:
    """``arch`` cut from the parent (by ``plan``, default the context's importance), exported, distilled
    from the parent with ``recipe`` and ``seed``, scored on the test rows (per row) and by ``extra``
    (see :func:`distilled_and_scored`); the scratch checkpoints are deleted."""
    import shutil
    import tempfile

    from autocompress_opt.prune.export import export_model
    from autocompress_opt.recover.distill import DistillRecipe

    CACHE.mkdir(parents=True, exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix="inner-arms-", dir=CACHE))
    try:
        began = time.perf_counter()
        plan = plan_pruning(context.architecture, context.importance, arch) if plan is None else plan
        child = materialize(context.model, plan)
        export_model(child, arch, where / "export", parent={"model": MODEL}, tokenizer=context.tokenizer)
        del child
        return distilled_and_scored(where, MODEL, DistillRecipe(seed=seed, **recipe), test_rows, began, extra)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def distilled_and_scored(
    where: Path, teacher: str, recipe: Any, test_rows: TestRows, began: float, extra: Any = None
) -> dict[str, Any]:
    """The student exported at ``where/export`` distilled from ``teacher`` with ``recipe`` (into
    ``where/distilled``) and scored on the test rows (per row): the record of one recovery run, its
    export-and-distill seconds counted from ``began``. ``extra``, a function of (model, tokenizer),
    scores it further: its result is the record's ``tasks``."""
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.recover.distill import distill

    result = distill(str(where / "export"), teacher, where / "distilled", recipe, progress=False)
    distill_s = time.perf_counter() - began
    student = load_model(str(where / "distilled"))
    scores = test_rows.score(student.model)
    run = {
        "seed": recipe.seed,
        "distill": {"first_loss": result.losses[0], "last_loss": result.losses[-1]} if result.losses else {},
        "test": summary(scores),
        "rows": scores,
        "seconds": {"export_and_distill": distill_s, "test": scores["seconds"]},
    }
    if extra is not None:
        t0 = time.perf_counter()
        run["tasks"] = extra(student.model, student.tokenizer)
        run["seconds"]["tasks"] = time.perf_counter() - t0
    return run


def _model_key(arm: dict[str, Any]) -> str:
    """What identifies an arm's model across cells: its per-layer structure and summary (every arm is
    cut from the one parent by the one importance)."""
    return json.dumps(arm["layers"]) + arm["summary"]


def recover(
    context: Any,
    done: dict[str, Any],
    test_rows: TestRows,
    args: argparse.Namespace,
    save: Any,
) -> None:
    """Equal recovery of each cell's :func:`to_recover` arms, ``args.recovery_seeds`` each, written into
    ``cell["recovered"][arm][seed]`` (``save()`` after each); a model already recovered with a seed (in
    this or another cell: same per-layer structure) is not trained again. Then each recovered searched
    arm's difference to ``best-uniform`` (``vs_best_uniform_kl_recovered``), paired over rows and
    resampled over seeds."""
    recipe = {
        "steps": args.distill_steps,
        "batch_size": args.distill_batch,
        "seq_len": args.seq_len,
        "lr": args.distill_lr,
    }
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for c in done.values():
        for arm, runs in c.get("recovered", {}).items():
            for seed, run in runs.items():
                seen[(_model_key(c["arms"][arm]), int(seed))] = run
    for key, c in done.items():
        names = to_recover(c, args.recover_top)
        for name in names:
            arm = c["arms"][name]
            shape_key = _model_key(arm)
            for seed in args.seeds:
                have = c.setdefault("recovered", {}).setdefault(name, {})
                if str(seed) in have:
                    continue
                if (shape_key, seed) in seen:
                    have[str(seed)] = {**seen[(shape_key, seed)], "same_model_as_recovered_elsewhere": True}
                else:
                    print(f"{key}: recovering {name}, seed {seed}", flush=True)
                    arch = Architecture.from_dict(arm["architecture"])
                    have[str(seed)] = seen[(shape_key, seed)] = recovered_once(context, arch, seed, recipe, test_rows)
                    print(
                        f"{key}: {name} seed {seed}: test KL {have[str(seed)]['test']['kl_to_parent']:.4f}", flush=True
                    )
                save()
        runs = {n: [c["recovered"][n][str(s)]["rows"] for s in args.seeds] for n in names}
        if "best-uniform" in runs:
            c["vs_best_uniform_kl_recovered"] = {
                n: differences(runs[n], runs["best-uniform"], n_boot=args.n_boot, seed=0)["kl"]
                for n in names
                if n != "best-uniform"
            }
        save()


def _kl_runs(*scored: dict[str, Any]) -> list[dict[str, list[float]]]:
    """Per-row test KL by domain of each scored model (an arm before recovery, or one recovery seed's
    run), one run each, as :func:`seeded_bootstrap_p` takes them."""
    return [{dom: s["rows"][dom]["kl"] for dom in ("code", "prose")} for s in scored]


def corrected(cells: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """Every comparison of the file as one family: each searched arm against ``best-uniform`` and against
    ``uniform`` before recovery, and each recovered searched arm against recovered ``best-uniform``; per
    comparison the KL difference, its two-sided bootstrap p-value over the test rows (and recovery
    seeds; :func:`seeded_bootstrap_p`, the interval's replicates) and Holm's adjustment across the
    family; ``verdict`` says whether it is resolved at 5 % after correction."""
    from autocompress_opt.tasks.scoring import seeded_bootstrap_p

    raw: dict[str, float] = {}
    diffs: dict[str, float] = {}
    for key, c in cells.items():
        for base, field in (("best-uniform", "vs_best_uniform_kl"), ("uniform", "vs_uniform_kl")):
            for name, d in c.get(field, {}).items():
                comparison = f"{key}/{name} vs {base}"
                raw[comparison] = seeded_bootstrap_p(
                    _kl_runs(c["arms"][name]), _kl_runs(c["arms"][base]), n_boot=n_boot, seed=0
                )
                diffs[comparison] = d["mean"]
        for name, d in c.get("vs_best_uniform_kl_recovered", {}).items():
            comparison = f"{key}/{name} vs best-uniform, after recovery"
            raw[comparison] = seeded_bootstrap_p(
                _kl_runs(*c["recovered"][name].values()),
                _kl_runs(*c["recovered"]["best-uniform"].values()),
                n_boot=n_boot,
                seed=0,
            )
            diffs[comparison] = d["mean"]
    return {
        "family": len(raw),
        "method": "Holm over every comparison of the file; bootstrap over test rows (and recovery seeds)",
        "comparisons": holm_comparisons(raw, diffs, ("arm better", "baseline better", "not resolved after correction")),
    }


def plot(data: dict[str, Any], out: Path, *copies: Path) -> Path:
    """Each cell's arms as rows of per-layer bars: the FFN width kept (bar height, of the parent's) and
    whether attention stays (dark bar foot); the test KL before (and after) recovery in the row's title.
    Written to ``out`` and to each of ``copies`` (the docs page's picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = data["cells"]
    arms = [a for a in ARMS if any(c["arms"].get(a, {}).get("available") for c in cells.values())]
    fig, axes = plt.subplots(
        len(arms), len(cells), figsize=(4.2 * len(cells), 1.25 * len(arms) + 0.8), squeeze=False, sharey=True
    )
    widest = max(
        layer["ffn"] for c in cells.values() for a in c["arms"].values() if a.get("available") for layer in a["layers"]
    )
    for col, (key, c) in enumerate(cells.items()):
        for row, name in enumerate(arms):
            ax = axes[row][col]
            arm = c["arms"].get(name, {})
            ax.set_xticks([])
            ax.set_yticks([])
            if not arm.get("available"):
                ax.text(
                    0.5, 0.5, "infeasible at this budget", ha="center", va="center", fontsize=7, transform=ax.transAxes
                )
                ax.set_title(name, fontsize=7, loc="left")
                continue
            layers = arm["layers"]
            xs = range(len(layers))
            ax.bar(xs, [layer["ffn"] / widest for layer in layers], color="#7aa6c2", width=0.85)
            ax.bar(xs, [0.12 if layer["heads"] else 0 for layer in layers], color="#23435a", width=0.85)
            after = c.get("recovered", {}).get(name)
            kl = f"KL {arm['test']['kl_to_parent']:.3f}"
            if after:
                kl += f" → {sum(r['test']['kl_to_parent'] for r in after.values()) / len(after):.3f} recovered"
            ax.set_title(f"{name}: {arm['params'] / 1e6:.1f}M, {kl}", fontsize=7, loc="left")
            ax.set_ylim(0, 1.05)
        axes[0][col].annotate(key, (0.5, 1.45), xycoords="axes fraction", ha="center", fontsize=9, weight="bold")
    fig.suptitle(
        "Per-layer structure of each arm\nbar: FFN width kept; dark foot: attention kept (layers 0 → 29)", fontsize=9
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    for path in (out, *copies):
        fig.savefig(path, dpi=110)
        print(f"wrote {path}")
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    path = RESULTS / f"{args.name}.json"
    if args.summarise or args.plot:
        data = json.loads(path.read_text())
        if args.plot:
            plot(data, *pictures(args.name))
            return
        data["corrected"] = corrected(data["cells"], data["settings"]["n_boot"])
        write(args.name, {k: v for k, v in data.items() if k not in ("benchmark", "date", "machine")})
        for comparison, v in data["corrected"]["comparisons"].items():
            print(f"{comparison}: {v['kl_diff']:+.4f} nats, p {v['p']:.4f}, Holm {v['p_holm']:.4f}: {v['verdict']}")
        return
    unknown = [b for b in args.budgets.split(",") if b not in BUDGETS]
    if unknown:
        raise SystemExit(f"--budgets: {unknown} not among {', '.join(BUDGETS)}")
    try:
        args.seeds = [int(x) for x in args.recovery_seeds.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(
            f"--recovery-seeds: {args.recovery_seeds!r} is not a comma-separated list of integers"
        ) from None
    targets = [Target(*t.split(":", 1)) for t in args.targets.split(",")]
    inner = _overrides(args.inner)
    settings: dict[str, Any] = {"rows": args.rows, "seq_len": args.seq_len, "seed": args.seed, "n_boot": args.n_boot}
    if inner:  # only when given: results written before the option resume as they were
        settings["inner"] = inner
    recovery = {
        "steps": args.distill_steps,
        "batch_size": args.distill_batch,
        "lr": args.distill_lr,
        "seeds": args.seeds,
        "top": args.recover_top,
    }
    done: dict[str, Any] = {}
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("settings") == settings and old.get("recovery") == recovery:
            done = old.get("cells", {})
    origin = provenance(seed=args.seed)  # the code this process runs, not the tree when it writes
    context, _ = parent_context(MODEL, TrialConfig.from_dict(None, seed=args.seed), CACHE)
    test_rows = TestRows(context.model, context.tokenizer, rows=args.rows, seq_len=args.seq_len, seed=0)

    def save() -> None:
        write(
            args.name,
            {
                "benchmark": "inner_arms",
                **origin,
                "model": MODEL,
                "settings": settings,
                "recovery": recovery,
                "test_rows": test_rows.record(),
                "cells": done,
                "corrected": corrected(done, args.n_boot),
            },
        )

    for target in targets:
        for budget in args.budgets.split(","):
            key = f"{target.hardware}:{target.workload}/{budget}"
            if key in done:
                print(f"{key}: done already", flush=True)
                continue
            print(f"{key}: running", flush=True)
            began = time.perf_counter()
            done[key] = {
                "budget": budget,
                **cell(context, target, dict(BUDGETS[budget]), args.seed, test_rows, args.n_boot, inner),
            }
            done[key]["seconds"]["cell"] = time.perf_counter() - began
            line = ", ".join(
                f"{n} {a['test']['kl_to_parent']:.4f}" for n, a in done[key]["arms"].items() if a["available"]
            )
            print(f"{key}: test KL {line}", flush=True)
            save()
    if not args.no_recover:
        recover(context, done, test_rows, args, save)
    plot(json.loads(path.read_text()), *pictures(args.name))


def pictures(name: str) -> list[Path]:
    """Where the picture goes: results/<name>.png, and for the default file also the one
    docs/results/inner-arms.md shows (docs links stay inside docs/)."""
    paths = [RESULTS / f"{name}.png"]
    if name == "inner_arms":
        paths.append(DOCS_PICTURE)
    return paths


if __name__ == "__main__":
    main()
