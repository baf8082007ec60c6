"""What the inner search contributes: uniform vs greedy start vs trained masks, at the same global choices.

For each target (hardware × workload, the workload's own constraints, which SmolLM2-135M violates)
and each of two global points a study actually runs —

* ``minitron``: the global choices the study seeds first (the Minitron candidate search's pick,
  snapped onto the bundled search space: :func:`autocompress_opt.search.study.baseline_seeds`);
* ``largest``: the feasible uniform point of the search space with the most parameters (what plan
  mode favours; :func:`bench_inner_search.plan_pick`) —

the weights trial's inner search (:func:`autocompress_opt.search.study.weights_trial.inner_search`) runs
with ``--seeds`` inner seeds (batch sampling and gate noise; the start point and the uniform
allocation do not depend on it). Each of its candidates — the **uniform** allocation of the global
choices, the **start** point (greedy repair and fill from it by importance per unit of cost; equal
to the uniform allocation whenever that is feasible and on budget) and the **trained** masks
(discretised, repaired, filled) — is then measured on the held-out evaluation rows exactly as a
weights trial measures its result (:func:`evaluate_architecture`: KL to the parent, nats, lower is
better). A fourth, deterministic arm, **greedy** (``--greedy``, added to an existing result), is
the greedy heuristic alone from the parent: every unit kept, then the least important per unit of
cost removed until every budget and constraint holds, then filled (``init=parent``, no training).
Every arm keeps the shapes the target's serving engine loads, as a study does
(:meth:`StudyConfig.serve_as_for`: the global choices made legal by :func:`legal_point`, the inner
search under that engine's rules; ``--serve-as any`` runs without engine rules, as before they existed).
Recorded per (target, point, seed): every candidate's held-out calibration KL (what the selection
sees), its evaluation KL, feasibility, and which one the selection returned. Summary: mean ± sample
standard deviation over seeds, and the fraction of runs in which the trained masks won the selection.

Writes ``results/ablation.json`` (with the git commit and seeds). Run:
``.venv/bin/python benchmarks/bench_ablation.py`` (``--help``; about 2 minutes per run on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _util import provenance, write
from bench_inner_search import plan_pick

from autocompress_opt.arch.search_space import load_search_space
from autocompress_opt.search.study import StudyConfig, baseline_seeds
from autocompress_opt.search.study.trials import legal_point
from autocompress_opt.search.study.weights_trial import TrialConfig, evaluate_architecture, inner_search, parent_context
from autocompress_opt.serving.targets import Target

MODEL = "smollm2-135m"
TARGETS = ("rtx5070:in-game", "rtx5080:local-coding", "h100-sxm:datacenter", "b200:datacenter")
CANDIDATES = ("uniform", "start", "trained")
CACHE = Path(".autocompress")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="hardware:workload list")
    p.add_argument("--points", default="minitron,largest", help="global points per target: minitron, largest")
    p.add_argument("--seeds", default="0,1,2", help="inner-search seeds")
    p.add_argument("--inner", default="", help="inner-search overrides, key=value,... (e.g. steps=80)")
    p.add_argument(
        "--serve-as",
        default="target",
        choices=("target", "any"),
        help="engine rules the inner search keeps: each target's serving engine, as a study does, or none",
    )
    p.add_argument("--name", default="ablation", help="results/<name>.json")
    p.add_argument(
        "--greedy",
        action="store_true",
        help="only add the greedy-from-the-parent arm to every row of an existing results/<name>.json",
    )
    return p.parse_args(argv)


def _overrides(text: str) -> dict[str, Any]:
    """``key=value,...`` with YAML scalars (``steps=80``, ``lr=0.02``, ``engine_relaxation=false``,
    ``ffn_unit=null``); the keys and values are checked by :class:`InnerConfig`."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--inner: {item!r} is not key=value (e.g. steps=80,engine_relaxation=false)")
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str):  # YAML 1.1 reads 1e-2 as a string
            with contextlib.suppress(ValueError):
                parsed = float(parsed)
        out[key.strip()] = parsed
    return out


def study_config(target: Target, serve_as: str) -> StudyConfig:
    """The one-target weights-mode study whose first global choices and engine rules the ablation takes."""
    return StudyConfig(
        name="ablation",
        model=MODEL,
        targets=(target,),
        space=load_search_space(MODEL),
        trials=1,
        mode="weights",
        serve_as=None if serve_as == "target" else serve_as,
    )


def engine_for(target: Target, serve_as: str) -> str:
    """The engine whose loadable shapes the arms keep (``any``: none)."""
    return study_config(target, serve_as).serve_as_for(target)


def points_for(target: Target, context: Any, wanted: list[str], serve_as: str = "target") -> dict[str, dict[str, int]]:
    """The global choices of each wanted point for ``target``, made legal for its engine as a weights
    trial makes them (:func:`legal_point`)."""
    from autocompress_opt.prune.baselines import masked_kl_scorer

    parent = context.architecture
    order = context.importance.layer_order()
    config = study_config(target, serve_as)
    engine = config.serve_as_for(target)
    out: dict[str, dict[str, int]] = {}
    if "minitron" in wanted:
        val = TrialConfig().inner.val_samples  # calibration rows, as seeding.seed_scoring scores them
        rows = context.tokens[val : 2 * val]
        score = masked_kl_scorer(context.model, context.importance, rows)
        seeds = baseline_seeds(config, target, parent, importance=context.importance, score=score, layer_order=order)
        if "point" in seeds.get("minitron", {}):
            out["minitron"] = dict(seeds["minitron"]["point"])
        else:
            print(f"{target.hardware}: no minitron seed ({seeds.get('minitron')})", flush=True)
    if "largest" in wanted:
        out["largest"] = plan_pick(parent, target, order)
    return {name: legal_point(point, config.space, parent, engine) for name, point in out.items()}


def run_one(
    context: Any, target: Target, params: dict[str, int], seed: int, inner: dict[str, Any], serve_as: str = "any"
) -> dict[str, Any]:
    """One inner search at ``params`` with inner seed ``seed`` under the ``serve_as`` engine's rules;
    every candidate measured on held-out rows."""
    config = TrialConfig.from_dict(inner or None, seed=seed)
    began = time.perf_counter()
    result = inner_search(context, params, target, config, serve_as=serve_as)
    searched = time.perf_counter() - began
    choice = result.choice()
    row: dict[str, Any] = {"seed": seed, "chosen": choice["chosen"], "search_s": searched, "candidates": {}}
    for name in CANDIDATES:
        arch = result.candidates.get(name)
        if arch is None:  # the uniform allocation is only a candidate when it is feasible
            row["candidates"][name] = {"feasible": False, "val_kl": None, "eval_kl": None}
            continue
        quality = evaluate_architecture(arch, MODEL, inner=inner or None, cache_dir=CACHE)
        row["candidates"][name] = {
            "feasible": choice["feasible"].get(name, False),
            "val_kl": choice["val_kl"].get(name),
            "eval_kl": quality["kl_to_parent"],
            "params": arch.num_params,
            "summary": arch.summary(),
        }
    return row


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per candidate: mean ± sd of the evaluation and calibration KL over seeds; who won how often."""
    out: dict[str, Any] = {}
    for name in CANDIDATES:
        for kind in ("eval_kl", "val_kl"):
            vals = [r["candidates"][name][kind] for r in runs if r["candidates"][name][kind] is not None]
            out[f"{name}_{kind}"] = _stats(vals)
    out["chosen"] = {name: sum(r["chosen"] == name for r in runs) for name in CANDIDATES}
    # the trained masks "win" when the selection returns them (ties go to the earlier candidate)
    out["trained_won_fraction"] = out["chosen"]["trained"] / len(runs) if runs else None
    best_eval = [
        min(CANDIDATES, key=lambda n, r=r: r["candidates"][n]["eval_kl"] or float("inf"))  # type: ignore[misc]
        for r in runs
    ]
    out["best_on_eval"] = {name: best_eval.count(name) for name in CANDIDATES}
    return out


def greedy_from_parent(
    context: Any, target: Target, params: dict[str, int], inner: dict[str, Any], serve_as: str = "any"
) -> dict[str, Any]:
    """The greedy arm: the parent repaired down to the budgets and constraints and filled, untrained."""
    config = TrialConfig.from_dict({**inner, "init": "parent", "steps": 0})
    arch = inner_search(context, params, target, config, serve_as=serve_as).candidates["start"]
    quality = evaluate_architecture(arch, MODEL, inner=inner or None, cache_dir=CACHE)
    return {"eval_kl": quality["kl_to_parent"], "params": arch.num_params, "summary": arch.summary()}


def add_greedy(args: argparse.Namespace) -> None:
    """``--greedy``: the greedy arm for every row of an existing result, which is rewritten."""
    import json

    from _util import RESULTS

    path = RESULTS / f"{args.name}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    inner = _overrides(args.inner)
    context, _ = parent_context(MODEL, TrialConfig.from_dict(inner or None), CACHE)
    for row in data["rows"]:
        target = Target(row["hardware"], row["workload"])
        greedy = greedy_from_parent(context, target, row["global_choices"], inner, row.get("serve_as", "any"))
        row["greedy_from_parent"] = greedy
        trained = row["summary"]["trained_eval_kl"]
        print(
            f"{row['hardware']:9s} {row['point']:8s} greedy eval KL {greedy['eval_kl']:.3f} (trained mean "
            f"{trained['mean']:.3f})",
            flush=True,
        )
    rest = {k: v for k, v in data.items() if k not in ("benchmark", "date", "machine")}
    write(args.name, {**rest, "greedy": provenance()})


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.greedy:
        add_greedy(args)
        return
    began = time.perf_counter()
    inner = _overrides(args.inner)
    seeds = [int(s) for s in args.seeds.split(",")]
    wanted = args.points.split(",")
    started = provenance(seeds=seeds)  # the code the run imports now (modules load once)
    context, _ = parent_context(MODEL, TrialConfig.from_dict(inner or None), CACHE)
    rows: list[dict[str, Any]] = []
    for spec in args.targets.split(","):
        hardware, _, workload = spec.partition(":")
        target = Target(hardware, workload)
        engine = engine_for(target, args.serve_as)
        for point, params in points_for(target, context, wanted, args.serve_as).items():
            runs = []
            for seed in seeds:
                run = run_one(context, target, params, seed, inner, engine)
                runs.append(run)
                kls = "  ".join(
                    f"{n} {run['candidates'][n]['eval_kl']:.3f}"
                    if run["candidates"][n]["eval_kl"] is not None
                    else f"{n} -"
                    for n in CANDIDATES
                )
                print(f"{hardware:9s} {point:8s} seed {seed}: chosen {run['chosen']:8s} eval KL {kls}", flush=True)
            rows.append(
                {
                    "hardware": hardware,
                    "workload": workload,
                    "point": point,
                    "serve_as": engine,
                    "global_choices": params,
                    "runs": runs,
                    "summary": summarise(runs),
                }
            )
            all_runs = [r for row in rows for r in row["runs"]]
            write(
                args.name,
                {
                    **started,
                    "code_at_write": provenance()["code"],
                    "model": MODEL,
                    "inner": TrialConfig.from_dict(inner or None).to_dict(),
                    "quality": "KL(parent || candidate), nats, held-out evaluation rows (code, prose); lower is better",
                    "rows": rows,
                    "overall": summarise(all_runs),
                    "seconds": time.perf_counter() - began,
                },
            )


if __name__ == "__main__":
    main()
