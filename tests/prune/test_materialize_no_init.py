"""materialize builds the child without random initialisation, on the parent's device: the same
model as the old path (transformers' random init on the CPU, then moved and overwritten), no
``_init_weights`` call, every tensor on the parent's device(s), every parameter copied."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from tiny_families import FAMILIES, tiny_hetero_model, tiny_model, tokens
from transformers import AutoModelForCausalLM, PreTrainedModel

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune import slicing
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.plan import PrunePlan, plan_pruning
from autocompress_opt.prune.slicing import materialize


def uniform_target(arch: Architecture) -> Architecture:
    """Two of three layers, one KV group of 3 heads, FFN 24, hidden 36: a plain model of the family."""
    base = replace(arch.layers[0], num_heads=3, num_kv_heads=1, ffn_width=24)
    return replace(arch, hidden_size=36, layers=(base, base))


def hetero_target(arch: Architecture) -> Architecture:
    """Per-layer widths, a removed attention, a removed FFN: the package's heterogeneous model."""
    return replace(
        arch,
        hidden_size=40,
        layers=(
            replace(arch.layers[0], num_heads=4, num_kv_heads=2, ffn_width=40),
            LayerSpec(attention=False, ffn=True, ffn_width=16),
            LayerSpec(True, 3, 1, 8, False, 0),
        ),
    )


def hetero_parent_target(arch: Architecture) -> Architecture:
    """For :func:`tiny_hetero_model`: prune its 4 layers (one dropped already) further."""
    return replace(
        arch,
        hidden_size=32,
        layers=(
            replace(arch.layers[0], ffn_width=8),
            replace(arch.layers[1], num_heads=2, num_kv_heads=1, ffn_width=20),
            LayerSpec.dropped(),
            arch.layers[3],
        ),
    )


CASES = [(f, "uniform") for f in FAMILIES] + [(f, "hetero") for f in FAMILIES] + [("qwen2", "hetero-parent")]


def case(family: str, kind: str) -> tuple[Any, PrunePlan]:
    """The parent of ``family`` (a hetero parent for ``hetero-parent``) and its pruning plan."""
    parent = tiny_hetero_model(family) if kind == "hetero-parent" else tiny_model(family)
    arch = adapter_for(parent).architecture(parent)
    importance = estimate_importance(parent, tokens(4, 10, seed=1), model_id="parent", progress=False)
    target = {"uniform": uniform_target, "hetero": hetero_target, "hetero-parent": hetero_parent_target}[kind](arch)
    return parent, plan_pruning(arch, importance, target)


def random_init_child(parent: Any, plan: PrunePlan) -> Any:
    """The child as materialize built it before: ``from_config`` (random initialisation on the CPU),
    ``.to(device)``, then every weight copied over."""
    adapter = adapter_for(parent)
    config = slicing._target_config(parent, adapter, plan, heterogeneous=False)
    weight = adapter.embedding(parent).weight
    attn = getattr(parent.config, "_attn_implementation", None)
    child = AutoModelForCausalLM.from_config(config, dtype=weight.dtype, attn_implementation=attn).to(weight.device)
    with torch.no_grad():
        slicing._copy_weights(parent, adapter, child, adapter_for(child), plan, set())
    return child.eval()


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens(2, 12, seed=3)).logits


@pytest.mark.parametrize("family, kind", CASES)
def test_the_child_equals_the_one_built_with_random_init(family: str, kind: str) -> None:
    """Same class, same parameters and buffers (rotary tables, Gemma's embedding scale), same logits."""
    parent, plan = case(family, kind)
    child, before = materialize(parent, plan), random_init_child(parent, plan)
    assert type(child) is type(before) and not child.training
    for named in ("named_parameters", "named_buffers"):
        now, then = dict(getattr(child, named)()), dict(getattr(before, named)())
        assert now.keys() == then.keys()
        for name, tensor in now.items():
            assert tensor.dtype == then[name].dtype and tensor.requires_grad == then[name].requires_grad, name
            assert torch.equal(tensor, then[name]), name
    torch.testing.assert_close(logits(child), logits(before), rtol=0, atol=0)


@pytest.mark.parametrize("family, kind", [("llama", "uniform"), ("gemma3_text", "uniform"), ("qwen3", "hetero")])
def test_no_weight_initialisation_runs(family: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the child class's ``_init_weights`` nor transformers' dispatcher runs while materialising."""
    parent, plan = case(family, kind)
    before = random_init_child(parent, plan)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a random weight initialisation ran")

    monkeypatch.setattr(type(before), "_init_weights", refuse)
    monkeypatch.setattr(PreTrainedModel, "_init_weights", refuse)
    monkeypatch.setattr(PreTrainedModel, "_initialize_weights", refuse)
    with pytest.raises(AssertionError, match="random weight initialisation"):  # the patch bites the old path
        random_init_child(parent, plan)
    torch.testing.assert_close(logits(materialize(parent, plan)), logits(before), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_every_tensor_on_the_parents_device_and_every_parameter_copied(family: str) -> None:
    """All parameters and buffers on the parent's device; layer 0's weights are the parent's slices,
    the embedding its kept columns (Gemma: times the embedding-scale ratio); tied weights stay tied."""
    parent, plan = case(family, "uniform")
    child = materialize(parent, plan)
    assert {t.device for t in [*child.parameters(), *child.buffers()]} == {parent.model.embed_tokens.weight.device}
    h, lp = torch.tensor(plan.hidden_channels), plan.layers[0]
    c, p = child.model.layers[0], parent.model.layers[lp.parent_index]
    ffn = torch.tensor(lp.ffn_channels)
    assert torch.equal(c.mlp.gate_proj.weight, p.mlp.gate_proj.weight[ffn][:, h])
    assert torch.equal(c.mlp.down_proj.weight, p.mlp.down_proj.weight[h][:, ffn])
    assert torch.equal(c.input_layernorm.weight, p.input_layernorm.weight[h])
    rows = (torch.tensor(lp.kv_heads)[:, None] * 8 + torch.arange(8)).flatten()  # head_dim 8
    assert torch.equal(c.self_attn.k_proj.weight, p.self_attn.k_proj.weight[rows][:, h])
    assert torch.equal(c.self_attn.k_proj.bias, p.self_attn.k_proj.bias[rows])
    embed, parent_embed = child.model.embed_tokens, parent.model.embed_tokens
    scale = float(parent_embed.embed_scale / embed.embed_scale) if family == "gemma3_text" else 1.0
    torch.testing.assert_close(embed.weight, parent_embed.weight[:, h] * scale)
    if family == "gemma3_text":
        assert child.lm_head.weight is embed.weight
    else:
        assert torch.equal(child.lm_head.weight, parent.lm_head.weight[:, h])


def test_a_parameter_left_uncopied_is_an_error_not_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uninitialised memory never reaches the caller: skipping the FFN copy fails, naming the weights."""
    parent, plan = case("qwen2", "uniform")
    monkeypatch.setattr(slicing, "_copy_ffn", lambda *args: None)
    with pytest.raises(RuntimeError, match=r"copied no weights into model\.layers\.0\.mlp\.gate_proj\.weight"):
        materialize(parent, plan)


# ------------------------------------------------------------------- a parent on several devices
def test_each_child_part_goes_where_its_parent_part_is() -> None:
    """A parent spread over devices (read from its parameters; ``meta`` stands for a second GPU)
    gives each kept layer its parent layer's device and the rest the embedding's; parameters get
    storage there, and the device map names every part."""
    parent, plan = case("llama", "hetero")
    parent.model.layers[plan.layers[1].parent_index].to("meta")
    config = slicing._target_config(parent, adapter_for(parent), plan, heterogeneous=False)
    child = AutoModelForCausalLM.from_config(config)  # the structure only
    adapter, child_adapter = adapter_for(parent), adapter_for(child)
    devices = slicing._child_devices(parent, adapter, child, child_adapter, plan)
    meta, cpu = torch.device("meta"), torch.device("cpu")
    layer = child_adapter.layers(child)[1]
    assert devices[id(layer)] == meta and {d for k, d in devices.items() if k != id(layer)} == {cpu}
    slicing._allocate(child, devices, cpu)
    on_meta = {n for n, t in [*child.named_parameters(), *child.named_buffers()] if t.device == meta}
    assert on_meta == {f"model.layers.1.{n}" for n, _ in [*layer.named_parameters(), *layer.named_buffers()]}
    assert all(p.requires_grad for p in child.parameters())
    rotary = {f"model.rotary_emb.{n}": cpu for n, _ in child.model.rotary_emb.named_children()}
    assert slicing._device_map(child, devices, cpu) == {
        "model.embed_tokens": cpu,
        "model.layers.0": cpu,
        "model.layers.1": meta,
        "model.layers.2": cpu,
        "model.norm": cpu,
        "lm_head": cpu,
        **rotary,
    }


@pytest.mark.parametrize("family, kind", [("gemma3_text", "uniform"), ("qwen2", "hetero")])
def test_dispatching_by_the_device_map_keeps_the_logits(family: str, kind: str) -> None:
    """accelerate's dispatch (what a child spread over GPUs gets) accepts the map, so it covers every
    tensor, and its hooks change nothing in the forward pass."""
    from accelerate import dispatch_model

    parent, plan = case(family, kind)
    child = materialize(parent, plan)
    before = logits(child)
    adapter, cpu = adapter_for(child), torch.device("cpu")
    devices = {id(m): cpu for m in (adapter.embedding(child), adapter.final_norm(child), *adapter.layers(child))}
    dispatch_model(child, device_map=slicing._device_map(child, devices, cpu), main_device=cpu, force_hooks=True)
    assert hasattr(child.model.layers[1], "_hf_hook")
    torch.testing.assert_close(logits(child), before, rtol=0, atol=0)
