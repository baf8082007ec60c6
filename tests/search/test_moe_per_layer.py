"""Per-layer MoE counts in the expert search (issue 43, the Puzzle case): on a tiny random Nemotron-H each
MoE layer learns its own expert width and experts per token under the point's parameter budgets; the
relaxation at τ → 0 routes exactly as the masked parent with those per-layer counts; a choice whose
rounding overshoots a budget is repaired back inside it; the result's architecture carries each layer's
sizes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from tiny_families import hybrid_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_kind_uniform
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.experts import expert_masks
from autocompress_opt.prune.importance import Importance, estimate_importance
from autocompress_opt.prune.masking import Masks, apply_masks
from autocompress_opt.quality.metrics import log_probs
from autocompress_opt.search.inner.expert_cost import expert_param_totals, param_budget, soft_prefix, soft_top_at
from autocompress_opt.search.inner.expert_counts import layer_architecture, repair_counts
from autocompress_opt.search.inner.experts import ExpertMasks, discretise_experts, search_experts
from autocompress_opt.search.inner.inner_search import InnerConfig

MOE = (1, 5)  # tiny_families.HYBRID's MoE layers (parent: 8 experts of 16 channels, top-2)
POINT = {"num_experts": 6, "experts_per_token": 1, "expert_width": 8, "shared_width": 32, "mamba_heads": 8}


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    return hybrid_model()


@pytest.fixture(scope="module")
def parent(model: Any) -> Architecture:
    return moe_adapter(model).architecture(model)


@pytest.fixture(scope="module")
def importance(model: Any) -> Importance:
    return estimate_importance(model, tokens(4, 12), adapter=moe_adapter(model), progress=False)


def _masks(model: Any, importance: Importance) -> ExpertMasks:
    start = expert_masks(model, importance, POINT)
    parts = moe_adapter(model).all_layer_parts(model)
    return ExpertMasks(parts, importance, POINT, start, scoring="sigmoid", per_layer=True)


def _set(masks: ExpertMasks, widths: tuple[float, float], ks: tuple[float, float]) -> None:
    assert masks.width_keep is not None and masks.topk_keep is not None
    with torch.no_grad():
        masks.width_keep.copy_(torch.tensor(widths) / masks.width_size)
        masks.topk_keep.copy_(torch.tensor(ks) / masks.route_size)


def test_soft_counts_are_the_fixed_count_masks_at_integers_and_move_with_the_count() -> None:
    scores = torch.tensor([[5.0, 1.0, 4.0, 2.0, 3.0]])
    count = torch.tensor([2.0], requires_grad=True)
    hard = soft_top_at(scores, count, 0.0)
    assert hard.tolist() == [[1.0, 0.0, 1.0, 0.0, 0.0]]
    soft = soft_top_at(scores, count, 0.1)
    assert torch.equal(soft.detach().round(), hard)  # the threshold sits midway between 4 and 3
    soft.sum().backward()
    assert count.grad is not None and float(count.grad) > 0  # a larger count keeps more
    route = soft_prefix(torch.tensor([1.0, 2.0]), 2, 0.0)
    assert route.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_param_totals_take_a_top_k_per_layer(parent: Architecture) -> None:
    f64 = lambda *v: torch.tensor(v, dtype=torch.float64)
    got = expert_param_totals(parent, f64(6, 6), f64(12, 4), f64(1, 2))
    moe = [layer.moe for layer in parent.layers if layer.moe is not None]
    sized = [replace(m, num_experts=6, expert_width=w, experts_per_token=k) for m, w, k in zip(moe, (12, 4), (1, 2))]
    d = parent.hidden_size
    assert float(got["total"]) == sum(s.params(d, parent.mlp_bias) for s in sized)
    assert float(got["active"]) == sum(s.active_params(d, parent.mlp_bias) for s in sized)


def test_sharp_per_layer_masks_route_like_apply_masks_with_each_layers_counts(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """Layer 1 keeps 12 channels per expert and routes to 1 expert, layer 5 keeps 4 and routes to 2: the
    relaxation at τ = 0 computes the masked parent's logits, and the architecture says so per layer."""
    masks = _masks(model, importance)
    _set(masks, (12.0, 4.0), (1.0, 2.0))
    chosen = discretise_experts(masks, parent)
    for i, width, k in zip(MOE, (12, 4), (1, 2)):
        kept = chosen.layers[i].experts
        assert int(kept.sum()) == 6 and chosen.layers[i].experts_per_token == k
        assert set(chosen.layers[i].expert_ffn[kept].sum(-1).tolist()) == {width}
    ids = tokens(2, 12, seed=5)
    with torch.no_grad(), masks.install(), masks.use(masks.live(0.0)):
        got = model(ids).logits
    torch.testing.assert_close(got, _masked(model, chosen, ids))
    arch = layer_architecture(parent, masks)
    sizes = [(layer.moe.expert_width, layer.moe.experts_per_token) for layer in arch.layers if layer.moe]
    assert sizes == [(12, 1), (4, 2)] and not is_kind_uniform(arch)


def test_a_rounding_overshoot_is_repaired_inside_the_budgets(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    masks = _masks(model, importance)
    budget = param_budget(parent, POINT)
    _set(masks, (9.6, 8.0), (1.0, 1.0))  # rounds to 10 + 8 channels: over the 8 + 8 of the point
    assert repair_counts(masks, parent, budget) == 2
    assert masks.layer_counts() == {"expert_width": [8, 8], "experts_per_token": [1, 1]}
    _set(masks, (8.0, 8.0), (1.6, 1.0))  # top-2 in layer 1: over the active budget, the top-k gives way
    assert repair_counts(masks, parent, budget) == 1
    assert masks.layer_counts()["experts_per_token"] == [1, 1]
    _set(masks, (8.4, 7.4), (1.0, 1.0))  # rounds down to 8 + 7: one channel of budget left, given back
    assert repair_counts(masks, parent, budget) == 0
    assert sum(masks.layer_counts()["expert_width"]) == 16


def test_the_per_layer_search_trades_width_between_layers_within_the_budgets(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """A short search moves the layers' counts apart (each by its own gradient), ends inside the point's
    budgets, and its architecture and masks agree layer by layer."""
    rows = tokens(8, 16, seed=3)
    with torch.no_grad():
        teacher = log_probs(model(rows).logits)
    config = InnerConfig(steps=12, batch_size=2, seq_len=16, n_samples=8, val_samples=2, gate_lr=1.0, lr=0.1)
    result = search_experts(
        model, parent, importance, rows, teacher, params=POINT, goal=None, config=config, per_layer=True
    )
    assert all(v <= 1e-9 for v in result.violations.values()) and result.feasible
    trained = result.candidates["trained"]
    widths = [int(trained.layers[i].expert_ffn[trained.layers[i].experts][0].sum()) for i in MOE]
    ks = [trained.layers[i].experts_per_token for i in MOE]
    assert result.layers["expert_width"] == widths and result.layers["experts_per_token"] == ks
    assert widths != [8, 8] or ks != [1, 1], result.layers  # the layers no longer keep the point's counts
    if result.selection["chosen"] == "trained":
        arch = result.architecture
        assert [layer.moe.expert_width for layer in arch.layers if layer.moe] == widths
    assert result.summary()["per_layer"]["expert_width"] == widths


def _masked(model: Any, masks: Masks, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), apply_masks(model, masks, adapter=moe_adapter(model)):
        return model(ids).logits
