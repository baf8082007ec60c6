"""Task items for a report that compares models: clean of calibration text, fresh per evaluation, screened.

A comparison of two pruned models by accuracy needs items that can resolve a few points, that no
search step read, and that are not reused across the report's evaluations. :func:`report_tasks`
builds them:

- **Clean.** An item whose text (its context followed by its right answer, and each choice alone)
  shares :data:`~autocompress_opt.data.overlap.NGRAM_TOKENS` consecutive words with the calibration
  or selection text (:func:`~autocompress_opt.data.textdata.held_text_index`, the check test rows
  pass) is dropped and counted (``n_contaminated``).
- **Blocks.** The clean items, in the builder's seeded order, are cut into a *dev* block
  (``dev_items``, block 0) and ``blocks`` disjoint *report* blocks of ``block_items`` each. One
  report evaluates a model once per block (e.g. block ``1 + i`` for its ``i``-th recovery seed);
  the models compared on one block see the same items (paired), no item is scored in two blocks.
  A source with fewer clean items than that cuts every block in proportion (``short``).
- **Screen.** :func:`screen` drops a task no compared model moves off its floor or ceiling, judged
  on the dev block only, so the items that decide which tasks count are not the items that decide
  who wins: a task where every model scores within :data:`FLOOR_MARGIN` of chance (of zero for a
  greedy cloze) is *at chance* / *at floor*, one where every model scores :data:`CEILING` or more
  is *at ceiling*.

:func:`blocked_bootstrap` gives the paired difference of two models' mean accuracy over the kept
tasks, resampling items within each block and the blocks themselves, with its two-sided p-value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.errors import ConfigError, check_int
from autocompress_opt.tasks.items import TaskSpec

__all__ = [
    "CEILING",
    "FLOOR_MARGIN",
    "ReportTask",
    "blocked_bootstrap",
    "report_tasks",
    "screen",
]

FLOOR_MARGIN = 0.05  # every model within 5 points of chance: the task cannot tell them apart
CEILING = 0.95  # every model at 95 % or above: no room left to differ
_GROWTH = 1.5  # how much more of the source is built when contamination leaves too few items


@dataclass(frozen=True)
class ReportTask:
    """One task's clean items cut into blocks (module doc).

    Attributes:
        blocks: block 0 the dev block, then the report blocks; each a :class:`TaskSpec` with the
            task's metric, chance and source.
        n_built: items the builder gave (before the contamination check).
        n_contaminated: of those, items dropped for sharing an n-gram with calibration or selection text.
        short: the source held fewer clean items than the blocks asked for (every block was cut).
    """

    name: str
    metric: str
    chance: float
    blocks: tuple[TaskSpec, ...]
    n_built: int
    n_contaminated: int
    short: bool

    def to_dict(self) -> dict[str, Any]:
        """The record of where the items came from (the items themselves are rebuilt from it)."""
        return {
            "metric": self.metric,
            "chance": self.chance,
            "block_sizes": [len(b.items) for b in self.blocks],
            "n_built": self.n_built,
            "n_contaminated": self.n_contaminated,
            "short": self.short,
            "source": dict(self.blocks[0].source),
        }


def _contaminated(item: Any, index: Any) -> bool:
    gold = item.context + item.choices[item.gold]
    return index.shares(gold) or any(index.shares(c) for c in item.choices)


def report_tasks(
    names: Sequence[str],
    *,
    blocks: int,
    block_items: int = 1000,
    dev_items: int = 200,
    seed: int = 0,
    data_dir: str | Path | None = None,
    index: Any = None,
) -> dict[str, ReportTask]:
    """Each named task's clean items cut into a dev block and ``blocks`` report blocks (module doc).

    ``index`` is the n-gram index items are checked against (default: the calibration and
    selection text of the default sources). Deterministic in the installed data and the arguments.
    Raises :class:`ConfigError` for bad counts and :class:`~autocompress_opt.tasks.sources.MissingSourceError`
    for a task whose data is not installed, before anything is scored."""
    from autocompress_opt.tasks.builders import build_task

    check_int(blocks, "blocks")
    check_int(block_items, "block_items")
    check_int(dev_items, "dev_items")
    if index is None:
        from autocompress_opt.data.textdata import held_text_index

        index = held_text_index()
    out = {}
    for name in names:
        wanted = dev_items + blocks * block_items
        ask = wanted
        while True:
            spec = build_task(name, n_items=ask, seed=seed, data_dir=data_dir)
            clean = [item for item in spec.items if not _contaminated(item, index)]
            if len(clean) >= wanted or len(spec.items) < ask:  # enough, or the source has no more
                break
            ask = int(ask * _GROWTH) + 1
        n_contaminated = len(spec.items) - len(clean)
        if not clean:
            raise ConfigError(f"task {name!r}: every one of its {len(spec.items)} items shares text with calibration")
        short = len(clean) < wanted
        dev = dev_items if not short else max(1, len(clean) * dev_items // wanted)
        size = block_items if not short else (len(clean) - dev) // blocks
        if size < 1:
            raise ConfigError(f"task {name!r}: {len(clean)} clean items cannot fill {blocks} report blocks")
        cuts = [clean[:dev], *(clean[dev + b * size : dev + (b + 1) * size] for b in range(blocks))]
        specs = tuple(
            TaskSpec(spec.name, spec.metric, tuple(items), dict(spec.source), spec.chance, spec.seed) for items in cuts
        )
        out[name] = ReportTask(name, spec.metric, spec.chance, specs, len(spec.items), n_contaminated, short)
    return out


def screen(dev_scores: Mapping[str, Mapping[str, float]], tasks: Mapping[str, ReportTask]) -> dict[str, str | None]:
    """Per task, why it is dropped (``"at chance"``, ``"at floor"``, ``"at ceiling"``) or None when it
    counts. ``dev_scores[task][model]`` is each compared model's score on the task's dev block; a task
    is dropped only when *every* model sits at its floor, or every model at its ceiling."""
    out: dict[str, str | None] = {}
    for name, by_model in dev_scores.items():
        if not by_model:
            raise ConfigError(f"task {name!r}: no model's dev score to screen it by")
        chance = tasks[name].chance
        if all(s - chance < FLOOR_MARGIN for s in by_model.values()):
            out[name] = "at floor" if chance == 0 else "at chance"
        elif all(s >= CEILING for s in by_model.values()):
            out[name] = "at ceiling"
        else:
            out[name] = None
    return out


def blocked_bootstrap(
    a_blocks: Sequence[Mapping[str, Sequence[float]]],
    b_blocks: Sequence[Mapping[str, Sequence[float]]],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Model A minus model B in points (×100) of the mean accuracy over tasks (each task weighted
    equally), with its percentile interval and two-sided p-value.

    ``a_blocks[i]`` and ``b_blocks[i]`` hold per-task correctness on report block ``i`` (the same
    items for both: paired); blocks may hold different items and differ in length. Each replicate
    resamples the blocks (both models together) and, within each block and task, the items. The
    p-value is ``2 · min(P*(d ≤ 0), P*(d ≥ 0))`` with the add-one correction, at most 1."""
    if not a_blocks or len(a_blocks) != len(b_blocks):
        raise ConfigError(
            f"need the same non-zero number of blocks for both models, got {len(a_blocks)} and {len(b_blocks)}"
        )
    tasks = sorted(a_blocks[0])
    if not tasks or any(sorted(blk) != tasks for blk in [*a_blocks, *b_blocks]):
        raise ConfigError("every block of both models needs the same non-empty set of tasks")
    from autocompress_opt.tasks.scoring import check_bootstrap, two_sided_p

    check_bootstrap(confidence, n_boot)
    rng = np.random.default_rng(seed)
    per_block = np.zeros((n_boot, len(a_blocks)))  # each replicate's difference on each block
    observed = []
    for i, (a, b) in enumerate(zip(a_blocks, b_blocks)):
        block_obs = 0.0
        for task in tasks:
            x, y = np.asarray(a[task], dtype=float), np.asarray(b[task], dtype=float)
            if x.ndim != 1 or not len(x) or x.shape != y.shape:
                raise ConfigError(f"block {i}, task {task!r}: the models were scored on different items")
            diff = x - y
            block_obs += diff.mean()
            per_block[:, i] += diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1)
        observed.append(block_obs)
    picks = rng.integers(0, len(a_blocks), size=(n_boot, len(a_blocks)))
    scale = 100.0 / len(tasks)
    replicates = np.take_along_axis(per_block, picks, axis=1).mean(axis=1) * scale
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(replicates, [tail, 1 - tail])
    return {"mean": float(np.mean(observed) * scale), "ci95": [float(lo), float(hi)], "p": two_sided_p(replicates)}
