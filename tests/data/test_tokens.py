"""data.tokens: documents' token ids cached per (tokenizer, text) give exactly the uncached tokens; a changed
document or tokenizer misses; entries are shared across processes through the disk and survive corruption."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_lm import byte_tokenizer

from autocompress_opt.data import tokens
from autocompress_opt.data.textdata import TextBatches, TextSource, text_batches
from autocompress_opt.errors import ConfigError


class DictSource(TextSource):
    """Documents held in a dict (the test changes one in place)."""

    name, domain, licence = "dict-docs", "user", "test"

    def __init__(self, docs: dict[str, str]):
        self.docs = docs

    def available(self) -> bool:
        return True

    def install_hint(self) -> str:
        return ""

    def origin(self) -> str:
        return "test"

    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self.docs))

    def read(self, key: str) -> str:
        return self.docs[key]


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Texts of documents the tokenizer was actually run on (the piece separator left out)."""
    calls: list[str] = []
    original = tokens.encode

    def counting(tokenizer: Any, text: str) -> list[int]:
        if text != "\n\n":
            calls.append(text)
        return original(tokenizer, text)

    monkeypatch.setattr(tokens, "encode", counting)
    tokens.clear_token_memo()
    yield calls
    tokens.clear_token_memo()


def _docs(n: int = 40) -> dict[str, str]:
    return {f"doc{i:02d}": f"document {i}: " + " ".join(f"word{i * j % 97}" for j in range(60)) for i in range(n)}


def _call(tokenizer: Any, source: TextSource, cache: Any, n_samples: int = 12) -> TextBatches:
    return text_batches(
        tokenizer, role="calibration", n_samples=n_samples, seq_len=64, seed=3, sources=[source], token_cache=cache
    )


def _batches(tokenizer: Any, source: TextSource, cache: Any) -> torch.Tensor:
    return _call(tokenizer, source, cache).tokens


def test_cached_tokens_are_bit_identical_to_uncached(tmp_path: Path, encodes: list[str]) -> None:
    """Cold (tokenised, then written), memo-warm and disk-warm calls give the tensor of a fresh,
    cache-less tokenisation, and the disk entry holds exactly the tokenizer's ids of each text."""
    tokenizer, source = byte_tokenizer(), DictSource(_docs())
    cold = _batches(tokenizer, source, tmp_path)
    n_cold = len(encodes)
    assert n_cold > 0
    memo_warm = _batches(tokenizer, source, tmp_path)
    tokens.clear_token_memo()
    disk_warm = _batches(tokenizer, source, tmp_path)
    assert len(encodes) == n_cold  # neither warm call ran the tokenizer
    tokens.clear_token_memo()
    uncached = _batches(tokenizer, source, False)
    assert len(encodes) == 2 * n_cold
    for other in (memo_warm, disk_warm, uncached):
        assert torch.equal(cold, other)
    (entry,) = tmp_path.glob("*.npz")
    with np.load(entry, allow_pickle=False) as data:
        ids, offsets, digests = data["ids"], data["offsets"], list(data["digests"])
    assert len(digests) == n_cold
    for text in encodes[:n_cold]:
        i = digests.index(tokens.hashlib.sha256(text.encode()).hexdigest())
        assert ids[offsets[i] : offsets[i + 1]].tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_changed_document_misses(tmp_path: Path, encodes: list[str]) -> None:
    docs = _docs()
    source = DictSource(docs)
    tokenizer = byte_tokenizer()
    first = text_batches(
        tokenizer, role="calibration", n_samples=12, seq_len=64, seed=3, sources=[source], token_cache=tmp_path
    )
    used = first.documents[0].split(":", 1)[1]
    docs[used] = docs[used].replace("document", "DOCUMENT")
    tokens.clear_token_memo()
    encodes.clear()
    changed = _batches(tokenizer, source, tmp_path)
    assert encodes == [docs[used]]  # only the changed document was tokenised again
    tokens.clear_token_memo()
    assert torch.equal(changed, _batches(tokenizer, source, False))
    assert not torch.equal(changed, first.tokens)


def test_a_changed_tokenizer_misses_and_an_equal_one_hits(tmp_path: Path, encodes: list[str]) -> None:
    source = DictSource(_docs())
    plain = _batches(byte_tokenizer(), source, tmp_path)
    n_cold = len(encodes)
    assert torch.equal(_batches(byte_tokenizer(), source, tmp_path), plain)  # another object, same tokenizer
    assert len(encodes) == n_cold
    merged = byte_tokenizer()
    merged.add_tokens(["word"])  # one more token: other ids for the same text
    assert tokens.tokenizer_fingerprint(merged) != tokens.tokenizer_fingerprint(byte_tokenizer())
    with_word = _batches(merged, source, tmp_path)
    assert len(encodes) == 2 * n_cold
    assert not torch.equal(with_word, plain)
    tokens.clear_token_memo()
    assert torch.equal(with_word, _batches(merged, source, False))
    assert len(list(tmp_path.glob("*.npz"))) == 2  # one entry per (tokenizer, source)


def test_entries_grow_and_a_corrupt_entry_is_rewritten(tmp_path: Path, encodes: list[str]) -> None:
    tokenizer, source = byte_tokenizer(), DictSource(_docs())
    small = text_batches(
        tokenizer, role="calibration", n_samples=2, seq_len=64, seed=3, sources=[source], token_cache=tmp_path
    )
    (entry,) = tmp_path.glob("*.npz")
    with np.load(entry) as data:
        n_small = len(data["digests"])
    _batches(tokenizer, source, tmp_path)  # more documents: merged into the same entry
    with np.load(entry) as data:
        assert len(data["digests"]) > n_small
    entry.write_bytes(b"not a zip file")
    tokens.clear_token_memo()
    again = text_batches(
        tokenizer, role="calibration", n_samples=2, seq_len=64, seed=3, sources=[source], token_cache=tmp_path
    )
    assert torch.equal(again.tokens, small.tokens)
    with np.load(entry) as data:
        assert len(data["digests"]) == n_small


def test_an_unfingerprintable_tokenizer_is_not_cached(tmp_path: Path) -> None:
    class Bare:
        """A tokenizer without a serialisable backend: byte ids."""

        def __len__(self) -> int:
            return 256

        def __call__(self, text: str, add_special_tokens: bool = True, verbose: bool = True) -> dict[str, list[int]]:
            return {"input_ids": list(text.encode())}

    assert tokens.tokenizer_fingerprint(Bare()) is None
    source = DictSource(_docs())
    assert torch.equal(_batches(Bare(), source, tmp_path), _batches(byte_tokenizer(), source, False))
    assert not list(tmp_path.glob("*.npz"))


@pytest.mark.parametrize("bad", [None, "", 3])
def test_invalid_token_cache_names_the_value(bad: Any) -> None:
    with pytest.raises(ConfigError, match="token_cache must be True, False or a folder path"):
        _batches(byte_tokenizer(), DictSource(_docs()), bad)


def test_token_cache_env_moves_the_cache_for_started_processes(tmp_path: Path) -> None:
    """AUTOCOMPRESS_TOKEN_CACHE reaches a process this one starts (a Ray worker, a CLI run): the
    test session sets it, so subprocesses of tests do not write to the user's ~/.cache."""
    import os
    import subprocess
    import sys

    assert os.environ[tokens.TOKEN_CACHE_ENV] == tokens.DEFAULT_TOKEN_CACHE  # conftest: this session's folder
    code = "from autocompress_opt.data import tokens; print(tokens.DEFAULT_TOKEN_CACHE)"
    env = {**os.environ, tokens.TOKEN_CACHE_ENV: str(tmp_path / "ids")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "ids")
    env.pop(tokens.TOKEN_CACHE_ENV)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "~/.cache/autocompress_opt/tokens"


def test_the_rows_record_names_the_tokenizer_not_its_folder(tmp_path: Path) -> None:
    """One tokenizer read from two folders (a GGUF's and its dequantised copy's) gives one record, so
    the importance, teacher and seed-score caches keyed by it are shared; another tokenizer does not."""
    from transformers import AutoTokenizer

    source = DictSource(_docs())
    records = []
    for folder in ("parent", "dequantised-copy"):
        byte_tokenizer().save_pretrained(tmp_path / folder)
        loaded = AutoTokenizer.from_pretrained(tmp_path / folder)
        assert str(tmp_path / folder) in loaded.name_or_path
        records.append(_call(loaded, source, False).to_dict())
    assert records[0] == records[1]
    assert records[0]["tokenizer"] == tokens.tokenizer_label(byte_tokenizer())
    assert "dequantised-copy" not in records[1]["tokenizer"]
    merged = byte_tokenizer()
    merged.add_tokens(["word"])
    assert _call(merged, source, False).to_dict()["tokenizer"] != records[0]["tokenizer"]
