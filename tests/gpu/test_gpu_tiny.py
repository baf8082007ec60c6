"""The GPU path on a tiny random Llama (seconds): load in bf16, importance, one weights trial,
export and reload, distillation steps and calibration, all on the suite's device (see conftest:
CUDA, skipped without one; ``AUTOCOMPRESS_GPU_SUITE_DEVICE=cpu`` runs them on the CPU)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import tiny_model as family_model
from tiny_families import tokens
from tiny_lm import byte_tokenizer, save_hf_dir, tiny_model
from weights_helpers import INNER, PARAMS, request

from autocompress_opt.arch.architecture import LayerSpec
from autocompress_opt.arch.search_space import uniform_allocation
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.export import export_model
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.prune.slicing import materialize
from autocompress_opt.recover.distill import DistillRecipe, distill
from autocompress_opt.search.study.weights_trial import clear_trial_cache, run_weights_trial

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer random Llama (hidden 32, 4 heads in 2 KV groups, FFN 48) with a byte tokenizer:
    the parent of :mod:`weights_helpers`' trial request."""
    return save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("tiny-gpu") / "llama")


def log_probs(model: Any, ids: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.no_grad():
        return model(input_ids=ids.to(device)).logits.float().log_softmax(-1).cpu()


def test_tiny_parent_loads_in_bf16_on_the_device(
    parent_dir: Path, suite_device: torch.device, peak_memory: Any, gpu_record: Any
) -> None:
    """Every weight and buffer on the device, every weight in bf16; the log-probs stay within bf16
    rounding of the fp32 model's on the CPU."""
    with peak_memory() as peak:
        loaded = load_model(parent_dir, device=suite_device, dtype=BF16, cache=False)
    assert {p.device for p in loaded.model.parameters()} | {b.device for b in loaded.model.buffers()} == {suite_device}
    assert {p.dtype for p in loaded.model.parameters()} == {BF16}
    assert loaded.num_params == loaded.architecture.num_params
    ids = tokens(2, 16)
    reference = load_model(parent_dir, cache=False)  # fp32 on the CPU
    error = float((log_probs(loaded.model, ids) - log_probs(reference.model, ids)).abs().max())
    assert error < 0.05  # bf16 keeps 8 mantissa bits: ~0.4 % per rounding, logits of this model are O(1)
    gpu_record(load_s=loaded.load_time_s, peak_bytes=peak["peak_bytes"], max_log_prob_error=error)


def test_tiny_importance_on_the_device_agrees_with_fp32(suite_device: torch.device) -> None:
    """Minitron scores of the bf16 model on the device: back on the CPU in float64, each within 5 % of
    the fp32 CPU scores (mean activation magnitudes over 64 tokens; bf16 rounds each to ~0.4 %)."""
    model = family_model("llama")
    ids = tokens(4, 16)
    reference = estimate_importance(model, ids, model_id="tiny", progress=False)
    got = estimate_importance(copy.deepcopy(model).to(suite_device, BF16), ids, model_id="tiny", progress=False)
    for kind in ("heads", "kv_groups", "ffn"):
        for i, (a, b) in enumerate(zip(getattr(got, kind), getattr(reference, kind))):
            assert a is not None and b is not None
            assert a.device.type == "cpu" and a.dtype == torch.float64, (kind, i)
            torch.testing.assert_close(a, b, rtol=0.05, atol=1e-3 * float(b.abs().max()), msg=f"{kind}[{i}]")
    torch.testing.assert_close(got.hidden, reference.hidden, rtol=0.05, atol=0.0)
    # a skipped layer's loss increase: bf16 moves the mean cross-entropy by ~1e-2 nats
    torch.testing.assert_close(got.skip_loss, reference.skip_loss, rtol=0.0, atol=0.05)
    assert torch.isfinite(got.block_influence).all()


def test_the_study_driver_reads_the_parent_on_the_cpu_and_takes_no_device_memory(
    parent_dir: Path, tmp_path: Path, suite_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study driver scores the seeded baselines' candidates with the parent on the CPU, in the
    GPU trials' bf16, whatever GPUs it sees: no tensor on the device, so nothing to free before the
    trials (which take the GPUs Ray assigns them)."""
    from types import SimpleNamespace

    from autocompress_opt.hf import loading
    from autocompress_opt.search.study.seeding import SeedScoring
    from autocompress_opt.serving.targets import Target

    devices: list[str] = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: devices.append(str(k["device"])) or real(*a, **k))
    cuda = suite_device.type == "cuda"
    before = torch.cuda.memory_allocated(suite_device) if cuda else 0
    inner = {**INNER, "device": str(suite_device)}
    study = SimpleNamespace(
        mode="weights",
        inner=inner,
        seed=0,
        model=str(parent_dir),
        cache_dir=str(tmp_path / "cache"),
        gpus_per_trial=1.0 if cuda else None,
        address=None,
        driver_device="cpu",
    )
    scoring = SeedScoring(study)
    importance, _ = scoring(Target("h100-sxm", "datacenter"))
    assert devices == ["cpu"] and importance.meta.model_id.endswith(":bf16" if cuda else "")
    if cuda:
        assert torch.cuda.memory_allocated(suite_device) == before
    scoring.release()


def test_tiny_weights_trial_on_the_device(
    parent_dir: Path, tmp_path: Path, suite_device: torch.device, peak_memory: Any, gpu_record: Any
) -> None:
    """``inner: {device, compute_dtype: bf16}``: the trial computes there and says so; its held-out KL
    is within 0.05 nats of the same trial in fp32 on the same device (as on the CPU,
    tests/search/test_weights_trial.py)."""
    results = {}
    for dtype in ("bf16", "fp32"):
        clear_trial_cache()
        inner = {**INNER, "device": str(suite_device), "compute_dtype": dtype}
        with peak_memory() as peak:
            results[dtype] = run_weights_trial(request(parent_dir, tmp_path / dtype, inner=inner))
        result = results[dtype]
        assert result["compute"] == {"device": str(suite_device), "dtype": dtype, "devices": [str(suite_device)]}
        assert math.isfinite(result["kl_to_parent"]) and result["kl_to_parent"] >= 0
        assert 0 < result["quality"] <= 1 and not result["quality_cached"]
        assert result["inner"]["config"]["device"] == str(suite_device)
        if suite_device.type == "cuda":
            assert peak["peak_bytes"] and peak["peak_bytes"] > 0
        gpu_record(**{f"{dtype}_trial_s": result["timings_s"]["total"], f"{dtype}_peak_bytes": peak["peak_bytes"]})
    clear_trial_cache()
    assert abs(results["bf16"]["kl_to_parent"] - results["fp32"]["kl_to_parent"]) < 0.05
    assert results["bf16"]["architecture"]["hidden_size"] == PARAMS["hidden_size"]


def test_tiny_heterogeneous_export_reloads_on_the_device(
    parent_dir: Path, tmp_path: Path, suite_device: torch.device
) -> None:
    """A heterogeneous child cut on the device in bf16 is exported (safetensors written from device
    tensors) and reloads there, in bf16, with its architecture and its log-probs."""
    loaded = load_model(parent_dir, device=suite_device, dtype=BF16, cache=False)
    arch = loaded.architecture
    importance = estimate_importance(loaded.model, tokens(4, 16), model_id="tiny-gpu", progress=False)
    uniform = uniform_allocation(PARAMS, arch, importance.layer_order())
    kept = [i for i, layer in enumerate(uniform.layers) if not layer.is_noop]
    layers = list(uniform.layers)
    layers[kept[0]] = LayerSpec(attention=False, ffn=True, ffn_width=32)
    layers[kept[1]] = replace(layers[kept[1]], ffn_width=16)
    target = replace(uniform, layers=tuple(layers))
    child = materialize(loaded.model, plan_pruning(arch, importance, target))
    assert {p.device for p in child.parameters()} == {suite_device} and {p.dtype for p in child.parameters()} == {BF16}
    out = export_model(child, target, tmp_path / "out", parent=str(parent_dir), tokenizer=loaded.tokenizer)
    back = load_model(out, device=suite_device, dtype=BF16, cache=False)
    assert not architecture_mismatch(back.architecture, target.active())
    assert {p.device for p in back.model.parameters()} == {suite_device}
    ids = tokens(2, 16)
    torch.testing.assert_close(log_probs(back.model, ids), log_probs(child, ids), rtol=0.0, atol=1e-3)


def test_tiny_distill_steps_on_the_device(
    parent_dir: Path, tmp_path: Path, suite_device: torch.device, peak_memory: Any, gpu_record: Any
) -> None:
    """Six distillation steps of a perturbed student in bf16 (weights, gradients and AdamW moments),
    with activation checkpointing and the chunked KL, on the device: the loss and the held-out KL
    fall; the checkpoint reloads in bf16. The fp32 run starts at the same held-out KL within 10 %."""
    teacher = load_model(parent_dir, cache=False).model
    student = copy.deepcopy(teacher)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    student_dir = export_model(
        student, adapter_for(student).architecture(student), tmp_path / "student", tokenizer=byte_tokenizer()
    )
    recipe = DistillRecipe(steps=6, batch_size=2, seq_len=16, lr=3e-3, save_every=6, n_eval_rows=2)
    options = dict(device=str(suite_device), progress=False)
    with peak_memory() as peak:
        bf16 = distill(
            student_dir,
            parent_dir,
            tmp_path / "bf16",
            recipe,
            compute_dtype="bf16",
            gradient_checkpointing=True,
            kl_chunk=8,
            **options,
        )
    # bf16 compute over fp32 master weights: the checkpoint holds the fp32 weights.
    assert (bf16.device, bf16.precision) == (str(suite_device), "bf16-mixed")
    assert all(math.isfinite(loss) for loss in bf16.losses) and bf16.losses[-1] < 0.8 * bf16.losses[0]
    assert bf16.final_kl is not None and bf16.final_kl < bf16.initial_kl
    saved = load_model(bf16.out_dir, cache=False, device=suite_device).model
    assert {p.dtype for p in saved.parameters()} == {torch.float32}
    pure = distill(
        student_dir,
        parent_dir,
        tmp_path / "pure",
        replace(recipe, steps=1),
        compute_dtype="bf16",
        pure_bf16=True,
        **options,
    )
    assert pure.precision == "bf16" and math.isfinite(pure.losses[0])
    saved = load_model(pure.out_dir, cache=False, dtype=BF16, device=suite_device).model
    assert {p.dtype for p in saved.parameters()} == {BF16}
    fp32 = distill(student_dir, parent_dir, tmp_path / "fp32", replace(recipe, steps=1), **options)
    assert fp32.precision == "fp32" and bf16.initial_kl == pytest.approx(fp32.initial_kl, rel=0.1)
    if suite_device.type == "cuda":  # bf16 autocast over fp32 weights is CUDA-only
        autocast = distill(
            student_dir, parent_dir, tmp_path / "autocast", replace(recipe, steps=1), bf16=True, **options
        )
        assert autocast.precision == "bf16-autocast" and math.isfinite(autocast.losses[0])
    else:
        with pytest.raises(ConfigError, match="CUDA only"):
            distill(student_dir, parent_dir, tmp_path / "autocast", recipe, bf16=True, **options)
    gpu_record(seconds_per_step=bf16.seconds_per_step, peak_bytes=peak["peak_bytes"])


def test_tiny_inner_search_keeps_its_masks_and_cost_on_the_device(suite_device: torch.device, gpu_record: Any) -> None:
    """The inner search with the fp32 parent on the device builds its masks there (every parameter,
    buffer and gradient), prices the Lagrangian there (float32 off the CPU, float64 on it), and
    returns a feasible architecture; on the CPU exactly the CPU search's, elsewhere within 0.05 nats
    of its held-out KL (float32 cost, other kernels)."""
    from inner_helpers import TIGHT, TinyParent

    from autocompress_opt.search.inner.budget import CostGoal, cost_dtype
    from autocompress_opt.serving.targets import Target

    host = TinyParent()
    goal = CostGoal.for_target(Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.9x"}), host.arch)
    here = host.search(TIGHT, goal, steps=8)
    device = copy.copy(host)
    device.model = copy.deepcopy(host.model).to(suite_device)
    there = device.search(TIGHT, goal, steps=8)
    masks = there.learned
    assert masks is not None and masks.device == suite_device
    assert {t.device for t in (*masks.parameters(), *masks.buffers())} == {suite_device}
    assert cost_dtype(suite_device) == (torch.float64 if suite_device.type == "cpu" else torch.float32)
    assert there.feasible == here.feasible
    chosen = lambda r: r.selection[r.selection["chosen"]]["val_kl"]
    if suite_device.type == "cpu":
        assert (there.architecture, there.history) == (here.architecture, here.history)
    else:
        assert abs(chosen(there) - chosen(here)) < 0.05
    gpu_record(inner_train_s=there.seconds["train"], inner_train_cpu_s=here.seconds["train"])


def test_calibrate_times_on_the_device(tmp_path: Path, suite_device: torch.device, capsys: Any) -> None:
    """``autocompress calibrate --device``: the sweep is timed on the device (a catalog GPU's
    datasheet figures on CUDA, the CPU's measured ones on the CPU), a profile is fitted and saved."""
    hardware = "h200" if suite_device.type == "cuda" else "cpu"
    out = tmp_path / "profile.yaml"
    argv = ["calibrate", "--hardware", hardware, "--device", str(suite_device), "--archs", "4", "--passes", "1"]
    code = main([*argv, "--prompt-len", "16", "--decode-context", "16", "--out", str(out), "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["profile"]["fit"]["device"] == str(suite_device) and data["path"] == str(out) and out.is_file()
    assert len(data["rows"]) == 4
    assert all(row["prefill_ms"] > 0 and row["decode_ms_per_token"] > 0 for row in data["rows"])
    assert data["profile"]["mfu"] > 0 and data["profile"]["mbu"] > 0
