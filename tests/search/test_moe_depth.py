"""Depth and heads on MoE and hybrid parents (issue 43): a weights trial whose point keeps fewer layers
or attention heads than the parent cuts them first (``slice_layers``, the layers chosen as plan mode
chooses them; ``slice_heads``, the heads a dense plan keeps), runs the expert search on what is left,
records what it kept, and ``export_trial`` writes that child."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import TINY_MOE, hybrid_model, tiny_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import depth_layers
from autocompress_opt.arch.search_space import uniform_allocation
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.expert_kept import EXPERT_KEPT_DEPTH, expert_kept, kept_layers, kept_model
from autocompress_opt.prune.experts import (
    expert_masks,
    head_choice,
    head_masks,
    slice_experts,
    slice_heads,
    slice_layers,
)
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.masking import LayerMask, Masks, apply_masks
from autocompress_opt.serving.targets import Target

TARGET = Target("h100-sxm", "datacenter", constraints={"output_throughput_tok_s": "1x", "active_params": "0.95x"})
INNER = {
    "steps": 2,
    "n_samples": 4,
    "val_samples": 1,
    "seq_len": 16,
    "eval_samples": 2,
    "eval_seq_len": 16,
    "importance_samples": 2,
    "importance_seq_len": 16,
}


def _skipped(arch: Architecture, drop: set[int]) -> Masks:
    """Masks that keep everything but skip the layers ``drop`` (every sub-block None)."""
    ones = Masks.ones(arch)
    return replace(ones, layers=tuple(LayerMask(None, None) if i in drop else m for i, m in enumerate(ones.layers)))


@pytest.mark.parametrize(
    ("family", "overrides", "keep"),
    [
        ("qwen3_moe", TINY_MOE, [0, 1]),  # layer 1 is dense (mlp_only): the child's own index of it moves
        ("qwen3_moe", TINY_MOE, [1, 2]),
        ("mixtral", {}, [0, 2]),
        ("nemotron_h", {}, [0, 2, 3]),
    ],
)
def test_a_layer_cut_computes_the_parent_with_the_other_layers_skipped(
    family: str, overrides: dict[str, Any], keep: list[int]
) -> None:
    model = tiny_model(family, **overrides).eval()
    adapter = moe_adapter(model)
    arch = adapter.architecture(model)
    cut = slice_layers(model, keep)
    assert adapter.architecture(cut).layers == tuple(arch.layers[i] for i in keep)  # each kind where it was
    ids = tokens(2, 12, seed=3)
    drop = set(range(arch.num_layers)) - set(keep)
    with torch.no_grad():
        with apply_masks(model, _skipped(arch, drop), adapter=adapter):
            skipped = model(ids).logits
        torch.testing.assert_close(cut(ids).logits, skipped)
    assert all(p.data_ptr() != q.data_ptr() for p in cut.parameters() for q in model.parameters())


@pytest.mark.parametrize(("family", "overrides"), [("qwen3_moe", TINY_MOE), ("mixtral", {}), ("nemotron_h", {})])
def test_a_head_cut_computes_the_parent_with_the_other_heads_masked(family: str, overrides: dict[str, Any]) -> None:
    model = (hybrid_model() if family == "nemotron_h" else tiny_model(family, **overrides)).eval()
    adapter = moe_adapter(model)
    arch = adapter.architecture(model)
    importance = estimate_importance(model, tokens(2, 16, seed=1), adapter=adapter, progress=False)
    heads = head_choice(importance, arch, 1, 2)  # one KV group of two query heads, in every attention layer
    cut = slice_heads(model, heads)
    built = moe_adapter(cut).architecture(cut)
    assert all(
        (b.num_heads, b.num_kv_heads, b.head_dim) == (2, 1, a.head_dim)
        for a, b in zip(arch.layers, built.layers)
        if a.attention
    )
    masks = head_masks(Masks.ones(arch), arch, heads)
    ids = tokens(2, 12, seed=3)
    with torch.no_grad():
        with apply_masks(model, masks, adapter=adapter):
            masked = model(ids).logits
        torch.testing.assert_close(cut(ids).logits, masked)
    first = min(heads)
    with pytest.raises(ConfigError, match="same number of query heads"):
        slice_heads(model, {**heads, first: [0, 1, 3]})  # two heads of group 0, one of group 1
    with pytest.raises(ConfigError, match="every attention layer"):
        slice_heads(model, {first: heads[first]} if len(heads) > 1 else {})


def test_a_hybrid_layer_cut_keeps_each_layer_kind_and_refuses_bad_lists() -> None:
    model = hybrid_model().eval()
    cut = slice_layers(model, [0, 1, 2, 5])
    assert list(cut.config.layers_block_type) == ["linear_attention", "moe", "full_attention", "moe"]
    with pytest.raises(ConfigError, match=r"kept layer=9.*0\.\.5|kept layer"):
        slice_layers(model, [0, 9])
    with pytest.raises(ConfigError, match=r"give each layer once"):
        slice_layers(model, [1, 1])


def test_depth_keeps_a_moe_and_an_attention_layer_and_plan_mode_keeps_the_same_layers() -> None:
    """The first layers of the ranking, but a MoE parent's child keeps at least one MoE layer (the sparse
    choices apply to it) and one attention layer (transformers' Nemotron-H needs one): the best-ranked
    of a missing kind takes the place of the last-ranked layer that is not the only one of its kind."""
    model = hybrid_model()
    arch = moe_adapter(model).architecture(model)  # kinds: M, E, *, M, -, E
    ranked = [0, 2, 3, 4, 1, 5]  # both MoE layers (1, 5) ranked last
    assert depth_layers(arch, 3, ranked) == [0, 1, 2]
    assert depth_layers(arch, 5, ranked) == [0, 1, 2, 3, 4]
    assert depth_layers(arch, 3, [0, 3, 4, 5, 1, 2]) == [0, 2, 5]  # attention (2) in; MoE (5) and layer 0 stay
    assert depth_layers(arch, 3, [2, 3, 4, 1, 5, 0]) == [0, 1, 2]  # layer 0 in for the last ranked (3, then 4)
    point = {"num_layers": 3, "hidden_size": arch.hidden_size}
    child = uniform_allocation(point, arch, ranked)
    assert [i for i, layer in enumerate(child.layers) if not layer.is_noop] == [0, 1, 2]


def test_a_depth_record_names_the_kept_layers_and_is_read_back() -> None:
    model = hybrid_model().eval()
    keep = [0, 1, 2, 5]
    cut = slice_layers(model, keep)
    arch = moe_adapter(cut).architecture(cut)
    importance = estimate_importance(
        cut, tokens(2, 16, seed=1), batch_size=2, model_id="cut", adapter=moe_adapter(cut), progress=False
    )
    masks = expert_masks(cut, importance, {"num_experts": 4, "expert_width": 8, "mamba_heads": 4})
    record = expert_kept(masks, arch, keep)
    assert record["format"] == EXPERT_KEPT_DEPTH and record["kept_layers"] == keep
    assert (
        kept_layers(record, 6) == keep and kept_layers({**record, "format": "autocompress-kept-experts/2"}, 6) is None
    )
    again, back = kept_model(model, record)
    ids = tokens(2, 12, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(slice_experts(again, back)(ids).logits, slice_experts(cut, masks)(ids).logits)
    for bad in ([5, 0, 1, 2], [0, 1, 2, 9], []):
        with pytest.raises(ConfigError, match="kept_layers"):
            kept_layers({**record, "kept_layers": bad}, 6)
    with pytest.raises(ConfigError, match="layers_kept"):
        expert_kept(masks, arch, [0, 1, 2])


@pytest.mark.parametrize("family", ["qwen3_moe", "nemotron_h"])
def test_a_weights_trial_cuts_depth_first_and_exports_its_own_child(family: str, tmp_path: Path) -> None:
    """A point of fewer layers than the parent: the trial's architecture drops the layers that depth
    ranks last (a MoE layer kept), its kept record names the layers it kept, its quality is the child's,
    and ``export_trial`` writes a model with that child's logits."""
    from tiny_lm import save_hf_dir

    from autocompress_opt.arch.hybrid import sparse_limits
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.search.study.export import export_trial
    from autocompress_opt.search.study.weights_trial import run_weights_trial

    model = (
        tiny_model("qwen3_moe", **TINY_MOE, vocab_size=260) if family == "qwen3_moe" else hybrid_model(vocab_size=260)
    )
    model_dir = save_hf_dir(model, tmp_path / family)
    loaded = load_model(model_dir)
    parent = loaded.architecture
    params = {**sparse_limits(parent), "num_layers": parent.num_layers - 1, "num_experts": 4, "num_kv_heads": 1}
    result = run_weights_trial(
        {
            "mode": "weights",
            "params": params,
            "parent": parent.to_dict(),
            "target": TARGET.to_dict(),
            "layer_order": None,
            "seed": 0,
            "parent_model": str(model_dir),
            "cache_dir": str(tmp_path / "cache"),
            "inner": INNER,
        }
    )
    arch = Architecture.from_dict(result["architecture"])
    assert len(arch.layers) == parent.num_layers and sum(layer.is_noop for layer in arch.layers) == 1
    kept = result["kept"]
    assert kept["format"] == EXPERT_KEPT_DEPTH
    assert kept["kept_layers"] == [i for i, layer in enumerate(arch.layers) if not layer.is_noop]
    assert kept["kept_heads"] and all(len(heads) == 3 for _, heads in kept["kept_heads"])  # 1 KV group of 3
    assert {layer.num_kv_heads for layer in arch.layers if layer.attention} == {1}
    assert any(arch.layers[i].moe is not None for i in kept["kept_layers"])
    assert result["inner"]["form"] == "experts" and result["kl_to_parent"] > 0
    child = exported_as_kept(loaded, arch, kept, tmp_path / "export")
    assert child.config.num_hidden_layers == parent.num_layers - 1 and child.config.num_key_value_heads == 1
    with pytest.raises(ConfigError, match="keeps layers"):  # a record of other layers than the architecture's
        export_trial(loaded, arch, tmp_path / "other", kept={**kept, "kept_layers": kept["kept_layers"][::-1][:1]})


def exported_as_kept(loaded: Any, arch: Architecture, kept: dict[str, Any], out: Path) -> Any:
    """``export_trial`` of a trial's architecture and kept record, loaded back: asserts its logits equal
    the parent cut as the record says (``kept_model``) under the record's masks."""
    from transformers import AutoModelForCausalLM

    from autocompress_opt.search.study.export import export_trial

    child = AutoModelForCausalLM.from_pretrained(export_trial(loaded, arch, out, kept=kept).path).eval()
    cut, masks = kept_model(loaded.model, kept)
    ids = tokens(2, 12, seed=8)
    with torch.no_grad(), apply_masks(cut, masks, adapter=moe_adapter(cut)):
        masked = cut(ids).logits
    with torch.no_grad():
        torch.testing.assert_close(child(ids).logits, masked)
    return child


def test_a_puzzle_parent_cut_in_depth_keeps_each_layers_own_expert_sizes() -> None:
    """A Nemotron-H Puzzle model (each MoE layer its own width and top-k) cut to some layers: its
    block_configs keep the kept layers' entries, and it computes the Puzzle parent with the others skipped."""
    from puzzle_helpers import per_layer_masks

    model = hybrid_model().eval()
    importance = estimate_importance(
        model, tokens(2, 16, seed=1), batch_size=2, model_id="h", adapter=moe_adapter(model), progress=False
    )
    base = {"num_experts": 6, "expert_width": 8, "experts_per_token": 2}
    puzzle = slice_experts(model, per_layer_masks(model, importance, base, {5: {"expert_width": 16}}))
    assert puzzle.config.model_type == "nemotron_h_puzzle"
    cut = slice_layers(puzzle, [0, 2, 5])
    assert cut.config.model_type == "nemotron_h_puzzle"
    assert [b["block_type"] for b in cut.config.block_configs] == ["mamba", "attention", "moe"]
    assert cut.config.block_configs[2]["moe_intermediate_size"] == 16
    arch = moe_adapter(puzzle).architecture(puzzle)
    ids = tokens(2, 12, seed=3)
    with torch.no_grad():
        with apply_masks(puzzle, _skipped(arch, {1, 3, 4}), adapter=moe_adapter(puzzle)):
            skipped = puzzle(ids).logits
        torch.testing.assert_close(cut(ids).logits, skipped)


def _trial(tmp_path: Path, params_of: Any, model: Any = None) -> tuple[Any, dict[str, Any]]:
    """A weights trial of the point ``params_of(parent)`` on ``model`` (default a tiny Qwen3-MoE),
    saved as ``tmp_path / "moe"``: the parent's architecture and the result."""
    from tiny_lm import save_hf_dir

    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.search.study.weights_trial import run_weights_trial

    model = tiny_model("qwen3_moe", **TINY_MOE, vocab_size=260) if model is None else model
    model_dir = save_hf_dir(model, tmp_path / "moe")
    parent = load_model(model_dir).architecture
    request = {
        "params": params_of(parent),
        "parent": parent.to_dict(),
        "target": TARGET.to_dict(),
        "seed": 0,
        "parent_model": str(model_dir),
        "cache_dir": str(tmp_path / "cache"),
        "inner": INNER,
    }
    return parent, run_weights_trial(request)


def test_a_trial_that_keeps_every_expert_and_cuts_only_heads_completes(tmp_path: Path) -> None:
    """Every expert, width and top-k at the parent's: the expert search has nothing to learn (no score
    moves a mask), so its start is the choice; the heads are still cut."""
    from autocompress_opt.arch.hybrid import sparse_limits

    parent, result = _trial(tmp_path, lambda p: {**sparse_limits(p), "q_per_kv": 1})
    arch = Architecture.from_dict(result["architecture"])
    assert {(layer.num_heads, layer.num_kv_heads) for layer in arch.layers} == {(2, 2)}
    assert "kept_layers" not in result["kept"] and len(result["kept"]["kept_heads"]) == parent.num_layers
    assert result["selection"]["val_kl"]["trained"] == pytest.approx(result["selection"]["val_kl"]["start"])


def test_a_point_routing_to_more_experts_than_it_keeps_is_capped_as_plan_mode_caps_it(tmp_path: Path) -> None:
    """The sampler may propose top-k above the experts kept (both are choices of the space): the trial
    caps it, as the plan-mode child and the proxy do, instead of failing the trial."""
    from autocompress_opt.arch.hybrid import sparse_limits

    parent, result = _trial(tmp_path, lambda p: {**sparse_limits(p), "num_experts": 1, "experts_per_token": 2})
    params = {**sparse_limits(parent), "num_experts": 1, "experts_per_token": 2}
    arch = Architecture.from_dict(result["architecture"])
    assert {(layer.moe.num_experts, layer.moe.experts_per_token) for layer in arch.layers if layer.moe} == {(1, 1)}
    assert arch == replace(uniform_allocation(params, parent), name=arch.name)


def test_the_depth_seed_of_a_moe_study_names_a_depth_below_the_spaces_floor() -> None:
    """The deepest point with every other choice at the space's largest is the ``depth`` seed; when that
    depth is below the space's floor the seed says how deep and which --space reaches it."""
    from autocompress_opt.arch.search_space import Choice
    from autocompress_opt.prune.baselines import expert_seeds
    from autocompress_opt.search.study.config import expert_space

    model = tiny_model("qwen3_moe", **TINY_MOE)
    parent = moe_adapter(model).architecture(model)
    space = expert_space(parent)  # num_layers 2..3
    two = lambda arch: sum(not layer.is_noop for layer in arch.layers) <= 2  # a target only two layers meet
    assert expert_seeds(space, parent, two, None)["depth"]["point"]["num_layers"] == 2
    one = lambda arch: sum(not layer.is_noop for layer in arch.layers) <= 1
    narrow = replace(
        space, choices=tuple(Choice("num_layers", (2, 3)) if c.name == "num_layers" else c for c in space.choices)
    )
    skipped = expert_seeds(narrow, parent, one, None)["depth"]["skipped"]
    assert "keeps 1 layers, below the space's depth floor of 2" in skipped and "--space" in skipped
