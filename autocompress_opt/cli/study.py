"""``autocompress study``: run, list, show, export and delete Pareto studies."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autocompress_opt._data import REPO_SEARCH_SPACES
from autocompress_opt.cli._common import (
    add_data_arg,
    add_hardware_file,
    add_verb,
    concurrency,
    engine_options,
    print_json,
    setting_options,
    table,
)

if TYPE_CHECKING:
    from autocompress_opt.arch.architecture import Architecture

RUN_EXAMPLES = """
  autocompress study run --model smollm2-135m --targets rtx5070,b200 --workload datacenter \\
      --mode plan --trials 12 --name demo --storage sqlite:///studies/demo.db
  autocompress study run --model smollm2-135m --targets rtx5070:in-game,h100-sxm:datacenter --trials 40 --name mix
  autocompress study run --model smollm2-135m --targets rtx5080 --workload in-game --max-tpot-ms 0.5x \\
      --max-memory-gib 2 --trials 30 --name tight
  autocompress study run --config studies/demo.yaml          # the same flags, as YAML keys
  autocompress study run --targets my-gpu --hardware-file my_gpus.yaml --trials 20 --name mine
  autocompress study run --model ./my-model --mode weights --gpus-per-trial 1 --address auto \\
      --cache-dir /shared/autocompress --trials 40 --name gpu    # one trial per GPU of a Ray cluster
  autocompress study list
  autocompress study show demo
  autocompress study show smollm2-weights --test   # weights mode: the Pareto points on the test split too
  autocompress study export demo --format csv --out demo.csv
  autocompress study delete demo --yes
Running the same 'study run' command again continues each study to --trials trials."""

RUN_EXIT_CODES = """exit status:
  0    every target holds --trials trials (COMPLETE or stopped early) and at least one target has a
       feasible one
  1    a target ran trials and none of them completed (the first error is printed)
  2    bad input (one line on stderr naming the bad value); nothing was created
  3    trials completed but none is feasible on any target (the violated constraints are printed)
  130  interrupted (Ctrl-C): running trials were marked FAIL and re-queued; rerun the same
       command to resume (a second Ctrl-C quits at once)"""

EXIT_INFEASIBLE = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "study",
        "Pareto studies: Ray Tune runs trials, a persistent Optuna study (SQLite under "
        "studies/ by default) proposes the global architecture choices.",
        RUN_EXAMPLES,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser(
        "run",
        help="run or resume a study group",
        description="Run or resume a study group.\n\nexamples:" + RUN_EXAMPLES,
        epilog=RUN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config", type=Path, help="study YAML (keys = these flags with underscores); flags override it")
    run.add_argument("--model", help="parent model reference (default smollm2-135m)")
    run.add_argument("--targets", help="comma-separated hardware[:workload] (default rtx5070,rtx5080,h100-sxm,b200)")
    run.add_argument("--workload", help="workload for targets without one (default datacenter)")
    add_hardware_file(run)
    run.add_argument("--engine", help="serving engine (default: the workload's)")
    run.add_argument("--dtype", help="weight format (default: the workload's)")
    run.add_argument("--tp", type=int, help="tensor-parallel degree (default 1)")
    run.add_argument("--input-len", type=int, help="override the workload's prompt length")
    run.add_argument("--output-len", type=int, help="override the workload's output length")
    run.add_argument("--concurrency", type=concurrency, help="override the workload's concurrent requests (or 'max')")
    for flag, metric in (
        ("--max-ttft-ms", "ttft_ms"),
        ("--max-tpot-ms", "tpot_ms"),
        ("--min-throughput", "output_throughput_tok_s"),
        ("--max-memory-gib", "peak_memory_gib"),
    ):
        run.add_argument(
            flag, metavar="V|Rx", help=f"constraint on {metric}: absolute, or relative to the parent as 0.6x"
        )
    run.add_argument("--engine-option", action="append", default=None, metavar="KEY=VALUE", help="engine setting")
    run.add_argument(
        "--mode",
        help="trial mode (default plan: cost model, quality = retained-parameter fraction; "
        "weights: inner mask search, quality = exp(-KL to parent))",
    )
    run.add_argument(
        "--trials",
        type=int,
        help="trials wanted per target, COMPLETE or stopped early by --scheduler (default 40)",
    )
    run.add_argument(
        "--scheduler",
        metavar="asha|none",
        help="early stopping of weights-mode trials by Ray Tune's ASHA on their intermediate results (held-out "
        "KL plus a penalty for violated constraints, over inner-search steps): a trial outside the best third "
        "of its target's at an eighth or three eighths of its inner search is stopped and stored PRUNED, never "
        "on the Pareto front; "
        "'none' runs every trial to the end (default: asha in weights mode with more than 4 trials, else none)",
    )
    run.add_argument(
        "--proxy",
        type=int,
        metavar="K",
        help="weights mode: before the trials, rank the search space per target with the plan-mode proxy (cost "
        "model + retained importance, ~1.5 ms a point) and enqueue its K best feasible points; the proxy also "
        "screens the sampler's points, so a point whose uniform model it finds infeasible is stored PRUNED "
        "(proxy_infeasible) without running. 0: off (default 4 in weights mode)",
    )
    run.add_argument(
        "--time-budget",
        type=float,
        metavar="MINUTES",
        help="start no new trial after this many minutes of this run (trials in flight finish); with a large "
        "--trials, an equal-time study (default: none, --trials decides)",
    )
    run.add_argument("--name", help="study group name (default: the model name)")
    run.add_argument("--storage", help="Optuna storage: RDB URL or journal file (default sqlite:///studies/NAME.db)")
    run.add_argument(
        "--space",
        help="search-space YAML or bundled name (default: search_spaces/<model>.yaml if "
        "present, else derived from the parent)",
    )
    run.add_argument("--sampler", choices=["tpe", "nsga2", "gp", "random"], help="override the space's sampler")
    run.add_argument(
        "--objectives",
        help="comma-separated, e.g. quality:max,tpot_ms:min (default quality + the workload's primary metric)",
    )
    run.add_argument("--seed", type=int, help="sampler seed (default 0)")
    run.add_argument(
        "--parallel",
        type=int,
        help="trials running at once (default: as many as the cluster's GPUs hold when trials use GPUs, "
        "the GPUs / --gpus-per-trial; else 1)",
    )
    run.add_argument("--address", help="existing Ray cluster address (default: start a local Ray)")
    run.add_argument(
        "--gpus-per-trial",
        type=_gpus_per_trial,
        metavar="G",
        help="GPUs each trial holds under Ray: a fraction shares a GPU between small parents (0.5: two per GPU), "
        "a whole number k > 1 reserves k GPUs of one node for a parent that does not fit one (default: 1 in "
        "weights mode on a cluster with GPUs, else 0); each trial computes on the GPUs Ray assigned it",
    )
    run.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where trials keep the parent's importance, teacher log-probs and quality results (default "
        ".autocompress); on a multi-node cluster, storage mounted at the same path on every node, so the "
        "nodes share them",
    )
    run.add_argument(
        "--importance",
        metavar="DIR",
        help="plan mode: an importance record of the parent (saved by "
        "'autocompress prune' under .autocompress/importance/) → quality = retained importance",
    )
    add_data_arg(run, "weights-mode trials (same as the YAML key data: [code.jsonl:0.7, chat.parquet:0.3])")
    run.add_argument(
        "--inner",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="weights mode: per-trial settings, repeatable: inner-search keys (InnerConfig: steps=24, "
        "checkpoint_activations=true, ...) and data keys (TrialConfig: eval_samples=16, teacher_budget_gib=4, ...)",
    )
    run.add_argument(
        "--plugin",
        action="append",
        default=None,
        metavar="MODULE",
        help="import MODULE first (in the driver and every trial): it may register trial modes",
    )
    run.add_argument(
        "--seed-baselines",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="enqueue the depth, minitron and best-uniform baselines' points before the study's own samples "
        "(default: on in weights mode, off in plan mode)",
    )
    run.add_argument(
        "--allow-data-change",
        action="store_true",
        default=None,
        help="resume although the --data files now hold other rows than when the study began (refused otherwise)",
    )
    run.add_argument(
        "--seed-top-k",
        action="append",
        metavar="NAME=K",
        help="a scored seeded baseline (minitron, best-uniform) scores its K largest feasible candidates "
        "instead of its default (10, 20); repeatable, e.g. --seed-top-k minitron=3 --seed-top-k best-uniform=8. "
        "Fewer candidates: fewer forward passes before the first trial, possibly another (never larger) seed",
    )
    run.add_argument(
        "--confidence",
        type=float,
        help="judge every latency/throughput constraint at the pessimistic end of the cost model's interval "
        "at this level, e.g. 0.9 (from its held-out errors; default: the median prediction)",
    )
    run.add_argument(
        "--device",
        help="weights mode: where trials compute: auto (default: the first CUDA GPU, else the CPU), cpu, cuda, "
        "cuda:N (same as --inner device=...)",
    )
    run.add_argument(
        "--compute-dtype",
        help="weights mode: dtype of the trials' forward passes: auto (default: bf16 on CUDA, fp32 on the CPU), "
        "fast (auto, and bf16 on a CPU with AVX512-BF16 or AMX: about 2x faster there; the demo's), fp32, bf16, "
        "fp16; not the serving format --dtype",
    )
    run.add_argument(
        "--serve-as",
        metavar="ENGINE",
        help="every trial is a shape ENGINE loads (vllm, sglang, trtllm, llamacpp, transformers; FFN widths in its "
        "multiple, the same query heads in every layer, ...; see engines.rules), or any: no engine's rules "
        "(the package's own class serves every shape). Default: each target's engine (torch-eager: transformers)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(run=_run)

    lst = actions.add_parser("list", help="list studies under studies/ (or in --storage)")
    lst.add_argument("--storage", action="append", help="storage URL(s) to list (default every studies/*.db)")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(run=_list)

    show = actions.add_parser("show", help="Pareto table of a study group")
    show.add_argument("name", help="group name (or one study, NAME.hardware)")
    show.add_argument("--storage", help="storage URL (default sqlite:///studies/NAME.db)")
    show.add_argument("--all", action="store_true", help="every trial, not only the Pareto set")
    show.add_argument("--json", action="store_true")
    show.add_argument(
        "--test",
        action="store_true",
        help="weights mode: also score each Pareto point on the test split, which no trial read (the point's "
        "model rebuilt as its trial built it; the first time loads the parent and cuts each point, then cached)",
    )
    show.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the trials' caches, where --test finds the importance scores and keeps its results "
        "(default .autocompress: as for study run)",
    )
    show.set_defaults(run=_show)

    delete = actions.add_parser("delete", help="delete a study group (or one study) and its trials")
    delete.add_argument("name", help="group name (or one study, NAME.hardware)")
    delete.add_argument("--storage", help="storage URL (default sqlite:///studies/NAME.db)")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(run=_delete)

    exp = actions.add_parser("export", help="one row per trial as CSV or JSON")
    exp.add_argument("name")
    exp.add_argument("--storage")
    exp.add_argument("--format", choices=["csv", "json"], default="csv")
    exp.add_argument("--out", type=Path, help="file to write (default stdout)")
    exp.set_defaults(run=_export)


_DEFAULTS = {
    "model": "smollm2-135m",
    "targets": "rtx5070,rtx5080,h100-sxm,b200",
    "workload": "datacenter",
    "tp": 1,
    "mode": "plan",
    "trials": 40,
    "seed": 0,
}


_RUN_KEYS = (
    "model",
    "targets",
    "workload",
    "engine",
    "dtype",
    "tp",
    "input_len",
    "output_len",
    "concurrency",
    "max_ttft_ms",
    "max_tpot_ms",
    "min_throughput",
    "max_memory_gib",
    "engine_option",
    "mode",
    "trials",
    "name",
    "storage",
    "space",
    "sampler",
    "objectives",
    "seed",
    "parallel",
    "address",
    "plugin",
    "inner",
    "data",
    "importance",
    "seed_baselines",
    "seed_top_k",
    "scheduler",
    "proxy",
    "time_budget",
    "serve_as",
    "hardware_file",
    "confidence",
    "device",
    "compute_dtype",
    "gpus_per_trial",
    "cache_dir",
)


def _merged(args: argparse.Namespace) -> dict[str, Any]:
    import yaml

    from autocompress_opt.errors import ConfigError, suggest, yaml_problem

    values: dict[str, Any] = dict(_DEFAULTS)
    if args.config:
        if not args.config.is_file():
            raise ConfigError(f"study config {str(args.config)!r} does not exist")
        try:
            data = yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError:
            raise ConfigError(f"study config {str(args.config)!r} is not UTF-8 text") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"study config {str(args.config)!r} is not valid YAML ({yaml_problem(exc)})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"study config {str(args.config)!r} must be a mapping of keys, got {type(data).__name__}")
        valid = set(_RUN_KEYS)
        for key, value in data.items():
            key = key.replace("-", "_")
            if key not in valid:
                raise ConfigError(
                    f"unknown key {key!r} in {args.config}{suggest(key, valid)}; valid: {', '.join(sorted(valid))}"
                )
            values[key] = value
    values.update(
        {
            k: v
            for k, v in vars(args).items()
            if v is not None and v != [] and k not in ("run", "verb", "action", "config")
        }
    )
    return values


def _seed_top_k(value: Any) -> Any:
    """``seed_top_k`` from the YAML (a mapping, passed on) or the flags (``NAME=K`` strings)."""
    from autocompress_opt.errors import ConfigError

    if not isinstance(value, list):
        return value
    out: dict[str, Any] = {}
    for item in value:
        name, sep, k = str(item).partition("=")
        if not sep or not k.strip().isdigit():
            raise ConfigError(f"--seed-top-k {item!r}: expected NAME=K, e.g. minitron=3")
        out[name.strip()] = int(k)
    return out


def build_config(values: dict[str, Any]) -> Any:
    """Flags/YAML values → StudyConfig (the CLI's only logic)."""
    from autocompress_opt.arch.search_space import load_search_space
    from autocompress_opt.errors import check_int
    from autocompress_opt.search.study import Objective, StudyConfig
    from autocompress_opt.serving.targets import Target

    profiles = _hardware_profiles(values.get("hardware_file"))  # registered before the targets name them
    for key in ("tp", "input_len", "output_len", "concurrency"):  # 0 is an error, as in 'cost', not "the default"
        if values.get(key) is not None:
            check_int(values[key], key, also=("max",) if key == "concurrency" else ())
    constraints = {
        metric: str(values[key])
        for key, metric in (
            ("max_ttft_ms", "ttft_ms"),
            ("max_tpot_ms", "tpot_ms"),
            ("min_throughput", "output_throughput_tok_s"),
            ("max_memory_gib", "peak_memory_gib"),
        )
        if values.get(key)
    }
    targets = []
    raw_targets = values["targets"] if isinstance(values["targets"], list) else str(values["targets"]).split(",")
    for item in raw_targets:
        hardware, _, workload = str(item).strip().partition(":")
        targets.append(
            Target(
                hardware=hardware,
                workload=workload or values["workload"],
                engine=values.get("engine"),
                dtype=values.get("dtype"),
                tp=int(values["tp"]),
                input_len=values.get("input_len"),
                output_len=values.get("output_len"),
                concurrency=values.get("concurrency"),
                constraints=constraints,
                engine_options=engine_options(values.get("engine_option") or []),
                confidence=values.get("confidence"),
            )
        )
    model = str(values["model"])
    if values.get("space"):
        space = load_search_space(values["space"])
    else:
        bundled = REPO_SEARCH_SPACES / f"{model}.yaml"
        space = load_search_space(bundled) if bundled.is_file() else _default_space(model, str(values["mode"]))
    if values.get("sampler"):
        from dataclasses import replace

        space = replace(space, sampler=values["sampler"])
    objectives = (
        tuple(Objective.parse(o) for o in str(values["objectives"]).split(",")) if values.get("objectives") else ()
    )
    name = values.get("name") or Path(model).stem.replace(".", "-")
    return StudyConfig(
        name=name,
        model=model,
        targets=tuple(targets),
        space=space,
        trials=check_int(values["trials"], "trials"),
        objectives=objectives,
        mode=str(values["mode"]),
        storage=values.get("storage"),
        seed=check_int(values["seed"], "seed", minimum=0),
        concurrency=check_int(values["parallel"], "parallel") if values.get("parallel") is not None else None,
        address=values.get("address"),
        plugins=tuple(values.get("plugin") or ()),
        inner=_inner(values.get("inner"), values),
        importance=values.get("importance"),
        seed_baselines=values.get("seed_baselines"),
        seed_top_k=_seed_top_k(values.get("seed_top_k")),
        allow_data_change=bool(values.get("allow_data_change")),
        scheduler=values.get("scheduler"),
        proxy=values.get("proxy"),
        time_budget=values.get("time_budget"),
        serve_as=values.get("serve_as"),
        hardware=profiles,
        gpus_per_trial=values.get("gpus_per_trial"),
        cache_dir=values.get("cache_dir"),
    )


def _default_space(model: str, mode: str) -> Any:
    """The parent's default space; in weights mode a MoE parent's prunes its experts only (the expert
    trial's axes, :func:`~autocompress_opt.search.study.moe_study.expert_space`)."""
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.arch.hybrid import is_moe
    from autocompress_opt.arch.search_space import default_space

    parent = load_architecture(model)
    if mode == "weights" and is_moe(parent):
        from autocompress_opt.search.study.moe_study import expert_space

        return expert_space(parent)
    return default_space(parent)


def _gpus_per_trial(text: str) -> float:
    """``--gpus-per-trial`` as a number (the range is :class:`StudyConfig`'s check)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gpus per trial must be a number, e.g. 0.5, 1 or 2, got {text!r}") from None


def _hardware_profiles(raw: Any) -> tuple[dict[str, Any], ...]:
    """``--hardware-file`` paths (flags: a list; YAML: a path or a list) → the profiles they define,
    registered in the catalog (``serving.hardware.load_hardware_file``: collisions with built-in
    names or aliases are errors)."""
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.serving.hardware import load_hardware_file

    paths = [raw] if isinstance(raw, (str, Path)) else raw or []
    if not isinstance(paths, list) or not all(isinstance(p, (str, Path)) for p in paths):
        raise ConfigError(f"hardware_file must be a path or a list of paths, got {raw!r}")
    return tuple(item.to_dict() for path in paths for item in load_hardware_file(path))


def _inner(raw: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``{steps: 24}`` from YAML, or ``["steps=24"]`` from flags (or a YAML list), with ``--device`` /
    ``--compute-dtype``: :func:`~autocompress_opt.search.study.config.inner_settings`."""
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.search.study import inner_settings

    pairs = None if not raw else raw if isinstance(raw, dict) else setting_options(list(raw), "--inner")
    inner = inner_settings(
        pairs, mode=str(values.get("mode")), device=values.get("device"), compute_dtype=values.get("compute_dtype")
    )
    data = values.get("data")
    if data:  # --data (a list) or the YAML key (a spec or a list of them): the trials' text
        specs = [data] if isinstance(data, str) else data
        if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
            raise ConfigError(f"data must be a spec or a list of specs such as [code.jsonl:0.7], got {data!r}")
        if values.get("mode") != "weights":
            raise ConfigError(
                f"--data applies to weights mode (trials on the real model); this is {values.get('mode')} mode"
            )
        from autocompress_opt.data.user import resolve_data

        resolve_data(specs)  # the YAML's specs checked before any model loads, as --data's are (cli.main)
        inner["data"] = list(specs)
    return inner


def _run(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study import StudyInterrupted, binding_constraints, run_study, shared_answers

    try:
        config = build_config(_merged(args))
        outcomes = run_study(config, progress=not args.quiet)
    except (StudyInterrupted, KeyboardInterrupt) as exc:
        detail = str(exc) if isinstance(exc, StudyInterrupted) else ""
        print((detail + "\n" if detail else "") + "interrupted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    for o in outcomes:
        note = f", re-queued orphaned trials {o.repaired}" if o.repaired else ""
        stopped = f", {o.stopped} stopped early (PRUNED)" if o.stopped else ""
        screened = f"; the proxy kept {o.screened} infeasible points from running" if o.screened else ""
        print(f"{o.study_name}: {o.complete} COMPLETE trials, {o.feasible} feasible{stopped}{note}{screened}")
        for line in o.seeded:
            print(f"  seeded {line}")
        if o.failed:
            print(f"  {o.failed} trials FAILED; first error: {o.first_error}")
        if o.best is not None and o.best.architecture:
            from autocompress_opt.arch.architecture import Architecture

            arch = Architecture.from_dict(o.best.architecture)
            print(
                f"  best feasible: trial {o.best.number}, {arch.summary()}, quality {o.best.quality:.3f}; "
                f"binding: {', '.join(binding_constraints(o.best))}"
            )
    for line in shared_answers(outcomes):
        print(line)
    print(
        f"storage: {config.storage_url}\nnext: autocompress study show {config.name} --storage {config.storage_url}\n"
        f"      autocompress plot {config.name} --storage {config.storage_url}"
    )
    broken = [o for o in outcomes if o.completed_none]
    for o in broken:
        print(f"error: {o.study_name}: no trial completed; first error: {o.first_error}", file=sys.stderr)
    if broken:
        return 1
    if any(o.complete for o in outcomes) and not any(o.feasible for o in outcomes):
        print("error: no COMPLETE trial is feasible on any target; relax the binding constraints:", file=sys.stderr)
        for o in outcomes:
            print(
                f"  {o.study_name}: {o.complete} COMPLETE, 0 feasible; {_misses(o.misses, o.complete)}", file=sys.stderr
            )
        return EXIT_INFEASIBLE
    return 0


def _misses(misses: dict[str, tuple[int, float]], complete: int) -> str:
    """``"tpot_ms <= 0.5x missed by 12/12 (closest +31%)"`` for each violated constraint."""
    return "; ".join(f"{name} missed by {n}/{complete} (closest +{least:.0%})" for name, (n, least) in misses.items())


def _list(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study.studyio import list_studies

    urls = args.storage or [f"sqlite:///{p}" for p in sorted(Path("studies").glob("*.db"))]
    rows = [row for url in urls for row in list_studies(url)]
    if args.json:
        print_json(rows)
    elif not rows:
        print("no studies yet: run 'autocompress study run --help'")
    else:
        print(
            table(
                [[r["study"], str(r["trials"]), ",".join(r["directions"]), r["storage"]] for r in rows],
                ["study", "trials", "directions", "storage"],
            )
        )
    return 0


def _data_line(view: Any) -> str | None:
    """A weights study's text: the user's --data, or the built-in text its target's workload picks;
    and which split decided what (None for a plan-mode study, which reads no text)."""
    from autocompress_opt.search.study.weights_trial import TrialConfig

    identity = view.attrs.get("identity") or {}
    if identity.get("mode") != "weights":
        return None
    config = TrialConfig.from_dict(identity.get("inner") or None).for_workload(view.target.get("workload"))
    return (
        f"{config.data_label()} for the {view.target.get('workload')} workload; importance and inner-search training "
        "on its calibration split, the inner search's choice and the quality column on its selection split "
        "(the test split is for reported numbers: prune --from-study cards, eval)"
    )


def _test_scores(view: Any, cache_dir: str | None) -> dict[int, dict[str, Any]]:
    """``study show --test``: the test-split quality of each Pareto point of a weights study, by trial
    number (:func:`~autocompress_opt.search.study.testsplit.trial_test_quality`: computed once, cached)."""
    from autocompress_opt.search.study.placement import DEFAULT_CACHE_DIR
    from autocompress_opt.search.study.testsplit import trial_test_quality

    identity = view.attrs.get("identity") or {}
    if identity.get("mode") != "weights" or not identity.get("model"):
        return {}
    out = {}
    for record in view.pareto():
        arch = record.arch()
        if arch is None:
            continue
        out[record.number], _ = trial_test_quality(
            identity["model"],
            dict(identity.get("inner") or {}),
            arch,
            workload=view.target.get("workload"),
            cache_dir=cache_dir or DEFAULT_CACHE_DIR,
            kept=record.kept,
        )
    return out


def _test_line(scores: dict[int, dict[str, Any]]) -> str:
    """Which rows the test column is on, in words."""
    first = next(iter(scores.values()))
    domains = ", ".join(first["objective_domains"])
    return (
        f"test quality: exp(-KL) on the test split ({first['n_samples']} rows x {first['seq_len']} tokens per "
        f"domain; the objective's text: {domains}), documents no trial read; the Pareto points only"
    )


def _show(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study.studyio import load_group

    views = load_group(args.name, args.storage)
    tests = {v.name: _test_scores(v, args.cache_dir) if args.test else {} for v in views}
    if args.json:
        print_json(
            [
                {
                    "study": v.name,
                    "target": v.target,
                    "objectives": v.attrs.get("objectives"),
                    "quality": v.quality_label,
                    "quality_split": "selection" if (v.attrs.get("identity") or {}).get("mode") == "weights" else None,
                    "pareto": [
                        {**r.__dict__, **({"test": tests[v.name][r.number]} if r.number in tests[v.name] else {})}
                        for r in v.pareto()
                    ],
                }
                for v in views
            ]
        )
        return 0
    for view in views:
        states: dict[str, int] = {}
        for r in view.records:  # PRUNED: stopped early, screened out by the proxy, or a duplicate never run
            state = r.state if r.state != "PRUNED" else _pruned_kind(r)
            state += " (PRUNED)" if r.state == "PRUNED" else ""
            states[state] = states.get(state, 0) + 1
        feasible = sum(r.feasible for r in view.records)
        print(f"\n== {view.name}: {view.label}, objectives {', '.join(view.attrs.get('objectives', []))}")
        print("   trials: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + f"; {feasible} feasible")
        constraints = sorted({k for r in view.records for k in r.constraints})
        print("   constraints: " + ("; ".join(constraints) or "none"))
        for reason, numbers in _failures(view.records).items():
            print(f"   failed ({len(numbers)}): {reason} (trials {', '.join(f'#{n}' for n in numbers)})")
        data = _data_line(view)
        split = " on the selection split, which chose the points" if data else ""
        print(f"   quality: {view.quality_label}{split} (higher is better; 1.0 = the parent)")
        test = tests[view.name]
        if test:
            print(f"   {_test_line(test)}")
        elif data:
            print(f"   test split: `autocompress study show {view.name} --test` scores the Pareto points on it")
        if data:
            print(f"   data: {data}")
        counts = view.candidate_counts()
        if counts:
            picked = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            print(f"   inner search returned: {picked} (trained masks / greedy start point / uniform allocation)")
        shown = sorted(view.records, key=lambda r: r.number) if args.all else view.pareto()
        if not shown:
            print("   no feasible trial yet")
            continue
        moe = any(_experts(r.arch()) for r in shown)  # a MoE study: the expert sizes and active params
        rows = [
            [
                str(r.number) + (f" ({r.baseline})" if r.baseline else ""),
                _summary(r.arch()),
                *([_experts(r.arch()) or "-", *_param_counts(r.arch())] if moe else []),
                f"{r.quality:.3f}" if r.quality is not None else "-",
                *(
                    f"{r.metrics.get(k, float('nan')):,.2f}"
                    for k in ("ttft_ms", "tpot_ms", "output_throughput_tok_s", "peak_memory_gib")
                ),
                "yes" if r.feasible else ("no" if r.state == "COMPLETE" else _state(r)),
                *([_candidate(r.selection)] if counts else []),
                *([f"{test[r.number]['quality']:.3f}" if r.number in test else "-"] if test else []),
            ]
            for r in shown
        ]
        header = ["#", "architecture", *(["experts", "params", "active"] if moe else [])]
        header += ["quality (selection)" if data else "quality", "ttft_ms", "tpot_ms", "tok/s", "mem_gib", "feasible"]
        print(table(rows, header + (["inner (val KL)"] if counts else []) + (["test quality"] if test else [])))
    return 0


def _delete(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study import default_storage, delete_studies, group_members

    url = args.storage or default_storage(args.name.split(".")[0])
    names = group_members(args.name, url)
    if not args.yes:
        try:
            answer = input(f"delete {', '.join(names)} (every trial) from {url}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted", file=sys.stderr)
            return 1
    delete_studies(url, names)
    print(f"deleted {', '.join(names)} from {url}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study.studyio import export_rows, load_group, rows_to_csv

    rows = [row for view in load_group(args.name, args.storage) for row in export_rows(view)]
    text = rows_to_csv(rows) if args.format == "csv" else json.dumps(rows, indent=2, default=str)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _pruned_kind(record: Any) -> str:
    """Why a PRUNED trial has no result: stopped early by the scheduler, kept from running by the
    proxy (``proxy infeasible``), or a duplicate point never run."""
    if record.stopped_early:
        return "stopped early"
    return "proxy infeasible" if record.proxy_infeasible else "duplicate"


def _state(record: Any) -> str:
    """The feasible column of a trial that did not complete: ``stopped 6/24`` for one the scheduler
    stopped early, ``proxy`` for a point the proxy kept from running, else its state (``pruned``: a
    duplicate point, ``fail``, ``running``)."""
    early = record.stopped_early
    if early:
        return f"stopped {early.get('inner_step')}/{early.get('inner_steps')}"
    if record.proxy_infeasible:
        return "proxy"
    return str(record.state).lower()


def _failures(records: Any) -> dict[str, list[int]]:
    """FAIL trials grouped by their error's first line, in trial order."""
    from autocompress_opt.search.study import first_line

    out: dict[str, list[int]] = {}
    for r in sorted(records, key=lambda r: r.number):
        if r.state == "FAIL":
            out.setdefault(first_line(r.error) or "no error recorded", []).append(r.number)
    return out


def _candidate(selection: dict[str, Any] | None) -> str:
    """``"uniform 0.412 (trained 0.430, start 0.425)"``: the returned candidate's held-out calibration
    KL, then the others' ("-" for one not measured); "-" without a record."""
    if not selection or not selection.get("chosen"):
        return "-"
    chosen = selection["chosen"]
    if selection.get("stopped_at_step") is not None:  # a seeded trial stopped early: its baseline's own model
        return f"{chosen}'s own model (search stopped at step {selection['stopped_at_step']})"
    kls = selection.get("val_kl", {})
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    others = ", ".join(f"{n} {fmt(v)}" for n, v in kls.items() if n != chosen)
    return f"{chosen} {fmt(kls.get(chosen))}" + (f" ({others})" if others else "")


def _experts(arch: Architecture | None) -> str:
    """``"4 x 8ch, top-2"``: the routed experts, their width and top-k of a MoE architecture's MoE
    layers (one size per layer kind), then a shared expert's width and a hybrid's Mamba-2 heads
    (``"5 x 8ch, top-1, shared 30ch; 6 SSM heads"``); "" for a dense one or none."""
    sizes = sorted({(m.num_experts, m.expert_width, m.experts_per_token, m.shared_width) for m in _moe_specs(arch)})
    text = ", ".join(f"{e} x {w}ch, top-{k}" + (f", shared {s}ch" if s else "") for e, w, k, s in sizes)
    layers = [] if arch is None else [layer for layer in arch.layers if not layer.is_noop]
    heads = {layer.mamba.num_heads for layer in layers if layer.mamba is not None}
    return text + "".join(f"; {h} SSM heads" for h in sorted(heads))


def _moe_specs(arch: Architecture | None) -> list[Any]:
    return [] if arch is None else [layer.moe for layer in arch.layers if layer.moe is not None and not layer.is_noop]


def _param_counts(arch: Architecture | None) -> list[str]:
    """The total and active (per token) parameters of ``arch``, e.g. ``["30.5B", "3.3B"]``."""
    if arch is None:
        return ["-", "-"]
    return [_count(arch.num_params), _count(arch.active_params())]


def _count(n: float) -> str:
    """A parameter count with a unit: 412.3K, 30.5M, 3.35B (three significant digits)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _summary(arch: Architecture | None) -> str:
    """An architecture's one-line summary without its name, or "-" when the trial recorded none."""
    return arch.summary().split(": ", 1)[-1] if arch is not None else "-"
