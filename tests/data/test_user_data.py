"""A user's data as text sources: JSONL (text or chat), parquet, save_to_disk, a folder, hf: offline;
specs with weights; the three-way split by document; the record's SHA-256 and rows per source."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tiny_lm import byte_tokenizer

from autocompress_opt.data.textdata import ROLES, data_split, text_batches
from autocompress_opt.data.user import data_batches, load_source, parse_data_spec, resolve_data
from autocompress_opt.errors import ConfigError

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"


def _prose(i: int) -> str:
    return f"Document {i}: " + " ".join(f"word{(i * 7 + j) % 31}" for j in range(60))


def write_jsonl(path: Path, n: int = 40) -> Path:
    path.write_text("".join(json.dumps({"text": _prose(i), "id": i}) + "\n" for i in range(n)), encoding="utf-8")
    return path


def write_chat_jsonl(path: Path, n: int = 40) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": _prose(i)}]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, n: int = 40) -> Path:
    import datasets

    datasets.Dataset.from_dict({"text": [_prose(100 + i) for i in range(n)]}).to_parquet(str(path))
    return path


def write_disk(path: Path, n: int = 40) -> Path:
    import datasets

    datasets.Dataset.from_dict({"content": [_prose(200 + i) for i in range(n)]}).save_to_disk(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer():
    tok = byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "disk", "folder"])
def test_each_kind_of_source_splits_by_row_and_records_its_sha(tmp_path: Path, tokenizer, kind: str) -> None:
    """Every kind reads one document per row (or file); the three roles partition them; the record
    names the source, its SHA-256 over the documents and the rows drawn from it."""
    if kind == "jsonl":
        spec = str(write_jsonl(tmp_path / "rows.jsonl"))
    elif kind == "parquet":
        spec = str(write_parquet(tmp_path / "rows.parquet"))
    elif kind == "disk":
        spec = str(write_disk(tmp_path / "saved"))
    else:
        (tmp_path / "repo" / "pkg").mkdir(parents=True)
        for i in range(40):
            (tmp_path / "repo" / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 8)
        (tmp_path / "repo" / "blob.bin").write_bytes(b"\x00\x01")  # not text: skipped
        spec = str(tmp_path / "repo")
    source = load_source(spec)
    keys = source.keys()
    assert len(keys) == 40 and list(keys) == sorted(keys)
    split = data_split([source])
    roles = [set(split.documents(r)) for r in ROLES]
    assert sum(map(len, roles)) == 40 and all(roles) and not (roles[0] & roles[1] or roles[0] & roles[2])
    expected = hashlib.sha256()
    for key in keys:
        expected.update(f"{key}\x1f{source.read(key)}\x1e".encode())
    assert split.sources[0].sha256 == expected.hexdigest() and split.sources[0].n_documents == 40
    rows = data_batches(tokenizer, data=[spec], role="calibration", n_samples=3, seq_len=32, seed=0)
    assert rows.tokens.shape == (3, 32)
    record = json.loads(json.dumps(rows.to_dict()))
    assert record["rows_by_source"] == {source.name: 3}
    assert all(set(docs) <= set(split.calibration) for docs in rows.row_documents)


def test_chat_rows_go_through_the_chat_template(tmp_path: Path, tokenizer) -> None:
    """A ``messages`` row is rendered with the tokenizer's template: the rows hold its markers, and a
    tokenizer without a template is refused by name."""
    source = load_source(str(write_chat_jsonl(tmp_path / "chat.jsonl")))
    key = source.keys()[0]
    rendered = source.text(key, tokenizer)
    assert rendered == f"<|user|>question 0?\n<|assistant|>{_prose(0)}\n"
    # Rows longer than a conversation hold whole ones (each document is one piece): every row shows the template.
    rows = data_batches(
        tokenizer, data=[str(tmp_path / "chat.jsonl")], role="calibration", n_samples=2, seq_len=1024, seed=0
    )
    for row in rows.tokens.tolist():
        text = tokenizer.decode(row)
        assert "<|user|>question " in text and "<|assistant|>Document " in text and '"role"' not in text
    with pytest.raises(ConfigError, match="no chat template"):
        source.text(key, byte_tokenizer())


def test_weights_share_rows_between_sources(tmp_path: Path, tokenizer) -> None:
    a, b = str(write_jsonl(tmp_path / "a.jsonl")), str(write_parquet(tmp_path / "b.parquet"))
    rows = data_batches(tokenizer, data=[f"{a}:0.75", f"{b}:0.25"], role="selection", n_samples=8, seq_len=32, seed=1)
    assert rows.rows_by_source() == {"a.jsonl": 6, "b.parquet": 2}
    assert dict(rows.weights) == {"a.jsonl": 0.75, "b.parquet": 0.25}
    with pytest.raises(ConfigError, match="give a weight to every --data spec or to none; no weight on: .*b.parquet"):
        resolve_data([f"{a}:0.5", b])


def test_specs_parse_weights_and_errors_name_the_problem(tmp_path: Path) -> None:
    assert parse_data_spec("code.jsonl:0.7").weight == 0.7 and parse_data_spec("code.jsonl").weight is None
    hub = parse_data_spec("hf:wikitext:wikitext-2-raw-v1:test")
    assert (hub.source, hub.config, hub.split, hub.weight) == ("hf:wikitext", "wikitext-2-raw-v1", "test", None)
    with pytest.raises(ConfigError, match="weight of --data 'x.jsonl:-1'"):
        parse_data_spec("x.jsonl:-1")
    with pytest.raises(ConfigError, match="no such file or folder"):
        load_source(str(tmp_path / "missing.jsonl"))
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"cannot read \.csv"):
        load_source(str(tmp_path / "rows.csv"))
    (tmp_path / "odd.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(
        ConfigError, match=r"odd.jsonl \(line 1\) has no text field.*its fields: body; name the text with #field="
    ):
        load_source(str(tmp_path / "odd.jsonl"))
    assert load_source("python-stdlib").name == "python-stdlib"  # a built-in source by name


def test_hub_dataset_offline_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network here: load_dataset fails, and the error is one line naming the dataset, config and split."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    with pytest.raises(ConfigError) as error:
        load_source("hf:no-such-user/no-such-corpus:cfg:validation")
    message = str(error.value)
    assert "\n" not in message
    assert (
        "could not fetch Hugging Face dataset 'no-such-user/no-such-corpus' (config cfg, split validation)" in message
    )


def test_hub_dataset_unreachable_hub_loads_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the Hub unreachable, a dataset that is not in the local cache fails at once (load_dataset is
    never called); one that is cached loads in the Hub libraries' offline mode (no retries to wait
    out), its error says the Hub is not reachable, and the flags are restored afterwards."""
    import datasets

    from autocompress_opt.data import user
    from autocompress_opt.hf import hub

    seen: list[bool] = []

    def load_dataset(*args, **kwargs):
        seen.append(datasets.config.HF_HUB_OFFLINE)
        raise ConnectionError("Couldn't reach 'x/y' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=hub.HUB_PROBE_TIMEOUT_S: False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(ConfigError, match=r"'x/y'.*the Hub is not reachable from here and the dataset is not in"):
        load_source("hf:x/y")
    assert seen == []
    monkeypatch.setattr(user, "_hub_cached", lambda name: True)
    with pytest.raises(ConfigError, match=r"'x/y'.*the Hub is not reachable from here") as error:
        load_source("hf:x/y")
    assert seen == [True]
    assert datasets.config.HF_HUB_OFFLINE is False
    assert "\n" not in str(error.value)


def test_too_little_user_text_says_so(tmp_path: Path, tokenizer) -> None:
    spec = str(write_jsonl(tmp_path / "small.jsonl", n=20))
    with pytest.raises(ConfigError, match=r"the test user text holds [\d,]+ tokens from \d+ documents"):
        text_batches(tokenizer, sources=[load_source(spec)], role="test", n_samples=500, seq_len=256, seed=0)
