"""Pruning plans, masked forwards and materialised models: the masked parent and the sliced child
compute the same logits (every family, uniform and heterogeneous targets, hidden-size pruning)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mask_helpers import TOLERANCE
from tiny_families import FAMILIES, tiny_hetero_model, tiny_model, tokens

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch
from autocompress_opt.hf.hetero_model import AutocompressDeciLMForCausalLM
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.masking import LayerMask, Masks, apply_masks
from autocompress_opt.prune.plan import identity_plan, plan_pruning
from autocompress_opt.prune.slicing import materialize, prune

PLAIN_CLASS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


class Parent:
    """A tiny random model of one family with its architecture and importance scores."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.arch = adapter_for(model).architecture(model)
        self.importance = estimate_importance(model, tokens(4, 10, seed=1), model_id="parent", progress=False)


@pytest.fixture(scope="module", params=FAMILIES)
def parent(request: pytest.FixtureRequest) -> Parent:
    return Parent(tiny_model(request.param))


@pytest.fixture(scope="module")
def hetero_parent() -> Parent:
    return Parent(tiny_hetero_model("qwen2"))


def logits(model: Any, masks: Masks | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    ids = tokens(2, 12, seed=3) if ids is None else ids
    with torch.no_grad():
        if masks is None:
            return model(ids).logits
        with apply_masks(model, masks):
            return model(ids).logits


def assert_equivalent(parent: Parent, target: Architecture) -> Any:
    """Materialise ``target``; its logits equal the masked parent's; its structure is the plan's: the
    target's sizes, with every kept layer's window that of its parent layer."""
    plan = plan_pruning(parent.arch, parent.importance, target)
    child = materialize(parent.model, plan)
    torch.testing.assert_close(
        logits(child), logits(parent.model, plan.masks()), **TOLERANCE.get(parent.arch.family, {})
    )
    assert architecture_mismatch(plan.architecture, adapter_for(child).architecture(child)) is None
    assert without_windows(plan.architecture) == without_windows(target.active())
    assert [s.window for s in plan.architecture.layers] == [
        parent.arch.layers[lp.parent_index].window if s.attention else None
        for lp, s in zip(plan.layers, plan.architecture.layers)
    ]
    return child


def without_windows(arch: Architecture) -> Architecture:
    return replace(arch, layers=tuple(replace(s, window=None) for s in arch.layers))


def layer(spec: LayerSpec, **changes: Any) -> LayerSpec:
    return replace(spec, **changes)


# --------------------------------------------------------------------------- equivalence
def test_uniform_target_is_a_plain_model_of_the_family(parent: Parent) -> None:
    """Same width everywhere (fewer layers, one KV group, narrower FFN and hidden) → plain family class."""
    base = parent.arch.layers[0]
    target = replace(parent.arch, hidden_size=40, layers=(layer(base, num_heads=3, num_kv_heads=1, ffn_width=24),) * 2)
    child = assert_equivalent(parent, target)
    family = parent.arch.family
    if family in ("llama", "gemma3_text"):  # their configs need hidden % heads == 0: 40 % 3 != 0 → hetero class
        assert isinstance(child, AutocompressDeciLMForCausalLM)
        target = replace(target, hidden_size=36)
        child = assert_equivalent(parent, target)
    assert type(child).__name__ == PLAIN_CLASS[family]


def test_heterogeneous_target_is_the_package_model(parent: Parent) -> None:
    """Per-layer widths, a removed attention, a removed FFN and a dropped layer → AutocompressDeciLM."""
    base = parent.arch.layers[0]
    target = replace(
        parent.arch,
        hidden_size=40,
        layers=(
            layer(base, num_heads=4, num_kv_heads=2, ffn_width=40),  # 2 of 3 query heads per group
            LayerSpec(attention=False, ffn=True, ffn_width=16),
            LayerSpec(True, 3, 1, 8, False, 0),
        ),
    )
    child = assert_equivalent(parent, target)
    assert isinstance(child, AutocompressDeciLMForCausalLM)
    assert child.config.base_family == parent.arch.family


def test_dropped_layers_and_hidden_pruning_only(parent: Parent) -> None:
    target = replace(
        parent.arch, hidden_size=24, layers=(parent.arch.layers[0], LayerSpec.dropped(), parent.arch.layers[2])
    )
    assert_equivalent(parent, target)


def target_strategy(parent_arch: Architecture) -> st.SearchStrategy[Architecture]:
    """Random sub-architectures: each layer kept, dropped, or with its own heads/FFN; any hidden size."""

    @st.composite
    def build(draw: Any) -> Architecture:
        layers = []
        for spec in parent_arch.layers:
            attention, ffn = draw(st.booleans()), draw(st.booleans())
            groups = draw(st.integers(1, spec.num_kv_heads))
            per_group = draw(st.integers(1, spec.num_heads // spec.num_kv_heads))
            layers.append(
                LayerSpec(
                    attention, groups * per_group, groups, spec.head_dim, ffn, draw(st.integers(1, spec.ffn_width))
                )
            )
        if all(s.is_noop for s in layers):
            layers[0] = parent_arch.layers[0]
        depth = draw(st.integers(1, len(layers)))
        kept = [s for s in layers if not s.is_noop][:depth] or [parent_arch.layers[0]]
        return replace(parent_arch, hidden_size=draw(st.integers(1, parent_arch.hidden_size)), layers=tuple(kept))

    return build()


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_sub_architecture_materialises_to_the_masked_logits(family: str, data: st.DataObject) -> None:
    """Property: for random sub-architectures (fewer layers picked by importance included), the sliced
    model's logits equal the masked parent's."""
    parent = _PARENTS.setdefault(family, Parent(tiny_model(family)))
    assert_equivalent(parent, data.draw(target_strategy(parent.arch)))


_PARENTS: dict[str, Parent] = {}


def test_all_ones_masks_reproduce_the_parent_exactly(parent: Parent) -> None:
    assert torch.equal(logits(parent.model, Masks.ones(parent.arch)), logits(parent.model))


def test_identity_plan_rebuilds_the_parent_exactly(parent: Parent) -> None:
    """Keeping everything copies every weight: same class, bit-identical logits."""
    child = materialize(parent.model, identity_plan(parent.arch))
    assert type(child) is type(parent.model)
    assert torch.equal(logits(child), logits(parent.model))


def test_hetero_parent_prunes_further(hetero_parent: Parent) -> None:
    """The package's own model is a valid parent: prune its remaining layers again."""
    arch = hetero_parent.arch
    target = replace(
        arch,
        hidden_size=32,
        layers=(
            layer(arch.layers[0], ffn_width=8),
            layer(arch.layers[1], num_heads=2, num_kv_heads=1, ffn_width=20),
            LayerSpec.dropped(),
            arch.layers[3],
        ),
    )
    child = assert_equivalent(hetero_parent, target)
    assert isinstance(child, AutocompressDeciLMForCausalLM)


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text"])
def test_hetero_parent_with_a_uniform_target_becomes_a_plain_model(family: str) -> None:
    """Only layer 1 of a hetero parent has both blocks; keeping just it is uniform → the plain family class,
    with the parent's numerics (Gemma: its 4-token window, local RoPE base, activation, attention scale)."""
    hetero_parent = Parent(tiny_hetero_model(family))
    arch, dropped = hetero_parent.arch, LayerSpec.dropped()
    target = replace(
        arch, layers=(dropped, layer(arch.layers[1], num_heads=2, num_kv_heads=1, ffn_width=16), dropped, dropped)
    )
    child = assert_equivalent(hetero_parent, target)
    assert type(child).__name__ == PLAIN_CLASS[family]
    if family == "gemma3_text":
        config = child.config
        assert (config.layer_types, config.sliding_window) == (["sliding_attention"], 4)
        assert (config.hidden_activation, config.query_pre_attn_scalar) == ("gelu_pytorch_tanh", 12)
        assert config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4


def test_mistral_sliding_window_carries_over() -> None:
    """A window of 4 tokens over 12-token inputs: both the plain and the heterogeneous child apply it."""
    parent = Parent(tiny_model("mistral", sliding_window=4))
    base = parent.arch.layers[0]
    uniform = replace(parent.arch, layers=(layer(base, ffn_width=16),) * 2)
    hetero = replace(parent.arch, layers=(layer(base, ffn_width=16), LayerSpec(True, 3, 1, 8, False, 0)))
    for target in (uniform, hetero):
        assert assert_equivalent(parent, target).config.sliding_window == 4


def test_naive_hidden_zeroing_is_not_slicing(parent: Parent) -> None:
    """Why masked hidden norms use kept-channel statistics: zeroing pruned residual channels while
    the parent's RMSNorms still average over all D channels gives different logits than the sliced
    model (each norm output is off by about sqrt(D'/D))."""
    target = replace(parent.arch, hidden_size=24)
    plan = plan_pruning(parent.arch, parent.importance, target)
    child = materialize(parent.model, plan)
    keep = plan.masks().hidden.float()
    adapter = adapter_for(parent.model)
    hooks = [adapter.embedding(parent.model).register_forward_hook(lambda m, a, o: o * keep)]
    for p in adapter.all_layer_parts(parent.model):
        hooks += [proj.register_forward_hook(lambda m, a, o: o * keep) for proj in (p.o_proj, p.down_proj)]
    naive = logits(parent.model)
    for h in hooks:
        h.remove()
    assert (naive - logits(child)).abs().max() > 1e-2


def test_mask_handle_removes_every_hook(parent: Parent) -> None:
    base = logits(parent.model)
    masks = plan_pruning(parent.arch, parent.importance, replace(parent.arch, hidden_size=20)).masks()
    handle = apply_masks(parent.model, masks)
    handle.remove()
    assert torch.equal(logits(parent.model), base)


# --------------------------------------------------------------------------------- plans
def test_kept_sets_are_prefixes_of_the_importance_order(parent: Parent) -> None:
    """Every kept channel/group scores at least as high as every dropped one."""
    imp, base = parent.importance, parent.arch.layers[0]
    target = replace(parent.arch, hidden_size=30, layers=(layer(base, num_heads=3, num_kv_heads=1, ffn_width=20),) * 3)
    plan = plan_pruning(parent.arch, imp, target)

    def is_prefix(scores: torch.Tensor, kept: tuple[int, ...]) -> bool:
        dropped = [i for i in range(len(scores)) if i not in kept]
        return not dropped or float(scores[list(kept)].min()) >= float(scores[dropped].max())

    assert is_prefix(imp.hidden, plan.hidden_channels)
    for lp in plan.layers:
        assert is_prefix(imp.ffn[lp.parent_index], lp.ffn_channels)
        assert is_prefix(imp.kv_groups[lp.parent_index], lp.kv_heads)
        assert lp.heads == tuple(range(lp.kv_heads[0] * 3, lp.kv_heads[0] * 3 + 3))  # whole group


def test_fewer_layers_keep_the_most_important(parent: Parent) -> None:
    """A 2-layer target of a 3-layer parent drops the layer with the lowest score of the chosen metric."""
    target = replace(parent.arch, layers=parent.arch.layers[:2])
    for metric in ("skip_loss", "block_influence"):
        weakest = int(torch.argmin(parent.importance.layer_scores(metric)))
        plan = plan_pruning(parent.arch, parent.importance, target, layer_metric=metric)
        assert [lp.parent_index for lp in plan.layers] == [i for i in range(3) if i != weakest]


def test_prune_is_plan_then_materialise(parent: Parent) -> None:
    target = replace(parent.arch, layers=parent.arch.layers[:2])
    child = prune(parent.model, parent.importance, target)
    plan = plan_pruning(parent.arch, parent.importance, target)
    torch.testing.assert_close(logits(child), logits(materialize(parent.model, plan)), rtol=0, atol=0)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda a: {"layers": (a.layers[0], layer(a.layers[1], ffn_width=49), a.layers[2])},
            r"layers\[1\] \(parent layer 1\) ffn_width=49 exceeds the parent's 48",
        ),
        (
            lambda a: {"layers": (layer(a.layers[0], num_heads=9, num_kv_heads=3),) + a.layers[1:]},
            r"layers\[0\].*num_kv_heads=3 exceeds the parent's 2",
        ),
        (
            lambda a: {"layers": (layer(a.layers[0], num_heads=8, num_kv_heads=2),) + a.layers[1:]},
            r"num_heads=8 is 4 query heads per KV head; the parent has 3",
        ),
        (
            lambda a: {"layers": (layer(a.layers[0], num_heads=3, num_kv_heads=1, head_dim=16),) + a.layers[1:]},
            r"head_dim=16 differs from the parent's 8",
        ),
        (lambda a: {"hidden_size": 64}, r"hidden_size=64 exceeds the parent's 48"),
        (lambda a: {"vocab_size": 50}, r"vocab_size=50 but the parent has 97"),
        (lambda a: {"tie_embeddings": True}, r"tie_embeddings=True"),
        (lambda a: {"layers": a.layers + a.layers[:1]}, r"4 layers but the parent has only 3"),
    ],
    ids=["ffn", "kv-heads", "group", "head-dim", "hidden", "vocab", "tying", "depth"],
)
def test_target_that_is_not_a_sub_architecture_is_rejected(change: Any, match: str) -> None:
    parent = _PARENTS.setdefault("llama", Parent(tiny_model("llama")))
    with pytest.raises(ConfigError, match="not a sub-architecture.*" + match):
        plan_pruning(parent.arch, parent.importance, replace(parent.arch, **change(parent.arch)))


def test_other_family_is_rejected() -> None:
    parent = _PARENTS.setdefault("llama", Parent(tiny_model("llama")))
    with pytest.raises(ConfigError, match="family='mistral' but the parent has 'llama'"):
        plan_pruning(
            parent.arch,
            parent.importance,
            replace(parent.arch, family="mistral", qkv_bias=True, o_bias=True, mlp_bias=True),
        )


def test_sub_block_the_parent_lacks_is_rejected(hetero_parent: Parent) -> None:
    arch = hetero_parent.arch
    target = replace(arch, layers=(LayerSpec(True, 2, 1, 8, True, 8),) + arch.layers[1:])
    with pytest.raises(ConfigError, match=r"layers\[0\] \(parent layer 0\) has attention=True but the parent layer"):
        plan_pruning(arch, hetero_parent.importance, target)


def test_importance_of_another_model_and_wrong_model_are_rejected() -> None:
    parent = _PARENTS.setdefault("llama", Parent(tiny_model("llama")))
    other = Parent(tiny_model("llama", intermediate_size=64))
    with pytest.raises(ConfigError, match=r"another architecture \(layers\[0\].ffn_width: expected 64, got 48\)"):
        plan_pruning(parent.arch, other.importance, parent.arch)
    with pytest.raises(ConfigError, match="not the plan's parent"):
        materialize(other.model, identity_plan(parent.arch))
    with pytest.raises(UnknownNameError, match="layer importance metric 'ppl'"):
        plan_pruning(
            parent.arch, parent.importance, replace(parent.arch, layers=parent.arch.layers[:1]), layer_metric="ppl"
        )


def test_masks_that_do_not_fit_are_rejected() -> None:
    parent = _PARENTS.setdefault("llama", Parent(tiny_model("llama")))
    ones = Masks.ones(parent.arch)
    bad_layer = Masks(
        layers=(LayerMask(torch.ones(5, dtype=torch.bool), ones.layers[0].ffn),) + ones.layers[1:], hidden=ones.hidden
    )
    with pytest.raises(ConfigError, match=r"masks.layers\[0\].heads has shape \(5,\), layer 0 needs \(6,\)"):
        apply_masks(parent.model, bad_layer)
    with pytest.raises(ConfigError, match="masks have 2 layers, the model has 3"):
        apply_masks(parent.model, Masks(layers=ones.layers[:2], hidden=ones.hidden))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in parent.model.modules())
