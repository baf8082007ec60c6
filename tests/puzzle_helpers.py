"""Masks whose MoE layers keep different sizes, for the Nemotron-H Puzzle tests (prune and engine)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autocompress_opt.prune.experts import expert_masks
from autocompress_opt.prune.importance import Importance
from autocompress_opt.prune.masking import Masks


def per_layer_masks(
    model: Any, importance: Importance, base: dict[str, int], layers: dict[int, dict[str, int]]
) -> Masks:
    """:func:`expert_masks` of the point ``base`` in every layer, except layer ``i`` of ``layers``, which
    takes the point ``base | layers[i]`` (e.g. its own ``expert_width`` and ``experts_per_token``)."""
    masks = expert_masks(model, importance, base)
    kept = list(masks.layers)
    for i, point in layers.items():
        kept[i] = expert_masks(model, importance, {**base, **point}).layers[i]
    return replace(masks, layers=tuple(kept))
