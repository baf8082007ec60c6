"""Export: checkpoints that reload with identical logits, the model card, overwrite protection, the
heterogeneous model class (config, KV-cache decoding) and the ``autocompress prune`` verb."""

from __future__ import annotations

import json
import types
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_families import FAMILIES, hetero_arch, tiny_hetero_model, tiny_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch
from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM
from autocompress_opt.prune.export import (
    CARD_FILE,
    OutputExistsError,
    export_model,
    load_exported,
    model_card,
    write_card,
)
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.plan import identity_plan, plan_pruning
from autocompress_opt.prune.slicing import materialize

CARD = {
    "constraints": {"tpot_ms": 25.0, "memory_gib": 10.0},
    "predicted_costs": {"tpot_ms": 21.4},
    "hardware": "rtx5070",
}


def logits(model: Any, ids: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens(2, 12, seed=5) if ids is None else ids).logits


def pruned(family: str, uniform: bool) -> tuple[Any, Architecture]:
    """A tiny parent of ``family`` pruned to a uniform or a heterogeneous target."""
    parent = tiny_model(family)
    arch = adapter_for(parent).architecture(parent)
    base = arch.layers[0]
    layers = (
        (replace(base, num_heads=3, num_kv_heads=1, ffn_width=24),) * 2
        if uniform
        else (replace(base, ffn_width=24), replace(base, num_heads=3, num_kv_heads=1), arch.layers[2])
    )
    target = replace(arch, hidden_size=36, layers=layers, name=f"tiny-{family}")
    imp = estimate_importance(parent, tokens(2, 8), model_id=family, progress=False)
    plan = plan_pruning(arch, imp, target)
    return materialize(parent, plan), plan.architecture


def files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("family", FAMILIES)
def test_uniform_export_reloads_as_a_plain_checkpoint(family: str, tmp_path: Path) -> None:
    """A uniform result is a plain family checkpoint: AutoModelForCausalLM loads it, same logits."""
    from transformers import AutoModelForCausalLM

    model, arch = pruned(family, uniform=True)
    out = export_model(model, arch, tmp_path / "out", parent="tiny-parent", card=CARD)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family and "block_configs" not in config
    assert {"config.json", "model.safetensors", "README.md", CARD_FILE} <= files(out)
    assert not [f for f in files(out) if f.endswith((".bin", ".pt", ".pth", ".pkl"))]
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(loaded) is type(model)
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text"])
def test_heterogeneous_export_reloads_through_the_package_class(family: str, tmp_path: Path) -> None:
    """A heterogeneous result is an autocompress_decilm checkpoint with per-layer block_configs."""
    from transformers import AutoModelForCausalLM

    model, arch = pruned(family, uniform=False)
    out = export_model(model, arch, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "autocompress_decilm" and config["base_family"] == family
    assert [b["ffn"]["intermediate_size"] for b in config["block_configs"]] == [24, 48, 48]
    assert [b["attention"]["n_heads_in_group"] for b in config["block_configs"]] == [3, 3, 3]
    loaded = load_exported(out)
    assert isinstance(loaded, AutocompressDeciLMForCausalLM)
    assert architecture_mismatch(arch, adapter_for(loaded).architecture(loaded)) is None
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(out)), logits(model), rtol=0, atol=0)


def test_heterogeneous_class_with_uniform_layers_exports_plain(tmp_path: Path) -> None:
    """An AutocompressDeciLM model whose layers are all alike is written as the plain family class."""
    config = AutocompressDeciLMConfig(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=40,
        base_family="qwen2",
        attention_bias=True,
        rms_norm_eps=1e-5,
    )
    model = AutocompressDeciLMForCausalLM(config).eval()
    arch = adapter_for(model).architecture(model)
    out = export_model(model, arch, tmp_path / "out")
    loaded = load_exported(out)
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    torch.testing.assert_close(logits(loaded), logits(model))


def test_tokenizer_is_saved_when_given(tmp_path: Path) -> None:
    class Tokenizer:
        def save_pretrained(self, directory: Path) -> None:
            (Path(directory) / "tokenizer.json").write_text("{}")

    model, arch = pruned("mistral", uniform=True)
    assert "tokenizer.json" in files(export_model(model, arch, tmp_path / "out", tokenizer=Tokenizer()))


# ------------------------------------------------------------------------------- the card
def test_model_card_records_parent_architecture_constraints_and_costs(tmp_path: Path) -> None:
    model, arch = pruned("llama", uniform=False)
    out = export_model(model, arch, tmp_path / "out", parent={"model": "smollm2-135m"}, card=CARD)
    card = json.loads((out / CARD_FILE).read_text())
    assert card["parent"] == {"model": "smollm2-135m"} and card["kind"] == "heterogeneous"
    assert Architecture.from_dict(card["architecture"]) == arch and card["num_params"] == arch.num_params
    assert card["constraints"] == CARD["constraints"] and card["predicted_costs"] == CARD["predicted_costs"]
    assert card["extra"] == {"hardware": "rtx5070"} and card["model_type"] == "autocompress_decilm"
    readme = (out / "README.md").read_text()
    for text in (
        "smollm2-135m",
        "| tpot_ms | 25.0 |",
        "| tpot_ms | 21.4 |",
        "rtx5070",
        "import autocompress_opt.hf.hetero_model",
    ):
        assert text in readme


def test_a_hybrid_moe_card_names_its_mamba_and_expert_layers(tmp_path: Path) -> None:
    """The README of a MoE / hybrid export (written by write_card, as prune --from-study's expert
    export does) lists Mamba-2 mixers and expert FFNs with their sizes, not as empty layers."""
    from autocompress_opt.arch.catalog import known_architectures

    arch = known_architectures()["nemotron-3-nano-30b-a3b"]
    card = model_card(arch, parent="nemotron-3-nano-30b-a3b", card={"predicted_costs": {"tpot_ms": 9.5}})
    write_card(tmp_path, card)
    assert json.loads((tmp_path / CARD_FILE).read_text())["num_params"] == arch.num_params
    readme = (tmp_path / "README.md").read_text()
    assert "| 0 | Mamba-2 64 heads × 64 | — |" in readme
    assert "| 1 | — | 128 experts × 1856, top-6, shared 3712 |" in readme
    assert "| tpot_ms | 9.5 |" in readme and "Pruned by autocompress_opt from **nemotron-3-nano-30b-a3b**" in readme


def test_card_values_must_be_json(tmp_path: Path) -> None:
    model, arch = pruned("llama", uniform=True)
    with pytest.raises(ConfigError, match="model card entry 'bad' is not JSON-serialisable"):
        export_model(model, arch, tmp_path / "out", card={"bad": object()})
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- overwriting
def test_refuses_to_overwrite_a_non_empty_directory(tmp_path: Path) -> None:
    model, arch = pruned("qwen2", uniform=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="is not empty; pass force=True"):
        export_model(model, arch, out)
    assert files(out) == {"precious.txt"}
    assert isinstance(OutputExistsError("x"), FileExistsError)
    export_model(model, arch, out, force=True)
    assert "precious.txt" not in files(out) and "model.safetensors" in files(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no staging folder left


def test_empty_directory_is_fine_and_a_file_is_not(tmp_path: Path) -> None:
    model, arch = pruned("qwen2", uniform=True)
    (tmp_path / "empty").mkdir()
    export_model(model, arch, tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputExistsError, match="not a directory"):
        export_model(model, arch, tmp_path / "file", force=True)


def test_architecture_must_describe_the_model(tmp_path: Path) -> None:
    model, arch = pruned("llama", uniform=True)
    with pytest.raises(ConfigError, match=r"does not have the given architecture \(hidden_size: expected 40, got 36\)"):
        export_model(model, replace(arch, hidden_size=40), tmp_path / "out")


def test_load_exported_needs_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        load_exported(tmp_path)


# ---------------------------------------------------------------------- hetero model class
@pytest.mark.parametrize("family", FAMILIES)
def test_hetero_class_computes_what_the_family_class_computes(family: str) -> None:
    """Same weights (the state-dict keys are the family's), same logits and hidden states, bit for bit:
    one generic layer implementation covers every family."""
    model = tiny_model(family)
    hetero = materialize(model, identity_plan(adapter_for(model).architecture(model)), heterogeneous=True)
    assert isinstance(hetero, AutocompressDeciLMForCausalLM)
    hetero.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        a, b = model(tokens(), output_hidden_states=True), hetero(tokens(), output_hidden_states=True)
    torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=0)
    for x, y in zip(b.hidden_states, a.hidden_states, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_hetero_kv_cache_decoding_matches_the_full_forward(family: str) -> None:
    """Prefill 6 tokens, decode 6 more one at a time with a DynamicCache: same logits as one forward.
    Layer 0 has no attention (its cache slot stores nothing); Gemma's layer 1 slides over 4 tokens
    (its cache keeps only the window) while layer 3 attends to all 12."""
    from transformers import DynamicCache

    model, ids = tiny_hetero_model(family), tokens(2, 12, seed=9)
    assert model.config.layer_types == (
        ["mlp", "sliding_attention", "mlp", "full_attention"]
        if family == "gemma3_text"
        else ["mlp", "full_attention", "mlp", "full_attention"]
    )
    full = logits(model, ids)
    with torch.no_grad():
        out = model(ids[:, :6], cache=DynamicCache(config=model.config), use_cache=True)
        steps = [out.logits]
        for t in range(6, 12):
            out = model(ids[:, t : t + 1], cache=out.cache, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_hetero_generate_is_greedy_decoding(family: str) -> None:
    """generate() (its own cache, 5 + 4 tokens: past Gemma's 4-token window) is greedy decoding."""
    model, prompt = tiny_hetero_model(family), tokens(1, 5, seed=2)
    with torch.no_grad():
        generated = model.generate(prompt, max_new_tokens=4, do_sample=False)
        ids = prompt
        for _ in range(4):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, ids)


def test_hetero_config_reads_vllm_style_block_configs() -> None:
    """DeciLM's own keys (n_heads_in_group, no_op) are understood; per-layer num_heads is optional."""
    blocks = [
        {"attention": {"n_heads_in_group": 2}, "ffn": {"intermediate_size": 64}},
        {"attention": {"no_op": True}, "ffn": {"intermediate_size": 32}},
    ]
    config = AutocompressDeciLMConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=8, block_configs=blocks
    )
    arch = config.architecture()
    assert (arch.layers[0].num_heads, arch.layers[0].num_kv_heads) == (4, 2) and not arch.layers[1].attention
    assert AutocompressDeciLMConfig.from_architecture(hetero_arch()).architecture() == replace(
        hetero_arch(), max_context=2048
    )


@pytest.mark.parametrize(
    "blocks, match",
    [
        (
            [{"attention": {"n_heads_in_group": 3}, "ffn": {"intermediate_size": 8}}],
            r"block_configs\[0\].*does not divide",
        ),
        (
            [{"attention": {"no_op": True}, "ffn": {"intermediate_size": 0}}],
            r"block_configs\[0\].ffn.intermediate_size",
        ),
        ([{"attention": {"no_op": True, "replace_with_linear": True}, "ffn": {"no_op": True}}], "replace_with_linear"),
        ([], "block_configs has 0 entries but num_hidden_layers=1"),
    ],
    ids=["group", "width", "linear", "count"],
)
def test_bad_block_configs_name_the_entry(blocks: list[Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AutocompressDeciLMConfig(
            vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, head_dim=8, block_configs=blocks
        )


# -------------------------------------------------------------------------- the CLI verb
@pytest.fixture
def fake_loading(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Stand-ins for loading.load_model / data.user.data_batches (the real functions are replaced,
    so a renamed API fails here): a tiny llama and random tokens."""
    parent = tiny_model("llama")
    loaded = types.SimpleNamespace(
        model=parent,
        tokenizer=None,
        source="tiny test model",
        path=Path("tiny-llama"),
        architecture=adapter_for(parent).architecture(parent),
    )

    def data_batches(tokenizer: Any, *, data: Any, role: str, n_samples: int, seq_len: int, seed: int) -> Any:
        assert role == "calibration"
        return SimpleNamespace(tokens=tokens(n_samples, seq_len, seed), to_dict=lambda: {"role": role, "seed": seed})

    monkeypatch.setattr("autocompress_opt.hf.loading.load_model", lambda ref, **kw: loaded)
    monkeypatch.setattr("autocompress_opt.data.user.data_batches", data_batches)
    return parent


def test_cli_prune_params_exports_a_uniform_baseline(fake_loading: Any, tmp_path: Path, capsys: Any) -> None:
    from autocompress_opt.cli import main

    argv = [
        "prune",
        "--model",
        "tiny",
        "--params",
        "0.8",
        "--out",
        str(tmp_path / "out"),
        "--samples",
        "2",
        "--seq-len",
        "8",
        "--width-multiple",
        "8",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    ]
    assert main(argv) == 0
    model = load_exported(tmp_path / "out")
    card = json.loads((tmp_path / "out" / CARD_FILE).read_text())
    assert type(model).__name__ == "LlamaForCausalLM" and card["kind"] == "uniform"
    assert card["num_params"] <= 0.8 * adapter_for(fake_loading).architecture(fake_loading).num_params
    assert card["extra"]["recipe"]["mode"] == "uniform-baseline"
    assert "wrote" in capsys.readouterr().out
    assert main(argv) == 2  # the second run refuses to overwrite ...
    assert "--force" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0  # ... unless forced; the importance cache is reused


def test_cli_prune_arch_exports_the_given_architecture(fake_loading: Any, tmp_path: Path) -> None:
    from autocompress_opt.cli import main

    arch = adapter_for(fake_loading).architecture(fake_loading)
    target = replace(arch, layers=(replace(arch.layers[0], ffn_width=16),) + arch.layers[1:])
    target.save(tmp_path / "arch.json")
    assert (
        main(
            [
                "prune",
                "--model",
                "tiny",
                "--arch",
                str(tmp_path / "arch.json"),
                "--out",
                str(tmp_path / "out"),
                "--samples",
                "2",
                "--seq-len",
                "8",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--no-progress",
            ]
        )
        == 0
    )
    model = load_exported(tmp_path / "out")
    assert architecture_mismatch(target, adapter_for(model).architecture(model)) is None


@pytest.mark.parametrize("text, value", [("0.6", 0.6), ("80M", 80e6), ("1.5b", 1.5e9), ("2000", 2000.0)])
def test_cli_param_budget_parses_fractions_and_counts(text: str, value: float) -> None:
    from autocompress_opt.cli.prune import param_budget

    assert param_budget(text) == value


def test_cli_param_budget_rejects_garbage() -> None:
    import argparse

    from autocompress_opt.cli.prune import param_budget

    with pytest.raises(argparse.ArgumentTypeError, match="'sixty'"):
        param_budget("sixty")


def test_identity_materialise_then_export_round_trip_is_exact(tmp_path: Path) -> None:
    """No pruning at all: the exported checkpoint reproduces the parent bit for bit."""
    parent = tiny_model("qwen3")
    arch = adapter_for(parent).architecture(parent)
    out = export_model(materialize(parent, identity_plan(arch)), arch, tmp_path / "out")
    torch.testing.assert_close(logits(load_exported(out)), logits(parent), rtol=0, atol=0)


def test_gemma3_heterogeneous_export_keeps_gemma_numerics(tmp_path: Path) -> None:
    """A Gemma 3 parent pruned to per-layer widths with a smaller hidden size and a dropped layer: the
    autocompress_decilm config records the layer kinds (window_length per block), the nested local /
    global RoPE bases, query_pre_attn_scalar, the logit cap and the activation; the state dict has
    Gemma's norm names; the reloaded model computes the masked parent's logits."""
    from autocompress_opt.arch.architecture import LayerSpec

    parent = tiny_model("gemma3_text")
    arch = adapter_for(parent).architecture(parent)
    base = arch.layers[0]
    target = replace(
        arch,
        hidden_size=40,
        layers=(replace(base, ffn_width=24), LayerSpec.dropped(), replace(base, num_heads=3, num_kv_heads=1)),
    )
    imp = estimate_importance(parent, tokens(2, 8), model_id="gemma", progress=False)
    plan = plan_pruning(arch, imp, target)
    out = export_model(materialize(parent, plan), target.active(), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["base_family"] == "gemma3_text" and config["hidden_act"] == "gelu_pytorch_tanh"
    assert [b["attention"]["window_length"] for b in config["block_configs"]] == [4, 4]  # parent layers 0 and 2
    assert config["layer_types"] == ["sliding_attention", "sliding_attention"] and config["sliding_window"] == 4
    assert set(config["rope_parameters"]) == {"full_attention", "sliding_attention"}
    assert config["query_pre_attn_scalar"] == 12 and config["final_logit_softcapping"] == 5.0
    loaded = load_exported(out)
    keys = set(loaded.state_dict())
    assert {
        "model.layers.0.pre_feedforward_layernorm.weight",
        "model.layers.0.post_feedforward_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight",
    } <= keys
    from autocompress_opt.prune.masking import apply_masks

    ids = tokens(2, 12, seed=5)
    with torch.no_grad(), apply_masks(parent, plan.masks()):
        masked = parent(ids).logits
    torch.testing.assert_close(logits(loaded, ids), masked, atol=2e-4, rtol=2e-5)


def test_gemma3_uniform_export_with_a_smaller_hidden_size_keeps_the_parent_embedding_scale(tmp_path: Path) -> None:
    """Gemma scales the embedding by sqrt(hidden_size) of its own config: a plain Gemma3ForCausalLM with
    hidden 36 would use sqrt(36), not the parent's sqrt(48). The factor is folded into the (tied)
    embedding and cancelled in the final norm, so the reloaded checkpoint keeps the parent's numerics."""
    from autocompress_opt.prune.masking import apply_masks

    parent = tiny_model("gemma3_text")
    arch = adapter_for(parent).architecture(parent)
    target = replace(arch, hidden_size=36, layers=(replace(arch.layers[0], num_heads=3, num_kv_heads=1),) * 3)
    plan = plan_pruning(arch, estimate_importance(parent, tokens(2, 8), model_id="g", progress=False), target)
    child = materialize(parent, plan)
    out = export_model(child, plan.architecture, tmp_path / "out")  # the parent's windows, not layer 0's thrice
    loaded = load_exported(out)
    assert type(loaded).__name__ == "Gemma3ForCausalLM" and loaded.config.tie_word_embeddings
    assert loaded.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert float(loaded.model.embed_tokens.embed_scale) == pytest.approx(36**0.5)
    h = list(plan.hidden_channels)
    parent_rows = parent.model.embed_tokens.weight[:, h]
    torch.testing.assert_close(loaded.model.embed_tokens.weight, parent_rows * (48 / 36) ** 0.5)
    ids = tokens(2, 12, seed=5)
    with torch.no_grad(), apply_masks(parent, plan.masks()):
        masked = parent(ids).logits
    torch.testing.assert_close(logits(loaded, ids), masked, atol=2e-4, rtol=2e-5)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_hetero_model_with_attention_free_layers_saves_and_reloads(family: str, tmp_path: Path) -> None:
    """Layers without attention are "mlp" in layer_types (transformers' label, which its stock validator
    rejects): the config validates on save, reloads, and the model computes the same logits."""
    model = tiny_hetero_model(family)
    assert model.config.layer_types[0] == model.config.layer_types[2] == "mlp"
    model.save_pretrained(tmp_path)
    loaded = load_exported(tmp_path)
    assert loaded.config.layer_types == model.config.layer_types
    arch = adapter_for(model).architecture(model)
    assert architecture_mismatch(arch, adapter_for(loaded).architecture(loaded)) is None
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
