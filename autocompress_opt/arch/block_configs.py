"""Per-layer block configs of a heterogeneous decoder: DeciLM's ``block_configs`` (the shape vLLM's
``DeciLMForCausalLM`` / ``nemotron_nas`` reads), as pure data.

One entry per layer::

    {"attention": {"no_op": false, "n_heads_in_group": 3, "num_heads": 6, "num_key_value_heads": 2,
                   "window_length": null},
     "ffn": {"no_op": false, "intermediate_size": 768, "ffn_mult": 2.0}}

:class:`~autocompress_opt.hf.hetero_model.AutocompressDeciLMConfig` stores these; this module parses
and writes them without transformers, so reading an exported ``config.json`` into an
:class:`~autocompress_opt.arch.architecture.Architecture` needs no torch
(:func:`architecture_from_block_configs`, the one implementation both use).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autocompress_opt.arch.architecture import SUPPORTED_FAMILIES, Architecture, LayerSpec
from autocompress_opt.errors import ConfigError, check_int, suggest

__all__ = [
    "FULL_ATTENTION",
    "MODEL_TYPE",
    "NO_ATTENTION",
    "SLIDING_ATTENTION",
    "AttentionBlock",
    "BlockConfig",
    "FFNBlock",
    "architecture_from_block_configs",
    "parse_block_configs",
]

MODEL_TYPE = "autocompress_decilm"
FULL_ATTENTION, SLIDING_ATTENTION, NO_ATTENTION = "full_attention", "sliding_attention", "mlp"


@dataclass(frozen=True)
class AttentionBlock:
    """One layer's attention: ``no_op`` (removed) or ``num_heads`` query heads over KV heads,
    attending to the last ``window_length`` tokens (``None``: full causal attention)."""

    no_op: bool = False
    num_heads: int = 0
    num_key_value_heads: int = 0
    window_length: int | None = None

    @property
    def n_heads_in_group(self) -> int | None:
        """Query heads per KV head (DeciLM's name); None for a removed attention."""
        return None if self.no_op else self.num_heads // self.num_key_value_heads

    @property
    def layer_type(self) -> str:
        """transformers' ``layer_types`` entry for this layer."""
        if self.no_op:
            return NO_ATTENTION
        return FULL_ATTENTION if self.window_length is None else SLIDING_ATTENTION

    def to_dict(self) -> dict[str, Any]:
        return {
            "no_op": self.no_op,
            "replace_with_linear": False,
            "n_heads_in_group": self.n_heads_in_group,
            "num_heads": self.num_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "window_length": None if self.no_op else self.window_length,
        }


@dataclass(frozen=True)
class FFNBlock:
    """One layer's gated MLP: ``no_op`` (removed) or ``intermediate_size`` channels."""

    no_op: bool = False
    intermediate_size: int = 0

    def to_dict(self, hidden_size: int) -> dict[str, Any]:
        # ffn_mult as DeciLM defines it: intermediate = 2·ffn_mult·hidden/3 (before rounding).
        mult = None if self.no_op else round(3 * self.intermediate_size / (2 * hidden_size), 6)
        return {
            "no_op": self.no_op,
            "replace_with_linear": False,
            "intermediate_size": self.intermediate_size,
            "ffn_mult": mult,
        }


@dataclass(frozen=True)
class BlockConfig:
    """One layer of a heterogeneous decoder (DeciLM ``block_configs`` entry)."""

    attention: AttentionBlock
    ffn: FFNBlock

    @classmethod
    def from_layer(cls, layer: LayerSpec) -> BlockConfig:
        """The block of ``layer`` (its ``window`` is the attention's ``window_length``); a MoE or
        Mamba-2 layer has no DeciLM block yet (:class:`ConfigError`, issue 30)."""
        if layer.moe is not None or layer.mamba is not None:
            kind = "MoE" if layer.moe is not None else "Mamba-2"
            raise ConfigError(f"{kind} layers are described but not yet exported as block_configs: issue 30")
        return cls(
            AttentionBlock(not layer.attention, layer.num_heads, layer.num_kv_heads, layer.window),
            FFNBlock(not layer.ffn, layer.ffn_width),
        )

    def to_dict(self, hidden_size: int) -> dict[str, Any]:
        return {"attention": self.attention.to_dict(), "ffn": self.ffn.to_dict(hidden_size)}

    @classmethod
    def from_dict(
        cls, data: Any, where: str, num_attention_heads: int, sliding_window: int | None = None
    ) -> BlockConfig:
        """Parse one ``block_configs`` entry; ``where`` names it in errors (``block_configs[3]``).

        An attention without a ``window_length`` key takes ``sliding_window`` (the model-wide window).
        """
        attn, ffn = _section(data, "attention", where), _section(data, "ffn", where)
        no_attn, no_ffn = bool(attn.get("no_op", False)), bool(ffn.get("no_op", False))
        for sec, name in ((attn, "attention"), (ffn, "ffn")):
            if sec.get("replace_with_linear"):
                raise ConfigError(f"{where}.{name}.replace_with_linear=true is not supported (no linear replacements)")
        heads = kv = width = 0
        if not no_attn:
            heads, kv = _heads(attn, where, num_attention_heads)
        if not no_ffn:
            width = check_int(ffn.get("intermediate_size"), f"{where}.ffn.intermediate_size")
        window = attn.get("window_length", sliding_window)
        if window is not None:
            window = check_int(window, f"{where}.attention.window_length")
        try:
            spec = LayerSpec(
                attention=not no_attn,
                num_heads=heads,
                num_kv_heads=kv,
                head_dim=1,
                ffn=not no_ffn,
                ffn_width=width,
                window=window,
            )
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


def _heads(attn: Mapping[str, Any], where: str, num_attention_heads: int) -> tuple[int, int]:
    """(query heads, KV heads) from our explicit keys, else from DeciLM's ``n_heads_in_group``."""
    heads = attn.get("num_heads") or num_attention_heads
    heads = check_int(heads, f"{where}.attention.num_heads")
    if attn.get("num_key_value_heads"):
        return heads, check_int(attn["num_key_value_heads"], f"{where}.attention.num_key_value_heads")
    group = check_int(attn.get("n_heads_in_group"), f"{where}.attention.n_heads_in_group")
    if heads % group:
        raise ConfigError(f"{where}.attention.n_heads_in_group={group} does not divide num_heads={heads}")
    return heads, heads // group


def parse_block_configs(
    raw: Sequence[Any] | None,
    *,
    num_layers: int,
    num_attention_heads: int,
    sliding_window: int | None,
    base_family: str,
) -> tuple[BlockConfig, ...]:
    """Parse and check a config's ``block_configs``; raises :class:`ConfigError` naming the bad entry."""
    if raw is None:
        raise ConfigError(
            f"a {MODEL_TYPE} config needs block_configs (one entry per layer, num_hidden_layers={num_layers}); "
            "without it the layers are unknown"
        )
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ConfigError(f"block_configs must be a list with one entry per layer, got {raw!r}")
    raw = list(raw)
    if len(raw) != num_layers:
        raise ConfigError(f"block_configs has {len(raw)} entries but num_hidden_layers={num_layers}")
    if base_family not in SUPPORTED_FAMILIES:
        raise ConfigError(
            f"base_family {base_family!r} is not supported"
            f"{suggest(base_family, SUPPORTED_FAMILIES)}; "
            f"supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    return tuple(
        BlockConfig.from_dict(b, f"block_configs[{i}]", num_attention_heads, sliding_window) for i, b in enumerate(raw)
    )


def _required(config: Mapping[str, Any], key: str) -> Any:
    if config.get(key) is None:
        raise ConfigError(f"a {MODEL_TYPE} config needs {key!r}; keys present: {', '.join(sorted(config))}")
    return config[key]


def architecture_from_block_configs(config: Mapping[str, Any], *, name: str = "") -> Architecture:
    """The exact :class:`Architecture` a heterogeneous config (a ``config.json`` dict with
    ``block_configs``) builds: each layer's heads, FFN width and window from its block."""
    hidden = check_int(_required(config, "hidden_size"), f"{MODEL_TYPE} config hidden_size")
    heads = check_int(_required(config, "num_attention_heads"), f"{MODEL_TYPE} config num_attention_heads")
    head_dim = check_int(config.get("head_dim") or hidden // heads, f"{MODEL_TYPE} config head_dim")
    blocks = parse_block_configs(
        config.get("block_configs"),
        num_layers=check_int(_required(config, "num_hidden_layers"), f"{MODEL_TYPE} config num_hidden_layers"),
        num_attention_heads=heads,
        sliding_window=config.get("sliding_window"),
        base_family=str(config.get("base_family", "llama")),
    )
    layers = tuple(
        LayerSpec(
            not b.attention.no_op,
            b.attention.num_heads,
            b.attention.num_key_value_heads,
            0 if b.attention.no_op else head_dim,
            not b.ffn.no_op,
            b.ffn.intermediate_size,
            b.attention.window_length,
        )
        for b in blocks
    )
    return Architecture(
        vocab_size=check_int(_required(config, "vocab_size"), f"{MODEL_TYPE} config vocab_size"),
        hidden_size=hidden,
        layers=layers,
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        family=str(config.get("base_family", "llama")),
        qkv_bias=bool(config.get("attention_bias", False)),
        o_bias=bool(config.get("o_proj_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=bool(config.get("qk_norm", False)),
        max_context=config.get("max_position_embeddings"),
        name=name,
    )
