"""The real SmolLM2-135M, pruned uniform and heterogeneous within the engines' rules, served by
vLLM and llama.cpp (each skipped with `make engines` when it is not installed)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.arch.architecture import LayerSpec
from autocompress_opt.runtimes import install

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_exports(smollm2_loaded: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Uniform: every FFN 1024 wide, 2 layers dropped. Heterogeneous: layers 5 and 17 dropped, layer 2
    attention-free, layer 7 without FFN (attention kept), FFN 1024 in every third, 512 in layer 10; 9
    query heads of 64 channels everywhere (DeciLM's and llama.cpp's rule). KV heads stay 3: pruning
    removes a KV group with its query heads, so per-layer KV heads would change the query heads,
    which DeciLM cannot express (the tiny tests vary KV heads on random weights instead)."""
    from autocompress_opt.data.textdata import calibration_batches
    from autocompress_opt.prune.export import export_model
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize

    missing = install.status()
    if all(state != "installed" for state in missing.values()):  # nothing to serve it: skip before pruning
        pytest.skip("; ".join(missing.values()))
    root = tmp_path_factory.mktemp("smollm2-engines")
    parent, tokenizer, arch = smollm2_loaded.model, smollm2_loaded.tokenizer, smollm2_loaded.architecture
    calib = calibration_batches(tokenizer, n_samples=4, seq_len=64, seed=0)
    importance = estimate_importance(
        parent, calib, model_id="smollm2-135m", data_id="test-4x64", seed=0, cache_dir=root / "imp", progress=False
    )
    uniform = list(arch.layers)
    for i in range(len(uniform)):
        uniform[i] = LayerSpec.dropped() if i in (5, 17) else replace(uniform[i], ffn_width=1024)
    hetero = list(arch.layers)
    for i in range(len(hetero)):
        if i % 3 == 0:
            hetero[i] = replace(hetero[i], ffn_width=1024)
    hetero[5] = hetero[17] = LayerSpec.dropped()
    hetero[2] = replace(hetero[2], attention=False, num_heads=0, num_kv_heads=0, head_dim=0)
    hetero[7] = replace(hetero[7], ffn=False, ffn_width=0)
    hetero[10] = replace(hetero[10], ffn_width=512)
    out = {}
    for kind, layers in (("uniform", uniform), ("hetero", hetero)):
        target = replace(arch, layers=tuple(layers), name=f"smollm2-{kind}")
        model = materialize(parent, plan_pruning(arch, importance, target))
        out[kind] = export_model(model, target.active(), root / kind, tokenizer=tokenizer, decilm=True)
    return out


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
@pytest.mark.parametrize("kind", ["uniform", "hetero"])
def test_pruned_smollm2_serves_as_transformers_computes(
    engine: str, kind: str, smollm2_exports: dict[str, Path]
) -> None:
    from autocompress_opt.runtimes.serve_check import serve_check

    try:
        install.llamacpp() if engine == "llamacpp" else install.vllm()
    except install.EngineMissing as exc:
        pytest.skip(str(exc))
    result = serve_check(smollm2_exports[kind], engine, gguf="f16")
    print(result.line())
    assert result.positions == 256
    assert result.top1_agreement >= 0.99, result.line()
    assert result.max_abs_logprob_diff < 0.5, result.line()
