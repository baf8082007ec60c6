"""Integration on the real SmolLM2-135M: load → importance → heterogeneous prune → export → reload."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autocompress_opt.arch.architecture import LayerSpec
from autocompress_opt.arch.catalog import load_architecture

pytestmark = pytest.mark.slow


def test_prune_export_reload_on_the_real_model(smollm2_loaded, tmp_path: Path) -> None:
    """Importance on a small calibration set, a heterogeneous target (dropped layers, per-layer
    FFN widths and heads, smaller hidden), export, reload through load_model: identical logits;
    held-out perplexity finite and worse than the parent's."""
    from autocompress_opt.data.textdata import calibration_batches, test_batches
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.export import export_model
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.prune.masking import apply_masks
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize
    from autocompress_opt.quality.metrics import perplexity

    parent, tokenizer, arch = smollm2_loaded.model, smollm2_loaded.tokenizer, smollm2_loaded.architecture
    calib = calibration_batches(tokenizer, n_samples=4, seq_len=64, seed=0)
    importance = estimate_importance(
        parent, calib, model_id="smollm2-135m", data_id="test-4x64", seed=0, cache_dir=tmp_path / "imp", progress=False
    )
    layers = list(arch.layers)
    for i in (5, 17):
        layers[i] = LayerSpec.dropped()
    for i in range(0, 30, 3):
        if not layers[i].is_noop:
            layers[i] = replace(layers[i], ffn_width=768)
    for i in range(1, 30, 4):
        if not layers[i].is_noop:
            layers[i] = replace(layers[i], num_heads=6, num_kv_heads=2)
    layers[2] = replace(layers[2], attention=False, num_heads=0, num_kv_heads=0, head_dim=0)
    target = replace(arch, hidden_size=512, layers=tuple(layers), name="smollm2-hetero")
    plan = plan_pruning(arch, importance, target)
    pruned = materialize(parent, plan)
    assert sum(p.numel() for p in pruned.parameters()) == target.active().num_params

    ids = test_batches(tokenizer, n_samples=2, seq_len=64, seed=0)
    with torch.inference_mode():
        with apply_masks(parent, plan.masks()):
            masked = parent(ids).logits
        sliced = pruned(ids).logits
    torch.testing.assert_close(sliced, masked, atol=2e-4, rtol=1e-4)

    out = export_model(
        pruned,
        target.active(),
        tmp_path / "export",
        parent="smollm2-135m",
        card={"note": "integration test"},
        tokenizer=tokenizer,
    )
    reloaded = load_model(out, cache=False)
    assert reloaded.architecture.num_params == target.active().num_params
    assert load_architecture(out).num_params == target.active().num_params
    with torch.inference_mode():
        torch.testing.assert_close(reloaded.model(ids).logits, sliced, atol=1e-5, rtol=1e-5)

    held_out = test_batches(tokenizer, n_samples=4, seq_len=128, seed=1)
    ppl_parent = perplexity(parent, held_out, batch_size=2, progress=False)
    ppl_pruned = perplexity(reloaded.model, held_out, batch_size=2, progress=False)
    assert torch.isfinite(torch.tensor(ppl_pruned)) and ppl_pruned > ppl_parent
