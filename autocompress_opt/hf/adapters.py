"""Model-family adapters: where a transformers decoder keeps its embedding, layers, heads and FFN.

One :class:`FamilyAdapter` per model family, held in :data:`ADAPTERS` (a
:class:`~autocompress_opt.registry.Registry`) under the name its family's registry entry gives
(:attr:`autocompress_opt.arch.families.Family.adapter`); the package's own heterogeneous class has
one more. An adapter is data, not code: the attribute names
of each module (every supported family uses transformers' Llama names for the projections,
``model.layers[i].self_attn.q_proj`` ...; Gemma 3 names its norms differently and has two more per
layer), and the family traits that the module tree does not show (how an RMSNorm applies its
weight, whether the embedding is scaled). The package's own heterogeneous model uses the names
of its base family, so its state dict has the parent's keys. Importance estimation, masking and
materialisation only ever reach into a model through :meth:`FamilyAdapter.layer_parts` and
friends, so supporting a new family is one family entry plus one adapter, never a fork of the model code
(docs/adding-a-family.md).

Norms (``D`` = hidden size): ``input_norm`` before attention and ``ffn_norm`` before the MLP (Llama:
``input_layernorm`` / ``post_attention_layernorm``). Gemma 3 also normalises each sub-block's
output before adding it to the residual stream (``attn_out_norm`` = its
``post_attention_layernorm``, ``ffn_out_norm`` = ``post_feedforward_layernorm``), so there a
sub-block's *residual contribution* is that norm's output, not ``o_proj``'s / ``down_proj``'s
(:attr:`LayerParts.attn_residual`); a gate that scales ``o_proj``'s output would be undone by
the scale-invariant norm after it.

Head layout (every family): query head ``h`` occupies rows ``h·d:(h+1)·d`` of ``q_proj`` and
columns ``h·d:(h+1)·d`` of ``o_proj``; it reads KV head ``h // (num_heads // num_kv_heads)``
(transformers' ``repeat_kv``), so KV group ``g`` is query heads ``g·r .. g·r + r - 1``.

Importing this module does not import torch or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec, hf_layer_windows
from autocompress_opt.arch.block_configs import MODEL_TYPE as HETERO_MODEL_TYPE  # its adapter's name too
from autocompress_opt.arch.families import Family, family, family_for_model_type, family_names
from autocompress_opt.arch.moe import MambaSpec, MoESpec
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.registry import Registry

__all__ = [
    "ADAPTERS",
    "GEMMA3_PATHS",
    "MOE_ADAPTERS",
    "NEMOTRON_H_PATHS",
    "FamilyAdapter",
    "LayerParts",
    "ModulePaths",
    "adapter_for",
    "architecture_mismatch",
    "bypass_layer",
    "family_adapter",
    "layer_input",
    "layer_output",
    "model_type_of",
    "moe_adapter",
]


@dataclass(frozen=True)
class ModulePaths:
    """Attribute names, relative to their parent module, of every piece an adapter exposes."""

    decoder: str = "model"
    embedding: str = "embed_tokens"
    layers: str = "layers"
    final_norm: str = "norm"
    lm_head: str = "lm_head"
    attention: str = "self_attn"
    q_proj: str = "q_proj"
    k_proj: str = "k_proj"
    v_proj: str = "v_proj"
    o_proj: str = "o_proj"
    q_norm: str = "q_norm"
    k_norm: str = "k_norm"
    mlp: str = "mlp"
    gate_proj: str | None = "gate_proj"  # None: MLPs and experts are ungated, down(act(up(x)))
    up_proj: str = "up_proj"
    down_proj: str = "down_proj"
    input_norm: str = "input_layernorm"  # before attention
    ffn_norm: str = "post_attention_layernorm"  # before the MLP (Llama's name)
    attn_out_norm: str | None = None  # on the attention output, before the residual add (Gemma 3)
    ffn_out_norm: str | None = None  # on the MLP output, before the residual add (Gemma 3)
    # A sparse MoE block in place of the MLP (transformers 5 Qwen3-MoE / Mixtral names): its router, its
    # experts module and the experts' stacked weights, gate_up (E, 2F, D: gate rows, then up rows), down (E, D, F).
    router: str = "gate"
    experts: str = "experts"
    expert_gate_up: str = "gate_up_proj"
    expert_down: str = "down_proj"
    # Hybrid blocks (Nemotron-H): every layer holds one pre-norm and one mixer, whose role the layer's
    # ``block_kind`` attribute names (``mixer_roles`` maps it to attention / mamba / mlp / moe).
    mixer: str | None = None  # None: layers hold an attention and an MLP (every other family)
    block_kind: str = "block_type"
    block_norm: str = "norm"
    mixer_roles: tuple[tuple[str, str], ...] = ()
    # A MoE block's shared expert (an MLP every token runs) and the latent projections around the
    # routed experts (``nn.Identity`` when the block has none); None: the family has no such module.
    shared_expert: str | None = None
    latent_in: str | None = None
    latent_out: str | None = None


# Nemotron-H (transformers' NemotronHBlock): ``norm`` then one ``mixer``; relu² MLPs and experts, ungated
# (experts' ``up_proj`` (E, F, L), ``down_proj`` (E, L, F)); a MoE has a shared expert and optional latent
# projections. Source: transformers 5.24 modeling_nemotron_h.py (MIXER_TYPES).
NEMOTRON_H_PATHS = ModulePaths(
    embedding="embeddings",
    final_norm="norm_f",
    gate_proj=None,
    expert_gate_up="up_proj",
    mixer="mixer",
    mixer_roles=(("full_attention", "attention"), ("linear_attention", "mamba"), ("mlp", "mlp"), ("moe", "moe")),
    shared_expert="shared_experts",
    latent_in="fc1_latent_proj",
    latent_out="fc2_latent_proj",
)

# Gemma 3 (transformers' Gemma3DecoderLayer): four RMSNorms, two of them on the sub-block outputs.
GEMMA3_PATHS = ModulePaths(
    ffn_norm="pre_feedforward_layernorm",
    attn_out_norm="post_attention_layernorm",
    ffn_out_norm="post_feedforward_layernorm",
)


@dataclass(frozen=True)
class LayerParts:
    """The modules of one decoder layer; the attention fields are None when it has no attention,
    the MLP fields None when it has no dense FFN; ``attn_out_norm`` / ``ffn_out_norm`` are None in
    families without post-norms. A layer whose FFN is a mixture of experts has ``moe`` (the sparse
    block), ``router`` and ``experts`` (the module holding the stacked expert weights) and its
    ``ffn_norm``, and no ``mlp`` / projections.

    Shapes (``nn.Linear.weight`` is ``(out, in)``): ``q_proj`` ``(H·d, D)``, ``k_proj``/``v_proj``
    ``(G·d, D)``, ``o_proj`` ``(D, H·d)``, ``gate_proj``/``up_proj`` ``(F, D)``, ``down_proj``
    ``(D, F)``, norms ``(D,)``, ``q_norm``/``k_norm`` ``(d,)``; MoE: ``router.weight`` ``(E, D)``,
    ``expert_gate_up`` ``(E, 2F, D)`` (gate rows ``0..F-1``, up rows ``F..2F-1``), ``expert_down`` ``(E, D, F)``.
    Ungated families (``gated`` false, Nemotron-H): ``gate_proj`` is None and ``expert_gate_up`` holds the up
    rows only, ``(E, F, L)``; ``L`` is the latent width when ``latent_in`` ``(L, D)`` / ``latent_out``
    ``(D, L)`` wrap the experts (else ``D``; the modules are then ``nn.Identity``), and ``shared_expert``
    is the MLP every token of the MoE block runs (``up_proj`` ``(S, D)``, ``down_proj`` ``(D, S)``).

    A hybrid layer (Nemotron-H) holds one mixer: ``mamba`` (a Mamba-2 mixer, with ``input_norm`` its
    pre-norm; ``in_proj`` ``(I + C + H, D)``, ``out_proj`` ``(D, I)``, :class:`~autocompress_opt.arch.moe.MambaSpec`),
    or an attention, an MLP or a MoE as above.
    """

    layer: Any
    attention: Any = None
    q_proj: Any = None
    k_proj: Any = None
    v_proj: Any = None
    o_proj: Any = None
    q_norm: Any = None
    k_norm: Any = None
    input_norm: Any = None
    attn_out_norm: Any = None
    mlp: Any = None
    gate_proj: Any = None
    up_proj: Any = None
    down_proj: Any = None
    ffn_norm: Any = None
    ffn_out_norm: Any = None
    head_dim: int = 0
    moe: Any = None
    router: Any = None
    experts: Any = None
    expert_gate_up: Any = None
    expert_down: Any = None
    gated: bool = True
    shared_expert: Any = None
    latent_in: Any = None
    latent_out: Any = None
    mamba: Any = None

    @property
    def attn_residual(self) -> Any:
        """The module whose output ``(batch, time, D)`` the attention adds to the residual stream
        (``attn_out_norm`` where the family has one, else ``o_proj``); None without attention."""
        return self.attn_out_norm if self.attn_out_norm is not None else self.o_proj

    @property
    def ffn_residual(self) -> Any:
        """The module whose output the MLP adds to the residual stream (``ffn_out_norm`` or ``down_proj``)."""
        return self.ffn_out_norm if self.ffn_out_norm is not None else self.down_proj

    @property
    def hidden_norms(self) -> list[Any]:
        """This layer's RMSNorms over the hidden size D, in forward order."""
        norms = (self.input_norm, self.attn_out_norm, self.ffn_norm, self.ffn_out_norm)
        return [n for n in norms if n is not None]

    @property
    def num_heads(self) -> int:
        """Query heads H (0 without attention)."""
        return self.q_proj.out_features // self.head_dim if self.attention is not None else 0

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads G (0 without attention)."""
        return self.k_proj.out_features // self.head_dim if self.attention is not None else 0

    @property
    def group_size(self) -> int:
        """Query heads per KV head, ``H // G`` (0 without attention)."""
        return self.num_heads // self.num_kv_heads if self.attention is not None else 0

    @property
    def ffn_width(self) -> int:
        """FFN channels F (0 without an FFN)."""
        return self.down_proj.in_features if self.mlp is not None else 0

    @property
    def num_experts(self) -> int:
        """Routed experts E (0 without a MoE)."""
        return int(self.expert_down.shape[0]) if self.moe is not None else 0

    @property
    def expert_width(self) -> int:
        """Each routed expert's intermediate channels F (0 without a MoE)."""
        return int(self.expert_down.shape[-1]) if self.moe is not None else 0

    def moe_spec(self) -> MoESpec | None:
        """This layer's :class:`MoESpec`, read from the module shapes and the router's ``top_k``."""
        if self.moe is None:
            return None
        return MoESpec(
            num_experts=self.num_experts,
            experts_per_token=int(self.router.top_k),
            expert_width=self.expert_width,
            shared_width=self.shared_width,
            latent_width=int(getattr(self.latent_in, "out_features", 0)),  # nn.Identity: no latent
            gated=self.gated,
            router_bias=getattr(self.router, "bias", None) is not None,
        )

    @property
    def shared_width(self) -> int:
        """The shared expert's intermediate channels S (0 without one)."""
        return int(self.shared_expert.down_proj.in_features) if self.shared_expert is not None else 0

    def mamba_spec(self) -> MambaSpec | None:
        """This layer's :class:`MambaSpec`, read from the mixer (transformers' ``NemotronHMamba2Mixer``)."""
        m = self.mamba
        if m is None:
            return None
        return MambaSpec(
            num_heads=int(m.num_heads),
            head_dim=int(m.head_dim),
            state_size=int(m.ssm_state_size),
            groups=int(m.n_groups),
            conv_width=int(m.conv_kernel_size),
            conv_bias=m.conv1d.bias is not None,
            proj_bias=m.in_proj.bias is not None,
        )

    def spec(self, window: int | None = None) -> LayerSpec:
        """This layer's :class:`LayerSpec`, read from the module shapes; ``window`` (from the config:
        modules do not show it) applies when the layer has attention."""
        attn = self.attention is not None
        return LayerSpec(
            attention=attn,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim if attn else 0,
            ffn=self.mlp is not None,
            ffn_width=self.ffn_width,
            window=window,
            moe=self.moe_spec(),
            mamba=self.mamba_spec(),
        )


@dataclass(frozen=True)
class FamilyAdapter:
    """Where one model family keeps its pieces, and the traits its modules do not show.

    Attributes:
        name: its registry name (its family entry's ``adapter``; the built-ins use the family's name).
        description: one line for listings.
        paths: attribute names of the modules.
        norm_offset: an RMSNorm multiplies by ``norm_offset + weight`` (Gemma: 1, weights stored
            around 0; Llama: 0). Source: transformers' ``Gemma3RMSNorm``, which also applies the
            weight in float32 before casting back.
        embed_scale: the embedding's output is multiplied by ``sqrt(config.hidden_size)`` (Gemma's
            ``Gemma3TextScaledWordEmbedding``); the factor follows the model's *own* hidden size.
        heterogeneous: layers may lack attention or FFN and differ in shape (the package's own
            ``autocompress_decilm``); the base family is then read from ``config.base_family``, and
            module names and traits are the base family's (:meth:`base`).
        router_scoring: how a MoE router turns logits into top-``k`` weights (replayed on masked logits,
            :mod:`autocompress_opt.prune.masking`): ``"softmax"`` — softmax, top-``k``, renormalised iff
            ``norm_topk_prob`` (Qwen3-MoE); ``"sigmoid"`` — sigmoid scores, top-``k`` of score + correction
            bias, renormalised, scaled (Nemotron-H's ``NemotronHTopkRouter``).
    """

    name: str
    description: str
    paths: ModulePaths = field(default_factory=ModulePaths)
    norm_offset: float = 0.0
    embed_scale: bool = False
    heterogeneous: bool = False
    router_scoring: str = "softmax"

    def base(self, model_or_config: Any) -> FamilyAdapter:
        """The adapter whose module names and numerics the model uses: the base family's for a
        heterogeneous model, else this one."""
        if not self.heterogeneous:
            return self
        config = getattr(model_or_config, "config", model_or_config)
        return family_adapter(str(config.base_family))

    # ----------------------------------------------------------------- model-level pieces
    def decoder(self, model: Any) -> Any:
        """The base model holding embedding, layers and final norm (``model.model``)."""
        return getattr(model, self.paths.decoder)

    def embedding(self, model: Any) -> Any:
        """Token embedding, an ``nn.Embedding`` with weight ``(V, D)``."""
        return getattr(self.decoder(model), self.paths.embedding)

    def layers(self, model: Any) -> Any:
        """The ``nn.ModuleList`` of decoder layers."""
        return getattr(self.decoder(model), self.paths.layers)

    def final_norm(self, model: Any) -> Any:
        """RMSNorm applied before the LM head, weight ``(D,)``."""
        return getattr(self.decoder(model), self.paths.final_norm)

    def lm_head(self, model: Any) -> Any:
        """Output projection, ``nn.Linear`` with weight ``(V, D)`` (shared with the embedding when tied)."""
        return getattr(model, self.paths.lm_head)

    def tied(self, model: Any) -> bool:
        """True when the LM head and the embedding share one matrix."""
        return self.lm_head(model).weight is self.embedding(model).weight

    def family(self, model: Any) -> str:
        """The architecture family (``llama``, ``qwen3``...); the base family for a heterogeneous model."""
        if self.heterogeneous:
            return str(model.config.base_family)
        fam = family_for_model_type(model_type_of(model))
        return fam.name if fam is not None else self.name

    # ----------------------------------------------------------------- layer-level pieces
    def layer_parts(self, model: Any, index: int) -> LayerParts:
        """The modules of layer ``index``; raises :class:`ConfigError` for a layer out of range."""
        layers = self.layers(model)
        if not 0 <= index < len(layers):
            raise ConfigError(f"layer index {index} out of range: the model has {len(layers)} layers")
        return self._parts(model, layers[index])

    def all_layer_parts(self, model: Any) -> list[LayerParts]:
        """:meth:`layer_parts` of every layer, in order."""
        return [self._parts(model, layer) for layer in self.layers(model)]

    def _parts(self, model: Any, layer: Any) -> LayerParts:
        p = self.base(model).paths
        if p.mixer is not None:
            return self._mixer_parts(model, layer, p)
        attn, mlp = getattr(layer, p.attention, None), getattr(layer, p.mlp, None)
        if not self.heterogeneous and (attn is None or mlp is None):
            raise ConfigError(f"a {self.name} layer lacks {p.attention!r} or {p.mlp!r}: is this a {self.name} model?")
        optional = lambda module, name: None if name is None else getattr(module, name)
        parts: dict[str, Any] = {"layer": layer}
        if attn is not None:
            parts.update(
                _attention_parts(model, attn, p),
                input_norm=getattr(layer, p.input_norm),
                attn_out_norm=optional(layer, p.attn_out_norm),
            )
        if mlp is not None and hasattr(mlp, p.experts):  # a sparse MoE block (only the experts path's adapters)
            parts.update(_moe_parts(mlp, p), ffn_norm=getattr(layer, p.ffn_norm))
        elif mlp is not None:
            parts.update(_mlp_parts(mlp, p), ffn_norm=getattr(layer, p.ffn_norm))
            parts.update(ffn_out_norm=optional(layer, p.ffn_out_norm))
        return LayerParts(**parts)

    def _mixer_parts(self, model: Any, layer: Any, p: ModulePaths) -> LayerParts:
        """A hybrid layer: its one mixer in the role its kind names, its pre-norm before it."""
        assert p.mixer is not None  # the caller's branch
        kind = getattr(layer, p.block_kind, None)
        role = dict(p.mixer_roles).get(str(kind))
        if role is None:
            valid = ", ".join(k for k, _ in p.mixer_roles)
            raise ConfigError(f"a {self.name} layer has {p.block_kind}={kind!r}; valid: {valid}")
        mixer, norm = getattr(layer, p.mixer), getattr(layer, p.block_norm)
        if role == "attention":
            return LayerParts(layer=layer, **_attention_parts(model, mixer, p), input_norm=norm)
        if role == "mamba":
            return LayerParts(layer=layer, mamba=mixer, input_norm=norm)
        if role == "mlp":
            return LayerParts(layer=layer, **_mlp_parts(mixer, p), ffn_norm=norm)
        return LayerParts(layer=layer, **_moe_parts(mixer, p), ffn_norm=norm)

    def hidden_norms(self, model: Any) -> list[Any]:
        """Every RMSNorm over the hidden size D: each layer's (pre- and post-) norms, then the final norm."""
        norms = []
        for parts in self.all_layer_parts(model):
            norms += parts.hidden_norms
        return norms + [self.final_norm(model)]

    # ----------------------------------------------------------------------- structure
    def architecture(self, model: Any) -> Architecture:
        """The exact :class:`Architecture` of ``model``, read from its module shapes (each layer's
        attention window from its config: :meth:`windows`).

        ``num_params`` of the result equals ``sum(p.numel() for p in model.parameters())``.
        """
        parts = self.all_layer_parts(model)
        config = model.config
        return Architecture(
            vocab_size=self.embedding(model).num_embeddings,
            hidden_size=self.embedding(model).embedding_dim,
            layers=tuple(p.spec(w) for p, w in zip(parts, self.windows(model), strict=True)),
            tie_embeddings=self.tied(model),
            family=self.family(model),
            max_context=getattr(config, "max_position_embeddings", None),
            name=str(getattr(config, "_name_or_path", "") or ""),
            **self._flags(model, parts),
        )

    def windows(self, model: Any) -> tuple[int | None, ...]:
        """Each layer's attention window (None = full attention), as the model applies it: the
        blocks' ``window_length`` of a heterogeneous model, else the family's config rule
        (:func:`~autocompress_opt.arch.architecture.hf_layer_windows`)."""
        if self.heterogeneous:
            return tuple(b.attention.window_length for b in model.config.blocks)
        return hf_layer_windows(model.config)

    def _flags(self, model: Any, parts: list[LayerParts]) -> dict[str, bool]:
        """Bias and QK-norm flags: from the config of a heterogeneous model (a model without any
        attention layer still has them), else from the modules."""
        if self.heterogeneous:
            c = model.config
            return dict(
                qkv_bias=bool(c.attention_bias),
                o_bias=bool(c.o_proj_bias),
                mlp_bias=bool(c.mlp_bias),
                qk_norm=bool(c.qk_norm),
            )
        attn = [p for p in parts if p.attention is not None]  # a hybrid's Mamba / MLP / MoE layers have none
        biased = lambda module: getattr(module, "bias", None) is not None  # nn.Identity latents: no bias
        shared = lambda p: p.shared_expert.down_proj if p.shared_expert is not None else None
        return dict(
            qkv_bias=any(p.q_proj.bias is not None for p in attn),
            o_bias=any(p.o_proj.bias is not None for p in attn),
            mlp_bias=any(biased(p.down_proj) or biased(shared(p)) or biased(p.latent_in) for p in parts),
            qk_norm=any(p.q_norm is not None for p in attn),
        )


def _attention_parts(model: Any, attn: Any, p: ModulePaths) -> dict[str, Any]:
    head_dim = int(getattr(attn, "head_dim", 0) or model.config.head_dim)
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
    return dict(attention=attn, head_dim=head_dim, **{k: getattr(attn, getattr(p, k), None) for k in names})


def _mlp_parts(mlp: Any, p: ModulePaths) -> dict[str, Any]:
    gate = None if p.gate_proj is None else getattr(mlp, p.gate_proj)
    return dict(mlp=mlp, gate_proj=gate, up_proj=getattr(mlp, p.up_proj), down_proj=getattr(mlp, p.down_proj))


def _moe_parts(moe: Any, p: ModulePaths) -> dict[str, Any]:
    experts = getattr(moe, p.experts)
    optional = lambda name: None if name is None else getattr(moe, name)
    return dict(
        moe=moe,
        router=getattr(moe, p.router),
        experts=experts,
        expert_gate_up=getattr(experts, p.expert_gate_up),
        expert_down=getattr(experts, p.expert_down),
        gated=p.gate_proj is not None,
        shared_expert=optional(p.shared_expert),
        latent_in=optional(p.latent_in),
        latent_out=optional(p.latent_out),
    )


# One adapter per family entry (arch/families.py names it), plus the package's own heterogeneous class.
# qk_norm, post-norms and the rest of a family's facts are its family entry's, not repeated here.
ADAPTERS: Registry[FamilyAdapter] = Registry("decoder model family")
for _adapter in (
    FamilyAdapter("llama", "Llama 2/3, SmolLM2, CodeLlama (optional attention/MLP biases)"),
    FamilyAdapter("mistral", "Mistral (no biases; model-wide sliding window)"),
    FamilyAdapter("qwen2", "Qwen2 / Qwen2.5 (q, k, v biases)"),
    FamilyAdapter("qwen3", "Qwen3 (per-head q/k RMSNorm)"),
    FamilyAdapter(
        "gemma3_text",
        "Gemma 3 text decoder (q/k norm, post-norms, (1+w) RMSNorm, scaled embedding)",
        paths=GEMMA3_PATHS,
        norm_offset=1.0,
        embed_scale=True,
    ),
    FamilyAdapter(HETERO_MODEL_TYPE, "this package's heterogeneous DeciLM-style decoder", heterogeneous=True),
):
    ADAPTERS.register(_adapter.name, _adapter)


# The experts path (issue 30): adapters of the MoE / hybrid families whose routed experts (and Mamba-2 heads)
# are scored (prune/importance.py), masked (prune/masking.py), sliced and exported (prune/experts.py,
# prune/mamba.py), searched by the expert inner search (search/inner/experts.py) and run in weights-mode
# studies (search/study/weights_trial.py). Deliberately neither in ADAPTERS nor named by
# the family entry: the family stays architecture-only for every dense weights path (plan_pruning,
# materialize, export_model, the dense inner search), which cannot prune it yet.
MOE_ADAPTERS: dict[str, FamilyAdapter] = {
    "qwen3_moe": FamilyAdapter("qwen3_moe", "Qwen3-MoE (stacked experts, softmax-then-top-k router, q/k norm)"),
    # Mixtral (transformers 5.25 MixtralSparseMoeBlock): Qwen3-MoE's modules without q/k norm; its router
    # always renormalises the top-k (no norm_topk_prob attribute: renormalises_top_k).
    "mixtral": FamilyAdapter("mixtral", "Mixtral (stacked SwiGLU experts, softmax top-k router, renormalised)"),
    "nemotron_h": FamilyAdapter(
        "nemotron_h",
        "Nemotron-H (one mixer per layer: Mamba-2, attention, relu² MLP or latent MoE; sigmoid router)",
        paths=NEMOTRON_H_PATHS,
        router_scoring="sigmoid",
    ),
}


def moe_adapter(model_or_config: Any) -> FamilyAdapter:
    """The experts path's adapter for a MoE model (or config), by ``config.model_type``; raises
    :class:`ConfigError` naming the model_type and the families the experts path handles."""
    model_type = model_type_of(model_or_config)
    # By family: Nemotron-H's per-layer ("Puzzle") form, model_type nemotron_h_puzzle (hf/puzzle.py), has the
    # same modules, each MoE layer of its own expert width and router top_k, which LayerParts reads from them.
    fam = family_for_model_type(model_type)
    name = fam.name if fam is not None and fam.name in MOE_ADAPTERS else model_type
    if name not in MOE_ADAPTERS:
        raise ConfigError(
            f"expert pruning does not handle model_type {model_type or '(none)'!r} yet; "
            f"it handles: {', '.join(MOE_ADAPTERS)} (issue 30)"
        )
    return MOE_ADAPTERS[name]


def family_adapter(name: str) -> FamilyAdapter:
    """The adapter of the family called ``name`` (its entry's ``adapter``); :class:`UnknownNameError`
    for a name of no family, or when the entry names an adapter nobody registered;
    :class:`ConfigError` for an architecture-only family (no adapter yet)."""
    return _adapter_of(family(name))


def _adapter_of(fam: Family) -> FamilyAdapter:
    if fam.adapter is None:
        raise ConfigError(
            f"the {fam.name!r} family is architecture-only: its MoE / Mamba-2 layers are described and "
            "counted but not yet loaded, scored, pruned or exported: issue 30; families with weights "
            f"support: {', '.join(n for n in family_names() if not family(n).architecture_only)}"
        )
    return ADAPTERS.get(fam.adapter)


def renormalises_top_k(router: Any) -> bool:
    """Whether a softmax router renormalises the weights of its top-``k`` experts to sum to one:
    Qwen3-MoE's ``norm_topk_prob``; a router without that switch (Mixtral's) always does."""
    return bool(getattr(router, "norm_topk_prob", True))


def model_type_of(model_or_config: Any) -> str:
    """``config.model_type`` of a model or config (lower case), or ``""`` when it has none."""
    config = getattr(model_or_config, "config", model_or_config)
    return str(getattr(config, "model_type", "") or "").lower()


def adapter_for(model_or_config: Any) -> FamilyAdapter:
    """The adapter for a transformers model (or its config), chosen by ``config.model_type``: its
    family's adapter, or the heterogeneous one for the package's own class.

    Raises :class:`UnknownNameError` naming the model_type and listing the supported families
    (e.g. ``gpt2`` is not a supported decoder), :class:`ConfigError` for an architecture-only
    family (``mixtral``: no adapter yet, issue 30).
    """
    model_type = model_type_of(model_or_config)
    fam = family_for_model_type(model_type)
    if fam is not None:
        return _adapter_of(fam)
    if model_type == HETERO_MODEL_TYPE:
        return ADAPTERS.get(HETERO_MODEL_TYPE)
    raise UnknownNameError(
        "decoder model family", model_type or "(no model_type)", [*family_names(), HETERO_MODEL_TYPE]
    )


# ------------------------------------------------------------------------------ helpers
def bypass_layer(layer: Any) -> Any:
    """Make decoder ``layer`` return its input unchanged (the layer is skipped); returns the hook handle.

    The layer still runs (its output is discarded). Works for layers that return the hidden
    states (transformers v5) or a tuple whose first item is the hidden states.
    """

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        hidden = layer_input(args, kwargs)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    return layer.register_forward_hook(hook, with_kwargs=True)


class ReplacedForward:
    """A module whose ``forward`` is ``make(forward)`` (``forward``: the one it had) until
    ``remove()``, which puts back exactly what was there: an instance-level ``forward`` someone else
    set, or none (the class's). The handle of every forward replacement of the package."""

    def __init__(self, module: Any, make: Any) -> None:
        self._module = module
        self._had_own = "forward" in vars(module)
        self._previous = vars(module).get("forward")
        module.forward = make(module.forward)

    def remove(self) -> None:
        if self._module is None:
            return
        if self._had_own:
            self._module.forward = self._previous
        else:
            del self._module.forward
        self._module = None


def zero_sub_block(attention: bool) -> Any:
    """A sub-block's ``forward`` that computes nothing: zeros shaped like its input, ``(zeros, None)``
    for an attention (output and attention weights: what transformers 5's decoder layers unpack)."""
    import torch

    def zeros(*args: Any, **kwargs: Any) -> Any:
        out = torch.zeros_like(layer_input(args, kwargs))
        return (out, None) if attention else out

    return zeros


def layer_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The hidden states (batch, time, D) a decoder layer was called with."""
    return args[0] if args else kwargs["hidden_states"]


def layer_output(output: Any) -> Any:
    """The hidden states (batch, time, D) a decoder layer returned."""
    return output[0] if isinstance(output, tuple) else output


_IGNORED_FIELDS = ("name", "max_context")


def architecture_mismatch(expected: Architecture, actual: Architecture) -> str | None:
    """The first structural difference between two architectures, or None when they build the same model.

    ``name`` and ``max_context`` are labels and are ignored; layer windows count. Example:
    ``"layers[3].ffn_width: expected 64, got 48"``.
    """
    a, b = expected.to_dict(), actual.to_dict()
    for key in a:
        if key in _IGNORED_FIELDS or key == "layers" or a[key] == b[key]:
            continue
        return f"{key}: expected {a[key]!r}, got {b[key]!r}"
    if len(a["layers"]) != len(b["layers"]):
        return f"num_layers: expected {len(a['layers'])}, got {len(b['layers'])}"
    for i, (la, lb) in enumerate(zip(expected.layers, actual.layers)):
        for f in fields(LayerSpec):  # the objects, not to_dict(), which omits unset windows
            if getattr(la, f.name) != getattr(lb, f.name):
                return f"layers[{i}].{f.name}: expected {getattr(la, f.name)!r}, got {getattr(lb, f.name)!r}"
    return None
