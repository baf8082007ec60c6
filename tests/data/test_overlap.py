"""Roles by content: nested or identical documents share a role, and held-out rows that share a
13-word n-gram with calibration (test rows: or selection) text are dropped and counted."""

from __future__ import annotations

import random

import pytest
from tiny_lm import byte_tokenizer

from autocompress_opt.data import overlap
from autocompress_opt.data.textdata import ROLES, TextSource, data_split, text_batches, text_sources


class MemorySource(TextSource):
    """Documents held in a dict; a document's role is hashed from its key, as a built-in source's is."""

    domain, licence = "prose", "test"

    def __init__(self, texts: dict[str, str], name: str = "memory") -> None:
        self.texts, self.name = dict(texts), name

    def available(self) -> bool:
        return True

    def install_hint(self) -> str:
        return ""

    def origin(self) -> str:
        return "a test's dict"

    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self.texts))

    def read(self, key: str) -> str:
        return self.texts[key]


def _sentence(rng: random.Random, n_words: int) -> str:
    """Random three-letter words: two such sentences share no 13-word n-gram (26**39 choices)."""
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) for _ in range(n_words))


def _role(split, doc: str) -> str:
    return next(r for r in ROLES if doc in split.documents(r))


def test_nested_and_identical_documents_land_in_one_role() -> None:
    """40 documents each with a paragraph of it as another document, and 10 with a twin under another
    key: every pair shares its role (by their own keys' hashes, about half the pairs would not), and
    the record counts the documents that took another's role."""
    rng = random.Random(0)
    texts = {}
    for i in range(40):
        outer = _sentence(rng, 120)
        texts[f"outer{i:02d}"] = outer
        texts[f"inner{i:02d}"] = " ".join(outer.split()[30:60]).upper()  # case and spacing do not matter
    for i in range(10):
        texts[f"twin{i:02d}a"] = texts[f"twin{i:02d}b"] = _sentence(rng, 8)  # shorter than an n-gram
    split = data_split([MemorySource(texts)])
    for i in range(40):
        assert _role(split, f"memory:inner{i:02d}") == _role(split, f"memory:outer{i:02d}")
    for i in range(10):
        assert _role(split, f"memory:twin{i:02d}a") == _role(split, f"memory:twin{i:02d}b")
    assert split.grouped_documents == 50  # each inner and one of each twin pair
    assert split.to_dict()["grouped_documents"] == 50 and split.to_dict()["ngram_tokens"] == overlap.NGRAM_TOKENS


def test_a_short_shared_phrase_groups_nothing() -> None:
    """A document of fewer than 13 words inside another is not nested text (a common phrase): it keeps its own role."""
    rng = random.Random(1)
    outer = _sentence(rng, 100)
    groups = overlap.content_groups([overlap.DocumentWords.of(t) for t in (outer, " ".join(outer.split()[:12]))])
    assert groups == [0, 1]


def test_a_held_out_row_sharing_an_ngram_with_calibration_is_dropped_and_counted() -> None:
    """One calibration document and every other test document (each shorter than a row) hold the same
    15-word sentence (nothing else in common): test rows holding it are dropped and counted; no kept
    test row shares 13 words with the calibration text, and the record says how many were dropped."""
    rng = random.Random(2)
    texts = {f"doc{i:02d}": _sentence(rng, 20) for i in range(80)}
    roles = data_split([MemorySource(texts)])  # roles hash from keys: the shared sentence moves none
    shared = _sentence(rng, 15)
    test_keys = [d.split(":", 1)[1] for d in roles.test]
    calibration_key = roles.calibration[0].split(":", 1)[1]
    for key in [*test_keys[::2], calibration_key]:
        texts[key] = f"{shared} {texts[key]}"
    source = MemorySource(texts, name="memory2")
    tokenizer = byte_tokenizer()
    batches = text_batches(tokenizer, role="test", n_samples=4, seq_len=160, seed=0, sources=[source])

    assert batches.split.grouped_documents == 0
    calibration = overlap.NgramIndex(
        [overlap.DocumentWords.of(source.read(d.split(":", 1)[1])).grams for d in batches.split.calibration]
    )
    rows = [tokenizer.decode(r) for r in batches.tokens.tolist()]
    assert batches.n_samples == 4 and not any(calibration.shares(r) for r in rows)
    assert batches.rows_dropped >= 1
    check = batches.to_dict()["overlap_check"]
    assert check == {"ngram_tokens": 13, "against": ["calibration", "selection"], "rows_dropped": batches.rows_dropped}


def test_calibration_rows_are_not_checked() -> None:
    batches = text_batches(byte_tokenizer(), role="calibration", n_samples=2, seq_len=64, seed=0, domain="prose")
    assert batches.rows_dropped == 0 and batches.to_dict()["overlap_check"]["against"] == []


def test_ngram_hashes_are_those_of_the_words_whatever_the_punctuation() -> None:
    text = "The quick brown fox jumps over the lazy dog and then runs far away home"
    assert overlap.NgramIndex([overlap.DocumentWords.of(text).grams]).shares(
        "PREFIX: the, quick; brown (fox) jumps over the lazy dog and then runs far -- suffix"
    )
    assert not overlap.NgramIndex([overlap.DocumentWords.of(text).grams]).shares("the quick brown fox jumps")


@pytest.mark.slow
def test_no_built_in_test_row_shares_an_ngram_with_calibration_text() -> None:
    """The real built-in data: test rows of code and prose (64 of 256 byte tokens each) share no
    13-word n-gram with the calibration text, checked here independently of the library's index
    (before roles by content, about two thirds of prose test rows did: benchmarks/results/split_contamination.json)."""
    tokenizer = byte_tokenizer()
    sources = text_sources()
    for domain in ("code", "prose"):
        batches = text_batches(tokenizer, role="test", n_samples=64, seq_len=256, seed=0, domain=domain)
        held = [sources[n].read(k) for n, k in (d.split(":", 1) for d in batches.split.calibration)]
        calibration = overlap.NgramIndex([overlap.DocumentWords.of(t).grams for t in held])
        shared = [r for r in batches.tokens.tolist() if calibration.shares(tokenizer.decode(r))]
        assert not shared, f"{len(shared)} {domain} test rows share text with calibration"
