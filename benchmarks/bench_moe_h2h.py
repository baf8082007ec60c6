"""Issue 44's MoE head-to-head: on the real-weights MoE, does the search beat the uniform cuts a
practitioner would make, at the same hardware budget?

The parent is the recovered real-weights MoE (``benchmarks/build_moe.py --distill-steps 200``:
SmolLM2-135M split into 8 experts of 192 channels, top-4, a ``MixtralForCausalLM``). A **cell** is a
target at a budget (:func:`bench_sweep.budget_constraints`: keep ``--keep`` of the parent's cost on
the workload's primary metric, the other latency and throughput limits at the parent's own). Per
cell, every arm meets the same constraints by the exact cost model (equal constraint: the same
latency / throughput limits, so an arm's active parameters are what that budget allows it):

* ``searched``: the best feasible trial of a weights-mode study on the MoE (``study run --mode
  weights``, the default MoE space: depth, experts kept, top-``k`` and expert width chosen by the outer
  loop; the layers cut by importance, then which experts and channels by the inner expert search);
* ``uniform`` (Minitron-style): the study's own ``minitron`` seed point, the largest feasible points
  of the same space scored by the masked KL, cut by importance alone (the trial's ``start`` candidate);
* ``experts-only``: every layer and head kept at the parent's width and top-``k``, the most experts
  (of ``1..E``) that meet the budget (the most used kept);
* ``depth``: every head and expert kept, the most layers (of ``1..L``, not the study space's floor)
  that meet the budget (the lowest skip-loss dropped, a MoE and an attention layer kept).

An arm no point of its family meets is recorded as unavailable with the reason. Each arm is scored on
the **test** split (``--test-rows`` rows per domain, code and prose; per-row KL to the MoE parent),
then recovered with one recipe (``--distill-steps`` distillation steps from the MoE parent, each of
``--recovery-seeds``) and scored again; ``searched`` minus each other arm gets a 95 % interval paired
over rows and resampled over recovery seeds, and Holm's correction runs over every comparison of the
file. Each arm's active and total parameters and its constraint margins are kept.

Every finished cell is written at once into ``results/moe_h2h.json`` (merged with what the file
holds); a rerun skips finished cells and resumes a study from its storage (``--work``)::

    .venv/bin/python benchmarks/build_moe.py --distill-steps 200   # the parent, once (~25 min)
    .venv/bin/python benchmarks/bench_moe_h2h.py                   # both cells (hours on 2 cores)
    .venv/bin/python benchmarks/bench_moe_h2h.py --cells rtx5070:in-game --trials 2 --distill-steps 2 \\
        --results /tmp/moe-smoke --work /tmp/moe-smoke/work       # a smoke run into a scratch folder
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from build_moe import add_checkpoint_argument

NAME = "moe_h2h"
RESULTS = Path(__file__).parent / "results"
CACHE = Path(".autocompress")  # the trial caches a study run from the checkout uses (importance, data)
TARGETS = ("rtx5070:in-game", "h100-sxm:datacenter")
ARMS = ("searched", "uniform", "experts-only", "depth")
VERDICTS = ("searched better", "other arm better", "not resolved after correction")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, "recovered", " (build it with build_moe.py --distill-steps 200)")
    parser.add_argument("--cells", default=",".join(TARGETS), help="hardware:workload targets, comma-separated")
    parser.add_argument("--keep", type=float, default=0.6, help="fraction of the parent's primary-metric cost kept")
    parser.add_argument("--trials", type=int, default=12, help="weights-mode trials of each study")
    parser.add_argument("--seed", type=int, default=0, help="the study's seed (sampler and inner search)")
    parser.add_argument("--test-rows", type=int, default=32, help="test-split rows per domain (code, prose)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per test and recovery row")
    parser.add_argument("--recovery-seeds", default="0,1", help="distillation seeds of every arm")
    parser.add_argument("--distill-steps", type=int, default=30)
    parser.add_argument("--distill-batch", type=int, default=4)
    parser.add_argument("--distill-lr", type=float, default=1e-4)
    parser.add_argument("--n-boot", type=int, default=10_000)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where moe_h2h.json goes")
    parser.add_argument("--work", type=Path, default=RESULTS / "h2h-moe", help="the studies' storage and logs")
    args = parser.parse_args(argv)
    if not (args.moe / "config.json").is_file():
        parser.error(
            f"--moe {args.moe}: no checkpoint there; build it: python benchmarks/build_moe.py --distill-steps 200"
        )
    if not 0 < args.keep < 1:
        parser.error(f"--keep {args.keep}: a fraction in (0, 1), e.g. 0.6")
    args.seed_list = [int(s) for s in str(args.recovery_seeds).split(",") if s.strip()]
    return args


# ------------------------------------------------------------------------------------ arms
def cell_target(spec: str, keep: float) -> Any:
    from bench_sweep import budget_constraints

    from autocompress_opt.serving.targets import Target

    hardware, _, workload = spec.partition(":")
    return Target(hardware, workload, constraints=budget_constraints(workload, keep))


def largest_feasible(
    space: Any, parent: Any, target: Any, order: list[int], vary: str, fixed: dict[str, int]
) -> dict[str, int] | None:
    """The point whose ``vary`` choice is the largest of ``1..`` the parent's that meets ``target`` (its
    uniform child in the layer ``order``), every other choice at the parent's (``fixed`` aside), None
    when none does. A baseline's own range, not the study space's: that space's floors (e.g. two thirds
    of the depth) are the search's, not the practitioner's."""
    from autocompress_opt.arch.hybrid import sparse_limits
    from autocompress_opt.arch.search_space import uniform_allocation
    from autocompress_opt.serving.targets import parent_metrics

    reference = parent_metrics(parent, target)
    limits = sparse_limits(parent)
    base = {k: v for k, v in (limits | fixed).items() if k in space.names}
    for value in range(limits[vary], 0, -1):
        point = {**base, vary: value}
        if point.get("experts_per_token", 0) > point.get("num_experts", 1 << 30):
            continue
        if target.feasible(uniform_allocation(point, parent, order), reference):
            return point
    return None


def cut_point(context: Any, point: dict[str, int]) -> tuple[Any, dict[str, Any], Any]:
    """The importance cut of ``point``: its layers (dense_cut), then its experts, channels and top-k
    by importance (the trial's ``start``); the child, its expert record and its architecture."""
    from autocompress_opt.arch.hybrid import sparse_limits
    from autocompress_opt.prune.expert_kept import expert_kept
    from autocompress_opt.prune.experts import expert_masks, slice_experts
    from autocompress_opt.search.inner.experts import SEARCHED_CHOICES
    from autocompress_opt.search.study.weights_trial import dense_cut

    cut = dense_cut(context, point)
    has = sparse_limits(cut.architecture)
    masks = expert_masks(
        cut.model, cut.importance, {k: v for k, v in point.items() if k in SEARCHED_CHOICES and k in has}
    )
    child = slice_experts(cut.model, masks)
    kept = expert_kept(masks, cut.architecture, cut.layers, cut.heads)
    return child, kept, child_architecture(child, cut, context.architecture)


def child_architecture(child: Any, cut: Any, parent: Any) -> Any:
    from autocompress_opt.hf.adapters import moe_adapter

    return cut.spread(moe_adapter(child).architecture(child), parent)


def searched_child(context: Any, kept: dict[str, Any]) -> tuple[Any, Any]:
    """The study trial's child from its expert record, and its architecture over the parent's layers."""
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.prune.expert_kept import kept_layers, kept_model
    from autocompress_opt.prune.experts import slice_experts
    from autocompress_opt.search.study.weights_trial import DenseCut

    model, masks = kept_model(context.model, kept)
    child = slice_experts(model, masks)
    layers = kept_layers(kept, context.architecture.num_layers)
    cut = DenseCut(model, moe_adapter(model).architecture(model), None, layers)
    return child, child_architecture(child, cut, context.architecture)


def margins(arch: Any, target: Any, parent: Any) -> dict[str, Any]:
    from bench_sweep import margins as sweep_margins

    return sweep_margins(arch, target, parent)


def recover(
    child: Any, tokenizer: Any, moe: Path, seed: int, args: argparse.Namespace, test_rows: Any
) -> dict[str, Any]:
    """``child`` saved, distilled from the MoE parent with the one recipe and ``seed``, scored on the
    test rows (per row; :func:`bench_inner_arms.distilled_and_scored`); the scratch folder is deleted."""
    from bench_inner_arms import distilled_and_scored

    from autocompress_opt.recover.distill import DistillRecipe

    where = Path(tempfile.mkdtemp(prefix="moe-h2h-", dir=args.work))
    try:
        began = time.perf_counter()
        child.save_pretrained(where / "export")
        tokenizer.save_pretrained(where / "export")
        recipe = DistillRecipe(
            seed=seed, steps=args.distill_steps, batch_size=args.distill_batch, seq_len=args.seq_len, lr=args.distill_lr
        )
        return distilled_and_scored(where, str(moe), recipe, test_rows, began)
    finally:
        shutil.rmtree(where, ignore_errors=True)


# ------------------------------------------------------------------------------------ a cell
def run_cell(spec: str, args: argparse.Namespace, test_rows: Any) -> dict[str, Any]:
    from _h2h_test import differences, summary
    from bench_head_to_head import best_feasible, study_command
    from bench_sweep import FLAGS, run_logged, trial_counts

    from autocompress_opt.search.study import load_records
    from autocompress_opt.search.study.config import expert_space
    from autocompress_opt.search.study.export import trial_parent

    began, seconds = time.perf_counter(), {}
    target = cell_target(spec, args.keep)
    context, _ = trial_parent(str(args.moe), {}, cache_dir=CACHE, workload=target.workload)  # the study's caches
    parent = context.architecture
    order = context.importance.layer_order()
    space = expert_space(parent)
    group = f"moe-{target.workload}-s{args.seed}"
    storage = f"sqlite:///{(args.work / 'study.db').resolve()}"
    extra = ["--seed", str(args.seed)]
    for metric, limit in target.constraints.items():
        extra += [FLAGS[metric], limit]
    cmd = study_command(str(args.moe), spec, args.trials, group, storage, *extra, "--quiet")
    t0 = time.perf_counter()
    rc = run_logged(cmd, args.work / "logs" / f"{group}.log", spec)
    seconds["study"] = time.perf_counter() - t0
    records, attrs = load_records(storage, f"{group}.{target.hardware}")
    record: dict[str, Any] = {
        "target": spec,
        "keep": args.keep,
        "constraints": dict(target.constraints),
        "study": {"trials": trial_counts(records, args.trials), "exit_status": rc, "group": group},
        "space": {c.name: list(c.values) for c in space.choices if len(c.values) > 1},
        "arms": {},
    }
    children: dict[str, tuple[Any, Any]] = {}
    try:
        pick = best_feasible(storage, target, group)
        children["searched"] = searched_child(context, pick["kept"])
        record["study"]["best"] = {k: v for k, v in pick.items() if k not in ("architecture", "kept")}
    except RuntimeError as exc:
        record["arms"]["searched"] = {"unavailable": str(exc)}
    seed_point = ((attrs.get("baseline_seeds") or {}).get("minitron") or {}).get("point")
    points = {
        "uniform": seed_point,
        "experts-only": largest_feasible(
            space, parent, target, order, "num_experts", {"num_layers": parent.num_layers}
        ),
        "depth": largest_feasible(space, parent, target, order, "num_layers", {}),
    }
    for arm, point in points.items():
        if point is None:
            record["arms"][arm] = {"unavailable": "no point of this arm's family meets the budget"}
            continue
        child, kept, arch = cut_point(context, point)
        children[arm] = (child, arch)
        record["arms"][arm] = {"point": point}
        if "searched" in children:  # the same units as the study's best: the same model
            record["arms"][arm]["same_model_as_searched"] = kept == pick["kept"]
    t0 = time.perf_counter()
    scores = {}
    for arm, (child, arch) in children.items():
        scores[arm] = test_rows.score(child)
        record["arms"][arm] = {
            **record["arms"].get(arm, {}),
            "summary": arch.summary(),
            "params": arch.num_params,
            "active_params": arch.active_params(),
            "layers": sum(not layer.is_noop for layer in arch.layers),
            "margins": margins(arch, target, parent),
            "test": summary(scores[arm]),
            "rows": {d: scores[arm][d] for d in ("code", "prose")},
        }
        print(
            f"{spec}: {arm} {arch.summary()}: test KL before recovery {summary(scores[arm])['kl_to_parent']:.4f}",
            flush=True,
        )
    seconds["test_before"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for arm, (child, _) in children.items():
        runs = {}
        for seed in args.seed_list:
            run = recover(child, context.tokenizer, args.moe, seed, args, test_rows)
            runs[str(seed)] = run
            print(f"{spec}: {arm} recovered, seed {seed}: test KL {run['test']['kl_to_parent']:.4f}", flush=True)
        record["arms"][arm]["recovered"] = runs
    seconds["recovery"] = time.perf_counter() - t0
    if "searched" in children:
        after = lambda arm: [r["rows"] for _, r in sorted(record["arms"][arm]["recovered"].items())]
        record["difference"] = {
            arm: {
                "before": differences([scores["searched"]], [scores[arm]], n_boot=args.n_boot)["kl"],
                "after": differences(after("searched"), after(arm), n_boot=args.n_boot)["kl"],
            }
            for arm in children
            if arm != "searched"
        }
    record["seconds"] = {**seconds, "cell": time.perf_counter() - began}
    return record


# ------------------------------------------------------------------------------------ the file
def corrected(cells: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """Holm over every comparison of the file: searched vs each other arm, per cell, before and after
    recovery (two-sided bootstrap p-values over test rows and recovery seeds)."""
    from _h2h_test import holm_comparisons

    from autocompress_opt.tasks.scoring import seeded_bootstrap_p

    def runs(arm: dict[str, Any], when: str) -> list[dict[str, list[float]]]:
        rows = [arm["rows"]] if when == "before" else [r["rows"] for _, r in sorted(arm["recovered"].items())]
        return [{d: r[d]["kl"] for d in ("code", "prose")} for r in rows]

    raw: dict[str, float] = {}
    diffs: dict[str, float] = {}
    for key, cell in cells.items():
        for arm, diff in (cell.get("difference") or {}).items():
            for when in ("before", "after"):
                name = f"{key}: searched vs {arm}, {when} recovery"
                a, b = cell["arms"]["searched"], cell["arms"][arm]
                raw[name] = seeded_bootstrap_p(runs(a, when), runs(b, when), n_boot=n_boot, seed=0)
                diffs[name] = diff[when]["mean"]
    return {
        "family": len(raw),
        "method": "Holm over every comparison of the file (searched vs each other arm, before and after recovery); "
        "bootstrap over test rows and recovery seeds",
        "comparisons": holm_comparisons(raw, diffs, VERDICTS),
    }


def main(argv: list[str] | None = None) -> None:
    from _h2h_test import TestRows
    from _util import provenance, write

    from autocompress_opt.hf.loading import load_model

    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{NAME}.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    cells: dict[str, Any] = data.get("cells", {})
    loaded = load_model(str(args.moe))
    test_rows = TestRows(loaded.model, loaded.tokenizer, rows=args.test_rows, seq_len=args.seq_len, seed=0)
    settings = {
        "moe": args.moe.name,
        "keep": args.keep,
        "trials": args.trials,
        "study_seed": args.seed,
        "test_rows": args.test_rows,
        "seq_len": args.seq_len,
        "recovery": {
            "steps": args.distill_steps,
            "batch": args.distill_batch,
            "lr": args.distill_lr,
            "seeds": args.seed_list,
        },
    }
    if data and data.get("settings") != settings:
        raise SystemExit(f"{path} was made with other settings ({data.get('settings')}); use --results elsewhere")
    for spec in [c.strip() for c in args.cells.split(",") if c.strip()]:
        if spec in cells:
            print(f"{spec}: finished before, skipped", flush=True)
            continue
        cells[spec] = run_cell(spec, args, test_rows)
        out = {
            "benchmark": NAME,
            "settings": settings,
            "split": test_rows.record(),
            "cells": cells,
            "holm": corrected(cells, args.n_boot),
            "provenance": provenance(study_seed=args.seed),
            "command": "python benchmarks/bench_moe_h2h.py " + " ".join(sys.argv[1:] if argv is None else argv),
        }
        print(f"wrote {write(NAME, out, args.results)}", flush=True)


if __name__ == "__main__":
    main()
