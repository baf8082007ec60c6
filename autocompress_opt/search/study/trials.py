"""Trial functions: what one outer-loop trial does with the point the sampler proposed.

A trial function takes a plain, serialisable request (it may run on another Ray node) and returns
a plain result::

    request = {"params": {...global choices...}, "parent": Architecture dict, "target": Target dict,
               "layer_order": [...] | None, "seed": int, "serve_as": engine | "any" (absent: "any")}
    result  = {"architecture": Architecture dict, "metrics": {cost metric: value},
               "quality": float, "quality_kind": str, "serve_as": engine | "any"}

``serve_as`` names the serving engine whose rules the trial's architecture keeps
(:mod:`~autocompress_opt.prune.loadability`; the study passes its target's engine or ``--serve-as``).

Trial functions live in :data:`TRIAL_MODES`. This module ships ``plan``: no weights; the
architecture is scored by the target's cost model and a stand-in for quality (the fraction of the
parent's parameters, or of its importance, retained). The weights path (inner mask search, real
pruning and quality) registers another mode; the driver does not change.

Every study stores a trial's ``quality`` under that one objective name (so studies stay loadable),
but what it measures depends on the mode: ``quality_kind`` says which, and
:data:`QUALITY_LABELS` / :func:`quality_label` name it for people. Every kind is 1.0 for the
parent itself, higher is better, and kinds are not comparable with each other.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import PER_LAYER_MOE, is_moe
from autocompress_opt.arch.search_space import SearchSpace
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.loadability import SERVE_AS_ANY, check_serve_as, loadable_problems, parent_problems
from autocompress_opt.registry import Registry
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import FITS_DEVICE, Target, device_fit_violation, parent_metrics

__all__ = [
    "FITS_DEVICE",
    "PLAN_QUALITIES",
    "QUALITY_LABELS",
    "TRIAL_MODES",
    "LegalMemo",
    "Target",
    "check_loadable",
    "device_fit_violation",
    "engine_loads",
    "legal_point",
    "parent_metrics",
    "plan_quality",
    "plan_trial",
    "quality_label",
    "register_hardware",
    "retained_fraction",
    "run_trial",
    "searches_per_layer",
    "uniform_model",
]

TrialFn = Callable[[Mapping[str, Any]], dict[str, Any]]
TRIAL_MODES: Registry[TrialFn] = Registry("trial mode")


# quality_kind -> what that trial's "quality" measures, as plots and `study show` label it.
# "exp_neg_kl" is weights_trial.QUALITY_KIND (kept here so reading a study imports no torch).
QUALITY_LABELS: dict[str, str] = {
    "retained_params": "retained params (fraction)",  # plan mode: retained_fraction
    "retained_importance": "retained importance",  # plan mode with an importance record
    "exp_neg_kl": "exp(-KL to parent)",  # weights mode: exp(-mean per-position KL), held-out text
    "estimated_kl": "exp(-estimated KL), per-axis fit",  # plan mode: quality.estimate, fitted on measured KL
}
# Plan mode's stand-ins without an importance record; estimate-per-layer also allots the Puzzle form's
# per-MoE-layer sizes by the estimate's layer profile where the engine reads that form (plan_trial).
PLAN_QUALITIES = ("params", "estimate", "estimate-per-layer")


def quality_label(kind: str | None) -> str:
    """The human name of a ``quality_kind`` (:data:`QUALITY_LABELS`); an unknown kind (a plugin's)
    is shown as is, a missing one as ``"quality"``."""
    return QUALITY_LABELS.get(kind, kind) if kind else "quality"


def retained_fraction(arch: Architecture, parent: Architecture) -> float:
    """Plan-mode quality (kind ``retained_params``): the fraction of the parent's parameters
    ``arch`` keeps, in (0, 1]; 1.0 for the parent."""
    return arch.num_params / parent.num_params


_IMPORTANCE: dict[str, Any] = {}


@functools.cache
def _estimate() -> Any:
    """The shipped quality estimate, loaded once per process."""
    from autocompress_opt.quality.estimate import load_estimate

    return load_estimate()


def _importance(path: str) -> Any:
    """An importance record saved by ``Importance.save``, loaded once per process."""
    if path not in _IMPORTANCE:
        from autocompress_opt.prune.importance import Importance

        _IMPORTANCE[path] = Importance.load(path)
    return _IMPORTANCE[path]


def retained_importance(plan: Any, importance: Any) -> float:
    """Plan-mode quality with importance (kind ``retained_importance``): mean over FFN channels,
    query heads and hidden channels of the fraction of the parent's importance mass (Minitron
    activation scores, >= 0) that the pruning plan keeps; in [0, 1], 1.0 for the parent."""

    def fraction(kept: float, total: float) -> float:
        return kept / total if total > 0 else 1.0

    ffn_total = sum(float(t.clamp_min(0).sum()) for t in importance.ffn if t is not None)
    head_total = sum(float(t.clamp_min(0).sum()) for t in importance.heads if t is not None)
    ffn_kept = sum(
        float(importance.ffn[lp.parent_index][list(lp.ffn_channels)].clamp_min(0).sum())
        for lp in plan.layers
        if lp.ffn_channels
    )
    head_kept = sum(
        float(importance.heads[lp.parent_index][list(lp.heads)].clamp_min(0).sum()) for lp in plan.layers if lp.heads
    )
    hidden = importance.hidden.clamp_min(0)
    hidden_kept = float(hidden[list(plan.hidden_channels)].sum())
    return (
        fraction(ffn_kept, ffn_total) + fraction(head_kept, head_total) + fraction(hidden_kept, float(hidden.sum()))
    ) / 3


@TRIAL_MODES.decorator("plan")
def plan_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    """Score a point without weights: cost model for the target + a stand-in for quality.

    ``quality`` is the retained parameter fraction (:func:`retained_fraction`, kind
    ``retained_params``), ``exp(−KL̂)`` of the per-axis quality estimate when
    ``request["plan_quality"]`` is ``estimate`` (kind ``estimated_kl``), or — when
    ``request["importance"]`` names an importance record of the parent — the retained importance
    (:func:`retained_importance`, kind ``retained_importance``), with layers dropped in order of
    least importance (skip-loss).

    With ``plan_quality`` ``estimate-per-layer``, sizes are then allotted per layer by the estimate's
    layer profile under the uniform plan's totals, where the ``serve_as`` engine loads the result: each
    MoE layer's expert width and experts per token (the Puzzle form, :func:`searches_per_layer`;
    :func:`~autocompress_opt.quality.allocate.per_layer_moe_plan`) or each dense FFN's width (the
    DeciLM form; :func:`~autocompress_opt.quality.allocate.per_layer_ffn_plan`); elsewhere it ranks as
    ``estimate``.

    The architecture is otherwise uniform, a plain family checkpoint; under ``request["serve_as"]``'s rules
    it is that of :func:`legal_point` (the point itself, or the largest legal one below it) and
    must load in that engine (beyond what the parent itself cannot change, its family and head
    size: :func:`~autocompress_opt.prune.loadability.parent_problems`), else a :class:`ConfigError`.
    """
    parent = Architecture.from_dict(request["parent"])
    space = SearchSpace.from_dict(request["space"])
    target = Target.from_dict(request["target"])
    importance = _importance(request["importance"]) if request.get("importance") else None
    order = request.get("layer_order")
    if importance is not None and order is None:
        order = importance.layer_order()
    serve_as = check_serve_as(str(request.get("serve_as") or SERVE_AS_ANY))
    _, arch = uniform_model(request["params"], space, parent, serve_as, order)
    stand_in = request.get("plan_quality") or "params"
    if stand_in == "estimate-per-layer" and importance is None:
        arch = _per_layer(arch, parent, space, serve_as)
    metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
    quality, kind = plan_quality(arch, parent, importance, stand_in)
    return {
        "architecture": arch.to_dict(),
        "metrics": metrics,
        "quality": quality,
        "quality_kind": kind,
        "serve_as": serve_as,
    }


def _per_layer(arch: Architecture, parent: Architecture, space: SearchSpace, serve_as: str) -> Architecture:
    """``arch`` with sizes allotted per layer where the ``serve_as`` engine reads them (:func:`plan_trial`):
    a MoE parent's Puzzle-form expert widths and top-k (:func:`searches_per_layer`), a dense parent's
    FFN widths (the DeciLM form, when the engine loads the result); else ``arch`` itself."""
    from autocompress_opt.quality.allocate import per_layer_ffn_plan, per_layer_moe_plan

    def values(name: str) -> tuple[int, ...]:
        return space[name].values if name in space.names else ()

    if is_moe(parent):
        if not searches_per_layer(parent, serve_as):
            return arch
        planned = per_layer_moe_plan(arch, parent, _estimate(), values("expert_width"), values("experts_per_token"))
    else:
        from autocompress_opt.prune.loadability import shape_rules

        heads = next((layer.num_heads for layer in arch.layers if layer.attention), 0)
        rules = shape_rules(serve_as, parent, hidden_size=arch.hidden_size, query_heads=heads)
        if rules is not None and not rules.heterogeneous:
            return arch
        multiple = rules.ffn_multiple if rules is not None else 1
        planned = per_layer_ffn_plan(arch, parent, _estimate(), values("ffn_width"), multiple)
    return planned if planned is arch or engine_loads(parent, serve_as)(planned) else arch


def uniform_model(
    params: Mapping[str, Any],
    space: SearchSpace,
    parent: Architecture,
    serve_as: str,
    layer_order: Sequence[int] | None = None,
    memo: LegalMemo | None = None,
) -> tuple[dict[str, int], Architecture]:
    """The plan-mode model of a sampled point: its engine-legal point (:func:`legal_point`, with
    ``memo``) and that point's uniform architecture (layers dropped in ``layer_order``), which the
    ``serve_as`` engine loads (:func:`check_loadable`); a :class:`ConfigError` when there is none. What
    :func:`plan_trial` scores and the weights study's proxy (:mod:`.proxy`) checks."""
    built: dict[str, Architecture] = {}
    legal = _legal_point(
        {k: int(v) for k, v in params.items()}, space, parent, serve_as, memo, built if layer_order is None else None
    )
    if "point" in built:  # the legal point's model, just built and judged loadable by legal_point: the same
        return legal, built["point"]  # model in the default layer order, so no second build and check
    arch = space.architecture(legal, parent, layer_order)
    check_loadable(arch, parent, serve_as)
    return legal, arch


def plan_quality(
    arch: Architecture, parent: Architecture, importance: Any = None, stand_in: str = "params"
) -> tuple[float, str]:
    """``(quality, kind)`` of a plan-mode point: the retained importance of ``arch`` cut by the
    importance record (kind ``retained_importance``); else, by ``stand_in`` (:data:`PLAN_QUALITIES`),
    the retained parameter fraction (``params``, kind ``retained_params``) or ``exp(−KL̂)`` of the
    shipped per-axis quality estimate (``estimate``, kind ``estimated_kl``:
    :mod:`autocompress_opt.quality.estimate`, fitted on measured KL)."""
    if importance is None and stand_in in ("estimate", "estimate-per-layer"):
        return _estimate().quality(arch, parent), "estimated_kl"
    if importance is None:
        return retained_fraction(arch, parent), "retained_params"
    from autocompress_opt.prune.plan import plan_pruning

    return retained_importance(plan_pruning(parent, importance, arch), importance), "retained_importance"


# (parameters, loadable) of a point's uniform model, by the point's sorted items: valid for one
# (parent, space, serve_as), which its holder keeps it to (legal_point's ``memo``).
LegalMemo = dict[tuple[tuple[str, int], ...], tuple[int, bool]]


def legal_point(
    params: Mapping[str, int],
    space: SearchSpace,
    parent: Architecture,
    serve_as: str,
    memo: LegalMemo | None = None,
) -> dict[str, int]:
    """``params`` when its uniform model is a shape the ``serve_as`` engine loads (:func:`check_loadable`),
    else the largest such point of ``space`` (by parameters, then hidden size and query heads) whose
    ``hidden_size``, ``num_kv_heads`` and ``q_per_kv`` are not above the sampled ones; depth and FFN
    width are kept. E.g. a Llama's hidden size must be a multiple of its query heads (a plain
    checkpoint), so ``hidden_size=448`` with 9 heads becomes 384 with 6 in SmolLM2's space.

    ``memo`` (for this ``parent``, ``space`` and ``serve_as`` only) keeps each candidate's parameters
    and loadability: points of one depth and FFN width share their candidates, so scoring a whole
    space (the proxy's ranking) builds each architecture once instead of about six times.

    Raises :class:`ConfigError` when no point at or below ``params`` is legal."""
    return _legal_point(params, space, parent, serve_as, memo)


def _legal_point(
    params: Mapping[str, int],
    space: SearchSpace,
    parent: Architecture,
    serve_as: str,
    memo: LegalMemo | None = None,
    built: dict[str, Architecture] | None = None,
) -> dict[str, int]:
    """:func:`legal_point`; with ``built``, a point legal as sampled whose model this call built (not
    read from ``memo``) leaves that model (default layer order) there under ``"point"``."""
    point = {k: int(v) for k, v in params.items()}
    if serve_as == SERVE_AS_ANY:
        return point
    own = set(parent_problems(parent, serve_as))
    judged: LegalMemo = {} if memo is None else memo

    def problems(arch: Architecture) -> list[str]:
        return _avoidable_problems(arch, serve_as, own)

    def judge(candidate: dict[str, int]) -> tuple[int, bool]:
        key = tuple(sorted(candidate.items()))
        if key not in judged:
            arch = space.architecture(candidate, parent)
            judged[key] = (arch.num_params, not problems(arch))
            if built is not None and candidate is point and judged[key][1]:
                built["point"] = arch
        return judged[key]

    if judge(point)[1]:
        return point
    best: tuple[tuple[int, int, int], dict[str, int]] | None = None
    for hidden in space["hidden_size"].values:
        for kv in space["num_kv_heads"].values:
            for q in space["q_per_kv"].values:
                if hidden > point["hidden_size"] or kv > point["num_kv_heads"] or q > point["q_per_kv"]:
                    continue
                candidate = {**point, "hidden_size": hidden, "num_kv_heads": kv, "q_per_kv": q}
                num_params, loadable = judge(candidate)
                key = (num_params, hidden, kv * q)
                if (best is None or key > best[0]) and loadable:
                    best = (key, candidate)
    if best is None:
        why = problems(space.architecture(point, parent))
        raise ConfigError(
            f"serve_as {serve_as}: no point of the search space at or below {point} is a shape {serve_as} loads "
            f"({'; '.join(why)}); widen the space's hidden_size / head choices or use serve_as any"
        )
    return best[1]


def engine_loads(parent: Architecture, serve_as: str) -> Callable[[Architecture], bool]:
    """Whether the ``serve_as`` engine loads a model cut from ``parent``, as a predicate: no problem
    pruning could have avoided (:func:`check_loadable`'s test; ``any``: every model)."""
    if serve_as == SERVE_AS_ANY:
        return lambda arch: True
    own = set(parent_problems(parent, serve_as))
    return lambda arch: not _avoidable_problems(arch, serve_as, own)


def searches_per_layer(parent: Architecture, serve_as: str) -> bool:
    """Whether a trial of ``parent`` served by ``serve_as`` gives each MoE layer its own expert width and
    top-``k``: the family has a per-layer form (``any``: every form) and the engine loads it for this
    parent (a probe, the parent with one MoE layer narrower, raises no problem the parent has not:
    e.g. llama.cpp's Puzzle reader takes no dense MLP layer)."""
    if parent.family not in PER_LAYER_MOE:
        return False
    if serve_as == SERVE_AS_ANY:
        return True
    moe = [i for i, layer in enumerate(parent.layers) if layer.moe is not None and layer.moe.expert_width > 1]
    if serve_as not in PER_LAYER_MOE[parent.family] or not moe:
        return False
    layers = list(parent.layers)
    spec = layers[moe[0]].moe
    assert spec is not None
    layers[moe[0]] = replace(layers[moe[0]], moe=replace(spec, expert_width=spec.expert_width - 1))
    return engine_loads(parent, serve_as)(replace(parent, layers=tuple(layers)))


def check_loadable(arch: Architecture, parent: Architecture, serve_as: str) -> None:
    """Raise :class:`ConfigError` when the ``serve_as`` engine cannot load ``arch`` for a reason
    pruning could have avoided (:func:`~autocompress_opt.prune.loadability.loadable_problems`
    less the parent's own, :func:`~autocompress_opt.prune.loadability.parent_problems`)."""
    if serve_as == SERVE_AS_ANY:
        return
    problems = _avoidable_problems(arch, serve_as, set(parent_problems(parent, serve_as)))
    if problems:
        raise ConfigError(f"serve_as {serve_as}: {arch.summary()} cannot be served: {'; '.join(problems)}")


def _avoidable_problems(arch: Architecture, serve_as: str, own: set[str]) -> list[str]:
    """Why ``serve_as`` cannot load ``arch`` (:func:`~autocompress_opt.prune.loadability.loadable_problems`),
    less the parent's ``own`` problems, which no pruned model can avoid."""
    return [p for p in loadable_problems(arch, serve_as) if p not in own]


# Real weights: inner per-layer mask search (a MoE parent: the expert search) → materialise →
# held-out quality → cost. Registered lazily: torch-heavy, and the module imports this one.
TRIAL_MODES.register_lazy("weights", "autocompress_opt.search.study.weights_trial:run_weights_trial")


def load_plugins(modules: Sequence[str]) -> None:
    """Import plugin modules; importing one registers its trial modes in :data:`TRIAL_MODES`."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugin module {name!r} cannot be imported: {exc}") from None


def register_hardware(profiles: Sequence[Mapping[str, Any]]) -> None:
    """Register user hardware profiles (``Hardware.to_dict()`` of entries that
    :func:`~autocompress_opt.serving.hardware.load_hardware_file` read and checked in the driver)
    in this process's catalog, replacing earlier user entries of the same name: a trial on another
    Ray node knows the study's custom GPUs without their file."""
    from autocompress_opt.serving.hardware import HARDWARE, Hardware

    for profile in profiles:
        item = Hardware.from_dict(profile)
        HARDWARE.register(item.name, item, replace=True)


def run_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    """Dispatch to the trial mode named in ``request["mode"]`` (after importing its plugins and
    registering the study's user hardware, ``request["hardware"]``)."""
    load_plugins(request.get("plugins") or ())
    register_hardware(request.get("hardware") or ())
    try:
        return TRIAL_MODES.get(str(request.get("mode", "plan")))(request)
    finally:
        _release_gpu_cache()


def _release_gpu_cache() -> None:
    """Hand the CUDA caching allocator's free blocks back after a trial: an actor Ray reuses for the
    next trial (``reuse_actors``) would otherwise keep the last child's memory reserved. Never
    imports torch (a plan-mode trial does not)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
