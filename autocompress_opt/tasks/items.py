"""The data every offline task produces and every evaluator consumes.

A task is a tuple of :class:`Item` built deterministically from installed data; an evaluator scores
items the way lm-evaluation-harness does (zero-shot, by log-likelihood):

- ``multiple_choice``: the model scores each continuation ``choices[i]`` after ``context``;
  ``acc`` picks the choice with the largest summed log-likelihood (nats), ``acc_norm`` the largest
  log-likelihood divided by the choice's length in UTF-8 bytes.
- ``cloze``: one continuation ``choices[0]``; the item is correct when greedy decoding after
  ``context`` reproduces every token of it (lm-eval's ``is_greedy``).

Continuations carry their own leading space (``" word"``), as in lm-eval, so the context never
ends in whitespace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ITEM_KINDS", "METRICS", "PERPLEXITY_TASK", "Item", "TaskSpec"]

ITEM_KINDS = ("multiple_choice", "cloze")
METRICS = ("acc", "acc_norm", "greedy")
# The suite's eighth entry has no items: held-out perplexity, scored by autocompress_opt.quality.metrics.
PERPLEXITY_TASK = "heldout-perplexity"

ItemKind = Literal["multiple_choice", "cloze"]


@dataclass(frozen=True)
class Item:
    """One scored question. ``gold`` indexes ``choices``; a cloze item has one choice and gold 0."""

    task: str
    id: str
    context: str
    choices: tuple[str, ...]
    gold: int
    kind: ItemKind = "multiple_choice"

    def __post_init__(self) -> None:
        if self.kind not in ITEM_KINDS:
            raise ValueError(f"item {self.id!r}: kind {self.kind!r} is not one of {ITEM_KINDS}")
        if not self.choices:
            raise ValueError(f"item {self.id!r}: no choices")
        if self.kind == "cloze" and len(self.choices) != 1:
            raise ValueError(f"item {self.id!r}: a cloze item has exactly one continuation, got {len(self.choices)}")
        if not 0 <= self.gold < len(self.choices):
            raise ValueError(f"item {self.id!r}: gold {self.gold} is outside 0..{len(self.choices) - 1}")
        if len(set(self.choices)) != len(self.choices):
            raise ValueError(f"item {self.id!r}: duplicate choices {self.choices!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "id": self.id,
            "context": self.context,
            "choices": list(self.choices),
            "gold": self.gold,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Item:
        return cls(
            task=data["task"],
            id=data["id"],
            context=data["context"],
            choices=tuple(data["choices"]),
            gold=int(data["gold"]),
            kind=data.get("kind", "multiple_choice"),
        )


@dataclass(frozen=True)
class TaskSpec:
    """A built task: its items, the metric it is reported with, and where the items came from.

    ``source`` names the installed data (package, version, file) and ``chance`` is the expected
    score of uniform guessing under ``metric`` (0 for cloze), so a report can show the margin.
    """

    name: str
    metric: str
    items: tuple[Item, ...]
    source: dict[str, Any] = field(default_factory=dict)
    chance: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"task {self.name!r}: metric {self.metric!r} is not one of {METRICS}")
