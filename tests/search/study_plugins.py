"""Trial modes used by the study tests (imported through the --plugin mechanism, also in Ray workers)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from autocompress_opt.search.study.trials import TRIAL_MODES, plan_trial


def _slow(request: Mapping[str, Any]) -> dict[str, Any]:
    time.sleep(0.4)  # long enough that a killed driver leaves trials in flight
    return plan_trial(request)


def _slower(request: Mapping[str, Any]) -> dict[str, Any]:
    time.sleep(1.5)  # long enough that a Ctrl-C lands while trials run
    return plan_trial(request)


def _flaky(request: Mapping[str, Any]) -> dict[str, Any]:
    if request["params"]["hidden_size"] == 384:
        raise RuntimeError("injected failure for hidden_size=384")
    return plan_trial(request)


for _name, _fn in (("plan-slow", _slow), ("plan-slower", _slower), ("plan-flaky", _flaky)):
    if _name not in TRIAL_MODES:
        TRIAL_MODES.register(_name, _fn)


def _broken(request: Mapping[str, Any]) -> dict[str, Any]:
    raise ValueError("injected: this mode always fails")


if "plan-broken" not in TRIAL_MODES:
    TRIAL_MODES.register("plan-broken", _broken)
