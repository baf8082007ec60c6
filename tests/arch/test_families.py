"""The registry of model families: a conformance suite run over every registered family (each entry
complete, its adapter registered, a tiny random model of it read the same way by the config reader,
the adapter and the engine rules), the registry's duplicate and lookup errors, the tables it replaced
(pinned), and one family added the way docs/adding-a-family.md shows (SmolLM3, registered only here)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import tiny_families
from tiny_families import hetero_arch, num_params, tiny_model

from autocompress_opt.arch import families as families_module
from autocompress_opt.arch.architecture import (
    ARCHITECTURE_ONLY_FAMILIES,
    SUPPORTED_FAMILIES,
    Architecture,
    hf_layer_windows,
)
from autocompress_opt.arch.block_configs import MODEL_TYPE as HETERO_MODEL_TYPE
from autocompress_opt.arch.families import (
    BIAS_FLAGS,
    FAMILIES,
    Family,
    WindowRule,
    family,
    family_for_gguf_arch,
    family_for_model_type,
    family_names,
    register_family,
)
from autocompress_opt.arch.gguf import GGUF_ARCH_TO_FAMILY
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.hf.adapters import ADAPTERS, FamilyAdapter, adapter_for, architecture_mismatch, family_adapter
from autocompress_opt.prune.loadability import ENGINE_RULES, loadable_problems, shape_rules

DECILM_ENGINES = [name for name, rules in ENGINE_RULES.items() if not rules.own_class]


# ------------------------------------------------------------------ conformance, every family
@pytest.fixture(params=family_names())
def fam(request: pytest.FixtureRequest) -> Family:
    return family(request.param)


def test_entry_is_complete(fam: Family) -> None:
    """Every fact the package reads is given: a bias rule per flag, what every engine loads, a
    window rule, and model_types / GGUF architectures that lead back to this entry."""
    assert set(fam.biases) == set(BIAS_FLAGS)
    assert set(fam.serving) == set(ENGINE_RULES), "the entry must say what each serving engine loads"
    assert isinstance(fam.windows, WindowRule)
    assert fam.model_types[0] == fam.name
    assert all(family_for_model_type(t) is fam for t in fam.model_types)
    assert all(family_for_gguf_arch(a) is fam and GGUF_ARCH_TO_FAMILY[a] == fam.name for a in fam.gguf_archs)


def test_heterogeneous_in_a_decilm_engine_needs_the_decilm_form(fam: Family) -> None:
    """An engine that reads per-layer shapes as DeciLM can only load those of a family DeciLM holds."""
    for engine in DECILM_ENGINES:
        if fam.loads(engine) == "heterogeneous":
            assert fam.decilm, f"{fam.name}: {engine} reads per-layer shapes as DeciLM, which cannot hold it"


def test_adapter_is_registered_and_builds_the_family(fam: Family) -> None:
    if fam.architecture_only:  # no adapter yet: every weights path refuses it by name
        assert fam.name in tiny_families.ARCHITECTURE_ONLY, "add a tiny model of the family to tests/tiny_families.py"
        refused = rf"the '{fam.name}' family is architecture-only.*issue 30"
        with pytest.raises(ConfigError, match=refused):
            family_adapter(fam.name)
        with pytest.raises(ConfigError, match=refused):
            adapter_for(tiny_model(fam.name))
        return
    adapter = family_adapter(fam.name)
    assert adapter is ADAPTERS.get(fam.adapter) and not adapter.heterogeneous
    assert fam.name in tiny_families.FAMILIES, "add a tiny model of the family to tests/tiny_families.py"


def test_every_adapter_belongs_to_a_family() -> None:
    """No orphan adapter: each is a family's, or the package's own heterogeneous class's."""
    named = {family(name).adapter for name in family_names()} - {None}
    assert set(ADAPTERS.names()) == named | {HETERO_MODEL_TYPE}


def test_tiny_model_is_read_the_same_by_config_adapter_and_parameters(fam: Family) -> None:
    """The config reader, the adapter (module shapes) and the model's parameter count agree, and
    the architecture survives a round trip through its own HF config."""
    model = tiny_model(fam.name)
    if fam.architecture_only:  # the config reader alone: exact counts, and no config written back
        arch = Architecture.from_hf_config(model.config)
        assert arch.family == fam.name and arch.qk_norm == fam.qk_norm
        assert arch.num_params == num_params(model)
        assert Architecture.from_hf_config(model.config.to_dict()) == arch
        with pytest.raises(ConfigError, match="described but not yet exported.*issue 30"):
            arch.to_hf_config()
        return
    adapter = adapter_for(model)
    assert adapter is family_adapter(fam.name)
    from_config, from_modules = Architecture.from_hf_config(model.config), adapter.architecture(model)
    assert architecture_mismatch(from_config, from_modules) is None
    assert from_config.family == from_modules.family == fam.name
    assert from_config.num_params == num_params(model)
    assert from_config.qk_norm == fam.qk_norm
    assert Architecture.from_hf_config(from_config.to_hf_config()) == from_config
    assert tuple(layer.window for layer in from_config.layers) == hf_layer_windows(model.config)


def test_engines_load_the_tiny_model_as_the_entry_says(fam: Family) -> None:
    """Uniform: an engine that loads the family at all raises no family problem. Heterogeneous
    (:func:`hetero_arch`): the package's own class loads it; a DeciLM engine refuses a family DeciLM
    cannot hold."""
    uniform = Architecture.from_hf_config(tiny_model(fam.name).config)
    hetero = hetero_arch(fam.name)
    for engine in ENGINE_RULES:
        refused = f"{engine} does not serve the {fam.name!r} family"
        assert (refused in loadable_problems(uniform, engine)) == (fam.loads(engine) == "none")
        if fam.architecture_only:  # nothing of it can be exported yet, whatever its layers
            assert any("issue 30" in p for p in loadable_problems(hetero, engine))
            continue
        if engine in DECILM_ENGINES:
            not_llama = any("not Llama-like" in p for p in loadable_problems(hetero, engine))
            assert not_llama == (not fam.decilm)
        elif fam.loads(engine) == "heterogeneous":
            assert loadable_problems(hetero, engine) == []
            assert shape_rules(engine, hetero, hidden_size=48, query_heads=6) is None


# ------------------------------------------------------------------ the tables it replaced
def test_the_registry_reproduces_the_tables_it_replaced() -> None:
    """The values of _FAMILIES, GGUF_ARCH_TO_FAMILY and _DIVISIBLE_HEADS_FAMILIES before the registry
    (and export.decilm_problems' Llama-like set), so moving them changed nothing."""
    assert SUPPORTED_FAMILIES == ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
    assert family_names() == (*SUPPORTED_FAMILIES, *ARCHITECTURE_ONLY_FAMILIES)
    assert GGUF_ARCH_TO_FAMILY == {
        "llama": "llama",
        "mistral": "mistral",
        "qwen2": "qwen2",
        "qwen3": "qwen3",
        "gemma3": "gemma3_text",
    }
    assert [n for n in SUPPORTED_FAMILIES if family(n).heads_divide_hidden] == ["llama", "gemma3_text"]
    assert [n for n in SUPPORTED_FAMILIES if family(n).decilm] == ["llama", "mistral"]
    assert [n for n in SUPPORTED_FAMILIES if family(n).qk_norm] == ["qwen3", "gemma3_text"]
    assert [n for n in SUPPORTED_FAMILIES if family(n).post_norms] == ["gemma3_text"]
    defaults = {
        n: (family(n).default_kv_heads, family(n).default_head_dim, family(n).default_tied) for n in SUPPORTED_FAMILIES
    }
    assert defaults == {
        "llama": (None, None, False),
        "mistral": (8, None, False),
        "qwen2": (32, None, False),
        "qwen3": (32, 128, False),
        "gemma3_text": (4, 256, True),
    }
    assert {n: family(n).windows.kind for n in SUPPORTED_FAMILIES} == {
        "llama": "none",
        "mistral": "every_layer",
        "qwen2": "layer_types",
        "qwen3": "layer_types",
        "gemma3_text": "layer_types",
    }
    # Every engine serves every family: the dense ones per their rules, the MoE / hybrid ones in the
    # family's plain config (one size per layer kind: plan mode, issue 30).
    sparse = tuple(n for n in family_names() if family(n).architecture_only)
    assert all(rules.families == SUPPORTED_FAMILIES + sparse for rules in ENGINE_RULES.values())


# ------------------------------------------------------------------ registry errors
def test_unknown_family_suggests_and_lists() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown model family 'lama' — did you mean 'llama'\?; available: "):
        family("lama")
    with pytest.raises(ConfigError, match=r"Architecture.family 'lama' is not supported — did you mean 'llama'"):
        replace(hetero_arch(), family="lama")


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made in the test are undone afterwards (the registries are process-wide)."""
    FAMILIES.names()  # the built-ins, before the snapshot
    monkeypatch.setattr(FAMILIES, "_items", dict(FAMILIES._items))
    monkeypatch.setattr(families_module, "_ORDER", list(families_module._ORDER))
    monkeypatch.setattr(ADAPTERS, "_items", dict(ADAPTERS._items))
    yield


def test_duplicates_are_refused(scratch_registry: None) -> None:
    llama = family("llama")
    with pytest.raises(ValueError, match="model family 'llama' is already registered"):
        register_family(llama)
    with pytest.raises(ValueError, match="model_type 'qwen2' already belongs to family 'qwen2'"):
        register_family(replace(llama, name="other", model_types=("other", "qwen2")))
    with pytest.raises(ValueError, match="GGUF architecture 'gemma3' already belongs to family 'gemma3_text'"):
        register_family(replace(llama, name="other", model_types=("other",), gguf_archs=("gemma3",)))
    assert "other" not in FAMILIES


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(model_types=("llama2",)), "model_types must start with the name"),
        (dict(biases={"qkv_bias": False}), "biases must give each of qkv_bias, o_bias, mlp_bias"),
        (dict(serving={"vllm": "partly"}), "serving maps each engine to one of heterogeneous, uniform, none"),
        (dict(name="Llama"), "lower-case"),
    ],
)
def test_an_incomplete_entry_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        replace(family("llama"), **change)


def test_window_rules_are_checked() -> None:
    with pytest.raises(ConfigError, match="exactly one of default_pattern and default_max_window_layers"):
        WindowRule("layer_types")
    with pytest.raises(ConfigError, match="only a 'layer_types' WindowRule takes layer defaults"):
        WindowRule("every_layer", default_pattern=2)
    with pytest.raises(ConfigError, match="a 'none' WindowRule has no window to switch on"):
        WindowRule("none", switch="use_sliding_window")
    assert WindowRule("every_layer", switch="use_sliding_window").switch == "use_sliding_window"  # Qwen3-MoE


# ------------------------------------------------------------------ adding a family
# The entry of docs/adding-a-family.md. SmolLM3 has Llama's modules and parameters, but every 4th layer
# skips RoPE (no_rope_layers): neither DeciLM nor the package's own class can say that, so every engine
# loads it uniform only. Its window default is approximate: SmolLM3Config always writes layer_types (the
# NoPE layers slide when use_sliding_window and sliding_window are set), so the default is never read.
SMOLLM3 = Family(
    "smollm3",
    model_types=("smollm3",),
    gguf_archs=("smollm3",),
    adapter="smollm3",
    biases={"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": "mlp_bias"},
    serving={
        "vllm": "uniform",
        "sglang": "uniform",
        "trtllm": "uniform",
        "llamacpp": "uniform",
        "transformers": "uniform",
    },
    default_kv_heads=4,
    default_tied=True,
    windows=WindowRule("layer_types", switch="use_sliding_window", default_max_window_layers=0),
)
SMOLLM3_ADAPTER = FamilyAdapter("smollm3", "SmolLM3 (Llama modules, NoPE every 4th layer)")


def test_a_new_family_is_one_entry_plus_its_adapter(scratch_registry: None) -> None:
    """SmolLM3 registered as the docs show: the config reader, the adapter, the GGUF map and the
    engine rules all pick it up; per-layer shapes are refused everywhere, as its entry says."""
    register_family(SMOLLM3)
    ADAPTERS.register(SMOLLM3_ADAPTER.name, SMOLLM3_ADAPTER)
    # the shared TINY sizes (3 layers, hidden 48, 6 heads in 2 KV groups); its token ids fit the tiny vocabulary
    model = tiny_model("smollm3", pad_token_id=0, bos_token_id=1, eos_token_id=2)
    arch = Architecture.from_hf_config(model.config)
    assert arch.family == "smollm3" and arch.num_params == num_params(model)
    assert adapter_for(model) is SMOLLM3_ADAPTER
    assert architecture_mismatch(arch, SMOLLM3_ADAPTER.architecture(model)) is None
    assert family_for_gguf_arch("smollm3") is SMOLLM3
    assert loadable_problems(arch, "vllm") == [
        "head size 8 is not one vllm's attention takes (32, 64, 80, 96, "
        "112, 128, 160, 192, 224, 256, 512; head sizes are the CPU backend's)"
    ]
    hetero = hetero_arch("smollm3")
    one_shape = "loads smollm3 models of one shape only (the family's serving rule)"
    assert loadable_problems(hetero, "transformers") == [f"transformers {one_shape}"]
    assert any("not Llama-like" in p for p in loadable_problems(hetero, "llamacpp"))
    rules = shape_rules("transformers", arch, hidden_size=48, query_heads=6)
    assert rules is not None and not rules.heterogeneous and rules.why_uniform == f"transformers {one_shape}"
    assert "smollm3" in ENGINE_RULES["vllm"].families


def test_scratch_registrations_do_not_leak() -> None:
    """Runs after the test above in file order: the built-ins only."""
    assert family_names() == (*SUPPORTED_FAMILIES, *ARCHITECTURE_ONLY_FAMILIES) and "smollm3" not in ADAPTERS
