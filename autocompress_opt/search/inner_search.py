"""The inner loop: a differentiable per-layer mask search under a trial's budget, hardware-guided.

Given a frozen parent, its importance scores and calibration tokens, :func:`search` trains the
masks of :class:`~autocompress_opt.search.masks.ParentMasks` with Adam on

    loss = KL(parent ‖ masked parent)  +  Σ_k λ_k · v_k  +  ρ/2 · Σ_k relu(v_k)²

* ``KL`` — next-token distillation to the parent on calibration batches; the parent's log-probs
  are computed once per (parent, data) and cached in process and on disk
  (:func:`teacher_log_probs`, ``.autocompress/teacher/``).
* ``v_k`` — normalised constraint violations (``<= 0`` feasible): the target workload's
  constraints relative to the parent's metrics and the device-fit constraint, evaluated by the
  *differentiable* cost model (:func:`~autocompress_opt.serving.costmodel.estimate_batch` on torch
  tensors built from the masks' expected per-layer structure, :func:`cost_arrays`); and the outer
  trial's global choices as budgets (:class:`Budget`). Hardware constraints get a small margin
  (``v + margin``) so that rounding lands inside. By default the violation *values* are those of
  the rounded masks and the *gradients* those of the relaxation (straight-through), so the
  penalty prices exactly what discretisation will keep.
* ``λ_k`` — Lagrange multipliers, raised while violated and lowered while satisfied (dual ascent,
  ``λ ← max(0, λ + η·v)``, once per step).

Around the training (:func:`search`):

1. **Start point** — the trial's uniform allocation (or the parent) is rounded, repaired and
   filled (below) into a feasible heterogeneous point, and the masks start there.
2. **Train** as above, then **discretise** (:func:`discretise`): round to hardware-friendly sizes
   (whole FFN units, whole KV groups; gates at ½; kept sub-blocks capped by the layer budget by gate
   value), **repair** with the exact cost model (greedily remove the unit with the least
   importance per unit of violation removed) until every constraint and budget holds, and
   **fill** (greedily add back the unit with the most importance per unit of slack used while
   everything still holds).
3. **Select** — the trained point unless the start point is feasible where it is not, or has a
   lower KL to the parent on calibration rows held out of training (``val_samples``): with a
   few dozen noisy steps the search must never return worse than where it started.

If no repair satisfies everything the result says infeasible and lists the violated amounts;
feasibility is always judged by :func:`~autocompress_opt.serving.costmodel.estimate_cost` on the final
architecture, never by the relaxation.

Determinism: the same inputs and ``InnerConfig.seed`` give the same result (batch sampling and
gate noise come from one seeded generator; CPU kernels are deterministic at a fixed thread count).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError, suggest
from autocompress_opt.hf.adapters import FamilyAdapter, adapter_for
from autocompress_opt.prune.importance import Importance, tokens_id
from autocompress_opt.prune.materialize import Masks, PrunePlan, apply_masks, plan_pruning
from autocompress_opt.search.masks import DiscreteLayer, ExpectedStructure, ParentMasks
from autocompress_opt.serving.costmodel import FULL_WINDOW, ArchArrays, estimate_batch, estimate_cost
from autocompress_opt.serving.targets import FITS_DEVICE, Target, device_fit_violation, parent_metrics

__all__ = [
    "Budget",
    "CostGoal",
    "Discrete",
    "InnerConfig",
    "InnerResult",
    "cost_arrays",
    "discretise",
    "exact_violations",
    "expected_of",
    "objective",
    "search",
    "teacher_log_probs",
]


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class InnerConfig:
    """Budget and knobs of one inner search (YAML/dict form: :meth:`from_dict`).

    The defaults are sized for SmolLM2-135M on a 2-core CPU: ~1.3 s per step (2 × 128 tokens,
    forward and backward through the frozen parent), ~30-40 s per search in all (measured by
    ``benchmarks/bench_inner_search.py``); 32 steps or twice the learning rates did not do better.

    Attributes:
        steps: Adam steps (0: no training; the start point is discretised and repaired).
        batch_size / seq_len / n_samples: rows per step, tokens per calibration row (the caller
            builds the rows), calibration rows.
        val_samples: calibration rows held out of training to choose between the trained and the
            start point (0: always the trained one).
        lr: Adam step on the width keep-fractions (fractions of the parent layer's units).
        gate_lr: Adam step on the gates' log α.
        tau_start / tau_end: softness of the width steps, in units, annealed geometrically.
        dual_lr: η of the dual ascent on the multipliers.
        penalty: ρ of the quadratic term on violations.
        margin: hardware constraints are pushed to ``v <= -margin`` during training.
        init_log_alpha: |log α| of the initial gates.
        init: ``"budget"`` starts from the trial's uniform allocation, ``"parent"`` from the parent.
        ffn_unit: FFN granularity in channels (None: 64 or the largest power of two the parent allows).
        straight_through: penalise the cost of the rounded masks (gradients of the relaxation).
        fill: after repair, add back units while every constraint still holds.
        seed: batch sampling and gate noise.
    """

    steps: int = 24
    batch_size: int = 2
    seq_len: int = 128
    n_samples: int = 20
    val_samples: int = 4
    lr: float = 0.05
    gate_lr: float = 0.25
    tau_start: float = 0.5
    tau_end: float = 0.05
    dual_lr: float = 2.0
    penalty: float = 10.0
    margin: float = 0.01
    init_log_alpha: float = 3.0
    init: str = "budget"
    ffn_unit: int | None = None
    straight_through: bool = True
    fill: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name, minimum in (("steps", 0), ("batch_size", 1), ("seq_len", 2), ("n_samples", 1), ("val_samples", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigError(f"InnerConfig.{name} must be an int >= {minimum}, got {value!r}")
        for name in ("lr", "gate_lr", "tau_start", "tau_end", "init_log_alpha"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"InnerConfig.{name} must be a number > 0, got {value!r}")
        for name in ("dual_lr", "penalty", "margin"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"InnerConfig.{name} must be a number >= 0, got {value!r}")
        for name in ("straight_through", "fill"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"InnerConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.val_samples >= self.n_samples:
            raise ConfigError(
                f"InnerConfig.val_samples={self.val_samples} must be smaller than n_samples={self.n_samples}"
            )
        if self.tau_end > self.tau_start:
            raise ConfigError(f"InnerConfig.tau_end={self.tau_end} must not exceed tau_start={self.tau_start}")
        if self.init not in ("budget", "parent"):
            raise ConfigError(f"InnerConfig.init must be 'budget' or 'parent', got {self.init!r}")
        if self.ffn_unit is not None and (not isinstance(self.ffn_unit, int) or self.ffn_unit < 1):
            raise ConfigError(f"InnerConfig.ffn_unit must be a positive int or None, got {self.ffn_unit!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> InnerConfig:
        """Build from a mapping; unknown keys are rejected with a suggestion."""
        data = dict(data or {})
        valid = [f.name for f in fields(cls)]
        for key in data:
            if key not in valid:
                raise ConfigError(
                    f"unknown inner-search key {key!r}{suggest(str(key), valid)}; valid: {', '.join(valid)}"
                )
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def tau(self, step: int) -> float:
        """Geometric schedule from ``tau_start`` (step 0) to ``tau_end`` (last step)."""
        if self.steps <= 1:
            return self.tau_end
        return self.tau_start * (self.tau_end / self.tau_start) ** (step / (self.steps - 1))


# ----------------------------------------------------------------------------- budget
@dataclass(frozen=True)
class Budget:
    """The outer trial's global choices, as budgets on the per-layer allocation.

    ``num_layers`` bounds the kept *layer equivalents*: kept sub-blocks (attention, FFN) count
    half a layer each, so ``num_layers`` full layers meet it exactly, and so do, e.g., two fewer
    attention blocks and two more FFN blocks (an attention-only or FFN-only layer is half a layer
    of depth). ``ffn_width``, ``num_kv_heads`` and ``num_kv_heads · q_per_kv`` bound the *mean*
    FFN width, KV heads and query heads over ``num_layers`` layers — i.e. totals ``num_layers · x``.
    The uniform allocation meets every budget exactly, and the search may move depth between
    sub-blocks and width between layers. ``hidden_size`` is fixed, not a bound.
    """

    num_layers: int
    hidden_size: int
    ffn_width: int
    num_kv_heads: int
    q_per_kv: int

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Budget.{f.name} must be a positive int, got {value!r}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Budget:
        """From a search-space point (``num_layers``, ``hidden_size``, ``ffn_width``, ``num_kv_heads``,
        ``q_per_kv``)."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in params]
        if missing:
            raise ConfigError(f"search-space point lacks {', '.join(missing)}")
        return cls(**{n: int(params[n]) for n in names})

    @classmethod
    def of(cls, parent: Architecture) -> Budget:
        """Budgets that never bind: the parent's active layers and its widest layer's sizes."""
        attn = [s for s in parent.layers if s.attention]
        return cls(
            num_layers=parent.num_active_layers,
            hidden_size=parent.hidden_size,
            ffn_width=max((s.ffn_width for s in parent.layers), default=1) or 1,
            num_kv_heads=max((s.num_kv_heads for s in attn), default=1),
            q_per_kv=max((s.num_heads // s.num_kv_heads for s in attn), default=1),
        )

    def limits(self) -> dict[str, float]:
        """Totals over the whole stack: kept layers, FFN channels, query heads, KV heads."""
        n = self.num_layers
        return {
            "budget:num_layers": n,
            "budget:ffn_width": n * self.ffn_width,
            "budget:num_heads": n * self.num_kv_heads * self.q_per_kv,
            "budget:num_kv_heads": n * self.num_kv_heads,
        }

    def violations(self, totals: Mapping[str, Any]) -> dict[str, Any]:
        """Normalised ``(total - limit) / limit`` per budget (floats or tensors), ``<= 0`` within."""
        return {k: (totals[k] - lim) / lim for k, lim in self.limits().items()}


def _totals_of(arch: Architecture) -> dict[str, float]:
    return {
        "budget:num_layers": sum(s.attention + s.ffn for s in arch.layers) / 2,
        "budget:ffn_width": sum(s.ffn_width for s in arch.layers if s.ffn),
        "budget:num_heads": sum(s.num_heads for s in arch.layers if s.attention),
        "budget:num_kv_heads": sum(s.num_kv_heads for s in arch.layers if s.attention),
    }


def _totals_expected(e: ExpectedStructure) -> dict[str, torch.Tensor]:
    return {
        "budget:num_layers": (e.attn.sum() + e.ffn.sum()) / 2,
        "budget:ffn_width": (e.ffn * e.ffn_width).sum(),
        "budget:num_heads": (e.attn * e.heads).sum(),
        "budget:num_kv_heads": (e.attn * e.kv_heads).sum(),
    }


# ------------------------------------------------------------------------------ cost
@dataclass(frozen=True)
class CostGoal:
    """A target's hardware constraints: the workload's (relative to ``parent_metrics``) plus device fit."""

    target: Target
    parent_metrics: Mapping[str, float]

    @classmethod
    def for_target(cls, target: Target, parent: Architecture) -> CostGoal:
        return cls(target, parent_metrics(parent, target))

    def metrics(self, arrays: ArchArrays) -> dict[str, Any]:
        """Every cost metric of ``arrays`` (numpy or torch) in the target's scenario."""
        t = self.target
        return estimate_batch(arrays, t.hardware, t.engine_obj(), t.scenario())

    def violations(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Normalised violations (``<= 0`` feasible) of one architecture's metrics (floats or 1-element tensors)."""
        out = dict(self.target.resolved_workload().violations(metrics, self.parent_metrics))
        out[FITS_DEVICE] = device_fit_violation(metrics, self.target)
        return out


def cost_arrays(parent: Architecture, hidden_size: int, e: ExpectedStructure) -> ArchArrays:
    """A batch of one torch :class:`ArchArrays` (float64) from expected per-layer structure.

    At a discrete point (gates 0/1, integer widths) it packs exactly what
    ``ArchArrays.from_architectures`` packs for that architecture, so the two agree. Windows are
    the parent layers' (a constant: the search never changes a layer's attention kind).
    """
    one = lambda v: torch.tensor([float(v)], dtype=torch.float64)
    row = lambda x: x.to(torch.float64)[None, :]
    attn, ffn = row(e.attn), row(e.ffn)
    return ArchArrays(
        vocab=one(parent.vocab_size),
        hidden=one(hidden_size),
        tied=one(parent.tie_embeddings),
        attn=attn,
        heads=row(e.heads) * (attn > 0),
        kv_heads=row(e.kv_heads) * (attn > 0),
        head_dim=torch.tensor([[float(s.head_dim) for s in parent.layers]], dtype=torch.float64) * (attn > 0),
        ffn=ffn,
        ffn_width=row(e.ffn_width) * (ffn > 0),
        qkv_bias=one(parent.qkv_bias),
        o_bias=one(parent.o_bias),
        mlp_bias=one(parent.mlp_bias),
        qk_norm=one(parent.qk_norm),
        window=torch.tensor([[float(s.window or FULL_WINDOW) for s in parent.layers]], dtype=torch.float64),
    )


def expected_of(arch: Architecture) -> ExpectedStructure:
    """The (degenerate) expected structure of a discrete architecture: gates 0/1, exact widths."""
    t = lambda v: torch.tensor(v, dtype=torch.float64)
    return ExpectedStructure(
        attn=t([float(s.attention) for s in arch.layers]),
        ffn=t([float(s.ffn) for s in arch.layers]),
        heads=t([float(s.num_heads) for s in arch.layers]),
        kv_heads=t([float(s.num_kv_heads) for s in arch.layers]),
        ffn_width=t([float(s.ffn_width) for s in arch.layers]),
    )


def exact_violations(
    arch: Architecture, budget: Budget, goal: CostGoal | None
) -> tuple[dict[str, float], dict[str, float]]:
    """``(violations, metrics)`` of ``arch`` by the exact scalar cost model (:func:`estimate_cost`) and the budgets."""
    out = {k: float(v) for k, v in budget.violations(_totals_of(arch)).items()}
    metrics: dict[str, float] = {}
    if goal is not None:
        t = goal.target
        metrics = estimate_cost(arch, t.hardware, t.engine_obj(), t.scenario()).to_dict()
        out.update({k: float(v) for k, v in goal.violations(metrics).items()})
    return out, metrics


# ---------------------------------------------------------------------- teacher cache
_TEACHER_MEMORY: OrderedDict[str, torch.Tensor] = OrderedDict()
_TEACHER_MEMORY_SIZE = 2  # entries (SmolLM2, 16 x 128 tokens, fp16: 0.2 GB each)


def teacher_log_probs(
    model: Any,
    tokens: torch.Tensor,
    *,
    parent_id: str,
    data_id: str | None = None,
    cache_dir: str | Path | None = None,
    batch_size: int = 4,
    dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """The parent's next-token log-probabilities ``(n, T, V)`` on ``tokens``, computed once.

    Cached in process and, with ``cache_dir``, as safetensors under it, keyed by ``parent_id``,
    ``data_id`` (e.g. a hash of the data record) and the tokens' content hash. Stored in
    ``dtype`` (float16 halves memory; its rounding moves a KL by ~1e-3 nats).
    """
    from autocompress_opt.quality.metrics import cache_teacher_logits

    key = hashlib.sha256(json.dumps([parent_id, data_id, tokens_id(tokens), str(dtype)]).encode()).hexdigest()[:24]
    if key in _TEACHER_MEMORY:
        _TEACHER_MEMORY.move_to_end(key)
        return _TEACHER_MEMORY[key]
    path = Path(cache_dir) / f"{key}.safetensors" if cache_dir is not None else None
    if path is not None and path.is_file():
        from safetensors.torch import load_file

        log_probs = load_file(str(path))["log_probs"]
    else:
        logits = cache_teacher_logits(model, tokens, batch_size=batch_size, progress=False)
        log_probs = torch.log_softmax(logits, dim=-1).to(dtype)
        del logits
        if path is not None:
            from safetensors.torch import save_file

            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            save_file(
                {"log_probs": log_probs.contiguous()},
                str(tmp),
                metadata={"parent_id": parent_id, "data_id": str(data_id)},
            )
            tmp.replace(path)
    if tuple(log_probs.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"cached teacher log-probs {tuple(log_probs.shape)} do not fit tokens {tuple(tokens.shape)}")
    _TEACHER_MEMORY[key] = log_probs
    while len(_TEACHER_MEMORY) > _TEACHER_MEMORY_SIZE:
        _TEACHER_MEMORY.popitem(last=False)
    return log_probs


# ------------------------------------------------------------------------------ search
@dataclass
class InnerResult:
    """What one inner search produced.

    Attributes:
        architecture: heterogeneous, the parent's number of layers (dropped ones are no-ops).
        plan / masks: how to materialise it from the parent (:func:`~autocompress_opt.prune.materialize.materialize`).
        feasible: every constraint and budget holds by the exact cost model.
        violations: normalised violations of the final architecture (``<= 0`` satisfied).
        metrics: its exact cost metrics (empty without a cost goal).
        expected: the masks' expected per-layer structure at the end of training.
        history: per step: ``kl``, ``penalty``, ``tau`` and the largest violation.
        moves: how many units the repair removed and the fill added back.
        seconds: wall-clock seconds of the start point, training, discretising and selecting.
        selection: the candidates (trained, start), their validation KL, and which was chosen.
        learned: the trained :class:`~autocompress_opt.search.masks.ParentMasks` (frozen values).
    """

    architecture: Architecture
    plan: PrunePlan
    masks: Masks
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    expected: dict[str, list[float]]
    history: list[dict[str, float]] = field(default_factory=list)
    moves: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    selection: dict[str, Any] = field(default_factory=dict)
    learned: ParentMasks | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """JSON-safe record (no tensors)."""
        return {
            "feasible": self.feasible,
            "violations": self.violations,
            "moves": self.moves,
            "seconds": self.seconds,
            "expected": self.expected,
            "selection": self.selection,
            "final_kl_train": self.history[-1]["kl"] if self.history else None,
            "steps": len(self.history),
        }


def search(
    model: Any,
    parent: Architecture,
    importance: Importance,
    tokens: torch.Tensor,
    teacher: torch.Tensor,
    *,
    budget: Budget,
    goal: CostGoal | None,
    config: InnerConfig = InnerConfig(),
    init: Architecture | None = None,
    adapter: FamilyAdapter | None = None,
) -> InnerResult:
    """Search per-layer structure under ``budget`` and ``goal``; see the module doc.

    1. *Start*: ``init`` (``config.init == "budget"``, e.g. the trial's uniform allocation) or the
       parent, discretised, repaired and filled by the exact cost model — a feasible, importance-
       guided heterogeneous point (when one exists); the masks are reset to it.
    2. *Train* the masks (``config.steps`` Adam steps on KL + Lagrangian) and discretise, repair
       and fill the result.
    3. *Select* between the trained and the start point: feasible first, then the lower KL to the
       parent on ``config.val_samples`` calibration rows held out of training (never evaluation data).

    Args:
        model: the parent (frozen while the masks train; hooks and flags are restored afterwards).
        parent / importance: its architecture and importance scores.
        tokens: calibration rows ``(n, T)``; ``teacher``: the parent's log-probs on them ``(n, T, V)``.
        budget: the trial's global choices; ``goal``: hardware constraints (None: budgets only).
        config: steps, batch, learning rates, schedule, seed.
        init: the start point for ``config.init == "budget"``; None starts from the parent.
    """
    adapter = adapter or adapter_for(model)
    if tuple(teacher.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"teacher log-probs {tuple(teacher.shape)} do not fit tokens {tuple(tokens.shape)}")
    if config.val_samples >= tokens.shape[0]:
        raise ConfigError(f"val_samples={config.val_samples} leaves no training rows of the {tokens.shape[0]} given")
    began = time.perf_counter()
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    masks = ParentMasks(
        parent,
        importance,
        hidden_size=budget.hidden_size,
        init=init if config.init == "budget" else None,
        init_log_alpha=config.init_log_alpha,
        ffn_unit=config.ffn_unit,
    )
    start = discretise(masks, importance, budget, goal, fill=config.fill)
    if start.feasible:
        masks.reset(start.architecture, config.init_log_alpha)
    started = time.perf_counter()
    val, train = slice(0, config.val_samples), slice(config.val_samples, None)
    history = (
        _train(model, masks, tokens[train], teacher[train], budget, goal, config, gen, adapter) if config.steps else []
    )
    trained_at = time.perf_counter()
    with torch.no_grad():
        expected = masks.expected(config.tau_end).to_dict()
    trained = discretise(masks, importance, budget, goal, fill=config.fill)
    discretised = time.perf_counter()
    chosen, selection = _select(
        {"trained": trained, "start": start},
        model,
        parent,
        importance,
        tokens[val],
        teacher[val],
        config.batch_size,
        adapter,
    )
    plan = plan_pruning(parent, importance, chosen.architecture)
    seconds = {
        "start": started - began,
        "train": trained_at - started,
        "discretise": discretised - trained_at,
        "select": time.perf_counter() - discretised,
        "total": time.perf_counter() - began,
    }
    masks.requires_grad_(False)
    return InnerResult(
        chosen.architecture,
        plan,
        plan.masks(),
        chosen.feasible,
        chosen.violations,
        chosen.metrics,
        expected,
        history,
        chosen.moves,
        seconds,
        selection,
        masks,
    )


def _select(
    candidates: dict[str, Discrete],
    model: Any,
    parent: Architecture,
    importance: Importance,
    tokens: torch.Tensor,
    teacher: torch.Tensor,
    batch_size: int,
    adapter: FamilyAdapter,
) -> tuple[Discrete, dict[str, Any]]:
    """Feasible before infeasible (then less violation), then the lower held-out calibration KL."""
    record: dict[str, Any] = {}
    kls: dict[str, float] = {}
    for name, cand in candidates.items():
        same = next((n for n, c in candidates.items() if n in kls and c.architecture == cand.architecture), None)
        if same is not None:
            kls[name] = kls[same]
        elif tokens.shape[0] and cand.feasible:
            kls[name] = _masked_kl(model, parent, importance, cand.architecture, tokens, teacher, batch_size, adapter)
        else:
            kls[name] = math.nan
        record[name] = {"feasible": cand.feasible, "val_kl": kls[name], "summary": cand.architecture.summary()}

    def key(name: str) -> tuple[float, float, int]:
        cand = candidates[name]
        excess = sum(max(v, 0.0) for v in cand.violations.values())
        return (
            0.0 if cand.feasible else 1.0,
            excess if not cand.feasible else (kls[name] if math.isfinite(kls[name]) else 0.0),
            list(candidates).index(name),
        )

    best = min(candidates, key=key)
    record["chosen"] = best
    return candidates[best], record


def _masked_kl(
    model: Any,
    parent: Architecture,
    importance: Importance,
    arch: Architecture,
    tokens: torch.Tensor,
    teacher: torch.Tensor,
    batch_size: int,
    adapter: FamilyAdapter,
) -> float:
    """Mean per-position KL(parent ‖ ``arch``) on ``tokens``, computing ``arch`` with bool masks over the parent."""
    plan = plan_pruning(parent, importance, arch)
    device = next(model.parameters()).device
    total = 0.0
    with apply_masks(model, plan.masks(), adapter=adapter), torch.inference_mode():
        for start in range(0, tokens.shape[0], batch_size):
            logits = model(input_ids=tokens[start : start + batch_size].to(device), use_cache=False).logits
            total += float(_kl(logits, teacher[start : start + batch_size].to(logits.device))) * logits.shape[0]
    return total / tokens.shape[0]


def _train(
    model: Any,
    masks: ParentMasks,
    tokens: torch.Tensor,
    teacher: torch.Tensor,
    budget: Budget,
    goal: CostGoal | None,
    config: InnerConfig,
    gen: torch.Generator,
    adapter: FamilyAdapter,
) -> list[dict[str, float]]:
    """Adam on the mask parameters with dual ascent on the multipliers; returns the per-step history."""
    if tuple(teacher.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"teacher log-probs {tuple(teacher.shape)} do not fit tokens {tuple(tokens.shape)}")
    was_training = model.training
    model.eval()
    optimizer = torch.optim.Adam(
        [
            {"params": [masks.kv_keep, masks.q_keep, masks.ffn_keep], "lr": config.lr},
            {"params": [masks.attn_log_alpha, masks.ffn_log_alpha], "lr": config.gate_lr},
        ]
    )
    duals: dict[str, float] = {}
    history = []
    try:
        with masks.install(model, adapter=adapter):
            for step in range(config.steps):
                tau = config.tau(step)
                rows = torch.randint(0, tokens.shape[0], (config.batch_size,), generator=gen)
                loss, kl, violations = objective(
                    model,
                    masks,
                    tokens[rows],
                    teacher[rows],
                    budget=budget,
                    goal=goal,
                    tau=tau,
                    duals=duals,
                    config=config,
                    generator=gen,
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                masks.clamp_()
                for k, v in violations.items():
                    duals[k] = max(0.0, duals.get(k, 0.0) + config.dual_lr * v)
                history.append(
                    {
                        "step": step,
                        "tau": tau,
                        "kl": kl,
                        "penalty": float(loss.detach()) - kl,
                        "max_violation": max(violations.values(), default=0.0),
                    }
                )
    finally:
        model.train(was_training)
    return history


def objective(
    model: Any,
    masks: ParentMasks,
    tokens: torch.Tensor,
    teacher: torch.Tensor,
    *,
    budget: Budget,
    goal: CostGoal | None,
    tau: float,
    duals: Mapping[str, float],
    config: InnerConfig,
    generator: torch.Generator | None = None,
    sample: bool = True,
) -> tuple[torch.Tensor, float, dict[str, float]]:
    """One batch of the Lagrangian: ``(loss, kl, violations)``; ``loss`` is differentiable w.r.t. the masks.

    ``model`` must have ``masks.install``-ed hooks; ``tokens`` ``(B, T)`` and ``teacher`` ``(B, T, V)``
    log-probs. ``violations`` (floats) are those the multipliers are updated with (margin included).
    """
    device = next(model.parameters()).device
    live = masks.live(tau, sample=sample, generator=generator)
    with masks.use(live):
        logits = model(input_ids=tokens.to(device), use_cache=False).logits  # (B, T, V)
    kl = _kl(logits, teacher.to(logits.device))
    violations = _violations(masks, tau, budget, goal, config.margin, config.straight_through)
    penalty = sum(
        (duals.get(k, 0.0) * v + config.penalty / 2 * torch.relu(v) ** 2 for k, v in violations.items()),
        torch.zeros((), dtype=torch.float64),
    )
    loss = kl + penalty.to(kl.dtype)
    return loss, float(kl.detach()), {k: float(v.detach()) for k, v in violations.items()}


def _kl(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean per-position ``KL(teacher ‖ student)`` in nats; ``teacher`` holds log-probabilities."""
    student = torch.log_softmax(logits.float(), dim=-1)
    t = teacher.float()
    return (t.exp() * (t - student)).sum(-1).mean()


def _violations(
    masks: ParentMasks, tau: float, budget: Budget, goal: CostGoal | None, margin: float, straight_through: bool = True
) -> dict[str, torch.Tensor]:
    """Differentiable violations: budgets on the expected structure, hardware constraints (+margin)
    by the torch cost model. With ``straight_through`` the *values* are those of the rounded masks
    (what discretisation will keep) and the *gradients* those of the relaxation, so the penalty
    and the multipliers see no relaxation gap (a gate at σ(−3) still costs 5 % of a layer otherwise)."""
    e = masks.expected(tau)
    if straight_through:
        hard = masks.expected(tau, hard=True)
        e = ExpectedStructure(
            **{
                k: getattr(e, k) + (getattr(hard, k) - getattr(e, k)).detach()
                for k in ("attn", "ffn", "heads", "kv_heads", "ffn_width")
            }
        )
    out = {
        k: torch.as_tensor(v, dtype=torch.float64).reshape(())
        for k, v in budget.violations(_totals_expected(e)).items()
    }
    if goal is not None:
        metrics = goal.metrics(cost_arrays(masks.parent, budget.hidden_size, e))
        for k, v in goal.violations(metrics).items():
            out[k] = torch.as_tensor(v, dtype=torch.float64).reshape(()) + margin
    return out


# -------------------------------------------------------------------- discretisation
@dataclass(frozen=True)
class _Values:
    """Importance of each unit, comparable across layers: a unit's share of its sub-block's summed
    scores × half the layer's importance (``skip_loss``, floored at a small positive value)."""

    ffn: list[list[float]]  # [layer][unit rank]
    heads: list[list[list[float]]]  # [layer][group rank][head rank inside group]


def _unit_values(masks: ParentMasks, importance: Importance) -> _Values:
    skip = importance.skip_loss.double().clamp(min=0)
    floor = max(float(skip.mean()) * 1e-3, 1e-9)
    weight = (skip + floor).tolist()
    ffn, heads = [], []
    for i, spec in enumerate(masks.parent.layers):
        f_vals: list[float] = []
        if spec.ffn:
            scores = torch.sort(importance.ffn[i].double(), descending=True, stable=True).values
            f_vals = (scores.view(-1, masks.ffn_unit).sum(-1) / scores.sum() * weight[i] / 2).tolist()
        h_vals: list[list[float]] = []
        if spec.attention:
            r = spec.num_heads // spec.num_kv_heads
            by_group = importance.heads[i].double().view(spec.num_kv_heads, r)
            total = by_group.sum()
            for g in torch.argsort(importance.kv_groups[i], descending=True, stable=True).tolist():
                sorted_heads = torch.sort(by_group[g], descending=True, stable=True).values
                h_vals.append((sorted_heads / total * weight[i] / 2).tolist())
        ffn.append(f_vals)
        heads.append(h_vals)
    return _Values(ffn, heads)


def _attn_value(v: _Values, i: int, d: DiscreteLayer) -> float:
    return sum(v.heads[i][g][j] for g in range(d.kv_groups) for j in range(d.q_per_group)) if d.attention else 0.0


def _ffn_value(v: _Values, i: int, d: DiscreteLayer) -> float:
    return sum(v.ffn[i][: d.ffn_units]) if d.ffn else 0.0


def _shrink_moves(layers: list[DiscreteLayer], v: _Values) -> list[tuple[str, list[DiscreteLayer], float]]:
    """Every one-step removal: (description, new layers, importance lost)."""
    active = sum(d.attention or d.ffn for d in layers)
    moves = []

    def add(name: str, i: int, new: DiscreteLayer, lost: float) -> None:
        if not (new.attention or new.ffn) and active <= 1:
            return  # keep at least one layer computing something
        moves.append((f"{name}@{i}", layers[:i] + [new] + layers[i + 1 :], lost))

    for i, d in enumerate(layers):
        if d.ffn:
            if d.ffn_units > 1:
                add("ffn-unit", i, replace(d, ffn_units=d.ffn_units - 1), v.ffn[i][d.ffn_units - 1])
            add("drop-ffn", i, replace(d, ffn=False), _ffn_value(v, i, d))
        if d.attention:
            if d.kv_groups > 1:
                add(
                    "kv-group",
                    i,
                    replace(d, kv_groups=d.kv_groups - 1),
                    sum(v.heads[i][d.kv_groups - 1][: d.q_per_group]),
                )
            if d.q_per_group > 1:
                add(
                    "q-head",
                    i,
                    replace(d, q_per_group=d.q_per_group - 1),
                    sum(v.heads[i][g][d.q_per_group - 1] for g in range(d.kv_groups)),
                )
            add("drop-attn", i, replace(d, attention=False), _attn_value(v, i, d))
        if d.attention and d.ffn:
            add("drop-layer", i, replace(d, attention=False, ffn=False), _attn_value(v, i, d) + _ffn_value(v, i, d))
    return moves


def _grow_moves(
    layers: list[DiscreteLayer], v: _Values, parent: Architecture, sizes: torch.Tensor
) -> list[tuple[str, list[DiscreteLayer], float]]:
    """Every one-step addition the parent allows: (description, new layers, importance gained)."""
    moves = []
    for i, (d, p) in enumerate(zip(layers, parent.layers)):
        g_n, r_n, u_n = (int(x) for x in sizes[i])

        def add(name: str, new: DiscreteLayer, gained: float, i: int = i) -> None:
            moves.append((f"{name}@{i}", layers[:i] + [new] + layers[i + 1 :], gained))

        if p.ffn:
            if not d.ffn:
                add("add-ffn", replace(d, ffn=True, ffn_units=1), v.ffn[i][0])
            elif d.ffn_units < u_n:
                add("ffn-unit", replace(d, ffn_units=d.ffn_units + 1), v.ffn[i][d.ffn_units])
        if p.attention:
            if not d.attention:
                r = max(1, min(d.q_per_group, r_n))
                add("add-attn", replace(d, attention=True, kv_groups=1, q_per_group=r), sum(v.heads[i][0][:r]))
            else:
                if d.kv_groups < g_n:
                    add(
                        "kv-group", replace(d, kv_groups=d.kv_groups + 1), sum(v.heads[i][d.kv_groups][: d.q_per_group])
                    )
                if d.q_per_group < r_n:
                    add(
                        "q-head",
                        replace(d, q_per_group=d.q_per_group + 1),
                        sum(v.heads[i][g][d.q_per_group] for g in range(d.kv_groups)),
                    )
    return moves


class _Evaluator:
    """Violations of many candidate architectures at once (numpy :func:`estimate_batch`: the same
    equations as :func:`estimate_cost`, which judges the final answer)."""

    def __init__(self, masks: ParentMasks, budget: Budget, goal: CostGoal | None) -> None:
        self.masks, self.budget, self.goal = masks, budget, goal
        self.names = list(budget.limits()) + (list(goal.violations(goal.parent_metrics)) if goal else [])

    def __call__(self, candidates: Sequence[list[DiscreteLayer]]) -> np.ndarray:
        archs = [self.masks.architecture(c) for c in candidates]
        rows = [self.budget.violations(_totals_of(a)) for a in archs]
        if self.goal is not None:
            metrics = self.goal.metrics(ArchArrays.from_architectures(archs))
            for n, row in enumerate(rows):
                one = {k: float(np.asarray(m).reshape(-1)[n]) for k, m in metrics.items()}
                row.update(self.goal.violations(one))
        return np.array([[float(r[k]) for k in self.names] for r in rows])  # (N, K)


@dataclass(frozen=True)
class Discrete:
    """A discretised, repaired point: its architecture and verdict by the exact cost model."""

    architecture: Architecture
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    moves: dict[str, int]


def discretise(
    masks: ParentMasks, importance: Importance, budget: Budget, goal: CostGoal | None, *, fill: bool = True
) -> Discrete:
    """Round the masks, cap the kept layers by gate value, repair, fill; judged by :func:`exact_violations`."""
    values = _unit_values(masks, importance)
    layers = _ensure_active(_cap_layers(masks.discrete(), budget.num_layers, values), masks)
    evaluate = _Evaluator(masks, budget, goal)
    layers, repaired = _repair(layers, values, evaluate)
    filled = 0
    if fill and np.all(evaluate([layers])[0] <= 0):
        layers, filled = _fill(layers, values, evaluate, masks)
    arch = masks.architecture(layers)
    violations, metrics = exact_violations(arch, budget, goal)
    feasible = all(v <= 0 for v in violations.values())
    return Discrete(arch, feasible, violations, metrics, {"repair": repaired, "fill": filled})


def _ensure_active(layers: list[DiscreteLayer], masks: ParentMasks) -> list[DiscreteLayer]:
    """A decoder needs one computing layer: if the masks dropped all, revive the one with the
    highest gate score (its FFN, else its attention, at least one unit)."""
    if any(d.attention or d.ffn for d in layers):
        return layers
    i = max(range(len(layers)), key=lambda j: (layers[j].gate_score, -j))
    d, spec = layers[i], masks.parent.layers[i]
    if spec.ffn:
        revived = replace(d, ffn=True, ffn_units=max(d.ffn_units, 1))
    else:
        revived = replace(d, attention=True, kv_groups=max(d.kv_groups, 1), q_per_group=max(d.q_per_group, 1))
    return layers[:i] + [revived] + layers[i + 1 :]


def _cap_layers(layers: list[DiscreteLayer], limit: int, values: _Values) -> list[DiscreteLayer]:
    """Drop kept sub-blocks until at most ``limit`` layer equivalents remain (two sub-blocks per
    layer): from the layer with the lowest gate score, its less important sub-block first."""
    layers = list(layers)
    while sum(d.attention + d.ffn for d in layers) > 2 * limit:
        i = min((j for j, d in enumerate(layers) if d.attention or d.ffn), key=lambda j: (layers[j].gate_score, -j))
        d = layers[i]
        drop_attn = d.attention and (not d.ffn or _attn_value(values, i, d) <= _ffn_value(values, i, d))
        layers[i] = replace(d, attention=False) if drop_attn else replace(d, ffn=False)
    return layers


_BATCH_MOVES = 8  # most one-unit removals applied at once while far from feasible (on distinct layers)


def _repair(layers: list[DiscreteLayer], values: _Values, evaluate: _Evaluator) -> tuple[list[DiscreteLayer], int]:
    """Greedy: remove the unit with the least importance per unit of total violation removed.

    While the total excess is large, the best few removals on distinct layers are applied together
    (``1 + 8·excess`` of them, at most :data:`_BATCH_MOVES`), so a far-off start does not cost one
    cost-model sweep per unit; near the boundary it is one unit at a time.
    """
    current = evaluate([layers])[0]
    moves = 0
    while np.any(current > 0):
        candidates = _shrink_moves(layers, values)
        if not candidates:
            break  # nothing left to remove: infeasible
        viol = evaluate([c[1] for c in candidates])  # (N, K)
        lost = np.array([c[2] for c in candidates]) + 1e-12
        over = current > 0
        gain = np.maximum(current, 0).sum() - np.maximum(viol, 0).sum(1)
        if np.any(gain > 1e-12):
            score = np.where(gain > 1e-12, lost / np.maximum(gain, 1e-12), np.inf)
        else:  # e.g. a stepwise metric: reduce the violated values themselves, else shrink cheaply
            drop = (current[over][None, :] - viol[:, over]).sum(1)
            score = np.where(drop > 1e-12, lost / np.maximum(drop, 1e-12), np.inf)
            if not np.isfinite(score).any():
                score = lost
        best = int(np.argmin(score))
        batch = min(_BATCH_MOVES, 1 + int(8 * np.maximum(current, 0).sum()))
        if batch > 1:
            combined, applied = _combine(layers, candidates, np.argsort(score, kind="stable"), score, batch)
            if applied > 1:
                after = evaluate([combined])[0]
                if np.maximum(after, 0).sum() < np.maximum(viol[best], 0).sum():
                    layers, current, moves = combined, after, moves + applied
                    continue
        layers, current = candidates[best][1], viol[best]
        moves += 1
    return layers, moves


def _combine(
    layers: list[DiscreteLayer],
    candidates: list[tuple[str, list[DiscreteLayer], float]],
    order: np.ndarray,
    score: np.ndarray,
    limit: int,
) -> tuple[list[DiscreteLayer], int]:
    """Apply the best-scoring finite moves, at most one per layer and ``limit`` in all."""
    combined, touched = list(layers), set()
    for j in order:
        if len(touched) >= limit or not np.isfinite(score[j]):
            break
        i = int(candidates[j][0].rsplit("@", 1)[1])
        if i not in touched:
            touched.add(i)
            combined[i] = candidates[j][1][i]
    if not any(d.attention or d.ffn for d in combined):
        return layers, 0  # never remove the last computing layer
    return combined, len(touched)


def _fill(
    layers: list[DiscreteLayer], values: _Values, evaluate: _Evaluator, masks: ParentMasks
) -> tuple[list[DiscreteLayer], int]:
    """Greedy: add the unit with the most importance per unit of slack used while all constraints hold."""
    current = evaluate([layers])[0]
    moves, cap = 0, 8 * len(layers)
    while moves < cap:
        candidates = _grow_moves(layers, values, masks.parent, masks.sizes)
        if not candidates:
            break
        viol = evaluate([c[1] for c in candidates])
        ok = np.all(viol <= 0, axis=1)
        if not ok.any():
            break
        gained = np.array([c[2] for c in candidates])
        used = np.maximum(viol - current[None, :], 0).sum(1)
        score = np.where(ok, gained / np.maximum(used, 1e-12), -np.inf)
        best = int(np.argmax(score))
        layers, current = candidates[best][1], viol[best]
        moves += 1
    return layers, moves
