"""The DeciLM export the engines read, checked without any engine: the keys their readers dispatch
on and read, the ffn_mult round trip, refusals naming what DeciLM cannot express, exact reloads, and
llama.cpp's workaround (a zero FFN) leaving the model's function unchanged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_models import HIDDEN, export, hetero_arch, random_model, uniform_arch

from autocompress_opt.arch.architecture import LayerSpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.export import (
    decilm_ffn_mult,
    decilm_ffn_width,
    decilm_problems,
    export_model,
    load_exported,
    to_decilm,
)
from autocompress_opt.runtimes import install
from autocompress_opt.runtimes.llamacpp import attention_only_layers, llamacpp_ready_copy
from autocompress_opt.runtimes.serve_check import check_sequences, compare


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


IDS = torch.randint(0, 49152, (2, 16), generator=torch.Generator().manual_seed(3))


def test_decilm_config_has_what_vllm_and_llamacpp_read(tmp_path: Path) -> None:
    out = export(hetero_arch(), tmp_path / "hetero")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "nemotron-nas" and config["architectures"] == ["DeciLMForCausalLM"]
    assert config["auto_map"] == {"AutoConfig": "configuration_decilm.DeciLMConfig"}
    assert (out / "configuration_decilm.py").is_file()
    assert config["num_attention_heads"] == 4 and config["hidden_size"] == HIDDEN
    blocks = config["block_configs"]
    assert len(blocks) == config["num_hidden_layers"] == 4  # the dropped layer is not written
    attn = [b["attention"] for b in blocks]
    ffn = [b["ffn"] for b in blocks]
    assert [a["no_op"] for a in attn] == [False, True, False, False]
    assert [a["n_heads_in_group"] for a in attn] == [2, None, 4, 1]  # KV heads = 4 / n: 2, -, 1, 4
    assert all(a["replace_with_linear"] is False for a in attn)
    assert [f["no_op"] for f in ffn] == [False, False, True, False]
    assert ffn[2]["ffn_mult"] is None  # llama.cpp's converter reads a removed FFN from ffn_mult null
    widths = [decilm_ffn_width(f["ffn_mult"], HIDDEN) for f in ffn if f["ffn_mult"] is not None]
    assert widths == [512, 256, 768]


def test_ffn_mult_round_trip_and_refusals() -> None:
    for hidden in (64, 576, 960, 2048, 4096):
        for width in range(256, 16385, 256):
            assert decilm_ffn_width(decilm_ffn_mult(width, hidden), hidden) == width
    with pytest.raises(ConfigError, match="not a positive multiple of 256"):
        decilm_ffn_mult(1536 + 64, 576)


def test_what_decilm_cannot_express_is_named(tmp_path: Path) -> None:
    base = hetero_arch()
    per_layer_heads = replace(base, layers=(*base.layers[:4], LayerSpec(True, 2, 1, 32, True, 768)))
    assert any("query heads differ" in p for p in decilm_problems(per_layer_heads))
    odd_width = replace(base, layers=(*base.layers[:4], LayerSpec(True, 4, 4, 32, True, 700)))
    # layers are numbered as exported (the dropped layer 1 is not written)
    assert decilm_problems(odd_width) == ["layer 3: FFN width 700 is not a multiple of 256"]
    assert any("not Llama-like" in p for p in decilm_problems(replace(base, family="qwen3", qk_norm=True)))
    assert any("QK-norm" in p for p in decilm_problems(replace(base, qk_norm=True)))
    assert decilm_problems(base) == []
    with pytest.raises(ConfigError, match="layer 3: FFN width 700") as err:
        export_model(random_model(odd_width), odd_width, tmp_path / "odd", decilm=True)
    assert "autocompress_decilm" in str(err.value) and not (tmp_path / "odd").exists()


def test_uniform_export_stays_a_plain_llama_checkpoint(tmp_path: Path) -> None:
    out = export(uniform_arch(), tmp_path / "uniform")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and "block_configs" not in config
    with pytest.raises(ConfigError, match="plain 'llama' checkpoint"):
        to_decilm(out, tmp_path / "again")


def test_decilm_export_reloads_exactly_and_converts_from_the_package_form(tmp_path: Path) -> None:
    arch = hetero_arch()
    model = random_model(arch)
    direct = export_model(model, arch, tmp_path / "direct", decilm=True)
    package = export_model(model, arch, tmp_path / "package")
    assert json.loads((package / "config.json").read_text())["model_type"] == "autocompress_decilm"
    converted = to_decilm(package, tmp_path / "converted")
    ref = logits(model, IDS)
    for path in (direct, package, converted):
        torch.testing.assert_close(logits(load_exported(path), IDS), ref, rtol=0, atol=0)
    assert json.loads((converted / "config.json").read_text()) == json.loads((direct / "config.json").read_text())


def test_shipped_configuration_code_gives_attribute_access(tmp_path: Path) -> None:
    """What vLLM's nemotron_nas reads: block_configs[i].attention.no_op / .n_heads_in_group, .ffn.ffn_mult."""
    from transformers import AutoConfig

    out = export(hetero_arch(), tmp_path / "hetero")
    config = AutoConfig.from_pretrained(out, trust_remote_code=True)
    assert type(config).__name__ == "DeciLMConfig" and config.model_type == "nemotron-nas"
    blocks = config.block_configs
    assert [b.attention.no_op for b in blocks] == [False, True, False, False]
    assert blocks[0].attention.n_heads_in_group == 2 and hasattr(blocks[0].ffn, "ffn_mult")
    assert json.loads(config.to_json_string())["block_configs"][2]["ffn"]["ffn_mult"] is None


def test_llamacpp_padding_keeps_the_function(tmp_path: Path) -> None:
    """The zero FFN given to attention-only layers for llama.cpp changes no logit."""
    out = export(hetero_arch(), tmp_path / "hetero")
    assert attention_only_layers(json.loads((out / "config.json").read_text())) == [2]
    ready = llamacpp_ready_copy(out, tmp_path / "ready")
    assert ready != out and attention_only_layers(json.loads((ready / "config.json").read_text())) == []
    torch.testing.assert_close(logits(load_exported(ready), IDS), logits(load_exported(out), IDS), rtol=0, atol=0)
    uniform = export(uniform_arch(), tmp_path / "uniform")
    assert llamacpp_ready_copy(uniform, tmp_path / "unused") == uniform


def test_sequences_and_comparison() -> None:
    seqs = check_sequences(None, 1000, positions=256, length=64)
    assert [len(s) for s in seqs] == [64] * 4 and seqs == check_sequences(None, 1000, 256, 64)
    ref = [np.log(np.full((3, 4), 0.25))]
    ref[0][:, 1] = np.log(0.4)
    same = [[{1: float(np.log(0.4)), 0: float(np.log(0.25))}] * 3]
    assert compare(ref, same)[:2] == (1.0, 0.0)
    off = [[{0: float(np.log(0.5)), 1: float(np.log(0.3))}] * 3]
    agreement, worst, _, n = compare(ref, off)
    assert agreement == 0.0 and n == 3 and worst == pytest.approx(np.log(0.5) - np.log(0.25))


def test_missing_engine_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(install.EngineMissing, match="make engines"):
        install.llamacpp(tmp_path / "nowhere")
    with pytest.raises(install.EngineMissing, match="make engines"):
        install.vllm(tmp_path / "no-venv")


def test_engine_rules_name_what_is_not_loadable() -> None:
    from autocompress_opt.prune.loadability import ENGINE_RULES, loadable_problems

    assert set(ENGINE_RULES) == {"vllm", "sglang", "trtllm", "llamacpp", "transformers"}
    hetero = hetero_arch()
    assert all(loadable_problems(hetero, engine) == [] for engine in ENGINE_RULES)
    narrow = replace(hetero, layers=tuple(replace(l, head_dim=16) if l.attention else l for l in hetero.layers))
    assert any("head size 16" in p for p in loadable_problems(narrow, "vllm"))
    assert any("head_dim = hidden / query heads = 128/4" in p for p in loadable_problems(narrow, "llamacpp"))
    assert loadable_problems(narrow, "transformers") == []
    qwen = replace(hetero, family="qwen3", qk_norm=True)
    assert any("QK-norm" in p for p in loadable_problems(qwen, "vllm"))
    assert loadable_problems(replace(uniform_arch(), family="qwen3", qk_norm=True), "vllm") == []
    first_free = replace(hetero, layers=hetero.layers[2:])  # starts with the attention-free layer
    assert loadable_problems(first_free, "vllm") == ["vllm's DeciLM reader needs attention in the first layer"]
    assert loadable_problems(first_free, "llamacpp") == []
    with pytest.raises(ConfigError, match="unknown engine 'vlm'"):
        loadable_problems(hetero, "vlm")
