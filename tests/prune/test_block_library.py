"""The per-layer block library (issue 49, item 2) on a tiny random Llama: its variants, replace-one
KL scores that equal a whole masked pass, its cache and its errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import tiny_model, tokens

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.block_library import BlockLibrary, BlockVariant, build_block_library, layer_variants
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.quality.metrics import log_probs, token_kl

STEP = 16  # the tiny parent's FFN of 48 channels in three widths


@pytest.fixture(scope="module")
def parent() -> dict[str, Any]:
    """A tiny random Llama (3 layers, 2 KV groups of 3 query heads, FFN 48, every bias), its
    importance, calibration rows and its library at the full hidden size."""
    model = tiny_model("llama")
    importance = estimate_importance(model, tokens(4, 12, seed=1), model_id="tiny", progress=False)
    rows = tokens(4, 12, seed=2)
    library, _ = build_block_library(model, importance, rows, ffn_step=STEP, model_id="tiny", batch_tokens=100)
    return {"model": model, "importance": importance, "rows": rows, "library": library}


def test_variants_are_every_attention_grouping_ffn_width_and_the_skip(parent: dict[str, Any]) -> None:
    lib = parent["library"]
    expected = {
        BlockVariant(g, r, w)
        for g, r in [(0, 0)] + [(g, r) for g in (1, 2) for r in (1, 2, 3)]
        for w in (0, 16, 32, 48)
    }
    for i in range(3):
        assert set(lib.variants(i)) == expected  # 7 attention options x 4 FFN options
        assert set(lib.table(i)) == expected
    # measured: the full layer, 6 other attention options, 3 other FFN options, the skip
    assert lib.meta.passes == 3 * 11
    assert len(layer_variants(lib.parent, 256)[0]) == 7 * 2  # FFN 48 < 256: kept whole or dropped


def test_full_variant_scores_zero_and_cuts_score_positive(parent: dict[str, Any]) -> None:
    lib = parent["library"]
    for i in range(3):
        assert abs(lib.base_kl(i)) < 1e-6  # the parent itself, through the suffix pass
        assert lib.score(i, BlockVariant(2, 3, 48)) == 0.0
        assert lib.score(i, BlockVariant(0, 0, 0)) > 0.01
        assert lib.score(i, BlockVariant(1, 1, 16)) > lib.score(i, BlockVariant(1, 1, 48)) > 0
    # a combination not measured is its sub-blocks' sum
    combined = lib.score(1, BlockVariant(1, 2, 32))
    assert combined == pytest.approx(lib.score(1, BlockVariant(1, 2, 48)) + lib.score(1, BlockVariant(2, 3, 32)))
    assert lib.spread()["ratio"] >= 1


@pytest.mark.parametrize("hidden", [48, 40])
def test_scores_equal_a_whole_masked_pass(parent: dict[str, Any], hidden: int) -> None:
    """The suffix pass from the saved input, batched with other variants, computes what
    apply_masks of the replace-one plan computes on the whole model."""
    model, importance, rows = parent["model"], parent["importance"], parent["rows"]
    lib = (
        parent["library"]
        if hidden == 48
        else build_block_library(model, importance, rows, ffn_step=STEP, model_id="tiny", hidden_size=hidden)[0]
    )
    arch = adapter_for(model).architecture(model)
    with torch.inference_mode():
        teacher = log_probs(model(input_ids=rows).logits)
        for v in (BlockVariant(1, 2, 48), BlockVariant(2, 3, 16), BlockVariant(0, 0, 0), BlockVariant(0, 0, 48)):
            layers = list(arch.layers)
            layers[1] = v.spec(arch.layers[1])
            target = replace(arch, layers=tuple(layers), hidden_size=hidden)
            with apply_masks(model, plan_pruning(arch, importance, target).masks()):
                kl = token_kl(log_probs(model(input_ids=rows).logits), teacher).double().mean()
            torch.testing.assert_close(lib.measured[1][v], float(kl), rtol=1e-5, atol=1e-7)


def test_cached_on_second_build_and_round_trips(parent: dict[str, Any], tmp_path: Path) -> None:
    model, importance, rows = parent["model"], parent["importance"], parent["rows"]
    first, hit = build_block_library(model, importance, rows, ffn_step=STEP, model_id="tiny", cache_dir=tmp_path)
    assert not hit
    second, hit = build_block_library(model, importance, rows, ffn_step=STEP, model_id="tiny", cache_dir=tmp_path)
    assert hit
    assert second.measured == first.measured and second.meta == first.meta
    assert first.meta.build_seconds > 0
    other, hit = build_block_library(
        model, importance, rows, ffn_step=STEP, model_id="tiny", cache_dir=tmp_path, hidden_size=40
    )
    assert not hit and other.hidden_size == 40  # one entry per hidden size
    assert len(list(tmp_path.glob("block-library-*.json"))) == 2
    assert BlockLibrary.from_dict(first.to_dict()).measured == first.measured


def test_bad_input_raises_config_error(parent: dict[str, Any]) -> None:
    model, importance, rows, lib = parent["model"], parent["importance"], parent["rows"], parent["library"]
    with pytest.raises(ConfigError, match="did you mean 'replace-one-kl'"):
        build_block_library(model, importance, rows, scoring="replace-one-k")
    with pytest.raises(ConfigError, match="hidden_size=64 exceeds"):
        build_block_library(model, importance, rows, hidden_size=64)
    with pytest.raises(ConfigError, match="ffn_step"):
        build_block_library(model, importance, rows, ffn_step=0)
    other = estimate_importance(tiny_model("llama", num_hidden_layers=2), rows, model_id="two", progress=False)
    with pytest.raises(ConfigError, match="another architecture"):
        build_block_library(model, other, rows)
    with pytest.raises(ConfigError, match="no variant 2x3/24"):
        lib.score(0, BlockVariant(2, 3, 24))
    with pytest.raises(ConfigError, match="both be 0"):
        BlockVariant(0, 2, 48)
    with pytest.raises(ConfigError, match="not a block library"):
        BlockLibrary.from_dict({"format": "something else"})


def test_refit_scoring_lowers_narrowed_ffn_scores_only(parent: dict[str, Any], tmp_path: Path) -> None:
    """The recovery-aware scoring refits a narrowed FFN's down projection by least squares: its
    scores fall (on the whole), every other variant scores as without it, and it is cached apart."""
    model, importance = parent["model"], parent["importance"]
    rows = tokens(16, 12, seed=3)  # 192 tokens: 4 per FFN channel, the fewest the refit takes
    kwargs: dict[str, Any] = dict(ffn_step=STEP, model_id="tiny", cache_dir=tmp_path)
    plain, _ = build_block_library(model, importance, rows, **kwargs)
    refit, _ = build_block_library(model, importance, rows, scoring="replace-one-kl+refit", **kwargs)
    assert refit.meta.scoring == "replace-one-kl+refit"
    narrowed, total_plain, total_refit = (BlockVariant(2, 3, 16), BlockVariant(2, 3, 32)), 0.0, 0.0
    for i in range(3):
        for v in refit.measured[i]:
            if v in narrowed:
                total_plain += plain.score(i, v)
                total_refit += refit.score(i, v)
            else:
                assert refit.measured[i][v] == pytest.approx(plain.measured[i][v], rel=1e-5, abs=1e-7)
    assert total_refit < 0.8 * total_plain
    assert len(list(tmp_path.glob("block-library-*.json"))) == 2
    with pytest.raises(ConfigError, match="4 calibration tokens per FFN channel"):
        build_block_library(model, importance, parent["rows"], scoring="replace-one-kl+refit", **kwargs)
