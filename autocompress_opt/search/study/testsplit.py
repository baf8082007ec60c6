"""A weights-mode trial's model scored on the **test** split, on demand, cached: what ``autocompress
study show --test`` prints for the Pareto points, and what the card of ``prune --from-study`` reports.

Trials never read the test split (:mod:`autocompress_opt.data.textdata`): their quality is measured
on selection rows, which also chose them, so it is biased towards the points a study kept. Scoring
the few points of a Pareto front on test rows, after the study, gives numbers that chose nothing,
without making every trial pay for them.

The model is rebuilt as the trial built it: the parent, importance scores and data settings of the
trial (:func:`~autocompress_opt.search.study.export.trial_parent`), its architecture cut by
:func:`~autocompress_opt.prune.plan.plan_pruning`, then scored by
:func:`~autocompress_opt.quality.metrics.evaluate` on the test rows (the trial's ``eval_samples``
rows of ``eval_seq_len`` tokens per domain, seed ``eval_seed``). Loads torch when called, not when imported.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.cache import cache_key, fetch
from autocompress_opt.search.study.placement import DEFAULT_CACHE_DIR

__all__ = ["TEST_QUALITY_VERSION", "trial_test_quality"]

# The version of the computation below, part of every cache key: bump it when its numbers change.
TEST_QUALITY_VERSION = "test-quality/2"


def trial_test_quality(
    model: str,
    inner: Mapping[str, Any],
    arch: Architecture,
    *,
    workload: str | None = None,
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    kept: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    """The test-split quality of ``arch`` cut from ``model`` as a weights trial with ``inner`` settings
    (a study's) for ``workload``'s target built it, and whether it came from the cache.

    Returns :meth:`~autocompress_opt.quality.metrics.QualityReport.to_dict` (KL to the parent and
    perplexity per domain, the rows' record) plus ``split="test"``, ``kl_objective``: the KL on the
    domains of the trial's own objective (:func:`~autocompress_opt.search.study.weights_trial.objective_domains`:
    the workload's built-in text, or the user's data; the mean where there are two), and
    ``quality = exp(-kl_objective)``, the test counterpart of the study's quality column.
    ``kept``: the trial's stored kept indices (:meth:`~autocompress_opt.prune.plan.PrunePlan.kept`),
    cut exactly as ``prune --from-study`` cuts them; without, the architecture is cut by importance.
    Cached on disk under ``cache_dir/test-quality`` by the parent's weights, the importance data,
    the architecture, the kept indices and the test rows; deterministic, so the cached value is the
    computed one.
    """
    from autocompress_opt.prune.plan import plan_from_kept, plan_pruning
    from autocompress_opt.prune.slicing import materialize
    from autocompress_opt.quality.metrics import evaluate
    from autocompress_opt.search.study.export import trial_parent
    from autocompress_opt.search.study.weights_trial import objective_domains

    cache = Path(cache_dir)
    context, config = trial_parent(model, inner, cache_dir=cache, workload=workload)
    rows = {"n_samples": config.eval_samples, "seq_len": config.eval_seq_len, "seed": config.eval_seed}
    imp = context.importance.meta
    key = cache_key(
        TEST_QUALITY_VERSION,
        context.parent_id,
        imp.data_id,
        imp.method,
        {**arch.to_dict(), "name": ""},
        rows,
        list(config.data),
        dict(kept) if kept else None,
    )

    def compute() -> dict[str, Any]:
        plan = (
            plan_from_kept(context.architecture, arch, kept)
            if kept
            else plan_pruning(context.architecture, context.importance, arch)
        )
        child = materialize(context.model, plan)
        report = evaluate(
            child, context.tokenizer, parent=context.model, data=config.data or None, progress=False, **rows
        ).to_dict()
        domains = objective_domains(config)
        kl = sum(report[f"kl_{dom}"] for dom in domains) / len(domains)
        return {"split": "test", **report, "objective_domains": list(domains), "kl_objective": kl}

    record, cached = fetch(
        cache / "test-quality" / f"{key}.json",
        compute,
        lambda value, tmp: tmp.write_text(json.dumps(value, indent=2), encoding="utf-8"),
        lambda path: json.loads(path.read_text(encoding="utf-8")),
    )
    return {**record, "quality": math.exp(-record["kl_objective"])}, cached
