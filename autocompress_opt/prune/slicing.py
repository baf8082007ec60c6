"""Prune by importance: plan which heads/channels/layers a target keeps, then mask or slice the parent.

Three steps, each usable alone:

1. :func:`plan_pruning` — parent :class:`Architecture` + :class:`Importance` + target
   Architecture → :class:`PrunePlan`: for every kept layer, the parent layer it comes from and the
   parent query heads, KV heads and FFN channels it keeps; the kept hidden channels. Every kept set
   is a prefix of the importance order (most important first), stored in ascending index order.
2. :func:`apply_masks` — the parent computing the plan with masks (zeroed heads and FFN channels,
   removed sub-blocks, skipped layers, masked hidden channels), no weights changed.
3. :func:`materialize` — a new, smaller transformers model holding the sliced weights. A target
   whose kept layers are all identical becomes a plain model of the parent's family (``LlamaForCausalLM``
   ...); any other becomes the package's ``AutocompressDeciLMForCausalLM``. The decision is
   :func:`autocompress_opt.hf.build.model_config`, which the CPU timing shares (it times the model
   export writes).

Guarantee (tested per family): the materialised model's logits equal the masked parent's logits to
float tolerance; all-ones masks reproduce the parent exactly.

**Hidden-size pruning and RMSNorm.** A model sliced to ``D' < D`` residual channels computes each
RMSNorm's statistic over the kept channels only: ``rms = sqrt(Σ_kept x² / D' + eps)``. Zeroing the
pruned channels of the parent is *not* equivalent: its norms would divide by ``D`` and scale every
normalised activation by ``sqrt(D'/D)`` (not exactly, because of ``eps``). We keep the standard
sliced model (what Minitron ships and what any runtime loads) and make the mask match it: a masked
hidden norm computes its statistic over the kept channels, ``Σ_c m_c x_c² / Σ_c m_c``. So "hidden
mask" here means *channel removal*, not "zero these channels in the parent's own norms"; the two
agree only when ``D' = D``.

**Hidden-size pruning and Gemma's embedding scale.** Gemma 3 multiplies the embedding by
``sqrt(hidden_size)``, computed from the *model's own* config, so a child with ``D' < D`` channels
would scale by ``sqrt(D')``: a different model. We keep the parent's numerics by folding the
factor ``c = sqrt(D)/sqrt(D')`` (generally: parent scale / child scale) into the child's embedding
weights; with tied embeddings the LM head then carries ``c`` too, and the final norm's multiplier
``(1 + w)`` is divided by ``c`` to cancel it (exact up to float rounding). A plain Gemma 3 checkpoint
therefore reloads with the masked parent's logits, and no extra config key is needed.

**Heads.** Heads are pruned in whole KV groups (the groups with the highest summed score) and,
optionally, by the same number of query heads inside every kept group (the best ones of each
group), so the result stays valid grouped-query attention. ``head_dim`` never changes.

**Layers.** A target with as many layers as the parent maps layer ``i`` to parent layer ``i``
(``LayerSpec.dropped()`` removes one); a target with ``n`` fewer layers keeps the parent's ``n`` most
important layers (by ``layer_metric``), in their original order. Fully dropped layers are left out
of the built model (they compute nothing and hold no weights).

**Windows.** A kept layer computes its parent layer's attention (full, or sliding over the parent's
window), whatever window the target lists: the plan's architecture carries the parent layers'
windows, so it may differ from the target in ``LayerSpec.window`` only. Export and cost it (not
the target) when the two can differ (a target with fewer layers than the parent).

Plans live in :mod:`autocompress_opt.prune.plan`, masks in :mod:`autocompress_opt.prune.masking`, the
uniform baselines in :mod:`autocompress_opt.prune.baselines`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, adapter_for, architecture_mismatch
from autocompress_opt.hf.build import inherited_settings, model_config
from autocompress_opt.prune.importance import Importance

if TYPE_CHECKING:
    import torch
from autocompress_opt.prune.plan import LayerPlan, PrunePlan, plan_pruning

__all__ = ["materialize", "prune"]


# ------------------------------------------------------------------------------ materialise
def prune(
    parent_model: Any,
    importance: Importance,
    target: Architecture,
    *,
    layer_metric: str = "skip_loss",
    adapter: FamilyAdapter | None = None,
) -> Any:
    """:func:`plan_pruning` then :func:`materialize`: the smaller model, in eval mode."""
    adapter = adapter or adapter_for(parent_model)
    plan = plan_pruning(adapter.architecture(parent_model), importance, target, layer_metric=layer_metric)
    return materialize(parent_model, plan, adapter=adapter)


def materialize(
    parent_model: Any, plan: PrunePlan, *, adapter: FamilyAdapter | None = None, heterogeneous: bool = False
) -> Any:
    """Build the model ``plan`` describes from ``parent_model``'s weights (copied, never shared).

    Returns a plain transformers model of the parent's family when ``plan.architecture`` is
    uniform and that family's config accepts it (``LlamaConfig`` and ``Gemma3TextConfig`` require
    ``hidden_size % num_attention_heads == 0``), else an ``AutocompressDeciLMForCausalLM``;
    ``heterogeneous=True`` always builds the latter (:func:`~autocompress_opt.hf.build.model_config`
    decides). Same dtype, device and attention
    implementation as the parent; eval mode. Raises :class:`ConfigError` when the model is not
    ``plan.parent``, or when the parent computes something the pruned model cannot (bidirectional
    attention).
    """
    import torch
    from transformers import AutoModelForCausalLM

    adapter = adapter or adapter_for(parent_model)
    mismatch = architecture_mismatch(plan.parent, adapter.architecture(parent_model))
    if mismatch:
        raise ConfigError(f"the model is not the plan's parent ({mismatch})")
    config = _target_config(parent_model, adapter, plan, heterogeneous)
    weight = adapter.embedding(parent_model).weight
    attn_impl = getattr(parent_model.config, "_attn_implementation", None)
    child = AutoModelForCausalLM.from_config(config, dtype=weight.dtype, attn_implementation=attn_impl)
    child = child.to(weight.device)
    with torch.no_grad():
        _copy_weights(parent_model, adapter, child, adapter_for(child), plan)
    return child.eval()


def _target_config(parent_model: Any, adapter: FamilyAdapter, plan: PrunePlan, heterogeneous: bool) -> Any:
    """The config of the child: :func:`~autocompress_opt.hf.build.model_config` of the plan's
    architecture, starting from a homogeneous parent's own config (layer types re-indexed to the
    kept layers) so that a plain child keeps every key the parent had."""
    base = None
    if not adapter.heterogeneous:
        base = copy.deepcopy(parent_model.config)
        types = getattr(base, "layer_types", None)
        if types:
            base.layer_types = [types[lp.parent_index] for lp in plan.layers]
    return model_config(
        plan.architecture,
        base_config=base,
        heterogeneous=heterogeneous,
        **inherited_settings(parent_model.config),
    )


def _copy_weights(src: Any, src_adapter: FamilyAdapter, dst: Any, dst_adapter: FamilyAdapter, plan: PrunePlan) -> None:
    import torch

    device = src_adapter.embedding(src).weight.device
    h = torch.tensor(plan.hidden_channels, dtype=torch.long, device=device)  # (D',)
    # Gemma: the embedding is scaled by sqrt(own hidden size); fold parent/child into the weights (module doc).
    rescale = _embed_scale(src_adapter.embedding(src)) / _embed_scale(dst_adapter.embedding(dst))
    embedding = src_adapter.embedding(src).weight[:, h]
    _put(dst_adapter.embedding(dst).weight, embedding if rescale == 1.0 else embedding * rescale)
    final_norm = src_adapter.final_norm(src).weight[h]
    if dst_adapter.tied(dst) and rescale != 1.0:  # the LM head carries the factor too: cancel it in the norm
        offset = src_adapter.base(src).norm_offset
        final_norm = (offset + final_norm) / rescale - offset
    _put(dst_adapter.final_norm(dst).weight, final_norm)
    if not dst_adapter.tied(dst):
        _put(dst_adapter.lm_head(dst).weight, src_adapter.lm_head(src).weight[:, h])
    for k, lp in enumerate(plan.layers):
        s, d = src_adapter.layer_parts(src, lp.parent_index), dst_adapter.layer_parts(dst, k)
        if lp.heads:
            _copy_attention(s, d, lp, h)
        if lp.ffn_channels:
            _copy_ffn(s, d, lp, h)


def _embed_scale(embedding: Any) -> float:
    """The factor an embedding module multiplies its rows by (Gemma's ``embed_scale`` buffer; else 1)."""
    scale = getattr(embedding, "embed_scale", None)
    return 1.0 if scale is None else float(scale)


def _head_rows(heads: Sequence[int], head_dim: int, device: Any) -> torch.Tensor:
    """Row indices ``(len(heads)·head_dim,)`` of the given heads in a ``(heads·head_dim, ·)`` matrix."""
    import torch

    idx = torch.tensor(heads, dtype=torch.long, device=device)
    return (idx[:, None] * head_dim + torch.arange(head_dim, device=device)).flatten()


def _copy_attention(s: LayerParts, d: LayerParts, lp: LayerPlan, h: torch.Tensor) -> None:
    q = _head_rows(lp.heads, s.head_dim, h.device)
    kv = _head_rows(lp.kv_heads, s.head_dim, h.device)
    _copy_block(
        s,
        d,
        h,
        norms=("input_norm", "attn_out_norm"),
        inputs=(("q_proj", q), ("k_proj", kv), ("v_proj", kv)),
        output=("o_proj", q),
    )
    for name in ("q_norm", "k_norm"):
        if getattr(s, name) is not None:
            _put(getattr(d, name).weight, getattr(s, name).weight)


def _copy_ffn(s: LayerParts, d: LayerParts, lp: LayerPlan, h: torch.Tensor) -> None:
    import torch

    c = torch.tensor(lp.ffn_channels, dtype=torch.long, device=h.device)
    _copy_block(
        s, d, h, norms=("ffn_norm", "ffn_out_norm"), inputs=(("gate_proj", c), ("up_proj", c)), output=("down_proj", c)
    )


def _copy_block(
    s: LayerParts,
    d: LayerParts,
    h: torch.Tensor,
    *,
    norms: tuple[str, str],
    inputs: Sequence[tuple[str, torch.Tensor]],
    output: tuple[str, torch.Tensor],
) -> None:
    """Slice one residual sub-block: its (pre, optional post) norms over the kept residual channels
    ``h``; each input projection's kept rows × ``h`` columns; the output projection's ``h`` rows ×
    its kept input columns. Biases follow their rows."""
    pre, post = norms
    _put(getattr(d, pre).weight, getattr(s, pre).weight[h])
    if getattr(s, post) is not None:
        _put(getattr(d, post).weight, getattr(s, post).weight[h])
    for name, rows in inputs:
        src, dst = getattr(s, name), getattr(d, name)
        _put(dst.weight, src.weight[rows][:, h])
        if src.bias is not None:
            _put(dst.bias, src.bias[rows])
    name, cols = output
    src, dst = getattr(s, name), getattr(d, name)
    _put(dst.weight, src.weight[h][:, cols])
    if src.bias is not None:
        _put(dst.bias, src.bias[h])


def _put(dst: torch.Tensor, src: torch.Tensor) -> None:
    assert dst.shape == src.shape, f"internal: slicing produced {tuple(src.shape)} for {tuple(dst.shape)}"
    dst.copy_(src)
