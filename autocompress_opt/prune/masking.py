"""Hard masks on a real parent: the parent computing a pruning plan with zeroed heads and FFN
channels, removed sub-blocks, skipped layers and masked hidden channels, no weights changed
(:func:`apply_masks`). All-ones masks reproduce the parent exactly; the masked parent's logits
equal the sliced model's (:mod:`autocompress_opt.prune.slicing`) to float tolerance.

Mixture-of-experts layers (the experts path, :func:`~autocompress_opt.hf.adapters.moe_adapter`):
a dropped expert gets router logit ``-inf`` before the softmax and top-``k``, so tokens are routed
among the kept experts exactly as the sliced model (whose router has only their rows) routes them;
``experts_per_token`` changes the ``k``; a masked expert channel is a zeroed column of the expert's
stacked down projection (a ``torch.nn.utils.parametrize`` view, so the stored weight is untouched),
what slicing that channel away computes (:mod:`autocompress_opt.prune.experts`). The router's own rule
is replayed on the masked logits: softmax then top-``k`` (Qwen3-MoE), or sigmoid scores, top-``k`` of
score + correction bias, renormalised and scaled (Nemotron-H, :attr:`FamilyAdapter.router_scoring`;
group-limited routing, ``n_group > 1``, is refused when experts are dropped). A shared expert's masked
channel is a zeroed input of its ``down_proj``, as a dense FFN channel.

Mamba-2 mixers (hybrid parents): a masked SSM head is zeroed at ``out_proj``'s input, and the gated
RMSNorm before it (one statistic per group of ``I / G`` channels, transformers'
``NemotronHRMSNormGated``) computes each group's statistic over its kept heads' channels only. SSM
heads are otherwise independent (each has its own ``dt``, ``A``, ``D`` and conv channels; ``B`` and ``C``
are per group), so this is what removing the heads computes when every group keeps the same number
of heads (:mod:`autocompress_opt.prune.mamba`); a group must keep at least one head.

A masked hidden norm computes its statistic over the kept channels, ``sum_c m_c x_c^2 / sum_c m_c``,
so a hidden mask means *channel removal*, as slicing does (see :mod:`~autocompress_opt.prune.slicing`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import (
    FamilyAdapter,
    LayerParts,
    ReplacedForward,
    adapter_for,
    bypass_layer,
    renormalises_top_k,
    zero_sub_block,
)

if TYPE_CHECKING:
    import torch


__all__ = ["LayerMask", "MaskHandle", "Masks", "apply_masks", "kept_channel_gated_norm"]


# ------------------------------------------------------------------------------------ masks
@dataclass(frozen=True, eq=False)
class LayerMask:
    """Masks of one parent layer. ``heads`` ``(H,)`` over query heads and ``ffn`` ``(F,)`` over FFN
    channels hold 1 (keep) or 0 (zero); ``None`` removes the sub-block (its output, bias
    included, becomes zero). Both ``None`` skips the layer.

    A MoE layer (``ffn`` None there) has ``experts`` ``(E,)``: 1 = routed expert kept (None removes
    the MoE block; with ``heads`` None too the layer is skipped), ``expert_ffn`` ``(E, F)``: 1 = the
    expert's channel kept (None: all), ``experts_per_token``: the top-``k`` (None: the parent's),
    ``shared_ffn`` ``(S,)``: 1 = the shared expert's channel kept (None: all).

    A Mamba-2 layer has ``mamba_heads`` ``(H,)``: 1 = SSM head kept; None removes the mixer (the
    layer, whose one sub-block it is, is then skipped)."""

    heads: torch.Tensor | None
    ffn: torch.Tensor | None
    experts: torch.Tensor | None = None
    expert_ffn: torch.Tensor | None = None
    experts_per_token: int | None = None
    shared_ffn: torch.Tensor | None = None
    mamba_heads: torch.Tensor | None = None


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
        layers = []
        for s in arch.layers:
            mask = LayerMask(ones(s.num_heads, s.attention), ones(s.ffn_width, s.ffn))
            if s.moe is not None:
                e, f = s.moe.num_experts, s.moe.expert_width
                shared = ones(s.moe.shared_width, s.moe.shared_width > 0)
                mask = replace(mask, experts=ones(e, True), expert_ffn=ones((e, f), True), shared_ffn=shared)
            if s.mamba is not None:
                mask = replace(mask, mamba_heads=ones(s.mamba.num_heads, True))
            layers.append(mask)
        return cls(layers=tuple(layers), hidden=torch.ones(arch.hidden_size, dtype=torch.bool))


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
    scoring = adapter.base(model).router_scoring
    handles: list[Any] = []
    try:
        for p, mask in zip(parts, masks.layers):
            handles += _layer_hooks(p, mask, scoring)
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
        _check_expert_masks(i, p, mask)
        _check_mamba_mask(i, p, mask)


def _check_mamba_mask(i: int, p: LayerParts, mask: LayerMask) -> None:
    where = f"masks.layers[{i}]"
    if p.mamba is None:
        if mask.mamba_heads is not None:
            raise ConfigError(f"{where}.mamba_heads is set but layer {i} has no Mamba-2 mixer")
        return
    if mask.mamba_heads is None:
        return
    heads, groups = int(p.mamba.num_heads), int(p.mamba.n_groups)
    if tuple(mask.mamba_heads.shape) != (heads,):
        raise ConfigError(f"{where}.mamba_heads has shape {tuple(mask.mamba_heads.shape)}, layer {i} needs ({heads},)")
    per_group = mask.mamba_heads.bool().reshape(groups, heads // groups).sum(-1)  # (G,)
    if not bool((per_group > 0).all()):
        raise ConfigError(
            f"{where}.mamba_heads keeps {per_group.tolist()} heads in the layer's {groups} groups; every group "
            "must keep at least one (its gated RMSNorm has no channel left otherwise)"
        )


def _check_expert_masks(i: int, p: LayerParts, mask: LayerMask) -> None:
    where = f"masks.layers[{i}]"
    if p.moe is None:
        set_ = [n for n in ("experts", "expert_ffn", "experts_per_token") if getattr(mask, n) is not None]
        if set_:
            raise ConfigError(f"{where}.{set_[0]} is set but layer {i} has no mixture of experts")
        return
    if mask.experts is None:
        if mask.expert_ffn is not None or mask.experts_per_token is not None:
            raise ConfigError(
                f"{where}: experts is None (MoE removed), so expert_ffn and experts_per_token must be too"
            )
        return
    e, f = p.num_experts, p.expert_width
    for name, tensor, shape in (("experts", mask.experts, (e,)), ("expert_ffn", mask.expert_ffn, (e, f))):
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ConfigError(f"{where}.{name} has shape {tuple(tensor.shape)}, layer {i} needs {shape}")
    kept = int(mask.experts.sum())
    k = int(p.router.top_k) if mask.experts_per_token is None else mask.experts_per_token
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= kept:
        raise ConfigError(
            f"{where}.experts_per_token={k} does not fit the {kept} experts kept in layer {i}; valid: 1..{kept}"
        )
    if mask.expert_ffn is not None and not bool(mask.expert_ffn[mask.experts.bool()].any(dim=-1).all()):
        raise ConfigError(f"{where}.expert_ffn keeps no channel of a kept expert; drop that expert instead")
    if mask.shared_ffn is not None and tuple(mask.shared_ffn.shape) != (p.shared_width,):
        raise ConfigError(
            f"{where}.shared_ffn has shape {tuple(mask.shared_ffn.shape)}, layer {i} needs ({p.shared_width},)"
        )
    groups = int(getattr(p.router, "num_group", 1) or 1)
    if groups > 1 and not bool(mask.experts.all()):
        raise ConfigError(
            f"{where}.experts drops experts of a router with group-limited routing (n_group={groups}); "
            "only n_group=1 is supported when dropping experts"
        )


def _layer_hooks(p: LayerParts, mask: LayerMask, scoring: str = "softmax") -> list[Any]:
    has_attn, has_ffn, has_mamba = p.attention is not None, p.mlp is not None, p.mamba is not None
    removed = mask.heads is None and mask.ffn is None and mask.experts is None and mask.mamba_heads is None
    if removed and (has_attn or has_ffn or p.moe is not None or has_mamba):
        return [bypass_layer(p.layer)]
    handles = []
    if has_attn:
        if mask.heads is None:
            handles.append(ReplacedForward(p.attention, lambda _: zero_sub_block(attention=True)))
        elif not bool(mask.heads.all()):
            head_mask = mask.heads.repeat_interleave(p.head_dim)  # (H·d,)
            handles.append(p.o_proj.register_forward_pre_hook(_scale_input(head_mask)))
    if has_ffn:
        if mask.ffn is None:
            handles.append(ReplacedForward(p.mlp, lambda _: zero_sub_block(attention=False)))
        elif not bool(mask.ffn.all()):
            handles.append(p.down_proj.register_forward_pre_hook(_scale_input(mask.ffn)))
    if p.moe is not None:
        handles += _expert_hooks(p, mask, scoring)
    if has_mamba and mask.mamba_heads is not None and not bool(mask.mamba_heads.all()):
        channels = mask.mamba_heads.repeat_interleave(int(p.mamba.head_dim))  # (H·P,)
        handles.append(p.mamba.norm.register_forward_hook(_kept_head_gated_norm(channels)))
    return handles


def _expert_hooks(p: LayerParts, mask: LayerMask, scoring: str) -> list[Any]:
    """Reroute among the kept experts with the mask's top-k; zero masked expert and shared channels."""
    if mask.experts is None:
        return [p.moe.register_forward_hook(_zero_output)]
    handles: list[Any] = []
    k = int(p.router.top_k) if mask.experts_per_token is None else mask.experts_per_token
    if not bool(mask.experts.all()) or k != int(p.router.top_k):
        reroute = _REROUTES.get(scoring)
        if reroute is None:  # an adapter's data, not user input
            raise AssertionError(f"no reroute for router_scoring {scoring!r}; known: {', '.join(_REROUTES)}")
        handles.append(p.router.register_forward_hook(reroute(mask.experts.bool(), k)))
    if mask.expert_ffn is not None and not bool(mask.expert_ffn.all()):
        handles.append(_ChannelMask.install(p.experts, _down_name(p), mask.expert_ffn))
    if mask.shared_ffn is not None and not bool(mask.shared_ffn.all()):
        handles.append(p.shared_expert.down_proj.register_forward_pre_hook(_scale_input(mask.shared_ffn)))
    return handles


def _down_name(p: LayerParts) -> str:
    return next(name for name, param in p.experts.named_parameters(recurse=False) if param is p.expert_down)


def _reroute(keep: torch.Tensor, k: int) -> Any:
    """A router hook: logits of dropped experts ``-inf``, then the router's own rule again (transformers'
    ``Qwen3MoeTopKRouter``: softmax in float32, top-``k``, renormalised iff ``norm_topk_prob``, cast
    back), so the kept experts' weights are what the sliced router gives them."""
    import torch

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        logits = output[0]  # (tokens, E)
        logits = logits.masked_fill(~keep.to(logits.device), float("-inf"))
        probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
        top, index = torch.topk(probs, k, dim=-1)  # (tokens, k)
        if renormalises_top_k(module):
            top = top / top.sum(dim=-1, keepdim=True)
        return (logits, top.to(logits.dtype), index, *output[3:])

    return hook


def _sigmoid_reroute(keep: torch.Tensor, k: int) -> Any:
    """A router hook replaying transformers' ``NemotronHTopkRouter`` (DeepSeek-V3 style) on the kept
    experts: scores ``sigmoid(logits)``, the top-``k`` of score + ``e_score_correction_bias`` with the
    dropped experts at ``-inf``, weights the chosen scores, renormalised iff ``norm_topk_prob`` (+1e-20,
    as there), times ``routed_scaling_factor``. ``n_group == 1`` (checked): no group-limited step."""
    import torch

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        logits = output[0]  # (tokens, E), float32
        scores = logits.sigmoid()
        choice = (scores + module.e_score_correction_bias).masked_fill(~keep.to(logits.device), float("-inf"))
        index = torch.topk(choice, k, dim=-1, sorted=False)[1]  # (tokens, k)
        weights = scores.gather(1, index)
        if module.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (logits, weights * module.routed_scaling_factor, index, *output[3:])

    return hook


# FamilyAdapter.router_scoring -> the reroute hook replaying that router's rule.
_REROUTES = {"softmax": _reroute, "sigmoid": _sigmoid_reroute}


def _kept_head_gated_norm(channels: torch.Tensor) -> Any:
    """A forward hook recomputing a Mamba-2 gated RMSNorm over the kept heads' channels ``(H·P,)``
    (:func:`kept_channel_gated_norm`)."""
    import torch

    constant = _Constant(channels)

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        return kept_channel_gated_norm(module, args, constant.like(args[0], torch.float32))

    return hook


def kept_channel_gated_norm(module: Any, args: tuple[Any, ...], channels: torch.Tensor) -> torch.Tensor:
    """Recompute a Mamba-2 gated RMSNorm (transformers' ``NemotronHRMSNormGated``: ``x·silu(z)`` in
    float32, one statistic per group of ``group_size`` channels, weight applied after the cast back)
    with each group's statistic over its kept channels only, ``sum_c m_c h_c^2 / sum_c m_c``, and
    pruned channels zeroed: what the norm of the sliced mixer, whose groups hold just the kept heads,
    computes. ``args``: the norm's ``(x, gate)``; ``channels`` ``(I,)`` float32 in [0, 1] (a soft
    mask, as the expert search's, weighs each channel's share of its group's statistic)."""
    import torch

    x, gate = args[0], args[1] if len(args) > 1 else None  # (batch, time, I) each
    h = x.to(torch.float32)
    if gate is not None:
        h = h * torch.nn.functional.silu(gate.to(torch.float32))
    m = channels.to(device=h.device, dtype=torch.float32).unflatten(-1, (-1, module.group_size))  # (G, I/G)
    grouped = h.unflatten(-1, (-1, module.group_size))  # (batch, time, G, I/G)
    variance = (grouped.pow(2) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
    normed = (grouped * torch.rsqrt(variance + module.variance_epsilon)).flatten(-2)
    y = module.weight * normed.to(x.dtype)
    return y * channels.to(device=y.device, dtype=y.dtype)


class _ChannelMask:
    """``experts.<down>`` ``(E, D, F)`` seen through ``weight · mask[:, None, :]`` while installed
    (``torch.nn.utils.parametrize``; the stored parameter is untouched and comes back on ``remove``).
    The product is recomputed on each access: one elementwise pass over the stacked weight per
    expert the forward visits."""

    def __init__(self, experts: Any, name: str) -> None:
        self.experts, self.name = experts, name

    @classmethod
    def install(cls, experts: Any, name: str, expert_ffn: torch.Tensor) -> _ChannelMask:
        import torch
        from torch.nn.utils import parametrize

        class _Mask(torch.nn.Module):
            def forward(self, weight: torch.Tensor) -> torch.Tensor:
                return weight * expert_ffn.to(device=weight.device, dtype=weight.dtype).unsqueeze(1)

        parametrize.register_parametrization(experts, name, _Mask())
        return cls(experts, name)

    def remove(self) -> None:
        from torch.nn.utils import parametrize

        if parametrize.is_parametrized(self.experts, self.name):
            parametrize.remove_parametrizations(self.experts, self.name, leave_parametrized=False)


def _hidden_hooks(
    model: Any, adapter: FamilyAdapter, parts: list[LayerParts], hidden: torch.Tensor, norm_offset: float
) -> list[Any]:
    handles = [adapter.embedding(model).register_forward_hook(_scale_output(hidden))]
    for p in parts:
        # every output added to the residual stream: a MoE block's (its experts' and shared expert's
        # sum) and a Mamba-2 mixer's, beside the attention's and the dense FFN's projections
        for proj in (p.o_proj, p.down_proj, p.moe, p.mamba.out_proj if p.mamba is not None else None):
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


class _Constant:
    """A fixed mask, converted to each (device, dtype) it meets once, on first use: a hook then
    multiplies by a tensor already beside its activations, so a bool mask held on the CPU costs one
    host-to-device copy per hook for the whole life of the handle, not one per forward pass."""

    def __init__(self, mask: torch.Tensor) -> None:
        self._mask = mask
        self._converted: dict[tuple[Any, Any], torch.Tensor] = {}

    def like(self, x: torch.Tensor, dtype: Any = None) -> torch.Tensor:
        """The mask on ``x``'s device in ``dtype`` (default ``x``'s)."""
        import torch

        key = (x.device, dtype or x.dtype)
        out = self._converted.get(key)
        if out is None:
            # A normal tensor even when first met under torch.inference_mode(): a later forward
            # with gradients may save it for backward, which an inference tensor refuses.
            with torch.inference_mode(False):
                out = self._converted[key] = self._mask.to(device=key[0], dtype=key[1])
        return out


def _scale_input(mask: torch.Tensor) -> Any:
    constant = _Constant(mask)

    def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]  # (..., features)
        return (x * constant.like(x), *args[1:])

    return hook


def _scale_output(mask: torch.Tensor) -> Any:
    constant = _Constant(mask)

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        return output * constant.like(output)

    return hook


def _kept_channel_rmsnorm(mask: torch.Tensor, offset: float = 0.0) -> Any:
    """Recompute an RMSNorm over the kept channels only, as the sliced model's norm does.

    ``offset`` 0: Llama's ``w · x̂`` (x̂ cast to the input dtype first); 1: Gemma's ``(1 + w) · x̂``
    computed in float32, then cast (transformers' ``Gemma3RMSNorm``).
    """
    import torch

    constant = _Constant(mask)

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        x = args[0]  # (batch, time, D)
        eps = getattr(module, "variance_epsilon", None)
        eps = module.eps if eps is None else eps
        m = constant.like(x, torch.float32)
        x32 = x.to(torch.float32)
        variance = (x32.pow(2) * m).sum(-1, keepdim=True) / m.sum()
        normed = x32 * torch.rsqrt(variance + eps)
        if offset:
            y = (normed * (offset + module.weight.float())).type_as(x)
        else:
            y = module.weight * normed.to(x.dtype)
        return y * constant.like(y)

    return hook
