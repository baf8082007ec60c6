"""Helpers shared by the masking, slicing and inner-search tests."""

from __future__ import annotations

import torch

from autocompress_opt.search.inner.relaxation import ParentMasks

# Gemma 3 renormalises each sub-block's output (post-norms), so a sub-block whose float32 output
# nearly cancels has its rounding error scaled up to unit RMS with it: masked and sliced models
# then agree to ~1e-5 relative instead of ~1e-6. With every norm computed in float64 the two agree
# to 1e-14 on the same targets (checked by hand), so the looser tolerance hides no slicing error.
TOLERANCE: dict[str, dict[str, float]] = {"gemma3_text": dict(atol=2e-4, rtol=2e-5)}


def randomise(masks: ParentMasks, seed: int, gate_scale: float = 4.0) -> ParentMasks:
    """Random widths anywhere in their range and confident gates (|log α| = gate_scale)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (masks.kv_keep, masks.q_keep, masks.ffn_keep):
            p.copy_(torch.rand(p.shape, generator=gen) * 1.2 - 0.1)
        for p in (masks.attn_log_alpha, masks.ffn_log_alpha):
            p.copy_(torch.where(torch.rand(p.shape, generator=gen) < 0.75, gate_scale, -gate_scale))
    masks.clamp_()
    return masks
