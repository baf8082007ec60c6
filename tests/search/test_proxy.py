"""The plan-mode proxy of weights studies: ranking the space per target, screening the sampler's
points, the group searcher that runs every target in one Ray Tune run, and the time budget."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import CHOICES, load_search_space
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.study import StudyConfig, enqueue_proxy_points
from autocompress_opt.search.study.proxy import PROXY_ATTR, Proxy, maximal
from autocompress_opt.search.study.searcher import GroupSearcher, StudySearcher
from autocompress_opt.serving.targets import Target, parent_metrics

PARENT = load_architecture("smollm2-135m")
SPACE = load_search_space("smollm2-135m")


def proxy(hardware: str, workload: str, serve_as: str = "vllm") -> Proxy:
    target = Target(hardware, workload)
    return Proxy(PARENT, SPACE, target, parent_metrics(PARENT, target), serve_as=serve_as)


def test_maximal_keeps_the_points_nothing_else_covers() -> None:
    points = [(2, 2), (1, 3), (2, 1), (1, 1), (2, 2), (0, 3)]
    assert sorted(maximal(points)) == [(1, 3), (2, 2)]
    assert maximal([]) == []


@pytest.mark.slow
def test_the_ranking_gives_feasible_maximal_distinct_points_best_first_and_differs_per_gpu() -> None:
    ranked = {hw: proxy(hw, wl).rank(4) for hw, wl in (("rtx5070", "in-game"), ("b200", "datacenter"))}
    for hw, points in ranked.items():
        assert len(points) == 4
        keys = [tuple(s.point[c] for c in CHOICES) for s in points]
        assert len(set(keys)) == 4 and sorted(maximal(keys)) == sorted(keys)  # none covers another
        qualities = [s.quality for s in points]
        assert qualities == sorted(qualities, reverse=True) and all(0 < q <= 1 for q in qualities)
        for score in points:  # each one feasible, as an independent check says
            again = proxy(hw, "in-game" if hw == "rtx5070" else "datacenter").check(score.point)
            assert again.feasible and all(v <= 0 for v in again.violations.values())
    assert ranked["rtx5070"][0].point != ranked["b200"][0].point  # a different answer per GPU
    assert proxy("rtx5070", "in-game").rank(0) == []


def test_the_estimate_can_rank_the_proxys_points_and_a_bad_choice_is_refused() -> None:
    """proxy_quality estimate: the same feasible maximal points, ordered by exp(-KL) of the per-axis
    estimate (quality.estimate), which the ranking's qualities then are."""
    from autocompress_opt.quality.estimate import load_estimate
    from autocompress_opt.search.study.seeding import make_proxy

    target = Target("h100-sxm", "datacenter")
    by_estimate = Proxy(PARENT, SPACE, target, parent_metrics(PARENT, target), serve_as="vllm", quality="estimate")
    ranked = by_estimate.rank(4)
    estimate = load_estimate()
    for s in ranked:
        arch = SPACE.architecture(s.point, PARENT)
        assert s.quality == pytest.approx(estimate.quality(arch, PARENT))
    assert [s.quality for s in ranked] == sorted((s.quality for s in ranked), reverse=True)
    config = StudyConfig(
        name="x", model="smollm2-135m", targets=(target,), space=SPACE, trials=1, mode="weights",
        proxy_quality="estimate",
    )  # fmt: skip
    made = make_proxy(config, target, PARENT, parent_metrics(PARENT, target), None, lambda: (None, None))
    assert made.quality == "estimate"
    with pytest.raises(
        ConfigError,
        match=r"proxy_quality must be one of importance, estimate \(what ranks the proxy's points\), got 'kl'",
    ):
        StudyConfig(name="x", model="smollm2-135m", targets=(target,), space=SPACE, trials=1, proxy_quality="kl")


def test_check_flags_the_parent_sized_point_infeasible_under_a_tight_target() -> None:
    score = proxy("rtx5070", "in-game").check(
        {"num_layers": 30, "hidden_size": 576, "ffn_width": 1536, "num_kv_heads": 3, "q_per_kv": 3}
    )
    assert not score.feasible and any(v > 0 for v in score.violations.values())


def test_a_sampled_space_is_scored_on_a_seeded_sample() -> None:
    p = proxy("h100-sxm", "datacenter")
    assert [s.point for s in p.rank(3, seed=1, limit=500)] == [s.point for s in p.rank(3, seed=1, limit=500)]


def test_check_many_agrees_with_the_cost_model_point_by_point() -> None:
    """The batched cost model (padded to the deepest point) gives each point the violations that
    estimate_cost on that point alone gives; points no engine-legal model exists for say why."""
    import random

    from autocompress_opt.search.study.trials import uniform_model
    from autocompress_opt.serving.costmodel import estimate_cost

    rng = random.Random(3)
    points = [{c: rng.choice(SPACE[c].values) for c in CHOICES} for _ in range(60)]
    target = Target("rtx5080", "local-coding")
    for serve_as in ("vllm", "llamacpp"):
        p = proxy("rtx5080", "local-coding", serve_as)
        scores = p.check_many(points)
        assert len(scores) == len(points)
        for params, score in zip(points, scores):
            legal, arch = uniform_model(params, SPACE, PARENT, serve_as)
            metrics = estimate_cost(arch, target.hardware, target.engine_obj(), target.scenario()).to_dict()
            expected = target.violations(metrics, parent_metrics(PARENT, target))
            assert score.point == legal and score.violations.keys() == expected.keys()
            assert all(abs(score.violations[k] - v) <= 1e-9 * max(1.0, abs(v)) for k, v in expected.items())
            assert score.feasible == all(v <= 0 for v in expected.values())
        assert any(s.feasible for s in scores) and not all(s.feasible for s in scores)


# --------------------------------------------------------------------------- in a study
class _Coordination:
    def __init__(self) -> None:
        self.driver = {"pid": 1}
        self.interval = 60.0

    def lock(self) -> Any:
        from contextlib import nullcontext

        return nullcontext()

    def beat(self, trial: Any) -> None: ...

    def done(self, trial: Any) -> None: ...

    def repair(self, keep: set[int]) -> list[int]:
        return []


class _Bar:
    def update_running(self, number: int, what: str) -> None: ...

    def update_complete(self, feasible: bool, quality: float, number: int | None = None) -> None: ...

    def update_pruned(self, number: int) -> None: ...

    def update_fail(self, number: int | None = None) -> None: ...


def searcher(study: Any, target: Target, screen: Proxy | None, deadline: float | None = None) -> StudySearcher:
    return StudySearcher(
        study,
        distributions=SPACE.distributions(),
        request={"mode": "weights"},
        target=target,
        parent_cost=parent_metrics(PARENT, target),
        objectives=["quality"],
        trials=5,
        max_failures=5,
        progress=_Bar(),
        coordination=_Coordination(),
        proxy=screen,
        deadline=deadline,
    )


def test_the_proxy_keeps_infeasible_sampled_points_from_running() -> None:
    """rtx5070 in-game is tight: random points are mostly infeasible. Every point handed to Ray is
    feasible by the proxy; the others are PRUNED with proxy_infeasible and do not count as trials."""
    target = Target("rtx5070", "in-game")
    study = optuna.create_study(directions=["maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    screen = proxy("rtx5070", "in-game")
    s = searcher(study, target, screen)
    handed = [s.suggest(f"t{i}") for i in range(3)]
    assert all(isinstance(h, dict) for h in handed)
    for h in handed:
        assert screen.check(h["request"]["params"]).feasible
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and s.screened == len(pruned)
    assert all(t.user_attrs[PROXY_ATTR] and max(t.user_attrs[PROXY_ATTR].values()) > 0 for t in pruned)
    running = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(running) == 3  # screened points are not trials in flight or evaluated

    unscreened = searcher(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)), target, None)
    assert isinstance(unscreened.suggest("u"), dict) and unscreened.screened == 0


def test_no_trial_starts_after_the_deadline() -> None:
    target = Target("h100-sxm", "datacenter")
    late = searcher(optuna.create_study(), target, None, deadline=time.monotonic() - 1)
    assert late.suggest("t0") == "FINISHED"


def test_the_proxy_points_are_enqueued_once_and_a_resumed_study_reads_them_back(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/p.db", study_name="p")
    lines = enqueue_proxy_points(study, proxy("rtx5080", "local-coding", "llamacpp"), 3)
    assert len(lines) == 3 and lines[0].startswith("proxy #1: {")
    stored = study.user_attrs["proxy_points"]
    assert len(stored) == 3 and len(study.trials) == 3
    assert [t.user_attrs["proxy_rank"] for t in study.trials] == [1, 2, 3]

    class Unused:
        def rank(self, *args: Any, **kwargs: Any) -> list[Any]:
            raise AssertionError("a resumed study must not rank again")

    assert enqueue_proxy_points(study, Unused(), 3) == lines
    assert len(study.trials) == 3  # skip_if_exists: not enqueued twice


def test_the_proxy_option_is_checked(tmp_path: Path) -> None:
    base = dict(name="x", model="smollm2-135m", targets=(Target("b200", "datacenter"),), space=SPACE, trials=8)
    assert StudyConfig(**base, mode="weights").proxy_points == 4
    assert StudyConfig(**base).proxy_points == 0  # plan mode: trials are the proxy
    assert StudyConfig(**base, mode="weights", proxy=0).proxy_points == 0
    with pytest.raises(ConfigError, match=r"proxy must be an int >= 0 .*got -2"):
        StudyConfig(**base, mode="weights", proxy=-2)
    with pytest.raises(ConfigError, match="Use --proxy 0 or --mode weights"):
        StudyConfig(**base, proxy=2)
    with pytest.raises(ConfigError, match="time_budget must be a number of minutes > 0, got -1"):
        StudyConfig(**base, time_budget=-1)


# ------------------------------------------------------------------------ the group searcher
class _Fake:
    """A target's searcher: hands out its points, then FINISHED once nothing of it is in flight."""

    def __init__(self, name: str, points: int) -> None:
        self.name, self.left, self.live = name, points, 0
        self.results: list[str] = []
        self.done: list[str] = []
        self.stopped = False

    def suggest(self, trial_id: str) -> Any:
        if self.left == 0:
            return "FINISHED" if not self.live else None
        self.left -= 1
        self.live += 1
        return {"request": self.name}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.results.append(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.live -= 1
        self.done.append(trial_id)

    def stop(self) -> None:
        self.stopped = True

    def release(self, reason: str) -> list[int]:
        return [len(self.name)]


def test_the_group_searcher_takes_the_targets_in_turn_and_routes_each_trial_back() -> None:
    a, b = _Fake("a", 3), _Fake("bb", 1)
    group = GroupSearcher([a, b])
    got = [group.suggest(f"t{i}") for i in range(4)]
    assert [g["request"] for g in got] == ["a", "bb", "a", "a"]
    assert [g["target_index"] for g in got] == [0, 1, 0, 0]
    assert group.suggest("t4") is None  # trials in flight: not finished yet
    group.on_trial_result("t1", {"x": 1})
    for i in range(4):
        group.on_trial_complete(f"t{i}")
    assert (a.done, b.done, b.results) == (["t0", "t2", "t3"], ["t1"], ["t1"])
    assert group.suggest("t5") == "FINISHED"
    group.stop()
    assert a.stopped and b.stopped and group.release("why") == [1, 2]


def test_a_group_position_left_empty_is_skipped_until_admitted_and_abandon_ends_the_run() -> None:
    """Pipelining: a target still being prepared (None) gets no trial and does not finish the group;
    once admitted it is asked in turn; abandon() gives up the empty positions, and close=True starts
    no new trial while those in flight are still routed back."""
    a, b = _Fake("a", 2), _Fake("bb", 1)
    group = GroupSearcher([a, None])
    assert group.suggest("t0")["request"] == "a"
    group.admit(1, b)
    with pytest.raises(ValueError, match="already admitted"):
        group.admit(1, b)
    assert [group.suggest(f"t{i}")["request"] for i in (1, 2)] == ["bb", "a"]
    for i in range(3):
        group.on_trial_complete(f"t{i}")
    assert group.suggest("t3") == "FINISHED"

    c = _Fake("c", 5)
    waiting = GroupSearcher([c, None])
    assert waiting.suggest("u0")["target_index"] == 0
    began = time.monotonic()
    waiting.abandon()
    assert waiting.suggest("u1")["request"] == "c"  # the admitted target goes on
    assert time.monotonic() - began < 0.2  # abandon() woke no sleeping suggest; none slept here
    waiting.abandon(close=True)
    assert waiting.suggest("u2") is None  # trials in flight: not finished yet, but no new one
    waiting.on_trial_complete("u0")
    waiting.on_trial_complete("u1")
    assert c.done == ["u0", "u1"] and waiting.suggest("u3") == "FINISHED"

    idle = GroupSearcher([None])  # nothing admitted, nothing in flight: suggest() waits, not spins
    began = time.monotonic()
    assert idle.suggest("v0") is None
    assert time.monotonic() - began >= 0.3
    idle.abandon()
    assert idle.suggest("v1") == "FINISHED"


def test_a_per_target_scheduler_routes_trials_without_an_index_to_the_first_target(tmp_path: Path) -> None:
    from autocompress_opt.search.study import per_target_scheduler

    seen: list[tuple[str, str]] = []

    class Part:
        def __init__(self, name: str) -> None:
            self.name = name

        def on_trial_add(self, controller: Any, trial: Any) -> None:
            seen.append((self.name, trial.trial_id))

    scheduler = per_target_scheduler([Part("first"), Part("second")])
    scheduler.on_trial_add(None, SimpleNamespace(trial_id="x", config={}))
    scheduler.on_trial_add(None, SimpleNamespace(trial_id="y", config={"target_index": 1}))
    assert seen == [("first", "x"), ("second", "y")]
