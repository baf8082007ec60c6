"""A trial mode that reports inner-search progress without a model (imported through --plugin, also
in Ray workers): the scheduler tests need trials whose intermediate scores are known in advance."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autocompress_opt.search.study.progress import TrialProgress, report
from autocompress_opt.search.study.trials import TRIAL_MODES, plan_trial


def fake_kl(params: Mapping[str, Any]) -> float:
    """A held-out KL that falls with every kept unit: bigger points are strictly better."""
    return 20.0 - params["num_layers"] * 0.3 - params["hidden_size"] / 100 - params["ffn_width"] / 1000


def _reporting(request: Mapping[str, Any], worse: float = 0.0) -> dict[str, Any]:
    """Phases like a weights trial, then ``inner.steps`` inner steps whose KL approaches
    :func:`fake_kl` of the point, plus ``worse`` (``violation`` > 0 when ``hidden_size`` is 384),
    then the plan-mode result."""
    steps = int(request["inner"]["steps"])
    for phase in ("load parent", "importance", "teacher"):
        report(TrialProgress(phase, 0, steps))
    kl = fake_kl(request["params"]) + worse
    violation = 0.2 if request["params"]["hidden_size"] == 384 else 0.0
    for step in range(1, steps + 1):
        time.sleep(0.05)
        report(TrialProgress("inner search", step, steps, kl + 1.0 / step, violation))
    report(TrialProgress("quality", steps, steps, kl, violation))
    return plan_trial(request)


def _reporting_with_fallback(request: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`_reporting`, but a seeded trial (``request["baselines"]``) first reports its fallback,
    as a weights trial does: the plan-mode result named after its first baseline. The search at
    minitron's point goes badly (10 nats worse), so a rung has a seed to stop."""
    worse = 0.0
    if request.get("baselines"):
        name = next(iter(request["baselines"]))
        fallback = {**plan_trial(request), "selection": {"chosen": name, "stopped_at_step": None}}
        report(TrialProgress("baseline", 0, int(request["inner"]["steps"]), fallback=json.dumps(fallback)))
        worse = 10.0 if name == "minitron" else 0.0
    return _reporting(request, worse)


def _reporting_held(request: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`_reporting`, but a trial that starts while the file named by ``ACO_TEST_HOLD`` exists
    holds for a minute before its first report: a kill -9 is sure to find it running (a trial seen
    running otherwise may be stopped at its next rung before the kill lands). The variable reaches
    the Ray workers of a local cluster through the driver's environment."""
    hold = os.environ.get("ACO_TEST_HOLD")
    if hold and Path(hold).exists():
        report(TrialProgress("load parent", 0, int(request["inner"]["steps"])))
        time.sleep(60)
    return _reporting(request)


if "plan-reporting" not in TRIAL_MODES:
    TRIAL_MODES.register("plan-reporting", _reporting)
if "plan-fallback" not in TRIAL_MODES:
    TRIAL_MODES.register("plan-fallback", _reporting_with_fallback)
if "plan-reporting-held" not in TRIAL_MODES:
    TRIAL_MODES.register("plan-reporting-held", _reporting_held)
