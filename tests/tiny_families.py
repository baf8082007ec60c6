"""Tiny random models of every supported family, shared by the adapter, importance, pruning, export,
search and task tests (:func:`tiny_model`, :func:`tiny_hetero_model`): 3-4 layers, hidden 48, every
parameter random (biases and norm weights included, so a slicing mistake cannot hide behind zeros or
ones). :data:`BUILDERS` has one builder per registered adapter (the conformance suite's input).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autocompress_opt.arch.architecture import Architecture, LayerSpec

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
# The architecture-only families (no adapter yet, issue 30): tiny models of them check the config
# reader's exact counts against transformers, and that every weights path refuses them.
ARCHITECTURE_ONLY = ("mixtral", "qwen3_moe", "gpt_oss", "nemotron_h", "granitemoehybrid")
VOCAB = 97

# 3 layers, hidden 48, 6 query heads of 8 channels in 2 KV groups of 3,
# FFN 48. Llama gets every bias so bias slicing is exercised; qwen2 has q/k/v biases by design.
# Gemma 3 (tied embeddings by default) gets q/k/v/o biases, a sliding / full / sliding layer pattern
# with a 4-token window (the tests' 10-12-token inputs cross it), an attention scale that is not
# head_dim**-0.5 and a final logit cap, so every Gemma-specific setting must survive pruning.
TINY: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=48,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
)
GEMMA3_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
FAMILY_OVERRIDES: dict[str, dict[str, Any]] = {
    "llama": dict(attention_bias=True, mlp_bias=True),
    "gemma3_text": dict(
        attention_bias=True,
        layer_types=GEMMA3_LAYER_TYPES,
        sliding_window=4,
        query_pre_attn_scalar=12,
        final_logit_softcapping=5.0,
    ),
    # 4 experts, 2 per token, everywhere; one dense layer (qwen3_moe), a 4-token window (gpt_oss), every
    # Nemotron-H block kind with a latent MoE and every bias switched on, Granite's Mamba-2 and attention.
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1], attention_bias=True
    ),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=4),
    "nemotron_h": dict(
        layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        moe_shared_expert_intermediate_size=32,
        moe_latent_size=16,
        mlp_bias=True,
        use_bias=True,
    ),
    "granitemoehybrid": dict(
        layer_types=["mamba", "attention", "mamba"],
        mamba_n_heads=4,
        mamba_d_head=24,
        mamba_n_groups=2,
        mamba_d_state=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=32,
        attention_bias=True,
    ),
}


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random: matrices N(0, 0.1²) (0.2 for embeddings), norms 1 + N(0, 0.1²), biases N(0, 0.05²).

    (Gemma's norms multiply by 1 + w, so theirs scale by about 2: still a valid model.)"""
    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for name, param in model.named_parameters(remove_duplicate=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            noise = torch.randn(param.shape, generator=gen)
            if "norm" in name:
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.05 * noise)
            else:
                param.copy_((0.2 if "embed" in name else 0.1) * noise)
    return model.eval()


def tiny_config(family: str, **overrides: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(family, **{**TINY, **FAMILY_OVERRIDES.get(family, {}), **overrides})


def tiny_model(family: str, *, seed: int = 0, **overrides: Any) -> Any:
    """A random-weight causal LM of ``family`` with :data:`TINY` sizes (``overrides`` change them)."""
    from transformers import AutoModelForCausalLM

    return randomize(AutoModelForCausalLM.from_config(tiny_config(family, **overrides)), seed)


# A tiny Qwen3-MoE: 3 layers (layer 1 dense), hidden 48, 8 experts of 16 channels, top-2. Widths the tests
# keep stay multiples of 4: transformers' grouped_mm experts need 16-byte strides (fp32) on the CPU.
TINY_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)


def tiny_moe_model() -> Any:
    """The tiny Qwen3-MoE (:data:`TINY_MOE`), random weights of seed 0."""
    return tiny_model("qwen3_moe", **TINY_MOE)


def tiny_moe_importance(model: Any) -> Any:
    """Importance of ``model`` (a MoE) on 4 random rows of 16 tokens: experts, their channels, the rest."""
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.prune.importance import estimate_importance

    return estimate_importance(model, tokens(4, 16), adapter=moe_adapter(model), progress=False)


def hetero_arch(family: str = "llama", **kwargs: Any) -> Architecture:
    """Layer 0 has no attention, layer 1 keeps 2 of 3 query heads per group over 2 groups, layer 2 is
    dropped entirely, layer 3 has no FFN and one KV group of 3 heads. Gemma: layer 1 slides over 4
    tokens, layer 3 attends fully."""
    flags = {
        "llama": dict(qkv_bias=True, o_bias=True, mlp_bias=True),
        "qwen2": dict(qkv_bias=True),
        "qwen3": dict(qk_norm=True),
        "gemma3_text": dict(qk_norm=True, tie_embeddings=True),
    }.get(family, {})
    layers = (
        LayerSpec(attention=False, ffn=True, ffn_width=40),
        LayerSpec(True, 4, 2, 8, True, 48, window=4 if family == "gemma3_text" else None),
        LayerSpec.dropped(),
        LayerSpec(True, 3, 1, 8, False, 0),
    )
    return Architecture(vocab_size=VOCAB, hidden_size=48, layers=layers, family=family, **{**flags, **kwargs})


def tiny_hetero_model(family: str = "llama", *, seed: int = 0, **kwargs: Any) -> Any:
    """A random-weight ``AutocompressDeciLMForCausalLM`` of :func:`hetero_arch`."""
    from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM

    settings: dict[str, Any] = {}
    if family == "gemma3_text":  # Gemma numerics (hetero_arch gives layer 1 its 4-token window)
        settings = dict(
            hidden_act="gelu_pytorch_tanh",
            query_pre_attn_scalar=12,
            final_logit_softcapping=5.0,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        )
    config = AutocompressDeciLMConfig.from_architecture(
        hetero_arch(family, **kwargs), max_position_embeddings=64, rms_norm_eps=1e-5, **settings
    )
    return randomize(AutocompressDeciLMForCausalLM(config), seed)


def tokens(batch: int = 2, length: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# One builder per registered adapter: the suite fails the day an adapter is added without one.
BUILDERS: dict[str, Callable[[], Any]] = {
    **{family: (lambda f=family: tiny_model(f)) for family in FAMILIES},
    "autocompress_decilm": tiny_hetero_model,
}


# A Nemotron-H hybrid, "ME*M-E": Mamba-2, latent MoE, attention, Mamba-2, relu² MLP, latent MoE; hidden 48.
# Mamba-2: 8 heads of 8 channels in 2 groups, state 8. MoE: 8 experts of 16 channels over a latent width of
# 16, top-2, a shared expert of 32. Expert widths stay multiples of 4 (transformers' grouped_mm experts need
# 16-byte strides on CPU); without mamba_ssm / causal_conv1d transformers runs its PyTorch reference scan
# (slower, exact).
HYBRID_KINDS = ["linear_attention", "moe", "full_attention", "linear_attention", "mlp", "moe"]
HYBRID = dict(
    layers_block_type=HYBRID_KINDS, mamba_num_heads=8, n_groups=2, n_routed_experts=8, moe_intermediate_size=16
)


def hybrid_model(**overrides: Any) -> Any:
    """The tiny Nemotron-H (:data:`HYBRID`), with a random router correction bias in each MoE layer
    (a buffer :func:`randomize` leaves at zero)."""
    model = tiny_model("nemotron_h", **{**HYBRID, **overrides})
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mixer, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.copy_(0.1 * torch.randn(gate.e_score_correction_bias.shape, generator=gen))
    return model
