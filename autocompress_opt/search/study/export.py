"""A weights-mode trial's model, exported: its architecture cut from the parent with the importance
scores the trial used (the same calibration data and settings, from the same trial caches), saved
as a loadable checkpoint (:func:`~autocompress_opt.prune.export.export_model`).

``autocompress prune --from-study`` and ``benchmarks/bench_head_to_head.py`` both export with
:func:`export_trial`. Loads torch when called, not when imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.search.study.placement import DEFAULT_CACHE_DIR

if TYPE_CHECKING:
    from autocompress_opt.prune.plan import PrunePlan
    from autocompress_opt.search.study.weights_trial import ParentContext, TrialConfig

__all__ = ["ExportedTrial", "export_trial", "trial_parent"]


@dataclass(frozen=True)
class ExportedTrial:
    """Where :func:`export_trial` wrote the model and the plan it was cut by (``plan.architecture``:
    the architecture as built; ``plan.layers``: which parent layer each kept layer comes from)."""

    path: Path
    plan: PrunePlan


def trial_parent(
    model: str, inner: Mapping[str, Any], *, cache_dir: str | Path = DEFAULT_CACHE_DIR, workload: str | None = None
) -> tuple[ParentContext, TrialConfig]:
    """The parent ``model`` as a weights-mode trial with ``inner`` settings (a study's
    :attr:`~autocompress_opt.search.study.config.StudyConfig.inner`) had it: loaded, with its
    importance scores and calibration data from the trial caches under ``cache_dir`` (built there
    when missing). ``workload``: the study target's, which picks the built-in text when the study
    gave no data (:meth:`TrialConfig.for_workload`), as it did for the trials.
    Returns the context and the trial settings it was built with."""
    from autocompress_opt.search.study.weights_trial import TrialConfig, parent_context

    config = TrialConfig.from_dict(dict(inner) or None).for_workload(workload)
    context, _ = parent_context(model, config, Path(cache_dir).resolve())
    return context, config


def export_trial(
    context: ParentContext,
    arch: Architecture,
    out: str | Path,
    *,
    parent: Mapping[str, Any] | None = None,
    card: Mapping[str, Any] | None = None,
    force: bool = False,
    decilm: bool = False,
) -> ExportedTrial:
    """Cut ``arch`` from ``context``'s parent with its importance scores (the plan the inner search
    built it with: :func:`~autocompress_opt.prune.plan.plan_pruning`) and export it to ``out``.

    ``parent`` and ``card`` go to :func:`~autocompress_opt.prune.export.export_model` (the card
    gains ``kept_parent_layers`` and the ``importance`` method and data id); ``force`` replaces an
    existing ``out``; ``decilm`` writes the DeciLM config vLLM loads. Deterministic: the same
    context and architecture give the same weights."""
    from autocompress_opt.prune.export import export_model
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize

    plan = plan_pruning(context.architecture, context.importance, arch)
    full_card = {
        **(card or {}),
        "kept_parent_layers": [lp.parent_index for lp in plan.layers],
        "importance": {"method": context.importance.meta.method, "data_id": context.importance.meta.data_id},
    }
    path = export_model(
        materialize(context.model, plan),
        plan.architecture,
        out,
        parent=parent,
        card=full_card,
        tokenizer=context.tokenizer,
        force=force,
        decilm=decilm,
    )
    return ExportedTrial(Path(path), plan)
