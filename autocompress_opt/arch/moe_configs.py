"""Readers of the mixture-of-experts and hybrid Mamba-2 families' Hugging Face configs (issue 30).

:meth:`Architecture.from_hf_config <autocompress_opt.arch.architecture.Architecture.from_hf_config>`
hands a config to :func:`read_config` when its family entry names a ``config_reader``; each reader
describes the architecture as plain data (its fields, with one ``LayerSpec`` keyword mapping per
layer: this module sits below ``architecture.py``, which builds the objects), as the family's
transformers 5.24 modeling code does (``modeling_{family}.py``), so that ``Architecture.num_params``
equals ``sum(p.numel() for p in model.parameters())`` of the built model (tested per family).
A key a ``config.json`` omits takes the transformers config class's default (:data:`DEFAULTS`,
from ``configuration_{family}.py``).

* ``mixtral``: every layer attention + a MoE of ``num_local_experts`` gated experts of
  ``intermediate_size``, ``num_experts_per_tok`` per token.
* ``qwen3_moe``: attention (q/k-normed) + a MoE of ``num_experts`` experts of
  ``moe_intermediate_size``; a layer in ``mlp_only_layers``, or off the ``decoder_sparse_step``
  grid, has a dense MLP of ``intermediate_size`` instead.
* ``gpt_oss``: attention with sinks + a MoE of ``num_local_experts`` gated experts of
  ``intermediate_size`` with biased router and experts; alternate layers slide.
* ``nemotron_h``: one block per layer, by ``layers_block_type`` (or the older
  ``hybrid_override_pattern``: ``M`` Mamba-2, ``E`` MoE, ``*`` attention, ``-`` MLP); relu²
  experts and MLP (not gated), a shared expert, an optional latent projection
  (``moe_latent_size``, Nemotron 3 Super); the Puzzle form (``nemotron_h_puzzle``) gives each layer's
  kind and each MoE layer's width and top-``k`` in ``block_configs``. The multi-token-prediction layers
  (``num_nextn_predict_layers``) are not built by transformers and not counted.
* ``granitemoehybrid``: a Mamba-2 or attention mixer (``layer_types``) + a MoE with a gated shared
  expert (or, with ``num_local_experts: 0``, the shared MLP alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autocompress_opt.arch.families import Family
from autocompress_opt.arch.moe import MambaSpec, MoESpec
from autocompress_opt.arch.windows import layer_windows
from autocompress_opt.errors import ConfigError, check_bool, check_int

# More layers than any decoder has: a config asking for more is a typo (1e12 would exhaust memory).
MAX_LAYERS = 10_000
Layer = dict[str, Any]  # LayerSpec keyword arguments

__all__ = ["DEFAULTS", "READERS", "read_config"]

# The config classes' defaults (transformers 5.24 configuration_{family}.py) for the keys read here.
DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "mixtral": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_local_experts=8,
        num_experts_per_tok=2,
    ),
    "qwen3_moe": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        decoder_sparse_step=1,
    ),
    "gpt_oss": dict(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=36,
        num_attention_heads=64,
        num_local_experts=128,
        num_experts_per_tok=4,
    ),
    "nemotron_h": dict(
        vocab_size=131072,
        hidden_size=4096,
        num_attention_heads=32,
        intermediate_size=21504,
        mamba_num_heads=128,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=8,
        conv_kernel=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=7688,
        moe_shared_expert_intermediate_size=7688,
    ),
    "granitemoehybrid": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_local_experts=8,
        num_experts_per_tok=2,
        shared_intermediate_size=1024,
        mamba_n_heads=128,
        mamba_n_groups=1,
        mamba_d_state=256,
        mamba_d_conv=4,
        mamba_expand=2,
    ),
}

# transformers' older layer-type names (configuration_utils._LEGACY_LAYER_TYPE_REMAP).
_LEGACY_KINDS = {"mamba": "linear_attention", "attention": "full_attention"}
# Nemotron-H's hybrid_override_pattern characters (NemotronHConfig._pattern_to_list).
_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
# The routed-expert count's names: config.json and to_dict() spell it differently (the config classes'
# attribute_map: Qwen3-MoE's config.json says num_experts, its to_dict() num_local_experts).
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# Nemotron-H's default layers_block_type when a config gives none.
_NEMOTRON_DEFAULT_KINDS = ("linear_attention", "moe", "full_attention", "mlp")
# The keys a block_configs entry of Nemotron-H's Puzzle form (model_type nemotron_h_puzzle, hf/puzzle.py)
# sets for its MoE layer; its block_type is a layer kind (released spelling "mamba" / "attention" / "moe" /
# "mlp", or transformers').
_PUZZLE_KEYS = ("moe_intermediate_size", "num_experts_per_tok")


class _Config:
    """A config dict with its family's defaults: typed reads that name the key in errors."""

    def __init__(self, cfg: Mapping[str, Any], fam: Family) -> None:
        present = {key: cfg[key] for key in _EXPERT_COUNT_KEYS if cfg.get(key) is not None}
        if present:  # each config class's attribute_map: one number under any of its names
            cfg = {**dict.fromkeys(_EXPERT_COUNT_KEYS, next(iter(present.values()))), **cfg}
        self.cfg, self.fam, self.defaults = cfg, fam, DEFAULTS.get(fam.name, {})

    def size(self, key: str, *, null: int | None = None, absent: int | None = None, minimum: int = 1) -> int:
        """``cfg[key]`` (the class default when absent), a positive int (``minimum=0`` allows 0)."""
        value = self.cfg.get(key, self.defaults.get(key) if absent is None else absent)
        value = null if value is None else value
        where = f"{self.fam.name} config {key}"
        return check_int(value, where, minimum, maximum=MAX_LAYERS if key.endswith("layers") else None)

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        return default if value is None else check_bool(value, f"{self.fam.name} config {key}")

    def attention(self) -> dict[str, int]:
        """Heads, KV heads and head size of an attention layer (head_dim: the config's, else the
        family's default, else hidden / heads, as each modeling file does)."""
        heads, hidden = self.size("num_attention_heads"), self.size("hidden_size")
        fam = self.fam
        return dict(
            num_heads=heads,
            num_kv_heads=self.size("num_key_value_heads", null=heads, absent=fam.default_kv_heads or heads),
            head_dim=self.size("head_dim", null=hidden // heads, absent=fam.default_head_dim or hidden // heads),
        )


def _architecture(c: _Config, layers: Sequence[Layer]) -> dict[str, Any]:
    """Architecture keyword arguments (its bias flags are the caller's: ``config_biases``)."""
    max_context = c.cfg.get("max_position_embeddings")
    return dict(
        vocab_size=c.size("vocab_size"),
        hidden_size=c.size("hidden_size"),
        layers=list(layers),
        tie_embeddings=c.flag("tie_word_embeddings", c.fam.default_tied),
        family=c.fam.name,
        qk_norm=c.fam.qk_norm,
        max_context=None if max_context is None else c.size("max_position_embeddings"),
    )


def _windowed(c: _Config, layers: list[Layer]) -> list[Layer]:
    """Each attention layer with the window the family's rule gives it."""
    windows = layer_windows(c.cfg, c.fam.name, len(layers))
    return [{**layer, "window": w} if layer["attention"] else layer for layer, w in zip(layers, windows)]


def _read_mixtral(c: _Config) -> dict[str, Any]:
    moe = MoESpec(c.size("num_local_experts"), c.size("num_experts_per_tok"), c.size("intermediate_size"))
    layer = dict(attention=True, ffn=False, moe=moe, **c.attention())
    return _architecture(c, _windowed(c, [layer] * c.size("num_hidden_layers")))


def _read_qwen3_moe(c: _Config) -> dict[str, Any]:
    experts = c.size("num_experts", minimum=0)
    step = c.size("decoder_sparse_step")
    dense_only = c.cfg.get("mlp_only_layers") or []
    if not isinstance(dense_only, Sequence) or isinstance(dense_only, str):
        raise ConfigError(f"qwen3_moe config mlp_only_layers must be a list of layer indices, got {dense_only!r}")
    attention = c.attention()
    layers = []
    for i in range(c.size("num_hidden_layers")):
        if i not in dense_only and experts > 0 and (i + 1) % step == 0:  # Qwen3MoeDecoderLayer's rule
            moe = MoESpec(experts, c.size("num_experts_per_tok"), c.size("moe_intermediate_size"))
            layers.append(dict(attention=True, ffn=False, moe=moe, **attention))
        else:
            layers.append(dict(attention=True, ffn=True, ffn_width=c.size("intermediate_size"), **attention))
    return _architecture(c, _windowed(c, layers))


def _read_gpt_oss(c: _Config) -> dict[str, Any]:
    moe = MoESpec(
        c.size("num_local_experts"),
        c.size("num_experts_per_tok"),
        c.size("intermediate_size"),
        router_bias=True,  # GptOssTopKRouter.bias
        expert_bias=True,  # GptOssExperts.gate_up_proj_bias, down_proj_bias
    )
    layer = dict(attention=True, ffn=False, moe=moe, **c.attention())
    return _architecture(c, _windowed(c, [layer] * c.size("num_hidden_layers")))


def _kinds(c: _Config, default: Sequence[str] | None) -> list[str]:
    """The per-layer block kinds (``linear_attention``, ``full_attention``, ``moe``, ``mlp``)."""
    where = f"{c.fam.name} config"
    for key in ("layers_block_type", "layer_types"):
        kinds = c.cfg.get(key)
        if kinds is not None:
            if not isinstance(kinds, Sequence) or isinstance(kinds, str):
                raise ConfigError(f"{where} {key} must be a list of layer kinds, got {kinds!r}")
            return [_LEGACY_KINDS.get(str(k), str(k)) for k in kinds]
    pattern = c.cfg.get("hybrid_override_pattern")
    if pattern is not None:
        bad = sorted({ch for ch in str(pattern) if ch not in _PATTERN})
        if bad:
            raise ConfigError(f"{where} hybrid_override_pattern has {bad}; valid characters: {', '.join(_PATTERN)}")
        return [_PATTERN[ch] for ch in str(pattern)]
    if default is None:
        return ["linear_attention"] * c.size("num_hidden_layers")  # GraniteMoeHybridConfig's default
    return list(default)


def _check_kinds(c: _Config, kinds: list[str], valid: Sequence[str]) -> None:
    if not kinds or len(kinds) > MAX_LAYERS:
        raise ConfigError(f"{c.fam.name} config needs 1..{MAX_LAYERS:,} layer kinds, got {len(kinds)}")
    bad = sorted(set(kinds) - set(valid))
    if bad:
        raise ConfigError(f"{c.fam.name} config has layer kinds {bad}; valid: {', '.join(valid)}")


def _puzzle_blocks(c: _Config) -> list[Mapping[str, Any]] | None:
    """The per-layer ``block_configs`` of Nemotron-H's Puzzle form (``nemotron_h_puzzle``), or None."""
    blocks = c.cfg.get("block_configs")
    if blocks is None:
        return None
    if not isinstance(blocks, Sequence) or isinstance(blocks, str) or not blocks:
        raise ConfigError(f"{c.fam.name} config block_configs must be a non-empty list, got {blocks!r}")
    for i, block in enumerate(blocks):
        if not isinstance(block, Mapping) or "block_type" not in block:
            raise ConfigError(
                f"{c.fam.name} config block_configs[{i}] must be a mapping with a block_type, got {block!r}"
            )
    return list(blocks)


def _layer_config(c: _Config, block: Mapping[str, Any] | None) -> _Config:
    """``c`` with a Puzzle MoE layer's own sizes (those its block gives) in place of the global ones."""
    own = {key: block[key] for key in _PUZZLE_KEYS if block is not None and block.get(key) is not None}
    return _Config({**c.cfg, **own}, c.fam) if own else c


def _read_nemotron_h(c: _Config) -> dict[str, Any]:
    blocks = _puzzle_blocks(c)  # the Puzzle form: the authority on the kinds, and each MoE layer's sizes
    if blocks is None:
        kinds = _kinds(c, _NEMOTRON_DEFAULT_KINDS)
    else:
        kinds = [_LEGACY_KINDS.get(str(b["block_type"]), str(b["block_type"])) for b in blocks]
    _check_kinds(c, kinds, ("linear_attention", "full_attention", "moe", "mlp"))
    # NemotronHConfig.__post_init__ renames the older mamba_* keys.
    renamed = (("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"), ("use_conv_bias", "mamba_conv_bias"))
    for new, old in renamed:
        if old in c.cfg and new not in c.cfg:
            c = _Config({**c.cfg, new: c.cfg[old]}, c.fam)
    mamba = MambaSpec(
        c.size("mamba_num_heads"),
        c.size("mamba_head_dim"),
        c.size("ssm_state_size"),
        c.size("n_groups"),
        c.size("conv_kernel"),
        conv_bias=c.flag("use_conv_bias", True),
        proj_bias=c.flag("use_bias", False),  # NemotronHMamba2Mixer: in_proj/out_proj bias=config.use_bias
    )
    by_kind: dict[str, Callable[[_Config], Layer]] = {
        "linear_attention": lambda _: dict(attention=False, ffn=False, mamba=mamba),
        "full_attention": lambda _: dict(attention=True, ffn=False, **c.attention()),
        "mlp": lambda _: dict(attention=False, ffn=True, ffn_width=c.size("intermediate_size")),
        "moe": lambda lc: dict(
            attention=False,
            ffn=False,
            moe=MoESpec(
                lc.size("n_routed_experts"),
                lc.size("num_experts_per_tok"),
                lc.size("moe_intermediate_size"),
                shared_width=lc.size("moe_shared_expert_intermediate_size"),
                latent_width=lc.size("moe_latent_size", null=0, absent=0, minimum=0),
                gated=False,  # NemotronHExperts: up, relu², down
            ),
        ),
    }
    layers = [by_kind[kind](_layer_config(c, None if blocks is None else blocks[i])) for i, kind in enumerate(kinds)]
    return _architecture(c, layers)


def _read_granitemoehybrid(c: _Config) -> dict[str, Any]:
    kinds = _kinds(c, None)
    _check_kinds(c, kinds, ("linear_attention", "full_attention"))
    hidden, heads = c.size("hidden_size"), c.size("mamba_n_heads")
    head_dim = c.cfg.get("mamba_d_head", "auto")
    if head_dim in (None, "auto"):  # GraniteMoeHybridConfig: mamba_expand * hidden_size // mamba_n_heads
        head_dim = c.size("mamba_expand") * hidden // heads
    mamba = MambaSpec(
        heads,
        check_int(head_dim, f"{c.fam.name} config mamba_d_head"),
        c.size("mamba_d_state"),
        c.size("mamba_n_groups"),
        c.size("mamba_d_conv"),
        conv_bias=c.flag("mamba_conv_bias", True),
        proj_bias=c.flag("mamba_proj_bias", False),
    )
    experts = c.size("num_local_experts", null=0, minimum=0)
    shared = c.size("shared_intermediate_size")
    ffn: dict[str, Any] = (
        dict(ffn=False, moe=MoESpec(experts, c.size("num_experts_per_tok"), c.size("intermediate_size"), shared))
        if experts > 0
        else dict(ffn=True, ffn_width=shared)  # GraniteMoeHybridDecoderLayer: the shared MLP alone
    )
    mixers: dict[str, dict[str, Any]] = {
        "linear_attention": dict(attention=False, mamba=mamba),
        "full_attention": dict(attention=True, **c.attention()),
    }
    layers = [dict(**mixers[kind], **ffn) for kind in kinds]
    return _architecture(c, layers)


READERS: Mapping[str, Callable[[_Config], dict[str, Any]]] = {
    "mixtral": _read_mixtral,
    "qwen3_moe": _read_qwen3_moe,
    "gpt_oss": _read_gpt_oss,
    "nemotron_h": _read_nemotron_h,
    "granitemoehybrid": _read_granitemoehybrid,
}


def read_config(cfg: Mapping[str, Any], fam: Family) -> dict[str, Any]:
    """The exact architecture of a config of ``fam`` (whose ``config_reader`` names the reader), as
    ``Architecture`` keyword arguments without the bias flags, ``layers`` a list of ``LayerSpec``
    keyword mappings.

    Raises :class:`ConfigError` naming a bad key and value, or a reader no module provides.
    """
    reader = READERS.get(str(fam.config_reader))
    if reader is None:
        raise ConfigError(
            f"family {fam.name!r} names config_reader {fam.config_reader!r}; known readers: {', '.join(READERS)}"
        )
    return reader(_Config(cfg, fam))
