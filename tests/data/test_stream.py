"""The token stream: no token position read twice until the text runs out, then a warning and a counted
pass; rows equal to the documents' own tokens; a position that resumes to the same rows; groups shared
by weight; a sharded run's per-rank slices disjoint — on a folder of small text files and a byte tokenizer."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pytest
from tiny_lm import byte_tokenizer, text_folder

from autocompress_opt.data.stream import TextRepeatsWarning, TokenStream, data_stream
from autocompress_opt.data.textdata import ROLES, data_split
from autocompress_opt.data.tokens import encode as _encode
from autocompress_opt.data.user import load_source
from autocompress_opt.errors import ConfigError


def stream(folder: Path, **kwargs: object) -> TokenStream:
    return data_stream(byte_tokenizer(), data=[str(folder)], role="calibration", seq_len=16, seed=3, **kwargs)


def positions(rows_spans: object) -> list[tuple[str, int]]:
    return [(doc, i) for spans in rows_spans for doc, start, end in spans for i in range(start, end)]  # type: ignore[attr-defined]


def test_rows_hold_the_documents_own_tokens_and_no_position_twice_within_a_pass(tmp_path: Path) -> None:
    folder = text_folder(tmp_path, 30, 200)
    reader = stream(folder)
    ids = {d: _encode(byte_tokenizer(), (folder / d.split(":", 1)[1]).read_text()) for d in reader.split.calibration}
    total = sum(len(v) for v in ids.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error", TextRepeatsWarning)  # never reached: the budget is below the corpus
        rows = reader.take(total // 16 - 10)
    seen = positions(rows.spans)
    assert len(seen) == len(set(seen)) > 0.8 * total  # no token position read twice
    for row, spans in zip(rows.tokens.tolist(), rows.spans):
        from_docs = [t for doc, start, end in spans for t in ids[doc][start:end]]
        assert from_docs == [t for t in row if t != ord("\n")]  # the documents hold no newline: only separators do
    assert reader.passes == 1 and set(rows.passes) == {0}
    assert reader.summary()["groups"]["user"]["pass_tokens"] is None  # not read to its end


def test_a_corpus_smaller_than_the_budget_repeats_warns_and_counts_passes(tmp_path: Path) -> None:
    folder = text_folder(tmp_path, 10, 40)
    reader = stream(folder)
    n_docs = len(reader.split.calibration)
    with pytest.warns(TextRepeatsWarning, match=rf"calibration user text \({n_docs} documents, .* pass 2") as caught:
        rows = reader.take(60)  # 60 · 16 tokens from ~250 tokens of calibration text
    assert sum(w.category is TextRepeatsWarning for w in caught) == 1  # once, however many passes follow
    summary = reader.summary()["groups"]["user"]
    assert reader.passes == summary["passes"] > 2 and max(rows.passes) == reader.passes - 1
    assert summary["pass_tokens"] == sum(
        len((folder / d.split(":", 1)[1]).read_bytes()) for d in reader.split.calibration
    )
    assert summary["epochs"] == pytest.approx(summary["text_tokens"] / summary["pass_tokens"])
    # Each pass reads every position exactly once, in a new document order.
    by_pass = Counter(p for spans, p in zip(rows.spans, rows.passes) for _ in spans)
    assert len(by_pass) == reader.passes
    first = [s[0][0] for s, p in zip(rows.spans, rows.passes) if p == 0 and s]
    second = [s[0][0] for s, p in zip(rows.spans, rows.passes) if p == 1 and s]
    assert list(dict.fromkeys(first)) != list(dict.fromkeys(second))


def test_a_seeked_stream_reads_what_an_uninterrupted_one_does(tmp_path: Path) -> None:
    folder = text_folder(tmp_path, 10, 40)
    straight = stream(folder, quiet=True).take(50)
    first = stream(folder, quiet=True)
    head = first.take(23)  # stops mid-pass, mid-document
    saved = json.loads(json.dumps(first.position()))  # what a checkpoint keeps
    resumed = stream(folder, quiet=True)
    resumed.seek(saved)
    tail = resumed.take(27)
    assert head.tokens.tolist() + tail.tokens.tolist() == straight.tokens.tolist()
    assert head.spans + tail.spans == straight.spans
    again = stream(folder, quiet=True)
    again.take(50)
    assert resumed.summary() == again.summary()


def test_groups_share_rows_by_weight_and_each_is_read_in_its_own_stream(tmp_path: Path) -> None:
    code, prose = text_folder(tmp_path, 20, 200, "code"), text_folder(tmp_path, 20, 200, "prose")
    reader = data_stream(
        byte_tokenizer(), data=[f"{code}:3", f"{prose}:1"], role="calibration", seq_len=16, seed=0, quiet=True
    )
    rows = reader.take(40)
    sources = [spans[0][0].split(":", 1)[0] for spans in rows.spans]
    assert sources[:4] == ["code", "code", "prose", "code"]  # (k+1)·w − n: 0.75, 0.5, 0.25 → prose, ...
    assert Counter(sources) == {"code": 30, "prose": 10}
    assert reader.summary()["groups"]["code"]["rows"] == 30


def test_ranks_slices_of_a_batch_are_disjoint_and_cover_it(tmp_path: Path) -> None:
    """What a sharded run does: every process reads the same stream and keeps rows rank, rank + W, ..."""
    folder = text_folder(tmp_path, 30, 200)
    world, batch = 2, 4
    streams = [stream(folder, quiet=rank > 0) for rank in range(world)]
    whole = stream(folder).take(3 * batch)
    for step in range(3):
        shares = [s.take(batch) for s in streams]
        mine = [positions(share.spans[rank::world]) for rank, share in enumerate(shares)]
        assert not set(mine[0]) & set(mine[1])
        assert sorted(mine[0] + mine[1]) == sorted(positions(whole.spans[step * batch : (step + 1) * batch]))


def test_bad_positions_and_empty_text_are_refused(tmp_path: Path) -> None:
    reader = stream(text_folder(tmp_path, 10, 40))
    with pytest.raises(ConfigError, match="not a position of this stream"):
        reader.seek({"groups": {"code": {}}})
    position = reader.position()
    position["groups"]["user"]["document"] = 10**6
    with pytest.raises(ConfigError, match="out of range"):
        reader.seek(position)
    empty = tmp_path / "empty"
    empty.mkdir()
    for i in range(12):
        (empty / f"e{i}.txt").write_text("")
    # Roles follow a document's text: the twelve empty files share one role, and a stream of it has no tokens.
    [role] = [r for r in ROLES if data_split([load_source(str(empty))]).documents(r)]
    with pytest.raises(ConfigError, match="hold no tokens"):
        data_stream(byte_tokenizer(), data=[str(empty)], role=role, seq_len=4, seed=0).take(20)
