"""Which transformers model an :class:`Architecture` becomes, and building it with random weights.

One decision, shared by export (:func:`autocompress_opt.prune.slicing.materialize` writes the
sliced weights into the model :func:`model_config` describes) and by the CPU timing that
calibrates the cost profile (:func:`autocompress_opt.serving.timing.build_torch_model` times the
model :func:`build_model` returns), so the profile is fitted on the model that export writes:

* a **uniform** architecture (every layer present with the same sizes) becomes a plain model of
  its family (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Gemma3ForCausalLM``...) when that
  family's config can express it and survives a save/load round trip (transformers re-validates
  on load: ``LlamaConfig`` rejects ``hidden_size % num_attention_heads != 0``, a llama config has
  no sliding window...);
* anything else becomes the package's heterogeneous decoder,
  :class:`~autocompress_opt.hf.hetero_model.AutocompressDeciLMForCausalLM`.

``settings`` are a parent's numerics under config keys (:func:`inherited_settings` reads them off a
parent's config): ``rms_norm_eps``, ``rope_parameters``, ``hidden_act``, token ids... Sizes always
come from the architecture.
"""

from __future__ import annotations

import copy
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError

__all__ = ["build_model", "inherited_settings", "model_config"]

# Config keys that carry a parent's numerics into a child (not its sizes), with the names a family's
# config may use instead (Gemma 3 calls the MLP activation ``hidden_activation``).
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

# The config keys a plain config's sizes live under, in the order :func:`_plain_config` sets them.
_SIZE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)

# A setting the heterogeneous decoder cannot compute: it is a causal decoder only.
_BIDIRECTIONAL = "use_bidirectional_attention"


def inherited_settings(config: Any) -> dict[str, Any]:
    """The numerics of a parent's transformers ``config`` under this package's keys (deep copies).

    ``use_bidirectional_attention=True`` is carried too, so that :func:`model_config` refuses it
    where it would build the (causal-only) heterogeneous decoder.
    """
    settings = {}
    for key in _INHERITED_KEYS:
        value = next(
            (getattr(config, n) for n in _KEY_NAMES.get(key, (key,)) if getattr(config, n, None) is not None), None
        )
        if value is not None:
            settings[key] = copy.deepcopy(value)
    if getattr(config, _BIDIRECTIONAL, False):
        settings[_BIDIRECTIONAL] = True
    return settings


def model_config(arch: Architecture, *, base_config: Any = None, heterogeneous: bool = False, **settings: Any) -> Any:
    """The transformers config of the model ``arch`` becomes (module doc): plain family or heterogeneous.

    Args:
        arch: the architecture, built exactly (fully dropped layers become no-op blocks of the
            heterogeneous decoder: leave them out with :meth:`Architecture.active` to get the model
            export writes, whose plans never hold them).
        base_config: a config of ``arch``'s family to start the plain config from (a homogeneous
            parent's, deep-copied, its ``layer_types`` already one per layer of ``arch``); its size
            keys are overwritten, every other key kept. ``None``: :meth:`Architecture.to_hf_config`
            plus ``settings`` (their ``sliding_window`` dropped: the layers' windows are in ``arch``).
        heterogeneous: always build the heterogeneous decoder.
        settings: a parent's numerics (:func:`inherited_settings`); they also configure the
            heterogeneous decoder when it is chosen.

    Returns:
        A plain family config when ``arch.is_uniform``, ``heterogeneous`` is false and the family
        can express and reload it; else an ``AutocompressDeciLMConfig``.

    Raises :class:`ConfigError` when the heterogeneous decoder is chosen and cannot build ``arch``
    (attention layers with different ``head_dim``, two window sizes) or ``settings`` ask for
    bidirectional attention.
    """
    from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig

    if arch.is_uniform and not heterogeneous:
        config = _plain_config(arch, base_config, settings)
        if config is not None:
            return config
    if settings.pop(_BIDIRECTIONAL, False):
        raise ConfigError(
            "the parent uses bidirectional attention (use_bidirectional_attention=True); "
            "only causal decoders can be pruned"
        )
    return AutocompressDeciLMConfig.from_architecture(arch, **settings)


def _plain_config(arch: Architecture, base_config: Any, settings: dict[str, Any]) -> Any | None:
    """A config of ``arch``'s family that builds ``arch``, or None if the family cannot say it."""
    if base_config is None:
        config = _family_config(arch, settings)
        if config is None:
            return None
    else:
        config = copy.deepcopy(base_config)
    layer = arch.layers[0]
    sizes = (arch.hidden_size, arch.num_layers, layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.ffn_width)
    for key, value in zip(_SIZE_KEYS, sizes):
        setattr(config, key, value)
    return config if _reloadable(config) else None


def _family_config(arch: Architecture, settings: dict[str, Any]) -> Any | None:
    """``arch.to_hf_config()`` with ``settings`` applied, or None if the family cannot say ``arch``
    (including windows it cannot express: :meth:`Architecture.to_hf_config` sets the layers' windows)."""
    settings = {k: v for k, v in settings.items() if k != "sliding_window"}  # the windows are in arch
    try:
        config = arch.to_hf_config()
    except (ConfigError, *_validation_errors()):  # type: ignore[misc]  # a tuple of exception classes
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


def build_model(
    arch: Architecture,
    *,
    dtype: Any = None,
    device: Any = "cpu",
    seed: int = 0,
    attn_implementation: str | None = None,
    **settings: Any,
) -> Any:
    """The model of :func:`model_config` (``arch``, ``settings``) with random weights, in eval mode.

    Weights are the model class's own transformers initialisation (``normal(0,
    initializer_range)`` matrices, default 0.02; norms at their identity; zero biases) drawn
    from the global RNG seeded with ``seed`` inside :func:`torch.random.fork_rng`, so the caller's
    RNG state is left untouched. Same ``arch``, ``settings``, ``seed`` and device type → same
    weights. The parameter count is ``arch.num_params``.

    Args:
        arch: the architecture (see :func:`model_config`).
        dtype: parameter dtype (a floating ``torch.dtype``); ``None`` means ``torch.float32``.
        device: where the parameters are created (``"cpu"``, ``"cuda"``, a ``torch.device``).
        seed: the weights' seed.
        attn_implementation: transformers' attention kernel (``"eager"``, ``"sdpa"``...);
            ``None`` leaves transformers' default.
        settings: config keys, as for :func:`model_config`.

    Returns:
        The model in ``eval()`` mode with gradients disabled. Raises :class:`ConfigError` for a
        non-floating ``dtype`` or an architecture :func:`model_config` refuses.
    """
    import torch
    from transformers import AutoModelForCausalLM

    import autocompress_opt.hf.hetero_model  # noqa: F401 (registers the heterogeneous decoder with AutoModel)

    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    device = torch.device(device)
    config = model_config(arch, **settings)
    forked = [] if device.type == "cpu" else [device]  # the CPU generator is always forked
    with torch.random.fork_rng(devices=forked, device_type=device.type), device:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval().requires_grad_(False)
