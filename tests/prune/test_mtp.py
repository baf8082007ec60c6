"""A parent's multi-token-prediction layers in an export: dropped (the config says so) or kept whole."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_families import hybrid_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.export import CARD_FILE, export_model
from autocompress_opt.prune.mtp import MTP_FILE, check_mtp_keep, settle_mtp


def _keys(folder: Path) -> set[str]:
    out: set[str] = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            out |= set(f.keys())
    return out


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, dict[str, torch.Tensor]]:
    """A tiny Nemotron-H saved as a checkpoint that declares one MTP layer and holds its tensors, as
    Nemotron 3 Super's does (transformers neither builds nor saves them)."""
    model = hybrid_model()
    folder = tmp_path_factory.mktemp("mtp") / "parent"
    model.save_pretrained(folder)
    hidden = model.config.hidden_size
    gen = torch.Generator().manual_seed(7)
    mtp = {
        "mtp.layers.0.enorm.weight": torch.randn(hidden, generator=gen),
        "mtp.layers.0.eh_proj.weight": torch.randn(hidden, 2 * hidden, generator=gen),
    }
    save_file({**load_file(str(folder / "model.safetensors")), **mtp}, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    return model, folder, mtp


def _export(model: Any, out: Path, **kwargs: Any) -> Path:
    model.config.num_nextn_predict_layers = 1  # as loading the parent's config gives it
    arch = Architecture.from_hf_config(model.config.to_dict())
    return export_model(model, arch, out, **kwargs)


def test_by_default_the_export_drops_them_and_its_config_and_card_say_so(parent: Any, tmp_path: Path) -> None:
    model, _, _ = parent
    out = _export(model, tmp_path / "child")
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 0
    assert not any(k.startswith("mtp.") for k in _keys(out))
    record = json.loads((out / CARD_FILE).read_text())["mtp"]
    assert record["kept"] is False and record["parent_layers"] == 1


def test_keep_copies_the_parents_tensors_unchanged_and_the_child_still_loads(parent: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, folder, mtp = parent
    out = _export(model, tmp_path / "child", mtp="keep", parent_dir=folder)
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1
    stored = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(stored[k], v) for k, v in mtp.items())
    assert json.loads((out / CARD_FILE).read_text())["mtp"] == {
        "kept": True,
        "parent_layers": 1,
        "tensors": 2,
        "note": "copied unchanged from the parent",
    }
    child = AutoModelForCausalLM.from_pretrained(out)  # the MTP tensors are not built, as for the parent
    x = tokens()
    with torch.no_grad():
        assert torch.allclose(child(x).logits, model(x).logits, atol=1e-5)


def test_keep_is_refused_where_it_cannot_hold(parent: Any, tmp_path: Path) -> None:
    model, folder, _ = parent
    check_mtp_keep(folder)  # declares and holds them: fine
    with pytest.raises(ConfigError, match="is not a local checkpoint folder"):
        check_mtp_keep(tmp_path / "nowhere")
    plain = shutil.copytree(folder, tmp_path / "plain")
    save_file(
        {k: v for k, v in load_file(str(plain / "model.safetensors")).items() if not k.startswith("mtp.")},
        str(plain / "model.safetensors"),
    )
    with pytest.raises(ConfigError, match="declares MTP layers but holds no mtp"):
        check_mtp_keep(plain)
    out = _export(model, tmp_path / "child")  # dropped; then pretend the child cut the hidden size
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1, "hidden_size": 8}))
    with pytest.raises(
        ConfigError,
        match=rf"changes them \(hidden_size {model.config.hidden_size} -> 8\); keep the parent's hidden size",
    ):
        settle_mtp(out, choice="keep", parent_dir=folder)
    with pytest.raises(ConfigError, match="--mtp must be one of drop, keep, got 'both'"):
        _export(model, tmp_path / "other", mtp="both")
    assert not (tmp_path / "other").exists()  # refused before anything was written


def test_a_sharded_export_gets_them_as_one_more_indexed_file(parent: Any, tmp_path: Path) -> None:
    _, folder, mtp = parent
    out = tmp_path / "sharded"
    out.mkdir()
    own = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if not k.startswith("mtp.")}
    save_file(own, str(out / "model-00001-of-00001.safetensors"))
    index = {"metadata": {}, "weight_map": dict.fromkeys(own, "model-00001-of-00001.safetensors")}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((folder / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config))
    assert settle_mtp(out, choice="keep", parent_dir=folder)["kept"] is True
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert {k: weight_map[k] for k in mtp} == dict.fromkeys(mtp, MTP_FILE)
    assert set(load_file(str(out / MTP_FILE))) == set(mtp)


def test_a_parent_without_them_is_left_alone_and_keep_is_refused_early(tmp_path: Path, capsys: Any) -> None:
    from tiny_lm import save_hf_dir, tiny_model

    plain = save_hf_dir(tiny_model("llama"), tmp_path / "llama")
    assert settle_mtp(plain) is None  # no MTP layer: nothing to settle, nothing on the card
    code = main(["prune", "--model", str(plain), "--params", "0.5", "--out", str(tmp_path / "x"), "--mtp", "keep"])
    assert code != 0 and "declares no MTP layer" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
