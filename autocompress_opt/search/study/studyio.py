"""Reading finished studies back: groups of per-target studies, Pareto tables, export rows.

A trial's ``quality`` means what its ``quality_kind`` says
(:data:`~autocompress_opt.search.study.trials.QUALITY_LABELS`);
:func:`quality_label_of` names the quality of a set of trials for tables and plots.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.search.study.records import TrialRecord, pareto_front
from autocompress_opt.search.study.storage import default_storage, group_members, load_records, make_storage
from autocompress_opt.search.study.trials import quality_label

__all__ = ["StudyView", "export_rows", "list_studies", "load_group", "quality_label_of", "rows_to_csv"]


def quality_label_of(records: Iterable[TrialRecord]) -> str:
    """What the ``quality`` of these trials measures, e.g. ``"exp(-KL to parent)"``: the labels of
    their kinds in first-seen order, joined by ``" / "`` when they differ (trials without a kind,
    e.g. failed ones, are skipped); ``"quality"`` when no trial has a kind."""
    labels: list[str] = []
    for r in records:
        if r.quality_kind and quality_label(r.quality_kind) not in labels:
            labels.append(quality_label(r.quality_kind))
    return " / ".join(labels) or "quality"


@dataclass(frozen=True)
class StudyView:
    """One target's study as read from storage."""

    name: str
    records: list[TrialRecord]
    attrs: dict[str, Any]

    @property
    def target(self) -> dict[str, Any]:
        return self.attrs.get("identity", {}).get("target", {})

    @property
    def label(self) -> str:
        t = self.target
        return f"{t.get('hardware', self.name)} / {t.get('workload', '?')}"

    @property
    def directions(self) -> list[str]:
        return ["maximize" if o.endswith(":max") else "minimize" for o in self.attrs.get("objectives", [])]

    @property
    def quality_label(self) -> str:
        """What this study's ``quality`` measures (:func:`quality_label_of` its trials)."""
        return quality_label_of(self.records)

    @property
    def parent(self) -> Architecture | None:
        data = self.attrs.get("parent_architecture")
        return Architecture.from_dict(data) if data else None

    def pareto(self) -> list[TrialRecord]:
        return sorted(pareto_front(self.records, self.directions), key=lambda r: -(r.quality or 0))

    def candidate_counts(self) -> dict[str, int]:
        """How often each inner-search candidate was returned, over trials that recorded one."""
        counts: dict[str, int] = {}
        for r in self.records:
            chosen = (r.selection or {}).get("chosen")
            if chosen:
                counts[chosen] = counts.get(chosen, 0) + 1
        return counts

    def best_feasible(self) -> TrialRecord | None:
        feasible = [r for r in self.records if r.feasible]
        return max(feasible, key=lambda r: r.quality or 0) if feasible else None


def list_studies(storage_url: str) -> list[dict[str, Any]]:
    import optuna

    out = []
    for s in optuna.get_all_study_summaries(make_storage(storage_url)):
        out.append(
            {
                "study": s.study_name,
                "trials": s.n_trials,
                "directions": [d.name.lower() for d in s.directions],
                "storage": storage_url,
                "started": str(s.datetime_start or ""),
            }
        )
    return out


def load_group(name: str, storage_url: str | None = None) -> list[StudyView]:
    """Every study of group ``name`` (studies named ``name.<hardware>``), or the study ``name``."""
    url = storage_url or default_storage(name.split(".")[0])
    views = []
    for study_name in group_members(name, url):  # never creates a storage that is not there
        records, attrs = load_records(url, study_name)
        views.append(StudyView(study_name, records, attrs))
    return views


def export_rows(view: StudyView) -> list[dict[str, Any]]:
    """One flat row per trial: number, state, feasible, params, the global choices, metrics,
    quality and its ``quality_kind``, constraint violations; ``baseline`` for a seeded trial; and in
    weights mode ``candidate`` (the inner-search candidate returned) with ``val_kl[<candidate>]``,
    each candidate's held-out calibration KL (None: not measured), ``search_stopped_at_step`` for a
    seeded trial the scheduler stopped (recorded as its baseline's model); for a trial the scheduler
    stopped early (state PRUNED), ``stopped_at_step``, ``stopped_val_kl`` and ``stopped_violation``:
    its last report; ``proxy_infeasible`` (the proxy's violations, JSON) for a point the proxy kept
    from running, ``proxy_rank`` for one it enqueued; ``seconds[<part>]``: where a completed weights
    trial's time went (parent load, inner search, quality, total); ``ffn_channels[<part>]``: a weights
    trial's FFN budget (``budget``: ``num_layers · ffn_width``), the most a per-layer shape keeps
    within it under the engine's rules (``heterogeneous``) and what its model kept (``kept``)."""
    rows = []
    for r in view.records:
        row: dict[str, Any] = {
            "study": view.name,
            "number": r.number,
            "state": r.state,
            "feasible": r.feasible,
            "params": json.dumps(r.params, sort_keys=True),
            **r.params,
        }
        row.update(r.metrics)
        row["quality"] = r.quality
        row["quality_kind"] = r.quality_kind
        row.update({f"constraint[{k}]": v for k, v in r.constraints.items()})
        if r.baseline:
            row["baseline"] = r.baseline
        if r.selection:
            row["candidate"] = r.selection.get("chosen")
            row.update({f"val_kl[{k}]": v for k, v in r.selection.get("val_kl", {}).items()})
            if r.selection.get("stopped_at_step") is not None:  # a seeded trial stopped early: its baseline's model
                row["search_stopped_at_step"] = r.selection["stopped_at_step"]
        if r.stopped_early:
            row["stopped_at_step"] = r.stopped_early.get("inner_step")
            row["stopped_val_kl"] = r.stopped_early.get("val_kl")
            row["stopped_violation"] = r.stopped_early.get("violation")
        if r.proxy_infeasible:
            row["proxy_infeasible"] = json.dumps(r.proxy_infeasible, sort_keys=True)
        if r.proxy_rank:
            row["proxy_rank"] = r.proxy_rank
        if r.timings_s:
            row.update(
                {f"seconds[{k}]": v for k, v in r.timings_s.items() if k in ("parent", "search", "quality", "total")}
            )
        if r.ffn_budget:
            b = r.ffn_budget
            row.update(
                {
                    "ffn_channels[budget]": b["channels"],
                    "ffn_channels[heterogeneous]": b["heterogeneous_channels"],
                    "ffn_channels[kept]": b["kept_channels"],
                }
            )
        if r.error:
            row["error"] = r.error.splitlines()[0]
        rows.append(row)
    return rows


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
