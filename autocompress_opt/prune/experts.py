"""Expert pruning of a mixture-of-experts parent: keep the most used routed experts, the most active
channels of each, and a smaller top-``k``; mask the parent, or slice it into the family's plain model.

Three steps, as for dense parents (:mod:`autocompress_opt.prune.slicing`), for the families the experts
path handles (:data:`~autocompress_opt.hf.adapters.MOE_ADAPTERS`: Qwen3-MoE):

1. :func:`expert_masks` — parent + :class:`~autocompress_opt.prune.importance.Importance` + a point of
   the sparse axes (``num_experts``, ``experts_per_token``, ``expert_width``: the keys of the plan-mode
   search's MoE choices) → :class:`~autocompress_opt.prune.masking.Masks`. Per MoE layer the kept experts
   are the ``num_experts`` with the highest ``expert_frequency`` (ties: higher ``expert_output``, then
   the lower index), and each keeps its ``expert_width`` channels of highest ``expert_ffn``.
2. :func:`~autocompress_opt.prune.masking.apply_masks` — the parent computing them (dropped experts'
   router logits ``-inf`` before the top-``k``, masked channels zeroed).
3. :func:`slice_experts` / :func:`export_experts` — the plain model of the family with the stacked
   expert tensors and the router rows cut to the kept experts and channels, and ``num_experts``,
   ``num_experts_per_tok``, ``moe_intermediate_size`` set; its logits equal the masked parent's
   (tested, float32). A plain config has one size per layer kind, so the masks must keep the same
   number of experts, channels per expert and top-``k`` in every MoE layer.

Attention heads, dense FFN channels, hidden channels and layers of a MoE parent are not pruned here yet
(issue 30): :func:`slice_experts` refuses masks that prune them.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError, check_int, suggest
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, moe_adapter
from autocompress_opt.prune.export import OutputExistsError
from autocompress_opt.prune.importance import Importance, ranked
from autocompress_opt.prune.masking import LayerMask, Masks

__all__ = ["EXPERT_CHOICES", "expert_masks", "export_experts", "slice_experts"]

# The sparse axes this module prunes (named as the plan-mode search's MoE choices).
EXPERT_CHOICES: tuple[str, ...] = ("num_experts", "experts_per_token", "expert_width")
# The Qwen3-MoE config keys the three sizes are written to (transformers' Qwen3MoeConfig).
_CONFIG_KEYS = {
    "num_experts": "num_experts",
    "experts_per_token": "num_experts_per_tok",
    "expert_width": "moe_intermediate_size",
}


def expert_masks(model: Any, importance: Importance, point: Mapping[str, int]) -> Masks:
    """Masks that keep, in every MoE layer of ``model``, the point's experts, channels and top-``k``
    (module docstring); every attention head, dense FFN channel and hidden channel is kept.

    ``point`` maps a subset of :data:`EXPERT_CHOICES` to sizes; an absent one stays the parent's.
    Raises :class:`ConfigError` for an unknown key (with a suggestion), a size outside
    ``1..parent size``, ``experts_per_token`` above the experts kept, or scores of another model.
    """
    adapter = moe_adapter(model)
    parts = adapter.all_layer_parts(model)
    moe = [p for p in parts if p.moe is not None]
    if not moe:
        raise ConfigError("the model has no mixture-of-experts layer: nothing for expert_masks to prune")
    sizes = _point_sizes(point, moe[0])
    arch = adapter.architecture(model)
    if importance.architecture.layers != arch.layers:
        raise ConfigError("the importance scores were computed for another architecture than this model's")
    layers = []
    base = Masks.ones(arch)
    for i, (p, mask) in enumerate(zip(parts, base.layers)):
        layers.append(mask if p.moe is None else _layer_mask(importance, i, p, mask, sizes))
    return replace(base, layers=tuple(layers))


def _point_sizes(point: Mapping[str, int], p: LayerParts) -> dict[str, int]:
    for key in point:
        if key not in EXPERT_CHOICES:
            raise ConfigError(
                f"unknown expert choice {key!r}{suggest(key, EXPERT_CHOICES)}; valid: {', '.join(EXPERT_CHOICES)}"
            )
    limits = {"num_experts": p.num_experts, "experts_per_token": int(p.router.top_k), "expert_width": p.expert_width}
    sizes = {key: check_int(point.get(key, limits[key]), key, 1, maximum=limits[key]) for key in EXPERT_CHOICES}
    if sizes["experts_per_token"] > sizes["num_experts"]:
        raise ConfigError(
            f"experts_per_token={sizes['experts_per_token']} exceeds the {sizes['num_experts']} experts kept "
            f"(num_experts={sizes['num_experts']}); valid: 1..{sizes['num_experts']}"
        )
    return sizes


def _layer_mask(imp: Importance, i: int, p: LayerParts, mask: LayerMask, sizes: dict[str, int]) -> LayerMask:
    import torch

    frequency, output, channels = imp.expert_frequency[i], imp.expert_output[i], imp.expert_ffn[i]
    if frequency is None or output is None or channels is None:
        raise ConfigError(f"the importance scores have no expert scores for MoE layer {i}")
    by_output = ranked(output)  # most used first; ties: larger output, then the lower index
    order = by_output[torch.argsort(frequency[by_output], descending=True, stable=True)]
    experts = torch.zeros(p.num_experts, dtype=torch.bool)
    experts[order[: sizes["num_experts"]]] = True
    expert_ffn = torch.zeros(p.num_experts, p.expert_width, dtype=torch.bool)
    for e in range(p.num_experts):
        expert_ffn[e, ranked(channels[e])[: sizes["expert_width"]]] = True
    return replace(mask, experts=experts, expert_ffn=expert_ffn, experts_per_token=sizes["experts_per_token"])


# ------------------------------------------------------------------------------------ slicing
def slice_experts(model: Any, masks: Masks, *, adapter: FamilyAdapter | None = None) -> Any:
    """The family's plain model holding ``model``'s weights with the experts, expert channels and top-``k``
    of ``masks`` (copied, never shared); same dtype and device, eval mode. Its logits equal
    ``apply_masks(model, masks)``'s.

    Raises :class:`ConfigError` when the masks prune anything but experts (heads, dense FFN or hidden
    channels, whole sub-blocks or layers: not yet for MoE parents, issue 30) or differ between MoE
    layers (a plain config has one expert count, width and top-``k``).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from autocompress_opt.prune.masking import apply_masks

    adapter = adapter or moe_adapter(model)
    parts = adapter.all_layer_parts(model)
    apply_masks(model, masks, adapter=adapter).remove()  # the shape checks, nothing installed
    sizes = _uniform_sizes(parts, masks)
    config = copy.deepcopy(model.config)  # setattr, not a dict: the config class maps its aliases
    for key, value in sizes.items():
        setattr(config, _CONFIG_KEYS[key], value)
    weight = next(model.parameters())
    with no_init_weights():
        child = AutoModelForCausalLM.from_config(config, dtype=weight.dtype)
    child.to(weight.device)
    with torch.no_grad():
        sliced = _sliced_state(model, parts, masks)
    missing, unexpected = child.load_state_dict(sliced, strict=False)
    if missing or unexpected:  # an internal error: a weight the slicing did not produce
        raise AssertionError(f"expert slicing left {missing} unset and produced unused {unexpected}")
    if child.config.tie_word_embeddings:
        child.tie_weights()
    return child.eval()


def _uniform_sizes(parts: list[LayerParts], masks: Masks) -> dict[str, int]:
    """The one (experts kept, top-k, channels per expert) of every MoE layer; raises when masks prune
    anything else or the layers differ."""
    if not bool(masks.hidden.all()):
        raise ConfigError("slice_experts prunes experts only: the masks drop hidden channels (not yet for MoE parents)")
    seen: dict[tuple[int, int, int], list[int]] = {}
    for i, (p, m) in enumerate(zip(parts, masks.layers)):
        for name, tensor, present in (("heads", m.heads, p.attention is not None), ("ffn", m.ffn, p.mlp is not None)):
            if present and (tensor is None or not bool(tensor.all())):
                raise ConfigError(
                    f"slice_experts prunes experts only: masks.layers[{i}].{name} prunes the layer's {name} "
                    "(not yet for MoE parents, issue 30)"
                )
        if p.moe is None:
            continue
        if m.experts is None:
            raise ConfigError(f"slice_experts cannot remove the MoE block of layer {i}; keep at least one expert")
        widths = {p.expert_width} if m.expert_ffn is None else set(m.expert_ffn[m.experts.bool()].sum(-1).tolist())
        if len(widths) != 1:
            raise ConfigError(
                f"layer {i} keeps {sorted(widths)} channels in different experts; a plain config has one width"
            )
        k = int(p.router.top_k) if m.experts_per_token is None else m.experts_per_token
        seen.setdefault((int(m.experts.sum()), k, int(widths.pop())), []).append(i)
    if len(seen) != 1:
        found = "; ".join(f"layers {ls}: {e} experts, top-{k}, width {w}" for (e, k, w), ls in seen.items())
        raise ConfigError(f"the MoE layers are pruned to different sizes ({found}); a plain config has one size")
    ((experts, k, width),) = seen
    return {"num_experts": experts, "experts_per_token": k, "expert_width": width}


def _sliced_state(model: Any, parts: list[LayerParts], masks: Masks) -> dict[str, Any]:
    """``model``'s state dict with each MoE layer's router rows and stacked expert tensors cut."""
    import torch

    names = {id(param): name for name, param in model.named_parameters(remove_duplicate=False)}
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    for p, m in zip(parts, masks.layers):
        if p.moe is None or m.experts is None:
            continue
        kept = torch.nonzero(m.experts.bool()).flatten()  # (E',) ascending: the child's expert order
        ffn = m.expert_ffn if m.expert_ffn is not None else torch.ones(p.num_experts, p.expert_width, dtype=torch.bool)
        channels = torch.stack([torch.nonzero(ffn[e].bool()).flatten() for e in kept.tolist()])  # (E', F')
        on = p.expert_down.device
        kept, channels = kept.to(on), channels.to(on)
        f = p.expert_width
        gate_up = p.expert_gate_up[kept]  # (E', 2F, D)
        rows = torch.cat([channels, channels + f], dim=1)  # gate rows, then up rows: (E', 2F')
        state[names[id(p.expert_gate_up)]] = torch.gather(
            gate_up, 1, rows[..., None].expand(-1, -1, gate_up.shape[-1])
        ).clone()
        down = p.expert_down[kept]  # (E', D, F)
        state[names[id(p.expert_down)]] = torch.gather(
            down, 2, channels[:, None, :].expand(-1, down.shape[1], -1)
        ).clone()
        state[names[id(p.router.weight)]] = p.router.weight[kept].detach().clone()  # (E', D)
        bias = getattr(p.router, "bias", None)
        if bias is not None:
            state[names[id(bias)]] = bias[kept].detach().clone()
    return state


def export_experts(model: Any, masks: Masks, out_dir: str | Path, *, force: bool = False) -> Path:
    """:func:`slice_experts`, saved as a plain checkpoint of the family in ``out_dir`` (created);
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` gives the masked parent's logits. Raises
    :class:`OutputExistsError` for a non-empty ``out_dir`` without ``force``."""
    out = Path(out_dir).expanduser()
    if out.exists() and any(out.iterdir()):
        if not force:
            raise OutputExistsError(f"{str(out)!r} is not empty; pass force=True to replace it")
        shutil.rmtree(out)
    child = slice_experts(model, masks)
    child.save_pretrained(out)
    return out
