"""Every verb that reads ``--data`` checks each spec before it loads a model: a malformed spec, file,
row or field, and an ``hf:`` dataset that cannot be fetched offline, end in exit status 2 and one line
naming the file and the line or field, within seconds, with nothing written and no study touched."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import autocompress_opt.data.user  # noqa: F401 - imported up front: the timing below is the check's, not torch's import
from autocompress_opt.cli import main


@pytest.fixture
def bad(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """spec -> what its one line must say."""
    (tmp_path / "cut.jsonl").write_text('{"text": "a"}\n{"text": "b')
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "p", "answer": None}) + "\n")
    (tmp_path / "odd.csv").write_text("a,b\n")
    return {
        "missing": (str(tmp_path / "nope.jsonl"), "nope.jsonl': no such file or folder"),
        "truncated": (str(tmp_path / "cut.jsonl"), "cut.jsonl line 2: not a JSON object"),
        "field": (str(tmp_path / "rows.jsonl") + "#field=question", "rows.jsonl: no row has the field 'question'"),
        "suffix": (str(tmp_path / "odd.csv"), "cannot read .csv; valid: .jsonl, .json, .parquet"),
        "option": (str(tmp_path / "rows.jsonl") + "#feild=prompt", "unknown option 'feild' — did you mean 'field'"),
        "hub": ("hf:nobody/nothing#split=test", "could not fetch Hugging Face dataset 'nobody/nothing'"),
    }


def _verbs(tmp_path: Path) -> dict[str, list[str]]:
    model = str(tmp_path / "no-model")  # never reached: the data is checked first
    out = str(tmp_path / "out")
    return {
        "eval": ["eval", "--model", model, "--parent", model, "--out", str(tmp_path / "eval.json")],
        "prune": ["prune", "--model", model, "--params", "0.5", "--out", out],
        "distill": ["distill", "--student", model, "--teacher", model, "--steps", "1", "--out", out],
        "study run": ["study", "run", "--model", model, "--mode", "weights", "--storage", f"sqlite:///{tmp_path}/s.db"],
    }


@pytest.mark.parametrize("verb", ["eval", "prune", "distill", "study run"])
@pytest.mark.parametrize("case", ["missing", "truncated", "field", "suffix", "option", "hub"])
def test_bad_data_is_exit_2_and_one_line_before_the_model_loads(
    tmp_path: Path,
    bad: dict[str, tuple[str, str]],
    verb: str,
    case: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec, says = bad[case]
    start = time.perf_counter()
    code = main([*_verbs(tmp_path)[verb], "--data", spec])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert elapsed < 2.0  # the hub case included: offline, it never waits on the network
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"cut.jsonl", "rows.jsonl", "odd.csv"}), (
        "wrote something"
    )
