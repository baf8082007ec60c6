"""Trial functions: what one outer-loop trial does with the point the sampler proposed.

A trial function takes a plain, serialisable request (it may run on another Ray node) and returns
a plain result::

    request = {"params": {...global choices...}, "parent": Architecture dict, "target": Target dict,
               "layer_order": [...] | None, "seed": int}
    result  = {"architecture": Architecture dict, "metrics": {cost metric: value},
               "quality": float, "quality_kind": str}

Trial functions live in :data:`TRIAL_MODES`. This module ships ``plan``: no weights; the
architecture is scored by the target's cost model and a quality proxy (the fraction of the
parent's parameters retained). The weights path (inner mask search, real pruning and quality)
registers another mode; the driver does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autocompress_opt.architecture import Architecture
from autocompress_opt.costmodel import Scenario, estimate_cost
from autocompress_opt.engines import get_engine
from autocompress_opt.errors import ConfigError, reject_unknown_keys
from autocompress_opt.registry import Registry
from autocompress_opt.search_space import SearchSpace
from autocompress_opt.workloads import Workload, get_workload

__all__ = ["TRIAL_MODES", "Target", "plan_trial", "quality_proxy"]

TrialFn = Callable[[Mapping[str, Any]], dict[str, Any]]
TRIAL_MODES: Registry[TrialFn] = Registry("trial mode")


@dataclass(frozen=True)
class Target:
    """Where and how the pruned model will be served; one Optuna study per target.

    ``constraints`` overrides or adds to the workload's (``{"tpot_ms": "0.6x"}``); ``None``
    fields take the workload's defaults.
    """

    hardware: str
    workload: str
    engine: str | None = None
    dtype: str | None = None
    tp: int = 1
    input_len: int | None = None
    output_len: int | None = None
    concurrency: int | str | None = None
    constraints: Mapping[str, str] = field(default_factory=dict)
    engine_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from autocompress_opt.hardware import get_hardware

        get_hardware(self.hardware)
        self.resolved_workload()  # validates names and constraint strings
        self.scenario()

    def resolved_workload(self) -> Workload:
        return get_workload(self.workload).with_constraints(dict(self.constraints))

    @property
    def engine_name(self) -> str:
        return self.engine or get_workload(self.workload).engine

    def scenario(self) -> Scenario:
        return get_workload(self.workload).scenario(dtype=self.dtype, tp=self.tp, input_len=self.input_len,
                                                    output_len=self.output_len, concurrency=self.concurrency)

    def engine_obj(self) -> Any:
        return get_engine(self.engine_name).with_options(**dict(self.engine_options))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["constraints"] = dict(self.constraints)
        data["engine_options"] = dict(self.engine_options)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        reject_unknown_keys(data, cls.__dataclass_fields__, "a target")
        return cls(**data)


FITS_DEVICE = "fits device memory"


def device_fit_violation(metrics: Mapping[str, float], target: Target) -> float:
    """Normalised violation of "the model, its KV cache and activations fit the device":
    ``peak_memory_gib / (device memory · engine memory fraction) - 1`` (<= 0 fits); also
    violated (+1) when not one sequence fits."""
    from autocompress_opt.hardware import get_hardware

    engine = target.engine_obj()
    budget = get_hardware(target.hardware).memory_gib * (engine.memory_fraction if engine.memory_policy != "dynamic" else 1.0)
    over = metrics["peak_memory_gib"] / budget - 1
    return max(over, 1.0) if metrics["max_concurrency"] < 1 else over


def parent_metrics(parent: Architecture, target: Target) -> dict[str, float]:
    """The parent's cost in the target scenario: the reference of relative constraints."""
    return estimate_cost(parent, target.hardware, target.engine_obj(), target.scenario()).to_dict()


def quality_proxy(arch: Architecture, parent: Architecture) -> float:
    """Plan-mode quality: the fraction of the parent's parameters the architecture keeps."""
    return arch.num_params / parent.num_params


_IMPORTANCE: dict[str, Any] = {}


def _importance(path: str) -> Any:
    """An importance record saved by ``Importance.save``, loaded once per process."""
    if path not in _IMPORTANCE:
        from autocompress_opt.importance import Importance

        _IMPORTANCE[path] = Importance.load(path)
    return _IMPORTANCE[path]


def retained_importance(plan: Any, importance: Any) -> float:
    """Mean over FFN channels, query heads and hidden channels of the fraction of the parent's
    importance mass (Minitron activation scores, >= 0) that the pruning plan keeps."""
    def fraction(kept: float, total: float) -> float:
        return kept / total if total > 0 else 1.0

    ffn_total = sum(float(t.clamp_min(0).sum()) for t in importance.ffn if t is not None)
    head_total = sum(float(t.clamp_min(0).sum()) for t in importance.heads if t is not None)
    ffn_kept = sum(float(importance.ffn[lp.parent_index][list(lp.ffn_channels)].clamp_min(0).sum())
                   for lp in plan.layers if lp.ffn_channels)
    head_kept = sum(float(importance.heads[lp.parent_index][list(lp.heads)].clamp_min(0).sum())
                    for lp in plan.layers if lp.heads)
    hidden = importance.hidden.clamp_min(0)
    hidden_kept = float(hidden[list(plan.hidden_channels)].sum())
    return (fraction(ffn_kept, ffn_total) + fraction(head_kept, head_total) + fraction(hidden_kept, float(hidden.sum()))) / 3


@TRIAL_MODES.decorator("plan")
def plan_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    """Score a point without weights: cost model for the target + a quality proxy.

    The proxy is the retained parameter fraction, or — when ``request["importance"]`` names an
    importance record of the parent — the retained importance (:func:`retained_importance`), with
    layers dropped in order of least importance (skip-loss).
    """
    parent = Architecture.from_dict(request["parent"])
    space = SearchSpace.from_dict(request["space"])
    target = Target.from_dict(request["target"])
    importance = _importance(request["importance"]) if request.get("importance") else None
    order = request.get("layer_order")
    if importance is not None and order is None:
        order = [int(i) for i in (-importance.layer_scores()).argsort()]
    arch = space.architecture(request["params"], parent, order)
    metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
    if importance is None:
        quality, kind = quality_proxy(arch, parent), "retained_params"
    else:
        from autocompress_opt.materialize import plan_pruning

        quality, kind = retained_importance(plan_pruning(parent, importance, arch), importance), "retained_importance"
    return {"architecture": arch.to_dict(), "metrics": metrics, "quality": quality, "quality_kind": kind}


@TRIAL_MODES.decorator("weights")
def weights_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    """Real weights: inner per-layer mask search → materialise → held-out quality → cost.
    (Imported lazily: torch-heavy, and ``import autocompress_opt`` must stay light.)"""
    from autocompress_opt.weights_trial import run_weights_trial

    return run_weights_trial(request)


def load_plugins(modules: Sequence[str]) -> None:
    """Import plugin modules; importing one registers its trial modes in :data:`TRIAL_MODES`."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugin module {name!r} cannot be imported: {exc}") from None


def run_trial(request: Mapping[str, Any]) -> dict[str, Any]:
    """Dispatch to the trial mode named in ``request["mode"]`` (after importing its plugins)."""
    load_plugins(request.get("plugins") or ())
    return TRIAL_MODES.get(str(request.get("mode", "plan")))(request)
