"""Learnable masks (masks.ParentMasks) on every family's structure, Gemma 3 in particular: all-ones
masks are the parent, hard masks are the materialised model, gradients reach every mask parameter
through the forward pass, and a gate scales a sub-block's residual contribution even where the
family normalises that contribution (Gemma 3's post-norms)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from mask_helpers import TOLERANCE, randomise
from tiny_families import tiny_model, tokens

from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.prune.slicing import materialize
from autocompress_opt.search.inner.relaxation import ParentMasks

# Gemma 3 (post-norms, (1 + w) norms, scaled tied embedding, mixed windows) and Llama (with biases) as
# the reference the inner search was first written for.
FAMILIES = ("gemma3_text", "llama")


class Parent:
    def __init__(self, family: str) -> None:
        self.model = tiny_model(family)
        self.arch = adapter_for(self.model).architecture(self.model)
        self.importance = estimate_importance(self.model, tokens(4, 12, seed=1), model_id=family, progress=False)


@pytest.fixture(scope="module", params=FAMILIES)
def parent(request: pytest.FixtureRequest) -> Parent:
    return Parent(request.param)


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def logits_with_outputs_scaled(model: Any, modules: Any, factor: float, ids: torch.Tensor) -> torch.Tensor:
    """The model's logits with every module in ``modules`` multiplying its output by ``factor``."""
    hooks = [m.register_forward_hook(lambda mod, args, out: out * factor) for m in modules]
    try:
        return logits(model, ids)
    finally:
        for h in hooks:
            h.remove()


def set_params(masks: ParentMasks, *, keep: float, log_alpha: float) -> ParentMasks:
    with torch.no_grad():
        for p in (masks.kv_keep, masks.q_keep, masks.ffn_keep):
            p.fill_(keep)
        for p in (masks.attn_log_alpha, masks.ffn_log_alpha):
            p.fill_(log_alpha)
    return masks


def test_all_ones_float_masks_reproduce_the_parent_exactly(parent: Parent) -> None:
    """At initialisation (parent start, full hidden size) every float mask is exactly 1 and the hooked
    parent's logits are bit-identical to the parent's."""
    masks = ParentMasks(parent.arch, parent.importance)
    live = masks.live(0.05, sample=False)
    for tensor in (live.attn_gate, live.ffn_gate, live.heads, live.ffn):
        assert torch.equal(tensor, torch.ones_like(tensor))
    ids = tokens(2, 10, seed=3)
    with masks.install(parent.model), masks.use(live):
        hooked = logits(parent.model, ids)
    assert torch.equal(hooked, logits(parent.model, ids))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hard_float_masks_equal_the_materialised_discrete_point(parent: Parent, seed: int) -> None:
    """Confident gates and τ → 0: the hooked parent computes the discrete point, i.e. what plan_pruning
    masks (apply_masks, whose bool masks are the discrete masks) and what materialize builds (hidden
    size pruned to 40 as well)."""
    masks = randomise(ParentMasks(parent.arch, parent.importance, hidden_size=40), seed)
    layers = masks.discrete()
    arch = masks.architecture(layers)
    if arch.num_active_layers == 0:
        pytest.skip("this draw drops every layer")
    ids = tokens(2, 10, seed=4)
    with masks.install(parent.model), masks.use(masks.live(0.0, sample=False)):
        hooked = logits(parent.model, ids)
    plan = plan_pruning(parent.arch, parent.importance, arch)
    for bool_mask, plan_mask in zip(masks.discrete_masks(layers).layers, plan.masks().layers):
        for a, b in ((bool_mask.heads, plan_mask.heads), (bool_mask.ffn, plan_mask.ffn)):
            assert (a is None and b is None) or torch.equal(a, b)
    tolerance = TOLERANCE.get(parent.arch.family, {})
    with apply_masks(parent.model, plan.masks()):
        torch.testing.assert_close(hooked, logits(parent.model, ids), **tolerance)
    torch.testing.assert_close(hooked, logits(materialize(parent.model, plan), ids), **tolerance)


def test_gradients_reach_every_mask_parameter_through_the_forward(parent: Parent) -> None:
    """A KL to the parent, differentiated through the hooked forward pass alone (no cost penalty),
    gives every mask parameter a finite, non-zero gradient; the frozen parent gets none."""
    masks = set_params(ParentMasks(parent.arch, parent.importance, hidden_size=40), keep=0.6, log_alpha=0.5)
    ids = tokens(2, 12, seed=5)
    teacher = torch.log_softmax(logits(parent.model, ids), dim=-1)  # (B, T, V)
    with masks.install(parent.model), masks.use(masks.live(0.5, sample=False)):
        student = torch.log_softmax(parent.model(ids).logits, dim=-1)
        loss = torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="batchmean")
        loss.backward()
    for name, p in masks.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert (p.grad != 0).all(), f"{name}: {p.grad}"
    assert all(p.grad is None for p in parent.model.parameters())


def test_a_gate_scales_the_residual_contribution(parent: Parent) -> None:
    """Half-open attention gates halve what each attention adds to the residual stream: the hooked model
    equals the parent whose attention contributions (Gemma: the post-attention norm's output, since
    that norm would undo any scaling before it) are multiplied by 0.5, and differs from the parent."""
    masks = ParentMasks(parent.arch, parent.importance)
    live = masks.live(0.05, sample=False)
    half = type(live)(attn_gate=live.attn_gate * 0.5, ffn_gate=live.ffn_gate, heads=live.heads, ffn=live.ffn)
    ids = tokens(2, 10, seed=6)
    with masks.install(parent.model), masks.use(half):
        gated = logits(parent.model, ids)
    parts = adapter_for(parent.model).all_layer_parts(parent.model)
    expected = logits_with_outputs_scaled(parent.model, [p.attn_residual for p in parts], 0.5, ids)
    torch.testing.assert_close(gated, expected, rtol=0, atol=0)
    assert (gated - logits(parent.model, ids)).abs().max() > 1e-2
    if parent.arch.family == "gemma3_text":  # scaling o_proj's output instead is (almost) a no-op there
        before_norm = logits_with_outputs_scaled(parent.model, [p.o_proj for p in parts], 0.5, ids)
        torch.testing.assert_close(before_norm, logits(parent.model, ids), rtol=1e-3, atol=1e-3)
