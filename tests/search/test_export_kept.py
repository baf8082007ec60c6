"""Exports equal the trial: a weights trial stores the kept indices it measured, and export_trial cuts
exactly those on any device and in any dtype, even where importance recomputed at export time would
choose other channels (here: the trial's importance is reversed, as a bf16 GPU's ranking could differ
from a CPU's fp32 one)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_lm import save_hf_dir, tiny_model
from weights_helpers import INNER, TARGET, request

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.export import CARD_FILE, load_exported
from autocompress_opt.prune.importance import ESTIMATORS, Importance
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.search.study import export_trial, trial_model, trial_parent
from autocompress_opt.search.study.weights_trial import clear_trial_cache, heldout_quality, run_weights_trial


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer random Llama (hidden 32, 4 heads in 2 KV groups, FFN 48) saved with a byte tokenizer."""
    return save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("tiny") / "llama")


def _reversed(scores: Importance) -> Importance:
    """The same scores with every head, KV-group, FFN and hidden ranking reversed (layers unchanged)."""
    flip = lambda t: None if t is None else -t
    return replace(
        scores,
        heads=tuple(map(flip, scores.heads)),
        kv_groups=tuple(map(flip, scores.kv_groups)),
        ffn=tuple(map(flip, scores.ffn)),
        hidden=-scores.hidden,
    )


@pytest.fixture(scope="module")
def trial(parent_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A weights trial whose importance (and so its kept channels) differs from what the exporting
    machine computes: the estimator is reversed while the trial runs."""
    original = ESTIMATORS.get("minitron")
    ESTIMATORS.register("minitron", lambda *a, **k: _reversed(original(*a, **k)), replace=True)
    clear_trial_cache()
    try:
        return run_weights_trial(request(parent_dir, tmp_path_factory.mktemp("trial-cache")))
    finally:
        ESTIMATORS.register("minitron", original, replace=True)
        clear_trial_cache()


def _logits(model: Any, masks: Any = None) -> torch.Tensor:
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        if masks is None:
            return model(ids).logits
        with apply_masks(model, masks):
            return model(ids).logits


@pytest.mark.slow
def test_export_cuts_the_trials_kept_indices_not_recomputed_importance(
    parent_dir: Path, trial: dict[str, Any], tmp_path: Path
) -> None:
    arch = Architecture.from_dict(trial["architecture"])
    cpu_fp32 = {**INNER, "device": "cpu", "compute_dtype": "fp32"}
    # what the old export did: importance recomputed here (fp32, CPU), which ranks channels otherwise
    context, _ = trial_parent(str(parent_dir), cpu_fp32, cache_dir=tmp_path / "fresh", workload=TARGET.workload)
    recomputed = plan_pruning(context.architecture, context.importance, arch)
    assert recomputed.kept() != trial["kept"]

    loaded, _ = trial_model(str(parent_dir), cpu_fp32, workload=TARGET.workload)
    exported = export_trial(loaded, arch, tmp_path / "out", kept=trial["kept"])
    assert exported.plan.kept() == trial["kept"]
    assert exported.plan.architecture == recomputed.architecture  # same shape, other channels
    child = load_exported(tmp_path / "out")
    # the export computes the masked parent with the trial's indices ...
    torch.testing.assert_close(_logits(child), _logits(loaded.model, exported.plan.masks()))
    # ... and is the model the trial measured: its held-out KL is the trial's objective
    assert heldout_quality(context, child)["kl_to_parent"] == pytest.approx(trial["kl_to_parent"], rel=1e-5, abs=1e-7)
    assert '"kept_from": "trial"' in (tmp_path / "out" / CARD_FILE).read_text()


@pytest.mark.slow
def test_export_in_bf16_keeps_the_same_indices(parent_dir: Path, trial: dict[str, Any], tmp_path: Path) -> None:
    arch = Architecture.from_dict(trial["architecture"])
    loaded, config = trial_model(str(parent_dir), {**INNER, "device": "cpu", "compute_dtype": "bf16"})
    assert config.compute_dtype == "bf16" and next(loaded.model.parameters()).dtype == torch.bfloat16
    exported = export_trial(loaded, arch, tmp_path / "out", kept=trial["kept"])
    assert exported.plan.kept() == trial["kept"]
    assert next(load_exported(tmp_path / "out").parameters()).dtype == torch.bfloat16


def test_export_without_kept_or_importance_is_refused(parent_dir: Path, tmp_path: Path) -> None:
    loaded, _ = trial_model(str(parent_dir), {**INNER, "device": "cpu"})
    with pytest.raises(ConfigError, match="needs the trial's kept indices"):
        export_trial(loaded, loaded.architecture, tmp_path / "out")
    assert not (tmp_path / "out").exists()
