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
   ...); any other becomes the package's ``AutocompressDeciLMForCausalLM``.

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

:func:`uniform_baseline` is the practitioner's Minitron-style baseline recipe (see its docstring).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, adapter_for, architecture_mismatch, bypass_layer
from autocompress_opt.prune.importance import Importance

if TYPE_CHECKING:
    import torch

__all__ = [
    "BASELINE_WIDTHS",
    "LayerMask",
    "LayerPlan",
    "MaskHandle",
    "Masks",
    "PrunePlan",
    "apply_masks",
    "identity_plan",
    "materialize",
    "plan_pruning",
    "prune",
    "resolve_param_target",
    "uniform_baseline",
]


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


def _indicator(size: int, kept: Sequence[int]) -> torch.Tensor:
    import torch

    mask = torch.zeros(size, dtype=torch.bool)
    mask[list(kept)] = True
    return mask


def _top(scores: torch.Tensor, k: int) -> tuple[int, ...]:
    """Indices of the ``k`` highest scores (ties: lower index first), in ascending index order."""
    import torch

    order = torch.argsort(scores, descending=True, stable=True)[:k]
    return tuple(int(i) for i in torch.sort(order).values)


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
    scores = importance.layer_scores(metric)
    # Most important first; present layers before fully dropped ones; ties by lower index.
    ranked = sorted(range(parent.num_layers), key=lambda j: (parent.layers[j].is_noop, -float(scores[j]), j))
    return sorted(ranked[: target.num_layers])


def _plan_layer(importance: Importance, p: int, parent: LayerSpec, spec: LayerSpec) -> LayerPlan:
    heads: tuple[int, ...] = ()
    groups: tuple[int, ...] = ()
    if spec.attention:
        r, r_new = parent.num_heads // parent.num_kv_heads, spec.num_heads // spec.num_kv_heads
        groups = _top(importance.kv_groups[p], spec.num_kv_heads)
        by_group = importance.heads[p].view(parent.num_kv_heads, r)  # (G, r): query heads of each KV group
        heads = tuple(g * r + j for g in groups for j in _top(by_group[g], r_new))
    ffn = _top(importance.ffn[p], spec.ffn_width) if spec.ffn else ()
    return LayerPlan(parent_index=p, heads=heads, kv_heads=groups, ffn_channels=ffn)


# ------------------------------------------------------------------------------------ masks
@dataclass(frozen=True, eq=False)
class LayerMask:
    """Masks of one parent layer. ``heads`` ``(H,)`` over query heads and ``ffn`` ``(F,)`` over FFN
    channels hold 1 (keep) or 0 (zero); ``None`` removes the sub-block (its output, bias
    included, becomes zero). Both ``None`` skips the layer."""

    heads: torch.Tensor | None
    ffn: torch.Tensor | None


@dataclass(frozen=True, eq=False)
class Masks:
    """One :class:`LayerMask` per parent layer plus ``hidden`` ``(D,)``: 1 = residual channel kept."""

    layers: tuple[LayerMask, ...]
    hidden: torch.Tensor

    @classmethod
    def ones(cls, arch: Architecture) -> Masks:
        """Masks that keep everything ``arch`` has."""
        import torch

        ones = lambda n, present: torch.ones(n, dtype=torch.bool) if present else None
        return cls(
            layers=tuple(LayerMask(ones(s.num_heads, s.attention), ones(s.ffn_width, s.ffn)) for s in arch.layers),
            hidden=torch.ones(arch.hidden_size, dtype=torch.bool),
        )


class MaskHandle:
    """Hooks that make a model compute with masks; ``remove()`` (or leaving the ``with`` block) undoes them."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> MaskHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def apply_masks(model: Any, masks: Masks, *, adapter: FamilyAdapter | None = None) -> MaskHandle:
    """Install forward hooks so ``model`` computes as if pruned by ``masks``; weights are untouched.

    Per layer: a head mask multiplies each head's attention output (``o_proj``'s input); an FFN
    mask multiplies ``down_proj``'s input; ``None`` replaces the sub-block's output with zeros; both
    ``None`` skips the layer. A hidden mask zeroes pruned residual channels (embedding, ``o_proj``
    and ``down_proj`` outputs) and makes every hidden RMSNorm compute its statistic over the kept
    channels (module docstring). All-ones masks install no hook, so the parent's logits are exact.

    Use as ``with apply_masks(model, masks): logits = model(ids).logits``. Raises
    :class:`ConfigError` when a mask's shape does not fit the model (naming the layer).
    """
    adapter = adapter or adapter_for(model)
    parts = adapter.all_layer_parts(model)
    _check_masks(masks, parts, adapter.embedding(model).embedding_dim)
    handles: list[Any] = []
    try:
        for p, mask in zip(parts, masks.layers):
            handles += _layer_hooks(p, mask)
        if not bool(masks.hidden.all()):
            handles += _hidden_hooks(model, adapter, parts, masks.hidden, adapter.base(model).norm_offset)
    except BaseException:
        MaskHandle(handles).remove()
        raise
    return MaskHandle(handles)


def _check_masks(masks: Masks, parts: list[LayerParts], hidden_size: int) -> None:
    if len(masks.layers) != len(parts):
        raise ConfigError(f"masks have {len(masks.layers)} layers, the model has {len(parts)}")
    if tuple(masks.hidden.shape) != (hidden_size,):
        raise ConfigError(f"hidden mask has shape {tuple(masks.hidden.shape)}, the model needs ({hidden_size},)")
    for i, (p, mask) in enumerate(zip(parts, masks.layers)):
        for name, tensor, present, size in (
            ("heads", mask.heads, p.attention is not None, p.num_heads),
            ("ffn", mask.ffn, p.mlp is not None, p.ffn_width),
        ):
            if tensor is not None and not present:
                raise ConfigError(f"masks.layers[{i}].{name} is set but layer {i} has no such sub-block")
            if tensor is not None and tuple(tensor.shape) != (size,):
                raise ConfigError(
                    f"masks.layers[{i}].{name} has shape {tuple(tensor.shape)}, layer {i} needs ({size},)"
                )


def _layer_hooks(p: LayerParts, mask: LayerMask) -> list[Any]:
    has_attn, has_ffn = p.attention is not None, p.mlp is not None
    if mask.heads is None and mask.ffn is None and (has_attn or has_ffn):
        return [bypass_layer(p.layer)]
    handles = []
    if has_attn:
        if mask.heads is None:
            handles.append(p.attention.register_forward_hook(_zero_output))
        elif not bool(mask.heads.all()):
            head_mask = mask.heads.repeat_interleave(p.head_dim)  # (H·d,)
            handles.append(p.o_proj.register_forward_pre_hook(_scale_input(head_mask)))
    if has_ffn:
        if mask.ffn is None:
            handles.append(p.mlp.register_forward_hook(_zero_output))
        elif not bool(mask.ffn.all()):
            handles.append(p.down_proj.register_forward_pre_hook(_scale_input(mask.ffn)))
    return handles


def _hidden_hooks(
    model: Any, adapter: FamilyAdapter, parts: list[LayerParts], hidden: torch.Tensor, norm_offset: float
) -> list[Any]:
    handles = [adapter.embedding(model).register_forward_hook(_scale_output(hidden))]
    for p in parts:
        for proj in (p.o_proj, p.down_proj):
            if proj is not None:
                handles.append(proj.register_forward_hook(_scale_output(hidden)))
    for norm in adapter.hidden_norms(model):  # post-norms (Gemma) included: they zero pruned channels too
        handles.append(norm.register_forward_hook(_kept_channel_rmsnorm(hidden, norm_offset)))
    return handles


def _zero_output(module: Any, args: tuple[Any, ...], output: Any) -> Any:
    import torch

    if isinstance(output, tuple):
        return (torch.zeros_like(output[0]), *output[1:])
    return torch.zeros_like(output)


def _scale_input(mask: torch.Tensor) -> Any:
    def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]  # (..., features)
        return (x * mask.to(device=x.device, dtype=x.dtype), *args[1:])

    return hook


def _scale_output(mask: torch.Tensor) -> Any:
    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        return output * mask.to(device=output.device, dtype=output.dtype)

    return hook


def _kept_channel_rmsnorm(mask: torch.Tensor, offset: float = 0.0) -> Any:
    """Recompute an RMSNorm over the kept channels only, as the sliced model's norm does.

    ``offset`` 0: Llama's ``w · x̂`` (x̂ cast to the input dtype first); 1: Gemma's ``(1 + w) · x̂``
    computed in float32, then cast (transformers' ``Gemma3RMSNorm``).
    """
    import torch

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        x = args[0]  # (batch, time, D)
        eps = getattr(module, "variance_epsilon", None)
        eps = module.eps if eps is None else eps
        m = mask.to(device=x.device, dtype=torch.float32)
        x32 = x.to(torch.float32)
        variance = (x32.pow(2) * m).sum(-1, keepdim=True) / m.sum()
        normed = x32 * torch.rsqrt(variance + eps)
        if offset:
            y = (normed * (offset + module.weight.float())).type_as(x)
        else:
            y = module.weight * normed.to(x.dtype)
        return y * m.to(y.dtype)

    return hook


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
    ``heterogeneous=True`` always builds the latter. Same dtype, device and attention
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
    from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig

    arch = plan.architecture
    if arch.is_uniform and not heterogeneous:
        config = _plain_config(parent_model, adapter, plan)
        if config is not None:
            return config
    return AutocompressDeciLMConfig.from_architecture(arch, **_inherited_settings(parent_model))


# Config keys that carry the parent's numerics into a heterogeneous child (not its sizes), with the
# names a family's config may use instead (Gemma 3 calls the MLP activation ``hidden_activation``).
_INHERITED_KEYS = (
    "hidden_act",
    "rms_norm_eps",
    "rope_parameters",
    "max_position_embeddings",
    "initializer_range",
    "attention_dropout",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sliding_window",
    "query_pre_attn_scalar",
    "final_logit_softcapping",
)
_KEY_NAMES = {"hidden_act": ("hidden_act", "hidden_activation")}


def _inherited_settings(parent_model: Any) -> dict[str, Any]:
    """The parent's numerics under this package's config keys; refuses what the child cannot compute."""
    config = parent_model.config
    if getattr(config, "use_bidirectional_attention", False):
        raise ConfigError(
            "the parent uses bidirectional attention (use_bidirectional_attention=True); "
            "only causal decoders can be pruned"
        )
    settings = {}
    for key in _INHERITED_KEYS:
        value = next(
            (getattr(config, n) for n in _KEY_NAMES.get(key, (key,)) if getattr(config, n, None) is not None), None
        )
        if value is not None:
            settings[key] = copy.deepcopy(value)
    return settings


_SIZE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)


def _plain_config(parent_model: Any, adapter: FamilyAdapter, plan: PrunePlan) -> Any | None:
    """A config of the parent's family that builds ``plan.architecture``, or None if the family cannot."""
    arch, layer = plan.architecture, plan.architecture.layers[0]
    if adapter.heterogeneous:
        config = _family_config(parent_model, plan)
        if config is None:
            return None
    else:
        config = copy.deepcopy(parent_model.config)
        types = getattr(config, "layer_types", None)
        if types:
            config.layer_types = [types[lp.parent_index] for lp in plan.layers]
    sizes = (arch.hidden_size, arch.num_layers, layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.ffn_width)
    for key, value in zip(_SIZE_KEYS, sizes):
        setattr(config, key, value)
    return config if _reloadable(config) else None


def _family_config(parent_model: Any, plan: PrunePlan) -> Any | None:
    """A heterogeneous parent's base-family config for a uniform plan, or None if it cannot say it
    (including windows it cannot express: :meth:`Architecture.to_hf_config` sets the layers' windows)."""
    settings = _inherited_settings(parent_model)
    settings.pop("sliding_window", None)  # the plan's windows are in the architecture
    try:
        config = plan.architecture.to_hf_config()
    except (ConfigError, *_validation_errors()):
        return None
    for key, value in settings.items():
        names = _KEY_NAMES.get(key, (key,))
        setattr(config, next((n for n in names if hasattr(config, n)), key), value)
    return config


def _validation_errors() -> tuple[type[Exception], ...]:
    """What transformers raises for a config it rejects (strict dataclass validation)."""
    from huggingface_hub.errors import StrictDataclassClassValidationError

    return (ValueError, TypeError, StrictDataclassClassValidationError)


def _reloadable(config: Any) -> bool:
    """True when ``config`` survives a save/load round trip (transformers re-validates on load)."""
    try:
        type(config).from_dict(config.to_dict())
    except _validation_errors():
        return False
    return True


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


# --------------------------------------------------------------------------- baseline recipe
def resolve_param_target(params: float, parent_params: int) -> int:
    """A parameter budget: ``0 < params <= 1`` is a fraction of ``parent_params``, ``> 1`` a count."""
    if isinstance(params, bool) or not isinstance(params, (int, float)) or not params > 0:
        raise ConfigError(f"params must be a fraction in (0, 1] or a parameter count > 1, got {params!r}")
    return int(params * parent_params) if params <= 1 else int(params)


BASELINE_WIDTHS = ("ffn", "hidden+ffn")


def uniform_baseline(
    parent: Architecture,
    params: float,
    *,
    max_layer_drop: float = 0.25,
    width_multiple: int = 64,
    width: str = "ffn",
) -> Architecture:
    """The practitioner's Minitron-style baseline: a UNIFORM target with at most ``params`` parameters.

    This is what a user picks without a hardware model — a parameter count — with a fixed recipe
    for splitting the cut between depth and width:

    1. **Depth**: drop layers, least important first, while the model is over budget and at most
       ``floor(max_layer_drop · L)`` layers are gone (default 25%; Minitron found width pruning
       keeps more accuracy than depth pruning, so depth is capped).
    2. **Width**, by ``width``:

       * ``"ffn"``: the widest FFN, a multiple of ``width_multiple`` (64: GEMM-friendly), that
         meets the budget at that depth. Heads and hidden size are kept.
       * ``"hidden+ffn"``: Minitron's width recipe (Llama-3.1-Minitron-4B-Width shrinks hidden
         4096 → 3072 and MLP 14336 → 9216, heads kept): hidden size and FFN shrink by one shared
         ratio ``r``, each rounded down to a multiple of ``width_multiple`` — the largest ``r``, in
         steps of 1/1024, that meets the budget. Heads are kept. This is the recipe that can reach
         budgets below the embeddings' share of the parent (Gemma 3's 262K vocabulary holds 63% of
         Gemma-3-270M's parameters).
    3. If even the narrowest width is over budget, drop one more layer and retry step 2, down to
       one layer; past that, :class:`ConfigError` (the embeddings alone are too big).

    Which layers, channels and heads go is decided afterwards by :func:`plan_pruning` from the
    importance scores (``layer_metric``); this function only fixes the sizes. Returns ``parent`` itself when it
    already meets the budget. ``parent`` must be uniform (windows may differ: Gemma 3).

    Windows (they change the cost, not the parameter count): an ``n``-layer result lists the windows
    of the parent layers it most likely keeps without knowing the importance scores: the first
    ``n - 1`` and the last, the search space's default (deep layers are the most redundant, Gromov
    et al. 2024). :func:`plan_pruning` then gives every kept layer its actual parent layer's window.
    """
    if not parent.is_uniform:
        raise ConfigError(f"the uniform baseline needs a uniform parent; {parent.summary()} is heterogeneous")
    if not 0.0 <= max_layer_drop < 1.0:
        raise ConfigError(f"max_layer_drop must be a fraction in [0, 1), got {max_layer_drop!r}")
    if not isinstance(width_multiple, int) or width_multiple < 1:
        raise ConfigError(f"width_multiple must be a positive int, got {width_multiple!r}")
    if width not in BASELINE_WIDTHS:
        raise ConfigError(f"width must be one of {', '.join(BASELINE_WIDTHS)}, got {width!r}")
    budget = resolve_param_target(params, parent.num_params)
    if parent.num_params <= budget:
        return parent
    layer, depth = parent.layers[0], parent.num_layers
    name = f"{parent.name.rstrip('/').rsplit('/', 1)[-1] or parent.family}-uniform-{budget}"

    def build(n: int, shape: tuple[int, int]) -> Architecture:
        hidden, ffn = shape
        kept = [*range(n - 1), parent.num_layers - 1]  # the windows' source layers (docstring)
        layers = tuple(replace(layer, ffn_width=ffn, window=parent.layers[j].window) for j in kept)
        return replace(parent, hidden_size=hidden, layers=layers, name=name)

    def down(value: int, ratio: float) -> int:
        return max(width_multiple, int(value * ratio) // width_multiple * width_multiple) if ratio < 1 else value

    full = (parent.hidden_size, layer.ffn_width)
    if width == "ffn":
        shapes = [full] + [
            (parent.hidden_size, w)
            for w in range(layer.ffn_width // width_multiple * width_multiple, 0, -width_multiple)
        ]
    else:
        shapes = list(
            dict.fromkeys(
                (down(parent.hidden_size, r / 1024), down(layer.ffn_width, r / 1024)) for r in range(1024, 0, -1)
            )
        )
    min_depth = parent.num_layers - int(max_layer_drop * parent.num_layers)
    while depth > min_depth and build(depth, full).num_params > budget:
        depth -= 1
    for n in range(depth, 0, -1):
        for shape in shapes:
            if build(n, shape).num_params <= budget:
                return build(n, shape)
    smallest = build(1, shapes[-1]).num_params
    raise ConfigError(
        f"cannot reach {budget:,} parameters with a uniform model: the smallest "
        f"(1 layer, hidden {shapes[-1][0]}, FFN {shapes[-1][1]}) has {smallest:,} "
        f"({parent.embedding_params:,} in embeddings)"
        + ("; width='hidden+ffn' also shrinks the embeddings" if width == "ffn" else "")
    )
