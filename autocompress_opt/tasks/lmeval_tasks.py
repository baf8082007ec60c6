"""Standard benchmarks by name: lm-evaluation-harness's own tasks (``eval --tasks lm-eval:NAMES``).

Where :mod:`autocompress_opt.tasks.lmeval` scores *our* offline tasks through lm-eval, this module
hands lm-eval the names of *its* tasks (``mmlu``, ``arc_challenge``, ``hellaswag``, a group, a tag,
a glob such as ``mmlu_*``, or a task YAML file) and reports what lm-eval computes, with the same
model wrapper (:func:`~autocompress_opt.tasks.lmeval.lmeval_model`). Users' own task YAMLs join the
registry through ``include`` (lm-eval's ``TaskManager(include_path=...)``).

Two steps, so that every failure that needs no model comes before a model loads:

1. :func:`load_lmeval_tasks` resolves the names (unknown: "unknown lm-eval task 'x' — did you mean
   'y'?") and builds the tasks, which fetches their datasets. When the Hugging Face Hub cannot be
   reached, that runs in offline mode (:func:`~autocompress_opt.hf.hub.hub_offline_unless_reachable`):
   a cached dataset loads, a missing one is a one-line :class:`ConfigError` naming the dataset,
   at once rather than after minutes of retries.
2. :func:`evaluate_lmeval_tasks` runs ``lm_eval.simple_evaluate`` on a loaded model and keeps
   every metric of every task and group lm-eval reports (a group's score is lm-eval's aggregate).

Few-shot counts and prompts are the tasks' own (lm-eval's defaults: ``num_fewshot`` from the YAML,
else zero; few-shot examples drawn with lm-eval's default seed 1234); ``limit`` keeps the first
``limit`` documents of every task, as lm-eval's ``--limit`` does. The process's global random seeds
are left as they were.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from autocompress_opt.errors import ConfigError, one_line, suggest
from autocompress_opt.tasks.lmeval import import_lmeval, lmeval_model
from autocompress_opt.tasks.scoring import DEFAULT_BATCH_SIZE

__all__ = [
    "LMEVAL_PREFIX",
    "LmEvalReport",
    "LmEvalScore",
    "LmEvalTasks",
    "evaluate_lmeval_tasks",
    "load_lmeval_tasks",
]

LMEVAL_PREFIX = "lm-eval:"
_GLOB = re.compile(r"[*?\[]")
_QUOTED = re.compile(r"'([^'\s]+)'")  # "Couldn't reach 'cais/mmlu' on the Hub": the dataset in the library's text


@dataclass(frozen=True)
class LmEvalTasks:
    """lm-eval tasks resolved and built (their datasets fetched), ready for a model.

    ``names``: the names as resolved (globs expanded); ``objects``: lm-eval's top-level ``Task`` /
    ``Group`` objects built for them (a tag: its member tasks), ``top``: their names, what the report
    marks as requested; ``offline``: whether the datasets were looked up in offline mode;
    ``manager``: the ``TaskManager`` that built them (``simple_evaluate`` would index every bundled
    YAML again without it).
    """

    names: tuple[str, ...]
    objects: tuple[Any, ...]
    top: tuple[str, ...]
    include: tuple[str, ...]
    offline: bool
    lm_eval_version: str
    manager: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class LmEvalScore:
    """One metric of one lm-eval task or group, as lm-eval reports it.

    ``metric`` is lm-eval's name (``acc``, ``acc_norm``, ``exact_match``), followed by the filter in
    parentheses unless that is lm-eval's ``none``; ``value`` and ``stderr`` are fractions for the
    accuracy metrics (``stderr`` None where lm-eval gives none); ``n`` the documents scored (a
    group: over its member tasks); ``requested``: asked for by name (else a member of one).
    """

    task: str
    kind: str  # "task" or "group"
    metric: str
    value: float
    stderr: float | None
    n: int
    num_fewshot: int | None
    dataset: str | None
    requested: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LmEvalReport:
    """Every metric lm-eval reported for the requested names, their groups' members included."""

    requested: tuple[str, ...]
    scores: tuple[LmEvalScore, ...]
    limit: int | None
    include: tuple[str, ...]
    offline: bool
    lm_eval_version: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": list(self.requested),
            "scores": [s.to_dict() for s in self.scores],
            "limit": self.limit,
            "include": list(self.include),
            "offline": self.offline,
            "lm_eval_version": self.lm_eval_version,
            "seconds": self.seconds,
        }


# ------------------------------------------------------------------------- names and datasets
def load_lmeval_tasks(names: Sequence[str], include: Iterable[str | Path] = ()) -> LmEvalTasks:
    """Resolve ``names`` in lm-eval's registry (plus the task YAMLs under each ``include`` folder)
    and build the tasks, fetching their datasets (offline mode when the Hub is unreachable).

    Raises :class:`ConfigError`: lm-eval not installed, an ``include`` that is not a folder, an
    unknown name (with the closest known one), a glob that matches nothing, or a task that could not
    be built (its dataset could not be fetched: the message names the dataset).
    """
    from autocompress_opt.hf.hub import hub_offline_unless_reachable

    if not names:
        raise ConfigError(f"{LMEVAL_PREFIX} needs at least one lm-eval task name")
    folders = tuple(str(Path(p)) for p in include)
    for folder in folders:
        if not Path(folder).is_dir():
            raise ConfigError(f"--lm-eval-include {folder!r} is not a directory (a folder of lm-eval task YAMLs)")
    lm_eval = import_lmeval()  # after the cheap checks: importing it takes seconds
    manager = _task_manager(names, folders)
    resolved = _resolve(names, manager)
    objects: list[Any] = []
    with hub_offline_unless_reachable() as offline:
        for name in resolved:
            try:
                loaded = manager.load([name])
            except Exception as error:  # the datasets library and lm-eval raise many kinds
                raise ConfigError(_build_error(name, manager, error, offline)) from None
            objects.extend(_top_level(name, loaded))
    top = tuple(dict.fromkeys(getattr(o, "task_name", None) or o.name for o in objects))
    return LmEvalTasks(tuple(resolved), tuple(objects), top, folders, offline, lm_eval.__version__, manager)


def _task_manager(names: Sequence[str], folders: tuple[str, ...]) -> Any:
    """lm-eval's ``TaskManager``: over the include folders alone when they hold every name asked
    for (indexing lm-eval's ~15k bundled YAMLs takes seconds to tens of seconds), else over both."""
    from lm_eval.tasks import TaskManager

    if folders:
        local = TaskManager(include_path=list(folders), include_defaults=False)
        if all(name in local.all_tasks for name in names):  # a glob may match bundled tasks too: indexed
            return local
    return TaskManager(include_path=list(folders) or None)


def _resolve(names: Sequence[str], manager: Any) -> list[str]:
    """The names as lm-eval will load them: globs expanded (sorted), YAML paths kept, the rest
    checked against the registry; duplicates dropped, first occurrence kept."""
    known = manager.all_tasks
    out: list[str] = []
    for name in names:
        if _GLOB.search(name):
            matched = manager.match_tasks([name])
            if not matched:
                raise ConfigError(f"lm-eval task pattern {name!r} matches none of {_registry_size(manager)}")
            out.extend(matched)
        elif name in known or (name.endswith((".yaml", ".yml")) and Path(name).is_file()):
            out.append(name)
        else:
            raise ConfigError(f"unknown lm-eval task {name!r}{suggest(name, known)}; {_registry_size(manager)}")
    return list(dict.fromkeys(out))


def _registry_size(manager: Any) -> str:
    return (
        f"lm-eval knows {len(manager.all_tasks)} tasks, groups and tags "
        "(`lm-eval ls tasks` lists them; --lm-eval-include DIR adds your own YAMLs)"
    )


def _top_level(name: str, loaded: dict[str, Any]) -> list[Any]:
    """What ``TaskManager.load([name])`` built for ``name``: its group, else its task(s) (a tag: several)."""
    groups = loaded.get("groups") or {}
    if name in groups:
        return [groups[name]]
    return list(loaded["tasks"].values())


def _build_error(name: str, manager: Any, error: Exception, offline: bool) -> str:
    """One line: which task, which dataset could not be fetched, and the library's first line."""
    text = _first_line(error)
    if not isinstance(error, (OSError, ConnectionError)) and "dataset" not in text.lower():
        return f"lm-eval could not build task {name!r}: {type(error).__name__}: {text}"
    datasets = _datasets_of(name, manager)
    named = [d for d in _QUOTED.findall(" ".join(_chain_text(error))) if d in datasets or not datasets]
    dataset = named[0] if named else ", ".join(datasets) or "(unknown)"
    why = (
        "the Hugging Face Hub cannot be reached from here and it is not in the local datasets cache"
        if offline
        else text
    )
    return f"lm-eval task {name!r}: could not fetch its dataset {dataset!r}: {why} ({type(error).__name__}: {text})"


def _first_line(error: BaseException) -> str:
    return one_line(str(error)).split("; ")[0] or type(error).__name__


def _chain_text(error: BaseException) -> list[str]:
    """The messages of ``error`` and of every exception it was raised from or during."""
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(str(current))
        current = current.__cause__ or current.__context__
    return texts


def _datasets_of(name: str, manager: Any, depth: int = 0) -> list[str]:
    """The Hugging Face datasets (``dataset_path``) of a task, group or tag, from lm-eval's index."""
    entry = manager.task_index.get(name)
    if entry is None or depth > 8:
        return []
    cfg = entry.cfg or {}
    if cfg.get("dataset_path"):
        return [str(cfg["dataset_path"])]
    children = cfg.get("task") if "group" in cfg else sorted(entry.tags)
    if isinstance(children, str):
        children = [children]
    found: list[str] = []
    for child in children or ():
        child_name = child.get("task") if isinstance(child, dict) else child
        if isinstance(child_name, str):
            found.extend(d for d in _datasets_of(child_name, manager, depth + 1) if d not in found)
    return found


# ------------------------------------------------------------------------------- evaluation
def evaluate_lmeval_tasks(
    model: Any,
    tokenizer: Any,
    tasks: LmEvalTasks,
    *,
    limit: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> LmEvalReport:
    """Run lm-eval's ``simple_evaluate`` over ``tasks`` on ``model`` (``HFLM`` over the loaded model).

    ``limit``: the first ``limit`` documents of every task (None: all). Deterministic for
    log-likelihood tasks; the model's training flag and the global random seeds are left alone.
    """
    lm_eval = import_lmeval()
    start = time.perf_counter()
    with lmeval_model(model, tokenizer, batch_size) as lm:
        output = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(tasks.objects),
            task_manager=tasks.manager,
            limit=limit,
            log_samples=False,
            random_seed=None,
            numpy_random_seed=None,
            torch_random_seed=None,
        )
    scores = _scores(output, set(tasks.top))
    return LmEvalReport(
        requested=tasks.names,
        scores=tuple(scores),
        limit=limit,
        include=tasks.include,
        offline=tasks.offline,
        lm_eval_version=tasks.lm_eval_version,
        seconds=time.perf_counter() - start,
    )


def _scores(output: dict[str, Any], requested: set[str]) -> list[LmEvalScore]:
    """One :class:`LmEvalScore` per (task or group, metric) in ``output["results"]``, in lm-eval's order."""
    children: dict[str, list[str]] = output.get("group_subtasks") or {}
    n_samples: dict[str, dict[str, int]] = output.get("n-samples") or {}
    configs: dict[str, dict[str, Any]] = output.get("configs") or {}
    n_shot: dict[str, Any] = output.get("n-shot") or {}
    rows = []
    for name, result in output["results"].items():
        is_group = bool(children.get(name))
        leaves = _leaves(name, children) if is_group else [name]
        n = sum(int(n_samples.get(leaf, {}).get("effective", 0)) for leaf in leaves)
        cfg = configs.get(name, {})
        dataset = ":".join(str(cfg[k]) for k in ("dataset_path", "dataset_name") if cfg.get(k)) or None
        shots = n_shot.get(name)
        num_fewshot = int(shots) if _is_number(shots) else None
        for key, value in result.items():
            metric, comma, filt = key.partition(",")
            if not comma or "_stderr" in metric or not _is_number(value):
                continue
            stderr = result.get(f"{metric}_stderr,{filt}")
            rows.append(
                LmEvalScore(
                    task=name,
                    kind="group" if is_group else "task",
                    metric=metric if filt == "none" else f"{metric} ({filt})",
                    value=float(value),
                    stderr=float(stderr) if _is_number(stderr) else None,
                    n=n,
                    num_fewshot=num_fewshot,
                    dataset=dataset,
                    requested=name in requested,
                )
            )
    return rows


def _leaves(name: str, children: dict[str, list[str]], depth: int = 0) -> list[str]:
    if name not in children or depth > 8:
        return [name]
    return [leaf for child in children[name] for leaf in _leaves(child, children, depth + 1)]


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
