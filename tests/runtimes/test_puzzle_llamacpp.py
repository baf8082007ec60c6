"""llama.cpp runs Nemotron-H's per-layer ("Puzzle") export, for real (skipped with `make engines` when it is
not installed): a tiny Nemotron-H whose two MoE layers keep different expert widths and top-k is exported
(``nemotron_h_puzzle``), converted by llama.cpp's own converter (``NemotronHPuzzleModel``: a
``nemotron_h_moe`` GGUF with per-layer ``expert_feed_forward_length`` and ``expert_used_count``), and its
next token agrees with the masked parent's on 256 positions in f32.

The tiny model stays within what llama.cpp's ``nemotron_h_moe`` holds (``src/models/nemotron-h.cpp``,
``conversion/nemotron.py``; each was tried and fails as said): no biases on the Mamba-2 projections, the
latent projections or the shared expert (the loader creates no such tensors: "wrong number of
tensors"); no dense MLP layer beside the MoE ones (the Puzzle converter writes feed_forward_length 0 for
it, which the loader takes for a Mamba-2 layer: "blk.N.ssm_in.weight not found"); ``moe_latent_size``
set (the Puzzle converter writes it unconditionally); a Mamba-2 inner width that is a multiple of 64 (the
converter's Granite-hybrid check), so heads of 64 channels as in the released models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from puzzle_helpers import llamacpp_study, per_layer_masks
from tiny_families import hybrid_model, tokens

from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.experts import export_experts, hidden_choice, slice_hidden
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.runtimes.llamacpp import convert_to_gguf, gguf_logits
from autocompress_opt.runtimes.serve_check import _log_softmax, _top_rows, check_sequences, compare

# Mamba-2, latent MoE, attention, Mamba-2, latent MoE; hidden 48, the SmolLM2 tokenizer's vocabulary.
# MoE: 8 experts of 16 channels over a latent width of 16, top-2, a shared expert of 32. Mamba-2: 8 heads
# of 64 channels in 2 groups. Both MoE layers keep 6 experts and 24 shared channels, both Mamba-2 layers 6
# heads; layer 1 keeps 8 channels per expert and top-1, layer 4 12 channels and top-2.
KINDS = ["linear_attention", "moe", "full_attention", "linear_attention", "moe"]
VOCAB = 49152
BASE = {"num_experts": 6, "shared_width": 24, "mamba_heads": 6}
PER_LAYER = {1: {"expert_width": 8, "experts_per_token": 1}, 4: {"expert_width": 12, "experts_per_token": 2}}


def engine_ready_model() -> Any:
    """The tiny Nemotron-H above, random weights (the routers' correction biases too): tiny_families'
    hybrid with the layers, vocabulary, head size and biases llama.cpp holds."""
    return hybrid_model(
        vocab_size=VOCAB,
        max_position_embeddings=512,
        layers_block_type=KINDS,
        mamba_head_dim=64,
        mlp_bias=False,
        use_bias=False,
    )


@pytest.fixture(scope="module")
def puzzle(
    tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer: Any, llamacpp_engine: Any
) -> tuple[Path, list[list[int]], list[np.ndarray]]:
    """The exported Puzzle folder (with the SmolLM2 tokenizer the converter needs), the check sequences
    and the masked parent's next-token log-probabilities on them (float32)."""
    torch.set_num_threads(2)
    model = engine_ready_model()
    adapter = moe_adapter(model)
    importance = estimate_importance(model, tokens(4, 12), adapter=adapter, progress=False)
    masks = per_layer_masks(model, importance, BASE, PER_LAYER)
    out = export_experts(model, masks, tmp_path_factory.mktemp("puzzle") / "child")
    smollm2_tokenizer.save_pretrained(out)
    sequences = check_sequences(smollm2_tokenizer, VOCAB, positions=256, length=64)
    with torch.no_grad(), apply_masks(model, masks, adapter=adapter):
        reference = [_log_softmax(model(torch.tensor([ids])).logits[0].numpy()) for ids in sequences]
    return out, sequences, reference


@pytest.mark.slow
def test_llamacpp_runs_the_puzzle_export_as_the_masked_parent(
    puzzle: tuple[Path, list[list[int]], list[np.ndarray]], tmp_path: Path
) -> None:
    from gguf import GGUFReader

    out, sequences, reference = puzzle
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["NemotronHPuzzleForCausalLM"]
    # pad_attention_only: the DeciLM padding reads DeciLM block_configs; a Puzzle folder needs none
    gguf = convert_to_gguf(out, tmp_path / "puzzle-f32.gguf", "f32", pad_attention_only=False)
    fields = {name: field.contents() for name, field in GGUFReader(str(gguf)).fields.items()}
    assert fields["general.architecture"] == "nemotron_h_moe"
    assert fields["nemotron_h_moe.expert_feed_forward_length"] == [0, 8, 0, 0, 12]
    assert fields["nemotron_h_moe.expert_used_count"] == [0, 1, 0, 0, 2]
    assert (fields["nemotron_h_moe.expert_count"], fields["nemotron_h_moe.expert_shared_feed_forward_length"]) == (
        6,
        24,
    )
    rows = [_top_rows(_log_softmax(x), 20) for x in gguf_logits(gguf, sequences)]
    agreement, worst, _, positions = compare(reference, rows)
    assert positions == 256
    assert agreement >= 0.99, (agreement, worst)
    # Measured: 100 % agreement, max |Δ log p| 1.8e-4 (llama.cpp's KV cache is f16). Against a reference
    # whose layer 1 routes to 2 experts instead of 1: 98.0 % and 0.044, so a per-layer top-k lost fails.
    assert worst < 0.01, (agreement, worst)


@pytest.mark.slow
def test_llamacpp_runs_a_puzzle_export_with_fewer_residual_channels(
    smollm2_tokenizer: Any, llamacpp_engine: Any, tmp_path: Path
) -> None:
    """The hidden size cut too (48 → 32 channels, ``slice_hidden``, before the per-layer expert cut): the
    Puzzle export converts and agrees with the cut model under its masks on 128 positions."""
    torch.set_num_threads(2)
    model = engine_ready_model()
    importance = estimate_importance(model, tokens(4, 12), adapter=moe_adapter(model), progress=False)
    channels = hidden_choice(importance, 32)
    cut = slice_hidden(model, channels)
    adapter = moe_adapter(cut)
    masks = per_layer_masks(cut, importance.select_hidden(channels, adapter.architecture(cut)), BASE, PER_LAYER)
    out = export_experts(cut, masks, tmp_path / "child")
    smollm2_tokenizer.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32
    sequences = check_sequences(smollm2_tokenizer, VOCAB, positions=128, length=64)
    with torch.no_grad(), apply_masks(cut, masks, adapter=adapter):
        reference = [_log_softmax(cut(torch.tensor([ids])).logits[0].numpy()) for ids in sequences]
    gguf = convert_to_gguf(out, tmp_path / "narrow-f32.gguf", "f32", pad_attention_only=False)
    rows = [_top_rows(_log_softmax(x), 20) for x in gguf_logits(gguf, sequences)]
    agreement, worst, _, positions = compare(reference, rows)
    assert positions == 128 and agreement >= 0.99 and worst < 0.01, (agreement, worst)


@pytest.mark.slow
def test_serve_check_runs_a_puzzle_export_in_llamacpp(puzzle: tuple[Path, list[list[int]], list[np.ndarray]]) -> None:
    """The user's check of an export, `serve_check` (as `autocompress serve-check` runs it), reads the
    Puzzle folder (its architecture per layer, no DeciLM padding) and passes; vLLM 0.32 reads one
    expert width for every layer, which the engine rules say."""
    from autocompress_opt.prune.loadability import loadable_problems
    from autocompress_opt.runtimes.serve_check import _architecture, serve_check

    out, _, _ = puzzle
    arch = _architecture(json.loads((out / "config.json").read_text()))
    assert [(m.expert_width, m.experts_per_token) for m in (layer.moe for layer in arch.layers) if m] == [
        (8, 1),
        (12, 2),
    ]
    assert any("Puzzle form is read by llamacpp" in p for p in loadable_problems(arch, "vllm"))
    check = serve_check(out, "llamacpp", gguf="f32")
    assert check.positions == 256 and check.top1_agreement >= 0.99 and check.max_abs_logprob_diff < 0.01, check.line()


@pytest.mark.slow
def test_llamacpp_runs_a_studys_own_puzzle_export_as_its_masked_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_tokenizer: Any, llamacpp_engine: Any
) -> None:
    """The whole path on the engine-ready tiny Nemotron-H: a weights-mode study served by llama.cpp gives
    its MoE layers their own expert width and top-k, `prune --from-study` writes the trial's kept record as
    a `nemotron_h_puzzle` folder, and llama.cpp converts it and predicts the masked parent's next token."""
    from autocompress_opt.arch.hybrid import per_layer_moe
    from autocompress_opt.cli import main
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.expert_kept import masks_from_expert_kept
    from autocompress_opt.search.study import load_records
    from autocompress_opt.serving.targets import Target

    torch.set_num_threads(2)
    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    model_dir = tmp_path / "parent"
    engine_ready_model().save_pretrained(model_dir)
    smollm2_tokenizer.save_pretrained(model_dir)
    # The vocabulary's embeddings are nearly all of this model: halving every expert's width saves 0.02 % of
    # its active parameters, so a budget of 0.9998x makes every point cut about half the expert channels.
    limits = {"output_throughput_tok_s": "0.5x", "active_params": "0.9998x"}
    target = Target("h100-sxm", "datacenter", constraints=limits)
    config, _ = llamacpp_study("puzzle-engine", model_dir, target, tmp_path, trials=4)
    records, _ = load_records(config.storage_url, config.study_name(target))
    per_layer = [r for r in records if r.state == "COMPLETE" and (a := r.arch()) is not None and per_layer_moe(a)]
    assert not [r.error for r in records if r.state == "FAIL"]
    assert per_layer, [(r.state, r.arch() and r.arch().summary()) for r in records]
    best = per_layer[0]
    out = tmp_path / "export"
    args = ["prune", "--from-study", "puzzle-engine", "--storage", config.storage_url, "--trial", str(best.number)]
    assert main([*args, "--out", str(out)]) == 0
    smollm2_tokenizer.save_pretrained(out)
    gguf = convert_to_gguf(out, tmp_path / "study-f32.gguf", "f32", pad_attention_only=False)
    sequences = check_sequences(smollm2_tokenizer, VOCAB, positions=256, length=64)
    loaded = load_model(model_dir)
    assert best.kept is not None
    masks = masks_from_expert_kept(loaded.architecture, best.kept)
    with torch.no_grad(), apply_masks(loaded.model, masks, adapter=moe_adapter(loaded.model)):
        reference = [_log_softmax(loaded.model(torch.tensor([ids])).logits[0].numpy()) for ids in sequences]
    rows = [_top_rows(_log_softmax(x), 20) for x in gguf_logits(gguf, sequences)]
    agreement, worst, _, positions = compare(reference, rows)
    assert positions == 256 and agreement >= 0.99, (agreement, worst)
