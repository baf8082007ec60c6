"""Tests for autocompress_opt.serving.timing: the model export writes, with random weights, and timings.

Models are tiny (hidden 32, 2-4 layers, vocabulary 97) so the whole file runs in seconds. Timing
values are only checked for being positive and finite: speed is for benchmarks, not tests.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_families import tiny_model, tokens

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.hf.hetero_model import AutocompressDeciLMForCausalLM
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.plan import plan_pruning
from autocompress_opt.prune.slicing import materialize
from autocompress_opt.serving.timing import (
    ENGINE,
    Timing,
    build_torch_model,
    decode_samples_ms,
    measure,
    prefill_samples_ms,
    random_architectures,
    time_decode,
    time_prefill,
)

VOCAB = 97


def uniform_arch(**kwargs: object) -> Architecture:
    base = dict(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_width=64, vocab_size=VOCAB)
    return Architecture.uniform(**{**base, **kwargs})


def hetero_arch(**kwargs: object) -> Architecture:
    """Layer 0 has no attention (its KV-cache slot is a placeholder), layer 1 has 3 query heads in
    one KV group, layer 2 is dropped, layer 3 has no FFN. One head_dim (8), as export requires."""
    layers = (
        LayerSpec(attention=False, ffn=True, ffn_width=48),
        LayerSpec(attention=True, num_heads=3, num_kv_heads=1, head_dim=8, ffn=True, ffn_width=80),
        LayerSpec.dropped(),
        LayerSpec(attention=True, num_heads=2, num_kv_heads=2, head_dim=8, ffn=False),
    )
    return Architecture(vocab_size=VOCAB, hidden_size=32, layers=layers, **kwargs)


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------ building
@pytest.mark.parametrize(
    "arch",
    [
        uniform_arch(),
        uniform_arch(tie_embeddings=True),
        uniform_arch(num_heads=3, num_kv_heads=3, head_dim=16),  # heads that do not divide hidden
        uniform_arch(qkv_bias=True, o_bias=True, mlp_bias=True),  # llama attention_bias + mlp_bias
        uniform_arch(family="qwen2", qkv_bias=True),  # q, k, v biased, o not
        uniform_arch(family="mistral"),
        uniform_arch(family="qwen3", qk_norm=True),
        hetero_arch(),
        hetero_arch(tie_embeddings=True),
        hetero_arch(family="qwen3", qk_norm=True),
    ],
    ids=[
        "uniform",
        "tied",
        "odd-heads",
        "llama-biases",
        "qwen2",
        "mistral",
        "qwen3",
        "hetero",
        "hetero-tied",
        "hetero-qwen3",
    ],
)
def test_parameter_count_equals_architecture(arch: Architecture) -> None:
    """The built model has exactly arch.num_params parameters, dropped sub-blocks and QK-norms included."""
    assert num_params(build_torch_model(arch)) == arch.num_params


@pytest.mark.parametrize(
    ("arch", "cls"),
    [
        (uniform_arch(), "LlamaForCausalLM"),
        (uniform_arch(family="qwen2", qkv_bias=True), "Qwen2ForCausalLM"),
        (uniform_arch(family="qwen3", qk_norm=True), "Qwen3ForCausalLM"),
        (uniform_arch(num_heads=3, num_kv_heads=3, head_dim=16), "AutocompressDeciLMForCausalLM"),  # 32 % 3 != 0
        (hetero_arch(), "AutocompressDeciLMForCausalLM"),
        # the dropped layer leaves the stack, as a plan leaves it out of the export: what remains is uniform
        (replace(uniform_arch(), layers=(*uniform_arch().layers, LayerSpec.dropped())), "LlamaForCausalLM"),
    ],
    ids=["llama", "qwen2", "qwen3", "odd-heads", "hetero", "dropped-layer"],
)
def test_model_class_is_the_exported_one(arch: Architecture, cls: str) -> None:
    """A uniform architecture is timed as a plain model of its family when the family's config can
    say it, anything else as the package's heterogeneous decoder, always with eager attention."""
    model = build_torch_model(arch)
    assert type(model).__name__ == cls
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_timed_model_is_the_model_export_writes(family: str) -> None:
    """For plans of a real (tiny) parent, the timed model has the class and the parameter shapes of
    the model materialize writes: uniform (plain family model), uniform with heads that do not
    divide the pruned hidden size (llama's config refuses it: heterogeneous decoder; qwen2's does
    not), heterogeneous with a dropped layer."""
    parent = tiny_model(family)
    arch = adapter_for(parent).architecture(parent)
    importance = estimate_importance(parent, tokens(2, 8, seed=1), model_id="parent", progress=False)
    base = arch.layers[0]  # 6 query heads of 8 channels in 2 KV groups, FFN 48, hidden 48
    narrow = replace(base, num_heads=4, num_kv_heads=2, ffn_width=16)
    targets = [
        (False, replace(arch, layers=(narrow,) * arch.num_layers)),
        (family == "llama", replace(arch, hidden_size=40, layers=(base,) * arch.num_layers)),  # 40 % 6 != 0
        (True, replace(arch, layers=(narrow, LayerSpec.dropped(), replace(base, ffn=False, ffn_width=0)))),
    ]
    for heterogeneous, target in targets:
        plan = plan_pruning(arch, importance, target)
        exported, timed = materialize(parent, plan), build_torch_model(target)
        assert type(timed) is type(exported)
        assert isinstance(timed, AutocompressDeciLMForCausalLM) == heterogeneous
        assert {k: v.shape for k, v in timed.state_dict().items()} == {
            k: v.shape for k, v in exported.state_dict().items()
        }


def test_mixed_head_dims_are_refused() -> None:
    """Export keeps head_dim (one rotary table per model), so an architecture mixing head sizes has no
    exported model to time."""
    layers = hetero_arch().layers
    arch = replace(hetero_arch(), layers=(replace(layers[1], head_dim=16), layers[3]))
    with pytest.raises(ConfigError, match="head_dim"):
        build_torch_model(arch)


def test_layers_have_each_specs_shapes() -> None:
    """Per layer: q/k/v/MLP widths follow the LayerSpec; absent sub-blocks and their norms are None."""
    arch = hetero_arch()
    model = build_torch_model(arch)
    kept = [spec for spec in arch.layers if not spec.is_noop]
    assert len(model.model.layers) == model.config.num_hidden_layers == arch.num_active_layers == len(kept)
    for layer, spec in zip(model.model.layers, kept):
        if spec.attention:
            assert layer.self_attn.q_proj.out_features == spec.num_heads * spec.head_dim
            assert layer.self_attn.k_proj.out_features == spec.num_kv_heads * spec.head_dim
            assert layer.self_attn.o_proj.in_features == spec.num_heads * spec.head_dim
        else:
            assert layer.self_attn is None and layer.input_layernorm is None
        if spec.ffn:
            assert layer.mlp.gate_proj.out_features == spec.ffn_width
        else:
            assert layer.mlp is None and layer.post_attention_layernorm is None
    # Every layer owns the KV-cache slot of its index (a layer without attention: a placeholder).
    assert [layer.self_attn.layer_idx for layer in model.model.layers if layer.self_attn is not None] == [1, 2]


def test_weights_are_deterministic_given_seed() -> None:
    """Same seed → identical weights; another seed → different weights; norms are ones; the
    caller's RNG is left alone."""
    arch = hetero_arch()
    state = torch.get_rng_state()
    a, b, c = (build_torch_model(arch, seed=s).state_dict() for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), state)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert torch.equal(a["model.norm.weight"], torch.ones(32))
    std = a["model.embed_tokens.weight"].std().item()
    assert 0.015 < std < 0.025  # normal(0, 0.02)


def test_dtype_is_applied_and_validated() -> None:
    model = build_torch_model(uniform_arch(), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with pytest.raises(ConfigError, match="dtype"):
        build_torch_model(uniform_arch(), dtype=torch.int64)


# ------------------------------------------------------------------------------ forward
@pytest.mark.parametrize(
    "arch", [uniform_arch(), uniform_arch(tie_embeddings=True), hetero_arch()], ids=["uniform", "tied", "hetero"]
)
def test_prefill_then_cached_decode_matches_full_forward(arch: Architecture) -> None:
    """Prefill builds a cache; decoding one token with it gives finite (batch, 1, vocab) logits equal
    to the last position of a full forward — so the cache (and positions) are right, even when
    layer 0 has no attention."""
    model = build_torch_model(arch)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        prefill = model(input_ids=ids[:, :8], use_cache=True)
        assert prefill.logits.shape == (2, 8, VOCAB)
        assert torch.isfinite(prefill.logits).all()
        assert prefill.cache.get_seq_length() == 8
        step = model(input_ids=ids[:, 8:], cache=prefill.cache, use_cache=True)
        assert step.logits.shape == (2, 1, VOCAB)
        assert torch.isfinite(step.logits).all()
        assert prefill.cache.get_seq_length() == 9
        full = model(input_ids=ids).logits
    torch.testing.assert_close(step.logits[:, -1], full[:, -1], rtol=1e-4, atol=1e-5)


def test_model_with_only_dropped_layers_still_runs() -> None:
    """Every layer dropped: embedding → final norm → LM head still produces logits."""
    arch = Architecture(vocab_size=VOCAB, hidden_size=32, layers=(LayerSpec.dropped(),) * 2)
    model = build_torch_model(arch)
    assert num_params(model) == arch.num_params
    with torch.inference_mode():
        logits = model(input_ids=torch.zeros(1, 4, dtype=torch.long), use_cache=True).logits
    assert logits.shape == (1, 4, VOCAB) and torch.isfinite(logits).all()


# ------------------------------------------------------------------------------ timing
def test_prefill_and_decode_timings_are_positive_floats() -> None:
    model = build_torch_model(hetero_arch())
    prefill_ms = time_prefill(model, batch=2, prompt_len=16, repeats=3, warmup=1)
    assert isinstance(prefill_ms, float) and 0 < prefill_ms < math.inf
    for context_len in (1, 32):  # decoding works from a 1-token and a longer context
        decode_ms = time_decode(model, batch=2, context_len=context_len, steps=4, repeats=2, warmup=1)
        assert isinstance(decode_ms, float) and 0 < decode_ms < math.inf


def test_sample_counts_exclude_warmup() -> None:
    """One sample per timed repeat for prefill, steps × repeats for decode; warm-up not included."""
    model = build_torch_model(uniform_arch())
    assert len(prefill_samples_ms(model, batch=1, prompt_len=8, repeats=3, warmup=2)) == 3
    assert len(decode_samples_ms(model, batch=1, context_len=8, steps=4, repeats=2, warmup=1)) == 8
    assert len(decode_samples_ms(model, batch=1, context_len=8, steps=4, repeats=2, warmup=0)) == 8


def test_time_decode_leaves_context_length_unchanged_between_rounds() -> None:
    """Each round decodes from a fresh copy of the prefilled cache, so every round sees the same
    context lengths: the cache the harness prefilled is never mutated."""
    model = build_torch_model(uniform_arch())
    seen: list[int] = []
    forward = model.forward

    def recording_forward(*args: object, **kwargs: object) -> object:
        cache = kwargs.get("cache")
        seen.append(cache.get_seq_length() if cache is not None else 0)
        return forward(*args, **kwargs)

    model.forward = recording_forward  # type: ignore[method-assign]
    decode_samples_ms(model, batch=1, context_len=5, steps=3, repeats=2, warmup=1)
    assert seen == [0] + [5, 6, 7] * 3  # prefill, then warm-up + 2 rounds from context 5


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(batch=0), "batch"),
        (dict(prompt_len=0), "prompt_len"),
        (dict(repeats=0), "repeats"),
        (dict(warmup=-1), "warmup"),
    ],
)
def test_invalid_timing_arguments_name_the_field(kwargs: dict[str, int], field: str) -> None:
    model = build_torch_model(uniform_arch())
    with pytest.raises(ConfigError, match=field):
        time_prefill(model, **{"batch": 1, "prompt_len": 8, **kwargs})


def test_measure_records_the_setup() -> None:
    arch = hetero_arch()
    timing = measure(
        arch,
        batch=2,
        prompt_len=12,
        decode_context=10,
        decode_steps=3,
        prefill_repeats=2,
        decode_repeats=2,
        warmup=1,
        seed=3,
    )
    assert isinstance(timing, Timing)
    assert timing.prefill_ms > 0 and timing.decode_ms_per_token > 0
    assert (timing.engine, timing.device, timing.dtype) == (ENGINE, "cpu", "float32")
    assert timing.threads == torch.get_num_threads()
    assert (timing.batch, timing.prompt_len, timing.decode_context, timing.decode_steps) == (2, 12, 10, 3)
    assert len(timing.prefill_samples_ms) == 2 and len(timing.decode_samples_ms) == 6
    assert min(timing.prefill_samples_ms) <= timing.prefill_ms <= max(timing.prefill_samples_ms)
    assert timing.noise >= 1.0


# ------------------------------------------------------------------------------ calibration sweep
def test_random_architectures_are_deterministic() -> None:
    assert random_architectures(12, seed=5) == random_architectures(12, seed=5)
    assert random_architectures(12, seed=5) != random_architectures(12, seed=6)
    assert random_architectures(4, seed=5) == random_architectures(12, seed=5)[:4]


def test_random_architectures_golden() -> None:
    """Pins the default sweep, so that a change to the generator is a visible decision: calibration
    data measured before the change would no longer match the architectures drawn after it."""
    archs = random_architectures(3, seed=0)
    assert [(a.num_layers, a.hidden_size, a.num_params, a.is_uniform) for a in archs] == [
        (8, 768, 95_171_328, True),
        (7, 768, 84_060_672, False),
        (7, 384, 32_764_416, False),
    ]


def test_random_architectures_are_valid_and_varied() -> None:
    hidden_sizes = (256, 384, 512, 768)
    archs = random_architectures(60, seed=0, hidden_sizes=hidden_sizes)
    for arch in archs:
        assert arch.hidden_size in hidden_sizes and 2 <= arch.num_layers <= 12
        assert arch.num_active_layers >= 1
        for layer in arch.layers:
            if layer.attention:
                assert layer.head_dim == 64 and 1 <= layer.num_heads <= arch.hidden_size // 64
                assert layer.num_heads % layer.num_kv_heads == 0
            if layer.ffn:
                assert layer.ffn_width % 64 == 0
                assert arch.hidden_size / 2 <= layer.ffn_width <= 4 * arch.hidden_size
    assert {a.hidden_size for a in archs} == set(hidden_sizes)
    assert len({a.num_layers for a in archs}) >= 5
    assert any(a.is_uniform for a in archs) and any(not a.is_uniform for a in archs)
    assert any(not layer.attention for a in archs for layer in a.layers)
    assert any(not layer.ffn for a in archs for layer in a.layers)
    assert len({a.name for a in archs}) == len(archs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(hidden_sizes=()),
        dict(hidden_sizes=(32,)),
        dict(num_layers=(3, 2)),
        dict(ffn_ratio=(0.0, 1.0)),
        dict(drop_prob=1.5),
        dict(n=-1),
    ],
)
def test_random_architectures_reject_bad_settings(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        random_architectures(**{"n": 2, "seed": 0, **kwargs})


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_every_sampled_architecture_builds_exactly_and_decodes(seed: int) -> None:
    """Any sweep member (tiny settings) builds with its exact parameter count and decodes."""
    (arch,) = random_architectures(
        1, seed=seed, vocab_size=VOCAB, hidden_sizes=(32, 48), head_dim=16, num_layers=(1, 4), drop_prob=0.3
    )
    model = build_torch_model(arch, seed=seed)
    assert num_params(model) == arch.num_params
    assert time_decode(model, batch=1, context_len=3, steps=2, repeats=1, warmup=0) > 0


def test_architecture_changes_reach_the_model() -> None:
    """Shrinking one layer's FFN shrinks the built model by exactly 3·hidden·Δwidth parameters."""
    arch = hetero_arch()
    smaller = replace(arch, layers=(replace(arch.layers[0], ffn_width=16),) + arch.layers[1:])
    assert num_params(build_torch_model(arch)) - num_params(build_torch_model(smaller)) == 3 * 32 * (48 - 16)
