"""A trial process yields the cores to its driver: it raises its niceness to TRIAL_NICENESS, never lowers it."""

from __future__ import annotations

import os
import subprocess
import sys

from autocompress_opt.search.study.ray_runtime import TRIAL_NICENESS

PROBE = """
import os, sys
os.nice(int(sys.argv[1]))
from autocompress_opt.search.study.ray_runtime import yield_to_the_driver
yield_to_the_driver()
yield_to_the_driver()
print(os.nice(0))
"""


def _niceness_after(start: int) -> int:
    """A fresh process at ``start`` niceness calls yield_to_the_driver twice; its niceness after."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(start)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_a_trial_process_runs_below_the_driver_and_never_above_where_it_started() -> None:
    here = os.nice(0)
    assert _niceness_after(0) == max(here, TRIAL_NICENESS)  # raised once, not twice
    assert _niceness_after(TRIAL_NICENESS + 3) == here + TRIAL_NICENESS + 3  # already nicer: left alone
