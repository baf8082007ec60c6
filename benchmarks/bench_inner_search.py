"""Inner mask search vs uniform allocations on the real SmolLM2-135M, at the same hardware constraint.

For each target (hardware × workload, the workload's own constraints, which SmolLM2 violates):

* the **global choices** are the plan-mode pick: the feasible point of the bundled SmolLM2 search
  space (``search_spaces/smollm2-135m.yaml``) with the most parameters, layers ranked by importance;
* (i) **searched** — a weights trial (:func:`run_weights_trial`): the inner mask search holding those
  choices as budgets; (i-b) **searched-free** — the same with only the hidden size fixed and the
  other budgets at the parent's (the hardware constraint alone decides the allocation);
* (ii) **uniform** — the uniform allocation of the same choices (``uniform_allocation``).

The strong baselines under the same constraints (Minitron's candidate search, depth pruning, best
uniform) are compared in ``bench_head_to_head.py``; the parameter-target arm this benchmark once had
was withdrawn with that baseline, so ``results/inner_search.json`` (written before) still has it.

Every architecture is materialised from the same importance scores and scored on the same held-out
code and prose rows (KL to the parent, perplexities). Writes ``results/inner_search.json``.
Run: ``.venv/bin/python benchmarks/bench_inner_search.py`` (about 10-15 minutes on 2 CPU cores).
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _util import write

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.search_space import CHOICES, load_search_space, uniform_allocation
from autocompress_opt.search.inner.budget import CostGoal
from autocompress_opt.search.study.weights_trial import (
    TrialConfig,
    evaluate_architecture,
    parent_context,
    run_weights_trial,
)
from autocompress_opt.serving.costmodel import ArchArrays, estimate_batch, estimate_cost
from autocompress_opt.serving.targets import Target, all_satisfied

MODEL = "smollm2-135m"
TARGETS = (("rtx5070", "in-game"), ("rtx5080", "local-coding"), ("h100-sxm", "datacenter"), ("b200", "datacenter"))
CACHE = Path(".autocompress")


def plan_pick(parent: Architecture, target: Target, order: list[int]) -> dict[str, int]:
    """The feasible point of the bundled space with the most parameters (what plan mode favours)."""
    space = load_search_space(MODEL)
    points = [dict(zip(CHOICES, v)) for v in itertools.product(*(space[c].values for c in CHOICES))]
    archs = [space.architecture(p, parent, order) for p in points]
    goal = CostGoal.for_target(target, parent)
    metrics = estimate_batch(
        ArchArrays.from_architectures(archs), target.hardware, target.engine_obj(), target.scenario()
    )
    ok = np.ones(len(archs), dtype=bool)
    for n in range(len(archs)):
        row = {k: float(np.asarray(v)[n]) for k, v in metrics.items()}
        ok[n] = all_satisfied(goal.violations(row))
    params = np.array([a.num_params for a in archs])
    best = int(np.argmax(np.where(ok, params, -1)))
    if not ok[best]:
        raise RuntimeError(f"no uniform point of the space meets {target}")
    return points[best]


def describe(arch: Architecture, target: Target) -> dict[str, Any]:
    layers = arch.layers
    cost = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
    constrained = {c.metric for c in target.resolved_workload().constraints}
    return {
        "summary": arch.summary(),
        "params": arch.num_params,
        "active_layers": arch.num_active_layers,
        "metrics": {k: v for k, v in cost.items() if k in constrained},
        "attention_layers": sum(s.attention for s in layers),
        "ffn_layers": sum(s.ffn for s in layers),
        "per_layer": [
            f"{s.num_kv_heads}x{s.num_heads // max(s.num_kv_heads, 1)}/{s.ffn_width}" if not s.is_noop else "-"
            for s in layers
        ],
    }


def main() -> None:
    began = time.perf_counter()
    config = TrialConfig()
    context, _ = parent_context(MODEL, config, CACHE)  # parent, importance, teacher and eval data, timed
    parent = context.architecture
    setup_s = time.perf_counter() - began
    order = context.importance.layer_order()
    reference = evaluate_architecture(parent, MODEL, cache_dir=CACHE)  # the parent itself: KL 0
    rows = []
    for hardware, workload in TARGETS:
        target = Target(hardware, workload)
        goal = CostGoal.for_target(target, parent)
        params = plan_pick(parent, target, order)
        free = {
            "num_layers": parent.num_layers,
            "hidden_size": params["hidden_size"],
            "ffn_width": parent.layers[0].ffn_width,
            "num_kv_heads": parent.layers[0].num_kv_heads,
            "q_per_kv": parent.layers[0].num_heads // parent.layers[0].num_kv_heads,
        }
        row: dict[str, Any] = {
            "hardware": hardware,
            "workload": workload,
            "constraints": [str(c) for c in target.resolved_workload().constraints],
            "parent_metrics": {c.metric: goal.parent_metrics[c.metric] for c in target.resolved_workload().constraints},
            "global_choices": params,
        }
        request = {
            "params": params,
            "parent": parent.to_dict(),
            "target": target.to_dict(),
            "layer_order": order,
            "seed": 0,
            "parent_model": MODEL,
            "cache_dir": str(CACHE),
        }
        for name, point in (("searched", params), ("searched_free", free)):
            result = run_weights_trial({**request, "params": point})
            arch = Architecture.from_dict(result["architecture"])
            row[name] = {
                "kl_to_parent": result["kl_to_parent"],
                "ppl_code": result["ppl_code"],
                "ppl_prose": result["ppl_prose"],
                "feasible": result["inner"]["feasible"],
                "violations": result["inner"]["violations"],
                "inner_search_s": result["timings_s"]["search"],
                "trial_s": result["timings_s"]["total"],
                "moves": result["inner"]["moves"],
                "budget": point,
                **describe(arch, target),
            }
            print(
                f"{hardware:9s} {name:13s} KL {result['kl_to_parent']:.4f}  feasible {result['inner']['feasible']}  "
                f"search {result['timings_s']['search']:.1f}s  {arch.summary()}",
                flush=True,
            )
        uniform = uniform_allocation(params, parent, order)
        quality = evaluate_architecture(uniform, MODEL, cache_dir=CACHE)
        violations, _ = goal.target.check(uniform, goal.parent_metrics)
        ok = all_satisfied(violations)
        row["uniform"] = {
            "kl_to_parent": quality["kl_to_parent"],
            "ppl_code": quality["ppl_code"],
            "ppl_prose": quality["ppl_prose"],
            "feasible": ok,
            "violations": violations,
            **describe(uniform, target),
        }
        print(f"{hardware:9s} {'uniform':13s} KL {quality['kl_to_parent']:.4f}  feasible {ok}  {uniform.summary()}")
        rows.append(row)
    write(
        "inner_search",
        {
            "model": MODEL,
            "parent": parent.summary(),
            "inner_defaults": config.to_dict(),
            "parent_quality": {k: reference[k] for k in ("kl_to_parent", "ppl_code", "ppl_prose")},
            "setup_s": setup_s,
            "setup_breakdown_s": context.seconds,
            "total_s": time.perf_counter() - began,
            "quality": "held-out KL(parent || pruned), nats, mean over code and prose rows; lower is better",
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
