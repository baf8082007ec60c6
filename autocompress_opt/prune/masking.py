"""Hard masks on a real parent: the parent computing a pruning plan with zeroed heads and FFN
channels, removed sub-blocks, skipped layers and masked hidden channels, no weights changed
(:func:`apply_masks`). All-ones masks reproduce the parent exactly; the masked parent's logits
equal the sliced model's (:mod:`autocompress_opt.prune.slicing`) to float tolerance.

A masked hidden norm computes its statistic over the kept channels, ``sum_c m_c x_c^2 / sum_c m_c``,
so a hidden mask means *channel removal*, as slicing does (see :mod:`~autocompress_opt.prune.slicing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import FamilyAdapter, LayerParts, adapter_for, bypass_layer

if TYPE_CHECKING:
    import torch


__all__ = ["LayerMask", "MaskHandle", "Masks", "apply_masks"]


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
