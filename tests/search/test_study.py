"""Pareto studies on a real local Ray with a real Optuna SQLite storage."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import load_search_space
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.study import (
    SEEDED_BASELINES,
    Objective,
    StudyConfig,
    TrialRecord,
    baseline_seeds,
    init_ray,
    load_records,
    pareto_front,
    run_study,
    sampler_seed,
)
from autocompress_opt.serving.targets import Target

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the module, with the test plugins importable in workers."""
    import ray

    init_ray(None, 2, ("study_plugins",))
    yield
    ray.shutdown()


def config(tmp_path: Path, name: str = "t", **kwargs) -> StudyConfig:
    base = dict(
        name=name,
        model="smollm2-135m",
        targets=(Target("rtx5070", "in-game"), Target("b200", "datacenter")),
        space=load_search_space("smollm2-135m"),
        trials=8,
        storage=f"sqlite:///{tmp_path}/studies.db",
        plugins=("study_plugins",),
        concurrency=2,
    )
    return StudyConfig(**{**base, **kwargs})


def complete(records: list[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.state == "COMPLETE"]


def test_multi_objective_study_with_constraints(tmp_path: Path) -> None:
    """Both targets reach the requested COMPLETE trials; constraints are stored Optuna's way;
    the Pareto set is non-dominated; quality and metrics are recorded per trial."""
    cfg = config(tmp_path)
    outcomes = run_study(cfg, progress=False)
    assert [o.complete for o in outcomes] == [8, 8]
    for target in cfg.targets:
        records, attrs = load_records(cfg.storage_url, cfg.study_name(target))
        done = complete(records)
        assert len(done) == 8
        assert len({tuple(sorted(r.params.items())) for r in done}) == 8  # no repeated points
        for r in done:
            assert r.constraints and r.metrics["tpot_ms"] > 0 and 0 < r.quality <= 1
            assert r.feasible == all(v <= 0 for v in r.constraints.values())
        study = optuna.load_study(study_name=cfg.study_name(target), storage=cfg.storage_url)
        assert all(t.constraints for t in study.trials if t.state.name == "COMPLETE")  # Trial.set_constraint
        front = pareto_front(records, ["maximize", "minimize" if target.workload == "in-game" else "maximize"])
        assert front and all(r.feasible for r in front)
        assert attrs["parent_metrics"]["tpot_ms"] > 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.1, 100), st.booleans()), min_size=1, max_size=30))
def test_pareto_front_is_non_dominated_and_complete(points: list) -> None:
    records = [TrialRecord("s", i, "COMPLETE", {}, [q, c], f, q, {}, {}, None) for i, (q, c, f) in enumerate(points)]
    front = pareto_front(records, ["maximize", "minimize"])
    feasible = [r for r in records if r.feasible]
    dominated = lambda a, b: a.values[0] >= b.values[0] and a.values[1] <= b.values[1] and a.values != b.values
    for r in front:
        assert r.feasible and not any(dominated(o, r) for o in feasible)
    for r in feasible:
        assert r in front or any(dominated(o, r) for o in front)


def test_quality_is_labelled_by_its_kind() -> None:
    """What a trial's "quality" measures is named from its quality_kind: one label, several joined,
    a plugin's unknown kind as is, "quality" when no trial has a kind (failed or old trials)."""
    from autocompress_opt.search.study.studyio import quality_label_of

    def record(kind: str | None) -> TrialRecord:
        return TrialRecord("s", 0, "COMPLETE", {}, [1.0], True, 1.0, {}, {}, None, quality_kind=kind)

    assert quality_label_of([record("exp_neg_kl"), record(None)]) == "exp(-KL to parent)"
    mixed = [record("retained_params"), record("retained_importance"), record("retained_params")]
    assert quality_label_of(mixed) == "retained params (fraction) / retained importance"
    assert quality_label_of([record("my_plugin_score")]) == "my_plugin_score"
    assert quality_label_of([record(None)]) == quality_label_of([]) == "quality"


def test_resume_continues_to_the_requested_count_and_repairs_orphans(tmp_path: Path) -> None:
    """A RUNNING trial left by a dead driver becomes FAIL and its params are re-run."""
    cfg = config(tmp_path, name="r", targets=(Target("rtx5080", "in-game"),), trials=4)
    run_study(cfg, progress=False)
    study = optuna.load_study(study_name="r.rtx5080", storage=cfg.storage_url)
    orphan = study.ask(cfg.space.distributions())  # no driver recorded: like a killed one
    run_study(replace(cfg, trials=7), progress=False)
    records, _ = load_records(cfg.storage_url, "r.rtx5080")
    assert len(complete(records)) == 7
    assert not [r for r in records if r.state == "RUNNING"]
    failed = [r for r in records if r.state == "FAIL"]
    assert [r.number for r in failed] == [orphan.number] and "orphaned" in failed[0].error
    assert any(r.params == orphan.params for r in complete(records))  # re-queued and run


def test_kill_9_mid_study_then_same_command_loses_nothing(tmp_path: Path) -> None:
    """kill -9 of the driver, then the same run: exactly N COMPLETE, no duplicates, no orphans."""
    storage = f"sqlite:///{tmp_path}/k.db"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from autocompress_opt.arch.search_space import load_search_space
        from autocompress_opt.search.study import StudyConfig, run_study
        from autocompress_opt.serving.targets import Target
        cfg = StudyConfig(name="k", model="smollm2-135m", targets=(Target("h100-sxm", "datacenter"),),
                          space=load_search_space("smollm2-135m"), trials=14, storage={storage!r},
                          mode="plan-slow", plugins=("study_plugins",), concurrency=2)
        run_study(cfg, progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, start_new_session=True)
    deadline = time.time() + 120
    n_done = 0
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
        try:
            trials = optuna.load_study(study_name="k.h100-sxm", storage=storage).trials
        except (KeyError, Exception):
            continue
        n_done = sum(t.state.name == "COMPLETE" for t in trials)
        if n_done >= 4 and any(t.state.name == "RUNNING" for t in trials):
            break
    assert proc.poll() is None, "driver finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started
    proc.wait()
    before = optuna.load_study(study_name="k.h100-sxm", storage=storage).trials
    running_before = [t for t in before if t.state.name == "RUNNING"]
    assert running_before, "expected trials in flight at the kill"
    cfg = StudyConfig(
        name="k",
        model="smollm2-135m",
        targets=(Target("h100-sxm", "datacenter"),),
        space=load_search_space("smollm2-135m"),
        trials=14,
        storage=storage,
        mode="plan-slow",
        plugins=("study_plugins",),
        concurrency=2,
    )
    run_study(cfg, progress=False)
    records, _ = load_records(storage, "k.h100-sxm")
    done = complete(records)
    assert len(done) == 14
    assert len({tuple(sorted(r.params.items())) for r in done}) == 14
    assert not [r for r in records if r.state == "RUNNING"]
    completed_before = {t.number for t in before if t.state.name == "COMPLETE"}
    assert completed_before <= {r.number for r in done}  # no finished trial lost


def test_a_raising_trial_is_recorded_and_the_study_goes_on(tmp_path: Path) -> None:
    space = replace(load_search_space("smollm2-135m"), sampler="random")
    space = type(space).from_dict({**space.to_dict(), "hidden_size": {"choices": [384, 576]}})
    cfg = config(
        tmp_path,
        name="f",
        targets=(Target("rtx5070", "in-game"),),
        mode="plan-flaky",
        space=space,
        trials=6,
        max_failures=40,
    )
    run_study(cfg, progress=False)
    records, _ = load_records(cfg.storage_url, "f.rtx5070")
    assert len(complete(records)) == 6
    failed = [r for r in records if r.state == "FAIL"]
    assert failed and all("injected failure" in r.error for r in failed)


def test_two_studies_share_a_storage_without_interfering(tmp_path: Path) -> None:
    a = config(tmp_path, name="a", targets=(Target("rtx5070", "in-game"),), trials=3)
    b = config(tmp_path, name="b", targets=(Target("rtx5070", "in-game"),), trials=3)
    run_study(b, progress=False)
    study_b = optuna.load_study(study_name="b.rtx5070", storage=b.storage_url)
    study_b.ask(b.space.distributions())  # an orphan in b
    run_study(a, progress=False)
    records_a, _ = load_records(a.storage_url, "a.rtx5070")
    records_b, _ = load_records(b.storage_url, "b.rtx5070")
    assert len(complete(records_a)) == 3 and len(records_a) == 3
    assert [r.state for r in records_b].count("RUNNING") == 1  # a's run did not touch b


def test_each_target_of_a_group_samples_its_own_points(tmp_path: Path) -> None:
    """One seed for the group, but not one stream of points: targets drew the same random start-up
    points before (and a repeated point's inner search is not shared), so they explored less."""
    cfg = config(tmp_path, trials=4, seed=3)
    run_study(cfg, progress=False)
    points = {
        t.hardware: [tuple(sorted(r.params.items())) for r in load_records(cfg.storage_url, cfg.study_name(t))[0]]
        for t in cfg.targets
    }
    assert all(len(p) == 4 for p in points.values())
    assert set(points["rtx5070"]).isdisjoint(points["b200"])
    # the seed is the target's own: stable whatever the other targets, different between targets
    a, b = Target("rtx5070", "in-game"), Target("b200", "datacenter")
    assert sampler_seed(3, a) == sampler_seed(3, Target("rtx5070", "in-game")) != sampler_seed(3, b)
    assert sampler_seed(3, a) != sampler_seed(4, a)


def test_the_first_targets_trials_run_while_the_last_target_is_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipelining: the last target's preparation (its seeds) waits until the first target has a
    COMPLETE trial, then finishes; by the recorded timestamps the first target's first trial started
    before the last target's preparation ended, and every target still reaches its trials. A driver
    that prepared every target before starting the trials would wait out the 60 s here and fail."""
    from datetime import datetime, timedelta

    from autocompress_opt.search.study import run as run_module

    targets = (Target("rtx5070", "in-game"), Target("b200", "datacenter"), Target("h100-sxm", "datacenter"))
    cfg = config(tmp_path, name="p", targets=targets, trials=3, seed_baselines=True)
    first = cfg.study_name(targets[0])
    seed_study = run_module.seed_study

    def slow_last(study, config, target, *args, **kwargs):
        if target == targets[-1]:
            waited = time.monotonic()
            while time.monotonic() - waited < 60:
                if any(r.state == "COMPLETE" for r in load_records(cfg.storage_url, first)[0]):
                    break
                time.sleep(0.2)
        return seed_study(study, config, target, *args, **kwargs)

    monkeypatch.setattr(run_module, "seed_study", slow_last)
    outcomes = run_study(cfg, progress=False)
    assert [o.complete for o in outcomes] == [3, 3, 3]
    started = min(
        t.datetime_start
        for t in optuna.load_study(study_name=first, storage=cfg.storage_url).get_trials()
        if t.datetime_start is not None
    )
    prepared = optuna.load_study(study_name=cfg.study_name(targets[-1]), storage=cfg.storage_url).user_attrs["prepared"]
    ended = datetime.fromisoformat(prepared["at"]) + timedelta(seconds=prepared["seconds"])
    assert started < ended
    assert prepared["seconds"] < 60


def test_changed_objectives_on_an_existing_study_are_an_error(tmp_path: Path) -> None:
    cfg = config(tmp_path, name="d", targets=(Target("rtx5070", "in-game"),), trials=2)
    run_study(cfg, progress=False)
    other = replace(cfg, objectives=(Objective("quality", "maximize"), Objective("peak_memory_gib", "minimize")))
    with pytest.raises(ConfigError, match="has directions|different settings"):
        run_study(other, progress=False)
    with pytest.raises(ConfigError, match="different settings.*target"):
        run_study(replace(cfg, targets=(Target("rtx5070", "in-game", dtype="fp8"),)), progress=False)


def test_cli_run_show_export_list_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The user verbs end to end: run, resume, show, export (csv/json), list and plot."""
    import json

    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/cli.db"
    run = [
        "study",
        "run",
        "--model",
        "smollm2-135m",
        "--targets",
        "rtx5070,b200",
        "--workload",
        "datacenter",
        "--mode",
        "plan",
        "--trials",
        "5",
        "--name",
        "demo",
        "--storage",
        storage,
        "--quiet",
    ]
    assert main(run) == 0
    assert "demo.b200: 5 COMPLETE trials" in capsys.readouterr().out
    assert main(run[:-3] + ["--trials", "7", "--storage", storage, "--quiet"]) == 0  # resume to 7
    assert "demo.rtx5070: 7 COMPLETE trials" in capsys.readouterr().out
    assert main(["study", "show", "demo", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert "== demo.rtx5070" in out and "== demo.b200" in out
    assert out.count("quality: retained params (fraction) (higher is better; 1.0 = the parent)") == 2
    csv_path = tmp_path / "demo.csv"
    assert main(["study", "export", "demo", "--storage", storage, "--format", "csv", "--out", str(csv_path)]) == 0
    header = csv_path.read_text().splitlines()[0].split(",")
    for column in (
        "number",
        "state",
        "feasible",
        "params",
        "num_layers",
        "hidden_size",
        "ffn_width",
        "num_kv_heads",
        "q_per_kv",
        "ttft_ms",
        "tpot_ms",
        "output_throughput_tok_s",
        "peak_memory_gib",
        "quality",
    ):
        assert column in header
    capsys.readouterr()
    assert main(["study", "export", "demo", "--storage", storage, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len([r for r in rows if r["state"] == "COMPLETE"]) == 14
    assert {r["quality_kind"] for r in rows if r["state"] == "COMPLETE"} == {"retained_params"}
    assert main(["study", "list", "--storage", storage, "--json"]) == 0
    assert {r["study"] for r in json.loads(capsys.readouterr().out)} == {"demo.rtx5070", "demo.b200"}
    assert main(["plot", "demo", "--storage", storage, "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "demo-pareto.png").stat().st_size > 10_000
    assert (tmp_path / "plots" / "demo-pareto.svg").exists()
    assert main(["study", "show", "nope", "--storage", storage]) == 2
    assert "no study named 'nope'" in capsys.readouterr().err


# ----------------------------------------------------------------------- seeding with the baselines
def test_a_seeded_study_runs_the_baselines_first_and_resuming_does_not_add_them_again(tmp_path: Path) -> None:
    """Plan mode with seed_baselines: the depth, minitron and best-uniform points (baseline_seeds, on
    the space) are the study's first trials, one per distinct point, labelled by the baseline(s) it
    comes from; a resumed run keeps the stored seeds and runs each point once."""
    target = Target("rtx5070", "in-game")
    cfg = config(tmp_path, name="s", targets=(target,), trials=5, seed_baselines=True)
    seeds = baseline_seeds(cfg, target, load_architecture(cfg.model))
    assert list(seeds) == list(SEEDED_BASELINES) == ["depth", "minitron", "best-uniform"]
    points = [seeds[name]["point"] for name in SEEDED_BASELINES]
    assert points[0] != points[1]  # depth and minitron differ on this target: two seeded trials
    distributions = cfg.space.distributions()
    assert all(distributions[k]._contains(distributions[k].to_internal_repr(v)) for p in points for k, v in p.items())
    distinct: list[dict[str, int]] = []
    labels: list[str] = []
    for name, point in zip(SEEDED_BASELINES, points):
        if point in distinct:
            labels[distinct.index(point)] += f"+{name}"
        else:
            distinct.append(point)
            labels.append(name)

    [outcome] = run_study(cfg, progress=False)
    assert [line.split(":")[0] for line in outcome.seeded] == list(SEEDED_BASELINES)
    records, attrs = load_records(cfg.storage_url, "s.rtx5070")
    first = sorted(records, key=lambda r: r.number)[: len(distinct)]
    assert [r.params for r in first] == distinct and [r.baseline for r in first] == labels
    assert all(r.state == "COMPLETE" for r in first)
    assert attrs["baseline_seeds"] == seeds

    run_study(replace(cfg, trials=7), progress=False)  # resume: seeds already in the study
    records, attrs = load_records(cfg.storage_url, "s.rtx5070")
    assert len(complete(records)) == 7 and attrs["baseline_seeds"] == seeds
    assert [sum(r.params == p for r in records) for p in distinct] == [1] * len(distinct)
    assert [r.baseline for r in records].count(None) == len(records) - len(distinct)


def test_baseline_points_are_snapped_down_onto_the_space_or_skipped_with_a_reason() -> None:
    """A space without 2 KV groups snaps minitron's kv2 down to 1 (never up: a costlier model); a
    space whose depths start above the depth pick skips it and says why."""
    target, parent = Target("h100-sxm", "datacenter"), load_architecture("smollm2-135m")
    bundled = load_search_space("smollm2-135m")  # holds 2 KV groups: minitron's point as it is
    cfg = StudyConfig(name="x", model="smollm2-135m", targets=(target,), space=bundled, trials=1)
    exact = baseline_seeds(cfg, target, parent)["minitron"]
    assert exact["point"] == exact["baseline_point"] and exact["point"]["num_kv_heads"] == 2

    space = type(bundled).from_dict({**bundled.to_dict(), "num_kv_heads": {"choices": [1, 3]}})
    cfg = replace(cfg, space=space)
    seeds = baseline_seeds(cfg, target, parent)
    minitron = seeds["minitron"]
    assert minitron["baseline_point"]["num_kv_heads"] == 2 and minitron["point"]["num_kv_heads"] == 1
    for name, value in minitron["point"].items():
        assert value in space[name].values and value <= minitron["baseline_point"][name]
    assert seeds["depth"]["point"] == seeds["depth"]["baseline_point"]  # full width, in the space

    deep_only = type(space).from_dict({**space.to_dict(), "num_layers": {"min": 28, "max": 30}})
    skipped = baseline_seeds(replace(cfg, space=deep_only), target, parent)["depth"]
    assert "num_layers=17 is below the smallest allowed 28" in skipped["skipped"]


def test_seed_baselines_defaults_on_in_weights_mode_only_and_is_validated(tmp_path: Path) -> None:
    from autocompress_opt.cli.study.config import DEFAULTS, build_config

    assert not config(tmp_path).seeds_baselines
    assert config(tmp_path, mode="weights").seeds_baselines
    assert not config(tmp_path, mode="weights", seed_baselines=False).seeds_baselines
    assert config(tmp_path, seed_baselines=True).seeds_baselines
    with pytest.raises(ConfigError, match="seed_baselines must be true, false or unset, got 'yes'"):
        config(tmp_path, seed_baselines="yes")
    flags = {**DEFAULTS, "mode": "weights", "targets": "rtx5070", "seed_baselines": False}
    assert not build_config(flags).seeds_baselines  # --no-seed-baselines / YAML seed_baselines: false


def test_seed_top_k_limits_the_candidates_each_scored_baseline_scores(tmp_path: Path) -> None:
    """seed_top_k: minitron and best-uniform score only their K largest feasible candidates (each
    scored architecture counted); the defaults score more; bad names and counts are refused by name,
    from the YAML mapping and from --seed-top-k NAME=K."""
    from autocompress_opt.cli.study.config import DEFAULTS, _seed_top_k, build_config

    target, parent = Target("h100-sxm", "datacenter"), load_architecture("smollm2-135m")
    cfg = StudyConfig(
        name="x", model="smollm2-135m", targets=(target,), space=load_search_space("smollm2-135m"), trials=1
    )
    scored: list[object] = []

    def score(arch: object) -> float:  # more parameters score lower, as the KL mostly does
        scored.append(arch)
        return -float(arch.num_params)  # type: ignore[attr-defined]

    default = baseline_seeds(cfg, target, parent, score=score)
    n_default = len(scored)
    scored.clear()
    small = baseline_seeds(replace(cfg, seed_top_k={"minitron": 2, "best-uniform": 3}), target, parent, score=score)
    assert n_default > 10 and len(scored) <= 2 + 3 + 1  # + the depth pick, which is scored once for the record
    assert small["minitron"]["point"] == default["minitron"]["point"]  # the largest candidate wins either way
    assert "of the 2 feasible candidates" in small["minitron"]["finding"]
    assert "of the 3 feasible candidates" in small["best-uniform"]["finding"]

    for bad, message in (
        ({"depth": 3}, "seed_top_k: unknown baseline 'depth'; valid: minitron, best-uniform"),
        ({"minitron": 0}, "seed_top_k: minitron must score a whole number >= 1 of candidates, got 0"),
        ({"best-uniform": True}, "best-uniform must score a whole number >= 1"),
        ([3], "seed_top_k must map baseline names to candidate counts"),
    ):
        with pytest.raises(ConfigError, match=message):
            replace(cfg, seed_top_k=bad)
    assert _seed_top_k(["minitron=3", "best-uniform=8"]) == {"minitron": 3, "best-uniform": 8}
    with pytest.raises(ConfigError, match="--seed-top-k 'minitron': expected NAME=K"):
        _seed_top_k(["minitron"])
    flags = {**DEFAULTS, "mode": "weights", "targets": "rtx5070", "seed_top_k": {"minitron": 3}}
    assert build_config(flags).seed_top_k == {"minitron": 3}  # the YAML key


def test_runners_up_seed_best_uniforms_next_best_scored_candidates(tmp_path: Path) -> None:
    """runners_up: after the three baselines, best-uniform's next-best scored candidates (lowest score
    first, none a baseline's point, each with its own uniform model for the trial to weigh); 2 by
    default in weights mode, none in plan mode, with runners_up 0 or without a scorer; validated."""
    from autocompress_opt.cli.study.config import DEFAULTS, build_config

    target, parent = Target("h100-sxm", "datacenter"), load_architecture("smollm2-135m")
    cfg = StudyConfig(
        name="x", model="smollm2-135m", targets=(target,), space=load_search_space("smollm2-135m"), trials=1,
        mode="weights",
    )  # fmt: skip
    scores: dict[int, float] = {}

    def score(arch: object) -> float:  # a middle-sized model scores best: the ranking is not by size
        n = arch.num_params  # type: ignore[attr-defined]
        return scores.setdefault(n, abs(n - 90e6) / 1e6)

    assert cfg.runner_up_seeds == 2
    seeds = baseline_seeds(cfg, target, parent, score=score)
    names = list(seeds)[3:]  # best-uniform#<its rank>: a rank whose point a baseline holds is passed over
    assert list(seeds)[:3] == list(SEEDED_BASELINES) and len(names) == 2
    assert all(n.startswith("best-uniform#") for n in names) and 2 <= int(names[0][13:]) < int(names[1][13:])
    baseline_points = [seeds[n]["point"] for n in SEEDED_BASELINES]
    runners = [seeds[n] for n in names]
    assert all(r["point"] not in baseline_points for r in runners) and runners[0]["point"] != runners[1]["point"]
    ranked = [float(r["finding"].split("(score ")[1].split(";")[0]) for r in runners]
    best = float(seeds["best-uniform"]["finding"].split("lowest score (")[1].split(")")[0])
    assert best <= ranked[0] <= ranked[1]
    for r in runners:  # the runner-up's own uniform model, with the parameters of its point
        arch = Architecture.from_dict(r["architecture"])
        assert {layer.ffn_width for layer in arch.layers if layer.ffn} == {r["point"]["ffn_width"]}
        assert sum(1 for layer in arch.layers if layer.ffn or layer.attention) == r["point"]["num_layers"]

    assert list(baseline_seeds(replace(cfg, runners_up=0), target, parent, score=score)) == list(SEEDED_BASELINES)
    more = list(baseline_seeds(replace(cfg, runners_up=5), target, parent, score=score))[3:]
    assert len(more) == 5 and more[:2] == names
    assert list(baseline_seeds(cfg, target, parent)) == list(SEEDED_BASELINES)  # ranked by parameters: none
    assert replace(cfg, mode="plan").runner_up_seeds == 0
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="runners_up must be an int >= 0"):
            replace(cfg, runners_up=bad)
    flags = {**DEFAULTS, "mode": "weights", "targets": "rtx5070", "runners_up": 0}
    assert build_config(flags).runner_up_seeds == 0  # --runners-up 0 / YAML runners_up: 0


def test_cli_seeds_shows_and_exports_the_baseline_trials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/seed.db"
    run = ["study", "run", "--targets", "rtx5070:in-game", "--trials", "3", "--name", "sd", "--storage", storage]
    assert main([*run, "--seed-baselines", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "seeded depth: {'num_layers': 17" in out and "seeded minitron:" in out
    assert main(["study", "show", "sd", "--storage", storage, "--all"]) == 0
    out = capsys.readouterr().out
    # by parameters alone (plan mode: no score) best-uniform picks the depth model: one trial, both labels
    assert "0 (depth+best-uniform)" in out and "1 (minitron)" in out
    assert main(["study", "export", "sd", "--storage", storage, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r.get("baseline") for r in sorted(rows, key=lambda r: r["number"])][:2] == [
        "depth+best-uniform",
        "minitron",
    ]


def test_a_weights_study_seeds_kl_scored_baselines_and_records_the_inner_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weights mode on a tiny saved Llama, seeding on by default: minitron is chosen by the inner
    search's held-out KL, both baselines run first, and every trial stores which inner-search
    candidate it returned with each one's KL — shown by `study show` and exported."""
    import json

    from tiny_lm import save_hf_dir, tiny_model

    from autocompress_opt.arch.search_space import default_space
    from autocompress_opt.cli import main
    from autocompress_opt.search.inner.inner_search import CANDIDATES

    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    model_dir = save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path / "llama")
    target = Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.95x", "output_throughput_tok_s": "1.05x"})
    inner = {"steps": 2, "n_samples": 4, "val_samples": 1, "seq_len": 32, "eval_samples": 2, "eval_seq_len": 32}
    cfg = config(
        tmp_path,
        name="w",
        model=str(model_dir),
        targets=(target,),
        space=default_space(load_architecture(str(model_dir))),
        mode="weights",
        inner={**inner, "importance_samples": 2, "importance_seq_len": 32},
        trials=3,
        serve_as="any",  # the tiny Llama's FFN (48) is below DeciLM's 256: vLLM's rules would allow only uniform points
    )
    [outcome] = run_study(cfg, progress=False)
    records, attrs = load_records(cfg.storage_url, "w.h100-sxm")
    seeds = attrs["baseline_seeds"]
    assert "lowest score" in seeds["minitron"]["finding"]  # scored by held-out KL, not by parameters
    points: list[dict[str, int]] = []  # the baselines' distinct points, in order
    for name in SEEDED_BASELINES:
        if "point" in seeds[name] and seeds[name]["point"] not in points:
            points.append(seeds[name]["point"])
    assert [line.split(":")[0] for line in outcome.seeded][:3] == list(SEEDED_BASELINES)  # then the proxy's
    seeded = sorted(records, key=lambda r: r.number)[: len(points)]
    assert [r.params for r in seeded] == points[:3]
    done = complete(records)
    assert len(done) == 3
    for r in done:
        # a seeded trial also weighs its baselines' own models (those that needed no snapping)
        own = {n for n in (r.baseline or "").split("+") if n and "architecture" in seeds[n]}
        assert r.selection is not None and r.selection["chosen"] in set(CANDIDATES) | own
        assert r.timings_s is not None and r.timings_s["total"] >= r.timings_s["search"] > 0  # where the time went
        # how the sampled FFN width was realised (serve_as any: any width in any layer, nothing rounded)
        assert r.ffn_budget is not None and r.ffn_budget["multiple"] == 1
        assert r.ffn_budget["channels"] == r.ffn_budget["heterogeneous_channels"] >= r.ffn_budget["kept_channels"]
        assert set(r.selection["val_kl"]) == set(CANDIDATES) | own
        heldout = r.selection.get("heldout_kl")
        if heldout:  # the baselines' models competed on the study's objective too: the trial kept the best
            assert own and heldout[r.selection["chosen"]] == min(heldout.values())
            assert r.quality == pytest.approx(math.exp(-min(heldout.values())))
        else:
            measured = [v for v in r.selection["val_kl"].values() if v is not None]
            assert r.selection["val_kl"][r.selection["chosen"]] == min(measured)
    assert any("architecture" in seeds[n] for n in SEEDED_BASELINES if "point" in seeds[n])
    assert main(["study", "show", "w", "--storage", cfg.storage_url, "--all"]) == 0
    shown = capsys.readouterr().out
    assert "inner search returned:" in shown
    assert "data: built-in prose (pydoc-topics) for the datacenter workload" in shown  # workload-matched default
    assert main(["study", "export", "w", "--storage", cfg.storage_url, "--format", "json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["state"] == "COMPLETE"]
    assert all(r["candidate"] in set(CANDIDATES) | set(SEEDED_BASELINES) and "val_kl[uniform]" in r for r in rows)
    assert all(r["seconds[total]"] >= r["seconds[quality]"] >= 0 for r in rows)
    assert all(r["ffn_channels[budget]"] >= r["ffn_channels[kept]"] for r in rows)


def test_the_120b_case_finds_architectures_that_fit_one_b200(tmp_path: Path) -> None:
    """Plan mode, dense ~123B parent, BF16, 128K context, one B200: the parent does not fit,
    the study finds feasible architectures that do."""
    from autocompress_opt.serving.targets import FITS_DEVICE

    cfg = config(
        tmp_path,
        name="big",
        model="mistral-large-2",
        space=load_search_space("mistral-large-2"),
        targets=(
            Target(
                "b200",
                "local-coding",
                engine="vllm",
                dtype="bf16",
                input_len=126976,
                output_len=4096,
                concurrency=1,
                constraints={"ttft_ms": "1x", "tpot_ms": "1x"},
            ),
        ),
        objectives=(Objective("quality", "maximize"), Objective("peak_memory_gib", "minimize")),
        trials=20,
    )
    run_study(cfg, progress=False)
    records, attrs = load_records(cfg.storage_url, "big.b200")
    assert attrs["parent_metrics"]["peak_memory_gib"] > 180  # the parent does not fit
    feasible = [r for r in records if r.feasible]
    assert feasible and all(r.metrics["peak_memory_gib"] < 180 and r.constraints[FITS_DEVICE] <= 0 for r in feasible)
