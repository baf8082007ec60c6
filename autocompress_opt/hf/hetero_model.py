"""The package's own heterogeneous decoder: a DeciLM / ``nemotron_nas``-style transformers model.

A pruned architecture whose layers differ (per-layer query/KV heads, FFN width, attention or FFN
removed) has no plain Hugging Face config. This module defines one, ``model_type
"autocompress_decilm"``, and a ``PreTrainedModel`` that builds it. Importing the module registers
both with ``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM``, so
``AutoModelForCausalLM.from_pretrained(directory)`` loads an exported checkpoint without
``trust_remote_code``.

Config (``config.json``): the usual global keys plus ``block_configs``, one entry per layer, in the
shape vLLM's ``DeciLMForCausalLM`` reads::

    {"attention": {"no_op": false, "n_heads_in_group": 3, "num_heads": 6, "num_key_value_heads": 2},
     "ffn": {"no_op": false, "intermediate_size": 768, "ffn_mult": 2.0}}

This package's form is not what the serving engines read: ``export_model(..., decilm=True)`` /
``to_decilm`` (:mod:`autocompress_opt.prune.export`) write the DeciLM form vLLM and llama.cpp load
(run for real in ``tests/runtimes``), and :meth:`AutocompressDeciLMConfig.from_decilm` reads it back.
Where the two differ (vLLM's ``nemotron_nas`` reader):

* vLLM keeps ``num_attention_heads`` query heads in every layer and derives KV heads as
  ``num_attention_heads // n_heads_in_group``. Pruning whole KV groups changes the query heads per
  layer, so we store ``num_heads`` and ``num_key_value_heads`` per layer (our extension) and set
  ``n_heads_in_group = num_heads // num_key_value_heads``. vLLM reads such a checkpoint correctly
  only when every attention layer keeps ``num_attention_heads`` query heads.
* vLLM derives an FFN width from ``ffn_mult`` as ``int(2·ffn_mult·hidden/3)`` rounded up to a
  multiple of 256 (DeciLM's ``_ffn_mult_to_intermediate_size``). ``intermediate_size`` is the exact
  width here; ``ffn_mult = 3·width / (2·hidden)`` is recorded for readers that want it, and agrees
  with vLLM only for widths that are multiples of 256.
* Biases (Qwen2's q/k/v), Qwen3's per-head QK-norm and a model-wide sliding window (Mistral) are
  supported here through global flags; DeciLM/vLLM know none of them.
* Gemma 3 (``base_family "gemma3_text"``) is supported through its base family's traits (see
  :class:`~autocompress_opt.hf.adapters.FamilyAdapter`): ``(1 + w)`` RMSNorms (transformers'
  ``Gemma3RMSNorm``), a norm on each sub-block's output, the embedding scaled by
  ``sqrt(hidden_size)``, ``query_pre_attn_scalar`` for the attention scale, ``hidden_act``
  ``gelu_pytorch_tanh`` and ``final_logit_softcapping``. Its sliding-window / full-attention layer
  pattern is per layer: ``attention.window_length`` (DeciLM's key; ``null`` = full attention) in
  each block, one window size per model (``sliding_window``), and ``rope_parameters`` may be nested
  by layer type (``{"full_attention": {...}, "sliding_attention": {...}}``, Gemma 3's local and
  global RoPE bases). A block written without ``window_length`` inherits ``sliding_window``
  (Mistral-style checkpoints written before the key existed). ``window_length`` is the
  :class:`~autocompress_opt.arch.architecture.LayerSpec` ``window`` of the layer, both ways.

The layer code is one generic implementation (no copy per family): attribute names are those of
the base family's transformers modules (``self_attn.q_proj``, ``mlp.down_proj``, ``input_layernorm``,
Gemma's ``pre_feedforward_layernorm``...), so state-dict keys are the same as the parent family's,
and a dropped sub-block is ``None``. ``config.layer_types`` is derived from the blocks
(``"full_attention"``, ``"sliding_attention"``, or ``"mlp"`` for a layer without attention, the
label transformers' ``nemotron_h`` uses), so ``DynamicCache(config=...)`` gives each layer the
right cache: a window for sliding layers, and a placeholder that stores nothing (and that
``get_seq_length`` skips) for layers without attention.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel, slice_logits_to_keep
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm, Gemma3TextScaledWordEmbedding
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.utils.deprecation import deprecate_kwarg

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.block_configs import (
    FULL_ATTENTION,
    MODEL_TYPE,
    NO_ATTENTION,
    SLIDING_ATTENTION,
    AttentionBlock,
    BlockConfig,
    FFNBlock,
    architecture_from_block_configs,
    parse_block_configs,
)
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import FamilyAdapter, family_adapter

__all__ = [
    "MODEL_TYPE",
    "AttentionBlock",
    "AutocompressDeciLMConfig",
    "AutocompressDeciLMForCausalLM",
    "AutocompressDeciLMModel",
    "BlockConfig",
    "FFNBlock",
]


# ------------------------------------------------------------------------------------ config
@strict  # as every transformers config: type checks, and class validators collected from *this* class
class AutocompressDeciLMConfig(PreTrainedConfig):
    r"""Config of a heterogeneous decoder: global settings plus one ``block_configs`` entry per layer.

    Global keys follow ``LlamaConfig``; ``num_attention_heads`` / ``num_key_value_heads`` /
    ``intermediate_size`` are the largest per-layer values (what homogeneous readers expect).
    Family details: ``attention_bias`` (q/k/v biases), ``o_proj_bias``, ``mlp_bias``, ``qk_norm``
    (per-head RMSNorm on q and k, Qwen3 / Gemma 3), ``sliding_window`` (the window of every layer
    whose block has a ``window_length``; one size per model), ``query_pre_attn_scalar`` (attention
    scale ``s**-0.5`` instead of ``head_dim**-0.5``, Gemma 3), ``final_logit_softcapping``, and
    ``base_family``, the parent's ``model_type`` (it also selects the norm style, post-norms and
    embedding scaling: :meth:`traits`). ``layer_types`` is derived from the blocks and never read.
    """

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values"]  # noqa: RUF012 (transformers' class attribute)
    # rope_parameters may be nested by these layer types (Gemma 3: local and global RoPE bases).
    _rope_type_labels = (FULL_ATTENTION, SLIDING_ATTENTION)

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: int | float = 0.02
    rms_norm_eps: int | float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None
    attention_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    attention_dropout: int | float = 0.0
    sliding_window: int | None = None
    query_pre_attn_scalar: int | float | None = None
    final_logit_softcapping: int | float | None = None
    base_family: str = "llama"
    block_configs: list | None = None
    layer_types: list | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.block_configs is None:  # homogeneous default: every layer like the global keys
            layer = LayerSpec(
                True,
                self.num_attention_heads,
                self.num_key_value_heads,
                self.head_dim,
                True,
                self.intermediate_size,
                self.sliding_window,
            )
            block = BlockConfig.from_layer(layer).to_dict(self.hidden_size)
            self.block_configs = [block] * self.num_hidden_layers
        blocks = self.blocks  # validate once, eagerly
        windows = sorted({b.attention.window_length for b in blocks if b.attention.window_length is not None})
        if len(windows) > 1 or (windows and self.sliding_window not in (None, windows[0])):
            raise ConfigError(
                f"block_configs use window_length {windows} with sliding_window={self.sliding_window}; "
                f"{MODEL_TYPE} supports one sliding-window size per model"
            )
        if windows:
            self.sliding_window = windows[0]
        self.layer_types = [b.attention.layer_type for b in blocks]
        if all(t == NO_ATTENTION for t in self.layer_types):
            # A cache of placeholders only has no sequence length (transformers raises), so a model
            # without any attention gets empty full-attention slots instead; nothing writes them.
            self.layer_types = [FULL_ATTENTION] * len(blocks)
        super().__post_init__(**kwargs)

    def validate_layer_type(self) -> None:
        """``layer_types`` holds one entry per layer; ``"mlp"`` marks a layer without attention
        (transformers' ``nemotron_h`` does the same), which the stock check does not allow."""
        allowed = (FULL_ATTENTION, SLIDING_ATTENTION, NO_ATTENTION)
        kinds = self.layer_types or []
        if len(kinds) != self.num_hidden_layers or not set(kinds) <= set(allowed):
            raise ValueError(f"layer_types must list one of {allowed} per layer, got {self.layer_types}")

    @property
    def blocks(self) -> tuple[BlockConfig, ...]:
        """Parsed ``block_configs``; raises :class:`ConfigError` naming the bad entry."""
        return parse_block_configs(
            self.block_configs,
            num_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            sliding_window=self.sliding_window,
            base_family=self.base_family,
        )

    def traits(self) -> FamilyAdapter:
        """The base family's adapter: module names, norm style, embedding scaling."""
        return family_adapter(self.base_family)

    def rope_for(self, layer_type: str) -> dict[str, Any]:
        """The RoPE parameters of ``layer_type`` layers (``rope_parameters`` may be nested by type)."""
        rope = self.rope_parameters or {}
        return rope.get(layer_type, rope)

    def architecture(self, name: str = "") -> Architecture:
        """The exact :class:`Architecture` this config builds."""
        return architecture_from_block_configs(self.to_dict(), name=name or str(self._name_or_path or ""))

    @classmethod
    def from_decilm(cls, config: Mapping[str, Any]) -> AutocompressDeciLMConfig:
        """This class's config for a DeciLM (``nemotron-nas``) ``config.json`` dict, so a DeciLM
        checkpoint loads here without its ``auto_map`` code.

        Blocks are read as DeciLM readers read them: query heads ``num_attention_heads``, KV heads
        ``num_attention_heads / n_heads_in_group``, FFN width ``ceil256(int(2·ffn_mult·hidden/3))``
        unless the block records its exact ``intermediate_size`` (this package's exports do);
        ``replace_with_linear`` is refused (:class:`ConfigError`). The base family is Llama.
        """
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        blocks = []
        for i, raw in enumerate(config.get("block_configs") or []):
            attn, ffn = dict(raw.get("attention") or {}), dict(raw.get("ffn") or {})
            if not attn.get("no_op") and not attn.get("num_heads"):
                attn["num_heads"] = heads
            if not ffn.get("no_op") and not ffn.get("intermediate_size"):
                if ffn.get("ffn_mult") is None:
                    raise ConfigError(f"block_configs[{i}].ffn has neither ffn_mult nor intermediate_size")
                width = int(2 * float(ffn["ffn_mult"]) * hidden / 3)
                ffn["intermediate_size"] = -(-width // 256) * 256  # DeciLM's _ffn_mult_to_intermediate_size
            blocks.append({"attention": attn, "ffn": ffn})
        skip = {"model_type", "architectures", "auto_map", "transformers_version", "rope_theta", "block_configs"}
        settings = {key: value for key, value in config.items() if key not in skip}
        if settings.get("rope_parameters") is None and config.get("rope_theta") is not None:
            settings["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
        return cls(**{**settings, "base_family": "llama", "block_configs": blocks})

    @classmethod
    def from_architecture(cls, arch: Architecture, **settings: Any) -> AutocompressDeciLMConfig:
        """A config that builds ``arch`` exactly, each layer's window included; ``settings`` carry
        the parent's numerics.

        ``settings`` are other config keys (``rms_norm_eps``, ``rope_parameters``, ``hidden_act``,
        ``max_position_embeddings``, ``bos_token_id``, ``query_pre_attn_scalar``...). A
        ``sliding_window`` among them (a parent's) is checked against the layers' windows and is
        dropped when no layer slides; ``layer_types`` is refused (it is derived from the windows).
        Every attention layer must share one ``head_dim`` (one rotary table) and every sliding
        layer one window; raises :class:`ConfigError` otherwise.
        """
        head_dims = sorted({layer.head_dim for layer in arch.layers if layer.attention})
        if len(head_dims) > 1:
            raise ConfigError(f"layers use head_dim {head_dims}; {MODEL_TYPE} needs one head_dim for all layers")
        if "layer_types" in settings:
            raise ConfigError(
                "from_architecture takes each layer's attention kind from LayerSpec.window; pass no layer_types"
            )
        windows = sorted({layer.window for layer in arch.layers if layer.window is not None})
        if len(windows) > 1 or (windows and settings.get("sliding_window") not in (None, windows[0])):
            raise ConfigError(
                f"the layers use windows {windows} with sliding_window={settings.get('sliding_window')}; "
                f"{MODEL_TYPE} supports one sliding-window size per model"
            )
        attn = [layer for layer in arch.layers if layer.attention]
        ffn = [layer.ffn_width for layer in arch.layers if layer.ffn]
        heads = max((layer.num_heads for layer in attn), default=1)
        blocks = [BlockConfig.from_layer(layer).to_dict(arch.hidden_size) for layer in arch.layers]
        kwargs: dict[str, Any] = dict(
            vocab_size=arch.vocab_size,
            hidden_size=arch.hidden_size,
            num_hidden_layers=arch.num_layers,
            num_attention_heads=heads,
            num_key_value_heads=max((layer.num_kv_heads for layer in attn), default=1),
            # Without any attention layer head_dim is unused; 2 is the smallest value RoPE validation accepts.
            head_dim=head_dims[0] if head_dims else 2,
            intermediate_size=max(ffn, default=1),
            tie_word_embeddings=arch.tie_embeddings,
            attention_bias=arch.qkv_bias,
            o_proj_bias=arch.o_bias,
            mlp_bias=arch.mlp_bias,
            qk_norm=arch.qk_norm,
            base_family=arch.family,
            block_configs=blocks,
        )
        if arch.max_context:
            kwargs["max_position_embeddings"] = arch.max_context
        settings = {**settings, "sliding_window": windows[0] if windows else None}  # no layer slides: none to record
        return cls(**{**kwargs, **settings})


# ------------------------------------------------------------------------------------ layers
def _rms_norm(config: AutocompressDeciLMConfig, dim: int) -> nn.Module:
    """The base family's RMSNorm over ``dim`` channels: ``w·x̂`` (Llama) or ``(1 + w)·x̂`` (Gemma)."""
    offset = config.traits().norm_offset
    if offset == 0.0:
        return LlamaRMSNorm(dim, eps=config.rms_norm_eps)
    if offset == 1.0:
        return Gemma3RMSNorm(dim, eps=config.rms_norm_eps)
    raise ConfigError(f"no RMSNorm multiplies by {offset} + weight (base_family {config.base_family!r})")


class DeciLMMLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``; (batch, time, hidden) → (batch, time, hidden)."""

    def __init__(self, config: AutocompressDeciLMConfig, width: int) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, width, bias=bias)
        self.up_proj = nn.Linear(hidden, width, bias=bias)
        self.down_proj = nn.Linear(width, hidden, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DeciLMAttention(nn.Module):
    """Grouped-query self-attention with this layer's own head counts and window.

    Query head ``h`` reads KV head ``h // n_heads_in_group`` (transformers' ``repeat_kv``).
    ``layer_idx`` is the layer's index, which is also its KV-cache slot.
    """

    def __init__(self, config: AutocompressDeciLMConfig, block: AttentionBlock, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        assert config.head_dim is not None  # __post_init__ fills it
        self.head_dim: int = config.head_dim
        self.num_heads, self.num_key_value_heads = block.num_heads, block.num_key_value_heads
        self.num_key_value_groups = block.num_heads // block.num_key_value_heads
        # Gemma 3 scales by query_pre_attn_scalar**-0.5 (modeling_gemma3.Gemma3Attention), others by head_dim**-0.5.
        scalar = config.query_pre_attn_scalar
        self.scaling = (self.head_dim if scalar is None else scalar) ** -0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.sliding_window = block.window_length
        hidden, q, kv = config.hidden_size, block.num_heads * self.head_dim, block.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, q, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, kv, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, kv, bias=config.attention_bias)
        self.o_proj = nn.Linear(q, hidden, bias=config.o_proj_bias)
        self.q_norm = _rms_norm(config, self.head_dim) if config.qk_norm else None
        self.k_norm = _rms_norm(config, self.head_dim) if config.qk_norm else None

    def forward(
        self,
        hidden_states: torch.Tensor,  # (batch, time, hidden)
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin: (batch, time, head_dim)
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)  # (batch, time, heads, head_dim)
        query, key = self.q_proj(hidden_states).view(shape), self.k_proj(hidden_states).view(shape)
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3, Gemma 3: RMSNorm over head_dim, before RoPE
            query, key = self.q_norm(query), self.k_norm(key)
        query, key = query.transpose(1, 2), key.transpose(1, 2)  # (batch, heads, time, head_dim)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        out = out.reshape(*hidden_states.shape[:-1], -1).contiguous()  # (batch, time, heads·head_dim)
        return self.o_proj(out), weights


class DeciLMDecoderLayer(nn.Module):
    """Pre-norm residual block whose attention and MLP may each be absent (``None``).

    An absent sub-block has no norms and adds nothing to the residual stream. Norm attributes take
    the base family's names (Llama: ``input_layernorm``, ``post_attention_layernorm`` before the
    MLP; Gemma 3 adds a norm on each sub-block's output: ``post_attention_layernorm``,
    ``post_feedforward_layernorm``, and calls the pre-MLP norm ``pre_feedforward_layernorm``).
    """

    def __init__(self, config: AutocompressDeciLMConfig, block: BlockConfig, layer_idx: int) -> None:
        super().__init__()
        hidden, paths = config.hidden_size, config.traits().paths
        has_attn, has_ffn = not block.attention.no_op, not block.ffn.no_op
        self._norm_names = (paths.input_norm, paths.attn_out_norm, paths.ffn_norm, paths.ffn_out_norm)
        for name, present in zip(self._norm_names, (has_attn, has_attn, has_ffn, has_ffn)):
            if name is not None:
                setattr(self, name, _rms_norm(config, hidden) if present else None)
        self.self_attn = DeciLMAttention(config, block.attention, layer_idx) if has_attn else None
        self.mlp = DeciLMMLP(config, block.ffn.intermediate_size) if has_ffn else None

    def _norm(self, which: int, x: torch.Tensor) -> torch.Tensor:
        """Apply norm ``which`` (0 input, 1 attention output, 2 pre-MLP, 3 MLP output) if the family has it."""
        name = self._norm_names[which]
        return x if name is None else getattr(self, name)(x)

    def forward(
        self,
        hidden_states: torch.Tensor,  # (batch, time, hidden)
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self.self_attn is not None:
            attn_out, _ = self.self_attn(
                hidden_states=self._norm(0, hidden_states),
                position_embeddings=position_embeddings,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                **kwargs,
            )
            hidden_states = hidden_states + self._norm(1, attn_out)
        if self.mlp is not None:
            hidden_states = hidden_states + self._norm(3, self.mlp(self._norm(2, hidden_states)))
        return hidden_states


# ------------------------------------------------------------------------------------ models
class AutocompressDeciLMPreTrainedModel(PreTrainedModel):
    config: AutocompressDeciLMConfig
    config_class = AutocompressDeciLMConfig
    base_model_prefix = "model"
    _no_split_modules = ["DeciLMDecoderLayer"]  # noqa: RUF012 (transformers' class attribute)
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        # As Gemma3PreTrainedModel._init_weights: (1 + w) norms start at w = 0, and the embedding
        # scale is a non-persistent buffer that a load from the meta device must recompute.
        if isinstance(module, Gemma3RMSNorm):
            init.zeros_(module.weight)
        elif isinstance(module, Gemma3TextScaledWordEmbedding):
            init.constant_(module.embed_scale, module.scalar_embed_scale)


def _rotary(config: AutocompressDeciLMConfig, layer_type: str) -> LlamaRotaryEmbedding:
    """The rotary table of ``layer_type`` layers (a config view whose ``rope_parameters`` are flat)."""
    rope = config.rope_for(layer_type)
    if rope is config.rope_parameters:
        return LlamaRotaryEmbedding(config=config)  # type: ignore[arg-type]  # reads the Llama keys it has
    view = copy.copy(config)
    view.rope_parameters = rope
    return LlamaRotaryEmbedding(config=view)  # type: ignore[arg-type]


class AutocompressDeciLMModel(AutocompressDeciLMPreTrainedModel):
    """Embedding, heterogeneous decoder layers, final RMSNorm; returns the last hidden state."""

    def __init__(self, config: AutocompressDeciLMConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens: nn.Embedding
        if config.traits().embed_scale:  # Gemma: embedding × sqrt(hidden_size), as Gemma3TextModel
            self.embed_tokens = Gemma3TextScaledWordEmbedding(
                config.vocab_size,
                config.hidden_size,
                self.padding_idx,  # type: ignore[arg-type]  # None (no padding row) works as in nn.Embedding
                embed_scale=config.hidden_size**0.5,
            )
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(DeciLMDecoderLayer(config, block, i) for i, block in enumerate(config.blocks))
        self.norm = _rms_norm(config, config.hidden_size)
        self.layer_kinds = [block.attention.layer_type for block in config.blocks]  # NO_ATTENTION: none
        self.attention_kinds = sorted(set(self.layer_kinds) - {NO_ATTENTION})
        self.rotary_emb = nn.ModuleDict({kind: _rotary(config, kind) for kind in self.attention_kinds})
        self.gradient_checkpointing = False
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (batch, time)
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,  # (batch, time) int64
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        kwargs.pop("return_dict", None)
        want_hidden = kwargs.pop("output_hidden_states", None)
        want_hidden = self.config.output_hidden_states if want_hidden is None else want_hidden
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = HeteroCache(config=self.config)
        if position_ids is None:
            seen = _seen_tokens(cache, self.config.layer_types)
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + seen).unsqueeze(0)
        masks = (
            attention_mask
            if isinstance(attention_mask, dict)
            else self._masks(inputs_embeds, attention_mask, cache, position_ids)
        )
        hidden_states = inputs_embeds
        rotary = {
            kind: self.rotary_emb[kind](hidden_states, position_ids=position_ids)  # (cos, sin) per kind
            for kind in self.attention_kinds
        }
        all_hidden = [hidden_states]
        for layer, kind in zip(self.layers, self.layer_kinds):
            hidden_states = layer(
                hidden_states,
                attention_mask=masks.get(kind),
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                position_embeddings=rotary.get(kind),
                **kwargs,
            )
            all_hidden.append(hidden_states)
        hidden_states = self.norm(hidden_states)
        # transformers' convention: embeddings, then each layer's output, the last one after the final norm
        all_hidden[-1] = hidden_states
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states, cache=cache, hidden_states=tuple(all_hidden) if want_hidden else None
        )

    def _masks(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Cache | None,
        position_ids: torch.Tensor,
    ) -> dict[str, Any]:
        """One attention mask per attention kind present (causal; causal within the window)."""
        make = {FULL_ATTENTION: create_causal_mask, SLIDING_ATTENTION: create_sliding_window_causal_mask}
        return {
            kind: make[kind](
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                cache=cache,
                position_ids=position_ids,
            )
            for kind in self.attention_kinds
        }


class HeteroCache(DynamicCache):
    """transformers' ``DynamicCache`` whose ``get_seq_length()`` of a layer without attention (a
    placeholder that stores nothing) reads the first layer with attention. transformers >= 5.25's
    ``Cache.get_seq_length()`` reads layer 0 whatever it is (its placeholder has no length), and
    ``generate`` asks it: a model whose first layer has no attention would fail."""

    def get_seq_length(self, layer_idx: int = 0) -> int:
        layers = self.layers
        if layer_idx < len(layers) and not hasattr(layers[layer_idx], "get_seq_length"):
            layer_idx = next((i for i, layer in enumerate(layers) if hasattr(layer, "get_seq_length")), len(layers))
        return int(super().get_seq_length(layer_idx))


def _seen_tokens(cache: Cache | None, layer_types: list | None) -> int:
    """Tokens ``cache`` already holds, read from the first layer with attention (any ``Cache``,
    :class:`HeteroCache` or not)."""
    if cache is None:
        return 0
    first = next((i for i, kind in enumerate(layer_types or []) if kind != NO_ATTENTION), 0)
    return int(cache.get_seq_length(first))


class AutocompressDeciLMForCausalLM(AutocompressDeciLMPreTrainedModel, GenerationMixin):
    """Causal LM over :class:`AutocompressDeciLMModel`; supports ``generate`` with a ``DynamicCache``."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # noqa: RUF012 (transformers')

    def _prepare_cache_for_generation(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' cache for ``generate``; its plain ``DynamicCache`` becomes a :class:`HeteroCache`
        (same state, the length read from a layer with attention)."""
        out = super()._prepare_cache_for_generation(*args, **kwargs)  # type: ignore[misc]
        model_kwargs = next((a for a in args if isinstance(a, dict) and "cache" in a), kwargs.get("model_kwargs"))
        cache = model_kwargs.get("cache") if isinstance(model_kwargs, dict) else None
        if type(cache) is DynamicCache:
            cache.__class__ = HeteroCache
        return out

    def __init__(self, config: AutocompressDeciLMConfig) -> None:
        super().__init__(config)
        self.model = AutocompressDeciLMModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)  # (batch, time, vocab)
        cap = self.config.final_logit_softcapping
        if cap is not None:  # Gemma: cap · tanh(logits / cap)
            logits = torch.tanh(logits / cap) * cap
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=outputs.cache, hidden_states=outputs.hidden_states
        )


def _register() -> None:
    """Make ``Auto*`` classes resolve ``model_type "autocompress_decilm"`` (idempotent)."""
    AutoConfig.register(MODEL_TYPE, AutocompressDeciLMConfig, exist_ok=True)
    AutoModel.register(AutocompressDeciLMConfig, AutocompressDeciLMModel, exist_ok=True)
    AutoModelForCausalLM.register(AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM, exist_ok=True)


_register()
