"""``autocompress study run``: its flags, exit codes and what it prints; the flags become a
:class:`~autocompress_opt.search.study.StudyConfig` in :mod:`.config`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autocompress_opt.cli._common import add_data_arg, add_hardware_file, concurrency
from autocompress_opt.cli.study.config import build_config, gpus_per_trial, merged

if TYPE_CHECKING:
    from autocompress_opt.search.study.records import TargetOutcome

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


def add_parser(actions: Any) -> None:
    """The ``run`` action and its flags (keys of a study YAML too: :data:`.config.RUN_KEYS`)."""
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
    run.add_argument(
        "--finalists",
        type=int,
        metavar="K",
        help="weights mode, after the trials: each target's K best feasible trials distilled alike for a few "
        "steps and ranked again on the selection rows ('study finalists' with its defaults; about K x 30 training "
        "steps per target); prune --trial recovered exports the chosen one. 0: off (default)",
    )
    run.add_argument("--name", help="study group name (default: the model name)")
    run.add_argument("--storage", help="Optuna storage: RDB URL or journal file (default sqlite:///studies/NAME.db)")
    run.add_argument(
        "--space",
        help="search-space YAML or bundled name (default: search_spaces/<model>.yaml if "
        "present, else derived from the parent); part of a study's identity: a resume with another space is refused",
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
        type=gpus_per_trial,
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
        "--driver-device",
        metavar="DEVICE",
        help="where this process reads the parent to choose the seeded baselines and the proxy's points: cpu "
        "(default, also on a head node without GPUs) or cuda / cuda:N, a GPU of this machine's; the trials "
        "compute on the GPUs Ray assigns them whatever this says",
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
        "checkpoint_activations=true, ...) and data keys (TrialConfig: eval_samples=16, teacher_budget_gib=4, "
        "start_from=block-library, ...)",
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
        "--plan-quality",
        choices=("params", "estimate", "estimate-per-layer"),
        help="plan mode without --importance: rank points by the fraction of parameters kept (params, default) "
        "or by exp(-KL) of the per-axis quality estimate fitted on measured KL (estimate: depth, hidden, FFN, "
        "heads, experts, expert width, experts per token priced separately); estimate-per-layer also sizes "
        "layers apart by the estimate's layer profile, where the engine loads the result: each MoE layer's "
        "expert width and experts per token (the Puzzle form: Nemotron-H served by llama.cpp or serve_as "
        "any), or each dense FFN's width (the DeciLM form)",
    )
    run.add_argument(
        "--proxy-quality",
        choices=("importance", "estimate"),
        help="weights mode: what ranks the proxy's points: the parent's importance they keep (importance, "
        "default) or exp(-KL) of the per-axis quality estimate fitted on measured KL (estimate)",
    )
    run.add_argument(
        "--runners-up",
        type=int,
        metavar="K",
        help="weights mode: after the baselines, also seed best-uniform's K next-best scored candidates "
        "(uniform models near the best one, where the inner search has room to make a trial heterogeneous; "
        "each costs one trial that early stopping does not cut). 0: none (default 2 in weights mode)",
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


def _run(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study import StudyInterrupted, binding_constraints, run_study, shared_answers

    try:
        config = build_config(merged(args))
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
    if config.finalists:
        _finalists(config, outcomes, quiet=args.quiet)
    elif config.mode == "weights" and any(o.feasible for o in outcomes):
        # the trials ranked their models before recovery; the shipped model is distilled first
        study = next(o.study_name for o in outcomes if o.feasible)
        print(f"      autocompress study finalists {study} --storage {config.storage_url}   # rank after recovery")
    return exit_status(outcomes)


def _finalists(config: Any, outcomes: Sequence[TargetOutcome], *, quiet: bool) -> None:
    """``--finalists K``: each target's K best trials ranked again after the same short recovery."""
    from autocompress_opt.cli.study.finalists import print_ranking
    from autocompress_opt.recover.finalists import FinalistRecipe, rank_finalists

    recipe = FinalistRecipe(top=config.finalists)
    for o in outcomes:
        if not o.feasible:
            continue
        print(f"{o.study_name}: ranking its {config.finalists} best trials again after {recipe.steps} recovery steps")
        ranking = rank_finalists(
            config.storage_url, o.study_name, recipe, cache_dir=config.cache_dir, progress=not quiet
        )
        print_ranking(ranking)
        print(f"      autocompress prune --from-study {o.study_name} --storage {config.storage_url} --trial recovered")


def exit_status(outcomes: Sequence[TargetOutcome]) -> int:
    """The run's exit status (docs/studies.md "Exit codes"), printing why on stderr when it is not 0:
    1 when a target's trials all failed, or when a target's study holds no COMPLETE trial and
    nothing failed (every point the sampler proposed was screened out as infeasible, or none was
    left to run): an empty study is not a result, unless the run's time budget ended first (a
    warning says so); 3 when trials completed but none is feasible."""
    broken = [o for o in outcomes if o.completed_none]
    for o in broken:
        print(f"error: {o.study_name}: no trial completed; first error: {o.first_error}", file=sys.stderr)
    empty = [o for o in outcomes if o.complete == 0 and not o.completed_none]
    for o in [o for o in empty if o.out_of_time]:  # the time budget's choice, not a failure: said, exit 0
        print(
            f"warning: {o.study_name}: the time budget ended before any trial of this target completed; "
            "rerun the same command to continue it, or give a larger --time-budget",
            file=sys.stderr,
        )
    empty = [o for o in empty if not o.out_of_time]
    for o in empty:
        why = (
            f"the proxy found all {o.screened} points the sampler proposed infeasible" if o.screened else "no trial ran"
        )
        print(
            f"error: {o.study_name}: the study has no COMPLETE trial: {why}; relax the constraints "
            "(--min-throughput, --max-tpot-ms, ...) or widen the search space (--space), then rerun",
            file=sys.stderr,
        )
    if broken or empty:
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
