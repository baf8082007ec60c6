"""A trial mode that reports inner-search progress without a model (imported through --plugin, also
in Ray workers): the scheduler tests need trials whose intermediate scores are known in advance."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from autocompress_opt.search.progress import TrialProgress, report
from autocompress_opt.search.trials import TRIAL_MODES, plan_trial


def fake_kl(params: Mapping[str, Any]) -> float:
    """A held-out KL that falls with every kept unit: bigger points are strictly better."""
    return 20.0 - params["num_layers"] * 0.3 - params["hidden_size"] / 100 - params["ffn_width"] / 1000


def _reporting(request: Mapping[str, Any]) -> dict[str, Any]:
    """Phases like a weights trial, then ``inner.steps`` inner steps whose KL approaches
    :func:`fake_kl` of the point (``violation`` > 0 when ``hidden_size`` is 384), then the plan-mode result."""
    steps = int(request["inner"]["steps"])
    for phase in ("load parent", "importance", "teacher"):
        report(TrialProgress(phase, 0, steps))
    kl = fake_kl(request["params"])
    violation = 0.2 if request["params"]["hidden_size"] == 384 else 0.0
    for step in range(1, steps + 1):
        time.sleep(0.05)
        report(TrialProgress("inner search", step, steps, kl + 1.0 / step, violation))
    report(TrialProgress("quality", steps, steps, kl, violation))
    return plan_trial(request)


if "plan-reporting" not in TRIAL_MODES:
    TRIAL_MODES.register("plan-reporting", _reporting)
