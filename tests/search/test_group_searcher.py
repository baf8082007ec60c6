"""GroupSearcher hands each free slot to the target it has started the fewest trials of, so a target
admitted late (its preparation finished after the first targets' trials began) catches up."""

from __future__ import annotations

from typing import Any

from autocompress_opt.search.study.searcher import GroupSearcher


class _Endless:
    """A target's searcher that always has a point to suggest."""

    def __init__(self, name: str) -> None:
        self.name = name

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return {"target": self.name}

    def on_trial_complete(self, trial_id: str, result: Any = None, error: bool = False) -> None:
        pass


def _served(group: GroupSearcher, slots: int, start: int = 0) -> list[int]:
    out = []
    for k in range(start, start + slots):
        suggestion = group.suggest(f"t{k}")
        assert isinstance(suggestion, dict)
        out.append(suggestion["target_index"])
    return out


def test_a_late_target_gets_the_slots_until_it_has_as_many_trials_as_the_others() -> None:
    group = GroupSearcher([_Endless("a"), None, None])  # b and c are still being prepared
    assert _served(group, 6) == [0] * 6  # only a is admitted: it takes every slot
    group.admit(1, _Endless("b"))  # type: ignore[arg-type]
    assert _served(group, 4, start=6) == [1, 1, 1, 1]  # b catches up: 4 of a's 6 ...
    group.admit(2, _Endless("c"))  # type: ignore[arg-type]
    served = _served(group, 12, start=10)
    assert served[:4] == [2] * 4  # c first reaches b's 4 ...
    assert sorted(served[4:8]) == [1, 1, 2, 2]  # ... then b and c reach a's 6 together ...
    assert max(group.started) - min(group.started) <= 1  # ... and all take turns
    assert sum(group.started) == 22


def test_equal_targets_take_turns() -> None:
    group = GroupSearcher([_Endless("a"), _Endless("b"), _Endless("c")])
    assert _served(group, 7) == [0, 1, 2, 0, 1, 2, 0]
