"""What a study enqueues before its own samples: the baselines' points and the plan-mode proxy's.

**Seeding with the baselines** (:attr:`~.config.StudyConfig.seed_baselines`, on by default in
weights mode): before its own samples a study enqueues the global choices of the ``depth``,
``minitron`` and ``best-uniform`` baselines for its target, each chosen by :func:`choose_baseline`
(:func:`~autocompress_opt.prune.baselines.make_baseline` among the candidates that meet the target's
exact constraint check and that the trials' engine loads, scored by :func:`baseline_scorer` on
:func:`baseline_rows`, then snapped down onto the search space's values). ``autocompress prune
--baseline`` calls the same two functions with the same inputs, so it exports the model a study
seeds. Together with the inner search's ``uniform`` candidate, a weights study's best is then never
worse on its own objective than the uniform models it would be compared with. After them come the
**runners-up** (:attr:`~.config.StudyConfig.runners_up`, 2 by default in weights mode):
best-uniform's next-best scored candidates (:func:`runner_up_seeds`), the region the best uniform
model sits in, where the inner search has room to make a trial heterogeneous. The points are stored
in the study (``baseline_seeds``) and enqueued with ``skip_if_exists``, so resuming never adds them
twice. The proxy's ranked points (:mod:`~autocompress_opt.search.study.proxy`) are stored and
enqueued the same way (``proxy_points``).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_moe
from autocompress_opt.arch.search_space import CHOICES, SearchSpace, uniform_allocation
from autocompress_opt.search.study.config import SEEDED_BASELINES, StudyConfig
from autocompress_opt.search.study.placement import Placement, driver_cache_dir, driver_compute_dtype, trials_on_gpus
from autocompress_opt.search.study.trials import Target

__all__ = [
    "BaselineSeed",
    "SeedScoring",
    "baseline_rows",
    "baseline_scorer",
    "baseline_seeds",
    "choose_baseline",
    "enqueue_proxy_points",
    "make_proxy",
    "runner_up_seeds",
    "seed_scoring",
    "seed_study",
    "seeded_baselines",
]

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
    """The study's seed point of each of :data:`SEEDED_BASELINES` for ``target``: :func:`choose_baseline`
    with ``importance``, ``score``, ``config.seed_top_k`` (how many candidates each scores),
    ``config.space`` and the engine the target's trials keep shapes for
    (:meth:`~.config.StudyConfig.serve_as_for`). Returns, per baseline, :meth:`BaselineSeed.record`:
    ``{"point", "baseline_point", "finding"}`` plus, when the point needed no snapping,
    ``"architecture"``: the baseline's own model (its layers kept by its own criterion), which the
    trial of that point weighs as a candidate (:func:`~.searcher.baseline_candidates`); or ``{"skipped": reason}``.
    """
    if config.mode == "weights" and is_moe(parent):  # the sparse axes' seeds
        from autocompress_opt.prune.baselines import expert_seeds, target_feasibility

        order = layer_order or (importance.layer_order() if importance is not None else None)
        return expert_seeds(config.space, parent, target_feasibility(target, parent), score, order)
    if is_moe(parent):  # plan mode: the uniform baselines cut dense layers only
        return {name: {"skipped": _PLAN_MOE_SKIP} for name in SEEDED_BASELINES}
    chosen = {
        name: choose_baseline(
            name,
            target,
            parent,
            config.space,
            importance=importance,
            score=score,
            top_k=config.seed_top_k.get(name),
            layer_order=layer_order,
            serve_as=config.serve_as_for(target),
        )
        for name in SEEDED_BASELINES
    }
    seeds = {name: seed.record() for name, seed in chosen.items()}
    if config.runner_up_seeds:
        taken = [seed.point for seed in chosen.values() if seed.point is not None]
        seeds.update(
            runner_up_seeds(
                chosen["best-uniform"],
                config.runner_up_seeds,
                target,
                parent,
                config.space,
                taken=taken,
                importance=importance,
                layer_order=layer_order,
                serve_as=config.serve_as_for(target),
            )
        )
    return seeds


def runner_up_seeds(
    best: BaselineSeed,
    k: int,
    target: Target,
    parent: Architecture,
    space: SearchSpace,
    *,
    taken: Sequence[Mapping[str, int]] = (),
    importance: Any = None,
    layer_order: Sequence[int] | None = None,
    serve_as: str = "any",
) -> dict[str, dict[str, Any]]:
    """Up to ``k`` more seeds from best-uniform's own ranking: its scored candidates after its choice,
    lowest score first, each snapped onto ``space`` as :func:`choose_baseline` snaps its choice, skipping
    points already in ``taken`` (the baselines' points) or seeded, and snapped points the target or the
    ``serve_as`` engine refuses. Keyed ``best-uniform#2``, ``best-uniform#3``... (the rank among
    best-uniform's candidates), in :meth:`BaselineSeed.record`'s form.

    Why: the uniform models scored next-best sit in the region where the best uniform model is, but a
    trial of such a point has room the best one may lack (its FFN below the parent's width, a layer
    more), so the inner search can make it heterogeneous there; a sampler's first points are usually far
    from that region. The candidates were scored anyway (no extra forward pass); each seed costs one
    trial, which, like a baseline's, early stopping does not cut short. None when best-uniform chose
    nothing or ranked its candidates by parameters (no scorer: no next-best to speak of).
    """
    from autocompress_opt.prune.baselines import target_feasibility
    from autocompress_opt.search.study.trials import engine_loads

    result = best.result
    if k <= 0 or best.point is None or result.ranked_by != "score":
        return {}
    meets, loads = target_feasibility(target, parent), engine_loads(parent, serve_as)
    order = layer_order or (importance.layer_order() if importance is not None else None)
    finite = [s for s in result.candidates if s.score is not None and math.isfinite(s.score)]
    ranked = sorted(
        (s for s in finite if s.candidate != result.choice), key=lambda s: (s.score, -s.candidate.num_params)
    )
    seen = [dict(p) for p in taken]
    out: dict[str, dict[str, Any]] = {}
    for rank, scored in enumerate(ranked, 2):
        if len(out) == k:
            break
        wanted = scored.candidate.point
        point, _ = _snap(wanted, space)
        if point is None or point in seen:
            continue
        arch = scored.candidate.architecture if point == wanted else uniform_allocation(point, parent, order)
        if point != wanted and not (loads(arch) and meets(arch)):
            continue
        seen.append(point)
        snapped = f", snapped onto the space as {point}" if point != wanted else ""
        record: dict[str, Any] = {
            "point": point,
            "baseline_point": wanted,
            "finding": (
                f"runner-up {rank} of best-uniform's {len(result.candidates)} scored candidates: "
                f"{scored.candidate.label()} (score {scored.score:.4f}; best {result.score:.4f}){snapped}"
            ),
        }
        if point == wanted:  # the trial of this point also weighs this uniform model (as a baseline's)
            record["architecture"] = arch.to_dict()
        out[f"best-uniform#{rank}"] = record
    return out


@dataclasses.dataclass(frozen=True)
class BaselineSeed:
    """What :func:`choose_baseline` chose: the study's seed point of a baseline and the model
    ``prune --baseline`` exports.

    Attributes:
        result: the baseline's own search (:class:`~autocompress_opt.prune.baselines.BaselineResult`).
        point: its choice snapped onto the search space (None when it is not seeded: ``skipped`` says why).
        architecture: the model ``point`` stands for: the baseline's own choice when no snapping was
            needed, else the point's uniform allocation in the trials' layer order (the model a
            trial of ``point`` starts from); None when skipped.
        skipped: why there is no point (nothing feasible, or nothing feasible in the space), else None.
    """

    result: Any
    point: dict[str, int] | None
    architecture: Architecture | None
    skipped: str | None = None

    @property
    def snapped(self) -> bool:
        """Whether the point differs from the baseline's own choice (snapped onto the space)."""
        return self.point is not None and self.point != self.result.choice.point

    def record(self) -> dict[str, Any]:
        """The form a study stores (``baseline_seeds``, module doc)."""
        if self.point is None or self.architecture is None:
            return {"skipped": self.skipped}
        out: dict[str, Any] = {
            "point": self.point,
            "baseline_point": self.result.choice.point,
            "finding": self.result.finding,
        }
        if not self.snapped:  # the trial of this point also weighs the baseline's own model
            out["architecture"] = self.architecture.to_dict()
        return out


def choose_baseline(
    name: str,
    target: Target,
    parent: Architecture,
    space: SearchSpace,
    *,
    importance: Any = None,
    score: Callable[[Architecture], float] | None = None,
    top_k: int | None = None,
    layer_metric: str | None = None,
    layer_order: Sequence[int] | None = None,
    serve_as: str = "any",
) -> BaselineSeed:
    """The baseline ``name``'s choice for ``target``, as a study seeds it and ``prune --baseline``
    exports it: the one implementation both call.

    1. :func:`~autocompress_opt.prune.baselines.make_baseline` on the parent's uniform grid, among the
       candidates that meet the target's exact constraint check (relative constraints against the
       parent's cost, :func:`~autocompress_opt.prune.baselines.target_feasibility`) and that the
       ``serve_as`` engine loads (:func:`~.trials.engine_loads`; ``any``: every shape), ranked by
       ``score`` (lower is better; :func:`baseline_scorer`; None: by parameters), ``top_k`` and
       ``layer_metric`` (None: each baseline's default), layers ordered by ``importance``.
    2. The choice snapped onto ``space``: each choice to the largest allowed value not above it (never
       a larger, costlier model). A snapped point is checked again (constraints and engine) on its
       uniform allocation in the trials' layer order (``layer_order``, else the importance's
       ``skip_loss`` order, else the default): a trial of the point starts from that model.

    Deterministic given its inputs. Dense parents only (a MoE parent's seeds:
    :func:`~autocompress_opt.prune.baselines.expert_seeds`).
    """
    from autocompress_opt.prune.baselines import make_baseline, target_feasibility
    from autocompress_opt.search.study.trials import engine_loads

    meets, loads = target_feasibility(target, parent), engine_loads(parent, serve_as)
    accept = lambda arch: loads(arch) and meets(arch)
    result = make_baseline(
        name, parent, accept, importance=importance, score=score, top_k=top_k, layer_metric=layer_metric
    )
    if result.choice is None:
        return BaselineSeed(result, None, None, result.finding)
    wanted = result.choice.point
    point, why = _snap(wanted, space)
    if point is None:
        return BaselineSeed(result, None, None, f"{result.choice.label()} is outside the search space: {why}")
    if point == wanted:
        return BaselineSeed(result, point, result.choice.architecture)
    order = layer_order or (importance.layer_order() if importance is not None else None)
    arch = uniform_allocation(point, parent, order)
    if not accept(arch):
        why = "infeasible" if loads(arch) else f"not a shape {serve_as} loads"
        skipped = f"{result.choice.label()} snapped onto the search space as {point} is {why}"
        return BaselineSeed(result, None, None, skipped)
    return BaselineSeed(result, point, arch)


_PLAN_MOE_SKIP = (
    "the uniform baselines prune dense parents only; a plan-mode study of a MoE or hybrid parent samples "
    "its own points (seed_baselines: false silences this)"
)


def seeded_baselines(config: StudyConfig, parent: Architecture) -> tuple[str, ...]:
    """The baselines whose points :func:`baseline_seeds` chooses for ``parent`` (the others it
    records as skipped): all of :data:`SEEDED_BASELINES`; for a MoE or hybrid parent only
    ``depth`` and ``minitron`` over the expert axes in a weights study
    (:func:`~autocompress_opt.prune.baselines.expert_seeds`), none in plan mode."""
    if is_moe(parent):
        return ("depth", "minitron") if config.mode == "weights" else ()
    return SEEDED_BASELINES


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
    ``(importance, score)`` pair of ``target`` (default :func:`seed_scoring`); a study group passes
    its :class:`SeedScoring`'s, so the parent is loaded once per run and each candidate scored once per
    data setting.
    """
    seeds = study.user_attrs.get("baseline_seeds")
    if seeds is None:
        importance, score = (scoring or (lambda: seed_scoring(config, target)))()
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


# Part of every candidate score's cache key: bump when the score changes (2: the choice rows of the
# selection split, was the first calibration rows; their tokens are in the key as well).
SEED_SCORE_VERSION = "seed-score/2"


def baseline_rows(tokenizer: Any, trial: Any) -> Any | None:
    """The rows on which every baseline chooses among its candidates: the inner search's choice rows
    (:func:`~.weights_trial.choice_rows`: ``inner.val_samples`` selection rows of ``inner.seq_len``
    tokens, none of them a row of the trial's objective), so a baseline chooses on the split and by
    the score the study's own candidates are chosen by. None when ``val_samples`` is 0 (then the
    baselines rank by parameters). ``trial``: a
    :class:`~.weights_trial.TrialConfig` resolved for the target's workload."""
    from autocompress_opt.search.study.weights_trial import choice_rows

    return choice_rows(tokenizer, trial) if trial.inner.val_samples else None


def baseline_scorer(model: Any, importance: Any, rows: Any, *, batch_size: int = 4) -> Callable[[Architecture], float]:
    """``score(arch)``: KL(parent ‖ ``arch``) on ``rows`` (``(n, T)`` token ids, :func:`baseline_rows`'),
    ``arch`` cut from ``model`` by ``importance``
    (:func:`~autocompress_opt.prune.baselines.masked_kl_scorer`; a MoE parent's expert search:
    :func:`~autocompress_opt.prune.baselines.expert_kl_scorer`). Lower is better; deterministic."""
    if is_moe(Architecture.from_hf_config(model.config)):  # the expert search's start point, scored
        from autocompress_opt.prune.baselines import expert_kl_scorer

        return expert_kl_scorer(model, importance, rows)
    from autocompress_opt.prune.baselines import masked_kl_scorer

    return masked_kl_scorer(model, importance, rows, batch_size=batch_size)


class SeedScoring:
    """``(importance, score)`` for :func:`baseline_seeds` and the proxy of each target of a study group.

    In weights mode, for a target: the importance its trials use (the parent's, on the calibration
    rows of its workload's data, :meth:`TrialConfig.for_workload
    <autocompress_opt.search.study.weights_trial.TrialConfig.for_workload>`; read from or written to the
    trials' own disk cache, so the trials then find it there) and ``score``, the KL of a candidate to
    the parent on the inner search's choice rows (:func:`baseline_scorer` on :func:`baseline_rows`:
    selection rows, none of them the objective's). Nothing else of a trial's context is built: no
    teacher on the search's training rows, none on the objective's rows. A candidate's score depends on
    the parent and the rows, not on the hardware (only the choice among candidates does), so targets
    whose workloads read the same data share one pair, and each score is kept on disk
    (``cache_dir/seed_scores``, keyed by the parent, the importance, the rows and the candidate): a
    later study on the same parent and data scores a candidate it has seen without a forward pass.
    The parent is loaded once, on first use, and held until :meth:`release`.

    The driver reads the parent on ``config.driver_device``: the CPU unless the user names a GPU of
    the driver's (the trials compute on the GPUs Ray assigns them, as many as ``--gpus-per-trial``
    says, and a head node may have none). It reads it in the trials' compute dtype
    (:func:`~.placement.driver_compute_dtype`: bf16 when they run on GPUs), so the importance it
    writes is the entry the trials read; whether they run on GPUs is known from the config, from this
    machine when Ray is local, or else from the placement (:meth:`place`).

    In plan mode: the ``importance`` record if the config names one, unscored; else neither.
    """

    def __init__(self, config: StudyConfig) -> None:
        self.config = config
        self._pairs: dict[str, tuple[Any, Any]] = {}  # data setting -> (importance, score)
        self._parent: tuple[Any, Any, str] | None = None  # (model, tokenizer, parent_id)
        self._loading: threading.Thread | None = None  # preload's thread, until joined
        self._load_error: BaseException | None = None
        self._placement: Placement | None = None  # the trials' placement, once planned (place)

    def place(self, placement: Placement) -> None:
        """Record the trials' placement: whether they compute on GPUs decides the dtype the parent is
        read in (:meth:`preload` waits for it when nothing else says)."""
        self._placement = placement

    def gpu_trials(self) -> bool | None:
        """Whether the trials compute on GPUs (:func:`~.placement.trials_on_gpus`); on a local Ray
        without a placement yet, whether this machine has a CUDA GPU; None while unknown (a cluster
        by address before :meth:`place`)."""
        config = self.config
        known = trials_on_gpus(str(config.inner.get("device", "auto")), config.gpus_per_trial, self._placement)
        if known is None and not config.address:  # a local Ray's GPUs are this machine's
            import torch

            known = torch.cuda.is_available()
        return known

    def _driver_trial(self, trial: Any) -> Any:
        """``trial`` as the driver loads the parent: on ``config.driver_device`` in the trials' dtype."""
        dtype = driver_compute_dtype(trial.compute_dtype, bool(self.gpu_trials()))
        return dataclasses.replace(trial, device=self.config.driver_device, compute_dtype=dtype)

    def __call__(self, target: Target | None = None) -> tuple[Any, Any]:
        """The pair for ``target`` (None: a config with no workload, whose trials read ``mixed`` data)."""
        config = self.config
        if config.mode != "weights":
            if "plan" not in self._pairs:
                from autocompress_opt.prune.importance import Importance

                self._pairs["plan"] = (Importance.load(config.importance), None) if config.importance else (None, None)
            return self._pairs["plan"]
        trial = self._trial_config(target)
        key = self.data_key(target)
        if key not in self._pairs:
            self._pairs[key] = self._weights_pair(trial)
        return self._pairs[key]

    def data_key(self, target: Target | None = None) -> str:
        """The data setting of ``target``'s pair: targets with equal keys share one (importance,
        score), so preparing them one after another loads no new data (plan mode: one key)."""
        if self.config.mode != "weights":
            return "plan"
        trial = self._trial_config(target)
        # the only data settings targets differ in; the user's data is read whatever the domain
        return json.dumps([trial.data, None if trial.data else trial.data_domain])

    def _trial_config(self, target: Target | None) -> Any:
        from autocompress_opt.search.study.weights_trial import TrialConfig

        config = self.config
        return TrialConfig.from_dict(config.inner, seed=config.seed).for_workload(target.workload if target else None)

    def preload(self, target: Target | None = None) -> None:
        """Start loading the parent in a background thread, so that it overlaps what the driver does
        before the first target is prepared (starting Ray, opening the studies): a cold GGUF parent is
        a dequantisation and a copy written, about 20 CPU-s for SmolLM2-135M, mostly on one core while
        Ray's processes start. Only in weights mode with seeds or a proxy (the pairs then need the
        parent); the first pair joins it and raises its error. Not before the parent's dtype is known
        (:meth:`gpu_trials`): call it again after :meth:`place`. Call :meth:`settle` before the
        process may exit."""
        config = self.config
        if config.mode != "weights" or not (config.seeds_baselines or config.proxy_points):
            return
        if self._parent is not None or self._loading is not None or self.gpu_trials() is None:
            return
        trial = self._trial_config(target)

        def load() -> None:
            try:
                self._parent = self._load_parent(trial)
            except BaseException as exc:  # re-raised by the first pair that needs the parent
                self._load_error = exc

        self._loading = threading.Thread(target=load, name="autocompress-parent", daemon=True)
        self._loading.start()

    def settle(self) -> None:
        """Wait for :meth:`preload`'s thread (a torch call cut short at interpreter exit aborts the process)."""
        if self._loading is not None:
            self._loading.join()
            self._loading = None

    def _load_parent(self, trial: Any) -> tuple[Any, Any, str]:
        from autocompress_opt.search.study.trial_context import parent_parts

        model, tokenizer, _, parent_id, _ = parent_parts(
            self.config.model, self._driver_trial(trial), Path(driver_cache_dir(self.config.cache_dir))
        )
        return model, tokenizer, parent_id

    def release(self) -> None:
        """Drop the parent model (the pairs' scores need it: call after the last score), and give back
        the GPU memory it held when the driver read it on a GPU."""
        self._parent = None
        self._pairs = {k: (imp, None) for k, (imp, _) in self._pairs.items()}
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            gc.collect()  # the model's tensors, freed only once nothing refers to them
            torch.cuda.empty_cache()

    def _weights_pair(self, trial: Any) -> tuple[Any, Any]:
        from autocompress_opt.search.study.trial_context import parent_importance

        cache = Path(driver_cache_dir(self.config.cache_dir))
        self.settle()
        if self._load_error is not None:
            error, self._load_error = self._load_error, None
            raise error
        if self._parent is None:
            self._parent = self._load_parent(trial)
        model, tokenizer, parent_id = self._parent
        importance = parent_importance(model, tokenizer, parent_id, trial, cache)
        # A baseline chooses among its candidates as the inner search does among its own: on the
        # choice rows of the selection split, never the rows of the study's objective.
        rows = baseline_rows(tokenizer, trial)
        if rows is None:
            return importance, None
        score = baseline_scorer(model, importance, rows.tokens)
        return importance, _stored_scores(score, cache / "seed_scores", parent_id, importance, rows.tokens)


def _stored_scores(
    score: Callable[[Architecture], float], folder: Path, parent_id: str, importance: Any, rows: Any
) -> Callable[[Architecture], float]:
    """``score`` with each architecture's value kept on disk under ``folder`` (:func:`~autocompress_opt.cache.fetch`),
    keyed by the parent, the importance (which decides what is kept), the rows and the architecture
    (its name aside); a stored value is returned without calling ``score``."""
    from autocompress_opt.cache import cache_key, fetch
    from autocompress_opt.prune.importance import tokens_id

    meta = importance.meta
    base = (parent_id, meta.data_id, meta.method, tokens_id(rows), "skip_loss")  # masked_kl_scorer's layer metric

    def stored(arch: Architecture) -> float:
        entry = folder / f"{cache_key(SEED_SCORE_VERSION, *base, {**arch.to_dict(), 'name': ''})}.json"
        value, _ = fetch(
            entry,
            lambda: float(_reusing_memory(score, arch)),
            lambda v, tmp: tmp.write_text(json.dumps({"kl": v}), encoding="utf-8"),
            lambda path: float(json.loads(path.read_text(encoding="utf-8"))["kl"]),
        )
        return value

    return stored


def _reusing_memory(score: Callable[[Architecture], float], arch: Architecture) -> float:
    """``score(arch)`` with its vocabulary-wide CPU tensors reusing freed pages, as a trial's do
    (:func:`~autocompress_opt.hf.host_memory.reused_host_memory`: about a third less CPU time a candidate)."""
    from autocompress_opt.hf.host_memory import reused_host_memory

    with reused_host_memory():
        return score(arch)


def seed_scoring(config: StudyConfig, target: Target | None = None) -> tuple[Any, Any]:
    """``(importance, score)`` of ``target`` for :func:`baseline_seeds`, built for this one call
    (:class:`SeedScoring`; a study group shares one across its targets)."""
    return SeedScoring(config)(target)


def make_proxy(
    config: StudyConfig,
    target: Target,
    parent: Architecture,
    parent_cost: Mapping[str, float],
    layer_order: Sequence[int] | None,
    scoring: Callable[[], tuple[Any, Any]],
    memos: dict[str, Any] | None = None,
) -> Any:
    """The target's plan-mode proxy (:class:`~autocompress_opt.search.study.proxy.Proxy`) with the
    parent's importance (from ``scoring``, shared with the seeds). ``memos``: one legal-point memo per
    engine (:func:`~autocompress_opt.search.study.trials.legal_point`), shared by the proxies of one
    study group (one parent, one space), so targets served by the same engine judge each shape once."""
    from autocompress_opt.search.study.proxy import Proxy

    importance, _ = scoring()
    serve_as = config.serve_as_for(target)
    return Proxy(
        parent,
        config.space,
        target,
        parent_cost,
        serve_as=serve_as,
        importance=importance,
        layer_order=layer_order,
        memo=memos.setdefault(serve_as, {}) if memos is not None else {},
        quality=config.proxy_quality,
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
