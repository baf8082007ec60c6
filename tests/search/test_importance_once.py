"""Importance is computed once per (parent, data, dtype): two weights-trial actors (spawned
processes, as Ray's trial actors are) that build their parent context at the same moment on a cold
cache compute the parent's importance once; the other waits and reads the same scores. A parent in
another dtype gets its own entry."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import multiprocessing.synchronize
import os
import time
from pathlib import Path

import pytest
from tiny_lm import save_hf_dir, tiny_model
from weights_helpers import INNER


def _trial_actor(
    parent_dir: str, cache_dir: str, counter: str, dtype: str, barrier: multiprocessing.synchronize.Barrier, out: str
) -> None:
    """Build the trial's parent context the way a trial actor does; the importance estimator is
    wrapped to append this process's id to ``counter`` and to take 3 s longer, so the other actor
    arrives while it computes. Writes the digest of every score tensor to ``out``, and when this
    actor entered and left ``estimate_importance`` (the cache lookup and, if it won, the computation)."""
    import torch

    from autocompress_opt.prune.importance import ESTIMATORS
    from autocompress_opt.search.study import trial_context
    from autocompress_opt.search.study.weights_trial import TrialConfig, parent_context

    torch.set_num_threads(1)
    original = ESTIMATORS.get("minitron")

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        with open(counter, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(3.0)
        return original(*args, **kwargs)

    ESTIMATORS.register("minitron", counted, replace=True)
    estimate, span = trial_context.estimate_importance, []

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        span.append(time.time())
        try:
            return estimate(*args, **kwargs)
        finally:
            span.append(time.time())

    trial_context.estimate_importance = timed
    config = TrialConfig.from_dict({**INNER, "device": "cpu", "compute_dtype": dtype})
    barrier.wait(timeout=120)  # both interpreters are up: start at the same moment
    context, _ = parent_context(parent_dir, config, Path(cache_dir))
    tensors = context.importance._tensors()
    digests = {k: hashlib.sha256(t.double().numpy().tobytes()).hexdigest() for k, t in tensors.items()}
    Path(out).write_text(json.dumps({"pid": os.getpid(), "digests": digests, "span": span}))


def _run_actors(parent_dir: Path, cache: Path, counter: Path, dtype: str, n: int, tmp_path: Path) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(n)
    outs = [tmp_path / f"{dtype}-{i}.json" for i in range(n)]
    actors = [
        context.Process(target=_trial_actor, args=(str(parent_dir), str(cache), str(counter), dtype, barrier, str(o)))
        for o in outs
    ]
    for a in actors:
        a.start()
    for a in actors:
        a.join(timeout=300)
        assert a.exitcode == 0
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow
def test_two_trial_actors_on_a_cold_cache_compute_importance_once(tmp_path: Path) -> None:
    parent_dir = save_hf_dir(tiny_model("llama", num_hidden_layers=2), tmp_path / "llama")
    cache, counter = tmp_path / "cache", tmp_path / "importance-computations.log"
    a, b = _run_actors(parent_dir, cache, counter, "fp32", 2, tmp_path)
    assert a["pid"] != b["pid"]
    assert max(a["span"][0], b["span"][0]) < min(a["span"][1], b["span"][1])  # both were in it at once
    assert len(counter.read_text().split()) == 1  # one of the two computed, the other read its entry
    assert a["digests"] == b["digests"]  # bit-identical scores
    assert len(list((cache / "importance").glob("minitron-*"))) == 1

    # the same parent and data in bf16: its own entry, computed once more (not the fp32 scores)
    [c] = _run_actors(parent_dir, cache, counter, "bf16", 1, tmp_path)
    assert len(counter.read_text().split()) == 2
    assert c["digests"] != a["digests"]
    assert len(list((cache / "importance").glob("minitron-*"))) == 2
