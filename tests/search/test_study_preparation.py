"""The driver's preparation of a study group's targets: in which order they are prepared, how each is
admitted at its own position, and what the driver says it is choosing (no Ray, no model)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import load_search_space
from autocompress_opt.search.study import SEEDED_BASELINES, StudyConfig
from autocompress_opt.search.study.run import _choosing, _Preparation, preparation_order
from autocompress_opt.search.study.seeding import SeedScoring, seeded_baselines
from autocompress_opt.serving.targets import Target

# make demo's group (studies/smollm2-weights.yaml): three targets read prose, local-coding reads code
DEMO = (
    Target("rtx5070", "in-game"),
    Target("rtx5080", "local-coding"),
    Target("h100-sxm", "datacenter"),
    Target("b200", "datacenter"),
)


def _config(mode: str = "weights", targets: tuple[Target, ...] = DEMO, **changes: Any) -> StudyConfig:
    space = load_search_space("smollm2-135m")
    return StudyConfig(name="p", model="smollm2-135m", targets=targets, space=space, mode=mode, trials=2, **changes)


def test_the_targets_that_share_the_first_targets_data_are_prepared_first() -> None:
    """Weights mode: the prose targets (0, 2, 3) before the code target (1); config order within a data
    setting. Plan mode reads no data: config order."""
    scoring = SeedScoring(_config())
    keys = [scoring.data_key(t) for t in DEMO]
    assert keys[0] == keys[2] == keys[3] != keys[1]
    assert preparation_order(keys) == [0, 2, 3, 1]
    plan = SeedScoring(_config("plan"))
    assert preparation_order([plan.data_key(t) for t in DEMO]) == [0, 1, 2, 3]
    assert preparation_order(["a", "b", "a", "c", "b"]) == [0, 2, 1, 4, 3]
    assert preparation_order([]) == []


def test_a_user_data_setting_makes_every_target_share_one_key() -> None:
    """With the user's --data every workload reads the same text: nothing to reorder."""
    scoring = SeedScoring(_config(inner={"data": ["docs.txt"]}))
    assert len({scoring.data_key(t) for t in DEMO}) == 1


class _Group:
    """What a preparation admits to (a GroupSearcher's admit/abandon), recorded."""

    def __init__(self) -> None:
        self.admitted: list[tuple[int, Any]] = []
        self.abandoned = 0

    def admit(self, index: int, searcher: Any) -> None:
        self.admitted.append((index, searcher))

    def abandon(self, close: bool = False) -> None:
        self.abandoned += 1


def test_the_preparation_runs_in_its_order_and_admits_each_target_at_its_position() -> None:
    runs = [SimpleNamespace(name=f"t{i}", searcher=None) for i in range(4)]
    prepared: list[str] = []

    def prepare(run: Any) -> None:
        prepared.append(run.name)
        run.searcher = f"searcher of {run.name}"

    group, finished = _Group(), threading.Event()
    preparation = _Preparation(runs, [0, 2, 3, 1], prepare, group, finished.set, None)  # type: ignore[arg-type]
    preparation.start()
    preparation.join(30)
    assert prepared == ["t0", "t2", "t3", "t1"]
    assert group.admitted == [
        (0, "searcher of t0"),
        (2, "searcher of t2"),
        (3, "searcher of t3"),
        (1, "searcher of t1"),
    ]
    assert finished.is_set() and preparation.error is None
    with pytest.raises(ValueError, match=r"each of the 4 targets once, got \[0, 2, 2, 1\]"):
        _Preparation(runs, [0, 2, 2, 1], prepare, group, finished.set, None)  # type: ignore[arg-type]


def test_the_start_message_names_the_baselines_really_chosen() -> None:
    """A dense parent's study chooses the three baselines; a MoE parent's weights study depth and
    minitron (its expert seeds skip best-uniform), its plan-mode study none (the uniform baselines
    prune dense parents), and the driver says so."""
    dense, moe = load_architecture("smollm2-135m"), load_architecture("qwen3-30b-a3b")
    assert seeded_baselines(_config(), dense) == SEEDED_BASELINES
    assert seeded_baselines(_config("plan"), dense) == SEEDED_BASELINES
    assert seeded_baselines(_config("plan"), moe) == ()
    assert seeded_baselines(_config(), moe) == ("depth", "minitron")
    assert _choosing(SEEDED_BASELINES) == "choosing the depth, minitron, best-uniform baselines to seed the study"
    assert _choosing(("minitron",)) == "choosing the minitron baseline to seed the study"


def test_no_target_is_prepared_once_ctrl_c_came() -> None:
    """Ctrl-C seen (the driver's loop still stopping its trials): the preparation starts no target;
    the group asks for no trial, and ends the run once none is in flight, even before any target was
    admitted; a target prepared meanwhile and admitted after the group stopped asks for no trial."""
    from autocompress_opt.search.study.searcher import GroupSearcher
    from autocompress_opt.search.study.signals import InterruptState

    runs = [SimpleNamespace(name="t0", searcher=None)]
    prepared: list[str] = []
    group, finished = _Group(), threading.Event()
    stopped = InterruptState(interrupted=True)
    preparation = _Preparation(runs, [0], lambda run: prepared.append(run.name), group, finished.set, None, stopped)  # type: ignore[arg-type]
    preparation.start()
    preparation.join(30)
    assert prepared == [] and group.admitted == [] and finished.is_set()

    late = SimpleNamespace(stopping=False, stop=lambda: setattr(late, "stopping", True))
    searcher = GroupSearcher([None])
    searcher.stop()
    assert searcher.suggest("trial") == "FINISHED"  # nothing in flight: Ray Tune's loop ends at once
    searcher.admit(0, late)  # type: ignore[arg-type]
    assert late.stopping
