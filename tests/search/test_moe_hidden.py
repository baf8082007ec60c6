"""Hidden size on MoE and hybrid parents (issue 43): ``slice_hidden`` keeps some residual channels in
every layer kind (attention, dense FFN, router and stacked experts or the latent projections around
them, shared expert, Mamba-2), and the child computes the parent with the other channels masked."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from test_moe_depth import _trial, exported_as_kept
from tiny_families import TINY_MOE, hybrid_model, tiny_model, tokens

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.experts import hidden_choice, slice_experts, slice_hidden
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.masking import Masks, apply_masks


def _masked_logits(model: Any, channels: list[int], ids: torch.Tensor) -> torch.Tensor:
    adapter = moe_adapter(model)
    arch = adapter.architecture(model)
    hidden = torch.zeros(arch.hidden_size, dtype=torch.bool)
    hidden[channels] = True
    with torch.no_grad(), apply_masks(model, replace(Masks.ones(arch), hidden=hidden), adapter=adapter):
        return model(ids).logits


def _puzzle() -> Any:
    from puzzle_helpers import per_layer_masks

    model = hybrid_model().eval()
    importance = estimate_importance(model, tokens(2, 16, seed=1), adapter=moe_adapter(model), progress=False)
    base = {"num_experts": 8, "experts_per_token": 2, "expert_width": 12, "shared_width": 32, "mamba_heads": 8}
    return slice_experts(model, per_layer_masks(model, importance, base, {5: {"expert_width": 16}}))


@pytest.mark.parametrize(
    "family",
    ["qwen3_moe", "mixtral", "nemotron_h", "nemotron_h_latent", "nemotron_h_puzzle"],
)
def test_a_hidden_cut_computes_the_parent_with_the_other_channels_masked(family: str) -> None:
    if family == "nemotron_h_latent":
        model = hybrid_model()  # latent MoE, Mamba-2, attention, relu² MLP
    elif family == "nemotron_h_puzzle":
        model = _puzzle()
    elif family == "nemotron_h":
        model = hybrid_model(moe_latent_size=None)  # experts on the residual width
    else:
        model = tiny_model(family, **(TINY_MOE if family == "qwen3_moe" else {}))
    model = model.eval()
    adapter = moe_adapter(model)
    arch = adapter.architecture(model)
    importance = estimate_importance(model, tokens(2, 16, seed=1), adapter=adapter, progress=False)
    channels = hidden_choice(importance, arch.hidden_size * 3 // 4)
    assert channels == sorted(channels) and len(channels) == arch.hidden_size * 3 // 4
    cut = slice_hidden(model, channels)
    built = moe_adapter(cut).architecture(cut)
    assert built.hidden_size == len(channels) and cut.config.model_type == model.config.model_type
    assert [(a.num_heads, a.head_dim, a.ffn_width) for a in arch.layers] == [
        (b.num_heads, b.head_dim, b.ffn_width) for b in built.layers
    ]
    ids = tokens(2, 12, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(cut(ids).logits, _masked_logits(model, channels, ids))
    assert all(p.data_ptr() != q.data_ptr() for p in cut.parameters() for q in model.parameters())


def test_bad_hidden_channel_lists_are_refused() -> None:
    model = tiny_model("mixtral").eval()
    d = model.config.hidden_size
    with pytest.raises(ConfigError, match="hidden channel"):
        slice_hidden(model, [0, d])
    with pytest.raises(ConfigError, match="at most once"):
        slice_hidden(model, [1, 1])
    with pytest.raises(ConfigError, match="at most once"):
        slice_hidden(model, [])


@pytest.mark.parametrize("family", ["qwen3_moe", "nemotron_h"])
def test_a_weights_trial_cuts_the_hidden_size_and_exports_its_own_child(family: str, tmp_path) -> None:
    """A point of fewer residual channels than the parent (and one layer fewer): the trial's architecture
    has that hidden size, its kept record names the channels (the highest-scoring ones), the proxy
    prices the cut, and ``export_trial`` writes a model with the trial child's logits."""

    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.arch.hybrid import sparse_limits
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.expert_kept import EXPERT_KEPT_DEPTH, kept_hidden
    from autocompress_opt.search.study.proxy import retained_expert_importance

    model = (
        tiny_model("qwen3_moe", **TINY_MOE, vocab_size=260) if family == "qwen3_moe" else hybrid_model(vocab_size=260)
    )
    width = model.config.hidden_size * 3 // 4
    point = lambda p: {**sparse_limits(p), "num_layers": p.num_layers - 1, "hidden_size": width, "num_experts": 4}
    parent, result = _trial(tmp_path, point, model)
    loaded = load_model(tmp_path / "moe")
    arch = Architecture.from_dict(result["architecture"])
    assert arch.hidden_size == width and sum(layer.is_noop for layer in arch.layers) == 1
    kept = result["kept"]
    assert kept["format"] == EXPERT_KEPT_DEPTH and len(kept_hidden(kept, parent.hidden_size)) == width
    assert result["kl_to_parent"] > 0
    assert exported_as_kept(loaded, arch, kept, tmp_path / "export").config.hidden_size == width
    with pytest.raises(ConfigError, match="kept_hidden"):
        kept_hidden({**kept, "kept_hidden": kept["kept_hidden"][::-1]}, parent.hidden_size)

    importance = estimate_importance(
        loaded.model, tokens(2, 16, seed=1), adapter=moe_adapter(loaded.model), progress=False
    )
    narrower = replace(parent, hidden_size=width)  # the proxy prices the hidden cut alone
    assert retained_expert_importance(narrower, importance) < retained_expert_importance(parent, importance)
