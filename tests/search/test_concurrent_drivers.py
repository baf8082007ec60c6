"""Several ``autocompress study run`` drivers on one study (issue 13): exactly the requested COMPLETE
count, no repeated points, no RUNNING trial left, no driver dying on a creation race; orphan repair
by heartbeat, so a live driver on another host keeps its trials. On SQLite and on a real PostgreSQL
server that the test starts itself (skipped when PostgreSQL is not installed)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autocompress_opt.search.study import make_storage, repair_orphans

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent
CLI = str(Path(sys.executable).parent / "autocompress")
PG_MISSING = "PostgreSQL not installed: apt-get install postgresql (or run make data as root)"


def _command(storage: str, trials: int) -> list[str]:
    return [
        CLI,
        "study",
        "run",
        "--targets",
        "h100-sxm",
        "--workload",
        "datacenter",
        "--mode",
        "plan-slower",  # 1.5 s a trial: the drivers overlap
        "--plugin",
        "study_plugins",
        "--trials",
        str(trials),
        "--parallel",
        "2",
        "--name",
        "cc",
        "--storage",
        storage,
        "--quiet",
    ]


def _run_two_drivers(tmp_path: Path, storage: str, trials: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            _command(storage, trials),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert f"cc.h100-sxm: {trials} COMPLETE trials" in out


def _check_study(storage: str, trials: int) -> list[optuna.trial.FrozenTrial]:
    all_trials = optuna.load_study(study_name="cc.h100-sxm", storage=make_storage(storage)).get_trials(deepcopy=False)
    complete = [t for t in all_trials if t.state.name == "COMPLETE"]
    assert len(complete) == trials  # exactly the requested count, not one per driver more
    assert len({tuple(sorted(t.params.items())) for t in complete}) == trials  # no repeated point
    assert not [t for t in all_trials if t.state.name in ("RUNNING", "WAITING")]  # no orphans, nothing queued
    return complete


def _drivers(complete: list[optuna.trial.FrozenTrial]) -> set[int]:
    return {t.user_attrs["driver"]["pid"] for t in complete}


def test_two_drivers_on_a_new_sqlite_study_reach_exactly_the_count_then_resume_together(tmp_path: Path) -> None:
    """Started at once on a database that does not exist yet (both race to create tables and
    study), then both asked for more on the existing study."""
    storage = f"sqlite:///{tmp_path}/cc.db"
    _run_two_drivers(tmp_path, storage, 8)
    first = _check_study(storage, 8)
    _run_two_drivers(tmp_path, storage, 16)
    complete = _check_study(storage, 16)
    assert {t.number for t in first} <= {t.number for t in complete}
    assert len(_drivers(complete)) >= 3, "expected both drivers of each run to complete trials"


# ----------------------------------------------------------------------- heartbeat repair
def _trial_id(storage: optuna.storages.RDBStorage, study: optuna.Study, trial: optuna.trial.Trial) -> int:
    """``trial``'s storage id, by Optuna's public storage API."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)


def _running_trial(
    study: optuna.Study, storage: optuna.storages.RDBStorage, driver: dict, heartbeat: bool
) -> optuna.trial.Trial:
    with warnings.catch_warnings():  # "heartbeat ... supposed to be used with Study.optimize"
        warnings.simplefilter("ignore")
        trial = study.ask({"x": optuna.distributions.IntDistribution(0, 1000)})
    trial.set_user_attr("driver", driver)
    if heartbeat:
        storage.record_heartbeat(_trial_id(storage, study, trial))
        storage.set_trial_system_attr(_trial_id(storage, study, trial), "heartbeat", True)
    return trial


def test_orphans_are_found_by_heartbeat_not_by_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial of a live driver on another host (fresh heartbeat) is left alone; once its heartbeat
    is older than the grace period it is failed and re-queued; a trial of a dead driver on this
    host is repaired at once; a trial another driver repairs first is not repaired twice."""
    monkeypatch.setenv("AUTOCOMPRESS_HEARTBEAT_S", "1")  # grace 6 s
    storage = make_storage(f"sqlite:///{tmp_path}/hb.db", heartbeat=True)
    study = optuna.create_study(study_name="hb", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    elsewhere = _running_trial(study, storage, {"host": "another-host.example", "pid": os.getpid()}, heartbeat=True)
    gone_here = _running_trial(study, storage, {"host": socket.gethostname(), "pid": dead.pid}, heartbeat=True)
    assert repair_orphans(study, storage) == [gone_here.number]
    assert repair_orphans(study, storage) == []  # already FAIL: not failed or re-queued again
    time.sleep(7.5)  # the other host's driver stopped beating (as if it had died)
    assert repair_orphans(study, storage) == [elsewhere.number]
    trials = study.get_trials(deepcopy=False)
    assert [t.state.name for t in trials[:2]] == ["FAIL", "FAIL"]
    assert all("orphaned" in t.user_attrs["error"] for t in trials[:2])
    assert sum(t.state.name == "WAITING" for t in trials) == 2  # both points re-queued once


def test_a_live_heartbeat_keeps_a_trial_of_another_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same as above while the heartbeat goes on: never repaired."""
    monkeypatch.setenv("AUTOCOMPRESS_HEARTBEAT_S", "1")
    storage = make_storage(f"sqlite:///{tmp_path}/hb.db", heartbeat=True)
    study = optuna.create_study(study_name="hb", storage=storage)
    trial = _running_trial(study, storage, {"host": "another-host.example", "pid": 1}, heartbeat=True)
    for _ in range(8):
        time.sleep(1)
        storage.record_heartbeat(_trial_id(storage, study, trial))
        assert repair_orphans(study, storage) == []


# ---------------------------------------------------------------------------- PostgreSQL
def _pg_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL server (initdb + pg_ctl in a temp dir, a free port, trust auth);
    as root, run as the ``postgres`` (else ``nobody``) user, since initdb refuses root."""
    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip(PG_MISSING)
    prefix: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="autocompress-pg-"))
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        users = [u for u in ("postgres", "nobody") if _user_exists(u)]
        if not runuser or not users:
            shutil.rmtree(base, ignore_errors=True)
            pytest.skip("running as root and no runuser/postgres user to run initdb as (it refuses root)")
        prefix = [runuser, "-u", users[0], "--"]
        base.chmod(0o755)
        shutil.chown(base, user=users[0])
    data, port = base / "data", _free_port()
    try:
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start"],
            check=True,
            capture_output=True,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {exc.stderr.decode(errors='replace')}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def test_two_drivers_on_postgresql_reach_exactly_the_count(tmp_path: Path, postgres_url: str) -> None:
    _run_two_drivers(tmp_path, postgres_url, 8)
    first = _check_study(postgres_url, 8)
    _run_two_drivers(tmp_path, postgres_url, 14)
    complete = _check_study(postgres_url, 14)
    assert {t.number for t in first} <= {t.number for t in complete}
    assert len(_drivers(complete)) >= 3, "expected both drivers of each run to complete trials"
