"""The kept experts of a mixture-of-experts child as a small JSON record, and back: what a weights-mode
MoE trial stores (``kept``) so that an export cuts exactly the experts and expert channels it measured
(:func:`~autocompress_opt.prune.experts.export_experts`), as :meth:`~autocompress_opt.prune.plan.PrunePlan.kept`
does for dense parents.

Record (:data:`EXPERT_KEPT_FORMAT`)::

    {"format": "autocompress-kept-experts/1", "experts_per_token": k,
     "layers": [[parent_layer, experts, [channels of each kept expert, ascending expert order]], ...]}

one entry per MoE layer; ``experts`` a hex bitmask over the layer's routed experts and each channel
set one over the expert's width (bit ``i``: index ``i`` kept; :mod:`autocompress_opt.prune.plan`'s
encoding). Everything else of the parent (attention, dense FFNs, hidden channels, layers) is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.masking import Masks
from autocompress_opt.prune.plan import _from_hex, _to_hex

__all__ = ["EXPERT_KEPT_FORMAT", "expert_kept", "is_expert_kept", "masks_from_expert_kept"]

EXPERT_KEPT_FORMAT = "autocompress-kept-experts/1"


def is_expert_kept(kept: Mapping[str, Any] | None) -> bool:
    """Whether ``kept`` is an expert record (not a dense :data:`~autocompress_opt.prune.plan.KEPT_FORMAT` one)."""
    return isinstance(kept, Mapping) and kept.get("format") == EXPERT_KEPT_FORMAT


def expert_kept(masks: Masks, parent: Architecture) -> dict[str, Any]:
    """The record of ``masks``'s kept experts and channels (module doc). Raises :class:`ConfigError`
    when a MoE layer's masks have no experts or top-``k``, or the layers' top-``k`` differ."""
    import torch

    layers, ks = [], set()
    for i, (spec, mask) in enumerate(zip(parent.layers, masks.layers)):
        if spec.moe is None:
            continue
        if mask.experts is None or mask.experts_per_token is None:
            raise ConfigError(f"masks.layers[{i}] has no kept experts or top-k to record")
        kept = torch.nonzero(mask.experts.bool()).flatten().tolist()
        ffn = (
            mask.expert_ffn if mask.expert_ffn is not None else torch.ones(spec.moe.num_experts, spec.moe.expert_width)
        )
        channels = [_to_hex(torch.nonzero(ffn[e].bool()).flatten().tolist(), spec.moe.expert_width) for e in kept]
        layers.append([i, _to_hex(kept, spec.moe.num_experts), channels])
        ks.add(int(mask.experts_per_token))
    if len(ks) != 1:
        raise ConfigError(f"the MoE layers route to different top-k {sorted(ks)}; a plain config has one")
    return {"format": EXPERT_KEPT_FORMAT, "experts_per_token": ks.pop(), "layers": layers}


def masks_from_expert_kept(parent: Architecture, kept: Mapping[str, Any]) -> Masks:
    """The :class:`Masks` over ``parent`` a record describes; :class:`ConfigError` naming the bad
    entry for a record of another format or parent (wrong layers, bitmasks or counts)."""
    import torch

    if not is_expert_kept(kept):
        raise ConfigError(f"kept record format {kept.get('format')!r} is not {EXPERT_KEPT_FORMAT!r}")
    moe = [i for i, spec in enumerate(parent.layers) if spec.moe is not None]
    entries = kept.get("layers")
    if not isinstance(entries, list) or [e[0] if isinstance(e, list) and e else None for e in entries] != moe:
        raise ConfigError(f"kept record: layers must list the parent's MoE layers {moe} in order")
    k = kept.get("experts_per_token")
    layers = list(Masks.ones(parent).layers)
    for i, experts_hex, channel_hexes in entries:
        spec = parent.layers[i].moe
        assert spec is not None
        experts = _from_hex(experts_hex, spec.num_experts, f"layers[{i}] experts")
        if not isinstance(k, int) or not 1 <= k <= len(experts):
            raise ConfigError(f"kept record: experts_per_token={k!r} must be an int in 1..{len(experts)}")
        if not isinstance(channel_hexes, list) or len(channel_hexes) != len(experts):
            raise ConfigError(f"kept record: layers[{i}] needs one channel set per kept expert ({len(experts)})")
        keep = torch.zeros(spec.num_experts, dtype=torch.bool)
        ffn = torch.zeros(spec.num_experts, spec.expert_width, dtype=torch.bool)
        for e, text in zip(experts, channel_hexes):
            keep[e] = True
            ffn[e, list(_from_hex(text, spec.expert_width, f"layers[{i}] expert {e} channels"))] = True
        layers[i] = replace(layers[i], experts=keep, expert_ffn=ffn, experts_per_token=k)
    return replace(Masks.ones(parent), layers=tuple(layers))
