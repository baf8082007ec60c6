"""Uniform children of mixture-of-experts and hybrid Mamba-2 parents: the plan-mode architecture of a
point whose global choices include the sparse axes.

A dense parent's uniform child (:func:`~autocompress_opt.arch.architecture.uniform_child`) makes
every kept layer an attention + FFN block of one size. A MoE / hybrid parent's layers differ in
*kind* (Nemotron 3 Super: 40 Mamba-2, 40 latent-MoE and 8 attention layers, each one sub-block),
and pruning keeps each layer's kind; so its uniform child keeps every kept layer's mixer and FFN
kinds and gives all sub-blocks of one kind the same size:

* attention: ``num_kv_heads`` KV heads, ``num_kv_heads · q_per_kv`` query heads of the parent's head
  size (the layer's window kept);
* dense FFN: ``ffn_width`` channels;
* MoE: ``num_experts`` routed experts kept (the most used, in weights mode), ``experts_per_token``
  routed per token (capped at the experts kept), ``expert_width`` channels per expert,
  ``shared_width`` channels of the shared expert (only where the parent has one); the latent width,
  gating and biases are the parent's;
* Mamba-2: ``mamba_heads`` SSM heads (a multiple of the layer's groups); head size, state size,
  groups and convolution are the parent's.

A choice the point does not carry leaves that size at the parent's. This is the architecture the
ModelOpt Minitron MoE/Mamba axes describe (``num_moe_experts``, ``moe_ffn_hidden_size``,
``moe_shared_expert_intermediate_size``, ``mamba_num_heads``: one width for all layers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from autocompress_opt.arch.architecture import Architecture, LayerSpec, check_kept_layers
from autocompress_opt.errors import ConfigError

__all__ = [
    "SPARSE_CHOICES",
    "depth_layers",
    "hybrid_child",
    "is_kind_uniform",
    "is_moe",
    "is_sparse",
    "sparse_limits",
]

# The global choices a MoE / hybrid parent adds to the dense five (apply to every such layer).
SPARSE_CHOICES: tuple[str, ...] = ("num_experts", "experts_per_token", "expert_width", "shared_width", "mamba_heads")


def is_sparse(parent: Architecture) -> bool:
    """True when ``parent`` has MoE or Mamba-2 layers (its uniform child is :func:`hybrid_child`)."""
    return any(layer.moe is not None or layer.mamba is not None for layer in parent.layers)


def is_moe(parent: Architecture) -> bool:
    """True when ``parent`` has a mixture-of-experts layer (a weights-mode trial of it is an expert trial)."""
    return any(layer.moe is not None for layer in parent.layers)


def is_kind_uniform(arch: Architecture) -> bool:
    """True when every present sub-block of one kind has the same sizes (attention windows aside):
    what a MoE / hybrid family's plain config can express."""
    kinds: dict[str, set[object]] = {}
    for layer in arch.layers:
        if layer.attention:
            kinds.setdefault("attention", set()).add((layer.num_heads, layer.num_kv_heads, layer.head_dim))
        if layer.ffn:
            kinds.setdefault("ffn", set()).add(layer.ffn_width)
        if layer.moe is not None:
            kinds.setdefault("moe", set()).add(layer.moe)
        if layer.mamba is not None:
            kinds.setdefault("mamba", set()).add(layer.mamba)
    return all(len(sizes) == 1 for sizes in kinds.values())


# The families whose MoE layers may each keep their own expert width and experts per token (NVIDIA's
# Puzzle form, ``nemotron_h_puzzle`` with per-layer ``block_configs``; issue 43), and the engines that
# read it: llama.cpp's NemotronHPuzzleModel converter and nemotron-h graph (per-layer n_ff_exp and
# n_expert_used; run here in tests/runtimes) and this package's own class
# (autocompress_opt.hf.puzzle). vLLM 0.32 maps NemotronHPuzzleForCausalLM onto NemotronHForCausalLM,
# which builds each layer from config.get_nemotron_h_config_for_layer when the config class has it:
# NVIDIA's Puzzle checkpoints ship that class as remote code, this package's export does not, so
# vLLM is not a reader of our exports (yet).
PER_LAYER_MOE: dict[str, tuple[str, ...]] = {"nemotron_h": ("llamacpp", "transformers")}


def per_layer_moe(arch: Architecture) -> bool:
    """True when ``arch`` is what the Puzzle form expresses and a plain config does not: its MoE layers
    differ only in expert width and experts per token (one expert count, shared width, latent width
    and gating in every MoE layer) and every other kind is alike."""
    if arch.family not in PER_LAYER_MOE or is_kind_uniform(arch):
        return False
    moe = {replace(layer.moe, expert_width=1, experts_per_token=1) for layer in arch.layers if layer.moe is not None}
    rest = replace(arch, layers=tuple(replace(layer, moe=None) for layer in arch.layers))
    return len(moe) == 1 and is_kind_uniform(rest)


def _first(parent: Architecture, present: str) -> LayerSpec | None:
    return next((layer for layer in parent.layers if getattr(layer, present)), None)


def sparse_limits(parent: Architecture) -> dict[str, int]:
    """The largest value of each global choice ``parent`` has a sub-block for (a choice absent here
    has nothing to size in this parent): the first layer of each kind gives its sizes."""
    limits = {"num_layers": parent.num_active_layers, "hidden_size": parent.hidden_size}
    attn, dense = _first(parent, "attention"), _first(parent, "ffn")
    moe = next((layer.moe for layer in parent.layers if layer.moe is not None), None)
    mamba = next((layer.mamba for layer in parent.layers if layer.mamba is not None), None)
    if attn is not None:
        limits.update(num_kv_heads=attn.num_kv_heads, q_per_kv=attn.num_heads // attn.num_kv_heads)
    if dense is not None:
        limits["ffn_width"] = dense.ffn_width
    if moe is not None:
        limits.update(
            num_experts=moe.num_experts, experts_per_token=moe.experts_per_token, expert_width=moe.expert_width
        )
        if moe.shared_width:
            limits["shared_width"] = moe.shared_width
    if mamba is not None:
        limits["mamba_heads"] = mamba.num_heads
    return limits


def _sized(layer: LayerSpec, point: Mapping[str, int], head_dim: int) -> LayerSpec:
    """``layer`` with each of its sub-blocks at the point's size for its kind."""
    out = layer
    if layer.attention and "num_kv_heads" in point:
        kv = int(point["num_kv_heads"])
        out = replace(out, num_heads=kv * int(point.get("q_per_kv", 1)), num_kv_heads=kv, head_dim=head_dim)
    if layer.ffn and "ffn_width" in point:
        out = replace(out, ffn_width=int(point["ffn_width"]))
    if layer.moe is not None:
        experts = int(point.get("num_experts", layer.moe.num_experts))
        moe = replace(
            layer.moe,
            num_experts=experts,
            experts_per_token=min(experts, int(point.get("experts_per_token", layer.moe.experts_per_token))),
            expert_width=int(point.get("expert_width", layer.moe.expert_width)),
            shared_width=int(point.get("shared_width", layer.moe.shared_width)) if layer.moe.shared_width else 0,
        )
        out = replace(out, moe=moe)
    if layer.mamba is not None and "mamba_heads" in point:
        heads = int(point["mamba_heads"])
        if heads % layer.mamba.groups:
            raise ConfigError(
                f"mamba_heads={heads} is not a multiple of the parent's Mamba-2 groups ({layer.mamba.groups}); "
                f"valid: multiples of {layer.mamba.groups} up to {layer.mamba.num_heads}"
            )
        out = replace(out, mamba=replace(layer.mamba, num_heads=heads))
    return out


def depth_layers(parent: Architecture, n: int, ranked: Sequence[int]) -> list[int]:
    """The ``n`` layers a MoE / hybrid child of ``parent`` keeps (ascending): the first ``n`` present
    layers of ``ranked`` (most important first), except that the child keeps at least one MoE layer
    and one attention layer where the parent has them (its sparse and head choices need a layer to
    apply to, and transformers' Nemotron-H builds its attention mask from an attention layer's cache:
    a child of Mamba-2 layers only does not run), and a hybrid (Mamba-2) parent's child keeps its first
    layer (transformers' Nemotron-H reads the cache's length from layer 0, which a MoE or MLP layer
    does not hold). A missing kind's best-ranked layer takes the place
    of the last-ranked kept layer that is not the only one of a kept kind. The one rule of plan mode's
    uniform child and of a weights trial's depth cut
    (:func:`~autocompress_opt.search.study.weights_trial.dense_cut`)."""
    present = [i for i in ranked if 0 <= i < parent.num_layers and not parent.layers[i].is_noop]
    kept = present[:n]
    kinds = {
        "moe": lambda i: parent.layers[i].moe is not None,
        "attention": lambda i: parent.layers[i].attention,
    }
    if any(layer.mamba is not None for layer in parent.layers):  # Nemotron-H: the first layer holds a cache
        first = min(present, default=0)
        kinds["first"] = lambda i: i == first
    for kind, has in kinds.items():
        if any(has(i) for i in kept) or not any(has(i) for i in present):
            continue
        needed = [k for k, h in kinds.items() if k != kind and sum(h(i) for i in kept) == 1]
        spare = [j for j in reversed(range(len(kept))) if not any(kinds[k](kept[j]) for k in needed)]
        if spare:
            kept[spare[0]] = next(i for i in present if has(i))
    return sorted(kept)


def hybrid_child(
    parent: Architecture,
    *,
    kept_layers: Sequence[int],
    point: Mapping[str, int],
    name: str | None = None,
) -> Architecture:
    """The uniform child of a MoE / hybrid ``parent`` at ``point`` (see the module docstring): the
    parent's layers in ``kept_layers`` kept, each keeping its kinds, sized by the point; the others
    dropped. Lists all ``parent.num_layers`` layers, like the dense builder.

    Raises :class:`ConfigError` when ``kept_layers`` is empty, repeats a layer, names one the parent
    lacks or drops, or a choice does not fit the parent (e.g. Mamba heads not a multiple of groups).
    """
    kept = check_kept_layers(parent, kept_layers)
    attn = _first(parent, "attention")
    head_dim = attn.head_dim if attn is not None else 0
    sized: dict[LayerSpec, LayerSpec] = {}  # parent layers repeat: size each distinct one once
    layers = []
    for i, layer in enumerate(parent.layers):
        if i not in kept:
            layers.append(LayerSpec.dropped())
            continue
        if layer not in sized:
            sized[layer] = _sized(layer, point, head_dim)
        layers.append(sized[layer])
    return replace(
        parent,
        hidden_size=int(point.get("hidden_size", parent.hidden_size)),
        layers=tuple(layers),
        name=f"{parent.name or parent.family}-pruned" if name is None else name,
    )
