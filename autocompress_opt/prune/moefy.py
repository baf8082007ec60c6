"""MoEfication: a dense Llama-family decoder rebuilt as a mixture-of-experts from its own weights (issue 44).

The registries these machines reach hold no small MoE checkpoint, so expert pruning has nothing real to
be measured on. This module makes one from the real dense model, after Zhang et al. 2022 ("MoEfication:
Transformer Feed-forward Layers are Mixtures of Experts"): every FFN's ``F`` channels are split into ``E``
experts of ``F / E`` channels by balanced k-means on the channels' activation profiles over calibration
tokens (channels that fire together share an expert), and a router is fitted per layer by least squares
from the FFN's input to each expert's activation mass on those tokens. The result is a
``MixtralForCausalLM`` (transformers' class whose SwiGLU experts match a Llama FFN: gate and up rows
of the expert's channels, the matching down columns; the attention, norms and embeddings copied), so
transformers loads it with its own classes and llama.cpp converts it.

Mixtral weighs the top-``k`` experts by their renormalised router softmax. Scaled to a spread of
``router_scale`` (standard deviation over the calibration tokens) the fitted logits are small, so
those weights are close to ``1 / k``, and every
expert's down projection is multiplied by ``k``: a token routed to the experts holding its active
channels then computes close to the dense FFN. With ``top_k = E`` and a zero router
(``router_scale=0``) the MoE computes exactly the dense model (tested). A brief distillation from
the dense model (:func:`~autocompress_opt.recover.distill.distill`) then recovers what routing to
``k < E`` experts loses (``benchmarks/build_moe.py`` does both and records the numbers).

:func:`moefy` is the whole conversion; :func:`activation_profiles`, :func:`balanced_clusters` and
:func:`fit_router` are its steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from autocompress_opt.errors import ConfigError, check_int

__all__ = ["LayerSplit", "MoefyResult", "activation_profiles", "balanced_clusters", "fit_router", "moefy"]

# The dense families whose FFN is a SwiGLU MLP (gate_proj, up_proj, down_proj) and whose attention and
# norms Mixtral's decoder layer computes the same way (no attention bias, no QK-norm).
MOEFY_FAMILIES = ("llama", "mistral")


@dataclass(frozen=True)
class LayerSplit:
    """One layer's split: ``clusters`` ``(F,)`` the expert of each FFN channel, ``router`` ``(E, D)``
    the fitted router, and ``recall`` the share of calibration tokens' true top-``k`` experts (by
    activation mass) the router's top-``k`` finds."""

    clusters: torch.Tensor
    router: torch.Tensor
    recall: float


@dataclass
class MoefyResult:
    """The MoE model and what each layer's split measured."""

    model: Any
    layers: list[LayerSplit] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-safe: the router recall per layer and its mean."""
        recall = [split.recall for split in self.layers]
        return {"router_recall": recall, "mean_router_recall": sum(recall) / max(len(recall), 1)}


@contextmanager
def _captured(model: Any) -> Iterator[list[dict[str, list[torch.Tensor]]]]:
    """Per decoder layer, the FFN's inputs ``x`` and its channel activations ``h = act(gate x) * up x``
    (the down projection's input) of every forward pass inside the block."""
    seen: list[dict[str, list[torch.Tensor]]] = [{"x": [], "h": []} for _ in model.model.layers]
    handles = []
    for store, layer in zip(seen, model.model.layers):
        handles.append(layer.mlp.register_forward_pre_hook(lambda m, a, s=store: s["x"].append(a[0].detach())))
        handles.append(
            layer.mlp.down_proj.register_forward_pre_hook(lambda m, a, s=store: s["h"].append(a[0].detach()))
        )
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def activation_profiles(
    model: Any, tokens: torch.Tensor, batch_size: int = 4
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per decoder layer of a dense ``model``, ``(x, h)``: the FFN inputs ``(T, D)`` and channel
    activations ``(T, F)`` (float32) of the ``T`` tokens of ``tokens`` ``(N, L)``."""
    device = next(model.parameters()).device
    with _captured(model) as seen, torch.inference_mode():
        for start in range(0, tokens.shape[0], batch_size):
            model(input_ids=tokens[start : start + batch_size].to(device), use_cache=False)
    flat = lambda parts: torch.cat([p.reshape(-1, p.shape[-1]).float().cpu() for p in parts])
    return [(flat(store["x"]), flat(store["h"])) for store in seen]


def balanced_clusters(features: torch.Tensor, experts: int, *, iterations: int = 20, seed: int = 0) -> torch.Tensor:
    """Balanced k-means of the ``F`` rows of ``features`` ``(F, T)`` into ``experts`` clusters of exactly
    ``F / experts`` rows each, by cosine similarity: each round assigns (row, cluster) pairs in order of
    similarity, a row to the first cluster with room; centroids are the clusters' mean directions.
    Returns ``(F,)`` cluster ids. Deterministic given ``seed``."""
    rows = features.shape[0]
    if rows % experts:
        raise ConfigError(f"{rows} FFN channels do not split into {experts} equal experts; valid: a divisor of {rows}")
    size = rows // experts
    unit = torch.nn.functional.normalize(features.double(), dim=1)
    gen = torch.Generator().manual_seed(seed)
    centroids = unit[torch.randperm(rows, generator=gen)[:experts]]
    assign = torch.empty(rows, dtype=torch.long)
    for _ in range(iterations):
        order = torch.argsort((unit @ centroids.T).flatten(), descending=True, stable=True)
        room, new = [size] * experts, torch.full((rows,), -1, dtype=torch.long)
        for flat in order.tolist():
            row, cluster = divmod(flat, experts)
            if new[row] < 0 and room[cluster]:
                new[row], room[cluster] = cluster, room[cluster] - 1
        if torch.equal(new, assign):
            break
        assign = new
        centroids = torch.nn.functional.normalize(
            torch.stack([unit[assign == c].mean(0) for c in range(experts)]), dim=1
        )
    return assign


def fit_router(x: torch.Tensor, mass: torch.Tensor, *, ridge: float = 1e-3) -> torch.Tensor:
    """The linear router ``(E, D)`` whose logits ``x W^T`` best predict (ridge least squares) each token's
    per-expert activation ``mass`` ``(T, E)`` (centred per token: only the order among experts
    matters to a top-``k``) from the FFN inputs ``x`` ``(T, D)``."""
    x64, target = x.double(), mass.double() - mass.double().mean(dim=1, keepdim=True)
    gram = x64.T @ x64
    gram = gram + ridge * torch.trace(gram) / x64.shape[1] * torch.eye(x64.shape[1], dtype=x64.dtype)
    return torch.linalg.solve(gram, x64.T @ target).T.float()


def _recall(x: torch.Tensor, mass: torch.Tensor, router: torch.Tensor, k: int) -> float:
    """Share of the true top-``k`` experts (by mass) that the router's top-``k`` picks, over tokens."""
    true = torch.topk(mass, k, dim=1).indices
    picked = torch.topk(x @ router.T, k, dim=1).indices
    hits = (true[:, :, None] == picked[:, None, :]).any(-1).float()
    return float(hits.mean())


def moefy(
    model: Any,
    tokens: torch.Tensor,
    *,
    experts: int,
    top_k: int,
    router_scale: float = 0.01,
    iterations: int = 20,
    seed: int = 0,
    batch_size: int = 4,
) -> MoefyResult:
    """``model`` (a dense Llama / Mistral causal LM) as a ``MixtralForCausalLM`` of ``experts`` experts per
    layer, ``top_k`` per token (module doc), split on the calibration ``tokens`` ``(N, L)``. The
    dense model is not changed. Raises :class:`ConfigError` for another family, an FFN width that
    ``experts`` does not divide, or ``top_k`` outside ``1..experts``."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = model.config
    if config.model_type not in MOEFY_FAMILIES:
        raise ConfigError(
            f"moefy splits the SwiGLU FFNs of {', '.join(MOEFY_FAMILIES)} models; got {config.model_type!r}"
        )
    check_int(experts, "experts", 2, maximum=config.intermediate_size)
    check_int(top_k, "top_k", 1, maximum=experts)
    if config.intermediate_size % experts:
        raise ConfigError(
            f"FFN width {config.intermediate_size} does not split into {experts} equal experts; "
            f"valid: a divisor of {config.intermediate_size}"
        )
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ConfigError("moefy needs a model without attention or MLP biases (Mixtral's layers have none)")
    width = config.intermediate_size // experts
    moe_config = MixtralConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=width,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=dict(config.rope_parameters),
        tie_word_embeddings=bool(config.tie_word_embeddings),
        sliding_window=getattr(config, "sliding_window", None),
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=getattr(config, "pad_token_id", None),
    )
    profiles = activation_profiles(model, tokens, batch_size)
    dense = model.state_dict()
    state = {k: v.detach().clone() for k, v in dense.items() if ".mlp." not in k}
    splits = []
    for i, (x, h) in enumerate(profiles):
        clusters = balanced_clusters(h.abs().T, experts, iterations=iterations, seed=seed + i)
        mass = torch.stack([h[:, clusters == e].abs().sum(1) for e in range(experts)], dim=1)  # (T, E)
        router = fit_router(x, mass)
        splits.append(LayerSplit(clusters, router, _recall(x, mass, router, top_k)))
        router = router / (x @ router.T).std().clamp_min(1e-12)  # logits of unit spread on the calibration tokens
        prefix = f"model.layers.{i}.mlp."
        gate, up, down = (dense[prefix + f"{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        index = [torch.nonzero(clusters == e).flatten().to(gate.device) for e in range(experts)]
        state[prefix + "experts.gate_up_proj"] = torch.stack([torch.cat([gate[j], up[j]]) for j in index])
        state[prefix + "experts.down_proj"] = torch.stack([down[:, j] * top_k for j in index])
        state[prefix + "gate.weight"] = (router * router_scale).to(gate.dtype).to(gate.device)
    weight = next(model.parameters())
    moe: Any = MixtralForCausalLM(moe_config)
    moe.to(dtype=weight.dtype, device=weight.device)
    missing, unexpected = moe.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight" or not moe_config.tie_word_embeddings]:
        raise AssertionError(f"moefy left {missing} unset and produced unused {unexpected}")
    if moe_config.tie_word_embeddings:
        moe.tie_weights()
    return MoefyResult(moe.eval(), splits)
