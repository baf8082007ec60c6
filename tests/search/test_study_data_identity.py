"""A weights study records what its ``--data`` held (each source's documents and content SHA-256) in its
identity: resumed after the file grew, it is refused with one line saying what changed, unless
``allow_data_change`` (``--allow-data-change``), which stores the new record and logs the change."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import load_search_space
from autocompress_opt.data import user
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.study import StudyConfig
from autocompress_opt.search.study.coordination import open_study
from autocompress_opt.serving.targets import Target


def _write(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"text": f"row {i} " * 8}) + "\n" for i in range(n)))


def test_a_study_resumed_on_grown_data_is_refused_unless_allowed(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    _write(rows, 30)
    target = Target("rtx5070", "in-game")
    config = StudyConfig(
        name="d",
        model="smollm2-135m",
        targets=(target,),
        space=load_search_space("smollm2-135m"),
        trials=2,
        mode="weights",
        storage=f"sqlite:///{tmp_path}/s.db",
        inner={"data": [str(rows)]},
    )
    parent = load_architecture("smollm2-135m")
    study, _, _ = open_study(config, target, parent)
    [record] = study.user_attrs["identity"]["data"]
    assert record["source"] == "rows.jsonl" and record["documents"] == 30
    open_study(config, target, parent)  # the same data: resumes

    _write(rows, 31)  # one row appended: the specs read the same, the data does not
    user._LOADED.clear()
    with pytest.raises(ConfigError) as error:
        open_study(config, target, parent)
    message = str(error.value)
    assert "\n" not in message
    assert "study 'd.rtx5070' was run on other data: rows.jsonl changed (30 documents" in message
    assert "-> 31," in message and "--allow-data-change" in message

    open_study(replace(config, allow_data_change=True), target, parent)
    stored = optuna.load_study(study_name=config.study_name(target), storage=config.storage_url).user_attrs
    assert stored["identity"]["data"][0]["documents"] == 31 and len(stored["data_changes"]) == 1
    open_study(config, target, parent)  # the new data is now the study's


def test_the_cli_flag_reaches_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autocompress_opt.cli import build_parser
    from autocompress_opt.cli.study import build_config
    from autocompress_opt.cli.study.config import merged as _merged

    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "rows.jsonl", 5)
    argv = ["study", "run", "--mode", "weights", "--targets", "rtx5070", "--data", "rows.jsonl"]
    assert build_config(_merged(build_parser().parse_args([*argv, "--allow-data-change"]))).allow_data_change
    assert not build_config(_merged(build_parser().parse_args(argv))).allow_data_change


def test_a_study_from_before_data_digests_resumes_on_user_data_only_when_told(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    _write(rows, 12)
    target = Target("rtx5070", "in-game")
    config = StudyConfig(
        name="old",
        model="smollm2-135m",
        targets=(target,),
        space=load_search_space("smollm2-135m"),
        trials=2,
        mode="weights",
        storage=f"sqlite:///{tmp_path}/s.db",
        inner={"data": [str(rows)]},
    )
    parent = load_architecture("smollm2-135m")
    study, _, _ = open_study(config, target, parent)
    identity = dict(study.user_attrs["identity"])
    del identity["data"]  # as an earlier version stored it
    study.set_user_attr("identity", identity)
    with pytest.raises(ConfigError, match="recorded no digest of its data .*--allow-data-change"):
        open_study(config, target, parent)
    open_study(replace(config, allow_data_change=True), target, parent)
    open_study(config, target, parent)


def test_a_study_from_before_roles_by_content_resumes_only_when_told(tmp_path: Path) -> None:
    """A weights study on the built-in text whose identity has no split rule (begun when roles were
    hashed per document, and held-out rows not checked for shared text) chose its trials on other
    rows: refused in one line naming the rule, resumed with allow_data_change, then the study's."""
    from autocompress_opt.data.textdata import SPLIT_RULE

    target = Target("rtx5070", "in-game")
    config = StudyConfig(
        name="rule",
        model="smollm2-135m",
        targets=(target,),
        space=load_search_space("smollm2-135m"),
        trials=2,
        mode="weights",
        storage=f"sqlite:///{tmp_path}/s.db",
    )
    parent = load_architecture("smollm2-135m")
    study, _, _ = open_study(config, target, parent)
    identity = dict(study.user_attrs["identity"])
    assert identity["split_rule"] == SPLIT_RULE
    del identity["split_rule"]  # as an earlier version stored it
    study.set_user_attr("identity", identity)
    with pytest.raises(ConfigError) as error:
        open_study(config, target, parent)
    message = str(error.value)
    assert "\n" not in message and f"its split rule was None, now {SPLIT_RULE}" in message
    assert "--allow-data-change" in message
    open_study(replace(config, allow_data_change=True), target, parent)
    open_study(config, target, parent)
