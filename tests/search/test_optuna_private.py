"""The one private Optuna call the study driver relies on
(:func:`~autocompress_opt.search.study._optuna_private.stale_trial_ids`), checked against a real
SQLite study: an Optuna upgrade that renames it or changes what it returns fails here, not in a
driver's orphan repair."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import optuna
import pytest

from autocompress_opt.search.study import Coordination, make_storage, repair_orphans
from autocompress_opt.search.study._optuna_private import stale_trial_ids
from autocompress_opt.search.study.coordination import heartbeat_interval


def _ask(study: optuna.Study) -> optuna.trial.Trial:
    with warnings.catch_warnings():  # "heartbeat ... supposed to be used with Study.optimize"
        warnings.simplefilter("ignore")
        return study.ask({"x": optuna.distributions.IntDistribution(0, 9)})


def test_stale_trial_ids_are_the_running_trials_whose_heartbeat_stopped(tmp_path: Path) -> None:
    """Only a RUNNING trial with a heartbeat older than the grace period is stale; one still
    beating, one without any heartbeat and a finished one are not; asking changes nothing."""
    assert hasattr(optuna.storages.RDBStorage, "_get_stale_trial_ids")  # what the function calls
    with warnings.catch_warnings():  # heartbeat_interval and grace_period are "experimental"
        warnings.simplefilter("ignore")
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="s", storage=storage)
    study_id = storage.get_study_id_from_name("s")
    stopped, beating, _silent, finished = (_ask(study) for _ in range(4))  # _silent: never beats
    ids = {t.number: storage.get_trial_id_from_study_id_trial_number(study_id, t.number) for t in study.trials}
    for trial in (stopped, beating, finished):
        storage.record_heartbeat(ids[trial.number])
    study.tell(finished, 1.0)
    assert stale_trial_ids(storage, study_id) == set()  # every heartbeat is fresh
    time.sleep(2.5)  # older than the 1 s grace period
    storage.record_heartbeat(ids[beating.number])
    assert stale_trial_ids(storage, study_id) == {ids[stopped.number]}
    assert stale_trial_ids(storage, study_id) == {ids[stopped.number]}  # reads only: still RUNNING
    assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["RUNNING", "RUNNING", "RUNNING", "COMPLETE"]


def test_heartbeats_are_on_only_for_an_rdb_storage_opened_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make_storage(heartbeat=True)`` records heartbeats every ``$AUTOCOMPRESS_HEARTBEAT_S``
    seconds; without it, or on a journal file, there are none (public API only)."""
    monkeypatch.setenv("AUTOCOMPRESS_HEARTBEAT_S", "3")
    assert heartbeat_interval(make_storage(f"sqlite:///{tmp_path}/a.db", heartbeat=True)) == 3
    assert heartbeat_interval(make_storage(f"sqlite:///{tmp_path}/b.db")) is None
    journal = tmp_path / "j.log"
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    optuna.create_study(study_name="j", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert heartbeat_interval(make_storage(str(journal))) is None


def test_a_driver_beats_its_trial_by_its_public_id_and_repair_spares_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:class:`Coordination` finds a trial's storage id through the public API, marks and beats it
    while it runs; with the beat stopped (``done``) and the grace period past, another driver's
    repair fails it and re-queues its point."""
    monkeypatch.setenv("AUTOCOMPRESS_HEARTBEAT_S", "1")  # grace 6 s
    url = f"sqlite:///{tmp_path}/c.db"
    storage = make_storage(url, heartbeat=True)
    study = optuna.create_study(study_name="c", storage=storage)
    coordination = Coordination(study, url, storage)
    trial = _ask(study)
    trial.set_user_attr("driver", {"host": "another-host.example", "pid": 1})
    try:
        coordination.beat(trial)
        assert study.trials[0].system_attrs["heartbeat"] is True
        time.sleep(7.5)  # past the grace period, but beaten every second
        assert repair_orphans(study, storage) == []
        coordination.done(trial)
        time.sleep(7.5)
        assert repair_orphans(study, storage) == [trial.number]
    finally:
        coordination.close()
    assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["FAIL", "WAITING"]
