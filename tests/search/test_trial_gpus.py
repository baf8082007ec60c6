"""A trial given k > 1 GPUs spreads its parent over all of them (``trial_gpus`` → ``load_model(gpus=k)``),
and a trial hands the CUDA allocator's cache back when it ends (an actor Ray reuses keeps no
previous child's blocks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autocompress_opt.search.study import placement, trial_context, trials
from autocompress_opt.search.study.placement import trial_gpus
from autocompress_opt.search.study.weights_trial import TrialConfig, parent_context


@pytest.mark.parametrize(
    "assigned, device, expected",
    [
        (["3", "5"], "cuda:0", 2),
        (["3", "5", "6", "7"], torch.device("cuda", 0), 4),
        (["3"], "cuda:0", 1),  # one GPU, or a fraction of one
        ([], "cuda:0", 1),  # outside Ray
        (["3", "5"], "cpu", 1),
        (["3", "5"], "cuda:1", 1),  # an explicit other GPU of the trial: that one only
    ],
)
def test_trial_gpus_is_every_gpu_ray_assigned_when_the_trial_computes_on_the_first(
    assigned: list[str], device: Any, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(placement, "assigned_gpus", lambda: assigned)
    assert trial_gpus(device) == expected


class Loaded(Exception):
    """Stops parent_context once load_model has been called."""


def test_the_weights_trial_loads_its_parent_over_the_gpus_ray_assigned(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def load_model(ref: str, **kwargs: Any) -> Any:
        calls.append(kwargs)
        raise Loaded

    monkeypatch.setattr(placement, "assigned_gpus", lambda: ["2", "6"])
    monkeypatch.setattr(trial_context, "resolve_device", lambda spec: torch.device("cuda", 0))
    monkeypatch.setattr("autocompress_opt.hf.device.bf16_supported", lambda device: True)  # an Ampere-or-newer GPU
    monkeypatch.setattr("autocompress_opt.hf.loading.load_model", load_model)
    with pytest.raises(Loaded):
        parent_context("some-parent", TrialConfig(), Path("unused"))
    expected = {"cache": False, "dtype": torch.bfloat16, "device": torch.device("cuda", 0), "gpus": 2}
    # the study's dequantised copy of a GGUF parent lives in the trials' cache (weights_trial.load_parent)
    assert calls == [{**expected, "dequantised_dir": Path("unused") / "parents"}]


def test_a_trial_empties_the_cuda_cache_when_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """After each trial, success or error, when CUDA is there; never without it."""
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    outcomes = {"ok": lambda request: {"done": True}, "bad": lambda request: 1 / 0}
    monkeypatch.setattr(trials.TRIAL_MODES, "get", lambda name: outcomes[name])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert trials.run_trial({"mode": "ok"}) == {"done": True}
    with pytest.raises(ZeroDivisionError):
        trials.run_trial({"mode": "bad"})
    assert emptied == [1, 1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trials.run_trial({"mode": "ok"})
    assert emptied == [1, 1]
