"""Plan-mode search over mixture-of-experts and hybrid Mamba-2 parents (issue 30, items 3-4): the
sparse global choices (experts kept, experts per token, expert and shared widths, Mamba-2 heads),
the uniform child they describe, and what the engines load of it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.hybrid import hybrid_child, is_kind_uniform, sparse_limits
from autocompress_opt.arch.search_space import SearchSpace, default_space
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.loadability import loadable_problems, parent_problems

SUPER = "nemotron-3-super-120b-a12b"
SPARSE_MODELS = [
    "nemotron-3-super-120b-a12b",
    "nemotron-3-nano-30b-a3b",
    "qwen3-30b-a3b",
    "gpt-oss-120b",
    "mixtral-8x7b",
]


def _top(space: SearchSpace) -> dict[str, int]:
    return {c.name: max(c.values) for c in space.choices}


@pytest.mark.parametrize("name", SPARSE_MODELS)
def test_the_largest_point_is_the_parent(name: str) -> None:
    """Every choice at its largest value keeps every parameter: the space starts at the parent."""
    parent = load_architecture(name)
    space = default_space(parent)
    space.check_parent(parent)
    child = space.architecture(_top(space), parent)
    assert child.num_params == parent.num_params
    assert child.active_params() == parent.active_params()


def test_super_space_has_a_choice_per_sub_block_kind() -> None:
    parent = load_architecture(SUPER)
    space = default_space(parent)
    # Nemotron 3 Super: attention, latent MoE with a shared expert, Mamba-2; no dense FFN layer.
    assert set(space.names) == {
        "num_layers",
        "hidden_size",
        "num_kv_heads",
        "q_per_kv",
        "num_experts",
        "experts_per_token",
        "expert_width",
        "shared_width",
        "mamba_heads",
    }
    assert sparse_limits(parent)["num_experts"] == 512
    assert all(h % 8 == 0 for h in space["mamba_heads"].values)  # multiples of its 8 groups


def test_dropping_experts_removes_exactly_their_parameters() -> None:
    """512 -> 320 routed experts in each of Super's 40 MoE layers removes 40 x 192 experts. Each
    non-gated relu² expert over the 1024-wide latent is up (2688 x 1024) + down (1024 x 2688) =
    5,505,024 parameters, so 40 x 192 x 5,505,024 = 42,278,584,320 fewer; active parameters are
    unchanged at the same top-22 (the router shrinks by 192 x 4096 per layer = 31,457,280 in all)."""
    parent = load_architecture(SUPER)
    space = default_space(parent)
    child = space.architecture({**_top(space), "num_experts": 320}, parent)
    assert parent.num_params - child.num_params == 42_278_584_320 + 31_457_280
    assert parent.active_params() - child.active_params() == 31_457_280


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_sampled_point_is_a_valid_smaller_model(data: st.DataObject) -> None:
    """Property: any point of the default space is a sub-architecture (never more parameters, kinds
    kept per layer, top-k never above the experts kept) that vLLM loads as the family's config."""
    parent = load_architecture(data.draw(st.sampled_from(SPARSE_MODELS)))
    space = default_space(parent)
    point = {c.name: data.draw(st.sampled_from(c.values)) for c in space.choices}
    child = space.architecture(point, parent)
    assert child.num_params <= parent.num_params
    assert child.num_active_layers == point["num_layers"]
    for mine, theirs in zip(child.layers, parent.layers, strict=True):
        if mine.is_noop:
            continue
        assert (mine.mixer, mine.ffn_kind) == (theirs.mixer, theirs.ffn_kind)
        if mine.moe is not None:
            assert mine.moe.experts_per_token <= mine.moe.num_experts
    assert is_kind_uniform(child)
    assert loadable_problems(child, "vllm") == parent_problems(parent, "vllm")


def test_per_layer_sizes_of_a_moe_family_are_refused_by_the_engines() -> None:
    """The family's plain config holds one size per layer kind; two MoE layers of different expert
    counts need the per-layer Puzzle form, which is not written yet."""
    parent = load_architecture("qwen3-30b-a3b")
    layers = list(parent.layers)
    assert layers[0].moe is not None
    layers[0] = replace(layers[0], moe=replace(layers[0].moe, num_experts=64))
    mixed = replace(parent, layers=tuple(layers))
    assert not is_kind_uniform(mixed)
    assert any("one size per layer kind" in p for p in loadable_problems(mixed, "vllm"))


def test_bad_sparse_choices_are_named() -> None:
    parent = load_architecture(SUPER)
    space = default_space(parent)
    with pytest.raises(ConfigError, match="mamba_heads=100 is not a multiple of the parent's Mamba-2 groups \\(8\\)"):
        space.architecture({**_top(space), "mamba_heads": 100}, parent)
    too_many = SearchSpace.from_dict({**space.to_dict(), "num_experts": [256, 1024]})
    with pytest.raises(ConfigError, match="num_experts choice 1024 is larger than the parent's 512"):
        too_many.check_parent(parent)
    lacking = {k: v for k, v in space.to_dict().items() if k != "mamba_heads"}
    with pytest.raises(ConfigError, match="missing mamba_heads"):
        SearchSpace.from_dict(lacking).check_parent(parent)
    dense = load_architecture("smollm2-135m")
    with pytest.raises(ConfigError, match="sizes MoE / Mamba-2 layers .* but smollm2-135m has none"):
        space.check_parent(dense)


def test_a_sparse_space_survives_its_yaml_form() -> None:
    space = default_space(load_architecture("nemotron-3-nano-30b-a3b"))
    assert SearchSpace.from_dict(space.to_dict()) == space


def test_hybrid_child_keeps_kinds_and_drops_the_rest() -> None:
    parent = load_architecture("nemotron-3-nano-30b-a3b")
    kept = [i for i, layer in enumerate(parent.layers) if not layer.is_noop][:10]
    child = hybrid_child(parent, kept_layers=kept, point={"hidden_size": 2048, "num_experts": 64})
    assert isinstance(child, Architecture) and child.hidden_size == 2048
    assert child.num_active_layers == 10
    assert {layer.moe.num_experts for layer in child.layers if layer.moe is not None} == {64}
    with pytest.raises(ConfigError, match="each once"):
        hybrid_child(parent, kept_layers=[0, 0], point={})
