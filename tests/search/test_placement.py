"""Ray placement of study trials: GPUs and CPUs per trial, trials at once, paths the trials see.

The unit tests give :func:`plan_placement` made-up nodes; the Ray tests start a local Ray with
logical GPUs (no hardware needed) and a two-node ``ray.cluster_utils.Cluster`` whose worker has
fewer CPUs than the head, and run real studies with the ``placement-probe`` trial mode
(``placement_plugins.py``), which records where Ray put each trial."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import load_search_space
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.study import StudyConfig, run_study
from autocompress_opt.search.study.placement import (
    NodeResources,
    check_gpus_per_trial,
    check_visible_paths,
    driver_cache_dir,
    driver_path,
    plan_placement,
    trial_device,
)
from autocompress_opt.search.study.ray_runtime import study_placement
from autocompress_opt.serving.targets import Target

TESTS = Path(__file__).parent


def node(cpus: float, gpus: float = 0, name: str = "n") -> NodeResources:
    return NodeResources(name, name, cpus, gpus)


# ------------------------------------------------------------------ resources, no Ray
def test_gpus_per_trial_default_to_one_in_weights_mode_on_a_gpu_cluster_and_zero_otherwise() -> None:
    gpu_box = [node(64, 8)]
    assert plan_placement(gpu_box, mode="weights").gpus_per_trial == 1
    assert plan_placement(gpu_box, mode="weights").concurrency == 8  # the cluster's GPUs / 1
    assert plan_placement(gpu_box, mode="weights", device="cpu").gpus_per_trial == 0
    assert plan_placement(gpu_box, mode="plan").gpus_per_trial == 0
    cpu_only = plan_placement([node(8)], mode="weights")
    assert (cpu_only.gpus_per_trial, cpu_only.concurrency, cpu_only.cpus_per_trial) == (0, 1, 8)
    assert cpu_only.resources() == {"cpu": 8}


def test_a_fraction_shares_a_gpu_and_divides_its_node_cpus() -> None:
    placement = plan_placement([node(16, 2)], mode="weights", gpus_per_trial=0.5)
    # 2 GPUs / 0.5 = 4 trials at once; 16 CPUs / 4 trials = 4 CPUs each
    assert (placement.concurrency, placement.cpus_per_trial) == (4, 4)
    assert placement.resources() == {"cpu": 4, "gpu": 0.5}
    assert placement.describe() == "4 trials at once, each 0.5 GPU and 4 CPUs"


def test_k_gpus_are_one_placement_group_bundle_on_one_node() -> None:
    from ray import tune

    # 8 + 6 GPUs hold 2 + 1 trials of 4 GPUs (a trial's GPUs are on one node): 3 at once, not 14 / 4
    placement = plan_placement([node(64, 8, "a"), node(12, 6, "b")], mode="weights", gpus_per_trial=4)
    assert (placement.concurrency, placement.cpus_per_trial) == (3, 12)
    factory = placement.resources()
    assert isinstance(factory, tune.PlacementGroupFactory)
    # one bundle: the trainable runs in bundle 0 and sees only that bundle's GPUs
    assert factory.bundles == [{"CPU": 12, "GPU": 4}] and factory.strategy == "STRICT_PACK"


def test_cpus_per_trial_come_from_the_smallest_node_that_hosts_trials_not_the_driver() -> None:
    head, worker = node(2, name="head"), node(1, name="worker")
    assert plan_placement([head, worker], mode="weights").cpus_per_trial == 1  # every node can host one
    assert plan_placement([head, worker], mode="weights", concurrency=3).cpus_per_trial == 1
    assert plan_placement([node(8)], mode="weights", concurrency=3).cpus_per_trial == 2  # 8 // 3, as on one machine
    # a CPU-only head does not limit GPU trials; the GPU nodes' CPUs do
    gpu = plan_placement([node(96, 0, "head"), node(32, 4, "g1"), node(16, 4, "g2")], mode="weights")
    assert (gpu.concurrency, gpu.cpus_per_trial) == (8, 4)
    assert plan_placement([head, worker], mode="plan", concurrency=1).cpus_per_trial == 1  # arithmetic


@pytest.mark.parametrize(
    "value, message",
    [
        (0, "gpus_per_trial must be a number > 0"),
        (-1, "gpus_per_trial must be a number > 0"),
        (float("nan"), "gpus_per_trial must be a number > 0"),
        (True, "gpus_per_trial must be a number > 0"),
        ("1", "gpus_per_trial must be a number > 0"),
        (1.5, "gpus_per_trial 1.5: above 1 it must be a whole number of GPUs"),
    ],
)
def test_invalid_gpus_per_trial_are_named(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_gpus_per_trial(value)


def test_more_gpus_than_one_node_has_or_gpus_on_a_cpu_cluster_are_errors() -> None:
    with pytest.raises(ConfigError, match=r"no node of the Ray cluster has 16 GPUs.*so at most 8"):
        plan_placement([node(64, 8), node(64, 8)], mode="weights", gpus_per_trial=16)
    with pytest.raises(ConfigError, match="gpus_per_trial 1, but the Ray cluster has no GPU"):
        plan_placement([node(8)], mode="weights", gpus_per_trial=1)
    assert plan_placement([node(8, 2)], mode="weights", gpus_per_trial=2.0).gpus_per_trial == 2


def study_config(tmp_path: Path, **kwargs) -> StudyConfig:
    base = dict(
        name="p",
        model="smollm2-135m",
        targets=(Target("h100-sxm", "datacenter"),),
        space=load_search_space("smollm2-135m"),
        trials=4,
        storage=f"sqlite:///{tmp_path}/p.db",
        mode="placement-probe",
        plugins=("placement_plugins",),
        inner={"log": str(tmp_path / "trials.jsonl")},
    )
    return StudyConfig(**{**base, **kwargs})


def test_study_config_checks_gpus_against_the_mode_and_device(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plan-mode trials are cost-model arithmetic and use no GPU"):
        study_config(tmp_path, mode="plan", inner={}, gpus_per_trial=1)
    with pytest.raises(ConfigError, match="with device cpu: the trials would hold GPUs they never use"):
        study_config(tmp_path, inner={"device": "cpu"}, gpus_per_trial=0.5)
    with pytest.raises(ConfigError, match=r"device 'cuda:1' with gpus_per_trial 1: .* cuda:0..cuda:0"):
        study_config(tmp_path, inner={"device": "cuda:1"}, gpus_per_trial=1)
    assert study_config(tmp_path, inner={"device": "cuda:1"}, gpus_per_trial=2).gpus_per_trial == 2
    with pytest.raises(ConfigError, match="cache_dir .* is a file"):
        study_config(tmp_path, cache_dir=__file__)


def test_paths_are_made_absolute_in_the_driver_and_a_node_without_them_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    assert driver_path("model") == str(tmp_path / "model")
    assert driver_path("smollm2-135m") == "smollm2-135m"  # a known name (or a Hub id) stays as it is
    assert driver_cache_dir(None) == str(tmp_path / ".autocompress")
    assert driver_cache_dir("shared/cache") == str(tmp_path / "shared" / "cache")
    missing = str(tmp_path / "gone")
    with pytest.raises(ConfigError, match=rf"node \S+ \(Ray node -\) cannot see the model path '{missing}'"):
        check_visible_paths({"mode": "weights", "parent_model": missing})
    check_visible_paths({"mode": "plan", "parent_model": missing})  # plan trials never load the model
    with pytest.raises(ConfigError, match="cannot see the importance record path"):
        check_visible_paths({"mode": "plan", "importance": missing})
    assert trial_device("auto") == "auto" and trial_device("cuda") == "cuda"  # outside Ray: as requested


def test_gpus_per_trial_and_cache_dir_flags_and_yaml_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autocompress_opt.cli import main

    monkeypatch.chdir(tmp_path)
    from autocompress_opt.cli.study.config import build_config, merged

    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text("mode: weights\ngpus_per_trial: 0.5\ncache_dir: /shared/ac\ntargets: rtx5070\n")
    args = argparse_namespace(config=yaml_file)
    config = build_config(merged(args))
    assert (config.gpus_per_trial, config.cache_dir, config.concurrency) == (0.5, "/shared/ac", None)
    assert build_config({**merged(args), "parallel": 3}).concurrency == 3
    with pytest.raises(SystemExit):
        main(["study", "run", "--gpus-per-trial", "half"])
    assert "gpus per trial must be a number, e.g. 0.5, 1 or 2, got 'half'" in capsys.readouterr().err
    assert main(["study", "run", "--mode", "weights", "--gpus-per-trial", "1.5", "--storage", "x.db"]) == 2
    assert "gpus_per_trial 1.5: above 1 it must be a whole number" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing created


def argparse_namespace(**values: object) -> object:
    import argparse

    return argparse.Namespace(**{"config": None, "run": None, "verb": "study", "action": "run", **values})


# ------------------------------------------------------------------ on Ray
@pytest.fixture
def logical_gpus():
    """A local Ray with 2 logical GPUs and 2 CPUs (no GPU hardware needed), the probe importable in workers."""
    import ray

    ray.init(
        address="local",  # a new Ray, never a cluster another process left in /tmp/ray
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}},
    )
    try:
        yield
    finally:
        ray.shutdown()


def overlapping(a: dict, b: dict) -> bool:
    return a["began"] < b["ended"] and b["began"] < a["ended"]


@pytest.mark.slow
def test_concurrent_trials_get_distinct_gpus_and_compute_on_their_own(
    logical_gpus: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpus_per_trial=1 on 2 GPUs: 2 trials at once by default, each on its own GPU, which it sees as
    cuda:0; the ids are stored with the trial; a local model path and the cache dir reach the
    trials absolute."""
    monkeypatch.chdir(tmp_path)
    load_architecture("smollm2-135m").save(tmp_path / "parent.json")
    config = study_config(tmp_path, model="parent.json", gpus_per_trial=1, cache_dir="cache")
    # each trial holds its GPU for 4 s, so the two running at once overlap even on a loaded machine
    config = replace(config, inner={**config.inner, "sleep_s": 4.0})
    assert study_placement(config).concurrency == 2  # the cluster's 2 GPUs / 1
    assert study_placement(replace(config, gpus_per_trial=0.5)).concurrency == 4
    outcomes = run_study(config, progress=False)
    assert [o.complete for o in outcomes] == [4]
    trials = [json.loads(line) for line in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert len(trials) >= 4
    for t in trials:
        assert len(t["gpu_ids"]) == 1 and t["cuda_visible"] == t["gpu_ids"][0] and t["device"] == "cuda:0"
        assert t["parent_model"] == str(tmp_path / "parent.json") and t["cache_dir"] == str(tmp_path / "cache")
    assert {t["gpu_ids"][0] for t in trials} == {"0", "1"}
    pairs = [(a, b) for a, b in itertools.combinations(trials, 2) if overlapping(a, b)]
    assert pairs, "no two trials ran at once"
    assert all(a["gpu_ids"] != b["gpu_ids"] for a, b in pairs)
    study = optuna.load_study(study_name="p.h100-sxm", storage=config.storage_url)
    stored = [t.user_attrs["gpu_ids"] for t in study.trials if t.state.name == "COMPLETE"]
    assert len(stored) == 4 and all(ids in (["0"], ["1"]) for ids in stored)


@pytest.mark.slow
def test_more_gpus_per_trial_than_the_cluster_has_stops_before_any_study(logical_gpus: None, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no node of the Ray cluster has 4 GPUs"):
        run_study(study_config(tmp_path, gpus_per_trial=4), progress=False)
    assert optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/p.db") == []


@contextlib.contextmanager
def two_nodes(head: dict[str, Any], worker: dict[str, Any]) -> Iterator[Any]:
    """A two-node ``ray.cluster_utils.Cluster`` on this machine: a head and one worker of these resources."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        cluster.add_node(**worker)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def small_worker():
    """A two-node cluster on this machine: a head of 2 CPUs and a worker of 1 CPU."""
    with two_nodes({"num_cpus": 2}, {"num_cpus": 1}) as cluster:
        yield cluster


@pytest.mark.slow
def test_a_worker_with_fewer_cpus_than_the_head_gets_trials(small_worker, tmp_path: Path) -> None:
    """CPUs per trial are the smallest node's (1), not the driver's cores: 3 trials at once fill the
    head (2) and the worker (1), and the study completes."""
    config = study_config(tmp_path, address=small_worker.address, concurrency=3, trials=6)
    # each trial holds its CPU for 4 s: the 3 running at once cannot all fit the head, even on a loaded machine
    config = replace(config, inner={**config.inner, "sleep_s": 4.0})
    outcomes = run_study(config, progress=False)
    assert [o.complete for o in outcomes] == [6]
    placement = study_placement(config)
    assert (placement.cpus_per_trial, placement.capacity) == (1, 3)
    assert study_placement(replace(config, concurrency=None)).cpus_per_trial == 1  # one trial: still fits the worker
    trials = [json.loads(line) for line in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert all(t["cpus"] == 1 for t in trials)
    assert len({t["node"] for t in trials}) == 2  # the 1-CPU worker ran trials too


@pytest.mark.slow
def test_a_study_without_an_address_starts_its_own_ray_beside_a_running_cluster(small_worker) -> None:
    """The two-node cluster wrote /tmp/ray/ray_current_cluster, where Ray's default ray.init() would
    attach (and refuse num_cpus); a study without --address starts a new local Ray instead."""
    import ray

    from autocompress_opt.search.study import init_ray

    ray.shutdown()
    init_ray(None, 1)
    try:
        assert len([n for n in ray.nodes() if n["Alive"]]) == 1  # not the cluster's head + worker
    finally:
        ray.shutdown()


@pytest.fixture
def gpu_worker():
    """A two-node cluster on this machine whose head (the driver's node) has no GPU and whose worker
    has 2 logical GPUs: the layout of a GPU-less login / head node in front of GPU nodes."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    with two_nodes(
        {"num_cpus": 1, "num_gpus": 0}, {"num_cpus": 2, "num_gpus": 2, "env_vars": {"PYTHONPATH": path}}
    ) as cluster:
        yield cluster


@pytest.mark.slow
def test_a_driver_on_a_gpu_less_head_runs_its_trials_on_the_gpu_worker(gpu_worker, tmp_path: Path) -> None:
    """The driver's node has no GPU; with gpus_per_trial=1 every trial runs on the worker, each on its
    own GPU (seen as cuda:0), the study completes, and the placement counts the worker's GPUs only."""
    import ray

    config = study_config(tmp_path, address=gpu_worker.address, gpus_per_trial=1, trials=4)
    config = replace(config, inner={**config.inner, "sleep_s": 2.0})
    outcomes = run_study(config, progress=False)
    assert [o.complete for o in outcomes] == [4]
    placement = study_placement(config)
    assert placement.concurrency == 2  # the worker's 2 GPUs, not the head's none
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and not n["Resources"].get("GPU"))
    trials = [json.loads(line) for line in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert len(trials) >= 4
    assert all(t["node"] != head for t in trials)  # none on the driver's GPU-less node
    assert all(len(t["gpu_ids"]) == 1 and t["device"] == "cuda:0" for t in trials)
    assert {t["gpu_ids"][0] for t in trials} <= {"0", "1"}
