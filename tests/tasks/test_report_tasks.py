"""Report tasks (autocompress_opt.tasks.report): items clean of calibration and selection text, cut
into a dev block and disjoint report blocks, a screen that drops tasks every model leaves at chance,
floor or ceiling, and a paired bootstrap over items within blocks and over blocks."""

from __future__ import annotations

import numpy as np
import pytest

from autocompress_opt.data import overlap
from autocompress_opt.data.textdata import data_split, text_sources
from autocompress_opt.errors import ConfigError
from autocompress_opt.tasks.builders import build_task, task_available
from autocompress_opt.tasks.report import CEILING, FLOOR_MARGIN, blocked_bootstrap, report_tasks, screen

NONE = overlap.NgramIndex([])  # an index that holds nothing: every item is clean


def _need(name: str) -> None:
    ok, hint = task_available(name)
    if not ok:
        pytest.skip(f"{name}: {hint}")


def _ids(spec) -> list[str]:
    return [item.id for item in spec.items]


def test_blocks_are_the_builders_items_in_order_disjoint_and_of_the_asked_sizes() -> None:
    _need("bible-next")
    [task] = report_tasks(["bible-next"], blocks=3, block_items=40, dev_items=10, index=NONE).values()
    assert [len(b.items) for b in task.blocks] == [10, 40, 40, 40]
    every = [i for b in task.blocks for i in _ids(b)]
    assert len(set(every)) == len(every) == 130  # no item in two blocks
    assert every == _ids(build_task("bible-next", n_items=130, seed=0))  # the builder's seeded order
    assert task.n_contaminated == 0 and not task.short
    again = report_tasks(["bible-next"], blocks=3, block_items=40, dev_items=10, index=NONE)["bible-next"]
    assert [_ids(b) for b in again.blocks] == [_ids(b) for b in task.blocks]  # deterministic
    assert all(b.metric == task.metric == "acc_norm" and b.chance == 0.25 for b in task.blocks)


def test_an_item_sharing_calibration_text_is_dropped_counted_and_replaced() -> None:
    _need("bible-next")
    built = build_task("bible-next", n_items=30, seed=0).items
    leaked = built[5]
    assert len(overlap.words(leaked.context)) >= overlap.NGRAM_TOKENS
    index = overlap.NgramIndex([overlap.DocumentWords.of("preamble. " + leaked.context + " and more").grams])
    task = report_tasks(["bible-next"], blocks=2, block_items=10, dev_items=10, index=index)["bible-next"]
    ids = [i for b in task.blocks for i in _ids(b)]
    assert leaked.id not in ids and len(ids) == 30  # the next clean item takes its place
    assert task.n_contaminated >= 1 and task.to_dict()["n_contaminated"] == task.n_contaminated


def test_a_source_with_too_few_items_cuts_every_block_in_proportion() -> None:
    _need("humaneval-mutants")
    task = report_tasks(["humaneval-mutants"], blocks=2, block_items=1000, dev_items=200, index=NONE)[
        "humaneval-mutants"
    ]
    sizes = [len(b.items) for b in task.blocks]
    assert task.short and sum(sizes) <= task.n_built < 1000
    assert sizes[1] == sizes[2] > sizes[0] > 0  # report blocks equal, the dev block in proportion
    every = [i for b in task.blocks for i in _ids(b)]
    assert len(set(every)) == len(every)


@pytest.mark.slow
def test_no_report_task_item_shares_an_ngram_with_calibration_or_selection_text() -> None:
    """The real installed tasks and the default split: no item of the report blocks shares 13 words
    with the calibration or selection documents, checked with an index built here from the
    documents themselves. docs-agreement reads the Python documentation, which the pydoc topics
    quote: its leaked items are the ones dropped."""
    names = [n for n in ("wordnet-define", "bible-next", "docs-agreement", "humaneval-mutants") if task_available(n)[0]]
    if not names:
        pytest.skip("no task source installed: make data")
    sources = text_sources()
    split = data_split()
    docs = [*split.calibration, *split.selection]
    held = overlap.NgramIndex(
        [overlap.DocumentWords.of(sources[n].read(k)).grams for n, k in (d.split(":", 1) for d in docs)]
    )
    tasks = report_tasks(names, blocks=2, block_items=300, dev_items=50)
    for name, task in tasks.items():
        leaked = [
            item.id
            for block in task.blocks
            for item in block.items
            if held.shares(item.context + item.choices[item.gold]) or any(held.shares(c) for c in item.choices)
        ]
        assert not leaked, f"{name}: {len(leaked)} items share text with calibration or selection"
    if "docs-agreement" in tasks:
        assert tasks["docs-agreement"].n_contaminated > 0


def test_the_screen_drops_tasks_every_model_leaves_at_chance_floor_or_ceiling() -> None:
    _need("bible-next")
    _need("bible-cloze")
    tasks = report_tasks(["bible-next", "bible-cloze"], blocks=1, block_items=5, dev_items=5, index=NONE)
    near = 0.25 + FLOOR_MARGIN / 2
    assert screen({"bible-next": {"a": near, "b": 0.2}}, tasks) == {"bible-next": "at chance"}
    assert screen({"bible-next": {"a": near, "b": 0.26 + FLOOR_MARGIN}}, tasks) == {"bible-next": None}
    assert screen({"bible-next": {"a": CEILING, "b": 1.0}}, tasks) == {"bible-next": "at ceiling"}
    assert screen({"bible-next": {"a": CEILING - 0.01, "b": 1.0}}, tasks) == {"bible-next": None}
    assert screen({"bible-cloze": {"a": 0.0, "b": 0.02}}, tasks) == {"bible-cloze": "at floor"}
    with pytest.raises(ConfigError, match="no model"):
        screen({"bible-next": {}}, tasks)


def test_blocked_bootstrap_is_zero_for_equal_models_and_resolves_a_real_lead() -> None:
    rng = np.random.default_rng(0)
    base = [{"t1": rng.random(400) < 0.4, "t2": rng.random(300) < 0.5} for _ in range(2)]
    same = blocked_bootstrap(base, base, n_boot=500)
    assert same["mean"] == 0 and same["ci95"] == [0.0, 0.0] and same["p"] == 1.0
    # B answers right wherever A does, plus 10 % more items: A − B is −10 points on each task
    better = [{t: v | (rng.random(len(v)) < 0.1) for t, v in blk.items()} for blk in base]
    exact = -100 * np.mean([np.mean(b[t] ^ a[t]) for a, b in zip(base, better) for t in a])
    diff = blocked_bootstrap(base, better, n_boot=2000)
    assert diff["mean"] == pytest.approx(exact)
    assert diff["ci95"][0] < diff["mean"] < diff["ci95"][1] < 0 and diff["p"] < 0.01
    with pytest.raises(ConfigError, match="different items"):
        blocked_bootstrap([{"t1": [1, 0]}], [{"t1": [1, 0, 1]}])
    with pytest.raises(ConfigError, match="same non-zero number of blocks"):
        blocked_bootstrap(base, base[:1])


def test_bad_counts_are_refused_before_anything_is_built() -> None:
    for kwargs in ({"blocks": 0}, {"blocks": 2, "block_items": 0}, {"blocks": 2, "dev_items": -1}):
        with pytest.raises(ConfigError):
            report_tasks(["bible-next"], index=NONE, **kwargs)
