"""MoEfication (issue 44): a dense Llama split into a Mixtral of the same weights. With every expert routed
and a zero router it computes the dense model exactly; channels are split into equal experts by
co-activation; the fitted router finds the experts holding a token's active channels better than chance;
the result saves and loads with transformers' own classes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_families import tiny_model, tokens

from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.moefy import balanced_clusters, moefy


def test_balanced_clusters_are_equal_sized_and_group_co_active_channels() -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(4, 64, generator=gen) ** 4  # four activation patterns over 64 tokens
    features = base.repeat_interleave(6, dim=0) + 0.01 * torch.rand(24, 64, generator=gen)
    clusters = balanced_clusters(features, 4)
    assert torch.bincount(clusters).tolist() == [6, 6, 6, 6]
    for group in range(4):  # the six copies of one pattern land in one expert
        assert len(set(clusters[group * 6 : group * 6 + 6].tolist())) == 1
    with pytest.raises(ConfigError, match=r"24 FFN channels do not split into 5 equal experts"):
        balanced_clusters(features, 5)


def test_every_expert_routed_with_a_zero_router_is_the_dense_model(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    dense = tiny_model("llama", attention_bias=False, mlp_bias=False)
    result = moefy(dense, tokens(4, 16), experts=4, top_k=4, router_scale=0.0)
    ids = tokens(2, 12, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(result.model(ids).logits, dense(ids).logits, rtol=1e-4, atol=1e-5)
    assert type(result.model).__name__ == "MixtralForCausalLM"
    from transformers import AutoModelForCausalLM

    result.model.save_pretrained(tmp_path / "moe")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, dense(ids).logits, rtol=1e-4, atol=1e-5)


def test_the_fitted_router_beats_chance_and_bad_requests_are_named() -> None:
    torch.set_num_threads(1)
    dense = tiny_model("llama", attention_bias=False, mlp_bias=False)
    result = moefy(dense, tokens(8, 32), experts=4, top_k=1)
    assert result.summary()["mean_router_recall"] > 0.25 + 0.1  # chance: 1 in 4
    assert result.model.config.num_experts_per_tok == 1 and result.model.config.intermediate_size == 12
    with pytest.raises(ConfigError, match=r"FFN width 48 does not split into 5 equal experts"):
        moefy(dense, tokens(2, 8), experts=5, top_k=1)
    with pytest.raises(ConfigError, match=r"top_k"):
        moefy(dense, tokens(2, 8), experts=4, top_k=5)
    with pytest.raises(ConfigError, match=r"splits the SwiGLU FFNs of llama, mistral models; got 'qwen2'"):
        moefy(tiny_model("qwen2"), tokens(2, 8), experts=4, top_k=1)
