"""Finalists: a study's best trials ranked again after the same short recovery.

A weights-mode trial is scored by its KL to the parent *before* any recovery, and that ranking is
not the one that matters once the chosen model is distilled. The compression sweep showed where the
two part (``docs/results/sweep.md``): at b200 datacenter, middle budget, the study's best cut the
attention to 3 of 9 heads and led best-uniform before recovery, then trailed it after equal
recovery; where the search kept every head and cut FFN width and depth, its lead grew or held.
Distillation forgives some cuts (FFN channels, whole layers) more than others (heads, KV groups).
Minitron ranks its candidate architectures the same way, after a short retraining of each
(Sreenivas et al., *LLM Pruning and Distillation in Practice: The Minitron Approach*, 2024: the
ranking before retraining is not the one after it).

:func:`rank_finalists` takes the ``top`` distinct feasible trials of a study by their stored quality,
cuts each exactly as its trial did (its stored kept indices), distils it from the parent with one
:class:`FinalistRecipe` (the same seed, data and steps for every finalist), and scores it on the
trial's own selection rows
(:func:`~autocompress_opt.search.study.trial_context.heldout_quality`: the test split stays unread).
The finalist with the lowest KL after recovery is the study's recommendation
(``autocompress prune --from-study NAME --trial recovered`` exports it). Each finalist's result
is stored on the study (user attribute ``finalists.<recipe key>.<trial>``) as soon as it is measured, so
an interrupted ranking resumes where it stopped and a finished one is read back for free.

Deterministic given the study, the recipe and the device: the recovery is
:func:`~autocompress_opt.recover.distill.distill`'s.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError, check_int
from autocompress_opt.search.study.records import TrialRecord
from autocompress_opt.search.study.storage import load_records, make_storage

ATTR_PREFIX = "finalists"


@dataclass(frozen=True)
class FinalistRecipe:
    """How finalists are chosen and recovered.

    Attributes:
        top: distinct feasible trials ranked (the best by stored quality); at least 1.
        steps: distillation updates per finalist (each sees ``steps · batch_size · seq_len`` tokens).
        batch_size: rows per update.
        seq_len: tokens per row.
        lr: peak AdamW learning rate (:class:`~autocompress_opt.recover.recipe.DistillRecipe`).
        seed: the recovery's seed (document order, torch RNG): one seed for every finalist.
    """

    top: int = 3
    steps: int = 30
    batch_size: int = 4
    seq_len: int = 128
    lr: float = 1e-4
    seed: int = 0

    def __post_init__(self) -> None:
        check_int(self.top, "finalists top")
        check_int(self.steps, "finalists steps")
        check_int(self.batch_size, "finalists batch_size")
        check_int(self.seq_len, "finalists seq_len", 2)
        check_int(self.seed, "finalists seed", 0)
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < math.inf:
            raise ConfigError(f"finalists lr must be a positive number, got {self.lr!r}")

    @property
    def key(self) -> str:
        """What identifies a recovery (every field but ``top``: ranking more trials reuses the ones done)."""
        fields = {k: v for k, v in asdict(self).items() if k != "top"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]

    def distill_recipe(self) -> Any:
        from autocompress_opt.recover.recipe import DistillRecipe

        return DistillRecipe(
            steps=self.steps,
            batch_size=self.batch_size,
            seq_len=self.seq_len,
            lr=float(self.lr),
            seed=self.seed,
            save_every=self.steps,
        )


@dataclass(frozen=True)
class Finalist:
    """One finalist: its trial, model and KL to the parent on the selection rows before recovery (the
    study's) and after the recipe's recovery (None until measured)."""

    trial: int
    summary: str
    params: int
    kl_in_study: float
    kl_recovered: float | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class FinalistRanking:
    """The finalists of one study under one recipe, in the study's order (best stored quality first)."""

    study: str
    recipe: FinalistRecipe
    finalists: tuple[Finalist, ...]

    @property
    def complete(self) -> bool:
        return all(f.kl_recovered is not None for f in self.finalists)

    @property
    def chosen(self) -> Finalist:
        """The finalist with the lowest KL after recovery (ties: the study's better one). Raises
        ConfigError while some finalist is unmeasured."""
        if not self.complete:
            raise ConfigError(
                f"the finalists of {self.study!r} are not all recovered yet; run "
                f"'autocompress study finalists {self.study}' to finish them"
            )
        return min(self.finalists, key=lambda f: (f.kl_recovered, self.finalists.index(f)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "recipe": asdict(self.recipe),
            "recipe_key": self.recipe.key,
            "finalists": [asdict(f) for f in self.finalists],
            **({"chosen": self.chosen.trial} if self.complete else {}),
        }


def finalist_records(records: Sequence[TrialRecord], top: int) -> list[TrialRecord]:
    """The ``top`` best feasible COMPLETE trials that stored their model (kept indices), one per distinct
    model (two trials that built the same model are one finalist: the earlier), best quality first."""
    pool = [r for r in records if r.state == "COMPLETE" and r.feasible and r.quality is not None and r.kept]
    pool.sort(key=lambda r: (-float(r.quality or 0.0), r.number))
    seen: set[str] = set()
    chosen = []
    for r in pool:
        key = json.dumps([r.architecture, r.kept], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            chosen.append(r)
    return chosen[:top]


def stored_ranking(storage_url: str, study_name: str, recipe: FinalistRecipe | None = None) -> FinalistRanking:
    """The ranking of ``study_name`` as far as it is stored (no work). With no ``recipe``: the recipe of
    the last ranking stored on the study; ConfigError when there is none."""
    records, attrs = load_records(storage_url, study_name)
    if recipe is None:
        last = attrs.get(f"{ATTR_PREFIX}.last")
        if not last:
            raise ConfigError(
                f"study {study_name!r} has no finalists ranked after recovery; run "
                f"'autocompress study finalists {study_name}' first"
            )
        recipe = FinalistRecipe(**last)
    return _ranking(study_name, records, attrs, recipe)


def rank_finalists(
    storage_url: str,
    study_name: str,
    recipe: FinalistRecipe | None = None,
    *,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    report: Callable[[str], None] = print,
) -> FinalistRanking:
    """Recover each finalist of weights-mode study ``study_name`` that is not yet recovered under
    ``recipe`` (module doc), storing each result as it lands; returns the whole ranking.

    ``cache_dir``: the trials' caches (importance, teacher log-probs; default ``.autocompress``), where
    the selection rows and their teacher targets are found as the trials had them. ``report`` gets
    one line per finalist. Raises ConfigError for a study that is not in weights mode, has no parent
    model recorded, or has no feasible trial with a stored model."""
    import optuna

    recipe = recipe or FinalistRecipe()
    records, attrs = load_records(storage_url, study_name)
    identity = attrs.get("identity") or {}
    if identity.get("mode") != "weights":
        raise ConfigError(
            f"study {study_name!r} is in {identity.get('mode')!r} mode: finalists are recovered from the "
            "models of weights-mode trials (study run --mode weights)"
        )
    ranking = _ranking(study_name, records, attrs, recipe)
    if not ranking.finalists:
        raise ConfigError(f"study {study_name!r} has no feasible COMPLETE trial with a stored model to rank")
    study = optuna.load_study(study_name=study_name, storage=make_storage(storage_url))
    study.set_user_attr(f"{ATTR_PREFIX}.last", asdict(recipe))
    todo = [f for f in ranking.finalists if f.kl_recovered is None]
    if todo:
        model = identity["model"]
        context, config = trial_parent_for(storage_url, study_name, cache_dir)
        by_number = {r.number: r for r in records}
        for i, finalist in enumerate(todo, 1):
            report(
                f"finalist {i}/{len(todo)}: trial {finalist.trial}, {finalist.summary}: recovering {recipe.steps} steps"
            )
            kl, seconds = _recovered_kl(context, model, by_number[finalist.trial], recipe, config.data, progress)
            study.set_user_attr(_attr(recipe, finalist.trial), {"kl_recovered": kl, "seconds": round(seconds, 1)})
            report(
                f"  trial {finalist.trial}: KL {finalist.kl_in_study:.4f} -> {kl:.4f} after recovery ({seconds:.0f} s)"
            )
        records, attrs = load_records(storage_url, study_name)
        ranking = _ranking(study_name, records, attrs, recipe)
    return ranking


def trial_parent_for(storage_url: str, study_name: str, cache_dir: str | Path | None = None) -> tuple[Any, Any]:
    """The parent context and trial settings of weights-mode study ``study_name`` as its trials had
    them (:func:`~autocompress_opt.search.study.export.trial_parent` with the study's model, inner
    settings and workload; the caches under ``cache_dir``, default ``.autocompress``)."""
    from autocompress_opt.search.study.export import trial_parent
    from autocompress_opt.search.study.trial_context import DEFAULT_CACHE_DIR

    _, attrs = load_records(storage_url, study_name)
    identity = attrs.get("identity") or {}
    if not identity.get("model"):
        raise ConfigError(f"study {study_name!r} in {storage_url} records no parent model")
    workload = (identity.get("target") or {}).get("workload")
    return trial_parent(
        identity["model"],
        dict(identity.get("inner") or {}),
        cache_dir=cache_dir or DEFAULT_CACHE_DIR,
        workload=workload,
    )


def _attr(recipe: FinalistRecipe, trial: int) -> str:
    return f"{ATTR_PREFIX}.{recipe.key}.{trial}"


def _ranking(
    study_name: str, records: Sequence[TrialRecord], attrs: dict[str, Any], recipe: FinalistRecipe
) -> FinalistRanking:
    finalists = []
    for r in finalist_records(records, recipe.top):
        arch = r.arch()
        done = attrs.get(_attr(recipe, r.number)) or {}
        finalists.append(
            Finalist(
                trial=r.number,
                summary=arch.summary() if arch is not None else "?",
                params=arch.num_params if arch is not None else 0,
                kl_in_study=-math.log(float(r.quality or 0.0)),
                kl_recovered=done.get("kl_recovered"),
                seconds=done.get("seconds"),
            )
        )
    return FinalistRanking(study_name, recipe, tuple(finalists))


def _recovered_kl(
    context: Any, model: str, record: TrialRecord, recipe: FinalistRecipe, data: Sequence[str], progress: bool
) -> tuple[float, float]:
    """The trial's model cut from ``context``'s parent by its kept indices, distilled from ``model`` with
    ``recipe`` in a scratch folder (removed after), and its KL to the parent on the selection rows."""
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.recover.distill import distill
    from autocompress_opt.search.study.export import export_trial
    from autocompress_opt.search.study.trial_context import heldout_quality

    arch = record.arch()
    if arch is None or not record.kept:
        raise ConfigError(f"trial {record.number} stores no model (architecture and kept indices) to recover")
    began = time.perf_counter()
    weight = next(context.model.parameters())
    where = Path(tempfile.mkdtemp(prefix="finalist-"))
    try:
        export_trial(context, arch, where / "export", kept=record.kept, parent={"model": model})
        distill(
            str(where / "export"),
            model,
            where / "distilled",
            recipe.distill_recipe(),
            progress=progress,
            device=str(weight.device),
            data=tuple(data),
        )
        student = load_model(where / "distilled", dtype=weight.dtype, device=weight.device).model
        kl = float(heldout_quality(context, student)["kl_to_parent"])
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return kl, time.perf_counter() - began
