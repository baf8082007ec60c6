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

Compatibility limits with vLLM's ``nemotron_nas`` reader (which we cannot run here):

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

The layer code is one generic implementation (no copy per family): attribute names match the
transformers Llama/Qwen modules (``self_attn.q_proj``, ``mlp.down_proj``, ``input_layernorm``...),
so state-dict keys are the same as the parent family's, and a dropped sub-block is ``None``.
KV-cache slots are numbered over the layers that have attention (0, 1, ...), so a layer without
attention takes no slot and ``DynamicCache`` positions stay right when layer 0 has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel, slice_logits_to_keep
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.utils.deprecation import deprecate_kwarg

from autocompress_opt.architecture import SUPPORTED_FAMILIES, Architecture, LayerSpec
from autocompress_opt.errors import ConfigError, suggest

__all__ = [
    "MODEL_TYPE",
    "AttentionBlock",
    "AutocompressDeciLMConfig",
    "AutocompressDeciLMForCausalLM",
    "AutocompressDeciLMModel",
    "BlockConfig",
    "FFNBlock",
]

MODEL_TYPE = "autocompress_decilm"


# ------------------------------------------------------------------------------ block configs
@dataclass(frozen=True)
class AttentionBlock:
    """One layer's attention: ``no_op`` (removed) or ``num_heads`` query heads over KV heads."""

    no_op: bool = False
    num_heads: int = 0
    num_key_value_heads: int = 0

    @property
    def n_heads_in_group(self) -> int | None:
        """Query heads per KV head (DeciLM's name); None for a removed attention."""
        return None if self.no_op else self.num_heads // self.num_key_value_heads

    def to_dict(self) -> dict[str, Any]:
        return {"no_op": self.no_op, "replace_with_linear": False, "n_heads_in_group": self.n_heads_in_group,
                "num_heads": self.num_heads, "num_key_value_heads": self.num_key_value_heads}


@dataclass(frozen=True)
class FFNBlock:
    """One layer's gated MLP: ``no_op`` (removed) or ``intermediate_size`` channels."""

    no_op: bool = False
    intermediate_size: int = 0

    def to_dict(self, hidden_size: int) -> dict[str, Any]:
        # ffn_mult as DeciLM defines it: intermediate = 2·ffn_mult·hidden/3 (before rounding).
        mult = None if self.no_op else round(3 * self.intermediate_size / (2 * hidden_size), 6)
        return {"no_op": self.no_op, "replace_with_linear": False,
                "intermediate_size": self.intermediate_size, "ffn_mult": mult}


@dataclass(frozen=True)
class BlockConfig:
    """One layer of a heterogeneous decoder (DeciLM ``block_configs`` entry)."""

    attention: AttentionBlock
    ffn: FFNBlock

    @classmethod
    def from_layer(cls, layer: LayerSpec) -> BlockConfig:
        return cls(
            AttentionBlock(not layer.attention, layer.num_heads, layer.num_kv_heads),
            FFNBlock(not layer.ffn, layer.ffn_width),
        )

    def to_dict(self, hidden_size: int) -> dict[str, Any]:
        return {"attention": self.attention.to_dict(), "ffn": self.ffn.to_dict(hidden_size)}

    @classmethod
    def from_dict(cls, data: Any, where: str, num_attention_heads: int) -> BlockConfig:
        """Parse one ``block_configs`` entry; ``where`` names it in errors (``block_configs[3]``)."""
        attn, ffn = _section(data, "attention", where), _section(data, "ffn", where)
        no_attn, no_ffn = bool(attn.get("no_op", False)), bool(ffn.get("no_op", False))
        for sec, name in ((attn, "attention"), (ffn, "ffn")):
            if sec.get("replace_with_linear"):
                raise ConfigError(f"{where}.{name}.replace_with_linear=true is not supported (no linear replacements)")
        heads = kv = width = 0
        if not no_attn:
            heads, kv = _heads(attn, where, num_attention_heads)
        if not no_ffn:
            width = _positive(ffn.get("intermediate_size"), f"{where}.ffn.intermediate_size")
        try:
            spec = LayerSpec(attention=not no_attn, num_heads=heads, num_kv_heads=kv, head_dim=1,
                             ffn=not no_ffn, ffn_width=width)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return cls.from_layer(spec)


def _section(data: Any, name: str, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping with 'attention' and 'ffn', got {data!r}")
    section = data.get(name, {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}.{name} must be a mapping, got {section!r}")
    return section


def _positive(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where} must be a positive int, got {value!r}")
    return value


def _heads(attn: Mapping[str, Any], where: str, num_attention_heads: int) -> tuple[int, int]:
    """(query heads, KV heads) from our explicit keys, else from DeciLM's ``n_heads_in_group``."""
    heads = attn.get("num_heads") or num_attention_heads
    heads = _positive(heads, f"{where}.attention.num_heads")
    if attn.get("num_key_value_heads"):
        return heads, _positive(attn["num_key_value_heads"], f"{where}.attention.num_key_value_heads")
    group = _positive(attn.get("n_heads_in_group"), f"{where}.attention.n_heads_in_group")
    if heads % group:
        raise ConfigError(f"{where}.attention.n_heads_in_group={group} does not divide num_heads={heads}")
    return heads, heads // group


# ------------------------------------------------------------------------------------ config
class AutocompressDeciLMConfig(PreTrainedConfig):
    r"""Config of a heterogeneous decoder: global settings plus one ``block_configs`` entry per layer.

    Global keys follow ``LlamaConfig``; ``num_attention_heads`` / ``num_key_value_heads`` /
    ``intermediate_size`` are the largest per-layer values (what homogeneous readers expect).
    Family details: ``attention_bias`` (q/k/v biases), ``o_proj_bias``, ``mlp_bias``, ``qk_norm``
    (per-head RMSNorm on q and k, Qwen3), ``sliding_window`` (every attention layer, Mistral), and
    ``base_family``, the parent's ``model_type``.
    """

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
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
    attention_dropout: float = 0.0
    sliding_window: int | None = None
    base_family: str = "llama"
    block_configs: list | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.block_configs is None:  # homogeneous default: every layer like the global keys
            layer = LayerSpec(True, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                              True, self.intermediate_size)
            self.block_configs = [BlockConfig.from_layer(layer).to_dict(self.hidden_size)] * self.num_hidden_layers
        super().__post_init__(**kwargs)
        self.blocks  # validate once, eagerly

    @property
    def blocks(self) -> tuple[BlockConfig, ...]:
        """Parsed ``block_configs``; raises :class:`ConfigError` naming the bad entry."""
        raw = self.block_configs or []
        if len(raw) != self.num_hidden_layers:
            raise ConfigError(f"block_configs has {len(raw)} entries but num_hidden_layers={self.num_hidden_layers}")
        if self.base_family not in SUPPORTED_FAMILIES:
            raise ConfigError(f"base_family {self.base_family!r} is not supported"
                              f"{suggest(self.base_family, SUPPORTED_FAMILIES)}; "
                              f"supported: {', '.join(SUPPORTED_FAMILIES)}")
        heads = self.num_attention_heads
        return tuple(BlockConfig.from_dict(b, f"block_configs[{i}]", heads) for i, b in enumerate(raw))

    def architecture(self, name: str = "") -> Architecture:
        """The exact :class:`Architecture` this config builds."""
        layers = tuple(
            LayerSpec(not b.attention.no_op, b.attention.num_heads, b.attention.num_key_value_heads,
                      0 if b.attention.no_op else self.head_dim, not b.ffn.no_op, b.ffn.intermediate_size)
            for b in self.blocks
        )
        return Architecture(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, layers=layers,
            tie_embeddings=bool(self.tie_word_embeddings), family=self.base_family,
            qkv_bias=self.attention_bias, o_bias=self.o_proj_bias, mlp_bias=self.mlp_bias, qk_norm=self.qk_norm,
            max_context=self.max_position_embeddings, name=name or str(self._name_or_path or ""),
        )

    @classmethod
    def from_architecture(cls, arch: Architecture, **settings: Any) -> AutocompressDeciLMConfig:
        """A config that builds ``arch`` exactly; ``settings`` carry the parent's numerics.

        ``settings`` are other config keys (``rms_norm_eps``, ``rope_parameters``, ``hidden_act``,
        ``max_position_embeddings``, ``bos_token_id``, ``sliding_window``...). Every attention layer
        must share one ``head_dim`` (one rotary table); raises :class:`ConfigError` otherwise.
        """
        head_dims = sorted({layer.head_dim for layer in arch.layers if layer.attention})
        if len(head_dims) > 1:
            raise ConfigError(f"layers use head_dim {head_dims}; {MODEL_TYPE} needs one head_dim for all layers")
        attn = [layer for layer in arch.layers if layer.attention]
        ffn = [layer.ffn_width for layer in arch.layers if layer.ffn]
        heads = max((layer.num_heads for layer in attn), default=1)
        kwargs: dict[str, Any] = dict(
            vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers,
            num_attention_heads=heads, num_key_value_heads=max((layer.num_kv_heads for layer in attn), default=1),
            head_dim=head_dims[0] if head_dims else arch.hidden_size // heads, intermediate_size=max(ffn, default=1),
            tie_word_embeddings=arch.tie_embeddings, attention_bias=arch.qkv_bias, o_proj_bias=arch.o_bias,
            mlp_bias=arch.mlp_bias, qk_norm=arch.qk_norm, base_family=arch.family,
            block_configs=[BlockConfig.from_layer(layer).to_dict(arch.hidden_size) for layer in arch.layers],
        )
        if arch.max_context:
            kwargs["max_position_embeddings"] = arch.max_context
        return cls(**{**kwargs, **settings})


# ------------------------------------------------------------------------------------ layers
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
    """Grouped-query self-attention with this layer's own head counts.

    Query head ``h`` reads KV head ``h // n_heads_in_group`` (transformers' ``repeat_kv``).
    ``layer_idx`` is the KV-cache slot, counted over attention layers only.
    """

    def __init__(self, config: AutocompressDeciLMConfig, block: AttentionBlock, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.num_heads, self.num_key_value_heads = block.num_heads, block.num_key_value_heads
        self.num_key_value_groups = block.num_heads // block.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.sliding_window = config.sliding_window
        hidden, q, kv = config.hidden_size, block.num_heads * self.head_dim, block.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, q, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, kv, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, kv, bias=config.attention_bias)
        self.o_proj = nn.Linear(q, hidden, bias=config.o_proj_bias)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps) if config.qk_norm else None

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
        if self.q_norm is not None:  # Qwen3: RMSNorm over head_dim, before RoPE
            query, key = self.q_norm(query), self.k_norm(key)
        query, key = query.transpose(1, 2), key.transpose(1, 2)  # (batch, heads, time, head_dim)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = attention(
            self, query, key, value, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, sliding_window=self.sliding_window, **kwargs,
        )
        out = out.reshape(*hidden_states.shape[:-1], -1).contiguous()  # (batch, time, heads·head_dim)
        return self.o_proj(out), weights


class DeciLMDecoderLayer(nn.Module):
    """Pre-norm residual block whose attention and MLP may each be absent (``None``).

    An absent sub-block has no norm and adds nothing to the residual stream.
    """

    def __init__(self, config: AutocompressDeciLMConfig, block: BlockConfig, cache_idx: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        has_attn, has_ffn = not block.attention.no_op, not block.ffn.no_op
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps) if has_attn else None
        self.self_attn = DeciLMAttention(config, block.attention, cache_idx) if has_attn else None
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps) if has_ffn else None
        self.mlp = DeciLMMLP(config, block.ffn.intermediate_size) if has_ffn else None

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
                hidden_states=self.input_layernorm(hidden_states), position_embeddings=position_embeddings,
                attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=use_cache, **kwargs,
            )
            hidden_states = hidden_states + attn_out
        if self.mlp is not None:
            hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states


# ------------------------------------------------------------------------------------ models
class AutocompressDeciLMPreTrainedModel(PreTrainedModel):
    config: AutocompressDeciLMConfig
    config_class = AutocompressDeciLMConfig
    base_model_prefix = "model"
    _no_split_modules = ["DeciLMDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True


class AutocompressDeciLMModel(AutocompressDeciLMPreTrainedModel):
    """Embedding, heterogeneous decoder layers, final RMSNorm; returns the last hidden state."""

    def __init__(self, config: AutocompressDeciLMConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        layers, slot = [], 0
        for block in config.blocks:
            layers.append(DeciLMDecoderLayer(config, block, slot))
            slot += not block.attention.no_op
        self.layers = nn.ModuleList(layers)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (batch, time)
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
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
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            seen = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + seen).unsqueeze(0)
        make_mask = create_causal_mask if self.config.sliding_window is None else create_sliding_window_causal_mask
        mask = make_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                         cache=cache, position_ids=position_ids)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        all_hidden = [hidden_states]
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, position_ids=position_ids, cache=cache,
                                  use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
            all_hidden.append(hidden_states)
        hidden_states = self.norm(hidden_states)
        # transformers' convention: embeddings, then each layer's output, the last one after the final norm
        all_hidden[-1] = hidden_states
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, cache=cache,
                                       hidden_states=tuple(all_hidden) if want_hidden else None)


class AutocompressDeciLMForCausalLM(AutocompressDeciLMPreTrainedModel, GenerationMixin):
    """Causal LM over :class:`AutocompressDeciLMModel`; supports ``generate`` with a ``DynamicCache``."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

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
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)  # (batch, time, vocab)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache, hidden_states=outputs.hidden_states)


def _register() -> None:
    """Make ``Auto*`` classes resolve ``model_type "autocompress_decilm"`` (idempotent)."""
    AutoConfig.register(MODEL_TYPE, AutocompressDeciLMConfig, exist_ok=True)
    AutoModel.register(AutocompressDeciLMConfig, AutocompressDeciLMModel, exist_ok=True)
    AutoModelForCausalLM.register(AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM, exist_ok=True)


_register()

