"""Pruning plans: which parent layer, query/KV heads, FFN channels and hidden channels each kept
layer of a target architecture takes, chosen by importance (:func:`plan_pruning`).

Every kept set is a prefix of the importance order (most important first), stored in ascending
index order. Heads go in whole KV groups (the groups with the highest summed score) and, optionally,
by the same number of query heads inside every kept group, so the result stays valid grouped-query
attention; ``head_dim`` never changes. A target with as many layers as the parent maps layer ``i`` to
parent layer ``i``; one with ``n`` fewer layers keeps the parent's ``n`` most important layers (by
``layer_metric``), in their original order. A kept layer computes its parent layer's attention (full
or sliding over the parent's window): the plan's architecture carries the parent layers' windows.

A plan's kept indices travel as a small JSON record (:meth:`PrunePlan.kept`, read back by
:func:`plan_from_kept`): one hex bitmask per index set, bit ``i`` set when index ``i`` is kept, so
a weights-mode trial stores exactly what it measured and an export on another machine, device or
dtype cuts the same channels without recomputing importance. SmolLM2-135M (30 layers of 1536 FFN
channels) takes about 12 KB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import architecture_mismatch
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.prune.masking import LayerMask, Masks

if TYPE_CHECKING:
    import torch


__all__ = [
    "KEPT_FORMAT",
    "LayerPlan",
    "PrunePlan",
    "identity_plan",
    "layer_heads",
    "plan_from_kept",
    "plan_pruning",
]

KEPT_FORMAT = "autocompress-kept/1"  # the record of PrunePlan.kept


# ------------------------------------------------------------------------------------ plans
@dataclass(frozen=True)
class LayerPlan:
    """What one built layer keeps of parent layer ``parent_index`` (indices ascending).

    ``heads`` are parent query heads, listed group by group so new head ``k`` reads new KV head
    ``k // (len(heads) // len(kv_heads))``; empty ``heads`` = no attention, empty ``ffn_channels``
    = no FFN.
    """

    parent_index: int
    heads: tuple[int, ...] = ()
    kv_heads: tuple[int, ...] = ()
    ffn_channels: tuple[int, ...] = ()


@dataclass(frozen=True)
class PrunePlan:
    """Which parts of ``parent`` a pruned model keeps.

    Attributes:
        parent: the parent's architecture.
        architecture: what :func:`materialize` builds (the target without fully dropped layers).
        layers: one :class:`LayerPlan` per layer of ``architecture``.
        hidden_channels: kept residual channels of the parent, ascending.
    """

    parent: Architecture
    architecture: Architecture
    layers: tuple[LayerPlan, ...]
    hidden_channels: tuple[int, ...]

    def masks(self) -> Masks:
        """The equivalent :class:`Masks` over the parent (one :class:`LayerMask` per parent layer)."""
        kept = {lp.parent_index: lp for lp in self.layers}
        layers = []
        for j, spec in enumerate(self.parent.layers):
            lp = kept.get(j)
            heads = _indicator(spec.num_heads, lp.heads) if lp is not None and lp.heads else None
            ffn = _indicator(spec.ffn_width, lp.ffn_channels) if lp is not None and lp.ffn_channels else None
            layers.append(LayerMask(heads=heads, ffn=ffn))
        return Masks(layers=tuple(layers), hidden=_indicator(self.parent.hidden_size, self.hidden_channels))

    def kept(self) -> dict[str, Any]:
        """The kept indices as a JSON-safe record (module doc; :func:`plan_from_kept` reads it):
        ``hidden`` and, per built layer, ``[parent_index, heads, kv_heads, ffn_channels]``, each
        set a hex bitmask over the parent layer's own count (bit ``i``: index ``i`` kept)."""
        layers = []
        for lp in self.layers:
            spec = self.parent.layers[lp.parent_index]
            sets = ((lp.heads, spec.num_heads), (lp.kv_heads, spec.num_kv_heads), (lp.ffn_channels, spec.ffn_width))
            layers.append([lp.parent_index, *(_to_hex(kept, size) for kept, size in sets)])
        return {
            "format": KEPT_FORMAT,
            "hidden": _to_hex(self.hidden_channels, self.parent.hidden_size),
            "layers": layers,
        }


def _to_hex(kept: Sequence[int], size: int) -> str:
    """``kept`` (indices in ``[0, size)``) as a bitmask of ``ceil(size / 4)`` hex digits."""
    return format(sum(1 << i for i in kept), "x").zfill(-(-size // 4))


def _from_hex(text: Any, size: int, where: str) -> tuple[int, ...]:
    """The ascending indices of the hex bitmask ``text`` over ``size`` indices; :class:`ConfigError`
    naming ``where`` for anything else (wrong length, not hex, bits past ``size``)."""
    width = -(-size // 4)
    try:
        value = int(text, 16) if isinstance(text, str) and len(text) == max(width, 1) else None
    except ValueError:
        value = None
    if value is None or value >> size:
        raise ConfigError(
            f"kept indices: {where} must be a bitmask of {max(width, 1)} hex digits over {size}, got {text!r}"
        )
    return tuple(i for i in range(size) if value >> i & 1)


def _indicator(size: int, kept: Sequence[int]) -> torch.Tensor:
    import torch

    mask = torch.zeros(size, dtype=torch.bool)
    mask[list(kept)] = True
    return mask


def _top(scores: torch.Tensor, k: int) -> tuple[int, ...]:
    """Indices of the ``k`` highest scores (:func:`ranked`: ties to the lower index), ascending."""
    return tuple(sorted(ranked(scores)[:k].tolist()))  # tolist: not a Python loop over 0-d tensors


def layer_heads(
    kv_scores: torch.Tensor, head_scores: torch.Tensor, num_kv_heads: int, q_per_kv: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(query heads, KV groups)`` one attention layer keeps for ``num_kv_heads`` groups of ``q_per_kv``
    query heads (both ascending): the highest-scoring KV groups (``kv_scores`` ``(G,)``), and within each
    the highest-scoring of its query heads (``head_scores`` ``(G·r,)``, group-major). The one head rule
    of a dense plan and of a MoE parent's head cut (:func:`~autocompress_opt.prune.experts.head_choice`)."""
    r = head_scores.numel() // kv_scores.numel()
    groups = _top(kv_scores, num_kv_heads)
    by_group = head_scores.view(kv_scores.numel(), r)  # (G, r): query heads of each KV group
    return tuple(g * r + j for g in groups for j in _top(by_group[g], q_per_kv)), groups


def plan_pruning(
    parent: Architecture, importance: Importance, target: Architecture, *, layer_metric: str = "skip_loss"
) -> PrunePlan:
    """Keep, everywhere, the most important parts of ``parent`` that ``target`` has room for.

    ``target`` must be a sub-architecture of ``parent``: same vocabulary, family, tying, biases and
    QK-norm; ``hidden_size`` no larger; at most as many layers; each kept layer's heads in whole KV
    groups of the parent layer's ``head_dim`` (no more KV heads, no more query heads per group) and
    no wider FFN; no sub-block the parent layer lacks. ``target``'s windows are not checked: every
    kept layer takes its parent layer's window (module doc). Raises :class:`ConfigError` naming the
    layer and field otherwise, or when ``importance`` was computed for another architecture.
    """
    mismatch = architecture_mismatch(importance.architecture, parent)
    if mismatch:
        raise ConfigError(f"the importance scores were computed for another architecture ({mismatch})")
    _check_globals(parent, target)
    mapping = _layer_mapping(parent, importance, target, layer_metric)
    plans, specs = [], []
    for t, (spec, p) in enumerate(zip(target.layers, mapping)):
        _check_layer(parent.layers[p], spec, f"target layers[{t}] (parent layer {p})")
        if not spec.is_noop:
            plans.append(_plan_layer(importance, p, parent.layers[p], spec))
            specs.append(replace(spec, window=parent.layers[p].window))  # None without attention
    return PrunePlan(
        parent=parent,
        architecture=replace(target, layers=tuple(specs)),
        layers=tuple(plans),
        hidden_channels=_top(importance.hidden, target.hidden_size),
    )


def plan_from_kept(parent: Architecture, target: Architecture, kept: Mapping[str, Any]) -> PrunePlan:
    """The plan that keeps exactly the indices of ``kept`` (a :meth:`PrunePlan.kept` record) to
    build ``target`` from ``parent``: what :func:`plan_pruning` returned where the record was made,
    with no importance. ``target`` must be a sub-architecture of ``parent`` (as for
    :func:`plan_pruning`) and the record must fit both: one entry per built layer of ``target``,
    parent layers ascending (the same index as the target layer when the target keeps the parent's
    layer count), and per set as many indices as the target layer has, heads in whole kept KV groups.
    Raises :class:`ConfigError` naming the layer and the field that does not fit."""
    if not isinstance(kept, Mapping) or kept.get("format") != KEPT_FORMAT:
        got = kept.get("format") if isinstance(kept, Mapping) else type(kept).__name__
        raise ConfigError(f"kept indices: format must be {KEPT_FORMAT!r}, got {got!r}")
    _check_globals(parent, target)
    built = [(t, spec) for t, spec in enumerate(target.layers) if not spec.is_noop]
    entries = kept.get("layers")
    if not isinstance(entries, list) or len(entries) != len(built):
        n = len(entries) if isinstance(entries, list) else entries
        raise ConfigError(f"kept indices: {n} layers recorded but the target builds {len(built)}")
    plans, specs, last = [], [], -1
    for (t, spec), entry in zip(built, entries):
        p = entry[0] if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], int) else None
        same_depth = target.num_layers == parent.num_layers
        if p is None or not last < p < parent.num_layers or (same_depth and p != t):
            raise ConfigError(
                f"kept indices: layer entry {entry!r} for target layers[{t}] must be [parent_index, heads, kv_heads, "
                f"ffn] with parent layers ascending in [0, {parent.num_layers})"
                + (f" and equal to {t}" if same_depth else "")
            )
        last, where = p, f"target layers[{t}] (parent layer {p})"
        _check_layer(parent.layers[p], spec, where)
        plans.append(_kept_layer(parent.layers[p], spec, p, entry[1:], where))
        specs.append(replace(spec, window=parent.layers[p].window))
    hidden = _from_hex(kept.get("hidden"), parent.hidden_size, "hidden")
    if len(hidden) != target.hidden_size:
        raise ConfigError(f"kept indices: {len(hidden)} hidden channels kept but the target has {target.hidden_size}")
    return PrunePlan(
        parent=parent, architecture=replace(target, layers=tuple(specs)), layers=tuple(plans), hidden_channels=hidden
    )


def _kept_layer(parent: LayerSpec, spec: LayerSpec, p: int, sets: Sequence[Any], where: str) -> LayerPlan:
    """One layer of :func:`plan_from_kept`: its recorded sets decoded and checked against ``spec``."""
    heads = _from_hex(sets[0], parent.num_heads, f"{where} heads")
    groups = _from_hex(sets[1], parent.num_kv_heads, f"{where} kv_heads")
    ffn = _from_hex(sets[2], parent.ffn_width, f"{where} ffn_channels")
    wanted = (spec.num_heads, spec.num_kv_heads) if spec.attention else (0, 0)
    if (len(heads), len(groups)) != wanted:
        raise ConfigError(
            f"kept indices: {where} keeps {len(heads)} heads in {len(groups)} KV groups; "
            f"the target has {wanted[0]} in {wanted[1]}"
        )
    if heads:
        r = parent.num_heads // parent.num_kv_heads
        per_group = [sum(1 for h in heads if h // r == g) for g in groups]
        if any(h // r not in groups for h in heads) or len(set(per_group)) != 1:
            raise ConfigError(
                f"kept indices: {where} heads {list(heads)} are not {len(heads) // len(groups)} in each kept KV "
                f"group {list(groups)} (group g holds heads {r}g..{r}g+{r - 1})"
            )
    if len(ffn) != (spec.ffn_width if spec.ffn else 0):
        raise ConfigError(
            f"kept indices: {where} keeps {len(ffn)} FFN channels; the target has {spec.ffn_width if spec.ffn else 0}"
        )
    return LayerPlan(parent_index=p, heads=heads, kv_heads=groups, ffn_channels=ffn)


def identity_plan(arch: Architecture) -> PrunePlan:
    """The plan that keeps everything of ``arch`` (fully dropped layers left out)."""
    layers = tuple(
        LayerPlan(j, tuple(range(s.num_heads)), tuple(range(s.num_kv_heads)), tuple(range(s.ffn_width)))
        for j, s in enumerate(arch.layers)
        if not s.is_noop
    )
    return PrunePlan(
        parent=arch, architecture=arch.active(), layers=layers, hidden_channels=tuple(range(arch.hidden_size))
    )


_SAME_FIELDS = ("vocab_size", "family", "tie_embeddings", "qkv_bias", "o_bias", "mlp_bias", "qk_norm")


def _check_globals(parent: Architecture, target: Architecture) -> None:
    prefix = "target is not a sub-architecture of the parent:"
    for name in _SAME_FIELDS:
        if getattr(target, name) != getattr(parent, name):
            raise ConfigError(f"{prefix} {name}={getattr(target, name)!r} but the parent has {getattr(parent, name)!r}")
    if target.hidden_size > parent.hidden_size:
        raise ConfigError(f"{prefix} hidden_size={target.hidden_size} exceeds the parent's {parent.hidden_size}")
    if target.num_layers > parent.num_layers:
        raise ConfigError(f"{prefix} {target.num_layers} layers but the parent has only {parent.num_layers}")


def _check_layer(parent: LayerSpec, spec: LayerSpec, where: str) -> None:
    problem = _attention_problem(parent, spec) if spec.attention else None
    if spec.ffn and not parent.ffn:
        problem = problem or "has ffn=True but the parent layer has no FFN"
    elif spec.ffn and spec.ffn_width > parent.ffn_width:
        problem = problem or f"ffn_width={spec.ffn_width} exceeds the parent's {parent.ffn_width}"
    if problem:
        raise ConfigError(f"target is not a sub-architecture of the parent: {where} {problem}")


def _attention_problem(parent: LayerSpec, spec: LayerSpec) -> str | None:
    """Why ``spec``'s attention cannot be cut from ``parent``'s, or None."""
    if not parent.attention:
        return "has attention=True but the parent layer has no attention"
    if spec.head_dim != parent.head_dim:
        return f"head_dim={spec.head_dim} differs from the parent's {parent.head_dim} (heads are pruned whole)"
    if spec.num_kv_heads > parent.num_kv_heads:
        return f"num_kv_heads={spec.num_kv_heads} exceeds the parent's {parent.num_kv_heads}"
    group, parent_group = spec.num_heads // spec.num_kv_heads, parent.num_heads // parent.num_kv_heads
    if group > parent_group:
        return (
            f"num_heads={spec.num_heads} is {group} query heads per KV head; the parent has {parent_group} "
            f"(valid num_heads: multiples of num_kv_heads up to {spec.num_kv_heads * parent_group})"
        )
    return None


def _layer_mapping(parent: Architecture, importance: Importance, target: Architecture, metric: str) -> list[int]:
    """Parent layer index of each target layer: identity, or the most important layers in order."""
    if target.num_layers == parent.num_layers:
        return list(range(parent.num_layers))
    return sorted(importance.layer_order(metric)[: target.num_layers])


def _plan_layer(importance: Importance, p: int, parent: LayerSpec, spec: LayerSpec) -> LayerPlan:
    heads: tuple[int, ...] = ()
    groups: tuple[int, ...] = ()
    if spec.attention:
        kv_scores, head_scores = importance.kv_groups[p], importance.heads[p]
        assert kv_scores is not None and head_scores is not None  # _check_layer: the parent layer attends
        heads, groups = layer_heads(kv_scores, head_scores, spec.num_kv_heads, spec.num_heads // spec.num_kv_heads)
    ffn_scores = importance.ffn[p]
    ffn = _top(ffn_scores, spec.ffn_width) if spec.ffn and ffn_scores is not None else ()
    return LayerPlan(parent_index=p, heads=heads, kv_heads=groups, ffn_channels=ffn)
