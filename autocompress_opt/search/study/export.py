"""A weights-mode trial's model, exported: its architecture cut from the parent with the very heads,
KV groups, FFN and hidden channels and layers the trial measured (the kept indices the study stores
with the trial, :meth:`~autocompress_opt.prune.plan.PrunePlan.kept`), saved as a loadable
checkpoint (:func:`~autocompress_opt.prune.export.export_model`). With those indices the export
needs no importance: the parent is only loaded (:func:`trial_model`), on any device and in any
dtype, and the export is the trial's model even where importance recomputed there would rank
channels differently (bf16 on a GPU vs fp32 on a CPU). A trial stored before trials recorded their
indices is cut with importance recomputed from the trial's settings (:func:`trial_parent`), which
matches the trial only where that importance is the trial's.

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
    from autocompress_opt.hf.loading import LoadedModel
    from autocompress_opt.prune.plan import PrunePlan
    from autocompress_opt.search.study.weights_trial import ParentContext, TrialConfig

__all__ = ["ExportedTrial", "export_trial", "trial_model", "trial_parent"]


@dataclass(frozen=True)
class ExportedTrial:
    """Where :func:`export_trial` wrote the model and the plan it was cut by (``plan.architecture``:
    the architecture as built; ``plan.layers``: which parent layer each kept layer comes from)."""

    path: Path
    plan: PrunePlan | None  # None for a MoE trial's experts (the kept record is the plan)


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


def trial_model(
    model: str, inner: Mapping[str, Any], *, workload: str | None = None
) -> tuple[LoadedModel, TrialConfig]:
    """The parent ``model`` loaded as a weights-mode trial with ``inner`` settings loads it (its
    ``device`` and ``compute_dtype``; :func:`~.weights_trial.load_parent`), and nothing else: no
    importance, no teacher targets. What :func:`export_trial` needs for a trial's stored kept
    indices. Returns the loaded parent and the trial settings (for ``workload``, as :func:`trial_parent`)."""
    from autocompress_opt.search.study.weights_trial import TrialConfig, load_parent

    config = TrialConfig.from_dict(dict(inner) or None).for_workload(workload)
    return load_parent(model, config), config


def export_trial(
    context: ParentContext | LoadedModel,
    arch: Architecture,
    out: str | Path,
    *,
    kept: Mapping[str, Any] | None = None,
    parent: Mapping[str, Any] | None = None,
    card: Mapping[str, Any] | None = None,
    force: bool = False,
    decilm: bool = False,
    mtp: str = "drop",
    parent_dir: str | Path | None = None,
) -> ExportedTrial:
    """Cut ``arch`` from ``context``'s parent and export it to ``out``: with ``kept`` (a trial's
    stored :meth:`~autocompress_opt.prune.plan.PrunePlan.kept` record), exactly those indices
    (:func:`~autocompress_opt.prune.plan.plan_from_kept`; ``context`` may be a plain loaded parent,
    :func:`trial_model`); without, by ``context``'s importance scores (the plan the inner search
    built it with: :func:`~autocompress_opt.prune.plan.plan_pruning`; ``context`` must be a
    :class:`~.weights_trial.ParentContext`, :func:`trial_parent`).

    ``parent`` and ``card`` go to :func:`~autocompress_opt.prune.export.export_model` (the card
    gains ``kept_parent_layers`` and ``kept_from``: ``"trial"``, or the ``importance`` method and
    data id it was cut by); ``force`` replaces an existing ``out``; ``decilm`` writes the DeciLM
    config vLLM loads; ``mtp`` / ``parent_dir``: the parent's multi-token-prediction layers dropped or
    kept (:func:`~autocompress_opt.prune.mtp.settle_mtp`). Deterministic: the same parent,
    architecture and indices give the same weights. Raises
    :class:`~autocompress_opt.errors.ConfigError` for ``kept`` that does not fit ``arch`` and the
    parent, or neither ``kept`` nor importance scores."""
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.prune.expert_kept import is_expert_kept
    from autocompress_opt.prune.export import export_model
    from autocompress_opt.prune.plan import plan_from_kept, plan_pruning
    from autocompress_opt.prune.slicing import materialize

    if kept is not None and is_expert_kept(kept):  # a MoE trial's experts: the family's plain model (prune.experts)
        card = {**(card or {}), "kept_from": "trial"}
        return _export_experts(
            context, arch, out, kept, force=force, parent=parent, card=card, mtp=mtp, parent_dir=parent_dir
        )
    importance = getattr(context, "importance", None)
    if kept is not None:
        plan = plan_from_kept(context.architecture, arch, kept)
        source: dict[str, Any] = {"kept_from": "trial"}
    elif importance is not None:
        plan = plan_pruning(context.architecture, importance, arch)
        source = {
            "kept_from": "importance",
            "importance": {"method": importance.meta.method, "data_id": importance.meta.data_id},
        }
    else:
        raise ConfigError(
            "export_trial needs the trial's kept indices (kept=) or a parent context with importance scores"
        )
    full_card = {**(card or {}), "kept_parent_layers": [lp.parent_index for lp in plan.layers], **source}
    path = export_model(
        materialize(context.model, plan),
        plan.architecture,
        out,
        parent=parent,
        card=full_card,
        tokenizer=context.tokenizer,
        force=force,
        decilm=decilm,
        mtp=mtp,
        parent_dir=parent_dir,
    )
    return ExportedTrial(Path(path), plan)


def _export_experts(
    context: ParentContext | LoadedModel,
    arch: Architecture,
    out: str | Path,
    kept: Mapping[str, Any],
    *,
    force: bool,
    parent: str | Mapping[str, Any] | None = None,
    card: Mapping[str, Any] | None = None,
    mtp: str = "drop",
    parent_dir: str | Path | None = None,
) -> ExportedTrial:
    """A MoE trial's kept experts and channels cut into the family's plain model
    (:func:`~autocompress_opt.prune.experts.export_experts`) with the parent's tokenizer and the JSON
    model card (:func:`~autocompress_opt.prune.export.write_card`: the JSON record and ``README.md``;
    ``card`` its extras); raises
    :class:`~autocompress_opt.errors.ConfigError` when the record's counts are not ``arch``'s."""
    from dataclasses import replace

    from autocompress_opt.errors import ConfigError
    from autocompress_opt.prune.expert_kept import kept_layers, kept_model
    from autocompress_opt.prune.experts import export_experts
    from autocompress_opt.prune.export import model_card, write_card
    from autocompress_opt.prune.mtp import check_mtp, settle_mtp

    check_mtp(mtp)

    layers = kept_layers(kept, context.architecture.num_layers)
    if layers is not None and [i for i, layer in enumerate(arch.layers) if not layer.is_noop] != layers:
        raise ConfigError(f"the kept record keeps layers {layers}; the architecture keeps others")
    model, masks = kept_model(context.model, kept)  # a trial cut in depth: the model of its kept layers
    built = next((layer.moe for layer in arch.layers if layer.moe is not None), None)
    kept_experts, k = next((m.experts, m.experts_per_token) for m in masks.layers if m.experts is not None)
    assert kept_experts is not None  # every MoE layer of a record's masks has its experts
    counts = (int(kept_experts.sum()), k)
    if built is None or (built.num_experts, built.experts_per_token) != counts:
        raise ConfigError(f"the kept record keeps {counts[0]} experts, top-{counts[1]}; the architecture does not")
    card_data = model_card(arch, parent=parent, card=card, model_type=None)  # checks card before writing
    path = export_experts(model, masks, out, force=force)
    context.tokenizer.save_pretrained(path)
    if replace(Architecture.from_hf_config(_config(path)), name="") != replace(arch.active(), name=""):
        raise ConfigError(f"the export at {str(path)!r} is not the trial's architecture")
    card_data["model_type"] = _config(path).get("model_type")
    mtp_record = settle_mtp(path, choice=mtp, parent_dir=parent_dir)  # the parent's MTP layers: whole or none
    if mtp_record is not None:
        card_data["mtp"] = mtp_record
    write_card(path, card_data)
    return ExportedTrial(Path(path), None)


def _config(path: Path) -> dict[str, Any]:
    import json

    return json.loads((path / "config.json").read_text(encoding="utf-8"))
