"""vLLM, for real (skipped with `make engines` when it is not installed): a uniform and a
heterogeneous tiny Llama export (a dropped layer, an attention-free layer, an FFN-free layer,
per-layer KV heads and FFN widths) load and agree with transformers on 256 positions. These run
vLLM with enforce_eager (a faster load); the SmolLM2 exports in test_engines_smollm2 run it compiled,
as vLLM does by default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_models import export, hetero_arch, uniform_arch

from autocompress_opt.cli import main
from autocompress_opt.runtimes.serve_check import serve_check


def test_uniform_export_agrees_with_transformers(vllm_engine: Any, tmp_path: Path) -> None:
    out = export(uniform_arch(), tmp_path / "uniform")
    result = serve_check(out, "vllm", vllm_eager=True)
    assert result.positions == 256 and result.fmt == "hf-float32"
    assert result.details["enforce_eager"] is True
    assert result.top1_agreement >= 0.99, result.line()
    assert result.max_abs_logprob_diff < 1e-2, result.line()


def test_hetero_export_agrees_with_transformers_through_the_cli(
    vllm_engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = export(hetero_arch(), tmp_path / "hetero")  # heterogeneous: written in DeciLM form directly
    assert main(["serve-check", str(out), "--engine", "vllm", "--vllm-eager", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["positions"] == 256 and report["fmt"] == "hf-float32"
    assert report["details"]["enforce_eager"] is True and report["details"]["served_model_type"] == "nemotron-nas"
    assert report["top1_agreement"] >= 0.99 and report["max_abs_logprob_diff"] < 1e-2
