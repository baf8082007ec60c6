"""An exact, immutable description of a (possibly heterogeneous) decoder-only transformer.

An :class:`Architecture` is global structure (vocabulary, hidden size, tied embeddings, family
details such as biases and QK-norm) plus one :class:`LayerSpec` per layer, so every layer may keep
its own heads and FFN width, or drop attention or the FFN altogether (DeciLM ``no_op`` blocks).

Its parameter count is exact: for a config that transformers can build it equals
``sum(p.numel() for p in model.parameters())`` (tested per family: llama, mistral, qwen2, qwen3 and
gemma3_text, whose four norms per layer are a family trait, not a field).

**Mixtures of experts and Mamba-2 mixers** (issue 30) extend a layer *additively*: a layer has a
mixer (``attention``, ``mamba``, or none) and an FFN (``ffn`` dense, ``moe``, or none). The dense
fields keep their meaning exactly (``ffn``/``ffn_width`` is the dense gated MLP, ``attention`` and
its heads the attention), and two optional fields, ``LayerSpec.moe`` (a
:class:`~autocompress_opt.arch.moe.MoESpec`) and ``LayerSpec.mamba`` (a
:class:`~autocompress_opt.arch.moe.MambaSpec`), default None, describe the new kinds; a layer has at
most one mixer and one FFN. This choice keeps every dense architecture, its JSON/YAML (the new keys
are written only when set), its cache keys, its counts and every dense code path byte-identical,
and a dense consumer that reads ``ffn_width`` of a MoE layer sees 0, never a wrong width. Code that
cannot handle the new kinds yet (pruning, slicing, export, the inner search) refuses them by name
(:meth:`Architecture.require_dense`, naming issue 30), never treats them as dense; the serving cost
model costs them (:mod:`autocompress_opt.serving.roofline`). The families that
have them are architecture-only (:attr:`~autocompress_opt.arch.families.Family.architecture_only`),
read by :mod:`autocompress_opt.arch.moe_configs`. Parameters: :attr:`Architecture.num_params` is
the exact total; :meth:`Architecture.active_params` the parameters one token touches.

A layer may attend to a sliding window of the last ``LayerSpec.window`` tokens instead of the whole
context (Gemma 3: five of every six layers; Mistral: every layer; Qwen2/3 with
``use_sliding_window``). The window changes what the layer caches and computes, not its parameters.

Builders: :meth:`Architecture.uniform` (every layer alike, from sizes),
:meth:`Architecture.from_hf_config` (a transformers config object or dict),
:meth:`Architecture.from_dict` / :meth:`Architecture.from_yaml`; resolving a name or a file is
:func:`autocompress_opt.arch.catalog.load_architecture`. :func:`uniform_child` is the one builder of
a uniform child of a parent (the search space's points, the uniform baseline); which layers it keeps
comes from a layer order: importance scores rank them
(:meth:`autocompress_opt.prune.importance.Importance.layer_order`), else :func:`default_layer_order`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autocompress_opt.arch.families import (
    FAMILIES,
    architecture_only_families,
    family,
    family_for_model_type,
    family_names,
)
from autocompress_opt.arch.moe import MambaSpec, MoESpec
from autocompress_opt.arch.moe_configs import MAX_LAYERS, read_config
from autocompress_opt.arch.windows import FULL as _FULL
from autocompress_opt.arch.windows import SLIDING as _SLIDING
from autocompress_opt.arch.windows import hf_layer_windows
from autocompress_opt.arch.windows import layer_windows as _layer_windows
from autocompress_opt.errors import ConfigError, check_bool, check_int, reject_unknown_keys, suggest, yaml_problem

__all__ = [
    "ARCHITECTURE_ONLY_FAMILIES",
    "SUPPORTED_FAMILIES",
    "Architecture",
    "LayerSpec",
    "MambaSpec",
    "MoESpec",
    "check_kept_layers",
    "default_layer_order",
    "hf_layer_windows",
    "reference_layer",
    "uniform_child",
]


# The families' facts (biases, norms, config defaults, window rules) are their registry entries.
# The built-in families the whole package supports (weights, pruning, cost), in registration order;
# the architecture-only ones (mixtures of experts, hybrids) are read and counted only (issue 30).
ARCHITECTURE_ONLY_FAMILIES: tuple[str, ...] = architecture_only_families()
SUPPORTED_FAMILIES: tuple[str, ...] = tuple(n for n in family_names() if n not in ARCHITECTURE_ONLY_FAMILIES)


def _config_int(
    cfg: Mapping[str, Any],
    key: str,
    model_type: str,
    null: int | None = None,
    absent: int | None = None,
    maximum: int | None = None,
) -> int:
    """``cfg[key]`` as a positive int of at most ``maximum``: ``null`` when the value is null,
    ``absent`` when the key is missing (the transformers config class's defaults); anything else
    (a string, a list, a float, a bool, zero) is a :class:`ConfigError` naming the key and value."""
    value = cfg.get(key, absent)
    if value is None:
        value = null
    where = f"{model_type} config {key}"
    check_int(value, where)
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where} must be at most {maximum:,}, got {value!r}")
    return int(value)


def config_biases(cfg: Mapping[str, Any], family_name: str) -> dict[str, bool]:
    """The Architecture bias flags a config of ``family_name`` sets (its entry's ``biases``: a
    config key, read with the family's ``default_bias``, or a constant)."""
    fam = family(family_name)
    return {
        flag: _config_bool(cfg, src, fam.default_bias, fam.name) if isinstance(src, str) else src
        for flag, src in fam.biases.items()
    }


def _config_bool(cfg: Mapping[str, Any], key: str, default: bool, model_type: str) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    check_bool(value, f"{model_type} config {key}")
    return bool(value)


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer. A dropped sub-block has ``attention=False`` / ``ffn=False``.

    The sizes of a dropped sub-block are set to zero on construction (its ``window`` to None), so
    two layers that compute the same thing compare equal
    (``LayerSpec(attention=False, num_heads=8) == LayerSpec(attention=False)``).

    Attributes:
        attention: whether the layer has self-attention (False = DeciLM attention ``no_op``).
        num_heads: query heads.
        num_kv_heads: key/value heads; must divide ``num_heads`` (grouped-query attention).
        head_dim: channels per head.
        ffn: whether the layer has a (gated) MLP.
        ffn_width: MLP intermediate size.
        window: sliding-window attention over the last ``window`` tokens, the current one included
            (transformers' ``sliding_window``: query ``t`` sees keys ``t - window < s <= t``), so
            the layer caches at most ``window`` tokens; None = full causal attention. It does not
            change the parameter count.
        moe: the layer's FFN is this mixture of experts (then ``ffn`` is False); None: no MoE.
        mamba: the layer's mixer is this Mamba-2 (then ``attention`` is False); None: no Mamba.
    """

    attention: bool = True
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    ffn: bool = True
    ffn_width: int = 0
    window: int | None = None
    moe: MoESpec | None = None
    mamba: MambaSpec | None = None

    def __post_init__(self) -> None:
        for name in ("attention", "ffn"):
            check_bool(getattr(self, name), f"LayerSpec.{name}")
        self._check_kinds()
        for name in ("num_heads", "num_kv_heads", "head_dim", "ffn_width"):
            check_int(getattr(self, name), f"LayerSpec.{name}", minimum=0)
        if self.window is not None:
            check_int(self.window, "LayerSpec.window")
        if self.attention:
            self._check_attention()
        else:
            for name in ("num_heads", "num_kv_heads", "head_dim"):
                object.__setattr__(self, name, 0)
            object.__setattr__(self, "window", None)
        if self.ffn and self.ffn_width < 1:
            raise ConfigError(f"a layer with an FFN needs ffn_width >= 1, got ffn_width={self.ffn_width}")
        if not self.ffn:
            object.__setattr__(self, "ffn_width", 0)

    def _check_kinds(self) -> None:
        """The optional sub-blocks have their types, and a layer has at most one mixer and one FFN."""
        if self.moe is not None and not isinstance(self.moe, MoESpec):
            raise ConfigError(f"LayerSpec.moe must be a MoESpec or None, got {type(self.moe).__name__}")
        if self.mamba is not None and not isinstance(self.mamba, MambaSpec):
            raise ConfigError(f"LayerSpec.mamba must be a MambaSpec or None, got {type(self.mamba).__name__}")
        if self.moe is not None and self.ffn:
            raise ConfigError("a layer has one FFN: a MoE layer needs ffn=False (the dense FFN is the other kind)")
        if self.mamba is not None and self.attention:
            raise ConfigError("a layer has one mixer: a Mamba-2 layer needs attention=False")

    @property
    def mixer(self) -> str:
        """``"attention"``, ``"mamba2"`` or ``"none"``."""
        return "attention" if self.attention else "mamba2" if self.mamba is not None else "none"

    @property
    def ffn_kind(self) -> str:
        """``"dense"``, ``"moe"`` or ``"none"``."""
        return "dense" if self.ffn else "moe" if self.moe is not None else "none"

    def _check_attention(self) -> None:
        if self.num_heads < 1 or self.num_kv_heads < 1 or self.head_dim < 1:
            raise ConfigError(
                "a layer with attention needs num_heads, num_kv_heads and head_dim >= 1, got "
                f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
            )
        if self.num_heads % self.num_kv_heads:
            valid = [g for g in range(1, self.num_heads + 1) if self.num_heads % g == 0]
            raise ConfigError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}; "
                f"valid num_kv_heads: {', '.join(map(str, valid))}"
            )

    @property
    def is_noop(self) -> bool:
        """True when the layer is dropped entirely (no mixer and no FFN of any kind)."""
        return self.mixer == "none" and self.ffn_kind == "none"

    @classmethod
    def dropped(cls) -> LayerSpec:
        """A fully dropped layer (DeciLM attention and FFN ``no_op``)."""
        return cls(attention=False, ffn=False)


def _sizes(layer: LayerSpec) -> tuple[Any, ...]:
    """A layer's sizes, its window left out (what :attr:`Architecture.is_uniform` compares)."""
    dense = (layer.attention, layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.ffn, layer.ffn_width)
    return dense if layer.moe is None and layer.mamba is None else (*dense, layer.moe, layer.mamba)


# Layer keys to_dict writes only when set (a dense full-attention layer serialises as before they existed).
_WRITTEN_WHEN_SET = ("window", "moe", "mamba")


def _sub_blocks(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A serialised layer's ``moe`` / ``mamba`` mappings as :class:`MoESpec` / :class:`MambaSpec`
    (unknown keys rejected with a suggestion)."""
    out: dict[str, Any] = {}
    for key, spec in (("moe", MoESpec), ("mamba", MambaSpec)):
        value = raw.get(key)
        if value is None or isinstance(value, spec):
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}.{key} must be a mapping, got {value!r}")
        reject_unknown_keys(value, spec.__dataclass_fields__, f"{where}.{key}")
        try:
            out[key] = spec(**value)
        except TypeError as exc:  # a required size missing
            raise ConfigError(f"{where}.{key}: {exc}") from None
    return out


@dataclass(frozen=True)
class Architecture:
    """Global plus per-layer structure of a decoder; exact parameter counts.

    Attributes:
        vocab_size: rows of the embedding matrix.
        hidden_size: residual stream width ``D``.
        layers: one :class:`LayerSpec` per layer, in order.
        tie_embeddings: the LM head shares the embedding matrix.
        family: Hugging Face ``model_type`` the architecture came from (``llama``, ``qwen2``...).
        qkv_bias / o_bias / mlp_bias: linear layers with a bias vector.
        qk_norm: per-head RMSNorm on queries and keys (Qwen3, Gemma 3).
        max_context: the parent's ``max_position_embeddings`` (informational), or None.
        name: a label for reports.
    """

    vocab_size: int
    hidden_size: int
    layers: tuple[LayerSpec, ...]
    tie_embeddings: bool = False
    family: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_context: int | None = None
    name: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.layers, tuple):
            object.__setattr__(self, "layers", tuple(self.layers))
        for name in ("vocab_size", "hidden_size"):
            check_int(getattr(self, name), f"Architecture.{name}")
        for name in ("tie_embeddings", "qkv_bias", "o_bias", "mlp_bias", "qk_norm"):
            check_bool(getattr(self, name), f"Architecture.{name}")
        if self.max_context is not None:
            check_int(self.max_context, "Architecture.max_context")
        if not isinstance(self.name, str):
            raise ConfigError(f"Architecture.name must be a string, got {self.name!r}")
        if not self.layers:
            raise ConfigError("Architecture.layers is empty: a decoder needs at least one layer")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LayerSpec):
                raise ConfigError(f"Architecture.layers[{i}] must be a LayerSpec, got {type(layer).__name__}")
        if not isinstance(self.family, str) or self.family not in FAMILIES or family(self.family).name != self.family:
            names = family_names()
            raise ConfigError(
                f"Architecture.family {self.family!r} is not supported{suggest(str(self.family), names)}; "
                f"supported: {', '.join(names)}"
            )

    # ----------------------------------------------------------------- structure
    @property
    def num_layers(self) -> int:
        """Layers in the stack, dropped (no-op) layers included."""
        return len(self.layers)

    @property
    def num_active_layers(self) -> int:
        """Layers that compute something (attention or FFN)."""
        return sum(not layer.is_noop for layer in self.layers)

    @property
    def is_uniform(self) -> bool:
        """True when every layer has the same sizes and is present: a plain HF config can describe it.

        Windows are not compared: a plain config gives each layer its own attention kind
        (``layer_types``), so Gemma 3, whose layers differ only in their window, is uniform.
        :meth:`to_hf_config` still refuses windows the family's config cannot express.
        """
        if "is_uniform" not in self._cache:
            first = _sizes(self.layers[0])
            self._cache["is_uniform"] = bool(
                first[0] and first[4] and all(_sizes(layer) == first for layer in self.layers)
            )
        return bool(self._cache["is_uniform"])

    def dense_problem(self) -> str | None:
        """What dense-only code cannot take in this architecture (``"MoE layers"``, ``"Mamba-2
        layers"``, or an architecture-only family), or None when every layer is a dense one of a
        fully supported family."""
        if "dense_problem" not in self._cache:
            kinds = [
                what
                for what, present in (
                    ("MoE layers", any(layer.moe is not None for layer in self.layers)),
                    ("Mamba-2 layers", any(layer.mamba is not None for layer in self.layers)),
                )
                if present
            ]
            problem = " and ".join(kinds) or None
            if problem is None and family(self.family).architecture_only:
                problem = f"{self.family} layers"
            self._cache["dense_problem"] = problem
        return self._cache["dense_problem"]

    def require_dense(self, action: str) -> None:
        """Raise :class:`ConfigError` when :meth:`dense_problem` finds something ``action`` (e.g.
        ``"costed"``, ``"pruned"``, ``"exported"``) cannot handle yet, naming it; else nothing."""
        problem = self.dense_problem()
        if problem is not None:
            raise ConfigError(
                f"{self.name or self.family}: {problem} are described but not yet {action}: issue 30 "
                f"(the {self.family!r} family is architecture-only: its parameters are counted, "
                f"nothing else takes it yet)"
            )

    def active(self) -> Architecture:
        """The same model with fully dropped layers removed from the stack (same parameter count).

        Raises :class:`ConfigError` when every layer is dropped.
        """
        return replace(self, layers=tuple(layer for layer in self.layers if not layer.is_noop))

    # ------------------------------------------------------------------ counting
    def layer_params(self, i: int) -> int:
        """Exact parameter count of layer ``i`` (norms and biases included).

        Each present sub-block brings its own pre-norm (``input_layernorm`` before attention,
        ``post_attention_layernorm`` before the FFN), as in DeciLM; a family with post-norms
        (Gemma 3) adds one more RMSNorm(D) on each present sub-block's output.
        """
        return self._layer_params(i, active=False)

    def _layer_params(self, i: int, *, active: bool) -> int:
        """Layer ``i``'s parameters: all of them, or (``active``) those one token touches."""
        layer, d_model, fam = self.layers[i], self.hidden_size, family(self.family)
        norms_per_block = 2 if fam.post_norms else 1
        total = 0
        if layer.attention:
            q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
            total += norms_per_block * d_model  # input_layernorm (+ Gemma's post_attention_layernorm)
            total += d_model * (q + 2 * kv) + q * d_model  # q, k, v, o projections
            total += (q + 2 * kv) if self.qkv_bias else 0
            total += d_model if self.o_bias else 0
            total += 2 * layer.head_dim if self.qk_norm else 0
            total += layer.num_heads if fam.attention_sinks else 0  # gpt-oss: one sink logit per head
        if layer.mamba is not None:
            total += norms_per_block * d_model + layer.mamba.params(d_model)
        if layer.ffn:
            gated = fam.gated_ffn  # gate, up, down (Nemotron-H's relu² MLP: up, down)
            total += norms_per_block * d_model  # pre-FFN norm (+ Gemma's post_feedforward_layernorm)
            total += (3 if gated else 2) * d_model * layer.ffn_width
            total += ((2 if gated else 1) * layer.ffn_width + d_model) if self.mlp_bias else 0
        if layer.moe is not None:
            count = layer.moe.active_params if active else layer.moe.params
            total += norms_per_block * d_model + count(d_model, self.mlp_bias)
        return total

    @property
    def embedding_params(self) -> int:
        """Embedding matrix plus an untied LM head."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def non_embedding_params(self) -> int:
        """All layers plus the final norm."""
        if "non_embedding" not in self._cache:
            self._cache["non_embedding"] = sum(self.layer_params(i) for i in range(self.num_layers)) + self.hidden_size
        return self._cache["non_embedding"]

    @property
    def num_params(self) -> int:
        """Exact total: equals ``sum(p.numel() for p in model.parameters())`` of the built model.

        Never rises when a layer's ``ffn_width`` or ``num_heads`` shrinks.
        """
        return self.non_embedding_params + self.embedding_params

    def active_params(self, *, count_embedding: bool = True) -> int:
        """Parameters one token touches: every dense part, and in each MoE layer the router, the
        latent projections, the shared expert and ``experts_per_token`` of the routed experts.

        ``count_embedding`` counts the whole input-embedding matrix (the convention of Mixtral's,
        Qwen3-MoE's and Nemotron 3's published "active" figures); False counts only the LM head of
        an untied model, since a lookup reads one row (OpenAI's gpt-oss figure). Tied embeddings
        are the LM head, counted either way. Equals :attr:`num_params` for a dense architecture
        (with ``count_embedding``).
        """
        key = f"active_{count_embedding}"
        if key not in self._cache:
            layers = sum(self._layer_params(i, active=True) for i in range(self.num_layers)) + self.hidden_size
            embedding = self.embedding_params
            if not count_embedding and not self.tie_embeddings:
                embedding -= self.vocab_size * self.hidden_size
            self._cache[key] = layers + embedding
        return int(self._cache[key])

    def state_elements_per_sequence(self) -> int:
        """Elements each sequence keeps in its Mamba-2 layers, whatever its length (SSM state plus
        convolution window, :meth:`MambaSpec.state_elements`); 0 without Mamba-2 layers."""
        return sum(layer.mamba.state_elements() for layer in self.layers if layer.mamba is not None)

    def kv_elements_per_token(self) -> int:
        """K and V elements one token adds to the cache of every attention layer: ``2·Σ_i g_i·d_i``.

        Windows are ignored: this is the growth rate while every window is still filling. A
        sequence of ``S`` tokens caches ``min(S, window)`` of them in a sliding layer
        (:meth:`kv_bytes`).
        """
        return 2 * sum(layer.num_kv_heads * layer.head_dim for layer in self.layers if layer.attention)

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """KV-cache bytes per token at ``bytes_per_element`` (2 for a bf16 cache), windows ignored
        (see :meth:`kv_elements_per_token`)."""
        return self.kv_elements_per_token() * bytes_per_element

    def kv_bytes(self, tokens: int, bytes_per_element: float = 2.0) -> float:
        """KV-cache bytes of one sequence of ``tokens`` tokens: ``2·b·Σ_i g_i·d_i·min(tokens, w_i)``
        (``w_i`` = the layer's window, or ``tokens`` for full attention)."""
        return (
            2
            * bytes_per_element
            * sum(
                layer.num_kv_heads * layer.head_dim * min(tokens, layer.window or tokens)
                for layer in self.layers
                if layer.attention
            )
        )

    # ------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-safe data; :meth:`from_dict` inverts it exactly.

        A layer's ``window``, ``moe`` and ``mamba`` are written only when set, so a dense
        full-attention architecture serialises (and hashes, in cache keys) as it did before they
        existed; a missing key reads as None.
        """
        data = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        data["layers"] = [
            {k: v for k, v in asdict(layer).items() if k not in _WRITTEN_WHEN_SET or v is not None}
            for layer in self.layers
        ]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Architecture:
        """Inverse of :meth:`to_dict`; unknown keys are rejected with a suggestion."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"an architecture must be a mapping, got {type(data).__name__}")
        fields = {f for f in cls.__dataclass_fields__ if not f.startswith("_")}
        reject_unknown_keys(data, fields, "Architecture")
        if "layers" not in data or not isinstance(data["layers"], Sequence):
            raise ConfigError("Architecture needs 'layers': a list of per-layer mappings")
        layer_fields = set(LayerSpec.__dataclass_fields__)
        layers = []
        for i, raw in enumerate(data["layers"]):
            if not isinstance(raw, Mapping):
                raise ConfigError(f"Architecture.layers[{i}] must be a mapping, got {raw!r}")
            reject_unknown_keys(raw, layer_fields, f"Architecture.layers[{i}]")
            layers.append(LayerSpec(**{**raw, **_sub_blocks(raw, f"Architecture.layers[{i}]")}))
        return cls(**{**data, "layers": tuple(layers)})

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Architecture:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"an architecture is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)  # allow_unicode=True mangles "\x85" (NEL)

    @classmethod
    def from_yaml(cls, text: str) -> Architecture:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"an architecture is not valid YAML: {yaml_problem(exc)}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> Path:
        """Write JSON (``.json``) or YAML (``.yaml``/``.yml``); :func:`load_architecture` reads it back."""
        path = Path(path)
        text = self.to_yaml() if path.suffix in (".yaml", ".yml") else self.to_json()
        path.write_text(text, encoding="utf-8")
        return path

    # -------------------------------------------------------------- construction
    @classmethod
    def uniform(
        cls,
        *,
        num_layers: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        ffn_width: int,
        vocab_size: int,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> Architecture:
        """Every layer identical (full attention), like a plain Hugging Face config."""
        if num_layers < 1:
            raise ConfigError(f"num_layers must be >= 1, got {num_layers}")
        if head_dim is None:
            if num_heads < 1 or hidden_size % num_heads:
                raise ConfigError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}; pass head_dim")
            head_dim = hidden_size // num_heads
        layer = LayerSpec(True, num_heads, num_kv_heads, head_dim, True, ffn_width)
        return cls(vocab_size=vocab_size, hidden_size=hidden_size, layers=(layer,) * num_layers, **kwargs)

    @classmethod
    def from_hf_config(cls, config: Any, name: str = "") -> Architecture:
        """Build from a transformers ``PretrainedConfig`` or its dict (``config.json``).

        Supports ``model_type`` llama (SmolLM2 is llama), mistral, qwen2, qwen3 and gemma3_text
        (a multimodal Gemma 3 config is read through its ``text_config``), and the
        architecture-only mixtral, qwen3_moe, gpt_oss, nemotron_h and granitemoehybrid (their
        family's ``config_reader``, :mod:`autocompress_opt.arch.moe_configs`). Keys a
        ``config.json`` omits take the transformers config class's default, so the count stays
        exact. Each layer's ``window`` follows :func:`hf_layer_windows`. A config that is not a
        decoder LLM of these families raises :class:`ConfigError` naming its model_type.
        """
        cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"text_config must be a mapping, got {cfg!r}")
        model_type = str(cfg.get("model_type", "")).lower()
        fam = family_for_model_type(model_type)
        if fam is None:
            names = family_names()
            raise ConfigError(
                f"model_type {model_type or '(missing)'!r} is not a supported decoder LLM"
                f"{suggest(model_type, names)}; supported: {', '.join(names)}"
            )
        if fam.config_reader is not None:  # experts / Mamba-2 / per-layer kinds
            data: dict[str, Any] = {**read_config(cfg, fam), **config_biases(cfg, fam.name)}
            data["layers"] = tuple(LayerSpec(**layer) for layer in data["layers"])
            return cls(**data, name=name or str(cfg.get("_name_or_path", "") or ""))
        required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        missing = [k for k in required if cfg.get(k) is None]
        if missing:
            raise ConfigError(f"{model_type} config is missing {', '.join(missing)}")
        size = lambda key, null=None, absent=None, maximum=None: _config_int(
            cfg, key, model_type, null, absent, maximum
        )
        heads, hidden = size("num_attention_heads"), size("hidden_size")
        max_context = cfg.get("max_position_embeddings")
        arch = cls.uniform(
            num_layers=size("num_hidden_layers", maximum=MAX_LAYERS),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=size("num_key_value_heads", heads, fam.default_kv_heads or heads),
            head_dim=size("head_dim", hidden // heads or None, fam.default_head_dim or hidden // heads or None),
            ffn_width=size("intermediate_size"),
            vocab_size=size("vocab_size"),
            tie_embeddings=_config_bool(cfg, "tie_word_embeddings", fam.default_tied, model_type),
            family=fam.name,
            qk_norm=fam.qk_norm,
            max_context=None if max_context is None else size("max_position_embeddings"),
            name=name or str(cfg.get("_name_or_path", "") or ""),
            **config_biases(cfg, fam.name),
        )
        windows = _layer_windows(cfg, model_type, arch.num_layers)
        return replace(arch, layers=tuple(replace(layer, window=w) for layer, w in zip(arch.layers, windows)))

    def to_hf_config(self) -> Any:
        """A transformers config that builds a model with exactly :attr:`num_params` parameters and
        the layers' windows (``layer_types`` + ``sliding_window``; Mistral's model-wide window).

        Raises :class:`ConfigError` for MoE or Mamba-2 layers or an architecture-only family
        (:meth:`require_dense`), for a heterogeneous architecture, for bias/QK-norm flags the
        family's config cannot express (e.g. ``o_bias`` on qwen2), or for windows it cannot
        express (any window on llama; two window sizes; on mistral, sliding and full layers mixed).
        """
        self.require_dense("exported (no config of them is written)")
        if not self.is_uniform:
            raise ConfigError("a heterogeneous architecture has no plain Hugging Face config; export it as DeciLM")
        from transformers import AutoConfig

        layer = self.layers[0]
        kwargs: dict[str, Any] = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=layer.num_heads,
            num_key_value_heads=layer.num_kv_heads,
            head_dim=layer.head_dim,
            intermediate_size=layer.ffn_width,
            tie_word_embeddings=self.tie_embeddings,
            **self._hf_flag_kwargs(),
            **self._hf_window_kwargs(),
        )
        if self.max_context:
            kwargs["max_position_embeddings"] = self.max_context
        return AutoConfig.for_model(self.family, **kwargs)

    def _hf_window_kwargs(self) -> dict[str, Any]:
        """Config keys that give every layer its window (:func:`hf_layer_windows` reads them back)."""
        windows = [layer.window for layer in self.layers]
        sizes = sorted({w for w in windows if w is not None})
        if len(sizes) > 1:
            raise ConfigError(f"a {self.family} config has one sliding_window, but the layers use windows {sizes}")
        window, rule = (sizes[0] if sizes else None), family(self.family).windows
        if rule.kind == "every_layer":
            if window is not None and None in windows:
                raise ConfigError(
                    f"a {self.family} config's sliding_window applies to every layer; "
                    "these layers mix sliding and full attention"
                )
            return {"sliding_window": window}  # None must be explicit: MistralConfig defaults to 4096
        if rule.kind == "none":
            if window is not None:
                raise ConfigError(f"a {self.family} config cannot express sliding windows (layers use window {window})")
            return {}
        kinds = [_SLIDING if w is not None else _FULL for w in windows]
        kwargs: dict[str, Any] = {"layer_types": kinds}
        if window is not None:
            kwargs["sliding_window"] = window
            if rule.switch is not None:
                kwargs[rule.switch] = True
        return kwargs

    def _hf_flag_kwargs(self) -> dict[str, bool]:
        """Config keys that reproduce this architecture's bias flags; raises if none can."""
        fam, kwargs = family(self.family), dict[str, bool]()
        for flag, src in fam.biases.items():
            value = getattr(self, flag)
            expressible = kwargs.setdefault(src, value) == value if isinstance(src, str) else src == value
            if not expressible:
                flags = ", ".join(f"{f}={getattr(self, f)}" for f in fam.biases)
                raise ConfigError(f"a {self.family} config cannot express {flags}")
        if self.qk_norm != fam.qk_norm:
            raise ConfigError(f"a {self.family} config cannot express qk_norm={self.qk_norm}")
        return kwargs

    # --------------------------------------------------------------- reporting
    def summary(self) -> str:
        """One line: depth, width, heads, FFN and parameter count."""
        active = [layer for layer in self.layers if not layer.is_noop]
        heads = sorted({layer.num_heads for layer in active if layer.attention})
        ffn = sorted({layer.ffn_width for layer in active if layer.ffn})
        span = lambda v: "-" if not v else (str(v[0]) if len(v) == 1 else f"{v[0]}..{v[-1]}")
        text = (
            f"{self.name or self.family}: {len(active)}/{self.num_layers} layers, hidden {self.hidden_size}, "
            f"heads {span(heads)}, ffn {span(ffn)}, {self.num_params / 1e6:.1f}M params"
        )
        moe = [layer.moe for layer in active if layer.moe is not None]
        mamba = sum(layer.mamba is not None for layer in active)
        if not moe and not mamba:
            return text  # a dense architecture's line, as before
        experts, tops = sorted({m.num_experts for m in moe}), sorted({m.experts_per_token for m in moe})
        widths = sorted({m.expert_width for m in moe})
        per_layer = f", width {span(widths)}" if len(widths) > 1 else ""  # the Puzzle form: each layer its own
        parts = [f"{len(moe)} MoE layers ({span(experts)} experts, top-{span(tops)}{per_layer})"] if moe else []
        parts += [f"{mamba} Mamba-2 layers"] if mamba else []
        return f"{text} ({self.active_params() / 1e6:.1f}M active); {', '.join(parts)}"


# ----------------------------------------------------------------- uniform children
def reference_layer(parent: Architecture) -> LayerSpec:
    """The first layer with attention and an FFN: the sizes a uniform child starts from and the
    limits of a search space (its window is irrelevant: each kept layer keeps its own).

    Raises :class:`ConfigError` when no layer has both, or for MoE / Mamba-2 layers and
    architecture-only families (:meth:`Architecture.require_dense`: not yet pruned).
    """
    parent.require_dense("pruned")
    for layer in parent.layers:
        if layer.attention and layer.ffn:
            return layer
    raise ConfigError(
        f"parent {parent.name or parent.family!r} has no layer with both attention and an FFN to take sizes from"
    )


def default_layer_order(parent: Architecture) -> list[int]:
    """The parent's layers from most to least worth keeping when no importance scores are known.

    Deeper layers are the most redundant, but the last one is not (Gromov et al. 2024, "The
    Unreasonable Ineffectiveness of the Deeper Layers"): the first present layer, the last, then the
    rest front to back, so the ``n`` first entries are the first ``n - 1`` present layers and the last
    one (``n >= 2``). Fully dropped layers come last, in index order. A permutation of
    ``range(parent.num_layers)``.
    """
    present = [i for i, layer in enumerate(parent.layers) if not layer.is_noop]
    dropped = [i for i, layer in enumerate(parent.layers) if layer.is_noop]
    return present[:1] + present[-1:] + present[1:-1] + dropped if len(present) > 1 else present + dropped


def check_kept_layers(parent: Architecture, kept_layers: Sequence[int]) -> set[int]:
    """``kept_layers`` as a set; a :class:`ConfigError` when it is empty, repeats a layer, or names one
    the parent lacks or drops entirely."""
    kept = set(kept_layers)
    if not kept or len(kept) != len(kept_layers):
        raise ConfigError(f"kept_layers must name at least one layer, each once; got {list(kept_layers)}")
    bad = sorted(i for i in kept if not (0 <= i < parent.num_layers) or parent.layers[i].is_noop)
    if bad:
        raise ConfigError(
            f"kept_layers {bad} are not present layers of the parent (layers 0..{parent.num_layers - 1}, "
            "fully dropped ones excluded)"
        )
    return kept


def uniform_child(
    parent: Architecture,
    *,
    kept_layers: Sequence[int],
    hidden_size: int,
    num_kv_heads: int,
    q_per_kv: int,
    ffn_width: int,
    name: str | None = None,
) -> Architecture:
    """A uniform child of ``parent``: every kept layer alike in size, the others dropped.

    Each parent layer ``i`` in ``kept_layers`` becomes a layer with attention (``num_kv_heads`` KV
    heads, ``num_kv_heads · q_per_kv`` query heads of :func:`reference_layer`'s ``head_dim``) and an
    FFN of ``ffn_width`` channels, keeping parent layer ``i``'s attention window; every other layer
    is :meth:`LayerSpec.dropped`. The child lists all ``parent.num_layers`` layers (``.active()``
    leaves out the dropped ones) and keeps the parent's vocabulary, family, biases and tying; its
    name defaults to ``"<parent>-pruned"``. Sizes are not checked against the parent's
    (:func:`~autocompress_opt.prune.plan.plan_pruning` does that).

    Raises :class:`ConfigError` when ``kept_layers`` is empty, repeats a layer, or names one the
    parent lacks or drops entirely.
    """
    kept = check_kept_layers(parent, kept_layers)
    ref = reference_layer(parent)
    layer = LayerSpec(True, num_kv_heads * q_per_kv, num_kv_heads, ref.head_dim, True, ffn_width)
    # One LayerSpec per distinct window, shared by the layers that have it (baselines build thousands).
    by_window = {w: replace(layer, window=w) for w in {parent.layers[i].window for i in kept}}
    dropped = LayerSpec.dropped()
    return replace(
        parent,
        hidden_size=hidden_size,
        layers=tuple(by_window[spec.window] if i in kept else dropped for i, spec in enumerate(parent.layers)),
        name=f"{parent.name or parent.family}-pruned" if name is None else name,
    )
