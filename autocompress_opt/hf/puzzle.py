"""Nemotron-H with per-layer MoE sizes: NVIDIA's "Puzzle" form, ``model_type "nemotron_h_puzzle"``.

NVIDIA's Puzzle models (``NVIDIA-Nemotron-Labs-3-Puzzle-75B-A9B``) store a Nemotron-H whose MoE layers
each have their own expert width and experts per token: NemotronH's global config keys plus
``block_configs``, one entry per layer::

    {"block_type": "mamba"}
    {"block_type": "moe", "moe_intermediate_size": 32, "num_experts_per_tok": 1}
    {"block_type": "attention"}
    {"block_type": "mlp"}

``block_type`` is the layer's kind as the released checkpoints spell it (Megatron's names, written
here); transformers' ``layers_block_type`` names (``linear_attention``, ``full_attention``) are read
too. A MoE entry without a size takes the global one. Everything else is global, as llama.cpp's
converter (``conversion/nemotron.py``, ``NemotronHPuzzleModel``) and runtime (``n_ff_exp`` and
``n_expert_used`` per layer) read it: ``n_routed_experts``, ``moe_shared_expert_intermediate_size``,
``moe_latent_size``, the Mamba-2 and attention sizes. ``block_configs`` is the authority on the layer
kinds (``layers_block_type`` is derived from it), and the global ``moe_intermediate_size`` /
``num_experts_per_tok`` are the largest per-layer values (what a reader of one size may plan for).

:class:`NemotronHPuzzleForCausalLM` is transformers' ``NemotronHForCausalLM`` whose MoE mixers are
rebuilt from a per-layer copy of the config (:meth:`NemotronHPuzzleConfig.layer_config`): no forked
model code. Weights are stored as transformers stores Nemotron-H (its ``nemotron_h`` checkpoint
conversion, registered for this model_type too): ``backbone.*`` names and one tensor per expert on
save; on load ``backbone.*`` or ``model.*`` trunks, per-expert or stacked experts (the released BF16
checkpoint's ``model.*`` spelling included).

Importing this module registers the config and model with ``AutoConfig`` / ``AutoModelForCausalLM``
(and the weight conversion), so ``AutoModelForCausalLM.from_pretrained(directory)`` loads a saved
Puzzle model without ``trust_remote_code``; :func:`~autocompress_opt.hf.loading.load_model` imports it
for such a directory.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.models.nemotron_h.configuration_nemotron_h import NemotronHConfig
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHForCausalLM, NemotronHMoE

from autocompress_opt.errors import ConfigError, check_int

__all__ = [
    "BLOCK_TYPES",
    "MODEL_TYPE",
    "PER_LAYER_KEYS",
    "NemotronHPuzzleConfig",
    "NemotronHPuzzleForCausalLM",
    "plain_config",
    "puzzle_config",
]

MODEL_TYPE = "nemotron_h_puzzle"
# block_type as written (the released checkpoints' / Megatron's spelling) -> transformers' layers_block_type.
BLOCK_TYPES: Mapping[str, str] = {
    "mamba": "linear_attention",
    "attention": "full_attention",
    "moe": "moe",
    "mlp": "mlp",
}
_WRITTEN = {kind: name for name, kind in BLOCK_TYPES.items()}  # transformers' kind -> block_type written
# The keys a MoE layer's block_configs entry sets for that layer (llama.cpp: expert_feed_forward_length
# and expert_used_count, per layer); every other key is global.
PER_LAYER_KEYS = ("moe_intermediate_size", "num_experts_per_tok")


# Channels per 16-byte row in bf16 (8; 4 in float32): expert widths that transformers' grouped kernel takes.
_GROUPED_MM_CHANNELS = 8


@strict  # as every transformers config: type checks on the declared fields
class NemotronHPuzzleConfig(NemotronHConfig):
    r"""NemotronH's config plus ``block_configs`` (module docstring), one entry per layer.

    block_configs (`list[dict]`, *optional*):
        One ``{"block_type": ..., [moe_intermediate_size, num_experts_per_tok]}`` per layer; None: one
        per ``layers_block_type`` entry, every MoE layer of the global sizes.
    """

    model_type = MODEL_TYPE
    block_configs: list[dict] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        blocks = None
        if self.block_configs is not None:  # the authority on the layer kinds (a pattern given too is dropped)
            kwargs.pop("hybrid_override_pattern", None)
            blocks = [_checked_block(i, b) for i, b in enumerate(self.block_configs)]
            self.layers_block_type = [BLOCK_TYPES[b["block_type"]] for b in blocks]
        super().__post_init__(**kwargs)
        if blocks is None:  # NemotronHConfig's __post_init__ has set the kinds (its default when none given)
            blocks = [{"block_type": _WRITTEN.get(kind, kind)} for kind in self.layers_block_type or ()]
        self.block_configs = [_sized(i, b, self) for i, b in enumerate(blocks)]

    def layer_config(self, index: int) -> NemotronHConfig:
        """A copy of this config with layer ``index``'s MoE sizes as the global ones (what transformers'
        ``NemotronHMoE`` reads); the config itself for a layer without a MoE."""
        block = self.block_configs[index] if self.block_configs is not None else {}
        if block.get("block_type") != "moe":
            return self
        layer = copy.copy(self)
        for key in PER_LAYER_KEYS:
            setattr(layer, key, block[key])
        if block["moe_intermediate_size"] % _GROUPED_MM_CHANNELS:
            # transformers' grouped expert kernel (torch._grouped_mm) takes rows of whole 16 bytes only:
            # a width the per-layer search left at another size runs its experts one at a time instead
            layer._experts_implementation = "eager"
        return layer


def _checked_block(index: int, block: Any) -> dict[str, Any]:
    """A ``block_configs`` entry with its block_type in the written spelling (:data:`BLOCK_TYPES`)."""
    where = f"block_configs[{index}]"
    if not isinstance(block, Mapping) or "block_type" not in block:
        raise ConfigError(f"{where} must be a mapping with a 'block_type', got {block!r}")
    kind = str(block["block_type"])
    name = _WRITTEN.get(kind, kind)
    if name not in BLOCK_TYPES:
        valid = sorted({*BLOCK_TYPES, *_WRITTEN})
        raise ConfigError(f"{where}.block_type {kind!r} is not a Nemotron-H layer kind; valid: {', '.join(valid)}")
    return {**block, "block_type": name}


def _sized(index: int, block: dict[str, Any], config: Any) -> dict[str, Any]:
    """A MoE entry with both :data:`PER_LAYER_KEYS` checked (absent: ``config``'s global value), top-k
    within the routed experts; any other entry as it is."""
    if block["block_type"] != "moe":
        return block
    where = f"block_configs[{index}]"
    out = dict(block)
    for key in PER_LAYER_KEYS:
        out[key] = check_int(getattr(config, key) if out.get(key) is None else out[key], f"{where}.{key}")
    if out["num_experts_per_tok"] > config.n_routed_experts:
        raise ConfigError(
            f"{where}.num_experts_per_tok={out['num_experts_per_tok']} exceeds n_routed_experts="
            f"{config.n_routed_experts}; valid: 1..{config.n_routed_experts}"
        )
    return out


def _block(kind: str, config: Any, **sizes: int) -> dict[str, Any]:
    """The ``block_configs`` entry of a layer of transformers' ``kind``; a MoE's sizes from ``sizes``,
    else ``config``'s."""
    block: dict[str, Any] = {"block_type": _WRITTEN.get(kind, kind)}
    if kind == "moe":
        block.update({key: int(sizes.get(key, getattr(config, key))) for key in PER_LAYER_KEYS})
    return block


class NemotronHPuzzleForCausalLM(NemotronHForCausalLM):
    """transformers' ``NemotronHForCausalLM`` with each MoE mixer built from its layer's
    :meth:`~NemotronHPuzzleConfig.layer_config` (its own expert width and router ``top_k``).

    The parent builds every MoE layer at the global sizes first; they are replaced before any weight is
    loaded (under ``from_pretrained`` both live on the meta device, so nothing is allocated twice)."""

    config_class = NemotronHPuzzleConfig
    config: NemotronHPuzzleConfig

    def __init__(self, config: NemotronHPuzzleConfig) -> None:
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            if layer.block_type == "moe":
                layer.mixer = NemotronHMoE(config.layer_config(i), layer_idx=i)
        self.post_init()  # initialise the rebuilt mixers, as the parent's post_init did the others


def puzzle_config(config: Any, sizes: Mapping[int, Mapping[str, int]]) -> NemotronHPuzzleConfig:
    """A :class:`NemotronHPuzzleConfig` of ``config`` (a NemotronH or Puzzle config) whose MoE layer
    ``i`` has the :data:`PER_LAYER_KEYS` of ``sizes[i]`` (a layer not in ``sizes`` keeps its own); the
    global sizes become the largest per-layer ones."""
    kinds = list(config.layers_block_type)
    layer = lambda i: config.layer_config(i) if isinstance(config, NemotronHPuzzleConfig) else config
    blocks = [_block(kind, layer(i), **sizes.get(i, {})) for i, kind in enumerate(kinds)]
    moe = [b for b in blocks if b["block_type"] == "moe"]
    data = _plain_dict(config)
    data.update({key: max(b[key] for b in moe) for key in PER_LAYER_KEYS} if moe else {})
    return NemotronHPuzzleConfig(**data, block_configs=blocks)


def plain_config(config: Any) -> NemotronHConfig:
    """A plain ``NemotronHConfig`` of a Puzzle ``config`` whose MoE layers all have one size (raises
    :class:`ConfigError` otherwise); ``config`` itself when it is plain already."""
    if not isinstance(config, NemotronHPuzzleConfig):
        return config
    moe = {tuple(b[k] for k in PER_LAYER_KEYS) for b in config.block_configs or () if b["block_type"] == "moe"}
    if len(moe) > 1:
        raise ConfigError(f"the MoE layers have different (width, top-k) sizes {sorted(moe)}: no plain config")
    data = _plain_dict(config)
    data.update(dict(zip(PER_LAYER_KEYS, moe.pop())) if moe else {})
    return NemotronHConfig(**data)


def _plain_dict(config: Any) -> dict[str, Any]:
    """``config``'s keys as NemotronHConfig takes them: no model_type (a class attribute) or block_configs."""
    data = config.to_dict()
    for key in ("model_type", "block_configs", "architectures", "transformers_version"):
        data.pop(key, None)
    data["layers_block_type"] = list(config.layers_block_type)
    return data


def _register() -> None:
    """Make ``Auto*`` classes resolve ``model_type "nemotron_h_puzzle"`` and store its weights as
    Nemotron-H's (idempotent)."""
    AutoConfig.register(MODEL_TYPE, NemotronHPuzzleConfig, exist_ok=True)
    AutoModelForCausalLM.register(NemotronHPuzzleConfig, NemotronHPuzzleForCausalLM, exist_ok=True)
    if get_checkpoint_conversion_mapping(MODEL_TYPE) is None:
        register_checkpoint_conversion_mapping(MODEL_TYPE, get_checkpoint_conversion_mapping("nemotron_h"))


_register()
