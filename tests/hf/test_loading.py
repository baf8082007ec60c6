"""load_model: offline loading of safetensors directories and GGUF files, exact counts, clear errors."""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import weakref
from pathlib import Path

import pytest
import torch
from tiny_lm import VOCAB, save_hf_dir, tiny_model, write_qwen2_gguf

from autocompress_opt.arch.catalog import known_weights, load_architecture
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.hf.loading import _load_cached, clear_model_cache, load_model


@pytest.fixture(scope="module")
def qwen2_source():
    """The random tiny Qwen2 every artefact below is written from."""
    return tiny_model("qwen2", seed=1)


@pytest.fixture(scope="module")
def qwen2_dir(qwen2_source, tmp_path_factory) -> Path:
    return save_hf_dir(qwen2_source, tmp_path_factory.mktemp("qwen2-hf"))


@pytest.fixture(scope="module")
def qwen2_gguf(qwen2_source, tmp_path_factory) -> Path:
    return write_qwen2_gguf(qwen2_source, tmp_path_factory.mktemp("qwen2-gguf") / "tiny-qwen2.F32.gguf")


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=tokens).logits


TOKENS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------ what loads
@pytest.mark.parametrize("kind", ["directory", "config.json", "gguf"])
def test_qwen2_loads_with_the_source_weights(kind, qwen2_source, qwen2_dir, qwen2_gguf):
    """A Qwen2 safetensors directory (or its config.json) and a Qwen2 GGUF reproduce the source logits."""
    ref = {"directory": qwen2_dir, "config.json": qwen2_dir / "config.json", "gguf": qwen2_gguf}[kind]
    loaded = load_model(ref, cache=False)
    assert loaded.architecture.family == "qwen2"
    assert not loaded.model.training
    torch.testing.assert_close(_logits(loaded.model, TOKENS), _logits(qwen2_source, TOKENS), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["directory", "gguf"])
def test_parameter_count_equals_the_architecture(kind, qwen2_dir, qwen2_gguf):
    """The loaded model's parameter count is the Architecture's exact count (and the GGUF metadata's)."""
    path = qwen2_dir if kind == "directory" else qwen2_gguf
    loaded = load_model(path, cache=False)
    assert loaded.num_params == sum(p.numel() for p in loaded.model.parameters()) == loaded.architecture.num_params
    assert loaded.architecture.num_params == load_architecture(path).num_params


def test_gguf_tokenizer_comes_from_the_file(qwen2_gguf):
    """The GGUF's byte-level BPE tokenizer is rebuilt from its metadata, merges included."""
    tokenizer = load_model(qwen2_gguf, cache=False).tokenizer
    ids = tokenizer("the", add_special_tokens=False)["input_ids"]
    assert ids[-1] == 256  # "he" is the first merged token after the 256 byte tokens
    assert tokenizer.decode(ids) == "the"


def test_a_gguf_header_is_parsed_once_per_load(qwen2_gguf, monkeypatch):
    """transformers reads a GGUF three times (config, weights, tokenizer); the load shares one
    reader, gives the source logits and leaves gguf.GGUFReader as it was."""
    import gguf
    from gguf.gguf_reader import GGUFReader

    opened: list[str] = []
    original_init = GGUFReader.__init__

    def counting_init(self, path, *args, **kwargs):
        opened.append(str(path))
        original_init(self, path, *args, **kwargs)

    monkeypatch.setattr(GGUFReader, "__init__", counting_init)
    loaded = load_model(qwen2_gguf, cache=False)
    assert [Path(p).name for p in opened if p.endswith(".gguf")].count(qwen2_gguf.name) == 1
    assert gguf.GGUFReader is GGUFReader
    assert loaded.tokenizer.decode(loaded.tokenizer("the", add_special_tokens=False)["input_ids"]) == "the"


def test_gguf_model_is_plain_and_saves_as_safetensors(qwen2_gguf, tmp_path):
    """A dequantised GGUF carries no quantizer: save_pretrained works and reloads to the same logits."""
    loaded = load_model(qwen2_gguf, cache=False)
    assert getattr(loaded.model, "hf_quantizer", None) is None
    assert getattr(loaded.model.config, "quantization_config", None) is None
    loaded.model.save_pretrained(tmp_path)
    loaded.tokenizer.save_pretrained(tmp_path)
    again = load_model(tmp_path, cache=False)
    torch.testing.assert_close(_logits(again.model, TOKENS), _logits(loaded.model, TOKENS), rtol=0, atol=0)


def test_dtype_and_source_description(qwen2_dir):
    loaded = load_model(qwen2_dir, dtype=torch.bfloat16, cache=False)
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert str(qwen2_dir) in loaded.source and "bfloat16" in loaded.source
    assert loaded.path == qwen2_dir.resolve()
    assert loaded.load_time_s > 0


def test_cache_hands_out_independent_copies(qwen2_dir):
    """Two cached loads share nothing mutable: pruning one in place leaves the other as loaded."""
    clear_model_cache()
    first, second = load_model(qwen2_dir, cache=True), load_model(qwen2_dir, cache=True)
    assert first.model is not second.model
    with torch.no_grad():
        first.model.model.embed_tokens.weight.zero_()
    assert second.model.model.embed_tokens.weight.abs().sum() > 0
    assert load_model(qwen2_dir, cache=True).model.model.embed_tokens.weight.abs().sum() > 0
    clear_model_cache()


def test_default_load_keeps_no_second_copy(qwen2_dir):
    """Without ``cache=True`` the caller's model is the only copy: nothing is cached, and once the
    caller drops it, its parameters are freed (no reference to them is left anywhere)."""
    clear_model_cache()
    loaded = load_model(qwen2_dir)
    assert _load_cached.cache_info().currsize == 0
    weight = weakref.ref(loaded.model.model.embed_tokens.weight)
    model = weakref.ref(loaded.model)
    del loaded
    gc.collect()
    assert model() is None and weight() is None


def test_cache_is_keyed_by_content_not_modification_time(qwen2_dir, tmp_path):
    """A file touched but unchanged is the same cached model; rewritten with other bytes, another one."""
    clear_model_cache()
    copy_dir = Path(shutil.copytree(qwen2_dir, tmp_path / "copy"))
    first = load_model(copy_dir, cache=True)
    config = copy_dir / "config.json"
    os.utime(config, ns=(0, 0))
    load_model(copy_dir, cache=True)
    assert _load_cached.cache_info().hits == 1 and _load_cached.cache_info().currsize == 1
    config.write_text(json.dumps({**json.loads(config.read_text()), "rms_norm_eps": 1e-5}))
    changed = load_model(copy_dir, cache=True)
    assert _load_cached.cache_info().currsize == 2
    assert changed.model.config.rms_norm_eps == 1e-5 != first.model.config.rms_norm_eps
    clear_model_cache()


# ----------------------------------------------------------------------- errors
def test_unknown_name_lists_the_models_with_weights():
    with pytest.raises(UnknownNameError, match=r"did you mean 'smollm2-135m'.*available: .*smollm2-135m"):
        load_model("smollm2-13m")
    assert {"smollm2-135m", "gemma3-270m"} <= set(known_weights())


def test_known_architecture_without_weights_says_so():
    with pytest.raises(ConfigError, match=r"'llama-3\.1-8b' is a known architecture but its weights are not available"):
        load_model("llama-3.1-8b")


@pytest.mark.parametrize("ref", ["/nonexistent/model-dir", "missing.gguf"])
def test_missing_path_is_named(ref):
    with pytest.raises(ConfigError, match=rf"no such file or directory: '{ref}'.*smollm2-135m"):
        load_model(ref)


def test_pickle_only_checkpoint_is_refused_without_unpickling(qwen2_source, tmp_path, monkeypatch):
    """A directory holding only pytorch_model.bin is rejected before anything reads it."""
    qwen2_source.config.save_pretrained(tmp_path)
    torch.save(qwen2_source.state_dict(), tmp_path / "pytorch_model.bin")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with pytest.raises(ConfigError, match=r"only pickle checkpoints \(pytorch_model\.bin\).*never unpickles"):
        load_model(tmp_path, cache=False)


def test_non_decoder_family_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    with pytest.raises(ConfigError, match=r"model_type 'bert' is not a supported decoder LLM family; supported: llama"):
        load_model(tmp_path, cache=False)


def test_unsupported_gguf_architecture_is_refused(qwen2_source, tmp_path):
    path = write_qwen2_gguf(qwen2_source, tmp_path / "other.gguf", architecture="gpt2")
    with pytest.raises(ConfigError, match=r"GGUF architecture 'gpt2' is not a supported.*supported: llama, mistral"):
        load_model(path, cache=False)


def test_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ConfigError, match=r"is not a readable GGUF file"):
        load_model(path, cache=False)


def test_directory_without_tokenizer_is_refused(qwen2_source, tmp_path):
    qwen2_source.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"no tokenizer files"):
        load_model(tmp_path, cache=False)


def test_directory_with_several_ggufs_asks_for_one(qwen2_gguf, tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(qwen2_gguf.read_bytes())
    with pytest.raises(ConfigError, match=r"several GGUF files; pass one of: a\.gguf, b\.gguf"):
        load_model(tmp_path, cache=False)


def test_dtype_must_be_floating(qwen2_dir):
    with pytest.raises(ConfigError, match=r"dtype must be a floating torch\.dtype.*torch\.int8"):
        load_model(qwen2_dir, dtype=torch.int8)


# ------------------------------------------------------------ the real parent
@pytest.mark.slow
def test_smollm2_loads_with_its_exact_count_and_scores(smollm2_loaded):
    """Integration: the real SmolLM2 GGUF loads offline, counts exactly, and scores finitely on held-out text."""
    from autocompress_opt.quality.metrics import evaluate

    loaded = smollm2_loaded
    assert loaded.num_params == loaded.architecture.num_params == load_architecture("smollm2-135m").num_params
    assert loaded.architecture.num_params == 134_515_008
    assert (loaded.architecture.num_layers, loaded.architecture.hidden_size) == (30, 576)
    report = evaluate(
        loaded.model, loaded.tokenizer, parent=loaded.model, n_samples=2, seq_len=64, seed=0, progress=False
    )
    assert math.isfinite(report.ppl_code) and math.isfinite(report.ppl_prose)
    assert 1.0 < report.ppl_code < 100.0 and 1.0 < report.ppl_prose < 200.0  # a trained model, far below V=49152
    assert report.kl_to_parent == 0.0


@pytest.mark.slow
def test_gemma3_270m_loads_with_its_exact_count_and_scores(gemma3_gguf):
    """Integration: the Gemma 3 270M GGUF (assembled from its PyPI chunk wheels) loads offline by name as a
    dense float32 Gemma3ForCausalLM, counts exactly, and scores finitely on held-out text."""
    from autocompress_opt.data.textdata import test_batches
    from autocompress_opt.quality.metrics import perplexity

    loaded = load_model("gemma3-270m", cache=True)
    assert type(loaded.model).__name__ == "Gemma3ForCausalLM" and loaded.path == gemma3_gguf.resolve()
    assert loaded.num_params == loaded.architecture.num_params == load_architecture("gemma3-270m").num_params
    assert loaded.architecture.num_params == 268_098_176 and loaded.architecture.family == "gemma3_text"
    config = loaded.model.config
    assert config.head_dim == 256 and config.sliding_window == 512 and config.layer_types.count("full_attention") == 3
    assert next(loaded.model.parameters()).dtype == torch.float32
    ids = test_batches(loaded.tokenizer, n_samples=2, seq_len=64, seed=0)
    ppl = perplexity(loaded.model, ids, batch_size=1, progress=False)
    assert math.isfinite(ppl) and 1.0 < ppl < 200.0  # a trained model, far below V=262144


def test_a_gguf_dequantised_copy_is_converted_once_then_read_bit_for_bit(qwen2_gguf, tmp_path, monkeypatch):
    """With ``dequantised_dir`` the first load converts the GGUF and keeps its copy; the next load of
    the same GGUF and dtype reads the copy without converting: the same tensors exactly, the same
    Architecture (named after the GGUF), path and tokenizer. Another dtype is another copy."""
    from autocompress_opt.hf import loading

    conversions: list[torch.dtype] = []
    convert = loading._load_gguf
    monkeypatch.setattr(loading, "_load_gguf", lambda path, dtype: conversions.append(dtype) or convert(path, dtype))
    copies = tmp_path / "parents"
    first = load_model(qwen2_gguf, dequantised_dir=copies)
    again = load_model(qwen2_gguf, dequantised_dir=copies)
    assert conversions == [torch.float32]
    assert [p.name for p in copies.iterdir() if not p.name.startswith(".")] == [next(copies.glob("tiny-qwen2*")).name]
    assert again.path == first.path == qwen2_gguf and again.architecture == first.architecture
    assert "read from its copy" in again.source
    ours, theirs = first.model.state_dict(), again.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    torch.testing.assert_close(_logits(again.model, TOKENS), _logits(first.model, TOKENS), rtol=0, atol=0)
    text = "the theme"
    assert again.tokenizer(text)["input_ids"] == first.tokenizer(text)["input_ids"]
    half = load_model(qwen2_gguf, dequantised_dir=copies, dtype=torch.bfloat16)
    assert conversions == [torch.float32, torch.bfloat16] and half.model.dtype == torch.bfloat16
    assert len([p for p in copies.iterdir() if not p.name.startswith(".")]) == 2
