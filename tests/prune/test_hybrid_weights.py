"""Weights mode on a tiny random Nemotron-H (issue 30): Mamba-2 heads, latent-MoE experts, their
channels and the shared expert's scored, masked on the parent, and sliced into a plain checkpoint that
reloads with the masked logits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import HYBRID_KINDS, hybrid_model, num_params, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch, moe_adapter
from autocompress_opt.prune.experts import expert_masks, export_experts, slice_experts
from autocompress_opt.prune.importance import Importance, estimate_importance, expert_forward
from autocompress_opt.prune.masking import Masks, apply_masks

KINDS = HYBRID_KINDS
MAMBA, MOE = (0, 3), (1, 5)


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(2)
    return hybrid_model()


@pytest.fixture(scope="module")
def importance(model: Any) -> Importance:
    return estimate_importance(model, tokens(4, 12), adapter=moe_adapter(model), progress=False)


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens(3, 14, seed=1)).logits


def masked_logits(model: Any, masks: Masks) -> torch.Tensor:
    with apply_masks(model, masks, adapter=moe_adapter(model)):
        return logits(model)


def test_adapter_reads_every_block_kind_as_the_config_reader(model: Any) -> None:
    arch = moe_adapter(model).architecture(model)
    assert architecture_mismatch(Architecture.from_hf_config(model.config), arch) is None
    assert arch.num_params == num_params(model)
    assert [(layer.mixer, layer.ffn_kind) for layer in arch.layers] == [
        ("mamba2", "none"),
        ("none", "moe"),
        ("attention", "none"),
        ("mamba2", "none"),
        ("none", "dense"),
        ("none", "moe"),
    ]
    moe = arch.layers[1].moe
    assert (moe.latent_width, moe.shared_width, moe.gated) == (16, 32, False)


def test_generic_weights_paths_still_refuse_the_family(model: Any) -> None:
    with pytest.raises(ConfigError, match="'nemotron_h' family is architecture-only"):
        adapter_for(model)


def test_importance_scores_every_sparse_part(model: Any, importance: Importance, tmp_path: Path) -> None:
    """Mamba-2 heads and shared channels where those exist, None elsewhere; frequencies sum to top-k."""
    for i in range(len(KINDS)):
        assert (importance.mamba_heads[i] is not None) == (i in MAMBA)
        assert (importance.shared_ffn[i] is not None) == (i in MOE)
    for i in MAMBA:
        assert importance.mamba_heads[i].shape == (8,) and bool((importance.mamba_heads[i] > 0).all())
    for i in MOE:
        assert importance.shared_ffn[i].shape == (32,) and importance.expert_ffn[i].shape == (8, 16)
        torch.testing.assert_close(importance.expert_frequency[i].sum(), torch.tensor(2.0, dtype=torch.float64))
    assert importance.heads[2].shape == (6,) and importance.ffn[4].shape == (48,)
    loaded = Importance.load(importance.save(tmp_path / "imp"))
    torch.testing.assert_close(loaded.mamba_heads[3], importance.mamba_heads[3])
    torch.testing.assert_close(loaded.shared_ffn[5], importance.shared_ffn[5])


def test_expert_forward_matches_the_latent_experts(model: Any) -> None:
    """Ungated relu² experts on the latent input: the routing-weighted per-expert recomputation is the module's."""
    parts = moe_adapter(model).layer_parts(model, 1)
    x = torch.randn(10, 48, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, weights, index = parts.router(x)
        latent = parts.latent_in(x)  # (10, 16)
        expected = parts.experts(latent, index, weights)
        got = torch.zeros_like(latent)
        for t in range(10):
            for slot in range(2):
                got[t] += weights[t, slot] * expert_forward(parts, int(index[t, slot]), latent[t : t + 1])[1][0]
    torch.testing.assert_close(got, expected)


def test_all_kept_masks_give_the_parent_logits(model: Any) -> None:
    masks = Masks.ones(moe_adapter(model).architecture(model))
    assert torch.equal(masked_logits(model, masks), logits(model))


def check_export(model: Any, imp: Importance, point: dict[str, int], out: Path) -> None:
    """The exported child of ``point`` has the point's sizes in its config and the masked parent's logits."""
    from transformers import AutoModelForCausalLM

    ref = logits(model)
    masks = expert_masks(model, imp, point)
    masked = masked_logits(model, masks)
    assert torch.equal(logits(model), ref)  # hooks and parametrizations are gone
    assert not torch.allclose(masked, ref)
    child = AutoModelForCausalLM.from_pretrained(export_experts(model, masks, out))
    c = child.config
    expected = {"num_experts": 8, "experts_per_token": 2, "expert_width": 16, "shared_width": 32, "mamba_heads": 8}
    expected |= point
    got = (c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size)
    assert got == (expected["num_experts"], expected["experts_per_token"], expected["expert_width"])
    assert (c.moe_shared_expert_intermediate_size, c.mamba_num_heads) == (
        expected["shared_width"],
        expected["mamba_heads"],
    )
    torch.testing.assert_close(logits(child), masked)
    assert num_params(child) == Architecture.from_hf_config(child.config).num_params


@pytest.mark.parametrize(
    "point",
    [
        {"mamba_heads": 4},
        {"num_experts": 5, "experts_per_token": 1, "expert_width": 8, "shared_width": 16, "mamba_heads": 6},
    ],
)
def test_exported_model_gives_the_masked_logits(
    model: Any, importance: Importance, tmp_path: Path, point: dict[str, int]
) -> None:
    check_export(model, importance, point, tmp_path / "child")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "overrides"),
    [
        ({"num_experts": 6, "expert_width": 12}, dict(norm_topk_prob=False, routed_scaling_factor=2.5)),
        ({"mamba_heads": 2, "num_experts": 3}, dict(moe_latent_size=None)),
    ],
)
def test_exported_model_of_other_router_and_latent_settings(
    tmp_path: Path, point: dict[str, int], overrides: dict[str, Any]
) -> None:
    """Unnormalised, scaled router weights; experts on the hidden state (no latent projections)."""
    model = hybrid_model(**overrides)
    imp = estimate_importance(model, tokens(4, 12), adapter=moe_adapter(model), progress=False)
    check_export(model, imp, point, tmp_path / "child")


def test_mamba_heads_are_kept_per_group(model: Any, importance: Importance) -> None:
    """4 of 8 heads in 2 groups: the 2 best of heads 0-3 and the 2 best of heads 4-7, in every Mamba-2 layer."""
    masks = expert_masks(model, importance, {"mamba_heads": 4})
    for i in MAMBA:
        keep = masks.layers[i].mamba_heads
        assert keep.reshape(2, 4).sum(-1).tolist() == [2, 2]
        for g in range(2):
            scores = importance.mamba_heads[i][4 * g : 4 * g + 4]
            assert set(torch.nonzero(keep[4 * g : 4 * g + 4]).flatten().tolist()) == set(
                torch.topk(scores, 2).indices.tolist()
            )
    assert all(masks.layers[i].experts.all() for i in MOE)


def with_mamba_heads(masks: Masks, keep: torch.Tensor) -> Masks:
    layers = tuple(replace(m, mamba_heads=keep) if m.mamba_heads is not None else m for m in masks.layers)
    return replace(masks, layers=layers)


def test_group_norm_is_recomputed_over_the_kept_heads(model: Any) -> None:
    """Zeroing heads at out_proj's input alone is not head removal: the gated norm's group statistic
    must drop them too (the masks' hook), or the logits differ from the sliced model's. Groups keeping
    different numbers of heads mask fine but have no plain config."""
    ones = Masks.ones(moe_adapter(model).architecture(model))
    uneven = with_mamba_heads(ones, torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool))  # 3 + 2
    assert torch.isfinite(masked_logits(model, uneven)).all()
    with pytest.raises(ConfigError, match=r"keeps \[3, 2\] heads in the layer's 2 groups; .* same number in every"):
        slice_experts(model, uneven)
    even = torch.tensor([1, 0, 1, 1, 1, 1, 0, 1], dtype=torch.bool)  # 3 + 3
    masks = with_mamba_heads(ones, even)
    masked = masked_logits(model, masks)
    torch.testing.assert_close(logits(slice_experts(model, masks)), masked)
    zero = lambda module, args: (args[0] * even.repeat_interleave(8),)  # heads' channels at out_proj's input
    handles = [model.model.layers[i].mixer.out_proj.register_forward_pre_hook(zero) for i in MAMBA]
    try:
        naive = logits(model)
    finally:
        for handle in handles:
            handle.remove()
    assert not torch.allclose(naive, masked, atol=1e-3)


def test_bad_points_and_masks_raise_clear_errors(model: Any, importance: Importance) -> None:
    with pytest.raises(
        ConfigError, match=r"mamba_heads=3 does not fit layer 0's 8 heads in 2 groups.*valid: 2, 4, 6, 8"
    ):
        expert_masks(model, importance, {"mamba_heads": 3})
    with pytest.raises(ConfigError, match=r"shared_width must be an int in \[1, 32\], got 40"):
        expert_masks(model, importance, {"shared_width": 40})
    with pytest.raises(ConfigError, match="unknown expert choice 'mamba_head' — did you mean 'mamba_heads'"):
        expert_masks(model, importance, {"mamba_head": 4})
    masks = expert_masks(model, importance, {"mamba_heads": 4})
    adapter = moe_adapter(model)
    empty_group = torch.tensor([1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.bool)
    bad = replace(masks, layers=(replace(masks.layers[0], mamba_heads=empty_group), *masks.layers[1:]))
    with pytest.raises(ConfigError, match=r"masks.layers\[0\].mamba_heads keeps \[2, 0\] heads"):
        apply_masks(model, bad, adapter=adapter)
    other = replace(
        masks, layers=(replace(masks.layers[0], mamba_heads=torch.ones(8, dtype=torch.bool)), *masks.layers[1:])
    )
    with pytest.raises(ConfigError, match="Mamba-2 layers keep different numbers of heads"):
        slice_experts(model, other)
    hidden = replace(masks, hidden=torch.arange(48) % 2 == 0)
    apply_masks(model, hidden, adapter=adapter).remove()  # masked in every layer kind (slice_hidden's reference)
    with pytest.raises(ConfigError, match="drop hidden channels; cut them first with slice_hidden"):
        slice_experts(model, hidden)
    heads = replace(
        masks, layers=(*masks.layers[:2], replace(masks.layers[2], heads=torch.arange(6) < 3), *masks.layers[3:])
    )
    with pytest.raises(ConfigError, match=r"prunes experts only: masks.layers\[2\].heads"):
        slice_experts(model, heads)


def test_group_limited_routing_is_refused_when_experts_drop(importance: Importance) -> None:
    grouped = hybrid_model(n_group=2, topk_group=1)
    masks = expert_masks(grouped, importance, {"num_experts": 6})
    with pytest.raises(ConfigError, match=r"group-limited routing \(n_group=2\)"):
        apply_masks(grouped, masks, adapter=moe_adapter(grouped))
