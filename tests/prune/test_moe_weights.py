"""Expert pruning of a tiny random Qwen3-MoE (issue 30, weights mode): expert importance, masks that
reroute among the kept experts, and the sliced plain checkpoint reloading with the masked logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import TINY_MOE, num_params, tiny_model, tiny_moe_importance, tiny_moe_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch, moe_adapter
from autocompress_opt.prune.experts import expert_masks, export_experts, slice_experts
from autocompress_opt.prune.importance import Importance, estimate_importance, expert_forward
from autocompress_opt.prune.masking import Masks, apply_masks


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    return tiny_moe_model()


@pytest.fixture(scope="module")
def importance(model: Any) -> Importance:
    return tiny_moe_importance(model)


def logits(model: Any, ids: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens(3, 14, seed=1) if ids is None else ids).logits


def test_generic_paths_still_refuse_the_family(model: Any) -> None:
    """Only the experts path takes a MoE parent; the rest keep refusing it by name."""
    with pytest.raises(ConfigError, match="architecture-only"):
        adapter_for(model)
    with pytest.raises(ConfigError, match="expert pruning does not handle model_type 'llama'.*qwen3_moe"):
        moe_adapter(tiny_model("llama"))


def test_adapter_reads_the_moe_layers_as_the_config_reader(model: Any) -> None:
    arch = moe_adapter(model).architecture(model)
    assert architecture_mismatch(Architecture.from_hf_config(model.config), arch) is None
    assert arch.num_params == num_params(model)
    assert [layer.ffn_kind for layer in arch.layers] == ["moe", "dense", "moe"]


def test_expert_importance_shapes_and_values(model: Any, importance: Importance) -> None:
    """Frequencies are fractions of tokens that sum to top-k; dense layers have none; the record round-trips."""
    assert importance.expert_frequency[1] is None and importance.ffn[1] is not None
    for i in (0, 2):
        freq, out, chans = importance.expert_frequency[i], importance.expert_output[i], importance.expert_ffn[i]
        assert freq.shape == out.shape == (8,) and chans.shape == (8, 16)
        torch.testing.assert_close(freq.sum(), torch.tensor(2.0, dtype=torch.float64))
        assert bool(((freq > 0) == (out > 0)).all()) and bool((chans >= 0).all())


def test_experts_never_routed_score_zero(tmp_path: Path) -> None:
    """Router rows ``a_e · u``: logit_e = a_e (u·x), so the top-2 is experts 0, 1 (u·x > 0) or 6, 7
    (u·x < 0), and experts 2..5 are never routed."""
    model = tiny_model("qwen3_moe", **TINY_MOE)
    scale = torch.tensor([4.0, 3.0, 1.0, 0.5, -0.5, -1.0, -3.0, -4.0])
    with torch.no_grad():
        for i in (0, 2):
            router = model.model.layers[i].mlp.gate
            router.weight.copy_(scale[:, None] * router.weight[0])
    imp = estimate_importance(model, tokens(4, 16), adapter=moe_adapter(model), progress=False)
    for i in (0, 2):
        used = imp.expert_frequency[i] > 0
        assert used.tolist() == [True, True, False, False, False, False, True, True]
        assert bool(((imp.expert_output[i] > 0) == used).all())
        assert bool((imp.expert_ffn[i][~used] == 0).all()) and bool((imp.expert_ffn[i][used].sum(-1) > 0).all())
    masks = expert_masks(model, imp, {"num_experts": 4})
    assert masks.layers[0].experts.tolist() == used.tolist()
    loaded = Importance.load(imp.save(tmp_path / "imp"))
    torch.testing.assert_close(loaded.expert_ffn[2], imp.expert_ffn[2])


def test_expert_forward_matches_the_experts_module(model: Any) -> None:
    """The scores' per-expert recomputation sums, routing-weighted, to what transformers computes."""
    parts = moe_adapter(model).layer_parts(model, 0)
    x = torch.randn(10, 48, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, weights, index = parts.router(x)
        expected = parts.experts(x, index, weights)
        got = torch.zeros_like(x)
        for t in range(10):
            for slot in range(2):
                got[t] += weights[t, slot] * expert_forward(parts, int(index[t, slot]), x[t : t + 1])[1][0]
    torch.testing.assert_close(got, expected)


def test_all_kept_masks_give_the_parent_logits(model: Any) -> None:
    ref = logits(model)
    masks = Masks.ones(moe_adapter(model).architecture(model))
    with apply_masks(model, masks, adapter=moe_adapter(model)):
        assert torch.equal(logits(model), ref)


@pytest.mark.parametrize(
    ("point", "norm_topk_prob"),
    [
        ({"num_experts": 5, "experts_per_token": 1, "expert_width": 8}, False),
        ({"num_experts": 6, "expert_width": 12}, True),
        ({"experts_per_token": 1}, False),
    ],
)
def test_exported_model_gives_the_masked_logits(tmp_path: Path, point: dict[str, int], norm_topk_prob: bool) -> None:
    from transformers import AutoModelForCausalLM

    model = tiny_model("qwen3_moe", **TINY_MOE, norm_topk_prob=norm_topk_prob)
    adapter = moe_adapter(model)
    imp = estimate_importance(model, tokens(4, 16), adapter=adapter, progress=False)
    ref = logits(model)
    masks = expert_masks(model, imp, point)
    with apply_masks(model, masks, adapter=adapter):
        masked = logits(model)
    assert torch.equal(logits(model), ref)  # the hooks and the parametrization are gone
    assert not torch.allclose(masked, ref)
    out = export_experts(model, masks, tmp_path / "child")
    child = AutoModelForCausalLM.from_pretrained(out)
    expected = {"num_experts": 8, "experts_per_token": 2, "expert_width": 16, **point}
    assert (child.config.num_experts, child.config.num_experts_per_tok, child.config.moe_intermediate_size) == (
        expected["num_experts"],
        expected["experts_per_token"],
        expected["expert_width"],
    )
    torch.testing.assert_close(logits(child), masked)
    assert num_params(child) == Architecture.from_hf_config(child.config).num_params


def test_bad_points_raise_clear_errors(model: Any, importance: Importance) -> None:
    with pytest.raises(ConfigError, match=r"experts_per_token=2 exceeds the 1 experts kept.*valid: 1\.\.1"):
        expert_masks(model, importance, {"num_experts": 1, "experts_per_token": 2})
    with pytest.raises(ConfigError, match="unknown expert choice 'num_expert' — did you mean 'num_experts'"):
        expert_masks(model, importance, {"num_expert": 4})
    with pytest.raises(ConfigError, match=r"expert_width must be an int in \[1, 16\], got 32"):
        expert_masks(model, importance, {"expert_width": 32})


def test_masks_that_do_not_fit_are_refused(model: Any, importance: Importance) -> None:
    from dataclasses import replace

    adapter = moe_adapter(model)
    masks = expert_masks(model, importance, {"num_experts": 4})
    too_many = replace(masks, layers=(replace(masks.layers[0], experts_per_token=5), *masks.layers[1:]))
    with pytest.raises(ConfigError, match=r"masks.layers\[0\].experts_per_token=5 does not fit the 4 experts"):
        apply_masks(model, too_many, adapter=adapter)
    uneven = replace(masks, layers=(*masks.layers[:2], replace(masks.layers[2], experts_per_token=1)))
    with pytest.raises(ConfigError, match="pruned to different sizes"):
        slice_experts(model, uneven)
    heads = replace(masks, layers=(replace(masks.layers[0], heads=torch.zeros(6, dtype=torch.bool)), *masks.layers[1:]))
    with pytest.raises(ConfigError, match=r"prunes experts only: masks.layers\[0\].heads"):
        slice_experts(model, heads)


def test_gate_mass_is_the_routing_weight_each_expert_gets_and_breaks_frequency_ties(
    model: Any, importance: Importance, tmp_path: Path
) -> None:
    """Per MoE layer the gate mass is zero exactly where no token routes, and sums to the mean routing
    weight of a token's top-k (``routing_mass``'s sum). Of two experts routed equally often, the one
    the router gives more weight is kept; a record written before the field loads with None."""
    from dataclasses import replace

    for i in (0, 2):
        gate, freq = importance.expert_gate_mass[i], importance.expert_frequency[i]
        assert gate.shape == (8,) and bool(((gate > 0) == (freq > 0)).all())
        torch.testing.assert_close(gate.sum(), importance.routing_mass[i].sum())
    assert importance.expert_gate_mass[1] is None
    freq = torch.tensor([0.5, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.0], dtype=torch.float64)
    gate = torch.tensor([0.3, 0.1, 0.2, 0.1, 0.1, 0.1, 0.1, 0.0], dtype=torch.float64)
    out = torch.tensor([1.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    tied = replace(
        importance,
        expert_frequency=(freq, None, freq),
        expert_gate_mass=(gate, None, gate),
        expert_output=(out, None, out),
    )
    kept = expert_masks(model, tied, {"num_experts": 2}).layers[0].experts
    assert kept.tolist() == [True, False, True, False, False, False, False, False]  # 2 over 1: more gate mass
    older = replace(tied, expert_gate_mass=())
    kept = expert_masks(model, older, {"num_experts": 2}).layers[0].experts
    assert kept.tolist() == [True, True, False, False, False, False, False, False]  # then: larger output
    loaded = Importance.load(replace(importance, expert_gate_mass=(None, None, None)).save(tmp_path / "old"))
    assert loaded.expert_gate_mass == (None, None, None)
    again = Importance.load(importance.save(tmp_path / "new"))
    torch.testing.assert_close(again.expert_gate_mass[2], importance.expert_gate_mass[2])
