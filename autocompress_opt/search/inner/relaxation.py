"""Learnable masks over a frozen parent: the continuous relaxation the inner search trains.

:class:`ParentMasks` holds, per parent layer ``l``, five scalar mask parameters; the parent's own
weights stay frozen (``requires_grad=False``) and only these are trained:

* **keep gates** ``attn_log_alpha[l]`` and ``ffn_log_alpha[l]`` — one hard-concrete gate per
  sub-block (Louizos, Welling & Kingma 2018, "Learning Sparse Neural Networks through L0
  Regularization", §4: a binary concrete stretched to ``(γ, ζ) = (−0.1, 1.1)`` and clamped to
  ``[0, 1]``, temperature ``β = 2/3``). Training samples the gate; the deterministic gate
  ``clamp(σ(log α)(ζ − γ) + γ, 0, 1)`` is above ½ exactly when ``log α > 0``, which is the
  discrete decision. A sub-block's gate scales its whole residual contribution (bias included).
* **widths** ``ffn_keep[l]``, ``kv_keep[l]``, ``q_keep[l]`` — the fraction of the parent layer's
  FFN units, KV groups and query heads per group kept, as a *prefix of the importance order*.
  With ``c = keep · n`` units kept of ``n``, unit ``j`` (0 = most important) gets the soft step
  ``m_j = σ((c − j − ½) / τ)``; as ``τ → 0`` this is the hard prefix ``j < round(c)``, so every
  discrete outcome is a set :func:`~autocompress_opt.prune.plan.plan_pruning` picks (it keeps
  the top-k by the same scores, ties to the lower index). An FFN unit is ``ffn_unit`` channels
  (64, or the largest power of two ≤ 64 that divides every layer's width); heads are pruned in
  whole KV groups and, inside every kept group, by the same number of query heads.

The hidden size is not learned: it is the trial's global choice, applied as a fixed channel mask
of the ``hidden_size`` most important residual channels, through
:func:`~autocompress_opt.prune.masking.apply_masks` (kept-channel RMSNorm, exactly as a sliced model).

Float-mask forward (:meth:`ParentMasks.install`): an ``o_proj`` pre-hook multiplies each head's
output by its mask, a ``down_proj`` pre-hook each FFN channel; forward hooks on the modules whose
outputs are the sub-blocks' residual contributions multiply them by the gates, times the mask of the
sub-block's most important unit (so a width of zero removes the sub-block, bias included). Those
modules are ``o_proj`` / ``down_proj``, or, in a family that normalises each sub-block's output
(Gemma 3), that post-norm: a gate in front of a scale-invariant RMSNorm would be undone by it
(:attr:`~autocompress_opt.hf.adapters.LayerParts.attn_residual`).

:meth:`ParentMasks.checkpoint_layers` makes every decoder layer recompute its activations during
the backward pass (non-reentrant ``torch.utils.checkpoint``) with the live masks of the forward
pass being rebuilt, captured when it ran: the hooks read the masks set by :meth:`ParentMasks.use`,
which is over by the time ``backward()`` rebuilds a layer, and the hard-concrete noise is drawn
once per step (:meth:`ParentMasks.live`), never again on recompute. transformers' own switch
(``activation_checkpointing_enable``) checkpoints only in training mode, and the frozen parent
runs in eval mode.

Device: the parameters, buffers and live masks sit on the parent's device (``device=``; the search
passes the parent's), so a hook multiplies by a mask already beside its activations — no host-device
copy per hook, gradients that stay on the device; the seeded gate noise is drawn on the CPU generator
and moved once per step.

:meth:`ParentMasks.expected` gives the expected per-layer structure as torch tensors — what the
differentiable cost model consumes (on the same device). A sub-block's keep probability is ``P(z > ½) = σ(log α)``
(the probability the rounded gate keeps it), not the L0 norm ``P(z ≠ 0)``: the penalty then
prices exactly what discretisation keeps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import (
    FamilyAdapter,
    ReplacedForward,
    adapter_for,
    architecture_mismatch,
    zero_sub_block,
)
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.prune.masking import LayerMask, MaskHandle, Masks, apply_masks

__all__ = [
    "HC_BETA",
    "HC_GAMMA",
    "HC_ZETA",
    "DiscreteLayer",
    "ExpectedStructure",
    "LiveMasks",
    "ParentMasks",
    "ffn_unit_for",
    "hidden_mask",
]

# Hard-concrete constants: Louizos et al. 2018, §4 ("we used β = 2/3, γ = −0.1, ζ = 1.1").
HC_BETA, HC_GAMMA, HC_ZETA = 2.0 / 3.0, -0.1, 1.1
_MAX_FFN_UNIT = 64  # GEMM-tile friendly FFN granularity
_LOG_ALPHA_RANGE = 8.0  # |log α| beyond this only slows the gate down (σ(8) = 0.9997)


def ffn_unit_for(parent: Architecture, engine_multiple: int | None = None) -> int:
    """FFN granularity in channels: ``engine_multiple`` (a serving engine's FFN width multiple) when
    it is above 1 and divides every layer's FFN width, else the largest power of two ≤ 64 that does."""
    widths = [layer.ffn_width for layer in parent.layers if layer.ffn]
    if engine_multiple is not None and engine_multiple > 1 and widths and not any(w % engine_multiple for w in widths):
        return engine_multiple
    unit = _MAX_FFN_UNIT
    while unit > 1 and any(w % unit for w in widths):
        unit //= 2
    return unit


def hidden_mask(importance: Importance, hidden_size: int) -> torch.Tensor:
    """Bool ``(D,)``: the ``hidden_size`` most important residual channels (materialize's choice)."""
    d_model = importance.hidden.numel()
    if not 1 <= hidden_size <= d_model:
        raise ConfigError(f"hidden_size={hidden_size} must lie in 1..{d_model} (the parent's hidden size)")
    order = ranked(importance.hidden)[:hidden_size]
    mask = torch.zeros(d_model, dtype=torch.bool)
    mask[order] = True
    return mask


@dataclass(frozen=True)
class ExpectedStructure:
    """Expected per-layer structure under the current masks; every field a float tensor ``(L,)``.

    ``attn`` / ``ffn`` are keep probabilities of the sub-blocks; ``heads``, ``kv_heads`` and
    ``ffn_width`` (channels) are expected sizes *given* the sub-block is kept, so ``attn · heads``
    is the expected number of query heads. Differentiable w.r.t. the mask parameters.
    """

    attn: torch.Tensor
    ffn: torch.Tensor
    heads: torch.Tensor
    kv_heads: torch.Tensor
    ffn_width: torch.Tensor

    @property
    def layers_kept(self) -> torch.Tensor:
        """``(L,)`` probability that a layer keeps at least one sub-block (gates independent)."""
        return 1 - (1 - self.attn) * (1 - self.ffn)

    def to_dict(self) -> dict[str, list[float]]:
        return {
            name: [round(v, 4) for v in getattr(self, name).tolist()]
            for name in ("attn", "ffn", "heads", "kv_heads", "ffn_width")
        }


@dataclass(frozen=True)
class LiveMasks:
    """The float masks of one forward pass.

    ``attn_gate`` / ``ffn_gate`` ``(L,)`` scale each sub-block's output; ``heads`` ``(L, H_max)``
    multiply head outputs, ``ffn`` ``(L, F_max)`` FFN channels (padding columns unused).
    """

    attn_gate: torch.Tensor
    ffn_gate: torch.Tensor
    heads: torch.Tensor
    ffn: torch.Tensor
    _off: dict[str, list[bool]] = field(default_factory=dict, compare=False, repr=False)

    def off(self, which: str) -> list[bool]:
        """Per layer, whether the gate ``which`` (``attn_gate`` / ``ffn_gate``) is exactly 0 in this
        pass: that sub-block's output is multiplied by 0 and its gradients are 0 (a hard-concrete gate
        clamped at 0 passes none), so its computation can be skipped with the same result. Read
        from the device once per pass and gate."""
        if which not in self._off:
            self._off[which] = (getattr(self, which).detach() == 0).tolist()
        return self._off[which]


@dataclass(frozen=True)
class DiscreteLayer:
    """A rounded layer: KV groups and query heads per group kept, FFN units kept (0 = none).

    ``attention`` / ``ffn`` are the rounded gates; ``gate_score`` (the larger log α) ranks layers
    when more are kept than the budget allows.
    """

    attention: bool
    kv_groups: int
    q_per_group: int
    ffn: bool
    ffn_units: int
    gate_score: float


class ParentMasks(torch.nn.Module):
    """Learnable per-layer gates and widths over a frozen parent (see the module doc).

    Args:
        parent: the parent's architecture; ``importance`` must have been computed for it.
        importance: orders heads, KV groups, FFN channels and residual channels.
        hidden_size: the trial's fixed hidden size (default: the parent's).
        init: where the widths and gates start — an architecture with the parent's number of
            layers (e.g. the outer trial's uniform allocation); default: the parent (all kept).
        init_log_alpha: ``|log α|`` of the initial gates (kept: +, dropped: −).
        ffn_unit: FFN granularity in channels (default :func:`ffn_unit_for`).
        device: where the parameters, the buffers and so every :class:`LiveMasks` live: the parent's
            device (:func:`~autocompress_opt.search.inner.inner_search.search` passes it), so a
            hook multiplies by a mask already beside its activations, with no host-device copy
            per hook and gradients that never leave the device. Default: the CPU.

    Parameters are float32 tensors of shape ``(L,)`` (the optimiser's state too, whatever the
    parent's compute dtype; a hook casts its slice of the mask to the activations' dtype, on the
    device); ``clamp_()`` keeps them in a useful range (call it after each optimiser step).
    """

    # Buffers (registered in __init__, not parameters; declared here for type checkers).
    hidden: torch.Tensor  # (D,) bool: kept residual channels
    head_group: torch.Tensor  # (L, H_max) long: importance rank of each query head's KV group
    head_rank: torch.Tensor  # (L, H_max) long: rank of each query head inside its group
    ffn_unit_index: torch.Tensor  # (L, F_max) long: importance-ordered FFN unit of each channel
    sizes: torch.Tensor  # (L, 3) long: KV groups, query heads per group, FFN units
    has_attn: torch.Tensor  # (L,) float 0/1
    has_ffn: torch.Tensor  # (L,) float 0/1

    def __init__(
        self,
        parent: Architecture,
        importance: Importance,
        *,
        hidden_size: int | None = None,
        init: Architecture | None = None,
        init_log_alpha: float = 3.0,
        ffn_unit: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self._live: LiveMasks | None = None
        mismatch = architecture_mismatch(importance.architecture, parent)
        if mismatch:
            raise ConfigError(f"the importance scores were computed for another architecture ({mismatch})")
        self.parent = parent
        self.hidden_size = parent.hidden_size if hidden_size is None else int(hidden_size)
        self.ffn_unit = ffn_unit_for(parent) if ffn_unit is None else int(ffn_unit)
        if self.ffn_unit < 1 or any(s.ffn and s.ffn_width % self.ffn_unit for s in parent.layers):
            raise ConfigError(f"ffn_unit={self.ffn_unit} must be positive and divide every FFN width of the parent")
        self._hidden_host = hidden_mask(importance, self.hidden_size)  # for install: no device read
        self.register_buffer("hidden", self._hidden_host.clone(), persistent=False)
        self._build_orders(parent, importance)
        self._init_parameters(init or parent, init_log_alpha)
        if device is not None:
            self.to(device)  # built on the CPU, moved once: parameters and buffers alike

    @property
    def device(self) -> torch.device:
        """Where the parameters, buffers and live masks are."""
        return self.attn_log_alpha.device

    # ------------------------------------------------------------------ construction
    def _build_orders(self, parent: Architecture, imp: Importance) -> None:
        """Rank tensors mapping every head and FFN channel to its importance-ordered unit."""
        layers = parent.layers
        n_layers = len(layers)
        h_max = max((s.num_heads for s in layers), default=0) or 1
        f_max = max((s.ffn_width for s in layers), default=0) or 1
        g_max = max((s.num_kv_heads for s in layers), default=0) or 1
        r_max = max((s.num_heads // s.num_kv_heads for s in layers if s.attention), default=1)
        head_group = torch.zeros(n_layers, h_max, dtype=torch.long)  # rank of the head's KV group
        head_rank = torch.zeros(n_layers, h_max, dtype=torch.long)  # rank of the head inside its group
        ffn_unit = torch.zeros(n_layers, f_max, dtype=torch.long)  # importance-ordered unit of a channel
        sizes = torch.zeros(n_layers, 3, dtype=torch.long)  # (KV groups, heads per group, FFN units)
        for i, spec in enumerate(layers):
            if spec.attention:
                r = spec.num_heads // spec.num_kv_heads
                kv_scores, head_scores = imp.kv_groups[i], imp.heads[i]
                assert kv_scores is not None and head_scores is not None  # scored for every kept block
                group_rank = _ranks(kv_scores)  # (G,)
                within = torch.stack([_ranks(h) for h in head_scores.view(spec.num_kv_heads, r)])  # (G, r)
                head_group[i, : spec.num_heads] = group_rank.repeat_interleave(r)
                head_rank[i, : spec.num_heads] = within.flatten()
                sizes[i, 0], sizes[i, 1] = spec.num_kv_heads, r
            if spec.ffn:
                ffn_scores = imp.ffn[i]
                assert ffn_scores is not None
                ffn_unit[i, : spec.ffn_width] = _ranks(ffn_scores) // self.ffn_unit
                sizes[i, 2] = spec.ffn_width // self.ffn_unit
        self.register_buffer("head_group", head_group, persistent=False)
        self.register_buffer("head_rank", head_rank, persistent=False)
        self.register_buffer("ffn_unit_index", ffn_unit, persistent=False)
        self.register_buffer("sizes", sizes, persistent=False)
        self.register_buffer("has_attn", torch.tensor([float(s.attention) for s in layers]), persistent=False)
        self.register_buffer("has_ffn", torch.tensor([float(s.ffn) for s in layers]), persistent=False)
        self._unit_counts = (g_max, r_max, max(f_max // self.ffn_unit, 1))

    def _init_parameters(self, init: Architecture, log_alpha: float) -> None:
        as_param = lambda v: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32))
        a_gate, f_gate, kv, q, f = self._start_values(init, log_alpha)
        self.attn_log_alpha, self.ffn_log_alpha = as_param(a_gate), as_param(f_gate)
        self.kv_keep, self.q_keep, self.ffn_keep = as_param(kv), as_param(q), as_param(f)

    @torch.no_grad()
    def reset(self, init: Architecture, init_log_alpha: float = 3.0) -> None:
        """Move every parameter (in place) to the point that reproduces ``init``: see :meth:`_start_values`."""
        for p, values in zip(
            (self.attn_log_alpha, self.ffn_log_alpha, self.kv_keep, self.q_keep, self.ffn_keep),
            self._start_values(init, init_log_alpha),
        ):
            p.copy_(torch.tensor(values, dtype=p.dtype, device=p.device))

    def _start_values(self, init: Architecture, log_alpha: float) -> tuple[list[float], ...]:
        """Gates (±``log_alpha``) and keep fractions at ``init``'s unit counts (one unit beyond the
        parent's when ``init`` keeps everything, so the masks start near 1); ``init`` lists every
        parent layer. Returns ``(attn log α, ffn log α, kv, q, ffn)`` lists."""
        parent = self.parent
        if init.num_layers != parent.num_layers:
            raise ConfigError(
                f"init has {init.num_layers} layers; it must list all {parent.num_layers} of the parent "
                "(dropped ones as LayerSpec.dropped())"
            )
        kv, q, f, a_gate, f_gate = [], [], [], [], []
        sizes = self.sizes.tolist()  # one read from the device, not one per layer
        for i, (p, s) in enumerate(zip(parent.layers, init.layers)):
            g_n, r_n, u_n = sizes[i]
            if p.attention:
                kv_k = min(s.num_kv_heads, g_n) if s.attention else g_n
                r_k = min(s.num_heads // s.num_kv_heads, r_n) if s.attention else r_n
            else:
                kv_k, r_k = 0, 0
            u_k = min(s.ffn_width // self.ffn_unit, u_n) if s.ffn and p.ffn else u_n
            kv.append(_start_fraction(kv_k, g_n))
            q.append(_start_fraction(r_k, r_n))
            f.append(_start_fraction(u_k, u_n))
            a_gate.append(log_alpha if (s.attention and p.attention) else -log_alpha)
            f_gate.append(log_alpha if (s.ffn and p.ffn) else -log_alpha)
        return a_gate, f_gate, kv, q, f

    # ------------------------------------------------------------------------ views
    def unit_steps(self, tau: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Soft prefix masks over importance-ordered units: KV groups ``(L, G)``, query heads per
        group ``(L, r)``, FFN units ``(L, U)``; ``tau`` (units) is the step's softness (0 = hard)."""
        g_max, r_max, u_max = self._unit_counts
        sizes = self.sizes.to(torch.float32)
        return (
            _soft_prefix(self.kv_keep * sizes[:, 0], self.sizes[:, 0], g_max, tau),
            _soft_prefix(self.q_keep * sizes[:, 1], self.sizes[:, 1], r_max, tau),
            _soft_prefix(self.ffn_keep * sizes[:, 2], self.sizes[:, 2], u_max, tau),
        )

    def expected(self, tau: float, *, hard: bool = False) -> ExpectedStructure:
        """Expected per-layer structure (differentiable); ``hard=True`` gives the rounded point
        (gates 0/1, hard prefix widths) that :meth:`discrete` describes."""
        kv, q, f = self.unit_steps(0.0 if hard else tau)
        kv_n, q_n, f_n = kv.sum(-1), q.sum(-1), f.sum(-1)
        if hard:
            attn = (self.attn_log_alpha > 0) & (kv_n >= 1) & (q_n >= 1)
            ffn = (self.ffn_log_alpha > 0) & (f_n >= 1)
            attn, ffn = attn.to(kv_n.dtype) * self.has_attn, ffn.to(kv_n.dtype) * self.has_ffn
        else:
            attn = torch.sigmoid(self.attn_log_alpha) * self.has_attn
            ffn = torch.sigmoid(self.ffn_log_alpha) * self.has_ffn
        return ExpectedStructure(attn=attn, ffn=ffn, heads=kv_n * q_n, kv_heads=kv_n, ffn_width=f_n * self.ffn_unit)

    def live(self, tau: float, *, sample: bool, generator: torch.Generator | None = None) -> LiveMasks:
        """Float masks for one forward pass; ``sample`` draws the hard-concrete gates (training),
        else the deterministic gates are used. Differentiable w.r.t. every parameter."""
        kv, q, f = self.unit_steps(tau)
        heads = kv.gather(1, self.head_group) * q.gather(1, self.head_rank)  # (L, H_max)
        ffn = f.gather(1, self.ffn_unit_index)  # (L, F_max)
        # A sub-block fades out with its last unit (the most important one), biases included, so a
        # zero width is a removed sub-block, as in the discrete architecture.
        attn_gate = _hard_concrete(self.attn_log_alpha, sample, generator) * self.has_attn * kv[:, 0] * q[:, 0]
        ffn_gate = _hard_concrete(self.ffn_log_alpha, sample, generator) * self.has_ffn * f[:, 0]
        return LiveMasks(attn_gate=attn_gate, ffn_gate=ffn_gate, heads=heads, ffn=ffn)

    @torch.no_grad()
    def clamp_(self) -> None:
        """Keep log α in ±8 and every kept count within one unit of ``[0, n]`` (gradients stay alive)."""
        for p in (self.attn_log_alpha, self.ffn_log_alpha):
            p.clamp_(-_LOG_ALPHA_RANGE, _LOG_ALPHA_RANGE)
        sizes = self.sizes.to(torch.float32).clamp(min=1)
        for j, p in enumerate((self.kv_keep, self.q_keep, self.ffn_keep)):
            p.copy_(torch.minimum(torch.maximum(p, -1 / sizes[:, j]), 1 + 1 / sizes[:, j]))

    # ---------------------------------------------------------------- discretising
    @torch.no_grad()
    def discrete(self) -> list[DiscreteLayer]:
        """Round every layer: gates at ½ (``log α > 0``), widths to the hard prefix (``τ → 0``)."""
        # One read from the device: counts and gates as Python numbers (float32 values, exactly).
        kv, q, f = (m.sum(-1).round().long().tolist() for m in self.unit_steps(0.0))
        a_alpha, f_alpha = self.attn_log_alpha.tolist(), self.ffn_log_alpha.tolist()
        out = []
        for i, spec in enumerate(self.parent.layers):
            attn = spec.attention and a_alpha[i] > 0 and kv[i] >= 1 and q[i] >= 1
            ffn = spec.ffn and f_alpha[i] > 0 and f[i] >= 1
            score = max(a_alpha[i] if spec.attention else -math.inf, f_alpha[i] if spec.ffn else -math.inf)
            out.append(DiscreteLayer(attn, kv[i], q[i], ffn, f[i], score))
        return out

    def architecture(self, layers: list[DiscreteLayer]) -> Architecture:
        """The :class:`Architecture` of rounded ``layers`` (all of the parent's layers, dropped ones as
        no-ops; a kept attention keeps its parent layer's window)."""
        specs = []
        for p, d in zip(self.parent.layers, layers):
            attn = d.attention and d.kv_groups >= 1 and d.q_per_group >= 1
            ffn = d.ffn and d.ffn_units >= 1
            specs.append(
                LayerSpec(
                    attention=attn,
                    num_heads=d.kv_groups * d.q_per_group if attn else 0,
                    num_kv_heads=d.kv_groups if attn else 0,
                    head_dim=p.head_dim if attn else 0,
                    ffn=ffn,
                    ffn_width=d.ffn_units * self.ffn_unit if ffn else 0,
                    window=p.window if attn else None,
                )
            )
        name = f"{self.parent.name or self.parent.family}-searched"
        return replace(self.parent, hidden_size=self.hidden_size, layers=tuple(specs), name=name)

    @property
    def sliced_parent(self) -> Architecture:
        """The parent with every layer, head and channel, cut to :attr:`hidden_size` residual
        channels: a model of this architecture materialised from the parent (the kept channels of
        :func:`hidden_mask`) computes what the parent does under the hidden mask, without the
        pruned channels (:meth:`install` accepts it)."""
        return replace(self.parent, hidden_size=self.hidden_size)

    # ------------------------------------------------------------------------ hooks
    def install(self, model: Any, *, adapter: FamilyAdapter | None = None, skip_off: bool = True) -> MaskHandle:
        """Hook ``model`` (the parent, or the parent cut to the hidden size: :attr:`sliced_parent`)
        so it computes with the masks set by :meth:`use`.

        The parent's parameters are frozen (``requires_grad=False``) while installed: only mask
        parameters receive gradients. The fixed hidden-channel mask goes through
        :func:`apply_masks`; the float masks through ``o_proj``/``down_proj`` pre-hooks and gate
        hooks on each sub-block's residual contribution. ``skip_off``: a sub-block (attention or
        dense MLP module) whose gate is exactly 0 in a pass returns zeros without computing
        (:meth:`LiveMasks.off`; the same output and gradients: tested); a dropped layer then costs
        nothing, in training, the rung measurements and the candidates' scores. Removing the
        returned handle restores the parent (hooks, ``forward`` methods and ``requires_grad`` flags).
        """
        adapter = adapter or adapter_for(model)
        actual = adapter.architecture(model)
        sliced = self.hidden_size < self.parent.hidden_size and not architecture_mismatch(self.sliced_parent, actual)
        mismatch = None if sliced else architecture_mismatch(self.parent, actual)
        if mismatch:
            raise ConfigError(
                f"the model is not the masks' parent, nor the parent cut to hidden {self.hidden_size} ({mismatch})"
            )
        handles: list[Any] = [_Frozen(model)]
        if not sliced:  # a model cut to the hidden size already computes only the kept channels
            ones = Masks.ones(self.parent)
            # The host copy of the hidden mask: apply_masks tests it for all-ones without reading the
            # device, and each of its hooks converts it to the activations' device once (not per pass).
            handles.append(apply_masks(model, Masks(layers=ones.layers, hidden=self._hidden_host), adapter=adapter))
        try:
            for i, p in enumerate(adapter.all_layer_parts(model)):
                if p.attention is not None:
                    handles.append(p.o_proj.register_forward_pre_hook(self._head_hook(i, p.num_heads, p.head_dim)))
                    handles.append(p.attn_residual.register_forward_hook(self._gate_hook(i, "attn_gate")))
                    if skip_off:
                        handles.append(_skipped_when_off(p.attention, self, i, "attn_gate"))
                if p.mlp is not None:
                    handles.append(p.down_proj.register_forward_pre_hook(self._ffn_hook(i, p.ffn_width)))
                    handles.append(p.ffn_residual.register_forward_hook(self._gate_hook(i, "ffn_gate")))
                    if skip_off:
                        handles.append(_skipped_when_off(p.mlp, self, i, "ffn_gate"))
        except BaseException:
            MaskHandle(handles).remove()
            raise
        return MaskHandle(handles)

    def checkpoint_layers(self, model: Any, *, adapter: FamilyAdapter | None = None) -> MaskHandle:
        """Checkpoint every decoder layer of ``model`` (the parent, hooks :meth:`install`-ed): with
        gradients enabled a layer's forward runs under non-reentrant ``torch.utils.checkpoint`` (the
        frozen parent's hidden states need no gradient, the masks do: the reentrant variant would
        lose them), keeping only its inputs; ``backward()`` rebuilds its activations with the
        :class:`LiveMasks` that were current when it ran (captured then; no new gate noise). Without
        gradients (held-out measurements) layers run as they are. Removing the returned handle
        restores each layer's ``forward``."""
        adapter = adapter or adapter_for(model)
        handles: list[Any] = []
        try:
            for part in adapter.all_layer_parts(model):
                handles.append(_checkpointed_layer(part.layer, self))
        except BaseException:
            MaskHandle(handles).remove()
            raise
        return MaskHandle(handles)

    @contextmanager
    def use(self, live: LiveMasks) -> Iterator[None]:
        """Make installed hooks compute with ``live`` inside the block (the masks set before it
        are current again after it, so a checkpointed layer may set its own inside a pass)."""
        before, self._live = self._live, live
        try:
            yield
        finally:
            self._live = before

    def _current(self) -> LiveMasks:
        live = self._live
        if live is None:
            raise RuntimeError("masked forward outside ParentMasks.use(...): no live masks are set")
        return live

    def _head_hook(self, i: int, n_heads: int, head_dim: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x = args[0]  # (batch, time, H·d)
            mask = self._current().heads[i, :n_heads].repeat_interleave(head_dim)  # (H·d,)
            return (x * _beside(mask, x), *args[1:])

        return hook

    def _ffn_hook(self, i: int, width: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x = args[0]  # (batch, time, F)
            return (x * _beside(self._current().ffn[i, :width], x), *args[1:])

        return hook

    def _gate_hook(self, i: int, which: str) -> Any:
        def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            return output * _beside(getattr(self._current(), which)[i], output)  # (B, T, D)

        return hook

    def discrete_masks(self, layers: list[DiscreteLayer]) -> Masks:
        """Bool :class:`Masks` over the parent for rounded ``layers`` (what ``plan_pruning`` keeps)."""
        out = []
        for i, (p, d) in enumerate(zip(self.parent.layers, layers)):
            heads = ffn = None
            if p.attention and d.attention and d.kv_groups >= 1 and d.q_per_group >= 1:
                g = self.head_group[i, : p.num_heads]
                heads = (g < d.kv_groups) & (self.head_rank[i, : p.num_heads] < d.q_per_group)
            if p.ffn and d.ffn and d.ffn_units >= 1:
                ffn = self.ffn_unit_index[i, : p.ffn_width] < d.ffn_units
            out.append(LayerMask(heads=heads, ffn=ffn))
        return Masks(layers=tuple(out), hidden=self.hidden.clone())


# --------------------------------------------------------------------------- helpers
class _Frozen:
    """Sets every parameter of a model to ``requires_grad=False``; ``remove()`` restores the flags."""

    def __init__(self, model: Any) -> None:
        self._flags = [(p, p.requires_grad) for p in model.parameters()]
        for p, _ in self._flags:
            p.requires_grad_(False)

    def remove(self) -> None:
        for p, flag in self._flags:
            p.requires_grad_(flag)
        self._flags = []


def _skipped_when_off(module: Any, masks: ParentMasks, index: int, which: str) -> ReplacedForward:
    """A sub-block module (a layer's attention or dense MLP) whose ``forward`` computes nothing when
    its gate ``which`` is exactly 0 in the current pass (:meth:`LiveMasks.off`): zeros shaped like its
    input (:func:`~autocompress_opt.hf.adapters.zero_sub_block`); the handle's ``remove()`` restores it."""
    zeros = zero_sub_block(attention=which == "attn_gate")

    def make(forward: Any) -> Any:
        def skipped_when_off(*args: Any, **kwargs: Any) -> Any:
            if masks._current().off(which)[index]:
                return zeros(*args, **kwargs)
            return forward(*args, **kwargs)

        return skipped_when_off

    return ReplacedForward(module, make)


def _checkpointed_layer(layer: Any, masks: ParentMasks) -> ReplacedForward:
    """One decoder layer's ``forward`` replaced by a checkpointed call (see
    :meth:`ParentMasks.checkpoint_layers`); the handle's ``remove()`` puts the previous one back."""
    from torch.utils.checkpoint import checkpoint

    def make(forward: Any) -> Any:
        def checkpointed(*args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            live = masks._current()  # this pass's masks, reused when backward() rebuilds the layer

            def run(*a: Any, **k: Any) -> Any:
                with masks.use(live):
                    return forward(*a, **k)

            return checkpoint(run, *args, use_reentrant=False, **kwargs)

        return checkpointed

    return ReplacedForward(layer, make)


def _beside(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``mask`` in ``x``'s dtype on ``x``'s device. The masks live on the parent's device, so this is
    the mask itself (float32 compute) or a cast on that device (bf16/fp16 compute: the gradient of
    each slice comes back in float32); it moves only for a parent spread over several devices, one
    device to another (a layer off the masks' device)."""
    if mask.device != x.device or mask.dtype != x.dtype:
        mask = mask.to(device=x.device, dtype=x.dtype)
    return mask


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """Rank of every entry (0 = highest score): its position in :func:`ranked`, the order
    :func:`~autocompress_opt.prune.plan.plan_pruning` keeps the top of."""
    order = ranked(scores)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel())
    return ranks


def _start_fraction(kept: int, n: int) -> float:
    """Keep fraction whose hard prefix is ``kept`` of ``n`` units; full → one unit beyond ``n``."""
    if n == 0:
        return 0.0
    return (n + 1) / n if kept >= n else kept / n


def _soft_prefix(count: torch.Tensor, n_units: torch.Tensor, size: int, tau: float) -> torch.Tensor:
    """``(L, size)``: ``σ((count − j − ½)/τ)`` for units ``j < n_units`` (0 beyond); ``τ = 0`` is the hard step."""
    j = torch.arange(size, dtype=count.dtype, device=count.device)
    valid = (j[None, :] < n_units[:, None]).to(count.dtype)
    edge = count[:, None] - j[None, :] - 0.5
    step = (edge > 0).to(count.dtype) if tau <= 0 else torch.sigmoid(edge / tau)
    return step * valid


def _hard_concrete(log_alpha: torch.Tensor, sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """Stretched, clamped binary concrete (Louizos et al. 2018, eq. 10-11); deterministic without ``sample``."""
    if sample:
        # Drawn where the generator is (the search's seeded CPU generator: the same noise whatever
        # the masks' device), moved once per step: (L,) numbers, not a copy per hook.
        on = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand(log_alpha.shape, generator=generator, device=on).to(log_alpha.device).clamp(1e-6, 1 - 1e-6)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / HC_BETA)
    else:
        s = torch.sigmoid(log_alpha)
    return (s * (HC_ZETA - HC_GAMMA) + HC_GAMMA).clamp(0.0, 1.0)
