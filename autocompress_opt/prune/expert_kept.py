"""The kept units of a mixture-of-experts or hybrid child as a small JSON record, and back: what a
weights-mode MoE trial stores (``kept``) so that an export cuts exactly the experts, channels and
Mamba-2 heads it measured (:func:`~autocompress_opt.prune.experts.export_experts`), as
:meth:`~autocompress_opt.prune.plan.PrunePlan.kept` does for dense parents.

Record (:data:`EXPERT_KEPT_FORMAT`)::

    {"format": "autocompress-kept-experts/2", "experts_per_token": k,
     "layers": [[parent_layer, experts, [channels of each kept expert, ascending expert order],
                 shared channels (only where the layer has a shared expert)], ...],
     "mamba": [[parent_layer, heads], ...]}   (only where the parent has Mamba-2 layers)

one ``layers`` entry per MoE layer and one ``mamba`` entry per Mamba-2 layer; ``experts`` a hex
bitmask over the layer's routed experts, each channel set one over the expert's (or the shared
expert's) width, ``heads`` one over the mixer's SSM heads (bit ``i``: index ``i`` kept;
:mod:`autocompress_opt.prune.plan`'s encoding). Everything else of the parent (attention, dense FFNs,
hidden channels, layers) is kept. Version 1 records (no shared channels or heads: those all kept) are
still read.

A child whose MoE layers route to different top-``k`` (the per-layer Puzzle form, issue 43; each
layer's expert width is already its channel sets) is written as version 3
(:data:`EXPERT_KEPT_PER_LAYER`): ``experts_per_token`` is then a list, one ``k`` per ``layers``
entry; a uniform child keeps writing version 2.

A child cut in its dense sizes too (a trial whose point keeps fewer layers, attention heads or
residual channels than the parent: :func:`~autocompress_opt.prune.experts.slice_layers`, then
:func:`~autocompress_opt.prune.experts.slice_heads`, then :func:`~autocompress_opt.prune.experts.slice_hidden`)
is written as version 4 (:data:`EXPERT_KEPT_DEPTH`): ``kept_layers`` lists the parent layers kept
(ascending; absent: all), ``kept_heads`` the query heads each attention layer of those keeps
(``[[layer, heads], ...]``, ``layer`` counting the kept layers, ``heads`` the ascending query-head
indices; absent: all), ``kept_hidden`` the ascending residual channels kept (absent: all), and every
other entry is the record of
the model those make (its ``layers`` / ``mamba`` indices count the kept layers only);
``experts_per_token`` is one ``k`` or a list as above. :func:`kept_layers` and :func:`kept_model`
read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.masking import Masks
from autocompress_opt.prune.plan import _from_hex, _indicator, _to_hex

__all__ = [
    "EXPERT_KEPT_DEPTH",
    "EXPERT_KEPT_FORMAT",
    "expert_kept",
    "is_expert_kept",
    "kept_heads",
    "kept_hidden",
    "kept_layers",
    "kept_model",
    "masks_from_expert_kept",
]

EXPERT_KEPT_FORMAT = "autocompress-kept-experts/2"
EXPERT_KEPT_PER_LAYER = "autocompress-kept-experts/3"  # experts_per_token: one per MoE layer
EXPERT_KEPT_DEPTH = "autocompress-kept-experts/4"  # kept_layers / _heads / _hidden: the dense cut before the experts
# The formats masks_from_expert_kept reads: /1 had no shared channels or Mamba-2 heads.
_READABLE = ("autocompress-kept-experts/1", EXPERT_KEPT_FORMAT, EXPERT_KEPT_PER_LAYER, EXPERT_KEPT_DEPTH)


def is_expert_kept(kept: Mapping[str, Any] | None) -> bool:
    """Whether ``kept`` is an expert record (not a dense :data:`~autocompress_opt.prune.plan.KEPT_FORMAT` one)."""
    return isinstance(kept, Mapping) and kept.get("format") in _READABLE


def _bits(mask: Any) -> list[int]:
    import torch

    return torch.nonzero(mask.bool()).flatten().tolist()


def expert_kept(
    masks: Masks,
    parent: Architecture,
    layers_kept: Sequence[int] | None = None,
    heads_kept: Mapping[int, Sequence[int]] | None = None,
    hidden_kept: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The record of ``masks``'s kept experts, channels and Mamba-2 heads (module doc; version 3 when the
    MoE layers' top-``k`` differ). ``layers_kept``: the grandparent's layers that ``parent`` is made of
    (:func:`~autocompress_opt.prune.experts.slice_layers`), None when it is the whole model;
    ``heads_kept``: the query heads each attention layer of those keeps
    (:func:`~autocompress_opt.prune.experts.slice_heads`), None for all; ``hidden_kept``: the residual
    channels kept (:func:`~autocompress_opt.prune.experts.slice_hidden`), None for all (any: version 4).
    Raises :class:`ConfigError` when a MoE layer's masks have no experts or top-``k``, or a Mamba-2
    layer's mixer is removed."""
    import torch

    layers, mamba, ks = [], [], []
    for i, (spec, mask) in enumerate(zip(parent.layers, masks.layers)):
        if spec.mamba is not None:
            if mask.mamba_heads is None:
                raise ConfigError(f"masks.layers[{i}] removes the Mamba-2 mixer; a kept record keeps every layer")
            mamba.append([i, _to_hex(_bits(mask.mamba_heads), spec.mamba.num_heads)])
        if spec.moe is None:
            continue
        moe = spec.moe
        if mask.experts is None or mask.experts_per_token is None:
            raise ConfigError(f"masks.layers[{i}] has no kept experts or top-k to record")
        kept = _bits(mask.experts)
        ffn = mask.expert_ffn if mask.expert_ffn is not None else torch.ones(moe.num_experts, moe.expert_width)
        entry: list[Any] = [i, _to_hex(kept, moe.num_experts), [_to_hex(_bits(ffn[e]), moe.expert_width) for e in kept]]
        if moe.shared_width:
            shared = mask.shared_ffn if mask.shared_ffn is not None else torch.ones(moe.shared_width)
            entry.append(_to_hex(_bits(shared), moe.shared_width))
        layers.append(entry)
        ks.append(int(mask.experts_per_token))
    uniform = len(set(ks)) == 1
    record: dict[str, Any] = {
        "format": EXPERT_KEPT_FORMAT if uniform else EXPERT_KEPT_PER_LAYER,
        "experts_per_token": ks[0] if uniform else ks,
        "layers": layers,
    }
    dense: dict[str, Any] = {}
    if layers_kept is not None:
        if len(layers_kept) != len(parent.layers) or list(layers_kept) != sorted(set(layers_kept)):
            raise ConfigError(
                f"layers_kept {list(layers_kept)}: one ascending parent index per layer of the model "
                f"({len(parent.layers)})"
            )
        dense["kept_layers"] = [int(i) for i in layers_kept]
    if heads_kept is not None:  # indices over the layer's query heads before the cut
        dense["kept_heads"] = [[int(i), sorted(int(h) for h in hs)] for i, hs in sorted(heads_kept.items())]
    if hidden_kept is not None:
        dense["kept_hidden"] = sorted(int(c) for c in hidden_kept)
    if dense:
        rest = {k: v for k, v in record.items() if k != "format"}
        record = {"format": EXPERT_KEPT_DEPTH, **dense, **rest}
    if mamba:
        record["mamba"] = mamba
    return record


def kept_layers(kept: Mapping[str, Any], num_layers: int) -> list[int] | None:
    """The parent layers a record's child keeps (version 4's ``kept_layers``), None when it keeps every
    one; :class:`ConfigError` for a list that is not ascending indices within ``0..num_layers-1``."""
    if kept.get("format") != EXPERT_KEPT_DEPTH or "kept_layers" not in kept:
        return None
    layers: Any = kept.get("kept_layers")
    if not _ascending(layers, num_layers):
        raise ConfigError(
            f"kept record: kept_layers {layers!r} must be ascending, distinct parent layers in 0..{num_layers - 1}"
        )
    return list(layers)


def _ascending(values: Any, n: int) -> bool:
    """Whether ``values`` is a non-empty list of ascending, distinct ints in ``0..n-1``."""
    return (
        isinstance(values, list)
        and bool(values)
        and all(isinstance(i, int) and 0 <= i < n for i in values)
        and values == sorted(set(values))
    )


def kept_heads(kept: Mapping[str, Any]) -> dict[int, list[int]] | None:
    """The query heads each attention layer of a record's child keeps (version 4's ``kept_heads``, its
    layers counted after ``kept_layers``), None when every head is kept; :class:`ConfigError` for
    entries that are not ``[layer, [heads...]]``."""
    if kept.get("format") != EXPERT_KEPT_DEPTH or "kept_heads" not in kept:
        return None
    entries = kept["kept_heads"]
    if not isinstance(entries, list) or not all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], int) and isinstance(e[1], list) and e[1]
        for e in entries
    ):
        raise ConfigError(f"kept record: kept_heads {entries!r} must be [[layer, [query heads...]], ...]")
    return {int(i): [int(h) for h in hs] for i, hs in entries}


def kept_hidden(kept: Mapping[str, Any], hidden_size: int) -> list[int] | None:
    """The residual channels a record's child keeps (version 4's ``kept_hidden``), None when it keeps
    every one; :class:`ConfigError` for a list that is not ascending channels within ``0..hidden_size-1``."""
    if kept.get("format") != EXPERT_KEPT_DEPTH or "kept_hidden" not in kept:
        return None
    channels = kept["kept_hidden"]
    if not _ascending(channels, hidden_size):
        raise ConfigError(
            f"kept record: kept_hidden must be ascending, distinct channels in 0..{hidden_size - 1}; "
            f"got {str(channels)[:80]}"
        )
    return list(channels)


def kept_model(model: Any, kept: Mapping[str, Any]) -> tuple[Any, Masks]:
    """The model a record's masks apply to, and those masks: ``model`` itself, or for a version 4 record
    the model of its ``kept_layers``, ``kept_heads`` and ``kept_hidden``
    (:func:`~autocompress_opt.prune.experts.slice_layers`, :func:`~autocompress_opt.prune.experts.slice_heads`,
    :func:`~autocompress_opt.prune.experts.slice_hidden`; a copy).
    :func:`~autocompress_opt.prune.experts.slice_experts` of the pair is the trial's child, and
    :func:`~autocompress_opt.prune.masking.apply_masks` of it computes that child's logits."""
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.prune.experts import slice_heads, slice_hidden, slice_layers

    adapter = moe_adapter(model)
    layers = kept_layers(kept, len(adapter.layers(model)))
    if layers is not None:
        model = slice_layers(model, layers, adapter=adapter)
    heads = kept_heads(kept)
    if heads is not None:
        model = slice_heads(model, heads, adapter=adapter)
    hidden = kept_hidden(kept, adapter.embedding(model).embedding_dim)
    if hidden is not None:
        model = slice_hidden(model, hidden, adapter=adapter)
    return model, masks_from_expert_kept(adapter.architecture(model), kept)


def masks_from_expert_kept(parent: Architecture, kept: Mapping[str, Any]) -> Masks:
    """The :class:`Masks` over ``parent`` a record describes (a version 4 record: over the model its
    ``kept_layers`` make, :func:`kept_layers`); :class:`ConfigError` naming the bad entry for a record
    of another format or parent (wrong layers, bitmasks or counts)."""
    import torch

    if not is_expert_kept(kept):
        raise ConfigError(f"kept record format {kept.get('format')!r} is not one of {', '.join(_READABLE)}")
    moe = [i for i, spec in enumerate(parent.layers) if spec.moe is not None]
    entries = kept.get("layers")
    if not isinstance(entries, list) or [e[0] if isinstance(e, list) and e else None for e in entries] != moe:
        raise ConfigError(f"kept record: layers must list the parent's MoE layers {moe} in order")
    ks = kept.get("experts_per_token")
    if kept.get("format") == EXPERT_KEPT_PER_LAYER or (
        kept.get("format") == EXPERT_KEPT_DEPTH and isinstance(ks, list)
    ):
        if not isinstance(ks, list) or len(ks) != len(entries):
            raise ConfigError(f"kept record: experts_per_token must list one top-k per MoE layer ({len(entries)})")
    else:
        ks = [ks] * len(entries)
    layers = list(Masks.ones(parent).layers)
    for (i, experts_hex, channel_hexes, *rest), k in zip(entries, ks):
        spec = parent.layers[i].moe
        assert spec is not None
        experts = _from_hex(experts_hex, spec.num_experts, f"layers[{i}] experts")
        if not isinstance(k, int) or not 1 <= k <= len(experts):
            raise ConfigError(f"kept record: experts_per_token={k!r} must be an int in 1..{len(experts)}")
        if not isinstance(channel_hexes, list) or len(channel_hexes) != len(experts):
            raise ConfigError(f"kept record: layers[{i}] needs one channel set per kept expert ({len(experts)})")
        if len(rest) > (1 if spec.shared_width else 0):
            raise ConfigError(
                f"kept record: layers[{i}] has {len(rest)} entries after its channels; the layer has "
                f"{'one shared expert' if spec.shared_width else 'no shared expert'}"
            )
        keep = torch.zeros(spec.num_experts, dtype=torch.bool)
        ffn = torch.zeros(spec.num_experts, spec.expert_width, dtype=torch.bool)
        for e, text in zip(experts, channel_hexes):
            keep[e] = True
            ffn[e, list(_from_hex(text, spec.expert_width, f"layers[{i}] expert {e} channels"))] = True
        layers[i] = replace(layers[i], experts=keep, expert_ffn=ffn, experts_per_token=k)
        if rest:
            shared = _indicator(
                spec.shared_width, _from_hex(rest[0], spec.shared_width, f"layers[{i}] shared channels")
            )
            layers[i] = replace(layers[i], shared_ffn=shared)
    _read_mamba(parent, kept.get("mamba"), layers)
    return replace(Masks.ones(parent), layers=tuple(layers))


def _read_mamba(parent: Architecture, entries: Any, layers: list[Any]) -> None:
    """Set the Mamba-2 head masks of ``layers`` from a record's ``mamba`` entries (absent: all kept)."""
    if entries is None:
        return
    mamba = [i for i, spec in enumerate(parent.layers) if spec.mamba is not None]
    if (
        not isinstance(entries, list)
        or [e[0] if isinstance(e, list) and len(e) == 2 else None for e in entries] != mamba
    ):
        raise ConfigError(
            f"kept record: mamba must list the parent's Mamba-2 layers {mamba} in order, [layer, heads] each"
        )
    for i, heads_hex in entries:
        spec = parent.layers[i].mamba
        assert spec is not None
        heads = _from_hex(heads_hex, spec.num_heads, f"mamba layer {i} heads")
        if not heads:
            raise ConfigError(f"kept record: mamba layer {i} keeps no head")
        layers[i] = replace(layers[i], mamba_heads=_indicator(spec.num_heads, heads))
