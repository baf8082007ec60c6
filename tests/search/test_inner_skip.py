"""A sub-block whose gate is exactly 0 in a pass is skipped (ParentMasks.install(skip_off=True)):
the loss and every mask gradient are bit for bit those of computing it and multiplying by 0, in
every family the relaxation supports (post-norm Gemma 3 and our heterogeneous DeciLM included), with
and without activation checkpointing; and the skipped modules' projections are never called."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from inner_helpers import FAST
from tiny_families import BUILDERS, tokens

from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.search.inner.budget import Budget
from autocompress_opt.search.inner.inner_search import objective
from autocompress_opt.search.inner.relaxation import ParentMasks
from autocompress_opt.search.inner.teacher import teacher_log_probs


def _step(model: Any, masks: ParentMasks, rows: Any, teacher: Any, *, skip: bool, checkpointing: bool) -> tuple:
    """One training step's loss, mask gradients and how many projections ran."""
    masks.zero_grad(set_to_none=True)
    calls = [0]
    adapter = adapter_for(model)
    counters = [
        module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        for p in adapter.all_layer_parts(model)
        for module in (p.o_proj, p.down_proj)
        if module is not None
    ]
    try:
        with (
            masks.install(model, skip_off=skip),
            masks.checkpoint_layers(model) if checkpointing else contextlib.nullcontext(),
        ):
            loss, _kl, _ = objective(
                model,
                masks,
                rows,
                teacher,
                budget=Budget.of(masks.parent),
                goal=None,
                tau=0.5,
                duals={},
                config=FAST,
                generator=torch.Generator().manual_seed(0),
            )
            loss.backward()
    finally:
        for handle in counters:
            handle.remove()
    return loss.detach(), {n: p.grad.clone() for n, p in masks.named_parameters() if p.grad is not None}, calls[0]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_an_off_sub_block_is_skipped_with_the_same_loss_and_gradients(family: str, checkpointing: bool) -> None:
    model = BUILDERS[family]()
    arch = adapter_for(model).architecture(model)
    importance = estimate_importance(model, tokens(4, 12, seed=1), model_id=family, progress=False)
    rows = tokens(2, 12, seed=2)
    teacher = teacher_log_probs(model, rows, parent_id=family)
    masks = ParentMasks(arch, importance)
    with torch.no_grad():  # one layer's attention and another's FFN far off: their sampled gates clamp to 0
        masks.attn_log_alpha.fill_(4.0)
        masks.ffn_log_alpha.fill_(4.0)
        masks.attn_log_alpha[next(i for i, s in enumerate(arch.layers) if s.attention)] = -8.0
        masks.ffn_log_alpha[max(i for i, s in enumerate(arch.layers) if s.ffn)] = -8.0
    plain_loss, plain_grads, plain_calls = _step(model, masks, rows, teacher, skip=False, checkpointing=checkpointing)
    loss, grads, calls = _step(model, masks, rows, teacher, skip=True, checkpointing=checkpointing)
    assert calls < plain_calls  # something was skipped
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        assert torch.equal(grads[name], plain_grads[name]), name
    assert all("forward" not in vars(m) for m in model.modules())  # every wrapper removed
