"""``autocompress prune --serve-as ENGINE``: the result is checked against what the engine loads
before anything is written, and a heterogeneous model is exported in the DeciLM form that vLLM and
llama.cpp read (a uniform one stays a plain checkpoint)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tiny_lm import save_hf_dir, tiny_model

from autocompress_opt.arch.architecture import LayerSpec
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.cli import main


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 layers, hidden 128, 4 query heads of 32 (vLLM's CPU attention takes 32), FFN 768."""
    model = tiny_model(
        "llama",
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=768,
        num_hidden_layers=4,
    )
    return save_hf_dir(model, tmp_path_factory.mktemp("parent") / "llama")


def arch_file(parent_dir: Path, tmp_path: Path, layers: list[LayerSpec], name: str) -> Path:
    parent = load_architecture(str(parent_dir))
    path = tmp_path / f"{name}.json"
    replace(parent, name=name, layers=tuple(layers)).save(path)
    return path


def prune(parent_dir: Path, tmp_path: Path, *extra: str) -> int:
    argv = ["prune", "--model", str(parent_dir), "--samples", "2", "--seq-len", "16", "--no-progress"]
    return main([*argv, "--cache-dir", str(tmp_path / "cache"), *extra])


def test_a_heterogeneous_model_within_the_rules_is_exported_as_decilm(parent_dir: Path, tmp_path: Path) -> None:
    full = LayerSpec(True, 4, 4, 32, True, 768)
    layers = [replace(full, ffn_width=512), LayerSpec.dropped(), LayerSpec(False, 0, 0, 0, True, 256), full]
    out = tmp_path / "out"
    path = arch_file(parent_dir, tmp_path, layers, "h")
    code = prune(parent_dir, tmp_path, "--arch", str(path), "--out", str(out), "--serve-as", "vllm")
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "nemotron-nas" and config["architectures"] == ["DeciLMForCausalLM"]
    # the dropped layer is left out; the attention-free one stays as a block without attention
    assert [b["attention"]["no_op"] for b in config["block_configs"]] == [False, True, False]


def test_a_shape_the_engine_cannot_load_is_refused_before_anything_is_written(
    parent_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = LayerSpec(True, 4, 4, 32, True, 768)
    layers = [full, replace(full, ffn_width=300), full, full]  # FFN 300: not a multiple of 256
    out = tmp_path / "out"
    path = arch_file(parent_dir, tmp_path, layers, "bad")
    assert prune(parent_dir, tmp_path, "--arch", str(path), "--out", str(out), "--serve-as", "vllm") == 2
    err = capsys.readouterr().err.strip()
    assert "--serve-as vllm" in err and "256" in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "cache").exists()  # refused before the model loaded
    assert prune(parent_dir, tmp_path, "--arch", str(path), "--out", str(out), "--serve-as", "vlm") == 2
    assert "unknown engine 'vlm'" in capsys.readouterr().err


def test_a_uniform_model_stays_a_plain_checkpoint(parent_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert prune(parent_dir, tmp_path, "--params", "0.7", "--out", str(out), "--serve-as", "llamacpp") == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
