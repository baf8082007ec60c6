"""Mamba-2 head pruning of a hybrid parent (Nemotron-H): keep the most active SSM heads, the same
number in every group, and cut the mixer's tensors to them.

Layout of one mixer (transformers' ``NemotronHMamba2Mixer``; ``H`` heads of ``P`` channels, inner width
``I = H·P``, ``G`` groups of state size ``N``, head ``h`` in group ``h // (H / G)``):

* ``in_proj`` rows ``(2I + 2GN + H, D)``: ``z`` (the gate, ``0..I-1``), then the convolution's input
  ``x`` (``I..2I-1``), ``B`` and ``C`` (``2GN`` rows), then ``dt`` (``H`` rows, one per head);
* ``conv1d`` (depthwise) over ``x``, ``B``, ``C``: ``(I + 2GN, 1, K)``;
* ``A_log``, ``D``, ``dt_bias`` ``(H,)``; the gated RMSNorm's weight ``(I,)``, one statistic per group
  of ``I / G`` channels; ``out_proj`` ``(D, I)``.

Head ``h`` owns channels ``h·P .. h·P + P - 1`` of ``z``, ``x``, the norm and ``out_proj``'s input, and
entry ``h`` of ``dt``, ``A_log``, ``D``, ``dt_bias``; ``B`` and ``C`` belong to the groups, which are all
kept. The scan treats heads independently, so removing heads is exact when each group keeps the same
number ``H' / G``: the sliced mixer's groups are then the parent's groups, each holding its kept heads,
and its norm's statistic runs over their channels, which is what the masked parent's norm hook computes
(:mod:`autocompress_opt.prune.masking`). Unequal groups have no plain config and are refused here.

Used by :mod:`autocompress_opt.prune.experts`, whose :func:`~autocompress_opt.prune.experts.expert_masks`
and :func:`~autocompress_opt.prune.experts.slice_experts` take the ``mamba_heads`` choice.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import LayerParts
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.prune.masking import LayerMask

__all__ = ["mamba_layer_mask", "slice_mamba_state", "uniform_mamba_heads"]


def mamba_layer_mask(imp: Importance, i: int, p: LayerParts, mask: LayerMask, heads: int) -> LayerMask:
    """``mask`` of Mamba-2 layer ``i`` keeping ``heads`` SSM heads: in each of the mixer's ``G`` groups the
    ``heads / G`` of highest ``imp.mamba_heads[i]`` (ties: the lower index). Raises :class:`ConfigError`
    when ``heads`` is not a multiple of ``G`` in ``G..H`` or the scores have no Mamba-2 entry for the layer."""
    import torch

    scores = imp.mamba_heads[i]
    if scores is None:
        raise ConfigError(f"the importance scores have no Mamba-2 head scores for layer {i}")
    total, groups = int(p.mamba.num_heads), int(p.mamba.n_groups)
    if heads % groups or not groups <= heads <= total:
        valid = ", ".join(str(n) for n in range(groups, total + 1, groups))
        raise ConfigError(
            f"mamba_heads={heads} does not fit layer {i}'s {total} heads in {groups} groups (each group keeps "
            f"the same number); valid: {valid}"
        )
    per_group, size = heads // groups, total // groups
    keep = torch.zeros(total, dtype=torch.bool)
    for g in range(groups):
        keep[g * size + ranked(scores[g * size : (g + 1) * size])[:per_group]] = True
    return replace(mask, mamba_heads=keep)


def uniform_mamba_heads(parts: list[LayerParts], masks_layers: tuple[LayerMask, ...]) -> int | None:
    """The one number of heads every Mamba-2 layer keeps (None without Mamba-2 layers). Raises
    :class:`ConfigError` when a mixer is removed, a layer keeps unequal numbers in its groups, or
    layers keep different numbers: a plain config has one ``mamba_num_heads``."""
    seen: dict[int, list[int]] = {}
    for i, (p, m) in enumerate(zip(parts, masks_layers)):
        if p.mamba is None:
            continue
        if m.mamba_heads is None:
            raise ConfigError(f"cannot remove the Mamba-2 mixer of layer {i} here; keep at least one head per group")
        groups = int(p.mamba.n_groups)
        per_group = m.mamba_heads.bool().reshape(groups, -1).sum(-1).tolist()  # (G,)
        if len(set(per_group)) != 1:
            raise ConfigError(
                f"masks.layers[{i}].mamba_heads keeps {per_group} heads in the layer's {groups} groups; the sliced "
                "mixer needs the same number in every group"
            )
        seen.setdefault(groups * per_group[0], []).append(i)
    if len(seen) > 1:
        found = "; ".join(f"layers {ls}: {h} heads" for h, ls in seen.items())
        raise ConfigError(f"the Mamba-2 layers keep different numbers of heads ({found}); a plain config has one")
    return next(iter(seen), None)


def slice_mamba_state(p: LayerParts, mask: LayerMask, state: dict[str, Any], names: dict[int, str]) -> None:
    """Cut Mamba-2 layer ``p``'s tensors in ``state`` (a state dict, keyed as ``names[id(param)]``) to
    the heads ``mask.mamba_heads`` keeps (module docstring's layout); copies, never views."""
    import torch

    mixer = p.mamba
    if mask.mamba_heads is None or bool(mask.mamba_heads.all()):
        return
    on = mixer.in_proj.weight.device
    inner, head_dim = int(mixer.intermediate_size), int(mixer.head_dim)
    bc = 2 * int(mixer.n_groups) * int(mixer.ssm_state_size)
    heads = torch.nonzero(mask.mamba_heads.bool()).flatten().to(on)  # (H',) ascending
    channels = (heads[:, None] * head_dim + torch.arange(head_dim, device=on)).flatten()  # (H'·P,)
    conv = torch.cat([channels, inner + torch.arange(bc, device=on)])  # x of the kept heads, all of B and C
    rows = torch.cat([channels, inner + conv, 2 * inner + bc + heads])  # z, xBC, dt

    def cut(param: Any, index: Any, dim: int = 0) -> None:
        if param is not None:
            state[names[id(param)]] = param.detach().index_select(dim, index).clone()

    cut(mixer.in_proj.weight, rows)
    cut(mixer.in_proj.bias, rows)
    cut(mixer.conv1d.weight, conv)
    cut(mixer.conv1d.bias, conv)
    for param in (mixer.A_log, mixer.D, mixer.dt_bias):
        cut(param, heads)
    cut(mixer.norm.weight, channels)
    cut(mixer.out_proj.weight, channels, dim=1)
