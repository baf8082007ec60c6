"""An exact, immutable description of a (possibly heterogeneous) decoder-only transformer.

An :class:`Architecture` is global structure (vocabulary, hidden size, tied embeddings, family
details such as biases and QK-norm) plus one :class:`LayerSpec` per layer, so every layer may keep
its own heads and FFN width, or drop attention or the FFN altogether (DeciLM ``no_op`` blocks).

Its parameter count is exact: for a config that transformers can build it equals
``sum(p.numel() for p in model.parameters())`` (tested per family).

Builders: :meth:`Architecture.from_hf_config` (a transformers config object or dict),
:func:`load_architecture` (a known name, a ``config.json``, a Hugging Face directory, a GGUF file,
or an architecture JSON/YAML written by :meth:`Architecture.save`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError, UnknownNameError, suggest

__all__ = [
    "Architecture",
    "LayerSpec",
    "SUPPORTED_FAMILIES",
    "known_architectures",
    "load_architecture",
]

# model_type in a Hugging Face config → the flags that change the parameter count.
# Sources: transformers modeling_{llama,mistral,qwen2,qwen3}.py (v5.x):
#   llama/qwen3: q,k,v,o biases iff config.attention_bias; llama: gate/up/down biases iff mlp_bias;
#   mistral: no biases; qwen2: q,k,v biased, o not; qwen3: RMSNorm(head_dim) on q and k.
_FAMILY_FLAGS: dict[str, dict[str, Any]] = {
    "llama": {"qk_norm": False},
    "mistral": {"qk_norm": False},
    "qwen2": {"qk_norm": False},
    "qwen3": {"qk_norm": True},
}
SUPPORTED_FAMILIES: tuple[str, ...] = tuple(_FAMILY_FLAGS)


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer. A dropped sub-block has ``attention=False`` / ``ffn=False`` and zero size.

    Attributes:
        attention: whether the layer has self-attention (False = DeciLM attention ``no_op``).
        num_heads: query heads.
        num_kv_heads: key/value heads; must divide ``num_heads`` (grouped-query attention).
        head_dim: channels per head.
        ffn: whether the layer has a (gated) MLP.
        ffn_width: MLP intermediate size.
    """

    attention: bool = True
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    ffn: bool = True
    ffn_width: int = 0

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_kv_heads", "head_dim", "ffn_width"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"LayerSpec.{name} must be a non-negative int, got {value!r}")
        if self.attention:
            if self.num_heads < 1 or self.num_kv_heads < 1 or self.head_dim < 1:
                raise ConfigError(
                    "a layer with attention needs num_heads, num_kv_heads and head_dim >= 1, got "
                    f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
                )
            if self.num_heads % self.num_kv_heads:
                raise ConfigError(
                    f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
                )
        if self.ffn and self.ffn_width < 1:
            raise ConfigError(f"a layer with an FFN needs ffn_width >= 1, got {self.ffn_width}")

    @property
    def is_noop(self) -> bool:
        """True when the layer is dropped entirely (no attention and no FFN)."""
        return not self.attention and not self.ffn

    @classmethod
    def dropped(cls) -> LayerSpec:
        return cls(attention=False, ffn=False)


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
        qk_norm: per-head RMSNorm on queries and keys (Qwen3).
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
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Architecture.{name} must be a positive int, got {value!r}")
        if not self.layers:
            raise ConfigError("Architecture.layers is empty: a decoder needs at least one layer")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LayerSpec):
                raise ConfigError(f"Architecture.layers[{i}] must be a LayerSpec, got {type(layer).__name__}")
        if self.family not in _FAMILY_FLAGS:
            raise ConfigError(
                f"Architecture.family {self.family!r} is not supported{suggest(self.family, SUPPORTED_FAMILIES)}; "
                f"supported: {', '.join(SUPPORTED_FAMILIES)}"
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
        """True when every layer is identical and present: a plain HF config can describe it."""
        first = self.layers[0]
        return first.attention and first.ffn and all(layer == first for layer in self.layers)

    def active(self) -> Architecture:
        """The same model with fully dropped layers removed from the stack."""
        return replace(self, layers=tuple(layer for layer in self.layers if not layer.is_noop))

    # ------------------------------------------------------------------ counting
    def layer_params(self, i: int) -> int:
        """Exact parameter count of layer ``i`` (norms and biases included)."""
        layer, d_model = self.layers[i], self.hidden_size
        total = 0
        if layer.attention:
            q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
            total += d_model  # input_layernorm
            total += d_model * (q + 2 * kv) + q * d_model  # q, k, v, o projections
            total += (q + 2 * kv) if self.qkv_bias else 0
            total += d_model if self.o_bias else 0
            total += 2 * layer.head_dim if self.qk_norm else 0
        if layer.ffn:
            total += d_model  # post_attention_layernorm
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
        """Exact total: equals ``sum(p.numel() for p in model.parameters())`` of the built model."""
        return self.non_embedding_params + self.embedding_params

    def kv_elements_per_token(self) -> int:
        """K and V elements cached per token across all attention layers: ``2·Σ_i g_i·d_i``."""
        return 2 * sum(layer.num_kv_heads * layer.head_dim for layer in self.layers if layer.attention)

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """KV-cache bytes per token at ``bytes_per_element`` (2 for a bf16 cache)."""
        return self.kv_elements_per_token() * bytes_per_element

    # ------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        data["layers"] = [asdict(layer) for layer in self.layers]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Architecture:
        """Inverse of :meth:`to_dict`; unknown keys are rejected with a suggestion."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"an architecture must be a mapping, got {type(data).__name__}")
        fields = {f for f in cls.__dataclass_fields__ if not f.startswith("_")}
        _reject_unknown(data, fields, "Architecture")
        if "layers" not in data or not isinstance(data["layers"], Sequence):
            raise ConfigError("Architecture needs 'layers': a list of per-layer mappings")
        layer_fields = set(LayerSpec.__dataclass_fields__)
        layers = []
        for i, raw in enumerate(data["layers"]):
            if not isinstance(raw, Mapping):
                raise ConfigError(f"Architecture.layers[{i}] must be a mapping, got {raw!r}")
            _reject_unknown(raw, layer_fields, f"Architecture.layers[{i}]")
            layers.append(LayerSpec(**raw))
        return cls(**{**data, "layers": tuple(layers)})

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Architecture:
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> Architecture:
        import yaml

        return cls.from_dict(yaml.safe_load(text))

    def save(self, path: str | Path) -> Path:
        """Write JSON (``.json``) or YAML (``.yaml``/``.yml``)."""
        path = Path(path)
        text = self.to_yaml() if path.suffix in (".yaml", ".yml") else self.to_json()
        path.write_text(text)
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
        """Every layer identical, like a plain Hugging Face config."""
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

        Supports ``model_type`` llama (SmolLM2 is llama), mistral, qwen2 and qwen3. A config that
        is not a decoder LLM of these families raises :class:`ConfigError` naming its model_type.
        """
        cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
        model_type = str(cfg.get("model_type", "")).lower()
        if model_type not in _FAMILY_FLAGS:
            raise ConfigError(
                f"model_type {model_type or '(missing)'!r} is not a supported decoder LLM"
                f"{suggest(model_type, SUPPORTED_FAMILIES)}; supported: {', '.join(SUPPORTED_FAMILIES)}"
            )
        required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        missing = [k for k in required if cfg.get(k) is None]
        if missing:
            raise ConfigError(f"{model_type} config is missing {', '.join(missing)}")
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = cfg.get("head_dim") or int(cfg["hidden_size"]) // heads
        bias = bool(cfg.get("attention_bias", False))
        flags = {
            "llama": dict(qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.get("mlp_bias", False))),
            "mistral": dict(),
            "qwen2": dict(qkv_bias=True),
            "qwen3": dict(qkv_bias=bias, o_bias=bias),
        }[model_type]
        return cls.uniform(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(head_dim),
            ffn_width=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            family=model_type,
            max_context=cfg.get("max_position_embeddings"),
            name=name or str(cfg.get("_name_or_path", "") or ""),
            **flags,
            **_FAMILY_FLAGS[model_type],
        )

    def to_hf_config(self) -> Any:
        """A transformers config for a *uniform* architecture (raises for a heterogeneous one)."""
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
        )
        if self.max_context:
            kwargs["max_position_embeddings"] = self.max_context
        if self.family in ("llama", "qwen3"):
            kwargs["attention_bias"] = self.qkv_bias
        if self.family == "llama":
            kwargs["mlp_bias"] = self.mlp_bias
        return AutoConfig.for_model(self.family, **kwargs)

    # --------------------------------------------------------------- reporting
    def summary(self) -> str:
        """One line: depth, width, heads, FFN and parameter count."""
        active = [layer for layer in self.layers if not layer.is_noop]
        heads = sorted({layer.num_heads for layer in active if layer.attention})
        ffn = sorted({layer.ffn_width for layer in active if layer.ffn})
        span = lambda v: "-" if not v else (str(v[0]) if len(v) == 1 else f"{v[0]}..{v[-1]}")  # noqa: E731
        return (
            f"{self.name or self.family}: {len(active)}/{self.num_layers} layers, hidden {self.hidden_size}, "
            f"heads {span(heads)}, ffn {span(ffn)}, {self.num_params / 1e6:.1f}M params"
        )


def _reject_unknown(data: Mapping[str, Any], valid: set[str], where: str) -> None:
    for key in data:
        if key not in valid:
            raise ConfigError(f"unknown key {key!r} in {where}{suggest(str(key), valid)}; valid keys: {', '.join(sorted(valid))}")


# ------------------------------------------------------------------ known names
_KNOWN_FILE = Path(__file__).parent / "data" / "known_models.json"


def known_architectures() -> dict[str, Architecture]:
    """Architecture numbers (no weights) for well-known models, keyed by short name."""
    raw = json.loads(_KNOWN_FILE.read_text())
    return {name: Architecture.from_hf_config(cfg, name=name) for name, cfg in raw["models"].items()}


def load_architecture(model: str | Path) -> Architecture:
    """Resolve a model reference to an :class:`Architecture`.

    ``model`` may be a known name (``smollm2-135m``), a Hugging Face directory or ``config.json``,
    a ``.gguf`` file (metadata only, no weights are read), or an architecture ``.json``/``.yaml``
    written by :meth:`Architecture.save`.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if config.is_file():
            return _from_json_file(config)
        ggufs = sorted(path.glob("*.gguf"))
        if ggufs:
            return architecture_from_gguf(ggufs[0])
        raise ConfigError(f"directory {text!r} has neither config.json nor a .gguf file")
    if path.is_file():
        if path.suffix == ".gguf":
            return architecture_from_gguf(path)
        if path.suffix in (".yaml", ".yml"):
            return Architecture.from_yaml(path.read_text())
        return _from_json_file(path)
    known = known_architectures()
    if text.lower() in known:
        return known[text.lower()]
    raise UnknownNameError("model", text, list(known) + ["<HF directory>", "<config.json>", "<file.gguf>"])


def _from_json_file(path: Path) -> Architecture:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, Mapping) and "layers" in data and "model_type" not in data:
        return Architecture.from_dict(data)
    return Architecture.from_hf_config(data, name=path.parent.name if path.name == "config.json" else path.stem)


# GGUF metadata → HF config keys. Source: llama.cpp gguf-py constants (LLM_KV_*), e.g.
# "{arch}.block_count", "{arch}.attention.head_count_kv". GGUF arch names map to HF model types.
_GGUF_ARCH_TO_FAMILY = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def architecture_from_gguf(path: str | Path) -> Architecture:
    """Read a GGUF file's metadata (not its weights) into an :class:`Architecture`."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")

    def value(key: str) -> Any:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    arch = str(value("general.architecture"))
    if arch not in _GGUF_ARCH_TO_FAMILY:
        raise ConfigError(
            f"GGUF architecture {arch!r} in {path} is not supported; supported: {', '.join(_GGUF_ARCH_TO_FAMILY)}"
        )
    tensor_names = {t.name for t in reader.tensors}
    vocab = value(f"{arch}.vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else None
    if vocab is None:
        embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
        vocab = int(embd.shape[-1])
    hidden = int(value(f"{arch}.embedding_length"))
    heads = int(value(f"{arch}.attention.head_count"))
    head_dim = value(f"{arch}.attention.key_length") or hidden // heads
    cfg = {
        "model_type": _GGUF_ARCH_TO_FAMILY[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "num_hidden_layers": int(value(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(value(f"{arch}.attention.head_count_kv") or heads),
        "head_dim": int(head_dim),
        "intermediate_size": int(value(f"{arch}.feed_forward_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "max_position_embeddings": value(f"{arch}.context_length"),
        "attention_bias": "blk.0.attn_output.bias" in tensor_names,
    }
    return Architecture.from_hf_config(cfg, name=str(value("general.name") or Path(path).stem))
