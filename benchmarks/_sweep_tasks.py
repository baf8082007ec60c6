"""The sweep's arms on accuracy tasks that can resolve a few points (issue 47, item 5).

``bench_sweep.py --tasks`` scores every recovered model of a cell on the report tasks of
:mod:`autocompress_opt.tasks.report`: items clean of calibration and selection text, a dev block
that screens the tasks, and one fresh report block per recovery seed (recovery seed ``i`` of the
file's list is scored on block ``1 + i`` by both arms: paired within a block, never reused across
blocks). A cell's record gains ``tasks``: what each task's items are, the screen's verdict per
task, each arm's scores, and searched − best-uniform in points of mean accuracy over the kept tasks
(and per task), resampled over items within blocks and over blocks. The cell's task comparison
joins the file's Holm family.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

# Every item task the suite has; the screen decides per cell which of them count.
CANDIDATES = (
    "wordnet-define",
    "wordnet-define-hard",
    "bible-next",
    "bible-cloze",
    "wikihow-goal-step",
    "docs-agreement",
    "humaneval-mutants",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tasks",
        action="store_true",
        help="also score every recovered model on the report tasks (clean items, one fresh block per recovery seed)",
    )
    p.add_argument("--task-items", type=int, default=1000, help="items per task in each report block")
    p.add_argument("--dev-items", type=int, default=200, help="items per task in the dev block that screens tasks")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the file's cells share about tasks (nothing when ``--tasks`` is off: files without tasks
    keep their settings)."""
    if not args.tasks:
        return {}
    from autocompress_opt.tasks import report

    return {
        "tasks": {
            "candidates": list(CANDIDATES),
            "block_items": args.task_items,
            "dev_items": args.dev_items,
            "floor_margin": report.FLOOR_MARGIN,
            "ceiling": report.CEILING,
        }
    }


def build(args: argparse.Namespace) -> dict[str, Any] | None:
    """The installed candidates' report tasks, one report block per recovery seed (None: ``--tasks`` off)."""
    if not args.tasks:
        return None
    from autocompress_opt.tasks.builders import task_available
    from autocompress_opt.tasks.report import report_tasks

    names = []
    for name in CANDIDATES:
        ok, hint = task_available(name)
        if ok:
            names.append(name)
        else:
            print(f"task {name}: not installed ({hint}); left out", flush=True)
    return report_tasks(names, blocks=len(args.seed_list), block_items=args.task_items, dev_items=args.dev_items)


def _bits(correct: list[bool]) -> str:
    return "".join("1" if c else "0" for c in correct)


def _unbits(bits: str) -> list[float]:
    return [float(c == "1") for c in bits]


def scorer(tasks: dict[str, Any], block: int) -> Callable[[Any, Any], dict[str, Any]]:
    """A function of (model, tokenizer) that scores every task's dev block and report ``block``."""
    from autocompress_opt.tasks.scoring import score_task

    def score(model: Any, tokenizer: Any) -> dict[str, Any]:
        out = {}
        for name, task in tasks.items():
            dev = score_task(model, tokenizer, task.blocks[0], progress=False)
            rep = score_task(model, tokenizer, task.blocks[block], progress=False)
            out[name] = {
                "block": block,
                "dev": dev.score,
                "score": rep.score,
                "dev_correct": _bits(dev.correct),
                "correct": _bits(rep.correct),
                "seconds": dev.seconds + rep.seconds,
            }
        return out

    return score


def _runs(record: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    return [r for _, r in sorted(record["arms"][arm]["recovered"].items(), key=lambda kv: int(kv[0]))]


def compare(record: dict[str, Any], tasks: dict[str, Any], arms: tuple[str, str], n_boot: int) -> dict[str, Any]:
    """The cell's ``tasks`` record (module doc) from its arms' recovered runs."""
    from autocompress_opt.tasks.report import blocked_bootstrap, screen

    runs = {arm: _runs(record, arm) for arm in arms}
    dev = {
        name: {f"{arm}/seed {r['seed']}": r["tasks"][name]["dev"] for arm in arms for r in runs[arm]} for name in tasks
    }
    screened = screen(dev, tasks)
    kept = [name for name, why in screened.items() if why is None]
    out: dict[str, Any] = {
        "items": {name: t.to_dict() for name, t in tasks.items()},
        "screen": screened,
        "kept": kept,
        "scores": {
            arm: {name: sum(r["tasks"][name]["score"] for r in runs[arm]) / len(runs[arm]) for name in tasks}
            for arm in arms
        },
        "difference": None,
        "per_task": {},
    }
    if not kept:
        return out

    def blocks(arm: str, names: list[str]) -> list[dict[str, list[float]]]:
        return [{n: _unbits(r["tasks"][n]["correct"]) for n in names} for r in runs[arm]]

    out["difference"] = blocked_bootstrap(blocks(arms[0], kept), blocks(arms[1], kept), n_boot=n_boot)
    out["per_task"] = {n: blocked_bootstrap(blocks(arms[0], [n]), blocks(arms[1], [n]), n_boot=n_boot) for n in kept}
    return out


def family(cells: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each cell's task comparison as (p-value, difference in points), for the file's Holm family."""
    out = {}
    for key, c in cells.items():
        diff = (c.get("tasks") or {}).get("difference")
        if diff:
            name = f"{key}: searched vs best-uniform, mean accuracy over {len(c['tasks']['kept'])} tasks after recovery"
            out[name] = (diff["p"], diff["mean"])
    return out
