"""The GPU path on the real SmolLM2-135M: load in bf16, importance, the bf16-vs-fp32 agreement of
the held-out KL, a weights trial in bf16 and fp32, export and reload, distillation steps; with the
time and peak device memory of each recorded (see conftest: CUDA, skipped without one;
``AUTOCOMPRESS_GPU_SUITE_DEVICE=cpu`` runs them on the CPU, in minutes)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.search_space import uniform_allocation
from autocompress_opt.data.textdata import text_batches
from autocompress_opt.hf.adapters import architecture_mismatch
from autocompress_opt.hf.loading import LoadedModel, load_model
from autocompress_opt.prune.export import export_model
from autocompress_opt.prune.importance import Importance, estimate_importance
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.prune.slicing import materialize
from autocompress_opt.quality.metrics import cache_teacher_logits, kl_divergence, perplexity
from autocompress_opt.recover.distill import DistillRecipe, distill
from autocompress_opt.search.study.weights_trial import (
    TrialConfig,
    clear_trial_cache,
    heldout_quality,
    parent_context,
    run_weights_trial,
)
from autocompress_opt.serving.targets import Target

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"
BF16 = torch.bfloat16
# A point of the bundled search space (search_spaces/smollm2-135m.yaml): 22 of 30 layers, hidden
# 512 of 576, FFN 1024 of 1536, all 3 KV groups of 3 query heads; about 60 % of the parameters.
POINT = {"num_layers": 22, "hidden_size": 512, "ffn_width": 1024, "num_kv_heads": 3, "q_per_kv": 3}
TARGET = Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.95x", "output_throughput_tok_s": "1.05x"})
# A small trial: 4 inner steps of 2 x 64 tokens, importance on 4 rows, 2 held-out rows per domain.
INNER = {
    "steps": 4,
    "n_samples": 6,
    "val_samples": 2,
    "seq_len": 64,
    "eval_samples": 2,
    "eval_seq_len": 64,
    "importance_samples": 4,
    "importance_seq_len": 64,
}


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path, real_model_device: torch.device) -> dict[str, LoadedModel]:
    """SmolLM2 on the device in bf16 and in fp32 (``smollm2_gguf`` skips when the wheel is absent;
    ``real_model_device`` on a CPU that emulates bf16 unless asked)."""
    suite_device = real_model_device
    return {
        "bf16": load_model(MODEL, device=suite_device, dtype=BF16, cache=False),
        "fp32": load_model(MODEL, device=suite_device, dtype=torch.float32, cache=False),
    }


@pytest.fixture(scope="module")
def rows(smollm2: dict[str, LoadedModel]) -> dict[str, torch.Tensor]:
    """Calibration rows (importance) and held-out evaluation rows (KL), SmolLM2's tokenizer."""
    tokenizer = smollm2["fp32"].tokenizer
    return {
        "calibration": text_batches(tokenizer, role="calibration", n_samples=4, seq_len=128, seed=0).tokens,
        "evaluation": text_batches(tokenizer, role="test", n_samples=8, seq_len=128, seed=0).tokens,
    }


@pytest.fixture(scope="module")
def importance(smollm2: dict[str, LoadedModel], rows: dict[str, torch.Tensor]) -> dict[str, Importance]:
    return {
        dtype: estimate_importance(loaded.model, rows["calibration"], model_id=f"{MODEL}:{dtype}", progress=False)
        for dtype, loaded in smollm2.items()
    }


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    rank = lambda x: torch.argsort(torch.argsort(x)).double()
    return float(torch.corrcoef(torch.stack([rank(a), rank(b)]))[0, 1])


def test_smollm2_loads_in_bf16_on_the_device(
    smollm2: dict[str, LoadedModel],
    suite_device: torch.device,
    rows: dict[str, torch.Tensor],
    peak_memory: Any,
    gpu_record: Any,
) -> None:
    """The bf16 load leaves 2 bytes per parameter on the device (the weights in bf16, nothing else
    kept there), and the model it gives predicts held-out text as the fp32 load does (perplexity
    within 2 %)."""
    with peak_memory() as measured:
        loaded = load_model(MODEL, device=suite_device, dtype=BF16, cache=False)
    params = list(loaded.model.parameters())
    assert {p.device for p in params} == {suite_device} and {p.dtype for p in params} == {BF16}
    assert loaded.num_params == loaded.architecture.num_params
    weight_bytes = 2 * loaded.num_params
    held, peak = None, None
    if suite_device.type == "cuda":
        start = measured["start_bytes"] or 0
        held = torch.cuda.memory_allocated(suite_device) - start
        peak = (measured["peak_bytes"] or 0) - start
        assert weight_bytes <= held <= 1.05 * weight_bytes + 2**24  # rotary tables and such: < 16 MiB
    ppl = perplexity(loaded.model, rows["evaluation"], progress=False)
    ppl_fp32 = perplexity(smollm2["fp32"].model, rows["evaluation"], progress=False)
    assert math.isfinite(ppl) and ppl == pytest.approx(ppl_fp32, rel=0.02)
    gpu_record(load_s=loaded.load_time_s, held_bytes=held, load_peak_bytes=peak, ppl_bf16=ppl, ppl_fp32=ppl_fp32)


def test_smollm2_importance_in_bf16_ranks_as_in_fp32(importance: dict[str, Importance], gpu_record: Any) -> None:
    """What pruning keeps is decided by the ranks of the scores. Per layer, the FFN channels bf16
    keeps at POINT's width (1024 of 1536) are, on average over the layers, >= 97 % those fp32 keeps
    (channels near the cut swap places under rounding); its ranks of FFN channels (per layer), of
    heads and of hidden channels correlate with fp32's at >= 0.95 / 0.98 / 0.98 (Spearman); the
    layers' skip losses agree within 5 % + 0.05 nats (layer 0's is ~7.5 nats)."""
    bf16, fp32 = importance["bf16"], importance["fp32"]
    width = POINT["ffn_width"]
    pairs = [(a, b) for a, b in zip(bf16.ffn, fp32.ffn) if a is not None and b is not None]
    kept = [len(set(a.topk(width).indices.tolist()) & set(b.topk(width).indices.tolist())) / width for a, b in pairs]
    ffn_rho = [spearman(a, b) for a, b in pairs]
    heads_rho = spearman(*(torch.cat([t for t in imp.heads if t is not None]) for imp in (bf16, fp32)))
    hidden_rho = spearman(bf16.hidden, fp32.hidden)
    gpu_record(
        ffn_kept_same_mean=sum(kept) / len(kept),
        ffn_kept_same_min=min(kept),
        ffn_spearman_min=min(ffn_rho),
        heads_spearman=heads_rho,
        hidden_spearman=hidden_rho,
    )
    assert sum(kept) / len(kept) >= 0.97
    assert min(ffn_rho) >= 0.95 and heads_rho >= 0.98 and hidden_rho >= 0.98
    torch.testing.assert_close(bf16.skip_loss, fp32.skip_loss, rtol=0.05, atol=0.05)


def test_smollm2_held_out_kl_in_bf16_agrees_with_fp32(
    smollm2: dict[str, LoadedModel],
    importance: dict[str, Importance],
    rows: dict[str, torch.Tensor],
    peak_memory: Any,
    gpu_record: Any,
) -> None:
    """The held-out KL(parent ‖ child) of one pruned child (the same kept layers, heads and channels:
    one plan from the fp32 scores) measured in bf16 and in fp32 on 8 x 128 held-out tokens:
    |KL_bf16 − KL_fp32| <= 5 % of KL_fp32.

    Why 5 %: bf16 keeps 8 significant bits (a relative rounding of at most 2^-9 ≈ 0.2 % per weight and
    activation). On its own that puts the bf16 parent ~1e-3 nats from the fp32 one (asserted below:
    < 0.01 nats) while the child's KL to its parent is ~2.6 nats, so rounding should move that KL
    by well under 1 %: measured on the CPU, 2.5788 (bf16) vs 2.5767 (fp32), 0.08 % apart. 5 % leaves
    ~60x that for the GPU's kernels and reduction orders and still fails on the errors that matter:
    a mask or slice lost in a dtype or device mix-up (another child: its KL differs by far more),
    an overflow to inf or nan."""
    parent32, parent16 = smollm2["fp32"], smollm2["bf16"]
    arch = parent32.architecture
    plan = plan_pruning(arch, importance["fp32"], uniform_allocation(POINT, arch, importance["fp32"].layer_order()))
    evaluation = rows["evaluation"]
    kl = {}
    with peak_memory() as peak:
        for dtype, parent in (("fp32", parent32), ("bf16", parent16)):
            child = materialize(parent.model, plan)
            assert next(child.parameters()).dtype == (BF16 if dtype == "bf16" else torch.float32)
            teacher = cache_teacher_logits(parent.model, evaluation, progress=False)
            kl[dtype] = kl_divergence(child, None, evaluation, teacher_logits=teacher, progress=False)
            del child
    rounding = kl_divergence(parent16.model, parent32.model, evaluation, progress=False)
    gpu_record(kl_fp32=kl["fp32"], kl_bf16=kl["bf16"], kl_bf16_parent_to_fp32=rounding, peak_bytes=peak["peak_bytes"])
    assert kl["fp32"] > 0.1  # a real pruning: the relative tolerance means something
    assert abs(kl["bf16"] - kl["fp32"]) <= 0.05 * kl["fp32"]
    assert 0 <= rounding < 0.01


@pytest.fixture(scope="module")
def trials(
    smollm2: dict[str, LoadedModel], suite_device: torch.device, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """One weights trial of POINT in fp32 and then in bf16 on the device (fresh caches each), and on
    CUDA the most device memory each added (the allocator's peak less what was allocated before it:
    the module's two parents stay resident). The bf16 parent context stays cached for the export."""
    import gc

    cache = tmp_path_factory.mktemp("smollm2-trials")
    parent = smollm2["fp32"].architecture
    out: dict[str, Any] = {"parent_params": parent.num_params}
    cuda = suite_device.type == "cuda"
    for dtype in ("fp32", "bf16"):
        clear_trial_cache()
        request = {
            "params": dict(POINT),
            "parent": parent.to_dict(),
            "target": TARGET.to_dict(),
            "layer_order": None,
            "seed": 0,
            "parent_model": MODEL,
            "cache_dir": str(cache / dtype),
            "inner": {**INNER, "device": str(suite_device), "compute_dtype": dtype},
        }
        start = 0
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(suite_device)
            start = torch.cuda.memory_allocated(suite_device)
        result = run_weights_trial(request)
        added = int(torch.cuda.max_memory_allocated(suite_device)) - start if cuda else None
        out[dtype] = {"request": request, "result": result, "peak_added_bytes": added}
    return out


def test_smollm2_weights_trial_on_the_device(
    trials: dict[str, Any], suite_device: torch.device, gpu_record: Any
) -> None:
    """The trial computes on the device in the dtype asked for and says so; on CUDA it added at least
    its own copy of the parent's weights to the device (it loaded and ran there). The bf16 trial's
    held-out KL is within 10 % of the fp32 trial's (1.3 % apart on the CPU: 2.385 vs 2.416 nats): looser
    than the fixed-child test above, because the two trials may keep different channels (near-tied
    importance scores) and their inner searches may take different steps."""
    for dtype, width in (("fp32", 4), ("bf16", 2)):
        result, added = trials[dtype]["result"], trials[dtype]["peak_added_bytes"]
        assert result["compute"] == {"device": str(suite_device), "dtype": dtype, "devices": [str(suite_device)]}
        arch = Architecture.from_dict(result["architecture"])
        assert arch.hidden_size == POINT["hidden_size"] and arch.num_active_layers <= POINT["num_layers"]
        assert math.isfinite(result["kl_to_parent"]) and 0 < result["quality"] < 1
        timings = result["timings_s"]
        assert {"parent", "search", "quality", "total", "parent_load", "parent_importance"} <= set(timings)
        if added is not None:
            assert added >= width * trials["parent_params"]
        gpu_record(
            **{
                f"{dtype}_kl": result["kl_to_parent"],
                f"{dtype}_trial_s": timings["total"],
                f"{dtype}_search_s": timings["search"],
                f"{dtype}_peak_added_bytes": added,
            }
        )
    kl32, kl16 = trials["fp32"]["result"]["kl_to_parent"], trials["bf16"]["result"]["kl_to_parent"]
    assert abs(kl16 - kl32) <= 0.1 * kl32


def _trial_config(request: dict[str, Any]) -> TrialConfig:
    """The trial's config as the trial resolved it: its workload picks the built-in text (prose for
    datacenter), so importance and the selection rows are the trial's own."""
    return TrialConfig.from_dict(request["inner"]).for_workload(Target.from_dict(request["target"]).workload)


@pytest.fixture(scope="module")
def exported(trials: dict[str, Any], suite_device: torch.device, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bf16 trial's architecture cut from the bf16 parent on the device with the trial's own
    importance (what ``autocompress prune --from-study`` exports), written with its tokenizer."""
    request = trials["bf16"]["request"]
    context, _ = parent_context(MODEL, _trial_config(request), Path(request["cache_dir"]))
    arch = Architecture.from_dict(trials["bf16"]["result"]["architecture"])
    child = materialize(context.model, plan_pruning(context.architecture, context.importance, arch))
    out = tmp_path_factory.mktemp("smollm2-export") / "child"
    return export_model(child, arch, out, parent=MODEL, tokenizer=context.tokenizer)


def test_smollm2_export_reloads_on_the_device_with_the_trials_kl(
    trials: dict[str, Any], exported: Path, suite_device: torch.device
) -> None:
    """The export reloads on the device in bf16 with the trial's architecture, and its held-out KL on
    the trial's own evaluation rows is the trial's (to 1e-3 nats: the same weights and kernels)."""
    request, result = trials["bf16"]["request"], trials["bf16"]["result"]
    back = load_model(exported, device=suite_device, dtype=BF16, cache=False)
    assert not architecture_mismatch(back.architecture, Architecture.from_dict(result["architecture"]).active())
    assert {p.device for p in back.model.parameters()} == {suite_device}
    context, _ = parent_context(MODEL, _trial_config(request), Path(request["cache_dir"]))
    assert heldout_quality(context, back.model)["kl_to_parent"] == pytest.approx(result["kl_to_parent"], abs=1e-3)
    clear_trial_cache()


def test_smollm2_distill_steps_on_the_device(
    exported: Path, suite_device: torch.device, tmp_path: Path, peak_memory: Any, gpu_record: Any
) -> None:
    """Three distillation steps (bf16 compute over fp32 master weights) of the exported child from
    SmolLM2 on the device, with activation checkpointing and the chunked KL: finite losses, a
    held-out KL that falls, and a checkpoint that reloads in bf16 on the device."""
    recipe = DistillRecipe(steps=3, batch_size=2, seq_len=64, lr=3e-4, save_every=3, n_eval_rows=2)
    with peak_memory() as peak:
        result = distill(
            exported,
            MODEL,
            tmp_path / "distilled",
            recipe,
            progress=False,
            device=str(suite_device),
            compute_dtype="bf16",
            gradient_checkpointing=True,
            kl_chunk=32,
        )
    assert (result.device, result.precision, result.complete) == (str(suite_device), "bf16-mixed", True)
    assert all(math.isfinite(loss) for loss in result.losses)
    assert result.final_kl is not None and result.final_kl < result.initial_kl
    back = load_model(result.out_dir, device=suite_device, dtype=BF16, cache=False)
    assert {p.dtype for p in back.model.parameters()} == {BF16}
    gpu_record(
        initial_kl=result.initial_kl,
        final_kl=result.final_kl,
        seconds_per_step=result.seconds_per_step,
        tokens_per_s=result.tokens_per_s,
        peak_bytes=peak["peak_bytes"],
    )
