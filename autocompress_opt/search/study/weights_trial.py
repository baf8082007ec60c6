"""The ``weights`` trial mode: inner mask search on the real parent → materialise → quality → cost.

:func:`run_weights_trial` follows the contract of :mod:`autocompress_opt.search.study.trials`::

    request = {"params": {...global choices...}, "parent": Architecture dict, "target": Target dict,
               "layer_order": [...] | None, "seed": int,   # ("space" may be present; unused)
               # optional:
               "inner": {...},            # InnerConfig keys + the data keys of TrialConfig
               "parent_model": str,       # what load_model loads; default: the parent's name, which
                                          # works for known names ("smollm2-135m"), not for paths
               "cache_dir": str,          # on-disk caches (default ".autocompress")
               "baselines": {name: Architecture dict},  # more candidates: a seeded baseline's own model
               "measure_at": [int] | None}  # the inner steps after which the held-out KL is measured
    result  = {"architecture": dict, "kept": {...}, "metrics": {...}, "quality": exp(-KL), "quality_kind": "exp_neg_kl",
               "kl_to_parent": nats, "kl_code", "kl_prose", "ppl_code", "ppl_prose",
               "quality_cached": bool, "inner": {...search summary...}, "timings_s": {...},
               "ffn_budget": {"width", "multiple", "channels", "heterogeneous_channels", "kept_channels"},
               "selection": {"chosen": "trained" | "start" | "uniform" | a baseline's name,
                             "val_kl": {candidate: nats | None}, "feasible": {candidate: bool}},
               "compute": {"device": "cpu" | "cuda:0" | ..., "dtype": "fp32" | "bf16" | "fp16", "devices": [...]},
               "teacher": {"form": "full" | "top-k", "k": int | None, "bytes": int, "bytes_per_token": int}}

``kept`` is the plan the trial measured, as kept indices (:meth:`~autocompress_opt.prune.plan.PrunePlan.kept`:
the parent layer, heads, KV groups and FFN channels of each built layer and the hidden channels, as
hex bitmasks, ~12 KB for SmolLM2-135M): the study stores it, and ``prune --from-study`` exports
exactly those channels (:func:`~autocompress_opt.prune.plan.plan_from_kept`) on any machine, device
and dtype, rather than choosing them again from importance recomputed there.

``selection`` says which candidate of the inner search the trial returned — the trained masks,
the greedy start point, or the uniform allocation of the trial's global choices (considered
whenever it is feasible, so a trial never returns worse, on the held-out calibration KL, than that
uniform model) — and each one's KL to the parent on the calibration rows held out of the search
(:meth:`~autocompress_opt.search.inner.inner_search.InnerResult.choice`). A seeded baseline's trial
(``request["baselines"]``) also weighs the baseline's own model(s): on that calibration KL in the
inner search, then, if the search returned another candidate, on the study's objective (the
held-out evaluation KL below; ``selection["heldout_kl"]`` records both), so the trial never scores
worse than the baseline it was seeded with. Such a trial measures its baselines' models first
(phase ``baseline``) and reports the best feasible one as a complete result
(:attr:`~autocompress_opt.search.study.progress.TrialProgress.fallback`): if the study's scheduler stops
the trial early, the study records that result (``selection["stopped_at_step"]``), so a seeded
point can be stopped like any other without losing the baseline it holds.

``ffn_budget`` (:func:`ffn_budget`) says how the sampled FFN width was realised: the uniform
candidate keeps it exactly in every layer (a plain checkpoint loads any width), while a per-layer
shape under a DeciLM engine's rules mixes widths in multiples of 256 and so keeps at most the
budget's ``num_layers · ffn_width`` channels rounded down to 256; the record gives that bound and
what the returned model keeps, so no shortfall is silent.

Steps: load the parent (cached per process), its importance (``estimate_importance`` with its disk
cache, ``.autocompress/importance/``), the parent's log-probs on the calibration rows (once,
``.autocompress/teacher/``), the inner search (:func:`autocompress_opt.search.inner.inner_search.search`,
starting from the trial's uniform allocation — layers ranked by ``layer_order``, else by the
importance ``skip_loss`` — holding its global choices as budgets, and keeping that uniform
allocation as a candidate) → a
heterogeneous :class:`Architecture` → :func:`~autocompress_opt.prune.slicing.materialize` → held-out
quality → the exact cost metrics of the target.

**Quality** is ``exp(−KL)``, where KL is the mean per-position ``KL(parent ‖ pruned)`` in nats on
held-out code and prose (never calibration documents): higher is better, 1 means the parent's
exact next-token distribution. It is cached on disk (``.autocompress/quality/``) keyed by the
parent's id, the importance data (which decides the kept channels), the architecture and the
evaluation data, so an architecture is evaluated once across targets and trials.

While it runs, the trial reports its phase (load parent, importance, teacher, inner search,
materialise, quality), every inner step, and every few steps the held-out calibration KL and how
far it is from a feasible result (:mod:`autocompress_opt.search.study.progress`): in a study they reach
the progress bar and the early-stopping scheduler; elsewhere the reports go nowhere.

**Sparse parents.** A parent with MoE or Mamba-2 layers (Qwen3-MoE, Mixtral, Nemotron-H: the families of
:data:`~autocompress_opt.hf.adapters.MOE_ADAPTERS`) runs the same trial with its own search, cut and record:

* dense sizes first: a point of fewer layers, attention heads or residual channels than the parent
  cuts them (:func:`dense_cut`) and the rest runs on the cut model, learning towards the whole parent's
  log-probs;
* the point holds the dense FFN at the parent's size
  (:func:`~autocompress_opt.search.inner.experts.expert_point` names one that does not); the outer loop
  chooses how many experts, the top-``k``, the expert width (and shared width and Mamba-2 heads where
  the parent has them), the inner search (:func:`~autocompress_opt.search.inner.experts.search_experts`)
  which experts, channels and heads;
* ``serve_as``: the point's uniform child is checked before any work
  (:func:`~autocompress_opt.search.study.trials.check_loadable`). Where the family has a per-layer form
  and the engine reads it (:data:`~autocompress_opt.arch.hybrid.PER_LAYER_MOE`: Nemotron-H's Puzzle
  form for llama.cpp and the package's own class, or ``serve_as`` ``any``), the search gives each MoE
  layer its own expert width and top-``k`` under the point's budgets and the child is a
  ``nemotron_h_puzzle`` model; else the family's plain config;
* ``kept`` is the expert record (:func:`~autocompress_opt.prune.expert_kept.expert_kept`), which
  :func:`~autocompress_opt.search.study.export.export_trial` cuts exactly, and the quality cache is
  keyed by it too;
* the candidates are ``trained`` and ``start`` (the importance choice); seeded baselines are not
  weighed (the expert seed, :func:`~autocompress_opt.prune.baselines.expert_seeds`, is the ``start``
  candidate of its point) and the result carries no ``ffn_budget``.

Deterministic given ``request["seed"]`` (and the thread count). Calibration and evaluation data
use ``data_seed`` / ``eval_seed``, not the trial seed, so every trial shares the caches.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.hybrid import depth_layers, hybrid_child, is_sparse, sparse_limits
from autocompress_opt.arch.search_space import SearchSpace, uniform_allocation
from autocompress_opt.cache import cache_key, fetch
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import architecture_mismatch
from autocompress_opt.hf.device import dtype_name
from autocompress_opt.hf.host_memory import reused_host_memory
from autocompress_opt.prune.loadability import SERVE_AS_ANY, ShapeRules, check_serve_as, shape_rules
from autocompress_opt.prune.plan import PrunePlan, plan_pruning
from autocompress_opt.search.inner.block_solver import NAME as BLOCK_LIBRARY
from autocompress_opt.search.inner.budget import Budget, CostGoal
from autocompress_opt.search.inner.inner_search import InnerResult, StepListener, search
from autocompress_opt.search.inner.teacher import teacher_form
from autocompress_opt.search.study.progress import TrialProgress, report
from autocompress_opt.search.study.trial_context import (
    DEFAULT_CACHE_DIR,
    QUALITY_CACHE_VERSION,
    QUALITY_KIND,
    ParentContext,
    TrialConfig,
    calibration_rows,
    choice_rows,
    clear_trial_cache,
    heldout_quality,
    importance_rows,
    load_parent,
    objective_domains,
    parent_context,
    parent_identity,
    parent_importance,
    parent_parts,
    search_rows,
    workload_domain,
)
from autocompress_opt.search.study.trials import check_loadable, legal_point, searches_per_layer
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import Target

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DenseCut",
    "ParentContext",
    "TrialConfig",
    "calibration_rows",
    "choice_rows",
    "clear_trial_cache",
    "dense_cut",
    "evaluate_architecture",
    "ffn_budget",
    "heldout_quality",
    "importance_rows",
    "inner_search",
    "load_parent",
    "objective_domains",
    "parent_context",
    "parent_identity",
    "parent_importance",
    "parent_parts",
    "run_weights_trial",
    "search_rows",
    "trial_rules",
    "workload_domain",
]


def _quality(
    parent: ParentContext,
    arch: Architecture,
    cut: Callable[[], Any],
    cache_dir: Path,
    on_phase: Callable[[str], None] | None = None,
    kept: Mapping[str, Any] | None = None,
) -> tuple[dict[str, float], bool]:
    """Held-out KL and perplexities of ``arch``, the child ``cut()`` makes from the parent, and whether
    they were cached: on disk by architecture (:func:`~autocompress_opt.cache.fetch` under
    ``cache_dir/quality``; the trials of one host that want one architecture at once measure it once),
    and by ``kept`` too where the architecture does not decide the units kept (a MoE parent's expert
    record: which experts a trial keeps is the search's, not a function of the sizes). ``on_phase``
    hears ``"materialise"`` and ``"quality"`` as each begins (not for a cached one)."""

    def measure() -> dict[str, float]:
        if on_phase is not None:
            on_phase("materialise")
        child = cut()
        if on_phase is not None:
            on_phase("quality")
        return heldout_quality(parent, child)

    imp = parent.importance.meta
    shape = {**arch.to_dict(), "name": ""}
    by = (shape,) if kept is None else (shape, dict(kept))
    parts = (parent.parent_id, imp.data_id, imp.method, *by, parent.eval_id)
    return fetch(
        cache_dir / "quality" / f"{cache_key(QUALITY_CACHE_VERSION, *parts)}.json",
        measure,
        lambda out, tmp: tmp.write_text(json.dumps(out, indent=2), encoding="utf-8"),
        lambda path: json.loads(path.read_text(encoding="utf-8")),
    )


def _plan_quality(
    parent: ParentContext,
    arch: Architecture,
    plan: PrunePlan,
    cache_dir: Path,
    on_phase: Callable[[str], None] | None = None,
) -> tuple[dict[str, float], bool]:
    """:func:`_quality` of a dense child: ``arch`` cut by ``plan``
    (:func:`~autocompress_opt.prune.slicing.materialize`)."""
    from autocompress_opt.prune.slicing import materialize

    return _quality(parent, arch, lambda: materialize(parent.model, plan), cache_dir, on_phase)


# ------------------------------------------------------------------------------- trial
def trial_rules(serve_as: str, parent: Architecture, budget: Budget) -> ShapeRules | None:
    """The ``serve_as`` engine's shape rules for a trial of ``budget`` on ``parent``
    (:func:`~autocompress_opt.prune.loadability.shape_rules` at the trial's hidden size and query heads)."""
    return shape_rules(
        serve_as, parent, hidden_size=budget.hidden_size, query_heads=budget.num_kv_heads * budget.q_per_kv
    )


def ffn_budget(budget: Budget, rules: ShapeRules | None, arch: Architecture) -> dict[str, int]:
    """How a trial realised its sampled FFN width (JSON-safe; the study stores it as ``ffn_budget``).

    ``width``: the sampled mean, which the uniform candidate keeps in every layer; ``multiple``: the
    width multiple of every layer of a per-layer shape under the engine's rules (1: any width);
    ``channels``: the budget, ``num_layers · width`` FFN channels; ``heterogeneous_channels``: the
    most a per-layer shape keeps within it (:meth:`~autocompress_opt.prune.loadability.ShapeRules.ffn_total`:
    ``channels`` rounded down to ``multiple``); ``kept_channels``: what ``arch`` keeps. So a
    trial whose per-layer widths fall short of its sampled width says by how much, and why."""
    legal = rules if rules is not None else ShapeRules(SERVE_AS_ANY)  # no rules: any width in any layer
    return {
        "width": budget.ffn_width,
        "multiple": legal.ffn_multiple if legal.heterogeneous else 1,
        "channels": budget.num_layers * budget.ffn_width,
        "heterogeneous_channels": legal.ffn_total(budget.num_layers, budget.ffn_width),
        "kept_channels": sum(layer.ffn_width for layer in arch.active().layers if layer.ffn),
    }


def inner_search(
    parent: ParentContext,
    params: Mapping[str, int],
    target: Target,
    config: TrialConfig,
    layer_order: list[int] | None = None,
    on_step: StepListener | None = None,
    serve_as: str = "any",
    extra: Mapping[str, Architecture] | None = None,
    measure_at: Sequence[int] | None = None,
    start_from: str | None = None,
) -> InnerResult:
    """The trial's inner search: from the uniform allocation of ``params`` (layers ranked by
    ``layer_order``, else by the importance ``skip_loss``), holding ``params`` as budgets, under
    ``target``'s constraints, with that uniform allocation as a candidate; ``on_step`` hears the
    step count, and every few steps the held-out KL and violation (:func:`.inner_search.search`);
    the result is a shape the ``serve_as`` engine loads (:func:`~autocompress_opt.prune.loadability.shape_rules`;
    ``any``: every shape); ``extra``: more candidates by name (a seeded baseline's own model);
    ``measure_at``: the steps whose held-out KL is measured (the study scheduler's rungs; None: every
    eighth of the search); ``start_from``: the name of an ``extra`` candidate the masks start from
    (None: the importance start)."""
    order = layer_order or parent.importance.layer_order()
    budget = Budget.from_params(params)
    rules = trial_rules(serve_as, parent.architecture, budget)
    return search(
        parent.model,
        parent.architecture,
        parent.importance,
        parent.tokens,
        parent.teacher,
        budget=budget,
        goal=CostGoal.for_target(target, parent.architecture),
        config=config.inner,
        init=uniform_allocation(dict(params), parent.architecture, order),
        on_step=on_step,
        rules=rules,
        extra=extra,
        measure_at=measure_at,
        start_from=start_from,
    )


def run_weights_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    """One weights-mode trial (see the module doc for the request and result), its vocabulary-wide
    CPU tensors reusing freed pages (:func:`~autocompress_opt.hf.host_memory.reused_host_memory`)."""
    with reused_host_memory():
        return _weights_trial(request)


def _weights_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    began = time.perf_counter()
    parent_arch = Architecture.from_dict(request["parent"])
    target = Target.from_dict(request["target"])
    seed = int(request.get("seed", 0))
    config = TrialConfig.from_dict(request.get("inner"), seed=seed).for_workload(target.workload)
    serve_as = check_serve_as(str(request.get("serve_as") or SERVE_AS_ANY))  # whose loadable shapes it keeps
    sparse = is_sparse(parent_arch)
    if sparse:  # the point's uniform child must load before any work (the sparse search keeps its sizes)
        check_loadable(
            hybrid_child(parent_arch, kept_layers=_present(parent_arch), point=request["params"]), parent_arch, serve_as
        )
    cache_dir = Path(request.get("cache_dir") or DEFAULT_CACHE_DIR)
    ref = str(request.get("parent_model") or parent_arch.name)
    if not ref:
        raise ConfigError("the parent architecture has no name; pass request['parent_model'] (a path or known name)")
    parent, fresh = parent_context(ref, config, cache_dir)
    mismatch = architecture_mismatch(parent_arch, parent.architecture)
    if mismatch:
        raise ConfigError(f"request['parent'] does not describe the model loaded from {ref!r} ({mismatch})")
    ready = time.perf_counter()
    timings = {"parent": ready - began}
    if fresh:
        timings.update({f"parent_{k}": v for k, v in parent.seconds.items()})
    if sparse:
        return _sparse_trial(request, parent, target, config, serve_as, cache_dir, timings, began)

    steps = config.inner.steps
    last = [TrialProgress("inner search", 0, steps)]  # what the trial last said (phases after the search repeat it)

    def say(progress: TrialProgress) -> None:
        last[0] = progress
        report(progress)

    params = dict(request["params"])
    if serve_as != "any":
        params = legal_point(params, SearchSpace.from_dict(request["space"]), parent_arch, serve_as)
    budget = Budget.from_params(params)
    realised = partial(ffn_budget, budget, trial_rules(serve_as, parent_arch, budget))  # of the returned model
    baselines = {name: Architecture.from_dict(a) for name, a in (request.get("baselines") or {}).items()}
    if baselines:  # a seeded trial: its baseline's model first, the study's result if it is stopped early
        report(TrialProgress("baseline", 0, steps))
        fallback = _baseline_fallback(parent, baselines, target, cache_dir, timings, began)
        if fallback is not None:
            fallback["ffn_budget"] = realised(Architecture.from_dict(fallback["architecture"]))
            report(TrialProgress("baseline", 0, steps, fallback=json.dumps(fallback)))
    say(last[0])
    extra = dict(baselines)
    start_from = None
    if config.block_library or config.start_from == BLOCK_LIBRARY:
        solved = _block_library_answer(parent, params, target, config, cache_dir, serve_as)
        if solved is not None:
            extra[BLOCK_LIBRARY] = solved
            start_from = BLOCK_LIBRARY if config.start_from == BLOCK_LIBRARY else None
    searching = time.perf_counter()
    if baselines:
        timings["baseline"] = searching - ready
    result = inner_search(
        parent,
        params,
        target,
        config,
        request.get("layer_order"),
        on_step=lambda step, kl, violation: say(
            replace(last[0], inner_step=step, stale=True)  # not measured at this step
            if kl is None
            else TrialProgress("inner search", step, steps, kl, violation)
        ),
        serve_as=serve_as,
        extra=extra,
        measure_at=request.get("measure_at"),
        start_from=start_from,
    )
    searched = time.perf_counter()

    on_phase = lambda phase: say(replace(last[0], phase=phase, inner_step=steps, stale=True))
    arch, plan = result.architecture, result.plan
    quality, cached = _plan_quality(parent, arch, plan, cache_dir, on_phase=on_phase)
    selection = result.choice()
    # A seeded baseline's own model, when feasible, also competes on the study's objective (held-out
    # evaluation KL): the trial of its point then never scores worse than the baseline itself.
    rivals = {
        n: a for n, a in baselines.items() if n != selection["chosen"] and selection["feasible"].get(n) and a != arch
    }
    if rivals:
        heldout = {selection["chosen"]: quality["kl_to_parent"]}
        for name, other in rivals.items():
            other_plan = plan_pruning(parent.architecture, parent.importance, other)
            q, c = _plan_quality(parent, other, other_plan, cache_dir)
            heldout[name] = q["kl_to_parent"]
            if q["kl_to_parent"] < quality["kl_to_parent"]:
                arch, plan, quality, cached = other, other_plan, q, c
                selection["chosen"] = name
        selection["heldout_kl"] = heldout
    done = time.perf_counter()
    timings.update({"search": searched - searching, "quality": done - searched, "total": done - began})
    return {
        **_payload(parent, arch, plan.kept(), target, quality, cached, selection, timings),
        "ffn_budget": realised(arch),
        "inner": {**result.summary(), "config": config.to_dict()},
    }


def _sparse_trial(
    request: Mapping[str, Any],
    parent: ParentContext,
    target: Target,
    config: TrialConfig,
    serve_as: str,
    cache_dir: Path,
    timings: dict[str, float],
    began: float,
) -> dict[str, Any]:
    """The search, cut and quality of a MoE or hybrid parent's trial (module doc, **Sparse parents**):
    the point's depth first (:func:`dense_cut`), then the expert search
    (:func:`~autocompress_opt.search.inner.experts.search_experts`) fills the point's sparse counts on
    the layers kept, per layer where the ``serve_as`` engine reads the family's per-layer form
    (:func:`~autocompress_opt.search.study.trials.searches_per_layer`); the child is
    :func:`~autocompress_opt.prune.experts.slice_experts` of that model; ``kept`` is its expert record."""
    from autocompress_opt.prune.expert_kept import expert_kept
    from autocompress_opt.prune.experts import slice_experts
    from autocompress_opt.search.inner.experts import search_experts

    searching = time.perf_counter()
    params = dict(request["params"])
    if "experts_per_token" in params and "num_experts" in params:  # top-k capped at the experts kept, as
        params["experts_per_token"] = min(int(params["experts_per_token"]), int(params["num_experts"]))  # plan mode
    cut = dense_cut(parent, params, request.get("layer_order"))
    if cut.layers is not None:  # the early check kept every layer; the kinds kept matter to some engines
        check_loadable(
            hybrid_child(parent.architecture, kept_layers=cut.layers, point=params), parent.architecture, serve_as
        )
    steps = config.inner.steps
    report(TrialProgress("inner search", 0, steps))
    has = sparse_limits(cut.architecture)  # a kind the cut keeps no layer of (e.g. attention) has nothing to size
    result = search_experts(
        cut.model,
        cut.architecture,
        cut.importance,
        parent.tokens,
        parent.teacher,  # the whole parent's: a cut model learns towards the parent, not towards itself
        params={k: v for k, v in params.items() if k in has},
        goal=CostGoal.for_target(target, parent.architecture),
        config=config.inner,
        on_step=lambda step, kl, violation: report(TrialProgress("inner search", step, steps, kl, violation)),
        measure_at=request.get("measure_at"),
        per_layer=searches_per_layer(parent.architecture, serve_as),
    )
    searched = time.perf_counter()
    arch = cut.spread(result.architecture, parent.architecture)
    kept = expert_kept(result.masks, cut.architecture, cut.layers, cut.heads, cut.hidden)
    quality, cached = _quality(parent, arch, lambda: slice_experts(cut.model, result.masks), cache_dir, kept=kept)
    done = time.perf_counter()
    timings.update({"search": searched - searching, "quality": done - searched, "total": done - began})
    return {
        **_payload(parent, arch, kept, target, quality, cached, result.choice(), timings),
        "serve_as": serve_as,
        "inner": {**result.summary(), "config": config.to_dict()},
    }


@dataclass(frozen=True)
class DenseCut:
    """A MoE or hybrid parent cut to a point's dense sizes (:func:`dense_cut`): ``model`` holds the parent
    layers ``layers`` (ascending; None: every layer) and, in each attention layer ``i`` of those, the
    query heads ``heads[i]`` (None: every head), and the parent's residual channels ``hidden``
    (ascending; None: every one); ``architecture`` is its own and ``importance`` the parent's scores of
    what it keeps. With all three None ``model`` is the parent."""

    model: Any
    architecture: Architecture
    importance: Any
    layers: list[int] | None
    heads: dict[int, list[int]] | None = None
    hidden: list[int] | None = None

    def spread(self, arch: Architecture, parent: Architecture) -> Architecture:
        """``arch`` (a child of :attr:`model`) over the parent's layers: each kept layer in its parent
        position, the others dropped, as a plan-mode child lists them
        (:func:`~autocompress_opt.arch.hybrid.hybrid_child`)."""
        if self.layers is None:
            return arch
        layers = [LayerSpec.dropped()] * parent.num_layers
        for j, i in enumerate(self.layers):
            layers[i] = arch.layers[j]
        return replace(arch, layers=tuple(layers))


_CUTS: dict[tuple[Any, ...], DenseCut] = {}  # the two most recent dense cuts of this process
_CUTS_KEPT = 2


def dense_cut(parent: ParentContext, params: Mapping[str, int], layer_order: Sequence[int] | None = None) -> DenseCut:
    """``parent`` (a MoE or hybrid one) cut to the point's dense sizes before its experts are searched:

    * depth, ``params["num_layers"]`` layers: the first present ones of ``layer_order`` (None: the
      importance ``skip_loss`` order, as a dense trial starts), a MoE and an attention layer among them
      (:func:`~autocompress_opt.arch.hybrid.depth_layers`, as plan mode keeps them), every kind kept
      where it is (:func:`~autocompress_opt.prune.experts.slice_layers`);
    * heads, ``num_kv_heads`` KV groups of ``q_per_kv`` query heads in every attention layer: the
      highest-scoring ones (:func:`~autocompress_opt.prune.experts.head_choice`, a dense plan's rule;
      :func:`~autocompress_opt.prune.experts.slice_heads`);
    * hidden size, ``hidden_size`` residual channels: the highest-scoring ones
      (:func:`~autocompress_opt.prune.experts.hidden_choice`, as a dense plan keeps them;
      :func:`~autocompress_opt.prune.experts.slice_hidden`), in every layer kind.

    The whole parent when the point keeps all three at the parent's. Cached per parent and what is
    kept (the two most recent)."""
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.prune.experts import head_choice, hidden_choice, slice_heads, slice_hidden, slice_layers

    arch = parent.architecture
    present = _present(arch)
    limits = sparse_limits(arch)
    n = int(params.get("num_layers", len(present)))
    if not 1 <= n <= len(present):
        raise ConfigError(f"point choice num_layers={n} is outside 1..{len(present)} (the parent's present layers)")
    heads = tuple(int(params.get(k, limits.get(k, 0))) for k in ("num_kv_heads", "q_per_kv"))
    cut_heads = "num_kv_heads" in limits and heads != (limits["num_kv_heads"], limits["q_per_kv"])
    width = int(params.get("hidden_size", arch.hidden_size))
    if not 1 <= width <= arch.hidden_size:
        raise ConfigError(f"point choice hidden_size={width} is outside 1..{arch.hidden_size} (the parent's)")
    cut_hidden = width < arch.hidden_size
    if n == len(present) and not cut_heads and not cut_hidden:
        return DenseCut(parent.model, arch, parent.importance, None)
    kept = depth_layers(arch, n, layer_order or parent.importance.layer_order()) if n < len(present) else None
    key = (id(parent.model), tuple(kept or ()), heads if cut_heads else None, width)
    if key not in _CUTS:
        while len(_CUTS) >= _CUTS_KEPT:
            _CUTS.pop(next(iter(_CUTS)))
        model, cut_arch, importance = parent.model, arch, parent.importance
        if kept is not None:
            model = slice_layers(model, kept)
            cut_arch = moe_adapter(model).architecture(model)
            importance = importance.select_layers(kept, cut_arch)
        chosen = None
        if cut_heads:
            chosen = head_choice(importance, cut_arch, *heads)
            model = slice_heads(model, chosen)
            cut_arch = moe_adapter(model).architecture(model)
            importance = importance.select_heads(chosen, cut_arch)
        channels = None
        if cut_hidden:
            channels = hidden_choice(importance, width)
            model = slice_hidden(model, channels)
            cut_arch = moe_adapter(model).architecture(model)
            importance = importance.select_hidden(channels, cut_arch)
        _CUTS[key] = DenseCut(model, cut_arch, importance, kept, chosen, channels)
    _CUTS[key] = _CUTS.pop(key)  # the most recent last
    return _CUTS[key]


def _present(parent: Architecture) -> list[int]:
    """The parent's present layers (not dropped already)."""
    return [i for i, layer in enumerate(parent.layers) if not layer.is_noop]


def _block_library_answer(
    parent: ParentContext,
    params: Mapping[str, int],
    target: Target,
    config: TrialConfig,
    cache_dir: Path,
    serve_as: str,
) -> Architecture | None:
    """The block-library solver's architecture for ``params`` under ``target`` and the ``serve_as``
    engine's rules (None when it finds none feasible); the library of the search's training rows at
    the trial's hidden size is built once and cached (:attr:`TrialConfig.block_library`)."""
    from autocompress_opt.prune.block_library import build_block_library
    from autocompress_opt.search.inner.block_solver import solve_block_library

    budget = Budget.from_params(params)
    report(TrialProgress("block library", 0, config.inner.steps))
    training = parent.tokens[config.inner.val_samples :]
    library, _ = build_block_library(
        parent.model,
        parent.importance,
        training,
        hidden_size=budget.hidden_size,
        model_id=parent.parent_id,
        cache_dir=cache_dir / "block_library",
    )
    rules = trial_rules(serve_as, parent.architecture, budget)
    solution = solve_block_library(library, budget, CostGoal.for_target(target, parent.architecture), rules=rules)
    return solution.architecture if solution.feasible else None


def _payload(
    parent: ParentContext,
    arch: Architecture,
    kept: Mapping[str, Any],
    target: Target,
    quality: Mapping[str, Any],
    cached: bool,
    selection: dict[str, Any],
    timings: Mapping[str, float],
) -> dict[str, Any]:
    """A weights trial's result for ``arch`` (module doc), the units it keeps ``kept`` (a dense plan's
    :meth:`~autocompress_opt.prune.plan.PrunePlan.kept`, or a MoE parent's expert record), its held-out
    ``quality`` measured."""
    metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
    return {
        "architecture": arch.to_dict(),
        "kept": dict(kept),
        "metrics": metrics,
        "quality": math.exp(-quality["kl_to_parent"]),
        "quality_kind": QUALITY_KIND,
        **quality,
        "quality_cached": cached,
        "selection": selection,
        "compute": _compute(parent),
        "teacher": teacher_form(parent.teacher),
        "timings_s": dict(timings),
    }


def _baseline_fallback(
    parent: ParentContext,
    baselines: Mapping[str, Architecture],
    target: Target,
    cache_dir: Path,
    timings: Mapping[str, float],
    began: float,
) -> dict[str, Any] | None:
    """A seeded trial's result should the scheduler stop it: the best, on the held-out evaluation KL
    (the study's objective), of its baselines' own models that meet ``target``'s constraints by the
    exact cost model; None when none does. The measurements land in the quality cache, so the trial
    pays them once whether it is stopped or not. ``selection["chosen"]`` names the baseline and
    ``selection["stopped_at_step"]`` is left for the study to fill in."""
    from autocompress_opt.serving.targets import parent_metrics

    reference = parent_metrics(parent.architecture, target)
    heldout: dict[str, float] = {}
    best: tuple[float, str, Architecture, PrunePlan, dict[str, Any], bool] | None = None
    for name, arch in baselines.items():
        if not target.feasible(arch, reference):
            continue
        plan = plan_pruning(parent.architecture, parent.importance, arch)
        quality, cached = _plan_quality(parent, arch, plan, cache_dir)
        heldout[name] = quality["kl_to_parent"]
        if best is None or quality["kl_to_parent"] < best[0]:
            best = (quality["kl_to_parent"], name, arch, plan, quality, cached)
    if best is None:
        return None
    _, name, arch, plan, quality, cached = best
    now = time.perf_counter()
    selection = {"chosen": name, "heldout_kl": heldout, "stopped_at_step": None}
    spent = {"baseline": now - began - timings["parent"], "total": now - began}
    return _payload(parent, arch, plan.kept(), target, quality, cached, selection, {**timings, **spent})


def _compute(parent: ParentContext) -> dict[str, Any]:
    """Where the trial computed and in which dtype (recorded with every result): the embedding's
    device, and every device holding a part of the parent (more than one when a trial's k GPUs
    share it)."""
    weight = next(parent.model.parameters())
    devices = sorted({str(p.device) for p in parent.model.parameters()})
    return {"device": str(weight.device), "dtype": dtype_name(weight.dtype), "devices": devices}


def evaluate_architecture(
    arch: Architecture,
    parent_model: str,
    *,
    inner: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    workload: str | None = None,
) -> dict[str, Any]:
    """Held-out quality of any sub-architecture of ``parent_model`` (e.g. a baseline), measured exactly as a
    weights trial measures its result (same data, importance and quality cache): ``quality``,
    ``kl_to_parent``, ``kl_<domain>`` and ``ppl_<domain>`` (:func:`objective_domains`), ``quality_cached``.
    ``workload``: the target's, which picks the built-in text as for that target's trials
    (:meth:`TrialConfig.for_workload`; None: code and prose)."""

    config = TrialConfig.from_dict(inner).for_workload(workload)
    cache = Path(cache_dir or DEFAULT_CACHE_DIR)
    parent, _ = parent_context(str(parent_model), config, cache)
    plan = plan_pruning(parent.architecture, parent.importance, arch)
    quality, cached = _plan_quality(parent, arch, plan, cache)
    return {
        "quality": math.exp(-quality["kl_to_parent"]),
        "quality_kind": QUALITY_KIND,
        **quality,
        "quality_cached": cached,
    }
