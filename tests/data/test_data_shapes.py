"""Every common shape of a user's data file is read as the rows it holds (text, named fields, OpenAI and
ShareGPT chats, prompt/completion, JSON arrays, parquet, text folders, save_to_disk folders, parquet
folders); nulls are no text; malformed input is one line naming the file, line or field; the spec
grammar gives weights unambiguously; roles follow a row's text; chats get no default system prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_lm import byte_tokenizer

from autocompress_opt.data import file_index, user
from autocompress_opt.data.chat import render_chat
from autocompress_opt.data.textdata import ROLES, data_split
from autocompress_opt.data.user import data_batches, load_source, parse_data_spec
from autocompress_opt.errors import ConfigError

# SmolLM2-135M-Instruct's chat template (tokenizer_config.json): a system turn of its own for every
# conversation that has none.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM"


def jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def documents(spec: str) -> list[str]:
    source = load_source(spec)
    return [source.read(k) for k in source.keys()]  # noqa: SIM118 (a TextSource, not a dict)


def chat(*turns: tuple[str, str]) -> str:
    return json.dumps([{"role": r, "content": c} for r, c in turns], ensure_ascii=False, separators=(",", ":"))


@pytest.fixture(autouse=True)
def _fresh_sources() -> Any:
    user._LOADED.clear()  # every test reads its files itself (the disk index is what later processes reuse)
    yield
    user._LOADED.clear()


def test_jsonl_shapes_read_the_rows_they_hold(tmp_path: Path) -> None:
    """text, named fields (nulls skipped, never "null"), OpenAI messages, ShareGPT conversations and
    prompt/completion pairs each give exactly the documents their rows hold."""
    text = jsonl(tmp_path / "t.jsonl", [{"text": "alpha", "id": 1}, {"text": None}, {"text": "beta"}])
    assert documents(text) == ["alpha", "beta"]
    assert load_source(text).keys() == ("000000001", "000000003")  # keys are line numbers
    sft = [{"instruction": "Add 2+2", "input": None, "output": "4"}, {"instruction": "Say hi", "output": None}]
    assert documents(jsonl(tmp_path / "sft.jsonl", sft) + "#field=instruction,input,output") == ["Add 2+2\n4", "Say hi"]
    messages = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    assert documents(jsonl(tmp_path / "m.jsonl", messages)) == [chat(("user", "hi"), ("assistant", "hello"))]
    share = [{"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q"}]}]
    share.append({"conversations": [{"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]})
    assert documents(jsonl(tmp_path / "sg.jsonl", share)) == [
        chat(("system", "be brief"), ("user", "q")),
        chat(("user", "q2"), ("assistant", "a2")),
    ]
    pairs = [{"prompt": "The capital of France is", "completion": " Paris."}, {"prompt": "Q:", "completion": "A"}]
    assert documents(jsonl(tmp_path / "pc.jsonl", pairs)) == ["The capital of France is Paris.", "Q:\nA"]


def test_json_parquet_folders_and_saved_datasets_read_their_rows(tmp_path: Path) -> None:
    import datasets

    rows = [{"question": f"q{i}", "answer": f"a{i}", "note": None} for i in range(3)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert documents(str(tmp_path / "rows.json") + "#field=question,answer") == ["q0\na0", "q1\na1", "q2\na2"]
    table = datasets.Dataset.from_list(rows)
    table.to_parquet(str(tmp_path / "rows.parquet"))
    assert documents(str(tmp_path / "rows.parquet") + "#field=answer,note") == ["a0", "a1", "a2"]
    # save_to_disk with a README beside it: the rows, not the README
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"content": ["one", "two"]}).save_to_disk(str(saved))
    (saved / "README.md").write_text("# my dataset\n")
    assert documents(str(saved)) == ["one", "two"]
    splits = tmp_path / "splits"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": ["t"]}), "test": datasets.Dataset.from_dict({"text": ["x", "y"]})}
    ).save_to_disk(str(splits))
    assert documents(str(splits)) == ["t"] and documents(str(splits) + "#split=test") == ["x", "y"]
    # a Hub dataset's files on disk (README + data/*.parquet): the rows
    hub = tmp_path / "hub-copy"
    (hub / "data").mkdir(parents=True)
    (hub / "README.md").write_text("---\nlicense: mit\n---\n")
    datasets.Dataset.from_dict({"text": ["p", "q"]}).to_parquet(str(hub / "data" / "train-00000-of-00001.parquet"))
    assert documents(str(hub)) == ["p", "q"]
    # a folder of text files: one document per file
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("first")
    (tmp_path / "notes" / "b.txt").write_text("second")
    assert documents(str(tmp_path / "notes")) == ["first", "second"]


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        ('{"text": "ok"}\n{"text": "cut sh', "", r"bad.jsonl line 2: not a JSON object .*the file looks truncated"),
        ('{"text": "ok"}\nnot json\n{"text": "x"}\n', "", r"bad.jsonl line 2: not a JSON object \(Expecting value"),
        ('["a", "b"]\n', "", r"bad.jsonl line 1: a row must be a JSON object"),
        ('{"text": {"nested": 1}}\n', "", r"bad.jsonl line 1: field 'text' holds dict .*valid: a string, null"),
        ('{"messages": [{"speaker": "x"}]}\n', "", r"line 1: field 'messages' item 0 is .*valid: a chat message"),
        ('{"conversations": [{"from": "alien", "value": "x"}]}\n', "", r"line 1: .*from 'alien'; valid speakers"),
        ('{"a": "x"}\n', "#field=b", r"bad.jsonl: no row has the field 'b'"),
        ('{"text": null}\n', "", r"bad.jsonl: no row holds text \(1 rows"),
        (
            '{"text": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n',
            "#field=text,messages",
            r"line 2: holds a chat where",
        ),
    ],
)
def test_malformed_rows_are_one_line_naming_file_line_and_field(
    tmp_path: Path, content: str, field: str, message: str
) -> None:
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(ConfigError, match=message) as error:
        load_source(str(tmp_path / "bad.jsonl") + field)
    assert "\n" not in str(error.value)


def test_the_spec_grammar_gives_weights_and_options_unambiguously(tmp_path: Path) -> None:
    hub = parse_data_spec("hf:org/ds:2024")
    assert (hub.source, hub.config, hub.weight) == ("hf:org/ds", "2024", None)  # a config, never a weight
    hub = parse_data_spec("hf:org/ds-2024#config=en#split=test#field=body#weight=2")
    assert (hub.source, hub.config, hub.split, hub.fields, hub.weight) == (
        "hf:org/ds-2024",
        "en",
        "test",
        ("body",),
        2.0,
    )
    spec = parse_data_spec("sft.jsonl#field=instruction,output#template=plain#weight=0.3")
    assert (spec.source, spec.fields, spec.template, spec.weight) == (
        "sft.jsonl",
        ("instruction", "output"),
        "plain",
        0.3,
    )
    assert parse_data_spec("code.jsonl:0.7").weight == 0.7  # the short form, for paths
    odd = tmp_path / "v:2"
    odd.mkdir()
    assert parse_data_spec(str(odd)) == user.DataSpec(str(odd))  # an existing path is never cut at its colon
    for bad, why in [
        ("x.jsonl#fields=a", "unknown option 'fields' — did you mean 'field'"),
        ("x.jsonl#weight=-1", "must be a finite number > 0"),
        ("x.jsonl#weight=lots", "must be a finite number > 0, got 'lots'"),
        ("x.jsonl#template=fancy", "must be one of model, plain"),
        ("hf:a:b#config=c", "config given twice"),
        ("x.jsonl#split", "option #split needs a value"),
    ]:
        with pytest.raises(ConfigError, match=why):
            parse_data_spec(bad)
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ConfigError, match="#config= applies to hf: datasets only"):
        load_source(str(tmp_path / "t.jsonl") + "#config=en")


def test_appending_rows_moves_no_earlier_row_and_duplicates_share_a_role(tmp_path: Path) -> None:
    """A row's role is hashed from its text: the 300 rows keep their roles when 200 are appended (and
    when the file is renamed); every copy of a repeated row is in one role."""
    rows = [{"text": f"row {i}: " + "w" * (i % 7)} for i in range(300)]
    path = tmp_path / "grow.jsonl"
    before = data_split([load_source(jsonl(path, rows))])
    user._LOADED.clear()
    grown = data_split([load_source(jsonl(path, rows + [{"text": f"new {i}"} for i in range(200)]))])
    for role in ROLES:
        assert set(before.documents(role)) <= set(grown.documents(role))
    assert all(before.documents(r) for r in ROLES)
    copies = data_split([load_source(jsonl(tmp_path / "dup.jsonl", [{"text": f"same {i % 5}"} for i in range(60)]))])
    source = load_source(str(tmp_path / "dup.jsonl"))
    role_of_text: dict[str, set[str]] = {}
    for role in ROLES:
        for doc in copies.documents(role):
            role_of_text.setdefault(source.read(doc.split(":", 1)[1]), set()).add(role)
    assert len(role_of_text) == 5 and all(len(r) == 1 for r in role_of_text.values())


def test_chats_get_no_system_prompt_the_user_did_not_write(tmp_path: Path) -> None:
    """SmolLM2's template writes its own system turn into every conversation without one: it is cut;
    a system message the user wrote stays; the data record names the rendering."""
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert render_chat(turns, tokenizer) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    own = [{"role": "system", "content": "be terse"}, *turns]
    assert render_chat(own, tokenizer).startswith("<|im_start|>system\nbe terse<|im_end|>\n<|im_start|>user\nhi")
    assert render_chat(turns, tokenizer, "plain") == "user: hi\n\nassistant: hello"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i} " * 20}, {"role": "assistant", "content": "a"}]}
        for i in range(40)
    ]
    spec = jsonl(tmp_path / "chat.jsonl", rows)
    for role in ROLES:
        batches = data_batches(tokenizer, data=[spec], role=role, n_samples=2, seq_len=64, seed=0)
        assert all(DEFAULT_SYSTEM not in tokenizer.decode(r) for r in batches.tokens.tolist())
    record = batches.to_dict()["rendering"]["chat.jsonl"]
    assert record["template"] == "model" and record["default_system_turn_removed"] is True


def test_a_later_process_reuses_the_index_of_an_unchanged_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass over a JSONL file is kept by (path, size, mtime): a fresh load reads the index, not the
    file; a rewritten file is read again."""
    from autocompress_opt.data import tables

    path = jsonl(tmp_path / "big.jsonl", [{"text": f"t{i}"} for i in range(50)])
    first = load_source(path)
    user._LOADED.clear()
    monkeypatch.setattr(tables.JsonlSource, "_scan", lambda self: pytest.fail("the file was read again"))
    again = load_source(path)
    assert again.content_sha256() == first.content_sha256() and again.keys() == first.keys()
    assert any(file_index.index_folder().glob("*.npz"))
    monkeypatch.undo()
    user._LOADED.clear()
    jsonl(tmp_path / "big.jsonl", [{"text": f"t{i}"} for i in range(51)])
    assert len(load_source(path).keys()) == 51


def test_a_hub_dataset_is_read_by_name_config_and_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """hf:NAME#config=C#split=S reaches load_dataset as such; the source is named without ':' (which
    ends a document id's source), so rows are drawn from it."""
    import datasets

    calls = []

    def load_dataset(name: str, config: str | None, split: str) -> Any:
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"body": [f"hub row {i} " * 10 for i in range(40)]})

    monkeypatch.setattr(user, "_hub_offline", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    spec = "hf:org/corpus-2024#config=en#split=validation#field=body"
    source = load_source(spec)
    assert calls == [("org/corpus-2024", "en", "validation")] and source.name == "org/corpus-2024[en][validation]"
    rows = data_batches(byte_tokenizer(), data=[spec], role="calibration", n_samples=2, seq_len=32, seed=0)
    assert rows.rows_by_source() == {source.name: 2}
