"""The inner search of a mixture-of-experts parent (issue 30): *which* routed experts and expert
channels each MoE layer keeps, under the outer trial's uniform choice of *how many*.

Engines load a MoE family only as its plain config (one expert count, top-``k`` and expert width for
every MoE layer: :func:`~autocompress_opt.prune.experts.slice_experts`), so the trial's point fixes
the counts (``num_experts``, ``experts_per_token``, ``expert_width``) and this search decides, per
layer, which experts and, per kept expert, which channels fill them. The dense axes (layers, hidden
size, heads, dense FFN) are not pruned in a MoE parent yet: a point must hold them at the parent's
sizes (:func:`expert_point`), else a :class:`ConfigError` names the choice.

Relaxation (:class:`ExpertMasks`): per MoE layer ``l`` a learnable score per expert ``s_le`` and per
expert channel ``c_lef``, in *rank units* (initialised to ``n - rank`` of the importance order, so
the start is the importance choice of :func:`~autocompress_opt.prune.experts.expert_masks`). A
soft top-``n`` keeps unit ``u`` with ``m_u = σ((s_u − t) / τ)``, ``t`` the midpoint between the
``n``-th and ``(n+1)``-th scores (detached), ``τ`` the dense search's schedule (units of one rank);
as ``τ → 0`` it is the hard top-``n`` that :func:`discretise_experts` keeps. In the forward pass
the expert masks enter the router as ``logits + log m`` before its softmax and top-``k`` (a dropped
expert, ``m = 0``, gets ``−inf``, exactly :func:`~autocompress_opt.prune.masking.apply_masks`), and
the channel masks scale the columns of the stacked down projection ``(E, D, F)``.

Cost: :func:`expert_param_totals` counts the MoE blocks' parameters, total and active per token,
by the arch's formulas (:meth:`~autocompress_opt.arch.moe.MoESpec.params` / ``active_params``,
which are affine in the expert count and width), on the masks' expected counts; the Lagrangian
prices them against the point's uniform child with straight-through values, as the dense search
does. Since every soft top-``n`` rounds to exactly ``n`` units, those budgets hold at every step:
the counts, and so the serving cost, are the outer loop's, and the exact cost model judges the
discretised child's feasibility (:meth:`~autocompress_opt.serving.targets.Target.check`).

Selection: the trained choice and the importance start, the lower KL to the parent on the held-out
rows (ties to ``trained``), as :func:`~autocompress_opt.search.inner.inner_search.search` does.
Deterministic given ``InnerConfig.seed``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import sparse_limits
from autocompress_opt.arch.moe import MoESpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, moe_adapter
from autocompress_opt.prune.experts import expert_masks
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.prune.masking import Masks, apply_masks
from autocompress_opt.quality.metrics import Teacher, log_probs, teacher_kl
from autocompress_opt.search.inner.budget import CostGoal
from autocompress_opt.serving.targets import all_satisfied

__all__ = [
    "ExpertMasks",
    "ExpertResult",
    "discretise_experts",
    "expert_param_totals",
    "expert_point",
    "search_experts",
]

# The choices the expert search fills (which experts, which of their channels); the other sparse
# choices prune.experts can cut (shared_width, mamba_heads) are not searched yet: they stay the parent's.
SEARCHED_CHOICES: tuple[str, ...] = ("num_experts", "experts_per_token", "expert_width")
_EPS = 1e-12  # keeps log m finite for a fully dropped soft mask (log 1e-12 ≈ −28: no token routed)


# ------------------------------------------------------------------------------ the point
def expert_point(params: Mapping[str, int], parent: Architecture) -> dict[str, int]:
    """The expert counts of a MoE trial's point (:data:`SEARCHED_CHOICES`,
    an absent one at the parent's size). Raises :class:`ConfigError` naming the choice when the point
    prunes a dense axis (``num_layers``, ``hidden_size``, heads, dense FFN: not pruned in a MoE parent
    yet), a choice the parent has no sub-block for, or an expert count outside ``1..parent``."""
    limits = sparse_limits(parent)
    if "num_experts" not in limits:
        raise ConfigError("the parent has no mixture-of-experts layer: the expert search has nothing to choose")
    for key, value in params.items():
        if key not in limits:
            raise ConfigError(
                f"point choice {key}={value!r}: the parent has no sub-block for it; valid: {', '.join(limits)}"
            )
        if key not in SEARCHED_CHOICES and int(value) != limits[key]:
            raise ConfigError(
                f"point choice {key}={value} prunes an axis of a MoE parent that the weights mode does not "
                f"search yet (dense axes, shared_width, mamba_heads); valid: {key}={limits[key]} (the parent's), "
                f"with {', '.join(SEARCHED_CHOICES)} free"
            )
    point = {key: int(params.get(key, limits[key])) for key in SEARCHED_CHOICES}
    for key, value in point.items():
        if not 1 <= value <= limits[key]:
            raise ConfigError(f"point choice {key}={value} is outside 1..{limits[key]} (the parent's)")
    if point["experts_per_token"] > point["num_experts"]:
        raise ConfigError(
            f"point choice experts_per_token={point['experts_per_token']} exceeds num_experts="
            f"{point['num_experts']}; valid: 1..{point['num_experts']}"
        )
    return point


# ------------------------------------------------------------------------------ cost
def _affine(f: Any) -> tuple[int, int]:
    """``(a, b)`` with ``f(n) = a·n + b`` for an integer-affine ``f`` (read at 1 and 2)."""
    return f(2) - f(1), 2 * f(1) - f(2)


def _sized(spec: MoESpec, experts: int, k: int, width: int) -> MoESpec:
    return replace(spec, num_experts=experts, experts_per_token=min(k, experts), expert_width=width)


def expert_param_totals(
    parent: Architecture, experts: torch.Tensor, width: torch.Tensor, k: int
) -> dict[str, torch.Tensor]:
    """Parameters of the MoE blocks of ``parent`` sized ``experts`` ``(M,)`` routed experts of ``width``
    ``(M,)`` channels in its ``M`` MoE layers (in order), top-``k``: ``total``
    (:meth:`~autocompress_opt.arch.moe.MoESpec.params`) and ``active`` per token
    (:meth:`~autocompress_opt.arch.moe.MoESpec.active_params`), norms excluded. Differentiable in
    ``experts`` and ``width`` (both formulas are affine in each, read off the arch's own methods);
    at integer sizes equal to those methods."""
    d, bias = parent.hidden_size, parent.mlp_bias
    total = active = torch.zeros((), dtype=experts.dtype, device=experts.device)
    for i, spec in enumerate(layer.moe for layer in parent.layers if layer.moe is not None):
        a_w, b_w = _affine(lambda f, s=spec: _sized(s, 1, 1, f).expert_params(d))  # one routed expert
        a_e, b_e = _affine(  # what does not scale with the width: router rows, shared expert, latent
            lambda e, s=spec: _sized(s, e, 1, 1).params(d, bias) - e * _sized(s, e, 1, 1).expert_params(d)
        )
        expert, always = a_w * width[i] + b_w, a_e * experts[i] + b_e
        total = total + experts[i] * expert + always
        active = active + min(k, spec.num_experts) * expert + always
    return {"total": total, "active": active}


def _param_budget(parent: Architecture, point: Mapping[str, int]) -> dict[str, float]:
    """The budgets of the point's uniform child: its MoE blocks' total and active parameters."""
    n = sum(layer.moe is not None for layer in parent.layers)
    full = lambda key: torch.full((n,), float(point[key]), dtype=torch.float64)
    totals = expert_param_totals(parent, full("num_experts"), full("expert_width"), point["experts_per_token"])
    return {"budget:expert_params": float(totals["total"]), "budget:active_expert_params": float(totals["active"])}


# ------------------------------------------------------------------------------ relaxation
def _soft_top(scores: torch.Tensor, n: int, tau: float) -> torch.Tensor:
    """Soft top-``n`` over the last axis of ``scores`` (rank units): ``σ((s − t)/τ)`` with ``t`` the
    midpoint of the ``n``-th and ``(n+1)``-th highest scores (detached); all ones when ``n`` is every
    unit; ``τ <= 0``: the hard top-``n`` (ties to the lower index, :func:`ranked`)."""
    size = scores.shape[-1]
    if n >= size:
        return torch.ones_like(scores)
    if tau <= 0:
        return _hard_top(scores, n).to(scores.dtype)
    top = torch.topk(scores.detach(), n + 1, dim=-1).values  # (..., n+1) descending
    threshold = (top[..., n - 1] + top[..., n]) / 2
    return torch.sigmoid((scores - threshold[..., None]) / tau)


def _hard_top(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Bool mask of the ``n`` highest scores along the last axis, ties to the lower index."""
    flat = scores.detach().reshape(-1, scores.shape[-1]).cpu()
    out = torch.zeros(flat.shape, dtype=torch.bool)
    for row, s in enumerate(flat):
        out[row, ranked(s)[:n]] = True
    return out.reshape(scores.shape).to(scores.device)


def _start_scores(start: torch.Tensor, tiebreak: torch.Tensor) -> torch.Tensor:
    """Scores in rank units (``n − rank``) whose top-``start.sum()`` is ``start``: its units first,
    each group ordered by ``tiebreak`` (higher first, ties to the lower index)."""
    tie = tiebreak.double()
    key = start.double() * 2 + 0.5 * tie / (tie.abs().max() + 1)  # kept units above all others
    n = key.numel()
    ranks = torch.empty(n, dtype=torch.long)
    ranks[ranked(key)] = torch.arange(n)
    return (n - ranks).float()


@dataclass(frozen=True)
class LiveExperts:
    """The float masks of one forward pass: ``experts`` ``(M, E)``, ``channels`` ``(M, E, F)``."""

    experts: torch.Tensor
    channels: torch.Tensor


class ExpertMasks(torch.nn.Module):
    """Learnable expert and channel scores of a MoE parent's ``M`` MoE layers (module doc).

    ``expert_score`` ``(M, E)`` and ``channel_score`` ``(M, E, F)``, float32 in rank units, start at
    ``start``'s choice (a :class:`Masks` with ``experts`` / ``expert_ffn`` in every MoE layer: the
    importance choice of :func:`~autocompress_opt.prune.experts.expert_masks`), the rest ordered by
    ``importance`` (expert frequency, channel score). ``point``: the counts kept (:func:`expert_point`).
    """

    def __init__(
        self,
        parts: list[LayerParts],
        importance: Importance,
        point: Mapping[str, int],
        start: Masks,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.moe_layers = [i for i, p in enumerate(parts) if p.moe is not None]
        self.parts = [parts[i] for i in self.moe_layers]
        shapes = {(p.num_experts, p.expert_width) for p in self.parts}
        if len(shapes) != 1:
            raise ConfigError(f"the MoE layers differ in (experts, width) {sorted(shapes)}; a plain config has one")
        self.point = dict(point)
        experts, channels = [], []
        for i in self.moe_layers:
            mask, freq, chan = start.layers[i], importance.expert_frequency[i], importance.expert_ffn[i]
            if mask.experts is None or mask.expert_ffn is None or freq is None or chan is None:
                raise ConfigError(f"MoE layer {i} has no expert masks or expert scores to start from")
            experts.append(_start_scores(mask.experts.cpu(), freq.cpu()))
            channels.append(torch.stack([_start_scores(m, c) for m, c in zip(mask.expert_ffn.cpu(), chan.cpu())]))
        self.expert_score = torch.nn.Parameter(torch.stack(experts))  # (M, E)
        self.channel_score = torch.nn.Parameter(torch.stack(channels))  # (M, E, F)
        self._live: LiveExperts | None = None
        if device is not None:
            self.to(device)

    def live(self, tau: float) -> LiveExperts:
        """Soft masks at softness ``tau`` (rank units; ``<= 0``: the hard choice)."""
        return LiveExperts(
            _soft_top(self.expert_score, self.point["num_experts"], tau),
            _soft_top(self.channel_score, self.point["expert_width"], tau),
        )

    def expected(self, tau: float, hard: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(experts (M,), width (M,))`` expected per MoE layer: kept experts, and channels per kept
        expert (mean over experts weighted by their keep masks). Straight-through unless ``hard``:
        the values of the hard choice with the gradients of the soft masks."""
        soft = self.live(tau)
        experts = soft.experts.sum(-1)
        width = (soft.experts * soft.channels.sum(-1)).sum(-1) / experts.clamp_min(_EPS)
        if hard:
            return experts.detach().round(), width.detach().round()
        exact = (float(self.point["num_experts"]), float(self.point["expert_width"]))
        return experts + (exact[0] - experts).detach(), width + (exact[1] - width).detach()

    def discrete(self, base: Masks) -> Masks:
        """``base`` with every MoE layer's experts, channels and top-``k`` the hard choice of the scores."""
        experts = _hard_top(self.expert_score, self.point["num_experts"]).cpu()
        channels = _hard_top(self.channel_score, self.point["expert_width"]).cpu()
        layers = list(base.layers)
        for j, i in enumerate(self.moe_layers):
            layers[i] = replace(
                layers[i], experts=experts[j], expert_ffn=channels[j], experts_per_token=self.point["experts_per_token"]
            )
        return replace(base, layers=tuple(layers))

    @contextmanager
    def use(self, live: LiveExperts) -> Iterator[None]:
        """The installed hooks read ``live`` while the block runs."""
        previous, self._live = self._live, live
        try:
            yield
        finally:
            self._live = previous

    @contextmanager
    def install(self) -> Iterator[None]:
        """Router hooks (``logits + log m``, then the router's softmax, top-``k`` and renormalisation)
        and a parametrization of each stacked down projection (``W · m[:, None, :]``) reading the masks
        set by :meth:`use`; removed on exit, the stored weights untouched."""
        from torch.nn.utils import parametrize

        handles, parametrized = [], []
        try:
            for j, p in enumerate(self.parts):
                handles.append(p.router.register_forward_hook(self._router_hook(j)))
                name = next(n for n, w in p.experts.named_parameters(recurse=False) if w is p.expert_down)
                parametrize.register_parametrization(p.experts, name, _Columns(self, j))
                parametrized.append((p.experts, name))
            yield
        finally:
            for h in handles:
                h.remove()
            for module, name in parametrized:
                parametrize.remove_parametrizations(module, name, leave_parametrized=False)

    def _current(self) -> LiveExperts:
        if self._live is None:
            raise RuntimeError("ExpertMasks hooks ran outside ExpertMasks.use(...)")
        return self._live

    def _router_hook(self, j: int) -> Any:
        k = self.point["experts_per_token"]

        def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            logits = output[0]  # (tokens, E)
            mask = self._current().experts[j].to(device=logits.device, dtype=torch.float32)
            shifted = logits.float() + torch.log(mask + _EPS)
            probs = torch.softmax(shifted, dim=-1)
            top, index = torch.topk(probs, k, dim=-1)  # (tokens, k)
            if getattr(module, "norm_topk_prob", False):
                top = top / top.sum(dim=-1, keepdim=True)
            return (shifted.to(logits.dtype), top.to(logits.dtype), index, *output[3:])

        return hook


class _Columns(torch.nn.Module):
    """A parametrization: the stacked down projection ``(E, D, F)`` times layer ``j``'s channel masks."""

    def __init__(self, masks: ExpertMasks, j: int) -> None:
        super().__init__()
        self._masks = [masks]  # a list: not a submodule (its parameters are not this module's)
        self.j = j

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        live = self._masks[0]._live
        if live is None:  # registration's check, outside a pass: the weight as stored
            return weight
        mask = live.channels[self.j]  # (E, F)
        return weight * mask.to(device=weight.device, dtype=weight.dtype).unsqueeze(1)


# ------------------------------------------------------------------------------ search
# The expert search's candidates, in tie-break order: the trained choice and the importance start.
EXPERT_CANDIDATES: tuple[str, ...] = ("trained", "start")


@dataclass
class ExpertResult:
    """What one expert search produced (the MoE counterpart of
    :class:`~autocompress_opt.search.inner.inner_search.InnerResult`).

    Attributes:
        architecture: the point's uniform child (every layer kept, the MoE layers at the point's counts).
        masks: which experts, channels and top-``k`` of the parent it keeps
            (:func:`~autocompress_opt.prune.experts.slice_experts` cuts them).
        feasible / violations / metrics: by the exact cost model (budgets included).
        history: per step ``kl``, ``penalty``, ``tau``; selection: per candidate ``feasible`` and
            held-out ``val_kl``, and ``chosen``; seconds: where the time went.
        candidates: every candidate's masks by name.
    """

    architecture: Architecture
    masks: Masks
    feasible: bool
    violations: dict[str, float]
    metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    selection: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, Masks] = field(default_factory=dict, repr=False)

    def summary(self) -> dict[str, Any]:
        """JSON-safe record (no tensors)."""
        return {
            "form": "experts",
            "feasible": self.feasible,
            "violations": self.violations,
            "seconds": self.seconds,
            "selection": self.selection,
            "final_kl_train": self.history[-1]["kl"] if self.history else None,
            "steps": len(self.history),
        }

    def choice(self) -> dict[str, Any]:
        """``chosen``, ``val_kl`` (None when not measured) and ``feasible`` per candidate, JSON-safe."""
        rows = {n: v for n, v in self.selection.items() if n != "chosen"}
        return {
            "chosen": self.selection.get("chosen"),
            "val_kl": {n: v["val_kl"] if math.isfinite(v["val_kl"]) else None for n, v in rows.items()},
            "feasible": {n: bool(v["feasible"]) for n, v in rows.items()},
        }


def discretise_experts(masks: ExpertMasks, parent: Architecture) -> Masks:
    """The hard choice of ``masks``: bool :class:`Masks` over the parent that keep everything but the
    routed experts and expert channels the scores leave out (:meth:`ExpertMasks.discrete`)."""
    return masks.discrete(Masks.ones(parent))


def search_experts(
    model: Any,
    parent: Architecture,
    importance: Importance,
    tokens: torch.Tensor,
    teacher: Teacher,
    *,
    params: Mapping[str, int],
    goal: CostGoal | None,
    config: Any,
    adapter: FamilyAdapter | None = None,
    on_step: Any = None,
) -> ExpertResult:
    """Choose which experts and expert channels every MoE layer of ``model`` keeps at the counts of
    ``params`` (module doc); ``config``: an :class:`~autocompress_opt.search.inner.inner_search.InnerConfig`
    (``steps``, ``batch_size``, ``val_samples``, ``gate_lr`` on the scores, ``tau_start``/``tau_end`` in
    rank units, ``dual_lr``, ``penalty``, ``seed``); ``tokens`` / ``teacher`` as for
    :func:`~autocompress_opt.search.inner.inner_search.search` (the first ``val_samples`` rows choose
    between the trained and the start choice). ``on_step(step, val_kl | None, violation | None)``
    after each step; every ``config.measure_every`` steps with the current hard choice's held-out KL.
    Raises :class:`ConfigError` for a point that prunes a dense axis (:func:`expert_point`)."""
    from autocompress_opt.arch.search_space import uniform_allocation

    adapter = adapter or moe_adapter(model)
    point = expert_point(params, parent)
    if tuple(teacher.shape[:2]) != tuple(tokens.shape):
        raise ConfigError(f"teacher log-probs {tuple(teacher.shape)} do not fit tokens {tuple(tokens.shape)}")
    if config.val_samples >= tokens.shape[0]:
        raise ConfigError(f"val_samples={config.val_samples} leaves no training rows of the {tokens.shape[0]} given")
    began = time.perf_counter()
    arch = uniform_allocation({**sparse_limits(parent), **point}, parent)
    start = expert_masks(model, importance, point)
    masks = ExpertMasks(
        adapter.all_layer_parts(model), importance, point, start, device=next(model.parameters()).device
    )
    val, train = slice(0, config.val_samples), slice(config.val_samples, None)
    budget = _param_budget(parent, point)
    history = _train(
        model, masks, parent, tokens[train], teacher[train], budget, config, on_step, tokens[val], teacher[val], adapter
    )
    trained_at = time.perf_counter()
    candidates = {"trained": discretise_experts(masks, parent), "start": start}
    violations, metrics = _exact(arch, masks, parent, budget, goal)
    feasible = all_satisfied(violations)
    kls = {n: _masks_kl(model, m, tokens[val], teacher[val], config.batch_size, adapter) for n, m in candidates.items()}
    chosen = min(candidates, key=lambda n: (kls[n] if math.isfinite(kls[n]) else 0.0, list(candidates).index(n)))
    selection: dict[str, Any] = {n: {"feasible": feasible, "val_kl": kls[n]} for n in candidates}
    selection["chosen"] = chosen
    done = time.perf_counter()
    seconds = {"train": trained_at - began, "select": done - trained_at, "total": done - began}
    return ExpertResult(
        arch, candidates[chosen], feasible, violations, metrics, history, selection, seconds, candidates
    )


def _exact(
    arch: Architecture, masks: ExpertMasks, parent: Architecture, budget: Mapping[str, float], goal: CostGoal | None
) -> tuple[dict[str, float], dict[str, float]]:
    """Violations of the discrete choice: the parameter budgets, then the target's constraints by the
    exact cost model on the child's architecture."""
    with torch.no_grad():
        experts, width = masks.expected(0.0, hard=True)
        totals = expert_param_totals(parent, experts.double(), width.double(), masks.point["experts_per_token"])
    out = {
        "budget:expert_params": float(totals["total"]) / budget["budget:expert_params"] - 1,
        "budget:active_expert_params": float(totals["active"]) / budget["budget:active_expert_params"] - 1,
    }
    metrics: dict[str, float] = {}
    if goal is not None:
        hardware, metrics = goal.target.check(arch, goal.parent_metrics)
        out.update(hardware)
    return out, metrics


def _violations(
    masks: ExpertMasks, parent: Architecture, budget: Mapping[str, float], tau: float
) -> dict[str, torch.Tensor]:
    """Differentiable parameter budgets (straight-through: the hard choice's values)."""
    experts, width = masks.expected(tau)
    totals = expert_param_totals(parent, experts.double(), width.double(), masks.point["experts_per_token"])
    return {
        "budget:expert_params": totals["total"] / budget["budget:expert_params"] - 1,
        "budget:active_expert_params": totals["active"] / budget["budget:active_expert_params"] - 1,
    }


def _train(
    model: Any,
    masks: ExpertMasks,
    parent: Architecture,
    tokens: torch.Tensor,
    teacher: Teacher,
    budget: Mapping[str, float],
    config: Any,
    on_step: Any,
    val_tokens: torch.Tensor,
    val_teacher: Teacher,
    adapter: FamilyAdapter,
) -> list[dict[str, float]]:
    """Adam (``gate_lr``) on the scores against KL + Lagrangian, with dual ascent; the history."""
    if not config.steps:
        return []
    gen = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.Adam([masks.expert_score, masks.channel_score], lr=config.gate_lr)
    device = next(model.parameters()).device
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    duals: dict[str, float] = {}
    history: list[dict[str, float]] = []
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        model.eval()
        with masks.install():
            for step in range(config.steps):
                tau = config.tau(step)
                rows = torch.randint(0, tokens.shape[0], (config.batch_size,), generator=gen)
                with masks.use(masks.live(tau)):
                    logits = model(input_ids=tokens[rows].to(device), use_cache=False).logits  # (B, T, V)
                kl = teacher_kl(log_probs(logits), teacher[rows].to(logits.device)).mean()
                violations = _violations(masks, parent, budget, tau)
                penalty = sum(
                    (duals.get(k, 0.0) * v + config.penalty / 2 * torch.relu(v) ** 2 for k, v in violations.items()),
                    torch.zeros((), dtype=torch.float64, device=masks.expert_score.device),
                )
                loss = kl + penalty.to(device=kl.device, dtype=kl.dtype)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                values = {k: float(v.detach()) for k, v in violations.items()}
                for k, v in values.items():
                    duals[k] = max(0.0, duals.get(k, 0.0) + config.dual_lr * v)
                history.append(
                    {
                        "step": step,
                        "tau": tau,
                        "kl": float(kl.detach()),
                        "penalty": float(penalty.detach()),
                        "max_violation": max(values.values(), default=0.0),
                    }
                )
                done = step + 1
                if on_step is None:
                    continue
                if done % config.measure_every == 0 and val_tokens.shape[0]:
                    with masks.use(masks.live(0.0)), torch.no_grad():  # the hard choice, as discretised
                        val_kl = _kl_rows(model, val_tokens, val_teacher, config.batch_size)
                    on_step(done, val_kl, max(max(values.values(), default=0.0), 0.0))
                else:
                    on_step(done, None, None)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)
    return history


def _kl_rows(model: Any, tokens: torch.Tensor, teacher: Teacher, batch_size: int) -> float:
    """Mean per-position KL(parent ‖ model as it computes now) on ``tokens``, in nats."""
    device = next(model.parameters()).device
    total = 0.0
    for start in range(0, tokens.shape[0], batch_size):
        logits = model(input_ids=tokens[start : start + batch_size].to(device), use_cache=False).logits
        kl = teacher_kl(log_probs(logits), teacher[start : start + batch_size].to(logits.device)).mean()
        total += float(kl) * logits.shape[0]
    return total / tokens.shape[0]


def _masks_kl(
    model: Any, masks: Masks, tokens: torch.Tensor, teacher: Teacher, batch_size: int, adapter: FamilyAdapter
) -> float:
    """KL(parent ‖ parent under the bool ``masks``) on ``tokens`` (NaN without rows)."""
    if not tokens.shape[0]:
        return math.nan
    with apply_masks(model, masks, adapter=adapter), torch.inference_mode():
        return _kl_rows(model, tokens, teacher, batch_size)
