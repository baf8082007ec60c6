"""A trial whose hidden size is below the parent's trains its masks on the parent cut to that hidden
size once (``search(slice_hidden=True)``, issue 41) instead of on the parent under a hidden-channel
mask: in every family the relaxation supports, the same chosen architecture, the same per-step
training KL and the same choice-row KLs up to float32 rounding; the cut model is built once per
parent and hidden size, and nothing of it is left on the parent."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from inner_helpers import FAST
from tiny_families import BUILDERS, tokens

from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.search.inner.budget import Budget
from autocompress_opt.search.inner.inner_search import hidden_sliced, search
from autocompress_opt.search.inner.relaxation import ParentMasks
from autocompress_opt.search.inner.teacher import teacher_log_probs


def _searched(family: str, *, slice_hidden: bool) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = BUILDERS[family]()
    arch = adapter_for(model).architecture(model)
    importance = estimate_importance(model, tokens(4, 12, seed=1), model_id=family, progress=False)
    rows = tokens(6, 12, seed=2)
    teacher = teacher_log_probs(model, rows, parent_id=family)
    # Three quarters of the residual channels, and room for every layer: only the hidden size is cut.
    budget = dataclasses.replace(Budget.of(arch), hidden_size=arch.hidden_size * 3 // 4)
    result = search(
        model, arch, importance, rows, teacher, budget=budget, goal=None, config=FAST, slice_hidden=slice_hidden
    )
    return model, result


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_the_cut_parent_trains_as_the_masked_parent(family: str) -> None:
    model, sliced = _searched(family, slice_hidden=True)
    _, masked = _searched(family, slice_hidden=False)
    assert sliced.architecture == masked.architecture
    assert sliced.selection["chosen"] == masked.selection["chosen"]
    kl = lambda r: [h["kl"] for h in r.history]
    assert kl(sliced) == pytest.approx(kl(masked), rel=1e-5)
    for name, value in masked.selection.items():
        if isinstance(value, dict) and "val_kl" in value and value["val_kl"] == value["val_kl"]:  # not NaN
            assert sliced.selection[name]["val_kl"] == pytest.approx(value["val_kl"], rel=1e-5), name
    assert all("forward" not in vars(m) for m in model.modules())  # the parent as it was
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_the_cut_model_is_built_once_per_hidden_size_and_only_when_cut() -> None:
    model = BUILDERS["llama"]()
    arch = adapter_for(model).architecture(model)
    importance = estimate_importance(model, tokens(4, 12, seed=1), model_id="llama", progress=False)
    adapter = adapter_for(model)
    full = ParentMasks(arch, importance)
    assert hidden_sliced(model, full, importance, adapter) is model
    cut = ParentMasks(arch, importance, hidden_size=arch.hidden_size // 2)
    work = hidden_sliced(model, cut, importance, adapter)
    assert work is not model
    assert architecture_mismatch(cut.sliced_parent, adapter_for(work).architecture(work)) is None
    again = ParentMasks(arch, importance, hidden_size=arch.hidden_size // 2)
    assert hidden_sliced(model, again, importance, adapter) is work
    # The masks install on it without a hidden-channel hook, and refuse a model of another shape.
    with cut.install(work):
        pass
    with pytest.raises(Exception, match="nor the parent cut to hidden"):
        ParentMasks(arch, importance, hidden_size=arch.hidden_size // 4).install(work)
