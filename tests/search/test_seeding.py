"""The study's seed scoring (search.study.seeding.SeedScoring): what it builds of the parent, what the
targets of a group share, and what it keeps on disk for the trials and for later studies."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_lm import save_hf_dir, tiny_model
from weights_helpers import INNER, PARAMS

from autocompress_opt.arch.search_space import uniform_allocation
from autocompress_opt.prune import baselines
from autocompress_opt.prune import importance as importance_module
from autocompress_opt.search.study import seeding, trial_context, weights_trial
from autocompress_opt.search.study.weights_trial import TrialConfig, parent_context
from autocompress_opt.serving.targets import Target

PROSE = Target("h100-sxm", "datacenter")  # datacenter and in-game trials read prose
ALSO_PROSE = Target("rtx5070", "in-game")
CODE = Target("rtx5080", "local-coding")


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("seeding") / "llama")


def _config(parent_dir: Path, cache: Path) -> Any:
    return SimpleNamespace(
        mode="weights",
        inner=dict(INNER),
        seed=0,
        model=str(parent_dir),
        cache_dir=str(cache),
        gpus_per_trial=None,
        address=None,
        driver_device="cpu",
    )


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the masked forward passes of every scorer seeding builds from now on."""
    calls = [0]
    real = baselines.masked_kl_scorer

    def scorer(*args: Any, **kwargs: Any) -> Any:
        score = real(*args, **kwargs)

        def counted(arch: Any) -> float:
            calls[0] += 1
            return score(arch)

        return counted

    monkeypatch.setattr(baselines, "masked_kl_scorer", scorer)
    return calls


def test_targets_of_one_workload_data_share_a_pair_and_others_get_their_own(
    parent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prose targets get the very same (importance, score); the coding target's importance is
    estimated on code, so its calibration data (and its scores' rows) differ; the parent is loaded once."""
    loads = [0]
    real_load = trial_context.load_parent

    def load(*args: Any, **kwargs: Any) -> Any:
        loads[0] += 1
        return real_load(*args, **kwargs)

    monkeypatch.setattr(trial_context, "load_parent", load)
    scoring = seeding.SeedScoring(_config(parent_dir, tmp_path / "cache"))
    prose, also_prose, code = scoring(PROSE), scoring(ALSO_PROSE), scoring(CODE)
    assert prose is also_prose
    assert code[0].meta.data_id != prose[0].meta.data_id
    assert loads[0] == 1
    arch = uniform_allocation(PARAMS, _arch(parent_dir))
    assert math.isfinite(prose[1](arch)) and math.isfinite(code[1](arch))


def _arch(parent_dir: Path) -> Any:
    from autocompress_opt.hf.loading import load_model

    return load_model(parent_dir).architecture


def test_seeding_builds_only_importance_and_its_rows_and_the_trials_reuse_the_importance(
    parent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeding writes the trials' importance entry and no teacher targets; a trial of that workload then
    reads the importance from disk (no second estimate) and gets the same scores."""
    cache = tmp_path / "cache"
    importance, _ = seeding.SeedScoring(_config(parent_dir, cache))(PROSE)
    assert len([p for p in (cache / "importance").iterdir() if not p.name.startswith(".")]) == 1  # not lock files
    assert not (cache / "teacher").exists()

    estimates = [0]
    monkeypatch.setattr(trial_context, "estimate_importance", _spy(estimates, trial_context.estimate_importance))
    monkeypatch.setattr(importance_module.ESTIMATORS, "get", lambda name: _forbidden)
    weights_trial.clear_trial_cache()
    trial = TrialConfig.from_dict(INNER, seed=0).for_workload(PROSE.workload)
    context, _ = parent_context(str(parent_dir), trial, cache)
    weights_trial.clear_trial_cache()
    assert estimates[0] == 1  # asked once, answered from the cache (the estimator itself is forbidden)
    assert context.importance.meta == importance.meta
    torch.testing.assert_close(context.importance.skip_loss, importance.skip_loss)


def _spy(calls: list[int], real: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    return wrapped


def _forbidden(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("importance was estimated again instead of read from the seeding's cache entry")


def test_candidate_scores_are_kept_on_disk_and_equal_the_masked_kl(
    parent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate scored once is not scored again by a later study's seeding on the same cache (no
    masked forward pass), and the stored value is the scorer's own: the masked KL on the inner
    search's choice rows (selection rows beside the objective's); other rows are another entry."""
    cache = tmp_path / "cache"
    calls = _counting(monkeypatch)
    parent = _arch(parent_dir)
    small = uniform_allocation(PARAMS, parent)
    smaller = uniform_allocation({**PARAMS, "num_layers": 2}, parent)

    _, first = seeding.SeedScoring(_config(parent_dir, cache))(CODE)
    values = [first(small), first(smaller), first(small)]
    assert calls[0] == 2 and values[0] == values[2] and values[0] != values[1]

    _, again = seeding.SeedScoring(_config(parent_dir, cache))(CODE)
    assert [again(small), again(smaller)] == values[:2]
    assert calls[0] == 2  # both read back from disk

    more_rows = _config(parent_dir, cache)
    more_rows.inner = {**INNER, "val_samples": 2}  # other choice rows: the stored scores are not theirs
    _, other = seeding.SeedScoring(more_rows)(CODE)
    other(small)
    assert calls[0] == 3

    # the value is the masked KL on the inner search's choice rows, recomputed here by hand
    trial = TrialConfig.from_dict(INNER, seed=0).for_workload(CODE.workload)
    model, tokenizer, _, parent_id, _ = weights_trial.parent_parts(str(parent_dir), trial)
    importance = weights_trial.parent_importance(model, tokenizer, parent_id, trial, cache)
    rows = weights_trial.choice_rows(tokenizer, trial)
    assert rows.role == "selection" and rows.tokens.shape[0] == trial.inner.val_samples
    monkeypatch.undo()
    by_hand = baselines.masked_kl_scorer(model, importance, rows.tokens)(small)
    assert values[0] == pytest.approx(by_hand, rel=1e-6)


def test_preload_loads_the_parent_once_in_a_thread_and_the_first_pair_uses_it_or_raises_its_error(
    parent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_study preloads the parent while Ray starts: one load, in a thread other than the caller's,
    which the pairs then use; a load error is raised by the pair that needs the parent; a study that
    scores nothing (no seeds, no proxy) or runs in plan mode loads nothing."""
    import threading

    from autocompress_opt.errors import ConfigError

    where: list[str] = []
    real_load = trial_context.load_parent

    def load(*args: Any, **kwargs: Any) -> Any:
        where.append(threading.current_thread().name)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(trial_context, "load_parent", load)
    config = _config(parent_dir, tmp_path / "cache")
    config.seeds_baselines, config.proxy_points = True, 4
    scoring = seeding.SeedScoring(config)
    scoring.preload(PROSE)
    importance, score = scoring(PROSE)
    scoring(CODE)
    assert where == ["autocompress-parent"] and importance is not None and score is not None
    scoring.settle()  # joined already: a no-op

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConfigError("cannot load the parent: boom")

    monkeypatch.setattr(trial_context, "load_parent", broken)
    failing = seeding.SeedScoring(_config(parent_dir, tmp_path / "cache2"))
    failing.config.seeds_baselines, failing.config.proxy_points = False, 4
    failing.preload(PROSE)
    with pytest.raises(ConfigError, match="boom"):
        failing(PROSE)

    for mode, seeds, proxy in (("weights", False, 0), ("plan", True, 0)):
        idle = seeding.SeedScoring(_config(parent_dir, tmp_path / "cache3"))
        idle.config.mode, idle.config.seeds_baselines, idle.config.proxy_points = mode, seeds, proxy
        idle.preload(PROSE)
        assert idle._loading is None and idle._parent is None


# ------------------------------------------------------------------ the driver stays on the CPU
@pytest.fixture
def gpus_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sees two CUDA GPUs in this process (the driver's), none of which may be used."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def _loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every (device, dtype) the parent is loaded with from now on (the real load runs)."""
    from autocompress_opt.hf import loading

    seen: list[tuple[str, Any]] = []
    real = loading.load_model

    def load(*args: Any, **kwargs: Any) -> Any:
        seen.append((str(kwargs.get("device")), kwargs.get("dtype")))
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_model", load)
    return seen


@pytest.mark.usefixtures("gpus_seen")
def test_the_driver_reads_the_parent_on_the_cpu_in_the_gpu_trials_dtype(
    parent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With GPUs in sight and trials of 2 GPUs each, the driver's parent is on the CPU (no device
    memory taken, none to free before the trials), in bf16, the dtype of the GPU trials, so the
    importance it writes is keyed by the parent the trials load (its id names bf16)."""
    loads = _loads(monkeypatch)
    config = _config(parent_dir, tmp_path / "cache")
    config.gpus_per_trial, config.seeds_baselines, config.proxy_points = 2.0, True, 0
    scoring = seeding.SeedScoring(config)
    assert scoring.gpu_trials() is True
    scoring.preload(PROSE)
    importance, _ = scoring(PROSE)
    assert loads == [("cpu", torch.bfloat16)]
    assert importance.meta.model_id.endswith(":bf16")
    scoring.release()


@pytest.mark.usefixtures("gpus_seen")
def test_a_remote_cluster_s_dtype_waits_for_the_placement(
    parent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driving a cluster by address without --gpus-per-trial: whether the trials run on GPUs is the
    cluster's to say, so the parent is not read before the placement; then on the CPU, in the
    trials' dtype (fp32 for a cluster without GPUs here)."""
    from autocompress_opt.search.study.placement import Placement

    loads = _loads(monkeypatch)
    config = _config(parent_dir, tmp_path / "cache")
    config.address, config.seeds_baselines, config.proxy_points = "ray://head:10001", True, 0
    scoring = seeding.SeedScoring(config)
    scoring.preload(PROSE)
    assert scoring.gpu_trials() is None and scoring._loading is None
    scoring.place(Placement(gpus_per_trial=0.0, cpus_per_trial=2, concurrency=1, capacity=1))
    scoring.preload(PROSE)
    scoring.settle()
    assert loads == [("cpu", torch.float32)]


def test_the_driver_uses_a_gpu_only_when_asked() -> None:
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.search.study.placement import check_driver_device, driver_compute_dtype

    assert check_driver_device(None) == "cpu" and check_driver_device("CUDA:1") == "cuda:1"
    with pytest.raises(ConfigError, match="driver_device 'auto' is not one of cpu, cuda, cuda:N"):
        check_driver_device("auto")
    assert [driver_compute_dtype(d, True) for d in ("auto", "fast", "fp32")] == ["bf16", "bf16", "fp32"]
    assert [driver_compute_dtype(d, False) for d in ("auto", "fast", "bf16")] == ["fp32", "fast", "bf16"]
