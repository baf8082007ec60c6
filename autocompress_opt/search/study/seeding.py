"""What a study enqueues before its own samples: the baselines' points and the plan-mode proxy's.

**Seeding with the baselines** (:attr:`~.config.StudyConfig.seed_baselines`, on by default in
weights mode): before its own samples a study enqueues the global choices of the ``depth``,
``minitron`` and ``best-uniform`` baselines for its target
(:func:`~autocompress_opt.prune.baselines.make_baseline`, feasibility by the target's exact
constraint check), snapped down onto the search space's values. Together with the inner search's
``uniform`` candidate, a weights study's best is then never worse on its own objective than the
uniform models it would be compared with. The points are stored in the study (``baseline_seeds``)
and enqueued with ``skip_if_exists``, so resuming never adds them twice. The proxy's ranked points
(:mod:`~autocompress_opt.search.study.proxy`) are stored and enqueued the same way (``proxy_points``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.search_space import CHOICES, SearchSpace, uniform_allocation
from autocompress_opt.search.study.config import SEEDED_BASELINES, StudyConfig
from autocompress_opt.search.study.placement import driver_cache_dir
from autocompress_opt.search.study.trials import Target

__all__ = ["baseline_seeds", "enqueue_proxy_points", "make_proxy", "seed_scoring", "seed_study"]

_log = logging.getLogger(__name__)


def baseline_seeds(
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    *,
    importance: Any = None,
    score: Any = None,
    layer_order: Sequence[int] | None = None,
) -> dict[str, dict[str, Any]]:
    """The study's seed point of each of :data:`SEEDED_BASELINES` for ``target``.

    Each baseline is chosen by :func:`~autocompress_opt.prune.baselines.make_baseline` under the
    target's exact constraint check (:func:`~autocompress_opt.prune.baselines.target_feasibility`),
    with ``importance`` (its layer orders) and ``score`` (``minitron``'s candidate score, lower is
    better; None ranks by parameters). Its point is snapped onto ``config.space``: each choice to the
    largest allowed value not above it (never a larger, costlier model), and the snapped point's
    architecture (:func:`uniform_allocation` in ``layer_order``) is checked again. Returns, per
    baseline, ``{"point", "baseline_point", "finding"}`` plus, when the point needed no snapping,
    ``"architecture"``: the baseline's own model (its layers kept by its own criterion), which the
    trial of that point weighs as a candidate (:func:`~.searcher.baseline_candidates`); or ``{"skipped": reason}``.
    """
    from autocompress_opt.prune.baselines import make_baseline, target_feasibility

    feasible = target_feasibility(target, parent)
    out: dict[str, dict[str, Any]] = {}
    for name in SEEDED_BASELINES:
        result = make_baseline(name, parent, feasible, importance=importance, score=score)
        if result.choice is None:
            out[name] = {"skipped": result.finding}
            continue
        wanted = result.choice.point
        point, why = _snap(wanted, config.space)
        if point is None:
            out[name] = {"skipped": f"{result.choice.label()} is outside the search space: {why}"}
        elif point != wanted and not feasible(uniform_allocation(point, parent, layer_order)):
            out[name] = {"skipped": f"{result.choice.label()} snapped onto the search space as {point} is infeasible"}
        else:
            out[name] = {"point": point, "baseline_point": wanted, "finding": result.finding}
            if point == wanted:  # the trial of this point also weighs the baseline's own model
                out[name]["architecture"] = result.choice.architecture.to_dict()
    return out


def _snap(point: Mapping[str, int], space: SearchSpace) -> tuple[dict[str, int] | None, str]:
    """Each choice to the largest value of ``space`` not above it; None and why when there is none."""
    snapped: dict[str, int] = {}
    for name in CHOICES:
        below = [v for v in space[name].values if v <= point[name]]
        if not below:
            return None, f"{name}={point[name]} is below the smallest allowed {min(space[name].values)}"
        snapped[name] = int(max(below))
    return snapped, ""


def seed_study(
    study: Any,
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    layer_order: Sequence[int] | None = None,
    scoring: Callable[[], tuple[Any, Any]] | None = None,
) -> list[str]:
    """Enqueue the baselines' points (:func:`baseline_seeds`) in ``study``; returns one line per baseline.

    The points are computed once per study and stored as its ``baseline_seeds`` attribute; later
    calls (a resumed study) read them from there. Each distinct point is enqueued with
    ``skip_if_exists`` (a point the study already holds, in any state, is not added again) and the
    user attribute ``baseline`` naming the baseline(s) it comes from. ``scoring`` returns the
    ``(importance, score)`` pair (default :func:`seed_scoring`); a study group passes one shared
    by all its targets, so the parent is loaded and each candidate scored once per run.
    """
    seeds = study.user_attrs.get("baseline_seeds")
    if seeds is None:
        importance, score = (scoring or (lambda: seed_scoring(config)))()
        seeds = baseline_seeds(config, target, parent, importance=importance, score=score, layer_order=layer_order)
        study.set_user_attr("baseline_seeds", seeds)
    by_point: dict[str, list[str]] = {}
    lines = []
    for name, seed in seeds.items():
        if "point" in seed:
            by_point.setdefault(json.dumps(seed["point"], sort_keys=True), []).append(name)
            snapped = "" if seed["point"] == seed["baseline_point"] else f" (snapped from {seed['baseline_point']})"
            lines.append(f"{name}: {seed['point']}{snapped}")
            if snapped:
                _log.warning("%s: baseline %s seeded as %s%s", config.study_name(target), name, seed["point"], snapped)
        else:
            lines.append(f"{name}: not seeded: {seed['skipped']}")
            _log.warning("%s: baseline %s not seeded: %s", config.study_name(target), name, seed["skipped"])
    for key, names in by_point.items():
        study.enqueue_trial(json.loads(key), user_attrs={"baseline": "+".join(names)}, skip_if_exists=True)
    return lines


def seed_scoring(config: StudyConfig) -> tuple[Any, Any]:
    """``(importance, score)`` for :func:`baseline_seeds`: in weights mode the trials' own importance
    and the inner search's KL on ``val_samples`` of its calibration (training) rows (the parent is loaded here,
    then released); in plan mode the ``importance`` record if any, unscored; else neither."""
    if config.mode == "weights":
        from autocompress_opt.prune.baselines import masked_kl_scorer
        from autocompress_opt.search.study.weights_trial import TrialConfig, clear_trial_cache, parent_context

        trial = TrialConfig.from_dict(config.inner, seed=config.seed)
        context, _ = parent_context(config.model, trial, Path(driver_cache_dir(config.cache_dir)))
        # A baseline's own choice among its candidates is part of the baseline (its calibration), so it
        # scores them on the search's calibration rows (after its val_samples selection rows); the
        # comparison of the seeded baselines is the trials' objective, on selection rows.
        val = trial.inner.val_samples
        rows = context.tokens[val : 2 * val]
        score = masked_kl_scorer(context.model, context.importance, rows) if rows.shape[0] else None
        clear_trial_cache()  # the scorer holds what it needs
        return context.importance, score
    if config.importance:
        from autocompress_opt.prune.importance import Importance

        return Importance.load(config.importance), None
    return None, None


def make_proxy(
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    parent_cost: Mapping[str, float],
    layer_order: Sequence[int] | None,
    scoring: Callable[[], tuple[Any, Any]],
) -> Any:
    """The target's plan-mode proxy (:class:`~autocompress_opt.search.study.proxy.Proxy`) with the
    parent's importance (from ``scoring``, shared with the seeds)."""
    from autocompress_opt.search.study.proxy import Proxy

    importance, _ = scoring()
    return Proxy(
        parent,
        config.space,
        target,
        parent_cost,
        serve_as=config.serve_as_for(target),
        importance=importance,
        layer_order=layer_order,
    )


def enqueue_proxy_points(study: Any, proxy: Any, k: int, seed: int = 0) -> list[str]:
    """Enqueue the proxy's ``k`` best points (:meth:`~autocompress_opt.search.study.proxy.Proxy.rank`) in
    ``study`` once: the ranking is stored as the study's ``proxy_points`` attribute, and a resumed
    study reads it from there; each point is enqueued with ``skip_if_exists`` and the attribute
    ``proxy_rank``. Returns one line per point."""
    from autocompress_opt.search.study.proxy import PROXY_RANK_ATTR

    ranked = study.user_attrs.get("proxy_points")
    if ranked is None:
        ranked = [{"point": s.point, "quality": s.quality} for s in proxy.rank(k, seed=seed)]
        study.set_user_attr("proxy_points", ranked)
    lines = []
    for rank, item in enumerate(ranked, 1):
        study.enqueue_trial(item["point"], user_attrs={PROXY_RANK_ATTR: rank}, skip_if_exists=True)
        lines.append(f"proxy #{rank}: {item['point']} (proxy quality {item['quality']:.3f})")
    return lines
