"""The one use of Optuna's private API in the package, kept here so an Optuna upgrade that changes
it breaks one function (and ``tests/search/test_optuna_private.py``), not the study driver.

Optuna (5.0) finds trials whose heartbeat stopped with ``RDBStorage._get_stale_trial_ids``; its
only public use of it, :func:`optuna.storages.fail_stale_trials`, fails those trials at once. The
study driver needs the ids without failing them: it records why a trial failed (its ``error``
user attribute, which a finished trial no longer takes) before failing it, fails it only when no
other driver did meanwhile, and also repairs trials without a heartbeat
(:func:`~autocompress_opt.search.study.coordination.repair_orphans`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["stale_trial_ids"]


def stale_trial_ids(storage: Any, study_id: int) -> set[int]:
    """The ids of the RUNNING trials of study ``study_id`` whose last heartbeat in ``storage`` (an
    ``optuna.storages.RDBStorage`` opened with ``heartbeat_interval``) is older than the storage's
    grace period. Reads only; changes nothing."""
    return set(storage._get_stale_trial_ids(study_id))
