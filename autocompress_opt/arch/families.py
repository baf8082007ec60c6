"""The registry of model families: everything the package knows about one decoder family, in one entry.

A :class:`Family` says how a Hugging Face config of the family counts parameters (biases, QK-norm,
post-norms, the config class's defaults), which layers slide (:class:`WindowRule`), which
``model_type`` values and GGUF ``general.architecture`` values mean it, which model-family adapter
(``autocompress_opt.hf.adapters.ADAPTERS``) finds its modules, and what each serving engine loads of
it. :data:`FAMILIES` holds them (a :class:`~autocompress_opt.registry.Registry`);
:func:`register_family` adds one, refusing a name, model_type or GGUF architecture already claimed.

Adding a family is one entry in :data:`_BUILTIN_FAMILIES` plus its adapter in
``hf/adapters.py`` (docs/adding-a-family.md). The mixture-of-experts and hybrid Mamba-2 families
(:data:`_ARCHITECTURE_ONLY`: Mixtral, Qwen3-MoE, gpt-oss, Nemotron-H, Granite-MoE-Hybrid) have no
adapter yet: they are *architecture-only* (:attr:`Family.architecture_only`), read by their
``config_reader`` and counted exactly, refused by the weights paths and the cost model (issue 30).
The architecture reader (:mod:`~autocompress_opt.arch.architecture`), the GGUF reader
(:mod:`~autocompress_opt.arch.gguf`), the adapters and the engine rules
(:mod:`~autocompress_opt.prune.loadability`) all read this table.
This module is the architecture layer's: it names the adapter and the engines by string and
imports neither (``tests/arch/test_families.py`` checks that every name resolves).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from autocompress_opt.errors import ConfigError
from autocompress_opt.registry import Registry

__all__ = [
    "BIAS_FLAGS",
    "FAMILIES",
    "LOADS",
    "Family",
    "Loads",
    "WindowRule",
    "architecture_only_families",
    "family",
    "family_for_gguf_arch",
    "family_for_model_type",
    "family_names",
    "register_family",
]

# The Architecture bias flags a family entry must say something about (each: a config key or a constant).
BIAS_FLAGS = ("qkv_bias", "o_bias", "mlp_bias")

Loads = Literal["heterogeneous", "uniform", "none"]
# What an engine loads of a family: per-layer shapes too (in the engine's heterogeneous form), a plain
# checkpoint of one shape only, or nothing.
LOADS: tuple[Loads, ...] = ("heterogeneous", "uniform", "none")


@dataclass(frozen=True)
class WindowRule:
    """How a family's config says which layers attend within ``sliding_window`` (default 4096).

    Attributes:
        kind: ``"none"``: every layer attends fully, a config cannot express a window (Llama);
            ``"every_layer"``: the model-wide ``sliding_window`` (null: none) applies to every
            layer and ``layer_types`` is ignored (Mistral); ``"layer_types"``: the window applies
            to the ``"sliding_attention"`` entries of ``layer_types`` (Qwen2/3, Gemma 3, gpt-oss).
        switch: a config key that must be true (default false) for any layer to slide
            (Qwen2/3 and Qwen3-MoE: ``use_sliding_window``); None: always on.
        default_pattern: ``layer_types`` absent, every ``sliding_window_pattern``-th layer (default
            this) is full, the others slide (Gemma 3: 6).
        default_max_window_layers: ``layer_types`` absent, layers ``i >= max_window_layers``
            (default this) slide (Qwen2/3: 28).
        default_window: ``sliding_window`` when a config omits it (the config class's default:
            4096 for Mistral and Qwen, 128 for gpt-oss, None for Mixtral).
    """

    kind: Literal["none", "every_layer", "layer_types"] = "none"
    switch: str | None = None
    default_pattern: int | None = None
    default_max_window_layers: int | None = None
    default_window: int | None = 4096

    def __post_init__(self) -> None:
        if self.kind not in ("none", "every_layer", "layer_types"):
            raise ConfigError(f"WindowRule.kind {self.kind!r} is not one of 'none', 'every_layer', 'layer_types'")
        defaults = (self.default_pattern is not None) + (self.default_max_window_layers is not None)
        if self.kind == "layer_types" and defaults != 1:
            raise ConfigError(
                "a 'layer_types' WindowRule needs exactly one of default_pattern and "
                f"default_max_window_layers (the layers that slide when layer_types is absent), got {self}"
            )
        if self.kind != "layer_types" and defaults:
            raise ConfigError(f"only a 'layer_types' WindowRule takes layer defaults, got {self}")
        if self.kind == "none" and self.switch is not None:
            raise ConfigError(f"a 'none' WindowRule has no window to switch on, got {self}")


@dataclass(frozen=True)
class Family:
    """One decoder family: the facts every part of the package needs about it.

    Attributes:
        name: the :attr:`~autocompress_opt.arch.architecture.Architecture.family` value and the
            ``model_type`` ``Architecture.to_hf_config`` writes (``transformers.AutoConfig.for_model``).
        model_types: every Hugging Face ``model_type`` read as this family; the first is ``name``.
        gguf_archs: GGUF ``general.architecture`` values read as this family (llama.cpp writes
            Mistral models as ``llama``, which stays Llama; Gemma 3's text decoder as ``gemma3``).
        adapter: the registry name of its adapter in ``autocompress_opt.hf.adapters.ADAPTERS``; None
            makes the family **architecture-only**: its configs are read and counted exactly (total
            and active parameters), but no weights path (loading, importance, slicing, export) and
            no cost model takes it yet (issue 30), so every engine's ``serving`` must be ``"none"``.
        biases: each Architecture bias flag (:data:`BIAS_FLAGS`) -> the config key that switches it
            (read with default ``default_bias``) or a constant when the family hard-codes it.
        default_bias: a bias key's value when a config omits it (gpt-oss: ``attention_bias`` true).
        qk_norm: RMSNorm(head_dim) on q and on k.
        post_norms: an RMSNorm(D) on each sub-block's output too ("sandwich" norms, Gemma 2/3).
        default_kv_heads: ``num_key_value_heads`` when a config omits it (None: ``num_attention_heads``).
        default_head_dim: ``head_dim`` when a config omits it (None: ``hidden_size // num_attention_heads``).
        default_tied: ``tie_word_embeddings`` when a config omits it.
        windows: which layers slide (:class:`WindowRule`).
        heads_divide_hidden: the head-divisibility rule: a plain config of the family refuses
            ``hidden_size % num_attention_heads != 0`` (transformers' ``LlamaConfig`` and
            ``Gemma3TextConfig`` validate it), so such a model exports as the package's own class,
            which only ``transformers`` loads.
        decilm: its layers fit the DeciLM form (a Llama-family format: vLLM's ``nemotron_nas``,
            llama.cpp's ``deci``) that heterogeneous exports take for the serving engines.
        serving: each serving engine (``prune.loadability.ENGINE_RULES``) -> what it loads of the
            family (:data:`Loads`). ``"heterogeneous"`` in an engine that reads DeciLM needs ``decilm``.
        config_reader: the reader of a config whose layers are not all alike
            (``autocompress_opt.arch.moe_configs.READERS``: experts, Mamba-2 mixers, per-layer
            kinds); None: the dense reader of ``Architecture.from_hf_config``.
        attention_sinks: each attention layer has one learned sink logit per query head (gpt-oss).
        gated_ffn: the dense FFN (and shared expert) is gated, ``down(act(gate(x)) * up(x))``;
            false: ``down(act(up(x)))`` (Nemotron-H's relu² MLP).
    """

    name: str
    model_types: tuple[str, ...]
    gguf_archs: tuple[str, ...]
    adapter: str | None
    biases: Mapping[str, str | bool]
    serving: Mapping[str, Loads]
    qk_norm: bool = False
    post_norms: bool = False
    default_kv_heads: int | None = None
    default_head_dim: int | None = None
    default_tied: bool = False
    windows: WindowRule = field(default_factory=WindowRule)
    heads_divide_hidden: bool = False
    decilm: bool = False
    default_bias: bool = False
    config_reader: str | None = None
    attention_sinks: bool = False
    gated_ffn: bool = True

    def __post_init__(self) -> None:
        where = f"family {self.name!r}"
        if not self.name or self.name != self.name.lower():
            raise ConfigError(f"a family name must be a non-empty lower-case model_type, got {self.name!r}")
        if not self.model_types or self.model_types[0] != self.name:
            raise ConfigError(f"{where}: model_types must start with the name, got {self.model_types!r}")
        if any(t != t.lower() for t in self.model_types):
            raise ConfigError(f"{where}: model_types must be lower case, got {self.model_types!r}")
        if self.adapter is not None and not self.adapter:
            raise ConfigError(f"{where}: adapter must name an entry of hf.adapters.ADAPTERS (None: architecture-only)")
        if set(self.biases) != set(BIAS_FLAGS):
            raise ConfigError(f"{where}: biases must give each of {', '.join(BIAS_FLAGS)}, got {sorted(self.biases)}")
        bad = {engine: loads for engine, loads in self.serving.items() if loads not in LOADS}
        if bad or not self.serving:
            raise ConfigError(f"{where}: serving maps each engine to one of {', '.join(LOADS)}, got {bad or '{}'}")
        per_layer = sorted(engine for engine, loads in self.serving.items() if loads == "heterogeneous")
        if self.adapter is None and per_layer:
            raise ConfigError(
                f"{where} is architecture-only (no adapter): no per-layer export of it exists, so no "
                f"engine's serving may be 'heterogeneous' (plan mode sizes its plain config: 'uniform'), "
                f"got {', '.join(per_layer)}"
            )
        # Read-only views, so a registered entry cannot be changed through its mappings.
        object.__setattr__(self, "biases", MappingProxyType(dict(self.biases)))
        object.__setattr__(self, "serving", MappingProxyType(dict(self.serving)))

    @property
    def architecture_only(self) -> bool:
        """True when the family has no adapter: described, counted and costed, not yet pruned."""
        return self.adapter is None

    def loads(self, engine: str) -> Loads:
        """What ``engine`` loads of this family; ``"none"`` for an engine the entry does not name."""
        return self.serving.get(engine, "none")


# Engines that read a heterogeneous export as DeciLM, and transformers (the package's own class: any shape).
_DECILM_ENGINES = ("vllm", "sglang", "trtllm", "llamacpp")
_LLAMA_LIKE: Mapping[str, Loads] = {**dict.fromkeys(_DECILM_ENGINES, "heterogeneous"), "transformers": "heterogeneous"}
_UNIFORM_ONLY: Mapping[str, Loads] = {**dict.fromkeys(_DECILM_ENGINES, "uniform"), "transformers": "heterogeneous"}
_QWEN_WINDOWS = WindowRule("layer_types", switch="use_sliding_window", default_max_window_layers=28)

# Source: transformers v5 configuration_{family}.py (defaults, windows) and modeling_{family}.py (biases):
#   llama: q,k,v,o biased iff attention_bias, gate/up/down iff mlp_bias; full attention everywhere.
#   mistral: no biases, 8 KV heads by default; sliding_window (default 4096; null = none) on every layer.
#   qwen2: q,k,v always biased, o never, 32 KV heads by default.
#   qwen3: q,k,v,o biased iff attention_bias, q/k RMSNorm, 32 KV heads and head_dim 128 by default.
#   qwen2, qwen3: nothing slides unless use_sliding_window; then the "sliding_attention" layers of
#     layer_types, which defaults to layers i >= max_window_layers (default 28).
#   gemma3_text (Gemma 3 text decoder, Gemma3ForCausalLM): q,k,v,o biased iff attention_bias, q/k
#     RMSNorm, four RMSNorms per layer (input, post_attention, pre_feedforward, post_feedforward),
#     4 KV heads, head_dim 256 and tied embeddings by default; layer_types defaults to every layer
#     but each sliding_window_pattern-th (default 6) sliding (Gemma 3 270M: window 512).
# heads_divide_hidden: LlamaConfig and Gemma3TextConfig validate hidden_size % num_attention_heads.
# decilm: DeciLM is Llama's layer with per-layer sizes; Mistral's layers are Llama's.
_BUILTIN_FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        model_types=("llama",),
        gguf_archs=("llama",),
        adapter="llama",
        biases={"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": "mlp_bias"},
        serving=_LLAMA_LIKE,
        heads_divide_hidden=True,
        decilm=True,
    ),
    Family(
        "mistral",
        model_types=("mistral",),
        gguf_archs=("mistral",),
        adapter="mistral",
        biases={"qkv_bias": False, "o_bias": False, "mlp_bias": False},
        serving=_LLAMA_LIKE,
        default_kv_heads=8,
        windows=WindowRule("every_layer"),
        decilm=True,
    ),
    Family(
        "qwen2",
        model_types=("qwen2",),
        gguf_archs=("qwen2",),
        adapter="qwen2",
        biases={"qkv_bias": True, "o_bias": False, "mlp_bias": False},
        serving=_UNIFORM_ONLY,
        default_kv_heads=32,
        windows=_QWEN_WINDOWS,
    ),
    Family(
        "qwen3",
        model_types=("qwen3",),
        gguf_archs=("qwen3",),
        adapter="qwen3",
        biases={"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False},
        serving=_UNIFORM_ONLY,
        qk_norm=True,
        default_kv_heads=32,
        default_head_dim=128,
        windows=_QWEN_WINDOWS,
    ),
    Family(
        "gemma3_text",
        model_types=("gemma3_text",),
        gguf_archs=("gemma3",),
        adapter="gemma3_text",
        biases={"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False},
        serving=_UNIFORM_ONLY,
        qk_norm=True,
        post_norms=True,
        default_kv_heads=4,
        default_head_dim=256,
        default_tied=True,
        windows=WindowRule("layer_types", default_pattern=6),
        heads_divide_hidden=True,
    ),
)

# Architecture-only families (issue 30): mixtures of experts and hybrid Mamba-2 decoders, read from their
# configs and counted exactly (arch/moe_configs.py), refused by every weights path and by the cost model
# until expert/SSM slicing exists (the cost model and plan mode take them: arch/hybrid.py). What the
# engines load of them is their plain config, which holds one size per layer kind ("uniform": every
# MoE layer alike, every Mamba-2 layer alike): vLLM's mixtral/qwen3_moe/gpt_oss/nemotron_h models,
# SGLang's and TensorRT-LLM's of the same names, llama.cpp's converters (below), transformers' own
# classes. Nemotron-H has one per-layer form, NVIDIA's "Puzzle" (model_type nemotron_h_puzzle: block_configs
# with each MoE layer's expert width and top-k, hf/puzzle.py), which prune/experts.py writes and llama.cpp
# converts; its config reads as a nemotron_h Architecture with per-layer MoE sizes (arch/moe_configs.py).
# The engine rules (serving below) still describe the plain config only. No GGUF names yet: the GGUF
# reader does not read expert or SSM metadata (llama.cpp writes these as qwen3moe, gpt-oss, nemotron_h_moe,
# granitehybrid, and Mixtral as "llama" with llama.expert_count, which arch/gguf.py refuses).
# Source: transformers 5.24 configuration_{family}.py (defaults) and modeling_{family}.py (parameters):
#   mixtral: no biases anywhere; 8 KV heads; sliding_window (default None) on every layer; router (E, D).
#   qwen3_moe: q,k,v,o biased iff attention_bias, q/k RMSNorm, 4 KV heads, head_dim from the config or
#     hidden/heads; sliding_window (default 4096) on every layer iff use_sliding_window.
#   gpt_oss: q,k,v,o biased iff attention_bias (default true), one sink logit per query head, 8 KV
#     heads, head_dim 64; layer_types default: even layers slide over sliding_window (default 128).
#   nemotron_h: one block per layer (Mamba-2, attention, MoE or MLP), attention never biased, MLP,
#     shared expert and latent projections biased iff mlp_bias, relu² MLPs (not gated); 8 KV heads,
#     head_dim 128; no sliding windows.
#   granitemoehybrid: q,k,v,o biased iff attention_bias; a Mamba-2 or attention mixer then MoE + a
#     gated shared MLP in every layer, no MLP biases; no sliding windows.
_SPARSE_UNIFORM: Mapping[str, Loads] = {**dict.fromkeys(_DECILM_ENGINES, "uniform"), "transformers": "uniform"}
_NO_BIASES: Mapping[str, str | bool] = {"qkv_bias": False, "o_bias": False, "mlp_bias": False}
_ARCHITECTURE_ONLY: tuple[Family, ...] = (
    Family(
        "mixtral",
        model_types=("mixtral",),
        gguf_archs=(),
        adapter=None,
        biases=_NO_BIASES,
        serving=_SPARSE_UNIFORM,
        default_kv_heads=8,
        windows=WindowRule("every_layer", default_window=None),
        config_reader="mixtral",
    ),
    Family(
        "qwen3_moe",
        model_types=("qwen3_moe",),
        gguf_archs=(),
        adapter=None,
        biases={"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False},
        serving=_SPARSE_UNIFORM,
        qk_norm=True,
        default_kv_heads=4,
        windows=WindowRule("every_layer", switch="use_sliding_window"),
        config_reader="qwen3_moe",
    ),
    Family(
        "gpt_oss",
        model_types=("gpt_oss",),
        gguf_archs=(),
        adapter=None,
        biases={"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False},
        serving=_SPARSE_UNIFORM,
        default_kv_heads=8,
        default_head_dim=64,
        windows=WindowRule("layer_types", default_pattern=2, default_window=128),
        default_bias=True,
        config_reader="gpt_oss",
        attention_sinks=True,
    ),
    Family(
        "nemotron_h",
        model_types=("nemotron_h", "nemotron_h_puzzle"),  # Puzzle: per-layer MoE sizes (see above)
        gguf_archs=(),
        adapter=None,
        biases={"qkv_bias": False, "o_bias": False, "mlp_bias": "mlp_bias"},
        serving=_SPARSE_UNIFORM,
        default_kv_heads=8,
        default_head_dim=128,
        config_reader="nemotron_h",
        gated_ffn=False,
    ),
    Family(
        "granitemoehybrid",
        model_types=("granitemoehybrid",),
        gguf_archs=(),
        adapter=None,
        biases={"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False},
        serving=_SPARSE_UNIFORM,
        config_reader="granitemoehybrid",
    ),
)


def _register_builtins(registry: Registry[Family]) -> None:
    for entry in (*_BUILTIN_FAMILIES, *_ARCHITECTURE_ONLY):
        _register(registry, entry, replace=False)


FAMILIES: Registry[Family] = Registry("model family", builtins=_register_builtins)
# Registration order: error messages list the families in it (Registry.names() sorts).
_ORDER: list[str] = []


def _register(registry: Registry[Family], entry: Family, *, replace: bool) -> Family:
    """Check that ``entry`` claims no model_type or GGUF architecture of another family, then register it."""
    others = [registry.get(name) for name in _ORDER if name != entry.name]
    for attribute, what in (("model_types", "model_type"), ("gguf_archs", "GGUF architecture")):
        for value in getattr(entry, attribute):
            owner = next((f.name for f in others if value in getattr(f, attribute)), None)
            if owner is not None:
                raise ValueError(f"family {entry.name!r}: {what} {value!r} already belongs to family {owner!r}")
    registry.register(entry.name, entry, replace=replace)
    if entry.name not in _ORDER:
        _ORDER.append(entry.name)
    return entry


def register_family(entry: Family, *, replace: bool = False) -> Family:
    """Add ``entry`` to :data:`FAMILIES` (a plugin's family; built-ins are :data:`_BUILTIN_FAMILIES`).

    Raises ``ValueError`` when its name is registered (unless ``replace``) or one of its model_types
    or GGUF architectures belongs to another family. Its adapter must be registered under
    ``entry.adapter`` in ``autocompress_opt.hf.adapters.ADAPTERS``.
    """
    FAMILIES.names()  # the built-ins first, so a plugin cannot take their names or model_types
    return _register(FAMILIES, entry, replace=replace)


def family_names() -> tuple[str, ...]:
    """Every registered family's name, in registration order (the built-ins first)."""
    names = FAMILIES.names()  # registers the built-ins on first use
    return (*_ORDER, *(name for name in names if name not in _ORDER))  # + any registered around register_family


def architecture_only_families() -> tuple[str, ...]:
    """The registered families without an adapter (described and counted, not yet pruned or costed)."""
    return tuple(name for name in family_names() if family(name).architecture_only)


def family(name: str) -> Family:
    """The family called ``name``; :class:`~autocompress_opt.errors.UnknownNameError` ("unknown model
    family 'x' — did you mean …? available: …") for any other name."""
    return FAMILIES.get(name)


def family_for_model_type(model_type: str) -> Family | None:
    """The family a Hugging Face ``model_type`` (any case) belongs to, or None."""
    key = model_type.lower()
    return next((f for f in map(FAMILIES.get, family_names()) if key in f.model_types), None)


def family_for_gguf_arch(arch: str) -> Family | None:
    """The family a GGUF ``general.architecture`` value belongs to, or None."""
    return next((f for f in map(FAMILIES.get, family_names()) if arch in f.gguf_archs), None)
