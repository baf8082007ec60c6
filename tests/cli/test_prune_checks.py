"""``autocompress prune`` checks its cheap arguments before the model loads: each bad input exits 2
with one line naming the bad value, no traceback, and nothing written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.cli import main


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: the argument checks must come first."""

    def load_model(ref: str, **kw: Any) -> Any:
        raise AssertionError(f"load_model({ref!r}) ran before the arguments were checked")

    monkeypatch.setattr("autocompress_opt.hf.loading.load_model", load_model)


def prune(tmp_path: Path, *extra: str, out: str | None = None) -> list[str]:
    return [
        "prune",
        "--model",
        "smollm2-135m",
        "--out",
        out or str(tmp_path / "out"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
        *extra,
    ]


def one_line_error(capsys: Any, *needles: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("autocompress prune: error:"), err
    for needle in needles:
        assert needle in err, err
    return err


def test_params_above_the_parents_count_is_an_error(no_loading: None, tmp_path: Path, capsys: Any) -> None:
    assert main(prune(tmp_path, "--params", "500M")) == 2
    one_line_error(capsys, "500,000,000", "134,515,008")
    assert not (tmp_path / "out").exists()


def test_a_count_the_recipe_cannot_meet_fails_before_loading(no_loading: None, tmp_path: Path, capsys: Any) -> None:
    assert main(prune(tmp_path, "--params", "2M")) == 2
    one_line_error(capsys)


def test_missing_arch_file_fails_before_loading(no_loading: None, tmp_path: Path, capsys: Any) -> None:
    assert main(prune(tmp_path, "--arch", str(tmp_path / "nope.json"))) == 2
    one_line_error(capsys, "nope.json")


def test_non_empty_out_without_force(no_loading: None, tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(prune(tmp_path, "--params", "0.6")) == 2
    one_line_error(capsys, "is not empty", "--force")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_out_that_is_a_file_or_under_a_file(no_loading: None, tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "file").write_text("x")
    assert main(prune(tmp_path, "--params", "0.6", out=str(tmp_path / "file"))) == 2
    one_line_error(capsys, "is not a directory")
    assert main(prune(tmp_path, "--params", "0.6", out=str(tmp_path / "file" / "sub"))) == 2
    one_line_error(capsys, "is not a directory")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's read-only filesystem")
def test_read_only_out(no_loading: None, tmp_path: Path, capsys: Any) -> None:
    assert main(prune(tmp_path, "--params", "0.6", out="/proc/autocompress-out")) == 2
    one_line_error(capsys, "/proc/autocompress-out", "cannot write")


@pytest.mark.parametrize("params", ["1.5", "2.5", "0", "-1", "lots"])
def test_nonsense_params_are_refused_by_argparse(no_loading: None, tmp_path: Path, capsys: Any, params: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(prune(tmp_path, "--params", params))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--params" in err and repr(params) in err and "Traceback" not in err
