"""Which transformers model an Architecture becomes (plain family or heterogeneous decoder), and
building it with seeded random weights: autocompress_opt.hf.build, shared by export and timing."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import torch
from tiny_families import FAMILIES, VOCAB, hetero_arch, num_params, tiny_config

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch
from autocompress_opt.hf.build import build_model, inherited_settings, model_config
from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM

PLAIN_CONFIG = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "gemma3_text": "Gemma3TextConfig",
}
# Each family's fixed flags (Architecture refuses nothing here; to_hf_config refuses what the family lacks).
FLAGS: dict[str, dict[str, Any]] = {
    "qwen2": dict(qkv_bias=True),
    "qwen3": dict(qk_norm=True),
    "gemma3_text": dict(qk_norm=True, tie_embeddings=True),
}


def uniform(family: str = "llama", **kwargs: Any) -> Architecture:
    """2 layers, hidden 48, 6 query heads of 8 in 2 KV groups, FFN 64."""
    base = dict(num_layers=2, hidden_size=48, num_heads=6, num_kv_heads=2, head_dim=8, ffn_width=64, vocab_size=VOCAB)
    return Architecture.uniform(**{**base, **FLAGS.get(family, {}), **kwargs}, family=family)


# ------------------------------------------------------------------------------ the decision
@pytest.mark.parametrize("family", FAMILIES)
def test_uniform_architecture_is_a_plain_config_of_its_family(family: str) -> None:
    config = model_config(uniform(family))
    assert type(config).__name__ == PLAIN_CONFIG[family]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (48, 2, 6)
    assert (config.num_key_value_heads, config.head_dim, config.intermediate_size) == (2, 8, 64)


@pytest.mark.parametrize(
    ("arch", "why"),
    [
        (hetero_arch(), "layers differ"),
        (uniform(hidden_size=40), "LlamaConfig: 40 % 6 != 0 does not reload"),
        (replace(uniform(), layers=(LayerSpec(True, 6, 2, 8, True, 64, window=4),) * 2), "llama has no window"),
        (uniform("qwen2", qkv_bias=False), "qwen2 always has q/k/v biases"),
    ],
    ids=["heterogeneous", "heads-do-not-divide", "llama-window", "qwen2-without-bias"],
)
def test_what_no_plain_config_can_say_is_the_heterogeneous_decoder(arch: Architecture, why: str) -> None:
    """Falls back to AutocompressDeciLMConfig, which builds exactly ``arch`` (windows included)."""
    config = model_config(arch)
    assert isinstance(config, AutocompressDeciLMConfig), why
    assert architecture_mismatch(config.architecture(), arch) is None


def test_heterogeneous_flag_forces_the_heterogeneous_decoder() -> None:
    assert isinstance(model_config(uniform(), heterogeneous=True), AutocompressDeciLMConfig)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_settings_reach_both_kinds_of_config(family: str) -> None:
    """A parent's numerics land under the family's own key (Gemma: hidden_activation); a parent's
    sliding_window is ignored by the plain config (the layers' windows are in the architecture)."""
    settings = dict(rms_norm_eps=1e-5, hidden_act="gelu_pytorch_tanh", max_position_embeddings=64, sliding_window=4)
    plain = model_config(uniform(family), **settings)
    act = "hidden_activation" if family == "gemma3_text" else "hidden_act"
    assert (plain.rms_norm_eps, getattr(plain, act), plain.max_position_embeddings) == (1e-5, "gelu_pytorch_tanh", 64)
    assert "sliding_attention" not in (getattr(plain, "layer_types", None) or [])  # every layer attends fully
    hetero = model_config(uniform(family), heterogeneous=True, **{**settings, "sliding_window": None})
    assert (hetero.rms_norm_eps, hetero.hidden_act, hetero.max_position_embeddings) == (1e-5, "gelu_pytorch_tanh", 64)


def test_base_config_keeps_its_keys_and_takes_the_sizes() -> None:
    """A homogeneous parent's config: every key kept (here rms_norm_eps and a token id), sizes replaced;
    the caller's config is not modified."""
    base = tiny_config("llama", bos_token_id=5)
    config = model_config(uniform(num_layers=3, ffn_width=16), base_config=base)
    assert type(config).__name__ == "LlamaConfig"
    assert (config.rms_norm_eps, config.bos_token_id, config.attention_bias) == (1e-5, 5, True)
    assert (config.num_hidden_layers, config.intermediate_size) == (3, 16)
    assert base.intermediate_size == 48


def test_base_config_that_does_not_reload_falls_back() -> None:
    assert isinstance(model_config(uniform(hidden_size=40), base_config=tiny_config("llama")), AutocompressDeciLMConfig)


def test_bidirectional_parent_is_refused_only_where_the_causal_decoder_is_built() -> None:
    """Gemma 3 embedding models attend bidirectionally: a plain child keeps it (base config), the
    heterogeneous decoder cannot compute it."""
    parent = tiny_config("gemma3_text", use_bidirectional_attention=True)
    settings = inherited_settings(parent)
    assert settings["use_bidirectional_attention"] is True
    base = copy.deepcopy(parent)
    base.layer_types = base.layer_types[:2]  # as slicing re-indexes them to the kept layers
    assert model_config(uniform("gemma3_text"), base_config=base, **settings).use_bidirectional_attention is True
    with pytest.raises(ConfigError, match="bidirectional"):
        model_config(hetero_arch("gemma3_text"), **settings)


def test_inherited_settings_read_family_key_names() -> None:
    settings = inherited_settings(tiny_config("gemma3_text"))
    assert settings["hidden_act"] == "gelu_pytorch_tanh" and settings["sliding_window"] == 4
    assert "hidden_size" not in settings and "use_bidirectional_attention" not in settings


# ------------------------------------------------------------------------------ building
@pytest.mark.parametrize(
    "arch", [uniform(), uniform("qwen3"), uniform("gemma3_text"), hetero_arch(), hetero_arch("qwen2")]
)
def test_built_model_is_exactly_the_architecture(arch: Architecture) -> None:
    model = build_model(arch)
    assert num_params(model) == arch.num_params
    assert architecture_mismatch(adapter_for(model).architecture(model), arch) is None
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_build_is_deterministic_given_seed_and_leaves_the_rng_alone() -> None:
    state = torch.get_rng_state()
    a, b, c = (build_model(hetero_arch(), seed=s).state_dict() for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), state)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert 0.015 < a["model.embed_tokens.weight"].std().item() < 0.025  # initializer_range 0.02


def test_build_options() -> None:
    model = build_model(uniform(), dtype=torch.bfloat16, attn_implementation="eager")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "eager"
    assert isinstance(build_model(uniform(hidden_size=40)), AutocompressDeciLMForCausalLM)
    with pytest.raises(ConfigError, match="dtype"):
        build_model(uniform(), dtype=torch.int64)
