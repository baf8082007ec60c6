"""An exact, immutable description of a (possibly heterogeneous) decoder-only transformer.

An :class:`Architecture` is global structure (vocabulary, hidden size, tied embeddings, family
details such as biases and QK-norm) plus one :class:`LayerSpec` per layer, so every layer may keep
its own heads and FFN width, or drop attention or the FFN altogether (DeciLM ``no_op`` blocks).

Its parameter count is exact: for a config that transformers can build it equals
``sum(p.numel() for p in model.parameters())`` (tested per family: llama, mistral, qwen2, qwen3 and
gemma3_text, whose four norms per layer are a family trait, not a field).

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

from autocompress_opt.arch.families import FAMILIES, WindowRule, family, family_for_model_type, family_names
from autocompress_opt.errors import ConfigError, check_bool, check_int, reject_unknown_keys, suggest, yaml_problem

__all__ = [
    "SUPPORTED_FAMILIES",
    "Architecture",
    "LayerSpec",
    "default_layer_order",
    "hf_layer_windows",
    "reference_layer",
    "uniform_child",
]


# The families' facts (biases, norms, config defaults, window rules) are their registry entries.
SUPPORTED_FAMILIES: tuple[str, ...] = family_names()  # the built-in families, in registration order


# More layers than any decoder has: a config asking for more is a typo (1e12 would exhaust memory).
MAX_LAYERS = 10_000


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
    """

    attention: bool = True
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    ffn: bool = True
    ffn_width: int = 0
    window: int | None = None

    def __post_init__(self) -> None:
        for name in ("attention", "ffn"):
            check_bool(getattr(self, name), f"LayerSpec.{name}")
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
        """True when the layer is dropped entirely (no attention and no FFN)."""
        return not self.attention and not self.ffn

    @classmethod
    def dropped(cls) -> LayerSpec:
        """A fully dropped layer (DeciLM attention and FFN ``no_op``)."""
        return cls(attention=False, ffn=False)


def _sizes(layer: LayerSpec) -> tuple[Any, ...]:
    """A layer's sizes, its window left out (what :attr:`Architecture.is_uniform` compares)."""
    return (layer.attention, layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.ffn, layer.ffn_width)


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
        layer, d_model = self.layers[i], self.hidden_size
        norms_per_block = 2 if family(self.family).post_norms else 1
        total = 0
        if layer.attention:
            q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
            total += norms_per_block * d_model  # input_layernorm (+ Gemma's post_attention_layernorm)
            total += d_model * (q + 2 * kv) + q * d_model  # q, k, v, o projections
            total += (q + 2 * kv) if self.qkv_bias else 0
            total += d_model if self.o_bias else 0
            total += 2 * layer.head_dim if self.qk_norm else 0
        if layer.ffn:
            total += norms_per_block * d_model  # pre-FFN norm (+ Gemma's post_feedforward_layernorm)
            total += 3 * d_model * layer.ffn_width  # gate, up, down
            total += (2 * layer.ffn_width + d_model) if self.mlp_bias else 0
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

        A layer's ``window`` is written only when set, so a full-attention architecture serialises
        (and hashes, in cache keys) as it did before windows existed; a missing key reads as None.
        """
        data = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        data["layers"] = [
            {k: v for k, v in asdict(layer).items() if k != "window" or v is not None} for layer in self.layers
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
            layers.append(LayerSpec(**raw))
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
        (a multimodal Gemma 3 config is read through its ``text_config``). Keys a
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
            **{
                flag: _config_bool(cfg, src, False, model_type) if isinstance(src, str) else src
                for flag, src in fam.biases.items()
            },
        )
        windows = _layer_windows(cfg, model_type, arch.num_layers)
        return replace(arch, layers=tuple(replace(layer, window=w) for layer, w in zip(arch.layers, windows)))

    def to_hf_config(self) -> Any:
        """A transformers config that builds a model with exactly :attr:`num_params` parameters and
        the layers' windows (``layer_types`` + ``sliding_window``; Mistral's model-wide window).

        Raises :class:`ConfigError` for a heterogeneous architecture, for bias/QK-norm flags the
        family's config cannot express (e.g. ``o_bias`` on qwen2), or for windows it cannot
        express (any window on llama; two window sizes; on mistral, sliding and full layers mixed).
        """
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
        return (
            f"{self.name or self.family}: {len(active)}/{self.num_layers} layers, hidden {self.hidden_size}, "
            f"heads {span(heads)}, ffn {span(ffn)}, {self.num_params / 1e6:.1f}M params"
        )


# ----------------------------------------------------------------- uniform children
def reference_layer(parent: Architecture) -> LayerSpec:
    """The first layer with attention and an FFN: the sizes a uniform child starts from and the
    limits of a search space (its window is irrelevant: each kept layer keeps its own).

    Raises :class:`ConfigError` when no layer has both.
    """
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
    kept = set(kept_layers)
    if not kept or len(kept) != len(kept_layers):
        raise ConfigError(f"kept_layers must name at least one layer, each once; got {list(kept_layers)}")
    bad = sorted(i for i in kept if not (0 <= i < parent.num_layers) or parent.layers[i].is_noop)
    if bad:
        raise ConfigError(
            f"kept_layers {bad} are not present layers of the parent (layers 0..{parent.num_layers - 1}, "
            "fully dropped ones excluded)"
        )
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


# ------------------------------------------------------------------------ windows
# Which layers slide is each family's WindowRule (arch/families.py, with its sources): a layer attends
# within ``config.sliding_window`` iff its ``layer_types`` entry is "sliding_attention" (Qwen2/3 only
# when ``use_sliding_window``), or every layer does (Mistral), or none (Llama).
_SLIDING, _FULL = "sliding_attention", "full_attention"
_DEFAULT_WINDOW = 4096  # sliding_window when a config omits it (every windowed transformers config)


def hf_layer_windows(config: Any) -> tuple[int | None, ...]:
    """Each layer's attention window (None = full attention) under a transformers config or its dict,
    as that family's transformers model applies it (its :class:`~autocompress_opt.arch.families.WindowRule`);
    full attention everywhere for a model_type of no registered family."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    return _layer_windows(cfg, str(cfg.get("model_type", "")).lower(), int(cfg["num_hidden_layers"]))


def _layer_windows(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[int | None, ...]:
    fam = family_for_model_type(model_type)
    rule = fam.windows if fam is not None else WindowRule()
    window = cfg.get("sliding_window", _DEFAULT_WINDOW)
    if rule.switch is not None and not cfg.get(rule.switch, False):
        window = None
    if rule.kind == "none" or window is None:
        return (None,) * num_layers
    check_int(window, f"{model_type} config sliding_window")
    if rule.kind == "every_layer":
        return (int(window),) * num_layers
    kinds = cfg.get("layer_types")
    if kinds is None and rule.default_pattern is not None:
        pattern = check_int(
            cfg.get("sliding_window_pattern", rule.default_pattern), f"{model_type} config sliding_window_pattern"
        )
        kinds = [_SLIDING if (i + 1) % pattern else _FULL for i in range(num_layers)]
    elif kinds is None:
        first = check_int(
            cfg.get("max_window_layers", rule.default_max_window_layers),
            f"{model_type} config max_window_layers",
            minimum=0,
        )
        kinds = [_SLIDING if i >= first else _FULL for i in range(num_layers)]
    if not isinstance(kinds, Sequence) or isinstance(kinds, str):
        raise ConfigError(f"{model_type} config layer_types must be a list, got {kinds!r}")
    if len(kinds) != num_layers:
        raise ConfigError(f"{model_type} config has {len(kinds)} layer_types for {num_layers} layers")
    return tuple(int(window) if kind == _SLIDING else None for kind in kinds)
