"""Nothing lost, nothing misleading (issue 13): storage safety, validate-before-create, study delete,
honest exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autocompress_opt.errors import ConfigError
from autocompress_opt.search.study import make_storage, resolve_storage

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the tests that run studies, with the test plugins importable in workers."""
    import ray

    from autocompress_opt.search.study import init_ray

    init_ray(None, 2, ("study_plugins",))
    yield
    ray.shutdown()


def _run_args(storage: str, *extra: str, name: str = "demo", trials: int = 2) -> list[str]:
    return [
        "study",
        "run",
        "--model",
        "smollm2-135m",
        "--targets",
        "rtx5070",
        "--workload",
        "in-game",
        "--trials",
        str(trials),
        "--name",
        name,
        "--storage",
        storage,
        "--plugin",
        "study_plugins",
        "--quiet",
        *extra,
    ]


# ----------------------------------------------------------------------------- storage
@pytest.mark.parametrize(
    "content", [b"my notes, do not touch\n", b"", b'{"a": 1}\n', b"SQLite format 2\x00rest"], ids=repr
)
def test_a_bare_path_to_a_users_file_is_refused_and_left_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        make_storage(str(path))
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "sqlite:///" in message
    assert path.read_bytes() == content


def test_the_cli_refuses_a_users_text_file_in_one_line_and_leaves_it_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli import main

    path = tmp_path / "notes.txt"
    path.write_bytes(b"remember the milk\n")
    assert main(_run_args(str(path))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err
    assert path.read_bytes() == b"remember the milk\n"


def test_a_bare_path_resolves_to_sqlite_when_new_or_sqlite_and_to_the_journal_when_a_journal(tmp_path: Path) -> None:
    new = tmp_path / "studies" / "x.db"
    assert resolve_storage(str(new)) == f"sqlite:///{new}"
    assert resolve_storage("sqlite:///a.db") == "sqlite:///a.db"
    optuna.create_study(study_name="s", storage=make_storage(str(new)))  # created as SQLite
    assert new.read_bytes()[:16] == b"SQLite format 3\x00"
    assert resolve_storage(str(new)) == f"sqlite:///{new}"
    assert [s.study_name for s in optuna.get_all_study_summaries(make_storage(str(new)))] == ["s"]

    from optuna.storages.journal import JournalFileBackend, JournalStorage

    journal = tmp_path / "j.log"
    optuna.create_study(study_name="j", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert json.loads(journal.read_text().splitlines()[0])["op_code"] == 0
    assert resolve_storage(str(journal)) == str(journal)
    assert [s.study_name for s in optuna.get_all_study_summaries(make_storage(str(journal)))] == ["j"]


def test_cli_run_with_a_bare_sqlite_path_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, local_ray: None
) -> None:
    from autocompress_opt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(_run_args("studies/x.db", "--mode", "plan")) == 0
    assert "demo.rtx5070: 2 COMPLETE trials" in capsys.readouterr().out
    assert (tmp_path / "studies" / "x.db").read_bytes()[:16] == b"SQLite format 3\x00"
    assert main(_run_args("studies/x.db", "--mode", "plan", trials=3)) == 0  # resume on the same bare path
    assert "demo.rtx5070: 3 COMPLETE trials" in capsys.readouterr().out
    assert main(["study", "show", "demo", "--storage", "studies/x.db"]) == 0


# ------------------------------------------------------------------ validate before you create
@pytest.mark.parametrize(
    "typo",
    [
        ["--engine", "vlm"],
        ["--engine-option", "no_such_option=1"],
        ["--targets", "rtx5O70"],
        ["--workload", "in-gmae"],
        ["--max-tpot-ms", "fast"],
        ["--inner", "steps=4"],  # plan mode takes no inner-search settings
        ["--mode", "weights", "--inner", "stpes=4"],
        ["--importance", "no/such/dir"],
    ],
    ids=lambda t: " ".join(t),
)
def test_a_typo_leaves_no_study_behind_and_the_corrected_command_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], typo: list[str], local_ray: None
) -> None:
    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/s.db"
    assert main(_run_args(storage, *typo)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    db = tmp_path / "s.db"
    assert not db.exists() or optuna.get_all_study_summaries(storage) == []
    assert main(_run_args(storage)) == 0
    assert "demo.rtx5070: 2 COMPLETE trials" in capsys.readouterr().out


def test_a_half_created_study_is_replaced_not_blocking_the_name(tmp_path: Path, local_ray: None) -> None:
    """What an interrupted creation (or an older version failing after create_study) leaves: a study
    with no identity and no trials. The next run recreates it instead of refusing the name."""
    from dataclasses import replace

    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.search.study import StudyConfig, load_records, run_study
    from autocompress_opt.serving.targets import Target

    storage = f"sqlite:///{tmp_path}/h.db"
    optuna.create_study(study_name="h.rtx5070", storage=storage, directions=["maximize", "minimize"])
    cfg = StudyConfig(
        name="h",
        model="smollm2-135m",
        targets=(Target("rtx5070", "in-game"),),
        space=replace(load_search_space("smollm2-135m"), sampler="random"),
        trials=2,
        storage=storage,
    )
    run_study(cfg, progress=False)
    records, attrs = load_records(storage, "h.rtx5070")
    assert len([r for r in records if r.state == "COMPLETE"]) == 2 and attrs["identity"]["model"] == "smollm2-135m"


# ----------------------------------------------------------------------------- study delete
def test_study_delete_asks_first_and_deletes_only_the_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/d.db"
    for name in ("demo.rtx5070", "demo.b200", "demo2.rtx5070", "other.rtx5070"):
        optuna.create_study(study_name=name, storage=storage)

    def stored() -> set[str]:
        return {s.study_name for s in optuna.get_all_study_summaries(storage)}

    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert main(["study", "delete", "demo", "--storage", storage]) == 1
    assert stored() == {"demo.rtx5070", "demo.b200", "demo2.rtx5070", "other.rtx5070"}
    prompts: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: prompts.append(prompt) or "y")
    assert main(["study", "delete", "demo", "--storage", storage]) == 0
    assert "demo.rtx5070, demo.b200" in prompts[0]
    assert stored() == {"demo2.rtx5070", "other.rtx5070"}
    capsys.readouterr()
    assert main(["study", "delete", "othr", "--storage", storage, "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'othr'" in err and "demo2.rtx5070, other.rtx5070" in err
    lock = tmp_path / "d.db.driver-lock"  # what a driver leaves beside a SQLite file
    lock.write_text("")
    assert main(["study", "delete", "other.rtx5070", "--storage", storage, "--yes"]) == 0
    assert stored() == {"demo2.rtx5070"} and lock.exists()  # a study is left: its drivers may still lock
    assert main(["study", "delete", "demo2", "--storage", storage, "--yes"]) == 0
    assert stored() == set() and not lock.exists()  # the last study gone: no driver-lock left behind
    assert main(["study", "delete", "x", "--storage", f"sqlite:///{tmp_path}/none.db", "--yes"]) == 2
    assert not (tmp_path / "none.db").exists()


def test_after_delete_the_name_takes_new_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], local_ray: None
) -> None:
    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/r.db"
    assert main(_run_args(storage)) == 0
    other = ["--objectives", "quality:max,peak_memory_gib:min"]
    assert main(_run_args(storage, *other)) == 2  # same name, other objectives: refused
    assert main(["study", "delete", "demo", "--storage", storage, "--yes"]) == 0
    assert main(_run_args(storage, *other)) == 0


# ------------------------------------------------------------------------------ exit codes
def test_a_run_where_no_trial_completes_exits_1_with_the_first_error_and_show_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], local_ray: None
) -> None:
    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/b.db"
    assert main(_run_args(storage, "--mode", "plan-broken")) == 1
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert err == ["error: demo.rtx5070: no trial completed; first error: ValueError: injected: this mode always fails"]
    assert "2 trials FAILED; first error: ValueError: injected" in captured.out
    assert main(["study", "show", "demo", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert "failed (2): ValueError: injected: this mode always fails (trials #0, #1)" in out


def test_a_finished_study_rerun_exits_0_and_partial_failures_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], local_ray: None
) -> None:
    from dataclasses import replace

    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.search.study import StudyConfig, run_study
    from autocompress_opt.serving.targets import Target

    space = replace(load_search_space("smollm2-135m"), sampler="random")
    space = type(space).from_dict({**space.to_dict(), "hidden_size": {"choices": [384, 576]}})
    cfg = StudyConfig(
        name="f",
        model="smollm2-135m",
        targets=(Target("rtx5070", "in-game"),),
        space=space,
        trials=4,
        storage=f"sqlite:///{tmp_path}/f.db",
        mode="plan-flaky",
        plugins=("study_plugins",),
        max_failures=40,
    )
    (outcome,) = run_study(cfg, progress=False)
    assert outcome.complete == 4 and outcome.before == 0 and not outcome.completed_none
    assert outcome.failed == 0 or outcome.first_error == "RuntimeError: injected failure for hidden_size=384"
    (again,) = run_study(cfg, progress=False)  # nothing left to run
    assert again.before == again.complete == 4 and again.failed == 0 and not again.completed_none


def test_study_show_on_a_storage_that_does_not_exist_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``study show`` resolves its storage like every other verb (search.study.group_members): a bare
    path that is not there is a one-line error, and no empty database is left behind."""
    from autocompress_opt.cli import main

    for storage in (str(tmp_path / "new" / "x.db"), f"sqlite:///{tmp_path / 'other' / 'x.db'}"):
        assert main(["study", "show", "x", "--storage", storage]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "no study storage at" in err
    assert list(tmp_path.iterdir()) == []


def test_a_study_where_nothing_is_feasible_says_so_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], local_ray: None
) -> None:
    """Constraints no architecture meets: every trial completes, none is feasible; the run names the
    binding constraint on stderr and exits 3 (documented in 'study run --help'); a looser run is 0."""
    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/i.db"
    assert main(_run_args(storage, "--max-memory-gib", "0.001")) == 3
    captured = capsys.readouterr()
    assert "demo.rtx5070: 2 COMPLETE trials, 0 feasible" in captured.out
    err = captured.err.splitlines()
    assert err[0] == "error: no COMPLETE trial is feasible on any target; relax the binding constraints:"
    assert err[1].startswith(
        "  demo.rtx5070: 2 COMPLETE, 0 feasible; peak_memory_gib <= 0.001 missed by 2/2 (closest +"
    )
    assert main(_run_args(storage, "--max-memory-gib", "100", name="ok")) == 0
    out = capsys.readouterr().out
    assert "ok.rtx5070: 2 COMPLETE trials, " in out and ", 0 feasible" not in out
    with pytest.raises(SystemExit):
        main(["study", "run", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out and "\n  3 " in out and "\n  130 " in out


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--concurrency", "0", "concurrency must be a positive int or 'max', got 0"),
        ("--input-len", "0", "input_len must be a positive int, got 0"),
        ("--output-len", "-5", "output_len must be a positive int, got -5"),
        ("--tp", "0", "tp must be a positive int, got 0"),
    ],
)
def test_zero_lengths_and_concurrency_are_errors_as_in_cost_not_the_workload_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    """``cost`` rejects these; ``study run`` used to replace them silently by the workload's values."""
    from autocompress_opt.cli import main

    assert main(_run_args(f"sqlite:///{tmp_path}/z.db", flag, value)) == 2
    err = capsys.readouterr().err
    assert err == f"autocompress study: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_progress_bar_counts_the_feasible_trials_and_best_quality_already_stored(tmp_path: Path) -> None:
    from autocompress_opt.search.study import ProgressBar

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/p.db", directions=["maximize"])
    for quality, violation in ((0.9, 0.5), (0.7, -0.1), (0.8, 0.0), (0.95, 0.2)):
        trial = study.ask()
        trial.set_user_attr("quality", quality)
        trial.set_constraint("tpot_ms <= 1x", violation)
        study.tell(trial, [quality])
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    bar = ProgressBar("p", total=10, initial=4, enabled=False)
    bar.count_existing(study)
    assert (bar.feasible, bar.best, bar.failed) == (2, 0.8, 0)  # 0.7 and 0.8 feasible; infeasible 0.95 not best
    bar.close()
