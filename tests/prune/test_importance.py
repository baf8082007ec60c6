"""Minitron-style importance: shapes, meaning, determinism, safetensors round trip and the disk cache."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import FAMILIES, VOCAB, hybrid_model, tiny_hetero_model, tiny_model, tiny_moe_model, tokens

from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.hf.adapters import adapter_for, bypass_layer
from autocompress_opt.prune.importance import Importance, cache_path, estimate_importance, ranked, tokens_id


def score(model: torch.nn.Module, ids: torch.Tensor | None = None, **kwargs: object) -> Importance:
    options = {"model_id": "tiny", "progress": False, "batch_size": 2, **kwargs}
    return estimate_importance(model, tokens(4, 10) if ids is None else ids, **options)


@pytest.mark.parametrize("family", FAMILIES)
def test_shapes_follow_the_architecture(family: str) -> None:
    """Per layer (H,), (G,), (F,); model-wide (D,), (L,), (L,); magnitudes are positive and finite."""
    model = tiny_model(family)
    imp = score(model)
    arch = adapter_for(model).architecture(model)
    for i, layer in enumerate(arch.layers):
        assert imp.heads[i].shape == (layer.num_heads,) and imp.kv_groups[i].shape == (layer.num_kv_heads,)
        assert imp.ffn[i].shape == (layer.ffn_width,)
        assert (imp.heads[i] > 0).all() and (imp.ffn[i] > 0).all()
    assert imp.hidden.shape == (arch.hidden_size,) and (imp.hidden > 0).all()
    assert imp.block_influence.shape == imp.skip_loss.shape == (arch.num_layers,)
    assert torch.isfinite(imp.skip_loss).all() and torch.isfinite(torch.tensor(imp.meta.base_loss))


def test_kv_group_score_is_the_sum_of_its_query_heads() -> None:
    imp = score(tiny_model("llama"))
    for heads, groups in zip(imp.heads, imp.kv_groups):
        torch.testing.assert_close(groups, heads.view(2, 3).sum(-1))


def test_head_and_ffn_scores_are_mean_activation_magnitudes() -> None:
    """Head score = mean over tokens of ‖o_proj input of the head‖₂; FFN score = mean |down_proj input|."""
    model, ids = tiny_model("qwen3"), tokens(4, 10)
    parts = adapter_for(model).layer_parts(model, 1)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        parts.o_proj.register_forward_pre_hook(lambda m, a: seen.update(o=a[0].clone())),
        parts.down_proj.register_forward_pre_hook(lambda m, a: seen.update(f=a[0].clone())),
    ]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    imp = score(model, ids)
    expected_heads = seen["o"].unflatten(-1, (6, 8)).norm(dim=-1).double().mean(dim=(0, 1))  # (H,)
    torch.testing.assert_close(imp.heads[1], expected_heads)
    torch.testing.assert_close(imp.ffn[1], seen["f"].abs().double().mean(dim=(0, 1)))


def test_identity_layer_has_zero_influence_and_zero_skip_loss() -> None:
    """A layer whose attention and MLP write nothing (zero o_proj/down_proj, no biases) changes
    nothing: block influence 0 and skipping it costs no loss; the other layers do matter."""
    model = tiny_model("mistral")
    parts = adapter_for(model).layer_parts(model, 1)
    with torch.no_grad():
        parts.o_proj.weight.zero_()
        parts.down_proj.weight.zero_()
    imp = score(model)
    assert imp.skip_loss[1] == 0.0
    assert abs(float(imp.block_influence[1])) < 1e-6
    assert (imp.block_influence[[0, 2]] > 1e-3).all()
    assert (imp.skip_loss[[0, 2]].abs() > 1e-4).all()


def test_heterogeneous_model_has_no_scores_for_missing_blocks() -> None:
    """The package's DeciLM model: None where a layer lacks attention/FFN; a dropped layer scores 0."""
    imp = score(tiny_hetero_model("qwen3"))
    assert imp.heads[0] is None and imp.kv_groups[0] is None and imp.ffn[0].shape == (40,)
    assert imp.heads[1].shape == (4,) and imp.kv_groups[1].shape == (2,)
    assert imp.heads[2] is None and imp.ffn[2] is None and imp.skip_loss[2] == 0
    assert abs(float(imp.block_influence[2])) < 1e-6  # cos(x, x) = 1 up to float32 rounding
    assert imp.ffn[3] is None and imp.heads[3].shape == (3,)


def test_ranked_goes_from_the_highest_score_ties_to_the_lower_index() -> None:
    assert ranked(torch.tensor([1.0, 3.0, 3.0, 0.0, 1.0])).tolist() == [1, 2, 0, 4, 3]


def test_layer_order_ranks_present_layers_by_the_metric_and_dropped_ones_last() -> None:
    """Layers 0, 1, 3 of the heterogeneous model by score (ties to the lower index), then layer 2, which
    it drops entirely, whatever its score."""
    imp = score(tiny_hetero_model("qwen3"))
    f64 = lambda values: torch.tensor(values, dtype=torch.float64)
    scored = replace(imp, skip_loss=f64([0.5, 0.7, 0.9, 0.5]), block_influence=f64([0.1, 0.3, 0.9, 0.2]))
    assert scored.layer_order() == scored.layer_order("skip_loss") == [1, 0, 3, 2]
    assert scored.layer_order("block_influence") == [1, 3, 0, 2]
    with pytest.raises(UnknownNameError, match="layer importance metric 'loss'"):
        scored.layer_order("loss")


def test_deterministic_and_leaves_no_hooks() -> None:
    """Same model and tokens → bit-identical scores; the model's outputs are unchanged afterwards."""
    model, ids = tiny_model("qwen2"), tokens(4, 10)
    with torch.no_grad():
        before = model(ids).logits
    a, b = score(model, ids), score(model, ids)
    for name, ta in a._tensors().items():
        assert torch.equal(ta, b._tensors()[name]), name
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _skip_loss_by_full_passes(model: torch.nn.Module, ids: torch.Tensor, adapter: Any) -> torch.Tensor:
    """The definition: one full pass over the data per layer, that layer bypassed (it runs, its
    output is replaced by its input), minus the unpruned pass; every sum in batch order."""
    from autocompress_opt.prune.importance import _loss_sum

    batches, n = ids.split(2), ids.shape[0] * (ids.shape[1] - 1)
    with torch.inference_mode():
        base = sum(_loss_sum(model, b) for b in batches) / n
        out = []
        for layer in adapter.layers(model):
            handle = bypass_layer(layer)
            try:
                out.append(sum(_loss_sum(model, b) for b in batches) / n - base)
            finally:
                handle.remove()
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("make", [*FAMILIES, "hetero", "qwen3_moe", "nemotron_h"])
def test_skip_loss_equals_one_full_pass_per_bypassed_layer_with_half_the_layer_computations(make: str) -> None:
    """Layers before the skipped one return the input the full pass gave it instead of recomputing
    it: the same floats as the full-pass definition, bit for bit, with L + L(L - 1)/2 layer
    computations per batch instead of L(L + 1); every layer's forward is its own again afterwards."""
    from autocompress_opt.hf.adapters import moe_adapter

    makers = {"hetero": tiny_hetero_model, "qwen3_moe": tiny_moe_model, "nemotron_h": hybrid_model}
    model = makers[make]() if make in makers else tiny_model(make)
    adapter = moe_adapter(model) if make in ("qwen3_moe", "nemotron_h") else adapter_for(model)
    ids = tokens(4, 10)
    layers = list(adapter.layers(model))
    computed = [0]  # layer calls in which one of the layer's own modules ran
    ran = [False]

    def child_ran(*_: Any) -> None:
        ran[0] = True

    def layer_done(*_: Any) -> None:
        computed[0] += ran[0]
        ran[0] = False

    hooks = [layer.register_forward_hook(layer_done) for layer in layers]
    hooks += [child.register_forward_pre_hook(child_ran) for layer in layers for child in layer.children()]
    imp = score(model, ids, adapter=adapter)
    for handle in hooks:
        handle.remove()
    assert torch.equal(imp.skip_loss, _skip_loss_by_full_passes(model, ids, adapter))
    # layer j computes in the full pass and in the passes that skip a layer i < j (a heterogeneous
    # model's layer without blocks never computes); all layers: L + L(L - 1)/2 per batch
    active = [j for j, layer in enumerate(layers) if any(True for _ in layer.children())]
    assert computed[0] == 2 * sum(1 + j for j in active)
    if make == "hetero":
        assert len(active) < len(layers)
    else:
        assert computed[0] == 2 * (len(layers) + len(layers) * (len(layers) - 1) // 2)
    assert not any("forward" in vars(layer) for layer in layers)


def test_safetensors_and_json_round_trip(tmp_path: Path) -> None:
    """save() writes only safetensors + JSON; load() gives back the same record."""
    imp = score(tiny_hetero_model(), seed=7, data_id="unit-test")
    folder = imp.save(tmp_path / "imp")
    assert sorted(p.name for p in folder.iterdir()) == ["importance.json", "importance.safetensors"]
    assert json.loads((folder / "importance.json").read_text())["meta"]["seed"] == 7
    back = Importance.load(folder)
    assert back.meta == imp.meta and back.architecture == imp.architecture
    assert back._tensors().keys() == imp._tensors().keys()
    for name, tensor in imp._tensors().items():
        assert torch.equal(back._tensors()[name], tensor), name


def test_cache_is_reused_for_the_same_key(tmp_path: Path) -> None:
    """The second run with the same (model id, data id, method) reads the cache instead of computing:
    it returns the first scores even though the model's weights changed meanwhile."""
    model, ids = tiny_model("llama"), tokens(4, 10)
    first = score(model, ids, cache_dir=tmp_path)
    assert (cache_path(tmp_path, "tiny", tokens_id(ids), "minitron") / "importance.safetensors").is_file()
    with torch.no_grad():
        adapter_for(model).layer_parts(model, 0).up_proj.weight.mul_(3.0)  # triples the FFN activations
    again = score(model, ids, cache_dir=tmp_path)
    assert torch.equal(again.ffn[0], first.ffn[0])
    fresh = score(model, ids, cache_dir=tmp_path, data_id="other-data")
    assert not torch.equal(fresh.ffn[0], first.ffn[0])


def test_cache_key_includes_the_weights_dtype(tmp_path: Path) -> None:
    """The same model id and data in bf16 is another entry: its scores are computed in bf16, never
    read from the fp32 entry (bf16 may rank channels differently)."""
    model, ids = tiny_model("llama"), tokens(4, 10)
    fp32 = score(model, ids, cache_dir=tmp_path)
    bf16 = score(model.to(torch.bfloat16), ids, cache_dir=tmp_path)
    assert (cache_path(tmp_path, "tiny", tokens_id(ids), "minitron", "bf16") / "importance.safetensors").is_file()
    assert len(list(tmp_path.glob("minitron-*"))) == 2
    assert not torch.equal(bf16.hidden, fp32.hidden)


def test_cache_entry_for_another_architecture_is_refused(tmp_path: Path) -> None:
    ids = tokens(2, 8)
    score(tiny_model("llama"), ids, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="another architecture.*model_id"):
        score(tiny_model("llama", intermediate_size=64), ids, cache_dir=tmp_path)


def test_data_id_defaults_to_a_content_hash() -> None:
    a, b = tokens(2, 8, seed=0), tokens(2, 8, seed=1)
    assert tokens_id(a) == tokens_id(a.clone()) != tokens_id(b)
    assert score(tiny_model("llama"), a).meta.data_id == tokens_id(a)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros(2, 8), "LongTensor"),
        (torch.zeros(8, dtype=torch.long), "LongTensor"),
        (torch.zeros(2, 1, dtype=torch.long), "at least 1 row of 2 tokens"),
        (torch.full((2, 8), VOCAB, dtype=torch.long), rf"\[0, {VOCAB}\).*{VOCAB}"),
    ],
    ids=["float", "1-d", "too-short", "out-of-vocab"],
)
def test_bad_tokens_are_rejected(bad: torch.Tensor, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        score(tiny_model("llama"), bad)


def test_bad_options_are_rejected(tmp_path: Path) -> None:
    model = tiny_model("llama")
    with pytest.raises(UnknownNameError, match="unknown importance method 'gradient'.*minitron"):
        score(model, method="gradient")
    with pytest.raises(ConfigError, match="batch_size must be a positive int, got 0"):
        score(model, batch_size=0)
    with pytest.raises(ConfigError, match="model_id"):
        estimate_importance(model, tokens(), cache_dir=tmp_path, progress=False)
    with pytest.raises(UnknownNameError, match="layer importance metric 'loss'"):
        score(model).layer_scores("loss")


def test_load_refuses_a_foreign_sidecar(tmp_path: Path) -> None:
    (tmp_path / "importance.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ConfigError, match="not an importance file"):
        Importance.load(tmp_path)
