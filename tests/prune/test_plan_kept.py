"""A pruning plan's kept indices as a small JSON record (PrunePlan.kept) and back (plan_from_kept):
the same plan, the same model, no importance needed; records that do not fit are refused by name."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import torch
from tiny_families import tiny_model, tokens

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.prune.plan import KEPT_FORMAT, LayerPlan, PrunePlan, plan_from_kept, plan_pruning
from autocompress_opt.prune.slicing import materialize


@pytest.fixture(scope="module")
def parent() -> tuple[Any, Architecture, Any]:
    """A tiny Llama (3 layers, hidden 48, 6 heads in 2 KV groups, FFN 48) and its importance."""
    model = tiny_model("llama")
    arch = adapter_for(model).architecture(model)
    return model, arch, estimate_importance(model, tokens(4, 10, seed=1), model_id="parent", progress=False)


def _targets(arch: Architecture) -> dict[str, Architecture]:
    """A same-depth heterogeneous target (a dropped layer, one without attention) and a shallower one."""
    same_depth = replace(
        arch,
        hidden_size=40,
        layers=(
            LayerSpec(True, 2, 1, 8, True, 20),
            LayerSpec.dropped(),
            LayerSpec(attention=False, ffn=True, ffn_width=30),
        ),
    )
    shallower = replace(
        arch, hidden_size=32, layers=(LayerSpec(True, 4, 2, 8, True, 16), LayerSpec(True, 3, 1, 8, False, 0))
    )
    return {"same_depth": same_depth, "shallower": shallower}


@pytest.mark.parametrize("name", ["same_depth", "shallower"])
def test_kept_record_gives_back_the_plan_and_its_model(parent: tuple[Any, Architecture, Any], name: str) -> None:
    model, arch, importance = parent
    target = _targets(arch)[name]
    plan = plan_pruning(arch, importance, target)
    record = json.loads(json.dumps(plan.kept()))  # what a study stores and reads back
    assert record["format"] == KEPT_FORMAT
    again = plan_from_kept(arch, target, record)
    assert again == plan
    ids = tokens(2, 12, seed=3)
    with torch.no_grad():
        with apply_masks(model, again.masks()):
            masked = model(ids).logits
        torch.testing.assert_close(materialize(model, again)(ids).logits, masked)


def test_kept_record_keeps_exactly_its_indices_whatever_the_importance(parent: tuple[Any, Architecture, Any]) -> None:
    """Indices no importance ranking would choose (the least important) come back as recorded."""
    _, arch, importance = parent
    target = _targets(arch)["same_depth"]
    best = plan_pruning(arch, importance, target)
    worst_ffn = tuple(sorted(int(i) for i in torch.argsort(importance.ffn[0])[:20]))  # 20 lowest scores
    assert worst_ffn != best.layers[0].ffn_channels
    layers = (replace(best.layers[0], ffn_channels=worst_ffn), *best.layers[1:])
    odd = replace(best, layers=layers, hidden_channels=tuple(range(8, 48)))
    assert plan_from_kept(arch, target, odd.kept()) == odd


def test_smollm2_record_is_small() -> None:
    """SmolLM2-135M (30 layers, 9 heads in 3 KV groups, FFN 1536, hidden 576) keeping half of every
    width: ~12 KB of JSON (30 layers x (384 + 3 + 1) hex digits for FFN, heads and groups, plus 144
    for the hidden channels), small enough for an Optuna user attribute in any database."""
    arch = load_architecture("smollm2-135m")
    layers = tuple(LayerPlan(j, (0, 1, 2), (0,), tuple(range(0, 1536, 2))) for j in range(arch.num_layers))
    target = replace(arch, hidden_size=288, layers=tuple(LayerSpec(True, 3, 1, 64, True, 768) for _ in arch.layers))
    plan = PrunePlan(parent=arch, architecture=target, layers=layers, hidden_channels=tuple(range(288)))
    text = json.dumps(plan.kept())
    assert 11_000 < len(text) < 13_000
    assert plan_from_kept(arch, target, json.loads(text)) == plan


def _edit(record: dict[str, Any], layer: int, field: int, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(record))
    out["layers"][layer][field] = value
    return out


def test_records_that_do_not_fit_are_refused_by_name(parent: tuple[Any, Architecture, Any]) -> None:
    _, arch, importance = parent
    target = _targets(arch)["same_depth"]
    record = plan_pruning(arch, importance, target).kept()
    cases = [
        ({**record, "format": "other/9"}, "format must be 'autocompress-kept/1', got 'other/9'"),
        ({**record, "layers": record["layers"][:1]}, "1 layers recorded but the target builds 2"),
        (_edit(record, 1, 0, 1), r"target layers\[2\] must be .* and equal to 2"),
        (_edit(record, 0, 3, "zz" * 6), r"target layers\[0\] \(parent layer 0\) ffn_channels must be a bitmask of 12"),
        (_edit(record, 0, 3, "f" * 12 + "0"), "must be a bitmask of 12 hex digits over 48"),
        (_edit(record, 0, 3, "0" * 11 + "f"), "keeps 4 FFN channels; the target has 20"),
        (_edit(record, 0, 1, "07"), "keeps 3 heads in 1 KV groups; the target has 2 in 1"),
        (_edit(_edit(record, 0, 2, "1"), 0, 1, "30"), r"heads \[4, 5\] are not 2 in each kept KV group \[0\]"),
        ({**record, "hidden": "f" * 12}, "48 hidden channels kept but the target has 40"),
    ]
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message):
            plan_from_kept(arch, target, bad)
    with pytest.raises(ConfigError, match="kept indices: format must be"):
        plan_from_kept(arch, target, ["not", "a", "record"])  # type: ignore[arg-type]
