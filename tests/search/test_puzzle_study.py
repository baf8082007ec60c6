"""A weights-mode study of a tiny Nemotron-H served by llama.cpp (issue 43): its trials give each MoE layer
its own expert width and top-k (the Puzzle form llama.cpp reads), store them (kept record), `study show`
lists them per layer, and `prune --from-study` writes a `nemotron_h_puzzle` checkpoint that loads in
transformers without trust_remote_code and computes the masked parent's logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from puzzle_helpers import llamacpp_study
from tiny_families import hybrid_model, tokens

from autocompress_opt.arch.hybrid import per_layer_moe
from autocompress_opt.cli import main
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.expert_kept import masks_from_expert_kept
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.search.study.trials import searches_per_layer
from autocompress_opt.serving.targets import Target

# Tiny models cost the same at every size but for their parameters: fewer active parameters meet this (the
# throughput held at the parent's instead of the workload's default 1.5x).
TARGET = Target("h100-sxm", "datacenter", constraints={"output_throughput_tok_s": "1x", "active_params": "0.9x"})


# The tiny Nemotron-H without its dense MLP layer: llama.cpp's Puzzle reader takes a dense MLP layer for a
# Mamba-2 one (prune.loadability), so with it a llama.cpp-served study stays uniform.
KINDS = ["linear_attention", "moe", "full_attention", "linear_attention", "moe"]


def test_only_engines_that_read_the_puzzle_form_search_per_layer() -> None:
    from autocompress_opt.arch.catalog import load_architecture

    nemotron = load_architecture("nemotron-3-super-120b-a12b")
    assert searches_per_layer(nemotron, "llamacpp") and searches_per_layer(nemotron, "any")
    assert not searches_per_layer(nemotron, "vllm")
    assert not searches_per_layer(load_architecture("qwen3-30b-a3b"), "any")
    with_mlp, without = hybrid_model(), hybrid_model(layers_block_type=KINDS)
    arch = lambda m: moe_adapter(m).architecture(m)
    assert not searches_per_layer(arch(with_mlp), "llamacpp") and searches_per_layer(arch(with_mlp), "any")
    assert searches_per_layer(arch(without), "llamacpp")


@pytest.mark.slow
def test_a_llamacpp_served_hybrid_study_exports_a_per_layer_puzzle_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tiny_lm import save_hf_dir
    from transformers import AutoModelForCausalLM

    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.search.study import load_records

    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    tiny = hybrid_model(vocab_size=260, layers_block_type=KINDS, mlp_bias=False, use_bias=False)  # as llama.cpp holds
    model_dir = save_hf_dir(tiny, tmp_path / "hybrid")
    cfg, outcome = llamacpp_study("puzzle", model_dir, TARGET, tmp_path, trials=3)
    records, _ = load_records(cfg.storage_url, cfg.study_name(TARGET))
    done = [r for r in records if r.state == "COMPLETE"]
    assert len(done) == 3 and outcome.complete == 3
    archs = {r.number: r.arch() for r in done}
    per_layer = [r for r in done if (a := archs[r.number]) is not None and per_layer_moe(a)]
    assert per_layer, [a.summary() for a in archs.values() if a is not None]
    assert all(r.selection is not None and r.selection["chosen"] == "trained" for r in per_layer)
    assert main(["study", "show", "puzzle", "--storage", cfg.storage_url, "--all"]) == 0
    shown = capsys.readouterr().out
    assert "ch, top-[" in shown and "MoE layers: each its own expert width" in shown

    best = per_layer[0]
    out_dir = tmp_path / "export"
    args = ["prune", "--from-study", "puzzle", "--storage", cfg.storage_url, "--trial", str(best.number)]
    assert main([*args, "--out", str(out_dir)]) == 0
    config = json.loads((out_dir / "config.json").read_text())
    assert config["model_type"] == "nemotron_h_puzzle"
    moe_blocks = [b for b in config["block_configs"] if b["block_type"] == "moe"]
    best_arch = archs[best.number]
    assert best_arch is not None
    moe_specs = [layer.moe for layer in best_arch.layers if layer.moe is not None]
    assert [(b["moe_intermediate_size"], b["num_experts_per_tok"]) for b in moe_blocks] == [
        (m.expert_width, m.experts_per_token) for m in moe_specs
    ]
    child = AutoModelForCausalLM.from_pretrained(out_dir)
    loaded = load_model(model_dir)
    assert best.kept is not None
    masks = masks_from_expert_kept(loaded.architecture, best.kept)
    ids = tokens(2, 12, seed=8)
    with torch.no_grad(), apply_masks(loaded.model, masks, adapter=moe_adapter(loaded.model)):
        masked = loaded.model(ids).logits
    with torch.no_grad():
        torch.testing.assert_close(child(ids).logits, masked)
