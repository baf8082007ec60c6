"""``autocompress eval``: held-out perplexity and KL to a parent, or zero-shot task accuracy (``--tasks``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import (
    add_compute_args,
    add_data_arg,
    add_verb,
    check_output_file,
    check_positive,
    compute_of,
    print_json,
    table,
)
from autocompress_opt.errors import ConfigError

_PPL_BATCH_SIZE = 4  # quality.DEFAULT_BATCH_SIZE: long rows, full-vocabulary logits
_TASK_BATCH_SIZE = 16  # scoring.DEFAULT_BATCH_SIZE: short requests


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "eval",
        "Score a model: held-out perplexity and KL to a parent, or task accuracy (--tasks).",
        """
  autocompress eval --model smollm2-135m                            # parent perplexities, 16 x 256 tokens per domain
  autocompress eval --model pruned/ --parent smollm2-135m --json    # a pruned checkpoint against its parent
  autocompress eval --model smollm2-135m --samples 64 --seq-len 512 --seed 1 --out eval.json
  autocompress eval --list-tasks                                    # tasks, metrics, installed sources, install hints
  autocompress eval --model smollm2-135m --tasks all --items 200 --out tasks.json
  autocompress eval --model pruned/ --tasks wordnet-define,bible-cloze --items 50 --evaluator lm-eval""",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model with offline weights (smollm2-135m), Hugging Face directory (safetensors) or .gguf",
    )
    p.add_argument("--parent", default=None, help="reference model for KL(parent || model); same forms as --model")
    p.add_argument(
        "--tasks",
        default=None,
        metavar="NAMES",
        help="comma-separated tasks or 'all' (see --list-tasks): zero-shot accuracy scored like "
        "lm-evaluation-harness; without it, the perplexity/KL report",
    )
    p.add_argument("--items", type=int, default=200, help="items per task (default 200)")
    p.add_argument(
        "--evaluator",
        default="builtin",
        choices=("builtin", "lm-eval"),
        help="builtin (default) or lm-eval (needs: pip install lm-eval)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="read task sources from DIR instead of their installed locations",
    )
    p.add_argument(
        "--list-tasks",
        action="store_true",
        help="list the tasks, their metric and whether their source is installed, then exit",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=16,
        help="held-out rows per domain (default 16), also for the heldout-perplexity task",
    )
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row (default 256)")
    add_data_arg(p, "perplexity and KL (its test split, reported beside the built-in code and prose)")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed of rows and task items (default 0); the held-out split stays fixed",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"rows per forward pass (default {_PPL_BATCH_SIZE}; {_TASK_BATCH_SIZE} with --tasks)",
    )
    add_compute_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--json", action="store_true", help="print the full report as one JSON object")
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="also write the JSON report to FILE")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.list_tasks:
        return _list_tasks(args)
    if not args.model:
        raise ConfigError("--model is required (only --list-tasks runs without a model)")
    _check_arguments(args)
    compute = compute_of(args)  # before anything loads
    if args.tasks is not None:
        return _run_tasks(args)
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.quality.metrics import evaluate

    model = load_model(args.model, **compute, cache=False)  # one copy each, not two
    parent = load_model(args.parent, **compute, cache=False) if args.parent else None
    report = evaluate(
        model.model,
        model.tokenizer,
        parent=parent.model if parent else None,
        n_samples=args.samples,
        seq_len=args.seq_len,
        seed=args.seed,
        batch_size=args.batch_size or _PPL_BATCH_SIZE,
        progress=not args.no_progress,
        data=args.data,
    )
    result = {
        "model": model.source,
        "parent": parent.source if parent else None,
        "num_params": model.num_params,
        "parent_num_params": parent.num_params if parent else None,
        **report.to_dict(),
    }
    _write(args, result)
    if args.json:
        print_json(result)
        return 0
    _print_table(model.source, parent.source if parent else None, report)
    return 0


def _check_arguments(args: argparse.Namespace) -> None:
    """Every check that needs no model, before one loads: counts, --out, task names, and the model
    files themselves (config, complete safetensors, tokenizer; no weights read)."""
    from autocompress_opt.hf.loading import check_model_files

    check_positive(args, "--samples", "--batch-size", "--items")
    check_positive(args, "--seq-len", minimum=2)
    if args.out is not None:
        check_output_file(args.out)
    if args.tasks is not None:
        if args.parent:
            raise ConfigError("--parent applies to the perplexity/KL report, not to --tasks")
        _check_task_names(_task_names(args.tasks))
    if args.data_dir is not None and not args.data_dir.is_dir():
        raise ConfigError(f"--data-dir {str(args.data_dir)!r} is not a directory")
    from autocompress_opt.hf.loading import model_limits
    from autocompress_opt.tasks.items import PERPLEXITY_TASK

    # --seq-len is the row length of the perplexity report, and of the heldout-perplexity task
    uses_seq_len = args.tasks is None or PERPLEXITY_TASK in _task_names(args.tasks)
    for flag in ("--model", "--parent"):
        ref = getattr(args, flag[2:])
        if ref:
            _, context = model_limits(check_model_files(ref))
            if uses_seq_len and context is not None and args.seq_len > context:
                raise ConfigError(
                    f"--seq-len {args.seq_len} exceeds the context of {flag} {ref!r} ({context} positions)"
                )


def _check_task_names(names: list[str]) -> None:
    from autocompress_opt.errors import UnknownNameError
    from autocompress_opt.tasks.builders import TASK_NAMES

    for name in names:
        if name not in TASK_NAMES:
            raise UnknownNameError("task", name, TASK_NAMES)


def _write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")


def _print_table(model: str, parent: str | None, report: Any) -> None:
    kl = lambda v: "-" if v is None else f"{v:.5f}"
    rows = [
        ["code", f"{report.ppl_code:.3f}", kl(report.kl_code), f"{report.timings_s['code']:.1f}"],
        ["prose", f"{report.ppl_prose:.3f}", kl(report.kl_prose), f"{report.timings_s['prose']:.1f}"],
        *(
            [["data", f"{report.ppl_data:.3f}", kl(report.kl_data), f"{report.timings_s['data']:.1f}"]]
            if report.ppl_data is not None
            else []
        ),
        ["all", "", kl(report.kl_to_parent), f"{report.timings_s['total']:.1f}"],
    ]
    print(
        f"model:  {model}\nparent: {parent or '(none)'}\n"
        f"test split: {report.n_samples} rows x {report.seq_len} tokens per domain, seed {report.seed}"
    )
    print(table(rows, ["domain", "perplexity", "KL(parent||model) nats", "seconds"]))


# ------------------------------------------------------------------- tasks
def _task_names(text: str) -> list[str]:
    from autocompress_opt.tasks.builders import TASK_NAMES

    if text.strip().lower() == "all":
        return list(TASK_NAMES)
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ConfigError(f"--tasks needs task names or 'all', got {text!r}")
    return names


def _run_tasks(args: argparse.Namespace) -> int:
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.tasks.scoring import evaluate_tasks

    if args.parent:
        raise ConfigError("--parent applies to the perplexity/KL report, not to --tasks")
    names = _task_names(args.tasks)
    model = load_model(args.model, **compute_of(args), cache=False)  # one copy of the parent, not two
    report = evaluate_tasks(
        model.model,
        model.tokenizer,
        names,
        n_items=args.items,
        seed=args.seed,
        batch_size=args.batch_size or _TASK_BATCH_SIZE,
        progress=not args.no_progress,
        data_dir=args.data_dir,
        ppl_samples=args.samples,
        ppl_seq_len=args.seq_len,
        evaluator=args.evaluator,
    )
    result = {"model": model.source, "num_params": model.num_params, **report.to_dict()}
    _write(args, result)
    if args.json:
        print_json(result)
        return 0
    print(f"model: {model.source}\n{args.items} items per task, seed {args.seed}, evaluator {args.evaluator}")
    print(
        table(
            _task_rows(names, report), ["task", "metric", "score %", "± stderr", "chance %", "n", "seconds", "source"]
        )
    )
    if report.average_accuracy is None:
        print("average accuracy: - (no item task was scored)")
    else:
        print(
            f"average accuracy: {100 * report.average_accuracy:.1f}% over {len(report.averaged_tasks)} tasks "
            f"({', '.join(report.averaged_tasks)})"
        )
    return 0


def _task_rows(names: list[str], report: Any) -> list[list[str]]:
    """One row per task in the order asked for; held-out perplexity takes a row per domain."""
    from autocompress_opt.tasks.items import PERPLEXITY_TASK

    scored = {t.name: t for t in report.tasks}
    rows = []
    for name in names:
        if name in scored:
            t = scored[name]
            rows.append(
                [
                    name,
                    t.metric,
                    f"{100 * t.score:.1f}",
                    f"± {100 * t.stderr:.1f}",
                    f"{100 * t.chance:.1f}",
                    str(t.n),
                    f"{t.seconds:.1f}",
                    _source_line(t.source),
                ]
            )
        elif name in report.skipped:
            rows.append([name, "", "", "", "", "", "", f"skipped: {report.skipped[name]}"])
        elif name == PERPLEXITY_TASK and report.heldout is not None:
            h = report.heldout
            for domain, ppl in (("code", h.ppl_code), ("prose", h.ppl_prose)):
                rows.append(
                    [
                        f"{name} ({domain})",
                        "perplexity",
                        f"{ppl:.3f}",
                        "",
                        "",
                        f"{h.n_samples}x{h.seq_len}",
                        f"{h.timings_s[domain]:.1f}",
                        "held-out " + domain,
                    ]
                )
    return rows


def _source_line(source: dict[str, Any]) -> str:
    """``package version`` of a task's source record, else its first fields."""
    if "package" in source:
        return " ".join(str(source[k]) for k in ("package", "version") if source.get(k))
    return ", ".join(f"{k}={v}" for k, v in list(source.items())[:2])


def _list_tasks(args: argparse.Namespace) -> int:
    from autocompress_opt.tasks.scoring import describe_tasks

    infos = describe_tasks(data_dir=args.data_dir)
    if args.json:
        print_json([info.__dict__ for info in infos])
        return 0
    rows = [[i.name, i.metric, "yes" if i.available else "no", "" if i.available else i.hint] for i in infos]
    print(table(rows, ["task", "metric", "installed", "install"]))
    return 0
