"""Ctrl-C on ``autocompress study run`` (issue 13): the first SIGINT stops the whole run, leaves no
RUNNING trial, says how to resume and exits 130; a second one quits at once; the same command then
finishes the study without losing a COMPLETE trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent
CLI = str(Path(sys.executable).parent / "autocompress")


def _command(storage: str, trials: int = 4, quiet: bool = True) -> list[str]:
    return [
        CLI,
        "study",
        "run",
        "--targets",
        "rtx5070,b200",
        "--workload",
        "datacenter",
        "--mode",
        "plan-slower",  # 1.5 s a trial: the signal lands while trials run
        "--plugin",
        "study_plugins",
        "--trials",
        str(trials),
        "--parallel",
        "2",
        "--name",
        "c",
        "--storage",
        storage,
        *(["--quiet"] if quiet else []),
    ]


def _env() -> dict[str, str]:
    # the checkout these tests belong to first, whichever one the venv installed
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parents[1]), str(TESTS)]), "OMP_NUM_THREADS": "1"}


def _states(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    except KeyError:
        return []


def _start_and_wait_for_a_complete_trial(tmp_path: Path, storage: str, quiet: bool = True) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        _command(storage, quiet=quiet),
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.3)
        if not (tmp_path / "c.db").exists():
            continue
        try:
            trials = _states(storage, "c.rtx5070")
        except Exception:  # the database is being created
            continue
        if any(t.state.name == "COMPLETE" for t in trials) and any(t.state.name == "RUNNING" for t in trials):
            return proc
    proc.kill()
    pytest.fail(f"no COMPLETE trial with another running before the run ended: {proc.communicate()}")


def _rerun_finishes(tmp_path: Path, storage: str, kept: set[int]) -> None:
    done = subprocess.run(_command(storage), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name in ("c.rtx5070", "c.b200"):
        trials = _states(storage, name)
        complete = [t for t in trials if t.state.name == "COMPLETE"]
        assert len(complete) == 4
        assert len({tuple(sorted(t.params.items())) for t in complete}) == 4
        assert not [t for t in trials if t.state.name == "RUNNING"]
    assert kept <= {t.number for t in _states(storage, "c.rtx5070") if t.state.name == "COMPLETE"}


def test_first_ctrl_c_stops_the_whole_run_consistently_and_the_same_command_resumes(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/c.db"
    proc = _start_and_wait_for_a_complete_trial(tmp_path, storage, quiet=False)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.startswith("starting a local Ray…\n")  # said before the seconds Ray takes to start
    lines = err.strip().splitlines()
    assert lines[-1] == "interrupted; rerun the same command to resume"
    assert "Traceback" not in err and "Tuner.restore" not in err
    # One Ray Tune run serves both targets (they take turns): Ctrl-C stops both, each consistent.
    stopped: list[tuple[str, optuna.trial.FrozenTrial]] = []
    for name in ("c.rtx5070", "c.b200"):
        trials = _states(storage, name)
        assert not [t for t in trials if t.state.name == "RUNNING"]  # storage consistent
        failed = [t for t in trials if t.state.name == "FAIL"]
        assert all("interrupted (Ctrl-C)" in t.user_attrs["error"] for t in failed)
        if failed:
            numbers = ", ".join(f"#{t.number}" for t in failed)
            assert f"{name}: trials {numbers} stopped, marked FAIL and re-queued" in err
        waiting = [t.system_attrs["fixed_params"] for t in trials if t.state.name == "WAITING"]
        assert all(t.params in waiting for t in failed)  # re-queued: rerunning evaluates them first
        stopped += [(name, t) for t in failed]
    assert stopped  # a trial was in flight when Ctrl-C came
    trials = _states(storage, "c.rtx5070")
    assert "COMPLETE trials" not in out  # no end-of-run summary as if it had finished
    kept = {t.number for t in trials if t.state.name == "COMPLETE"}
    _rerun_finishes(tmp_path, storage, kept)
    for name, t in stopped:  # each stopped point was run to completion by the rerun, in its own study
        assert any(r.params == t.params and r.state.name == "COMPLETE" for r in _states(storage, name))


_HANDLER_SCRIPT = """
import os, signal, sys, time
from autocompress_opt.search.study.signals import InterruptState, handle_sigint
state = InterruptState(stop=lambda: time.sleep(60))  # a graceful stop that takes a minute
with handle_sigint(state):
    print("ready", flush=True)
    time.sleep(60)
print("graceful end", flush=True)
"""


def test_a_second_ctrl_c_quits_at_once_while_the_first_is_still_stopping(tmp_path: Path) -> None:
    """The handler itself, deterministically: the first SIGINT starts a (slow) graceful stop; a
    second one, sent once the first has spoken, quits at once with exit 130 and says so."""
    import select
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _HANDLER_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGINT)
    seen = b""
    while b"interrupting:" not in seen:  # the first handler ran (and now sleeps in stop())
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        assert ready, "the first Ctrl-C was not handled"
        seen += os.read(proc.stderr.fileno(), 4096)  # unbuffered: select sees what is left
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and b"graceful end" not in out
    assert b"interrupted again: quitting now; rerun the same command to resume" in seen + err


def test_two_quick_ctrl_c_exit_130_and_the_next_run_repairs_what_they_left(tmp_path: Path) -> None:
    """End to end: two SIGINTs in quick succession (the hard quit, or one graceful stop when the
    machine merges them) exit 130, and the same command then completes the study."""
    storage = f"sqlite:///{tmp_path}/c.db"
    proc = _start_and_wait_for_a_complete_trial(tmp_path, storage)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)  # the driver itself (Ray's processes may hold the pipes a little longer)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "rerun the same command to resume" in err
    kept = {t.number for t in _states(storage, "c.rtx5070") if t.state.name == "COMPLETE"}
    _rerun_finishes(tmp_path, storage, kept)


# The driver of the test below: ``autocompress study run`` whose seeding waits, once it starts for a
# target, until the test creates ``go`` (at most a minute), and marks when it started and ended.
_SLOW_PREPARATION = """
import pathlib, sys, time
from autocompress_opt.cli import main
from autocompress_opt.search.study import run as run_module
here, seed_study = pathlib.Path.cwd(), run_module.seed_study
def slow(study, config, target, *args, **kwargs):
    (here / f"preparing-{target.hardware}").touch()
    waited = time.monotonic()
    while time.monotonic() - waited < 60 and not (here / "go").exists():
        time.sleep(0.05)
    lines = seed_study(study, config, target, *args, **kwargs)
    (here / f"prepared-{target.hardware}").touch()
    return lines
run_module.seed_study = slow
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_a_preparation_waits_for_it_and_leaves_the_storage_whole(tmp_path: Path) -> None:
    """Ctrl-C while the driver prepares the first target (its seeds): the driver says it waits, the
    preparation finishes (its seeds stored), no later target is prepared, the run exits 130 with no
    RUNNING trial, and the same command then completes both studies."""
    storage = f"sqlite:///{tmp_path}/c.db"
    command = [*_command(storage, trials=2), "--seed-baselines"]
    command[command.index("plan-slower")] = "plan"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_PREPARATION, *command[1:]],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (tmp_path / "preparing-rtx5070").exists():
        time.sleep(0.1)
    if not (tmp_path / "preparing-rtx5070").exists():
        proc.kill()
        pytest.fail(f"the first target's preparation never started: {proc.communicate()}")
    time.sleep(2)  # Ray Tune's loop runs beside the preparation by now
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    said = []  # until the driver says it waits (the preparation holds on for a minute at most)
    while not said or "waiting for the target being prepared to finish" not in said[-1]:
        line = proc.stderr.readline()
        if not line:
            break
        said.append(line)
    (tmp_path / "go").touch()
    _, rest = proc.communicate(timeout=120)
    err = "".join(said) + rest
    assert proc.returncode == 130, err
    assert "waiting for the target being prepared to finish" in err
    assert err.strip().splitlines()[-1] == "interrupted; rerun the same command to resume"
    assert "Traceback" not in err
    assert (tmp_path / "prepared-rtx5070").exists() and not (tmp_path / "preparing-b200").exists()
    first = optuna.load_study(study_name="c.rtx5070", storage=storage)
    assert "baseline_seeds" in first.user_attrs  # the preparation ran to its end
    assert not [t for t in first.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    assert not [t for t in _states(storage, "c.b200") if t.state.name == "RUNNING"]
    done = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name in ("c.rtx5070", "c.b200"):
        assert len([t for t in _states(storage, name) if t.state.name == "COMPLETE"]) == 2
