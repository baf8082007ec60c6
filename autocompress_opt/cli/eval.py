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
    dropped_rows_note,
    print_json,
    table,
)
from autocompress_opt.errors import ConfigError

_PPL_BATCH_SIZE = 4  # quality.DEFAULT_BATCH_SIZE: long rows, full-vocabulary logits
_TASK_BATCH_SIZE = 16  # scoring.DEFAULT_BATCH_SIZE: short requests
_ITEMS = 200  # items per built-in task
_LMEVAL_PREFIX = "lm-eval:"  # tasks.lmeval_tasks.LMEVAL_PREFIX (not imported: --help stays light)


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
  autocompress eval --model pruned/ --tasks wordnet-define,bible-cloze --items 50 --evaluator lm-eval
  autocompress eval --model pruned/ --tasks lm-eval:mmlu,arc_challenge,hellaswag    # lm-eval's own tasks, by name
  autocompress eval --model pruned/ --tasks all,lm-eval:arc_easy --items 100 --json  # ours and lm-eval's together
  autocompress eval --model pruned/ --tasks lm-eval:my_task --lm-eval-include my_tasks/  # your own task YAMLs""",
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
        "lm-evaluation-harness; 'lm-eval:' before a name makes it and the names after it lm-eval's own tasks, "
        "groups, tags or globs (lm-eval:mmlu,arc_challenge; `lm-eval ls tasks` lists them; their datasets come "
        "from the Hugging Face Hub or its local cache); without --tasks, the perplexity/KL report",
    )
    p.add_argument(
        "--items",
        type=int,
        default=None,
        help=f"items per task (default {_ITEMS}); for lm-eval tasks, the first N documents of each "
        "(default: all, as lm-eval reports them)",
    )
    p.add_argument(
        "--lm-eval-include",
        type=Path,
        action="append",
        default=None,
        metavar="DIR",
        help="a folder of your own lm-eval task YAMLs, named in --tasks lm-eval:NAME (repeatable)",
    )
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
        ours, theirs = _split_tasks(args.tasks)
        _check_task_names(ours)
        if args.lm_eval_include and not theirs:
            raise ConfigError("--lm-eval-include applies to lm-eval tasks: name them in --tasks lm-eval:NAME")
    elif args.lm_eval_include:
        raise ConfigError("--lm-eval-include applies to --tasks lm-eval:NAME")
    if args.data_dir is not None and not args.data_dir.is_dir():
        raise ConfigError(f"--data-dir {str(args.data_dir)!r} is not a directory")
    from autocompress_opt.hf.loading import model_limits
    from autocompress_opt.tasks.items import PERPLEXITY_TASK

    # --seq-len is the row length of the perplexity report, and of the heldout-perplexity task
    uses_seq_len = args.tasks is None or PERPLEXITY_TASK in _split_tasks(args.tasks)[0]
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
        f"{dropped_rows_note(report.data)}"
    )
    print(table(rows, ["domain", "perplexity", "KL(parent||model) nats", "seconds"]))


# ------------------------------------------------------------------- tasks
def _split_tasks(text: str) -> tuple[list[str], list[str]]:
    """``--tasks`` as (our task names, lm-eval task names): ``lm-eval:`` before a name makes it and
    every name after it lm-eval's; ``all`` among ours is the eight built-in tasks."""
    from autocompress_opt.tasks.builders import TASK_NAMES

    ours: list[str] = []
    theirs: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if name.lower().startswith(_LMEVAL_PREFIX):
            name = name[len(_LMEVAL_PREFIX) :].strip()
            theirs.append(name)
            if not name:
                raise ConfigError(f"--tasks {text!r}: '{_LMEVAL_PREFIX}' needs a task name after it")
        elif name and theirs:
            theirs.append(name)
        elif name.lower() == "all":
            ours.extend(n for n in TASK_NAMES if n not in ours)
        elif name:
            ours.append(name)
    if not ours and not theirs:
        raise ConfigError(f"--tasks needs task names, 'all' or {_LMEVAL_PREFIX}NAMES, got {text!r}")
    return ours, theirs


def _run_tasks(args: argparse.Namespace) -> int:
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.tasks.scoring import evaluate_tasks

    if args.parent:
        raise ConfigError("--parent applies to the perplexity/KL report, not to --tasks")
    names, lmeval_names = _split_tasks(args.tasks)
    lmeval_tasks = None
    if lmeval_names:  # names resolved and datasets fetched before the model loads
        from autocompress_opt.tasks.lmeval_tasks import load_lmeval_tasks

        lmeval_tasks = load_lmeval_tasks(lmeval_names, include=args.lm_eval_include or ())
    model = load_model(args.model, **compute_of(args), cache=False)  # one copy of the parent, not two
    result: dict[str, Any] = {"model": model.source, "num_params": model.num_params}
    report = None
    if names:
        report = evaluate_tasks(
            model.model,
            model.tokenizer,
            names,
            n_items=args.items or _ITEMS,
            seed=args.seed,
            batch_size=args.batch_size or _TASK_BATCH_SIZE,
            progress=not args.no_progress,
            data_dir=args.data_dir,
            ppl_samples=args.samples,
            ppl_seq_len=args.seq_len,
            evaluator=args.evaluator,
        )
        result.update(report.to_dict())
    lmeval_report = None
    if lmeval_tasks is not None:
        from autocompress_opt.tasks.lmeval_tasks import evaluate_lmeval_tasks

        lmeval_report = evaluate_lmeval_tasks(
            model.model,
            model.tokenizer,
            lmeval_tasks,
            limit=args.items,
            batch_size=args.batch_size or _TASK_BATCH_SIZE,
        )
        result["lm_eval"] = lmeval_report.to_dict()
    _write(args, result)
    if args.json:
        print_json(result)
        return 0
    print(f"model: {model.source}")
    if report is not None:
        _print_suite(args, names, report)
    if lmeval_report is not None:
        _print_lmeval(lmeval_report)
    return 0


def _print_suite(args: argparse.Namespace, names: list[str], report: Any) -> None:
    print(f"{args.items or _ITEMS} items per task, seed {args.seed}, evaluator {args.evaluator}")
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


def _print_lmeval(report: Any) -> None:
    """lm-eval's scores of the names asked for (a group's members are in the JSON report)."""
    docs = "all documents" if report.limit is None else f"the first {report.limit} documents"
    offline = ", Hugging Face Hub offline" if report.offline else ""
    print(f"lm-eval {report.lm_eval_version}: {docs} of each task, its own few-shot setting{offline}")
    rows = [
        [
            s.task,
            s.metric,
            _lmeval_number(s.metric, s.value),
            "" if s.stderr is None else "± " + _lmeval_number(s.metric, s.stderr),
            str(s.n),
            "" if s.num_fewshot is None else str(s.num_fewshot),
            s.dataset or ("(group)" if s.kind == "group" else ""),
        ]
        for s in report.scores
        if s.requested
    ]
    print(table(rows, ["lm-eval task", "metric", "score", "± stderr", "n", "shots", "dataset"]))


# lm-eval metrics that are fractions of documents, shown as percentages; others (perplexities, BLEU) as they are
_FRACTION_METRICS = frozenset({"acc", "acc_norm", "acc_bytes", "acc_mutual_info", "exact_match", "mc1", "mc2", "em"})


def _lmeval_number(metric: str, value: float) -> str:
    if metric.split(" ")[0] in _FRACTION_METRICS:
        return f"{100 * value:.1f}%"
    return f"{value:.4g}"


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
