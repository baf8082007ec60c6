"""Does choosing among a study's best trials after a short recovery pick a model that recovers better?

The compression sweep (``bench_sweep.py``) takes each study's best trial by its KL *before* recovery
as the ``searched`` arm; at b200 datacenter, middle budget, that model (3 of 9 heads kept) trailed
best-uniform after equal recovery. ``autocompress study finalists`` (:mod:`autocompress_opt.recover.finalists`)
ranks the study's ``--top`` best distinct feasible trials again after the same short distillation,
scored on the trials' selection rows. This benchmark measures whether that choice (the ``finalist``
arm) does better on the **test** split than the study's best and than best-uniform, with the
sweep's own protocol, for each finished cell of a sweep file whose study is still in its storage:

1. the finalists ranked with the sweep's recovery recipe (its steps, batch, sequence length and
   learning rate; recovery seed 0), on the selection rows: the test split is read by nothing that
   chooses;
2. the chosen finalist cut as its trial cut it and scored on the sweep's test rows before recovery,
   then recovered with each of the sweep's recovery seeds and scored again (a model the sweep
   already recovered, e.g. when the finalist *is* the study's best, is reused, not retrained);
3. finalist − best-uniform and finalist − searched, before and after recovery, with the sweep's
   paired intervals; Holm over every comparison of the file.

Each cell is written at once into ``<results>/finalists.json`` (keyed by sweep file and cell); a rerun
skips finished cells and resumes a ranking from the study's storage.

Examples::

    .venv/bin/python benchmarks/bench_finalists.py                       # every cell of results/sweep.json it can
    .venv/bin/python benchmarks/bench_finalists.py --cells rtx5070:in-game/aggressive/s1
    .venv/bin/python benchmarks/bench_finalists.py --sweep benchmarks/results/rerun/sweep.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

RESULTS = Path(__file__).parent / "results"
NAME = "finalists"
VERDICTS = ("finalist better", "other better", "not resolved after correction")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="examples:" + __doc__.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sweep", type=Path, default=RESULTS / "sweep.json", help="the sweep file whose cells are read")
    p.add_argument("--work", type=Path, default=None, help="that sweep's work folder (default <sweep dir>/h2h-sweep)")
    p.add_argument("--cells", default="", help="only these cells (keys as in the sweep file, comma-separated)")
    p.add_argument("--top", type=int, default=3, help="finalists per study (default 3)")
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of finalists.json")
    args = p.parse_args(argv)
    args.work = args.work or args.sweep.parent / "h2h-sweep"
    return args


def sweep_name(args: argparse.Namespace) -> str:
    """The sweep file as the results folder names it (``sweep.json``, ``rerun/sweep.json``)."""
    try:
        return args.sweep.resolve().relative_to(args.results.resolve()).as_posix()
    except ValueError:
        return str(args.sweep.resolve())


def read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def run_cell(
    key: str, cell: dict[str, Any], sweep: dict[str, Any], args: argparse.Namespace, shared: dict[str, Any]
) -> dict[str, Any]:
    """Rank the finalists of ``cell``'s study, score and recover the chosen one (module doc)."""
    from _h2h_test import differences, summary
    from bench_head_to_head import arm_plan
    from bench_inner_arms import per_layer
    from bench_sweep import CACHE, Cell, model_key, recovered, score_before

    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.recover.finalists import FinalistRecipe, rank_finalists
    from autocompress_opt.search.study import load_records

    settings, began = sweep["settings"], time.perf_counter()
    hardware = cell["target"].split(":")[0]
    study = f"{Cell.parse(key).group}.{hardware}"
    storage = f"sqlite:///{(args.work / 'study.db').resolve()}"
    recovery = settings["recovery"]
    recipe = FinalistRecipe(
        top=args.top,
        steps=recovery["steps"],
        batch_size=recovery["batch_size"],
        seq_len=settings["seq_len"],
        lr=recovery["lr"],
        seed=0,
    )
    ranking = rank_finalists(
        storage, study, recipe, cache_dir=CACHE, progress=False, report=lambda s: print(f"{key}: {s}", flush=True)
    )
    rank_s = time.perf_counter() - began
    chosen = ranking.chosen
    records, _ = load_records(storage, study)
    record = next(r for r in records if r.number == chosen.trial)
    context = shared["context"]
    plan = arm_plan(context, Architecture.from_dict(record.architecture), record.kept)
    arm: dict[str, Any] = {"trial": chosen.trial, "summary": plan.architecture.summary(), "model_key": model_key(plan)}
    arms = cell["arms"]
    same = arm["model_key"] == arms["searched"]["model_key"]
    out: dict[str, Any] = {
        "sweep": sweep_name(args),
        "cell": key,
        "study": study,
        "ranking": ranking.to_dict(),
        "study_best_trial": cell["study"]["best"]["trial"],
        "same_as_searched": same,
        "same_as_best_uniform": arm["model_key"] == arms["best-uniform"]["model_key"],
    }
    if same:
        arm.update({k: arms["searched"][k] for k in ("test", "rows", "recovered", "params", "uniform", "layers")})
    else:
        built = plan.architecture
        scores = score_before(context, plan, shared["test_rows"])
        arm.update(params=built.num_params, uniform=built.active().is_uniform, layers=per_layer(built))
        arm.update(test=summary(scores), rows={d: scores[d] for d in ("code", "prose")})
        ns = argparse.Namespace(
            distill_steps=recovery["steps"],
            distill_batch=recovery["batch_size"],
            seq_len=settings["seq_len"],
            distill_lr=recovery["lr"],
            seed_list=recovery["seeds"],
        )
        arm["recovered"] = recovered(context, arm, plan, shared["test_rows"], ns, shared["known"], f"{key}: finalist")
    out["arm"] = arm
    after = lambda a: [r["rows"] for r in a["recovered"].values()]
    out["difference"] = {
        other: {
            "before": differences([arm["rows"]], [arms[other]["rows"]], n_boot=settings["n_boot"])["kl"],
            "after": differences(after(arm), after(arms[other]), n_boot=settings["n_boot"])["kl"],
        }
        for other in ("searched", "best-uniform")
    }
    out["seconds"] = {"ranking": rank_s, "cell": time.perf_counter() - began}
    return out


def corrected(cells: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """Holm over every comparison of the file: each cell's finalist against the study's best and
    against best-uniform, before and after recovery."""
    from _h2h_test import holm_comparisons

    from autocompress_opt.tasks.scoring import seeded_bootstrap_p

    def runs(scores: list[dict[str, Any]]) -> list[dict[str, list[float]]]:
        return [{d: s[d]["kl"] for d in ("code", "prose")} for s in scores]

    raw: dict[str, float] = {}
    diffs: dict[str, float] = {}
    for key, c in cells.items():
        sweep_cell = c["_arms"]
        for other in ("searched", "best-uniform"):
            for when in ("before", "after"):
                if c["same_as_searched"] and other == "searched":
                    continue  # the same model: no comparison
                pick = (
                    (lambda a: [a["rows"]])
                    if when == "before"
                    else (lambda a: [r["rows"] for r in a["recovered"].values()])
                )
                name = f"{key}: finalist vs {other}, {when} recovery"
                raw[name] = seeded_bootstrap_p(
                    runs(pick(c["arm"])), runs(pick(sweep_cell[other])), n_boot=n_boot, seed=0
                )
                diffs[name] = c["difference"][other][when]["mean"]
    return {
        "family": len(raw),
        "method": "Holm over every comparison of the file; bootstrap over test rows and recovery seeds",
        "comparisons": holm_comparisons(raw, diffs, VERDICTS),
    }


def save(path: Path, key: str, record: dict[str, Any], sweep: dict[str, Any]) -> dict[str, Any]:
    from _util import machine

    from autocompress_opt.cache import publish

    data = read(path) or {"cells": {}}
    data["cells"][key] = record
    data.update(benchmark=NAME, date=f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}", machine=machine())
    with_arms = {
        k: {**c, "_arms": read(path.parent / c["sweep"])["cells"][c["cell"]]["arms"]} for k, c in data["cells"].items()
    }
    data["corrected"] = corrected(with_arms, sweep["settings"]["n_boot"])
    publish(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8"))
    return data


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sweep = read(args.sweep)
    if sweep is None:
        raise SystemExit(f"no sweep file at {args.sweep}")
    from _h2h_test import TestRows
    from bench_sweep import CACHE, MODEL

    from autocompress_opt.search.study.export import trial_parent

    path = args.results / f"{NAME}.json"
    done = (read(path) or {}).get("cells", {})
    wanted = [c.strip() for c in args.cells.split(",") if c.strip()] or list(sweep["cells"])
    todo = []
    for key in wanted:
        cell = sweep["cells"].get(key)
        name = f"{sweep_name(args)}:{key}"
        if cell is None or "difference" not in cell:
            print(f"{key}: not a finished cell of {args.sweep}; skipped", flush=True)
        elif name in done:
            print(f"{key}: done already", flush=True)
        else:
            todo.append((name, key, cell))
    if not todo:
        return
    settings = sweep["settings"]
    context, _ = trial_parent(MODEL, {}, cache_dir=CACHE, workload=todo[0][2]["target"].split(":")[1])
    test_rows = TestRows(
        context.model, context.tokenizer, rows=settings["test_rows"], seq_len=settings["seq_len"], seed=0
    )
    known = {
        (arm["model_key"], int(s)): run
        for c in sweep["cells"].values()
        for arm in c.get("arms", {}).values()
        for s, run in arm.get("recovered", {}).items()
        if not run.get("reused")
    }
    shared = {"context": context, "test_rows": test_rows, "known": known}
    for name, key, cell in todo:
        print(f"{key}: ranking the finalists", flush=True)
        try:
            record = run_cell(key, cell, sweep, args, shared)
        except Exception as exc:  # a cell whose study is gone from the storage, or a crash: the others go on
            print(f"{key}: FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        record["command"] = shlex.join([Path(sys.executable).name, *sys.argv])
        save(path, name, record, sweep)
        d = record["difference"]
        print(
            f"{key}: finalist trial {record['arm']['trial']} (study best {record['study_best_trial']}): "
            f"vs best-uniform after recovery {d['best-uniform']['after']['mean']:+.4f} "
            f"[{d['best-uniform']['after']['ci95'][0]:+.4f}, {d['best-uniform']['after']['ci95'][1]:+.4f}] "
            f"({record['seconds']['cell'] / 60:.1f} min)",
            flush=True,
        )


if __name__ == "__main__":
    main()
