"""Ctrl-C for the study driver: the first stops the whole run (every target's trials, none left
RUNNING; :class:`StudyInterrupted`), the second quits at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["InterruptState", "StudyInterrupted", "fit_until_stopped", "handle_sigint"]


class StudyInterrupted(Exception):
    """Ctrl-C stopped :func:`~.run.run_study`: COMPLETE trials are kept, the trials it stopped were told
    FAIL and their points re-queued (the message names them); running the same command resumes."""


@dataclass
class InterruptState:
    """What the SIGINT handler knows: whether Ctrl-C came, and how to stop the Ray Tune run in progress."""

    interrupted: bool = False
    stop: Callable[[], None] | None = None  # set while Ray Tune runs


@contextmanager
def handle_sigint(state: InterruptState) -> Iterator[None]:
    """Ctrl-C handling for :func:`~.run.run_study` (main thread only; elsewhere Ray Tune's own applies).

    First SIGINT: a note on stderr, then, while Ray Tune runs, its own stop (no new trials; its loop
    ends and its trials are stopped), else KeyboardInterrupt. Second SIGINT: exit 130 at once (a
    RUNNING trial may be left; the next run repairs it). Ray Tune's SIGINT handler is disabled so the
    whole run stops, not only the current target's Tune run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if state.interrupted:
            os.write(2, b"\ninterrupted again: quitting now; rerun the same command to resume\n")
            os._exit(130)
        state.interrupted = True
        os.write(2, b"\ninterrupting: stopping the running trials (Ctrl-C again to quit at once)\n")
        if state.stop is None:
            raise KeyboardInterrupt
        state.stop()

    previous = signal.getsignal(signal.SIGINT)
    old_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if old_env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = old_env


def fit_until_stopped(tuner: Any, searcher: Any, state: InterruptState) -> None:
    """``tuner.fit()`` that Ctrl-C stops: the searcher asks for nothing more and Ray Tune's own stop
    (its SIGUSR1 handler, installed by ``fit``) ends its loop and stops the running trials; trials
    still in flight afterwards are told FAIL and re-queued (:meth:`StudySearcher.release`)."""
    from autocompress_opt.search.study.searcher import INTERRUPTED

    usr1 = signal.getsignal(signal.SIGUSR1)
    tune_logger = logging.getLogger("ray.tune")
    level = tune_logger.level

    def stop() -> None:
        searcher.stop()
        ray_stop = signal.getsignal(signal.SIGUSR1)
        if callable(ray_stop) and ray_stop is not usr1:  # Ray Tune's, once fit() has installed it
            tune_logger.setLevel(logging.CRITICAL)  # not its "resume with Tuner.restore(...)" advice
            ray_stop(signal.SIGUSR1, None)

    state.stop = stop
    try:
        tuner.fit()
    finally:
        state.stop = None
        tune_logger.setLevel(level)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, usr1)
        if state.interrupted:
            searcher.release(INTERRUPTED)
    if state.interrupted:
        raise KeyboardInterrupt
