"""The ``autocompress serve-check`` verb: JSON report from a real engine, and one-line refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from engine_models import export, hetero_arch

from autocompress_opt.cli import main


def test_serve_check_json_from_llamacpp(
    llamacpp_engine: Any, smollm2_tokenizer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = export(hetero_arch(), tmp_path / "hetero", smollm2_tokenizer, decilm=False)
    gguf = tmp_path / "kept.gguf"
    argv = ["serve-check", str(out), "--engine", "llamacpp", "--gguf", "f32", "--positions", "128", "--json"]
    assert main([*argv, "--keep-gguf", str(gguf), "--decilm-out", str(tmp_path / "decilm")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == "llamacpp" and report["fmt"] == "gguf-f32" and report["positions"] == 128
    assert report["top1_agreement"] >= 0.99 and report["max_abs_logprob_diff"] < 0.01
    assert gguf.stat().st_size == report["details"]["gguf_bytes"]
    assert json.loads((tmp_path / "decilm" / "config.json").read_text())["model_type"] == "nemotron-nas"


def test_serve_check_names_what_the_engine_cannot_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before any engine is needed: head size 16 is not one vLLM's CPU attention takes."""
    arch = hetero_arch()
    narrow = replace(
        arch,
        hidden_size=64,
        layers=tuple(replace(layer, head_dim=16) if layer.attention else layer for layer in arch.layers),
    )
    out = export(narrow, tmp_path / "narrow", decilm=False)
    assert main(["serve-check", str(out), "--engine", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "vllm cannot load" in err and "head size 16" in err
    assert main(["serve-check", str(tmp_path / "nothing"), "--engine", "llamacpp"]) == 2
    assert "no config.json" in capsys.readouterr().err
