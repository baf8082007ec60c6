"""Model-family adapters: a conformance suite run over every registered adapter (builders in
``tests/tiny_families.py``), plus lookup errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_families import (
    BUILDERS,
    FAMILIES,
    VOCAB,
    hetero_arch,
    num_params,
    tiny_model,
    tokens,
)

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import UnknownNameError
from autocompress_opt.hf.adapters import (
    ADAPTERS,
    adapter_for,
    architecture_mismatch,
    bypass_layer,
    layer_input,
    layer_output,
)


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
