"""Early stopping by Ray Tune's ASHA: the option and its default, and trials stopped on their
intermediate results stored PRUNED with their last values, never on the Pareto front, counted
toward the study's trials and kept through a kill -9 and resume."""

from __future__ import annotations

import datetime
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from progress_plugins import fake_kl
from tiny_lm import save_hf_dir, tiny_model
from weights_helpers import INNER, TARGET

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import default_space, load_search_space
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.study import (
    Objective,
    StudyConfig,
    TrialRecord,
    init_ray,
    load_records,
    make_scheduler,
    run_study,
)
from autocompress_opt.search.study.progress import FALLBACK, INFEASIBLE_PENALTY, SCORE, STEP
from autocompress_opt.search.study.schedulers import rung_steps
from autocompress_opt.search.study.studyio import export_rows, load_group
from autocompress_opt.serving.targets import Target

TESTS = Path(__file__).parent


def config(tmp_path: Path, **changes: Any) -> StudyConfig:
    """A plugin-mode study whose trials report fake inner-search progress (progress_plugins)."""
    base: dict[str, Any] = dict(
        name="a",
        model="smollm2-135m",
        targets=(Target("h100-sxm", "datacenter"),),
        space=load_search_space("smollm2-135m"),
        trials=6,
        storage=f"sqlite:///{tmp_path}/a.db",
        mode="plan-reporting",
        plugins=("progress_plugins",),
        concurrency=1,
        inner={"steps": 8},
        scheduler="asha",
    )
    return StudyConfig(**{**base, **changes})


@pytest.fixture
def local_ray():
    """A local Ray with the test plugins importable in its workers, shut down afterwards."""
    import ray

    init_ray(None, 1, ("progress_plugins",))
    yield
    ray.shutdown()


def stopped(records: list[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.state == "PRUNED" and r.stopped_early]


# ----------------------------------------------------------------------------- the option
def test_asha_is_the_default_for_weights_studies_of_more_than_four_trials_only(tmp_path: Path) -> None:
    weights = dict(mode="weights", plugins=(), inner={}, scheduler=None)
    assert config(tmp_path, trials=5, **weights).scheduler_name == "asha"
    assert config(tmp_path, trials=4, **weights).scheduler_name == "none"
    assert config(tmp_path, trials=40, **{**weights, "scheduler": "none"}).scheduler_name == "none"
    assert config(tmp_path, trials=40, mode="plan", plugins=(), inner={}, scheduler=None).scheduler_name == "none"
    with pytest.raises(ConfigError, match="scheduler must be one of asha, none, got 'bogus'"):
        config(tmp_path, scheduler="bogus")
    with pytest.raises(ConfigError, match="plan-mode trials do not report"):
        config(tmp_path, mode="plan", plugins=(), inner={}, scheduler="asha")


def test_asha_decides_at_an_eighth_and_three_eighths_of_the_inner_search_on_the_constraint_aware_score(
    tmp_path: Path,
) -> None:
    assert make_scheduler(config(tmp_path, scheduler="none")) is None
    scheduler = make_scheduler(config(tmp_path, inner={"steps": 24}), targets=2)
    assert len(scheduler.parts) == 2 and scheduler.parts[0] is not scheduler.parts[1]
    for asha in scheduler.parts:
        assert (asha.metric, asha._mode, asha._time_attr) == (SCORE, "min", STEP)
        assert sorted(milestone for milestone, _ in asha._brackets[0]._rungs) == [3, 9]  # never past half way
        assert asha._reduction_factor == 3  # the best third goes on


@pytest.mark.parametrize("steps", [1, 3, 8, 24, 48, 100])
def test_the_trials_measure_at_the_scheduler_s_rungs_only(tmp_path: Path, steps: int) -> None:
    """``rung_steps`` are the milestones Ray's ASHA holds a trial at, the only steps whose measured
    KL it reads (``measure_at``); without a scheduler the trials measure at the same steps."""
    study = config(tmp_path, inner={"steps": steps})
    asha = make_scheduler(study).parts[0]
    assert rung_steps(study) == sorted(milestone for milestone, _ in asha._brackets[0]._rungs)
    unscheduled = config(tmp_path, scheduler="none", inner={"steps": steps}, mode="weights", plugins=())
    assert rung_steps(unscheduled) == rung_steps(study)  # weights trials measure there without a scheduler too
    assert rung_steps(config(tmp_path, scheduler="none")) is None  # a plugin's trials: nobody reads them
    every = config(tmp_path, scheduler="none", inner={"steps": steps, "report_every": 2}, mode="weights", plugins=())
    assert rung_steps(every) is None  # the user's report_every rules


def test_each_target_s_trials_meet_only_their_own_target_s_trials_at_a_rung(tmp_path: Path) -> None:
    """A group run shares one scheduler: at a rung a trial is compared with its own target's trials
    (config target_index), whose constraints it shares, never with another target's."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    scheduler = make_scheduler(config(tmp_path, inner={"steps": 8}), targets=2)
    trials = {
        name: SimpleNamespace(trial_id=name, config={"target_index": index})
        for name, index in (("good", 0), ("bad", 0), ("other", 1))
    }
    for trial in trials.values():
        scheduler.on_trial_add(None, trial)

    def at_rung(name: str, score: float) -> str:
        return scheduler.on_trial_result(None, trials[name], {STEP: 2, SCORE: score})

    assert at_rung("good", 1.0) == TrialScheduler.CONTINUE
    assert at_rung("bad", 5.0) == TrialScheduler.STOP  # worse than target 0's median at the rung
    assert at_rung("other", 5.0) == TrialScheduler.CONTINUE  # target 1's rung is its own: first there


def test_a_seeded_baseline_sets_the_bar_at_a_rung_and_is_stopped_only_after_its_fallback(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    scheduler = make_scheduler(config(tmp_path, inner={"steps": 8}), targets=1)
    seed_good = SimpleNamespace(trial_id="s1", config={"target_index": 0, "stoppable": False})
    seed_bad = SimpleNamespace(trial_id="s2", config={"target_index": 0, "stoppable": False})
    sampled = SimpleNamespace(trial_id="t", config={"target_index": 0, "stoppable": True})
    for trial in (seed_good, seed_bad, sampled):
        scheduler.on_trial_add(None, trial)
    assert scheduler.on_trial_result(None, seed_good, {STEP: 1, SCORE: 1.0}) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, seed_bad, {STEP: 1, SCORE: 9.0}) == TrialScheduler.CONTINUE  # kept
    # the seeds' scores are in the rung: 4.0 is not in the best third of (1.0, 9.0)
    assert scheduler.on_trial_result(None, sampled, {STEP: 1, SCORE: 4.0}) == TrialScheduler.STOP

    # A seed that has reported its fallback (its baseline's model, measured) may be stopped.
    covered = SimpleNamespace(trial_id="s3", config={"target_index": 0, "stoppable": False})
    scheduler.on_trial_add(None, covered)
    fallback = {STEP: 0, SCORE: math.inf, FALLBACK: "{}"}
    assert scheduler.on_trial_result(None, covered, fallback) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, covered, {STEP: 1, SCORE: 9.0}) == TrialScheduler.STOP


def test_a_bad_scheduler_is_a_one_line_error_and_nothing_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli import main

    storage = f"sqlite:///{tmp_path}/z.db"
    args = ["study", "run", "--targets", "rtx5070", "--trials", "2", "--storage", storage, "--quiet"]
    assert main([*args, "--scheduler", "bogus"]) == 2
    assert capsys.readouterr().err == "autocompress study: error: scheduler must be one of asha, none, got 'bogus'\n"
    (tmp_path / "s.yaml").write_text("scheduler: ASHA\n")
    assert main([*args, "--config", str(tmp_path / "s.yaml")]) == 2
    assert "got 'ASHA'" in capsys.readouterr().err
    assert main([*args, "--scheduler", "asha"]) == 2  # plan mode (the default) reports nothing to stop on
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use --scheduler none or --mode weights" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


# ----------------------------------------------------------------------------- stopping trials
@pytest.mark.slow
def test_asha_stops_the_worse_trials_which_are_stored_pruned_with_their_last_values(
    tmp_path: Path, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli import main

    cfg = config(tmp_path)
    [outcome] = run_study(cfg, progress=False)
    records, _ = load_records(cfg.storage_url, "a.h100-sxm")
    early = stopped(records)
    complete = [r for r in records if r.state == "COMPLETE"]
    assert early and outcome.stopped == len(early) and outcome.complete == len(complete)
    assert len(complete) + len(early) == cfg.trials  # a trial stopped early counts as evaluated
    for r in early:
        last = r.stopped_early
        assert r.values is None and r.quality is None and not r.feasible
        assert 0 < last[STEP] < 8 and last["phase"] == "inner search"
        steps = [row[0] for row in r.intermediate or []]
        assert steps == sorted(set(steps)) and steps[-1] == last[STEP]  # every value it reported, in order
        assert r.intermediate[-1][1] == pytest.approx(last["val_kl"])  # type: ignore[index]
        assert last["val_kl"] == pytest.approx(fake_kl(r.params) + 1 / last[STEP])
        # It scored worse, at that step, than another trial that reached it.
        assert any(
            row[0] == last[STEP] and row[1] + INFEASIBLE_PENALTY * row[2] < last[SCORE]
            for other in records
            if other is not r
            for row in other.intermediate or []
        )
    assert all(r.intermediate and [row[0] for row in r.intermediate] == list(range(1, 9)) for r in complete)
    [view] = load_group("a", cfg.storage_url)
    front = view.pareto()
    assert front and not {r.number for r in front} & {r.number for r in early}
    best = view.best_feasible()
    assert best is not None and best.state == "COMPLETE"

    assert main(["study", "show", "a", "--storage", cfg.storage_url]) == 0
    assert f"{len(early)} stopped early (PRUNED)" in capsys.readouterr().out
    assert main(["study", "show", "a", "--storage", cfg.storage_url, "--all"]) == 0
    shown = capsys.readouterr().out
    assert all(f"stopped {r.stopped_early['inner_step']}/8" in shown for r in early)  # type: ignore[index]
    rows = {row["number"]: row for view in load_group("a", cfg.storage_url) for row in export_rows(view)}
    for r in early:
        assert rows[r.number]["stopped_at_step"] == r.stopped_early["inner_step"]  # type: ignore[index]
        assert rows[r.number]["stopped_val_kl"] == r.stopped_early["val_kl"]  # type: ignore[index]
    # The same command again: the study already holds its trials; nothing runs, nothing changes.
    [again] = run_study(cfg, progress=False)
    assert (again.complete, again.stopped) == (outcome.complete, outcome.stopped)
    assert len(load_records(cfg.storage_url, "a.h100-sxm")[0]) == len(records)


@pytest.mark.slow
def test_the_seeded_baselines_without_a_fallback_are_never_stopped_early(tmp_path: Path, local_ray: None) -> None:
    """The study promises the baselines' results (seed_study): a seeded trial that reports no
    fallback (here a trial mode without one) runs to the end."""
    cfg = config(tmp_path, seed_baselines=True, trials=7)
    [outcome] = run_study(cfg, progress=False)
    records, _ = load_records(cfg.storage_url, "a.h100-sxm")
    seeded = [r for r in records if r.baseline]
    assert len(outcome.seeded) == 3  # depth, minitron, best-uniform (best-uniform may share a point)
    assert len(seeded) >= 2 and stopped(records)
    assert sorted(n for r in seeded for n in r.baseline.split("+")) == sorted(["depth", "minitron", "best-uniform"])
    assert all(r.state == "COMPLETE" and [row[0] for row in r.intermediate or []] == list(range(1, 9)) for r in seeded)


@pytest.mark.slow
def test_a_stopped_seeded_trial_is_recorded_complete_as_its_baseline_s_fallback(
    tmp_path: Path, local_ray: None
) -> None:
    """A seeded trial that reports its fallback first (as weights trials do) may be stopped at a
    rung like any other; the study then records the fallback, COMPLETE, with the step it stopped at."""
    cfg = config(tmp_path, seed_baselines=True, trials=7, mode="plan-fallback")
    [outcome] = run_study(cfg, progress=False)
    records, attrs = load_records(cfg.storage_url, "a.h100-sxm")
    seeded = [r for r in records if r.baseline]
    assert len(seeded) >= 2 and all(r.state == "COMPLETE" for r in seeded)
    cut = [r for r in seeded if r.selection and r.selection["stopped_at_step"] is not None]  # the others ran on
    # the fake search goes badly at minitron's point (after depth's): the first rung stops it
    assert [r.baseline for r in cut] == ["minitron"] and cut[0].selection["stopped_at_step"] == 1  # type: ignore[index]
    assert cut[0].params == attrs["baseline_seeds"]["minitron"]["point"] and cut[0].quality is not None
    assert cut[0].metrics and cut[0].architecture  # a full result: on the front if it earns it
    assert len(cut[0].intermediate or []) == 1 and outcome.complete == len(
        [r for r in records if r.state == "COMPLETE"]
    )
    [view] = load_group("a", cfg.storage_url)
    [row] = [row for row in export_rows(view) if row["number"] == cut[0].number]
    assert row["search_stopped_at_step"] == 1 and row["candidate"] == "minitron" and row["state"] == "COMPLETE"


@pytest.mark.slow
def test_a_single_objective_study_keeps_the_stopped_trials_values_as_optuna_intermediate_values(
    tmp_path: Path, local_ray: None
) -> None:
    cfg = config(tmp_path, objectives=(Objective("quality", "maximize"),), trials=7)
    run_study(cfg, progress=False)
    study = optuna.load_study(study_name="a.h100-sxm", storage=cfg.storage_url)
    early = [t for t in study.trials if t.state.name == "PRUNED" and "stopped_early" in t.user_attrs]
    assert early
    for t in early:
        last = t.user_attrs["stopped_early"]
        assert max(t.intermediate_values) == last[STEP]
        assert t.intermediate_values[last[STEP]] == pytest.approx(math.exp(-last[SCORE]))


@pytest.mark.slow
def test_a_tiny_weights_study_with_asha_stops_trials_and_keeps_them_off_the_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real weights trials (the tiny parent of test_weights_trial): ASHA, on by default with more
    than 4 trials, stops some of them on their held-out KL and violation; they are PRUNED."""
    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    model_dir = save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path / "llama")
    cfg = StudyConfig(
        name="w",
        model=str(model_dir),
        targets=(TARGET,),
        space=default_space(load_architecture(str(model_dir))),
        trials=6,
        storage=f"sqlite:///{tmp_path}/w.db",
        mode="weights",
        inner={**INNER, "steps": 8, "report_every": 1},
        concurrency=1,
        seed_baselines=False,
        serve_as="any",  # under vLLM's rules the tiny parent loads only uniform models, which do not train
    )
    assert cfg.scheduler_name == "asha"
    [outcome] = run_study(cfg, progress=False)
    records, _ = load_records(cfg.storage_url, "w.h100-sxm")
    early = stopped(records)
    assert early and outcome.complete + outcome.stopped == 6
    assert all(r.stopped_early["violation"] is not None and r.stopped_early["val_kl"] >= 0 for r in early)  # type: ignore[index]
    [view] = load_group("w", cfg.storage_url)
    assert not {r.number for r in view.pareto()} & {r.number for r in early}
    assert all(r.selection is None for r in early)  # never selected, materialised or measured


@pytest.mark.slow
def test_kill_9_mid_study_with_asha_then_the_same_command_loses_nothing(tmp_path: Path) -> None:
    """kill -9 of a driver whose study has trials stopped early: the rerun keeps them PRUNED (they
    are finished, not orphans), repairs the running ones and ends with exactly the requested trials.
    Once a trial has been stopped early the test creates a hold file; a trial that starts after it
    holds (progress_plugins' plan-reporting-held), so the kill finds it running. Watching for any
    running trial raced: ASHA could stop the one seen at its next rung before the kill landed."""
    cfg = config(tmp_path, trials=10, inner={"steps": 24}, mode="plan-reporting-held")
    hold = tmp_path / "hold"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from autocompress_opt.arch.search_space import load_search_space
        from autocompress_opt.search.study import StudyConfig, run_study
        from autocompress_opt.serving.targets import Target
        cfg = StudyConfig(name="a", model="smollm2-135m", targets=(Target("h100-sxm", "datacenter"),),
                          space=load_search_space("smollm2-135m"), trials=10, storage={cfg.storage_url!r},
                          mode="plan-reporting-held", plugins=("progress_plugins",), concurrency=1,
                          inner={{"steps": 24}}, scheduler="asha")
        run_study(cfg, progress=False)
    """)
    env = {**os.environ, "ACO_TEST_HOLD": str(hold)}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, start_new_session=True, env=env)
    deadline = time.time() + 120
    held_since = None
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        try:
            trials = optuna.load_study(study_name="a.h100-sxm", storage=cfg.storage_url).trials
        except Exception:
            continue
        if held_since is None:
            if any(t.state.name == "PRUNED" and "stopped_early" in t.user_attrs for t in trials):
                hold.touch()
                held_since = datetime.datetime.now()  # optuna stores naive local start times
        elif any(t.state.name == "RUNNING" and t.datetime_start > held_since for t in trials):
            break
    assert proc.poll() is None, "driver finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    hold.unlink()
    before = optuna.load_study(study_name="a.h100-sxm", storage=cfg.storage_url).trials
    assert any(t.state.name == "RUNNING" for t in before)
    import ray

    try:
        init_ray(None, 1, ("progress_plugins",))
        [outcome] = run_study(replace(cfg), progress=False)
    finally:
        ray.shutdown()
    records, _ = load_records(cfg.storage_url, "a.h100-sxm")
    assert outcome.complete + outcome.stopped == 10 and not [r for r in records if r.state == "RUNNING"]
    finished_before = {t.number: t.state.name for t in before if t.state.name in ("COMPLETE", "PRUNED")}
    assert {r.number: r.state for r in records if r.number in finished_before} == finished_before
    done = [r for r in records if r.state == "COMPLETE" or r.stopped_early]
    assert len({tuple(sorted(r.params.items())) for r in done}) == 10  # no point evaluated twice
