"""A weights trial speaks while it runs: its phases and, every few inner steps, the held-out KL and
constraint violation reach the study (Ray Tune results) and the progress display, with a step
counter that never goes back; listening changes nothing in the result."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import tiny_model, tokens
from tiny_lm import save_hf_dir
from tiny_lm import tiny_model as tiny_lm_model
from weights_helpers import INNER, TARGET, request

from autocompress_opt.arch.search_space import CHOICES, uniform_allocation
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.search.inner.budget import Budget, CostGoal
from autocompress_opt.search.inner.inner_search import InnerConfig, search
from autocompress_opt.search.inner.teacher import teacher_log_probs
from autocompress_opt.search.study import ProgressBar
from autocompress_opt.search.study.progress import (
    INFEASIBLE_PENALTY,
    PHASES,
    SCORE,
    STEP,
    TrialProgress,
    report,
    reporting,
)
from autocompress_opt.search.study.weights_trial import clear_trial_cache, run_weights_trial
from autocompress_opt.serving.targets import Target


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny saved Llama of test_weights_trial (4 layers, hidden 32)."""
    return save_hf_dir(tiny_lm_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("tiny") / "llama")


def listen(req: dict[str, Any]) -> tuple[dict[str, Any], list[TrialProgress]]:
    heard: list[TrialProgress] = []
    with reporting(heard.append):
        result = run_weights_trial(req)
    return result, heard


# ------------------------------------------------------------------------- the report itself
def test_the_score_adds_a_penalty_for_violation_so_an_infeasible_trial_ranks_below_a_feasible_one() -> None:
    feasible = TrialProgress("inner search", 4, 8, val_kl=9.0, violation=0.0)
    infeasible = TrialProgress("inner search", 4, 8, val_kl=1.0, violation=0.1)
    assert feasible.score == 9.0
    assert infeasible.score == pytest.approx(1.0 + 0.1 * INFEASIBLE_PENALTY)
    assert infeasible.score > feasible.score  # not promoted on quality alone
    assert TrialProgress("teacher").score == math.inf  # nothing measured yet


def test_a_report_round_trips_through_a_ray_result_and_describes_itself_in_one_line() -> None:
    progress = TrialProgress("inner search", 12, 24, val_kl=2.3125, violation=0.04)
    result = progress.to_result()
    assert result[STEP] == 12 and result[SCORE] == progress.score
    assert TrialProgress.from_result({**result, "training_iteration": 3}) == progress
    assert TrialProgress.from_result({"payload": "{}"}) is None  # a plan-mode result carries none
    assert progress.describe() == "inner step 12/24, val KL 2.31, violation 0.04"
    assert TrialProgress("inner search", 12, 24, 2.3125, 0.0).describe() == "inner step 12/24, val KL 2.31"
    assert TrialProgress("importance").describe() == "importance"


def test_report_outside_a_study_does_nothing_and_reporting_blocks_nest() -> None:
    report(TrialProgress("quality"))  # no listener: no error, nothing happens
    outer: list[TrialProgress] = []
    inner: list[TrialProgress] = []
    with reporting(outer.append):
        report(TrialProgress("load parent"))
        with reporting(inner.append):
            report(TrialProgress("teacher"))
        report(TrialProgress("quality"))
    assert [p.phase for p in outer] == ["load parent", "quality"] and [p.phase for p in inner] == ["teacher"]


# ------------------------------------------------------------------------- the inner search
def test_the_inner_search_reports_every_few_steps_and_its_result_does_not_depend_on_listening() -> None:
    model = tiny_model("llama")
    arch = adapter_for(model).architecture(model)
    importance = estimate_importance(model, tokens(4, 12, seed=1), model_id="tiny", progress=False)
    rows = tokens(6, 12, seed=2)
    teacher = teacher_log_probs(model, rows, parent_id="tiny")
    budget = Budget(num_layers=2, hidden_size=40, ffn_width=16, num_kv_heads=1, q_per_kv=1)
    goal = CostGoal.for_target(Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.9x"}), arch)
    config = InnerConfig(steps=7, batch_size=2, seq_len=12, n_samples=6, val_samples=2, seed=0, report_every=3)
    init = uniform_allocation({n: getattr(budget, n) for n in CHOICES}, arch, importance.layer_order())

    def run(on_step: Any = None, cfg: InnerConfig = config, target_goal: Any = goal) -> Any:
        return search(model, arch, importance, rows, teacher, budget=budget, goal=target_goal, config=cfg, init=init,
                      on_step=on_step)  # fmt: skip

    heard: list[tuple[int, Any, Any]] = []
    listened = run(lambda step, kl, violation: heard.append((step, kl, violation)))
    assert [h[0] for h in heard] == list(range(1, 8))  # every step
    measured = [h for h in heard if h[1] is not None]
    assert [h[0] for h in measured] == [3, 6]  # measured every report_every steps
    assert all(kl >= 0 and math.isfinite(kl) and violation >= 0 for _, kl, violation in measured)
    assert all(h[2] is None for h in heard if h[1] is None)
    assert (InnerConfig(steps=24).measure_every, InnerConfig(steps=3).measure_every) == (3, 1)  # an eighth
    plain = run()
    assert listened.architecture == plain.architecture and listened.history == plain.history
    # The selection reuses what the meter measured on the same rows (the start point, the uniform
    # allocation): the same KLs as measuring them again.
    assert json.dumps(listened.selection, sort_keys=True) == json.dumps(plain.selection, sort_keys=True)
    # At chosen steps (a study's ASHA rungs): the other steps report their count only, same result.
    bounded: list[tuple[int, Any, Any]] = []
    until = search(model, arch, importance, rows, teacher, budget=budget, goal=goal, config=config, init=init,
                   on_step=lambda *h: bounded.append(h), measure_at=[3, 5])  # fmt: skip
    assert [h[0] for h in bounded] == list(range(1, 8)) and [h[0] for h in bounded if h[1] is not None] == [3, 5]
    assert bounded[2] == measured[0]  # step 3: the same measurement
    assert until.architecture == plain.architecture and until.history == plain.history
    # Measured after the last step, the report is what the search returns: the selection's rule
    # over the same candidates, on the same held-out rows.
    last: list[Any] = []
    result = run(lambda step, kl, violation: last.append((kl, violation)), replace(config, report_every=7), None)
    assert result.feasible and last[-1][1] == 0.0
    assert last[-1][0] == pytest.approx(result.selection[result.selection["chosen"]]["val_kl"], abs=1e-5)
    # A listener that abandons the search (as Ray does when a scheduler stops the trial) leaves
    # the parent as it was: no mask hooks remain on the cached model.
    with torch.no_grad():
        before = model(rows[:1]).logits

    def stop(step: int, kl: float, violation: float) -> None:
        raise SystemExit(0)

    with pytest.raises(SystemExit):
        run(stop)
    with torch.no_grad():
        torch.testing.assert_close(model(rows[:1]).logits, before)


# ------------------------------------------------------------------------- the weights trial
def test_a_weights_trial_reports_its_phases_in_order_with_a_step_counter_that_never_goes_back(
    parent_dir: Path, tmp_path: Path
) -> None:
    clear_trial_cache()
    req = request(parent_dir, tmp_path, inner={**INNER, "steps": 4, "report_every": 2})
    result, heard = listen(req)
    phases = [p.phase for p in heard]
    assert phases == ["load parent", "importance", "teacher"] + ["inner search"] * 5 + ["materialise", "quality"]
    assert [PHASES.index(p) for p in phases] == sorted(PHASES.index(p) for p in phases)
    steps = [p.inner_step for p in heard]
    assert steps == [0, 0, 0, 0, 1, 2, 3, 4, 4, 4] and all(p.inner_steps == 4 for p in heard)
    measured = [p for p in heard if not p.stale and p.val_kl is not None]
    assert [p.inner_step for p in measured] == [2, 4]  # every report_every=2 steps; the others carry them
    assert all(p.val_kl >= 0 and p.violation is not None for p in measured)  # type: ignore[operator]
    assert heard[5] == measured[0] and heard[6] == replace(measured[0], inner_step=3, stale=True)
    assert heard[-1].val_kl == measured[-1].val_kl  # materialise/quality repeat the last measurement

    # A cached parent skips its three phases; the same architecture's quality comes from the cache.
    again, heard_again = listen(req)
    assert [p.phase for p in heard_again][:2] == ["inner search", "inner search"]
    assert again["architecture"] == result["architecture"]
    clear_trial_cache()
    assert run_weights_trial(req)["architecture"] == result["architecture"]  # listening changed nothing


def test_the_progress_bar_shows_what_each_running_trial_is_doing_on_one_line() -> None:
    bar = ProgressBar("demo.rtx5070", total=10, initial=2, enabled=True)  # on stderr, captured
    bar.update_running(5, TrialProgress("inner search", 12, 24, 2.31, 0.0).describe())
    bar.update_running(6, TrialProgress("teacher").describe())
    text = bar.text()
    assert text == "feasible 0, failed 0, best quality - | trial 5: inner step 12/24, val KL 2.31; trial 6: teacher"
    assert "\n" not in text
    bar.update_complete(True, 0.5, 5)
    bar.update_pruned(6)
    assert bar.text() == "feasible 1, failed 0, stopped early 1, best quality 0.500"
    assert bar.bar.n == 4  # a trial stopped early counts as evaluated
    bar.close()


@pytest.mark.slow
def test_intermediate_results_reach_the_study_through_ray_tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weights study on the tiny parent without a scheduler: the searcher hears each trial's
    phases and inner steps while it runs (the progress display is told), and every COMPLETE trial
    stores its held-out KL per inner step with increasing steps."""
    import ray

    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.arch.search_space import default_space
    from autocompress_opt.search.study import StudyConfig, init_ray, load_records, run_study

    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    model_dir = save_hf_dir(tiny_lm_model("llama", num_hidden_layers=4), tmp_path / "llama")
    shown: list[tuple[int, str]] = []
    monkeypatch.setattr(ProgressBar, "update_running", lambda self, number, what: shown.append((number, what)))
    cfg = StudyConfig(
        name="p",
        model=str(model_dir),
        targets=(TARGET,),
        space=default_space(load_architecture(str(model_dir))),
        trials=2,
        storage=f"sqlite:///{tmp_path}/p.db",
        mode="weights",
        inner={**INNER, "steps": 4, "report_every": 2},
        concurrency=1,
        seed_baselines=False,
        # any shape: under vLLM's rules the tiny parent (FFN 48, below the DeciLM multiple 256) loads only
        # uniform models, whose trials do not train and so report no inner steps
        serve_as="any",
    )
    assert cfg.scheduler_name == "none"
    try:
        init_ray(None, 1)
        [outcome] = run_study(cfg, progress=False)
    finally:
        ray.shutdown()
    assert outcome.complete == 2 and outcome.stopped == 0
    records, _ = load_records(cfg.storage_url, "p.h100-sxm")
    for r in records:
        assert r.state == "COMPLETE" and r.intermediate is not None
        assert [row[0] for row in r.intermediate] == [2, 4]
        assert all(row[1] is not None and row[1] >= 0 for row in r.intermediate)
        said = [what for number, what in shown if number == r.number]
        assert said[:3] == ["load parent", "importance", "teacher"] or said[0] == "inner step 0/4"
        assert any(what.startswith("inner step 4/4, val KL") for what in said)
        assert said[-1] == "quality" or said[-1].startswith("inner step 4/4")  # unless its quality was cached
