"""Model-family adapters: a conformance suite run over every registered adapter, plus lookup errors.

Also home of the tiny random models the importance / materialise / export tests share
(:func:`tiny_model`, :func:`tiny_hetero_model`): 3-4 layers, hidden 48, every parameter random
(biases and norm weights included, so a slicing mistake cannot hide behind zeros or ones).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import UnknownNameError
from autocompress_opt.hf.adapters import (
    ADAPTERS,
    adapter_for,
    architecture_mismatch,
    bypass_layer,
    layer_input,
    layer_output,
)

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
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


def test_every_registered_adapter_has_a_conformance_builder() -> None:
    """Registering an adapter without a test model is caught here."""
    assert sorted(BUILDERS) == ADAPTERS.names()


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def built(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, BUILDERS[request.param]()


# ----------------------------------------------------------------------- conformance suite
def test_adapter_is_chosen_by_model_type(built: tuple[str, Any]) -> None:
    name, model = built
    assert adapter_for(model).name == name
    assert adapter_for(model.config) is adapter_for(model)


def test_architecture_counts_every_parameter(built: tuple[str, Any]) -> None:
    """The adapter finds every module: its Architecture's exact count equals the model's."""
    _, model = built
    arch = adapter_for(model).architecture(model)
    assert arch.num_params == num_params(model)


def test_layer_parts_have_the_documented_shapes(built: tuple[str, Any]) -> None:
    """q/k/v/o, gate/up/down and norms are found, with (out, in) shapes as LayerParts documents."""
    _, model = built
    adapter = adapter_for(model)
    hidden = adapter.embedding(model).embedding_dim
    assert adapter.final_norm(model).weight.shape == (hidden,)
    assert adapter.lm_head(model).weight.shape == (VOCAB, hidden)
    for parts, spec in zip(adapter.all_layer_parts(model), adapter.architecture(model).layers):
        if spec.attention:
            q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
            assert parts.q_proj.weight.shape == (q, hidden)
            assert parts.k_proj.weight.shape == parts.v_proj.weight.shape == (kv, hidden)
            assert parts.o_proj.weight.shape == (hidden, q)
            assert parts.input_norm.weight.shape == (hidden,)
            assert parts.group_size == spec.num_heads // spec.num_kv_heads
        else:
            assert parts.attention is parts.q_proj is parts.input_norm is None
        if spec.ffn:
            assert parts.gate_proj.weight.shape == parts.up_proj.weight.shape == (spec.ffn_width, hidden)
            assert parts.down_proj.weight.shape == (hidden, spec.ffn_width)
            assert parts.ffn_norm.weight.shape == (hidden,)
        else:
            assert parts.mlp is parts.down_proj is parts.ffn_norm is None


def test_kv_group_layout_matches_the_model(built: tuple[str, Any]) -> None:
    """Perturbing KV head g's values changes exactly the query heads g·r .. g·r+r-1 (the group layout
    importance and slicing assume)."""
    _, model = built
    adapter = adapter_for(model)
    parts = next(p for p in adapter.all_layer_parts(model) if p.attention is not None and p.num_kv_heads > 1)
    d, r, g = parts.head_dim, parts.group_size, 1
    captured: list[torch.Tensor] = []
    hook = parts.o_proj.register_forward_pre_hook(lambda m, args: captured.append(args[0].clone()))
    ids = tokens()
    try:
        with torch.no_grad():
            model(ids)
            original = parts.v_proj.weight.clone()
            parts.v_proj.weight[g * d : (g + 1) * d] += 1.0
            model(ids)
            parts.v_proj.weight.copy_(original)
    finally:
        hook.remove()
    changed = (captured[0] - captured[1]).abs().unflatten(-1, (-1, d)).amax(dim=(0, 1, 3)) > 0  # (H,)
    assert changed.tolist() == [h // r == g for h in range(parts.num_heads)]


def test_bypass_layer_returns_its_input(built: tuple[str, Any]) -> None:
    """A bypassed layer hands its input on unchanged; removing the hook restores the model."""
    _, model = built
    layer = adapter_for(model).layers(model)[1]
    seen: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        base = model(tokens()).logits
        handle = bypass_layer(layer)  # forward hooks run in registration order: the next one sees its result
        hooks = [
            layer.register_forward_pre_hook(lambda m, a, k: seen.update(input=layer_input(a, k)), with_kwargs=True),
            layer.register_forward_hook(lambda m, a, o: seen.update(output=layer_output(o))),
        ]
        skipped = model(tokens()).logits
        for h in (handle, *hooks):
            h.remove()
        restored = model(tokens()).logits
    assert torch.equal(seen["input"], seen["output"])
    assert not torch.equal(base, skipped)
    assert torch.equal(base, restored)


# ---------------------------------------------------------------------------- per family
@pytest.mark.parametrize("family", FAMILIES)
def test_architecture_matches_the_config_reading(family: str) -> None:
    """Module shapes and Architecture.from_hf_config agree on every structural field."""
    model = tiny_model(family)
    from_modules = adapter_for(model).architecture(model)
    from_config = Architecture.from_hf_config(model.config)
    assert architecture_mismatch(from_config, from_modules) is None


def test_tied_embeddings_are_detected() -> None:
    model = tiny_model("qwen3", tie_word_embeddings=True)
    arch = adapter_for(model).architecture(model)
    assert arch.tie_embeddings and arch.num_params == num_params(model)


def test_architecture_mismatch_names_the_first_difference() -> None:
    a = hetero_arch()
    b = Architecture.from_dict(
        {
            **a.to_dict(),
            "layers": [*a.to_dict()["layers"][:3], {**a.to_dict()["layers"][3], "num_heads": 2, "num_kv_heads": 1}],
        }
    )
    assert architecture_mismatch(a, b) == "layers[3].num_heads: expected 3, got 2"
    assert architecture_mismatch(a, Architecture.from_dict({**a.to_dict(), "name": "other"})) is None


# ------------------------------------------------------------------------------- errors
def test_unsupported_family_lists_supported_ones() -> None:
    """gpt2 is not a supported decoder: the error names it and lists every supported family."""
    from transformers import GPT2Config

    with pytest.raises(UnknownNameError) as info:
        adapter_for(GPT2Config(n_layer=1, n_embd=32, n_head=2))
    message = str(info.value)
    assert "'gpt2'" in message and all(f in message for f in FAMILIES)


def test_near_miss_family_gets_a_suggestion() -> None:
    class Config:
        model_type = "qwen"

    with pytest.raises(UnknownNameError, match="did you mean"):
        adapter_for(Config())


def test_object_without_config_is_rejected() -> None:
    with pytest.raises(UnknownNameError, match="no model_type"):
        adapter_for(object())
