"""``--data`` end to end on a tiny saved model: ``prune --baseline depth``, ``eval`` and ``distill`` read
a JSONL file, a parquet file and a save_to_disk folder the test writes (chat rows through the chat
template), and their records carry each source's SHA-256 and rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_families import tiny_model
from tiny_lm import byte_tokenizer, save_hf_dir

from autocompress_opt.cli import main
from autocompress_opt.data.user import load_source
from autocompress_opt.prune.export import CARD_FILE

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
RELAXED = ["--max-ttft-ms", "0.9x", "--max-tpot-ms", "0.9x", "--max-memory-gib", "1x"]


def _text(i: int) -> str:
    return f"note {i}: " + " ".join(f"tok{(i * 3 + j) % 19}" for j in range(50))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A text JSONL, a chat JSONL, a parquet file and a save_to_disk folder of 40 rows each."""
    import datasets

    root = tmp_path_factory.mktemp("data")
    (root / "notes.jsonl").write_text("".join(json.dumps({"text": _text(i)}) + "\n" for i in range(40)))
    chat = [
        {"messages": [{"role": "user", "content": f"ask {i}"}, {"role": "assistant", "content": _text(i)}]}
        for i in range(40)
    ]
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    datasets.Dataset.from_dict({"text": [_text(100 + i) for i in range(40)]}).to_parquet(str(root / "rows.parquet"))
    datasets.Dataset.from_dict({"text": [_text(200 + i) for i in range(40)]}).save_to_disk(str(root / "saved"))
    sft = [{"instruction": f"do {i}", "input": None, "output": _text(300 + i)} for i in range(40)]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    share = [
        {"conversations": [{"from": "human", "value": f"q {i}"}, {"from": "gpt", "value": _text(i)}]} for i in range(40)
    ]
    (root / "sharegpt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in share))
    (root / "notes").mkdir()
    for i in range(40):
        (root / "notes" / f"n{i:02d}.md").write_text(_text(400 + i))
    files = {
        k: str(root / v)
        for k, v in (("jsonl", "notes.jsonl"), ("chat", "chat.jsonl"), ("parquet", "rows.parquet"), ("disk", "saved"))
    }
    files |= {"sharegpt": str(root / "sharegpt.jsonl"), "folder": str(root / "notes")}
    return files | {"fields": str(root / "sft.jsonl") + "#field=instruction,input,output"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 3-layer llama (byte vocabulary, a chat template) and a perturbed copy as the 'pruned' student."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    parent = save_hf_dir(tiny_model("llama", vocab_size=260), root / "parent", tokenizer)
    student = save_hf_dir(tiny_model("llama", vocab_size=260, seed=1), root / "student", tokenizer)
    return parent, student


def _sources(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in record["split"]["sources"]}


def test_prune_baseline_depth_reads_weighted_data(
    models: tuple[Path, Path], files: dict[str, str], tmp_path: Path
) -> None:
    parent, _ = models
    argv = ["prune", "--model", str(parent), "--out", str(tmp_path / "out"), "--samples", "2", "--seq-len", "16"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--no-progress", "--baseline", "depth"]
    argv += ["--hardware", "rtx5080", "--workload", "local-coding", *RELAXED, "--score-samples", "2"]
    # the choice rows sit beside the study objective's in the selection split: small data, small rows
    argv += ["--inner", "eval_samples=2", "--inner", "eval_seq_len=16", "--inner", "seq_len=16"]
    argv += ["--data", f"{files['jsonl']}:0.5", "--data", f"{files['parquet']}:0.25", "--data", f"{files['disk']}:0.25"]
    assert main(argv) == 0
    record = json.loads((tmp_path / "out" / CARD_FILE).read_text())["extra"]["data"]
    assert record["role"] == "calibration" and record["weights"] == {
        "notes.jsonl": 0.5,
        "rows.parquet": 0.25,
        "saved": 0.25,
    }
    sources = _sources(record)
    assert sources["notes.jsonl"]["sha256"] == load_source(files["jsonl"]).content_sha256()
    assert all(s["n_documents"] == 40 for s in sources.values())
    assert sum(record["rows_by_source"].values()) >= 2


@pytest.mark.parametrize("kind", ["jsonl", "fields", "chat", "sharegpt", "parquet", "disk", "folder"])
def test_eval_reports_the_test_split_of_the_data(
    models: tuple[Path, Path], files: dict[str, str], tmp_path: Path, kind: str, capsys: Any
) -> None:
    parent, student = models
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(student), "--parent", str(parent), "--samples", "2", "--seq-len", "16"]
    assert main([*argv, "--no-progress", "--data", files[kind], "--out", str(out)]) == 0
    assert "data " in capsys.readouterr().out  # the table's row for the user's data
    report = json.loads(out.read_text())
    data = report["data"]["data"]
    assert data["role"] == "test" and report["ppl_data"] > 1 and report["kl_data"] >= 0
    [source] = data["split"]["sources"]
    assert source["sha256"] == load_source(files[kind]).content_sha256() and source["n_documents"] == 40
    read = load_source(files[kind])
    assert sorted(read.read(k) for k in read.keys()) == sorted(EXPECTED[kind])  # noqa: SIM118 (a TextSource)


def _chat(question: str, answer: str) -> str:
    return json.dumps(
        [{"role": "user", "content": question}, {"role": "assistant", "content": answer}], separators=(",", ":")
    )


# The documents each file holds, as the test fixture wrote them (a chat as its canonical messages).
EXPECTED = {
    "jsonl": [_text(i) for i in range(40)],
    "fields": [f"do {i}\n{_text(300 + i)}" for i in range(40)],
    "chat": [_chat(f"ask {i}", _text(i)) for i in range(40)],
    "sharegpt": [_chat(f"q {i}", _text(i)) for i in range(40)],
    "parquet": [_text(100 + i) for i in range(40)],
    "disk": [_text(200 + i) for i in range(40)],
    "folder": [_text(400 + i) for i in range(40)],
}


def test_distill_trains_on_chat_data_through_the_template(
    models: tuple[Path, Path], files: dict[str, str], tmp_path: Path, capsys: Any
) -> None:
    parent, student = models
    argv = ["distill", "--student", str(student), "--teacher", str(parent), "--out", str(tmp_path / "out")]
    argv += ["--batch-size", "2", "--seq-len", "16", "--eval-rows", "2", "--no-progress", "--steps", "2"]
    assert main([*argv, "--data", files["chat"], "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["data"]["role"] == "calibration" and result["eval_data"]["role"] == "test"
    assert _sources(result["data"])["chat.jsonl"]["sha256"] == load_source(files["chat"]).content_sha256()
    # Resuming with other data is refused: the data's record is part of the run's identity.
    more = [*argv, "--data", files["jsonl"]]
    assert main(more) == 2
    assert "data" in capsys.readouterr().err


def test_calibrate_refuses_data_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    """calibrate times random token ids on random-weight architectures: --data is refused by name
    (one line, exit 2, before any timing), and --help explains it where the examples are."""
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "--hardware", "cpu", "--data", "notes.jsonl"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "calibrate takes no --data (got 'notes.jsonl')" in err and "--prompt-len" in err
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    out = capsys.readouterr().out
    assert "no --data:" in out and "random token ids" in out and "--data" not in out.split("options:")[1]
