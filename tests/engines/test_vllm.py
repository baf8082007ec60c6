"""vLLM, for real (skipped with `make engines` when it is not installed): a uniform and a
heterogeneous tiny Llama export (a dropped layer, an attention-free layer, an FFN-free layer,
per-layer KV heads and FFN widths) load and agree with transformers on 256 positions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_models import export, hetero_arch, uniform_arch

from autocompress_opt.engines.serve_check import serve_check


@pytest.mark.parametrize("kind", ["uniform", "hetero"])
def test_export_agrees_with_transformers(kind: str, vllm_engine: Any, tmp_path: Path) -> None:
    arch = uniform_arch() if kind == "uniform" else hetero_arch()
    out = export(arch, tmp_path / kind)  # heterogeneous: written in DeciLM form directly
    result = serve_check(out, "vllm")
    assert result.positions == 256 and result.fmt == "hf-float32"
    assert result.top1_agreement >= 0.99, result.line()
    assert result.max_abs_logprob_diff < 1e-2, result.line()
