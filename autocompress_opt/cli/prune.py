"""``autocompress prune``: prune a real model by importance and export it.

Four modes: ``--params`` is the practitioner's parameter-target recipe (a uniform architecture
chosen by parameter count, :func:`~autocompress_opt.prune.baselines.uniform_baseline`); ``--arch``
exports a given (e.g. searched, heterogeneous) architecture; ``--baseline`` chooses a uniform model
under a serving target's constraints (``minitron``, ``depth`` or ``best-uniform``) exactly as a study
seeds it (:func:`~autocompress_opt.search.study.seeding.choose_baseline`, scored by
:func:`~autocompress_opt.search.study.seeding.baseline_scorer` on the study's choice rows, importance
of the study's trials, snapped onto the study's search space). These
score the parent on calibration text (cached), keep the most important layers/heads/channels, and
write a checkpoint with a model card. ``--from-study`` exports a study trial's model exactly as the
trial built it: its architecture cut with the trial's own importance scores (same data, same
cache), so the kept layers, heads and channels are the ones the trial measured.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import (
    add_compute_args,
    add_data_arg,
    add_verb,
    check_output_dir,
    check_positive,
    compute_of,
)
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.baselines import BASELINE_WIDTHS, BASELINES
from autocompress_opt.prune.importance import LAYER_METRICS

_DEFAULT_CACHE = Path(".autocompress") / "importance"
_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9}
# --baseline's target flags: (flag, Target field or constrained metric)
_TARGET_FLAGS = (("--hardware", "hardware"), ("--workload", "workload"), ("--engine", "engine"), ("--dtype", "dtype"))
_CONSTRAINT_FLAGS = (
    ("--max-ttft-ms", "ttft_ms"),
    ("--max-tpot-ms", "tpot_ms"),
    ("--min-throughput", "output_throughput_tok_s"),
    ("--max-memory-gib", "peak_memory_gib"),
)


def param_budget(text: str) -> float:
    """``"0.6"`` → 0.6 (a fraction of the parent); ``"80M"`` / ``"1.5B"`` / ``"80000000"`` → a count."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbB]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"--params must be a fraction like 0.6 or a count like 80M or 1.5B, got {text!r}"
        )
    value = float(match[1]) * _SUFFIXES[match[2].lower()]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--params must be positive, got {text!r}")
    if value > 1 and value != int(value):
        raise argparse.ArgumentTypeError(
            f"--params must be a fraction in (0, 1] like 0.6 or a whole count like 80M, got {text!r}"
        )
    return value


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "prune",
        "Prune a model by importance (Minitron-style) and export the checkpoint.",
        """
  autocompress prune --model smollm2-135m --params 0.6 --out pruned/smollm2-0.6
  autocompress prune --model ./my-llama --params 80M --max-layer-drop 0.1 --out pruned/llama-80m --force
  autocompress prune --model smollm2-135m --arch searched.json --out pruned/smollm2-rtx5070
  autocompress prune --model smollm2-135m --baseline depth --hardware rtx5080 --workload local-coding \\
      --out pruned/smollm2-depth-rtx5080
  autocompress prune --model smollm2-135m --baseline minitron --hardware b200 --workload datacenter \\
      --top-k 10 --score-samples 8 --out pruned/smollm2-minitron-b200
  autocompress prune --from-study smollm2-weights.rtx5070 --out pruned/smollm2-rtx5070
  autocompress prune --from-study demo.h100-sxm --trial 7 --storage sqlite:///studies/demo.db --out pruned/t7

--params picks a UNIFORM architecture by parameter count, as a practitioner without a hardware model
would: drop the least important layers (at most --max-layer-drop of them), then shrink every FFN to
the widest multiple of --width-multiple that meets the budget (--width hidden+ffn: shrink hidden size
and FFN by one ratio, Minitron's width recipe, which also cuts the embeddings). --arch exports the given architecture
(a file written by Architecture.save, possibly heterogeneous).

--baseline chooses a uniform model that meets the target's constraints (--hardware, --workload, the
workload's constraints, overridden by --max-ttft-ms etc.) by the same cost model as the search, among
the shapes the target's engine loads (--serve-as overrides the engine):
  minitron      ModelOpt's Minitron search: uniform candidates cutting at most 40 % of each width
                (hidden, FFN, KV groups, query heads) and 20 % of the layers; the --top-k feasible
                ones with the most parameters are scored by KL to the parent and the lowest wins.
                When nothing inside the limits is feasible it says so and searches again with the
                limits lifted.
  depth         the deepest feasible model at full width, layers dropped in ShortGPT's
                block-influence order or in Minitron's LM-loss (skip_loss) order, whichever
                scores lower (--layer-metric fixes one; without a score: block influence).
  best-uniform  the lowest-KL of the --top-k largest feasible uniform models on the whole grid
                (each not contained in another feasible one).
This is the one implementation a study seeds its baselines with: the same importance (the study
trials', on the workload's calibration text: --samples, --seq-len, --seed set importance_samples,
importance_seq_len, data_seed), the same score (KL to the parent on the inner search's choice rows of
the selection split, never the study objective's rows: --score-samples sets inner.val_samples,
default 16; 0 ranks by parameters alone), the choice snapped onto the study's search space (--space,
default the bundled search_spaces/MODEL.yaml or the one derived from the parent). Pass a study's
--inner settings to reproduce its seed. It prints what it considered and chose, and the model card
records it.

--from-study STUDY exports a trial of a study (NAME.HARDWARE, or a group NAME with one target):
--trial best (default: the feasible trial with the highest quality), recovered (the finalist
'autocompress study finalists' chose: the lowest KL after the same short recovery) or a trial
number. The parent is the study's model (--model, if given, must name the same). A weights-mode
trial is cut with the importance scores the trial itself used (its inner settings, from the same
.autocompress cache), so the export is the model the trial measured; a plan-mode trial is cut like
--arch.""",
    )
    p.add_argument(
        "--model",
        help="parent: a known name (smollm2-135m), an HF directory or a .gguf (required, except with --from-study)",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--params", type=param_budget, help="parameter budget: a fraction (0.6) or a count (80M)")
    target.add_argument("--arch", help="architecture .json/.yaml to materialise (a sub-architecture of the parent)")
    target.add_argument("--baseline", choices=BASELINES, help="a uniform baseline under --hardware/--workload")
    target.add_argument("--from-study", metavar="STUDY", help="export a study trial as it was built (NAME.HARDWARE)")
    p.add_argument("--out", required=True, help="output checkpoint directory")
    p.add_argument("--force", action="store_true", help="replace --out if it exists and is not empty")
    p.add_argument(
        "--mtp",
        choices=("drop", "keep"),
        default="drop",
        help="the parent's multi-token-prediction layers (num_nextn_predict_layers, e.g. Nemotron 3 Super): drop "
        "them (default; the export's config then says 0) or keep them, copied unchanged from the parent's "
        "checkpoint folder (needs a local --model folder and the parent's hidden size); the card says which",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=8,
        help="calibration sequences for the importance pass (default 8; it costs (samples / batch-size) x "
        "(layers + 1) forward passes: 62 for SmolLM2-135M, cached afterwards; more rows, steadier scores)",
    )
    p.add_argument("--seq-len", type=int, default=128, help="tokens per calibration sequence (default 128)")
    p.add_argument("--seed", type=int, default=0, help="calibration sampling seed (default 0)")
    add_data_arg(p, "importance (its calibration split) and a --baseline's candidate scoring (its selection split)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per forward pass (default 4)")
    p.add_argument(
        "--layer-metric",
        choices=LAYER_METRICS,
        default=None,
        help="layer importance used to choose dropped layers (default skip_loss; --baseline depth: the "
        "better-scoring of block_influence and skip_loss)",
    )
    p.add_argument(
        "--max-layer-drop",
        type=float,
        default=0.25,
        help="--params only: most layers the recipe drops before shrinking width, as a fraction (default 0.25)",
    )
    p.add_argument(
        "--width-multiple", type=int, default=64, help="--params only: FFN (and hidden) width granularity (default 64)"
    )
    p.add_argument(
        "--width",
        choices=BASELINE_WIDTHS,
        default="ffn",
        help="--params only: what the width step shrinks: the FFN alone (default), or hidden size and "
        "FFN by one ratio (hidden+ffn; needed when the embeddings exceed the budget)",
    )
    base = p.add_argument_group("--baseline only: the serving target and the candidates' score")
    base.add_argument("--hardware", help="GPU of the target (see 'autocompress hardware')")
    base.add_argument("--workload", help="workload of the target: its scenario and constraints (e.g. local-coding)")
    base.add_argument("--engine", help="serving engine (default: the workload's)")
    base.add_argument("--dtype", help="weight format (default: the workload's)")
    for flag, metric in _CONSTRAINT_FLAGS:
        base.add_argument(
            flag, metavar="V|Rx", help=f"constraint on {metric}: absolute, or relative to the parent (0.6x)"
        )
    base.add_argument(
        "--top-k", type=int, default=None, help="candidates scored (default 10 for minitron, 20 for best-uniform)"
    )
    base.add_argument(
        "--score-samples",
        type=int,
        default=None,
        help="selection rows the KL score reads: a study's inner.val_samples, the inner search's choice rows, "
        "none of them a row of the study's objective (default 16; 0: rank by parameters)",
    )
    base.add_argument(
        "--space",
        default=None,
        help="search space the choice is snapped onto, as a study's --space (default: the bundled "
        "search_spaces/MODEL.yaml, else the space derived from the parent)",
    )
    base.add_argument(
        "--inner",
        action="append",
        metavar="KEY=VALUE",
        default=None,
        help="a study's inner setting (repeatable, as 'study run --inner'): those that decide the importance and "
        "score rows (seq_len, val_samples, eval_samples, eval_seq_len, eval_seed, data_domain, ...) make the "
        "choice the study's seed; they take precedence over --samples, --seq-len, --seed, --score-samples",
    )
    p.add_argument(
        "--cache-dir",
        default=str(_DEFAULT_CACHE),
        help=f"importance cache folder (default {_DEFAULT_CACHE}, where a study keeps its trials' importance); "
        "scores are reused across runs",
    )
    study = p.add_argument_group("--from-study only")
    study.add_argument(
        "--trial",
        default=None,
        help="'best' (default), 'recovered' (the finalist 'study finalists' chose after recovery) or a trial number",
    )
    study.add_argument("--storage", default=None, help="study storage (default sqlite:///studies/NAME.db)")
    p.add_argument(
        "--serve-as",
        metavar="ENGINE",
        default=None,
        help="check the result against what ENGINE loads (vllm, sglang, trtllm, llamacpp, transformers) before "
        "anything is written, and export a heterogeneous model in DeciLM form (nemotron-nas) that vLLM and "
        "llama.cpp read; without it a heterogeneous export uses the package's own class",
    )
    add_compute_args(p, note="; --from-study: the study's unless given")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    compute_of(args)  # a bad or absent device fails before anything else
    if args.from_study is not None:
        return _run_from_study(args)
    if args.trial is not None or args.storage is not None:
        raise ConfigError("--trial and --storage only apply with --from-study")
    if args.model is None:
        raise ConfigError("--model is required (the parent to prune), except with --from-study")
    serving_target = _serving_target(args)  # argument checks before the model loads
    if serving_target is not None:  # the study settings and space --baseline reads, checked as early
        _baseline_trial(args, serving_target)
        _study_space(args)
    _check_out(Path(args.out).expanduser(), force=args.force)
    _check_mtp(args, args.model)
    arch_file = _arch_file(args)
    if arch_file is not None:
        _decilm_for(args, arch_file)
    _check_budget(args)
    return _prune(args, serving_target, arch_file)


def _prune(args: argparse.Namespace, serving_target: Any, arch_file: Any, study: dict[str, Any] | None = None) -> int:
    """Load the parent, score it, choose or take the architecture, cut and export (``study``: the
    recipe and card record of a plan-mode study trial exported as ``arch_file``)."""
    from autocompress_opt.hf.adapters import adapter_for
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.export import export_model
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize

    loaded = load_model(args.model, **compute_of(args), cache=False)  # one copy of the parent, not two
    adapter = adapter_for(loaded.model)
    parent = adapter.architecture(loaded.model)
    metric = args.layer_metric or ("block_influence" if args.baseline == "depth" else "skip_loss")
    if serving_target is not None:  # the importance a study's trials use, so the choice is the study's seed
        target, recipe, importance = _baseline(args, loaded, serving_target, parent)
    elif study is not None:
        importance = _importance(args, loaded, adapter)
        target, recipe = arch_file, study["recipe"]
    else:
        importance = _importance(args, loaded, adapter)
        if args.params is not None:
            _check_params(args.params, parent)
        target, recipe = _target(args, parent, arch_file)
    plan = plan_pruning(parent, importance, target, layer_metric=metric)
    decilm = _decilm_for(args, plan.architecture)  # before anything is written
    pruned = materialize(loaded.model, plan, adapter=adapter)
    card = {
        "recipe": {**recipe, "layer_metric": metric},
        "kept_parent_layers": [lp.parent_index for lp in plan.layers],
        "importance": {
            "method": importance.meta.method,
            "data_id": importance.meta.data_id,
            "base_loss": importance.meta.base_loss,
        },
        **({"data": args.data_record} if getattr(args, "data_record", None) else {}),
        **({"study_result": study["result"]} if study is not None else {}),
    }
    parent_record = {"model": str(args.model), "source": loaded.source, "num_params": parent.num_params}
    out = export_model(
        pruned,
        plan.architecture,
        args.out,
        parent=parent_record,
        card=card,
        tokenizer=loaded.tokenizer,
        force=args.force,
        decilm=decilm,
        mtp=args.mtp,
        parent_dir=loaded.path if loaded.path.is_dir() else None,
    )
    print(
        f"parent: {parent.summary()}\npruned: {plan.architecture.summary()} "
        f"({plan.architecture.num_params / parent.num_params:.1%} of the parent)\nwrote {out}"
    )
    return 0


def _run_from_study(args: argparse.Namespace) -> int:
    """``--from-study``: the chosen trial's architecture, cut with the importance the trial used."""
    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.search.study import group_members, load_records, resolve_storage

    trial = _trial_choice(args.trial)
    _check_out(Path(args.out).expanduser(), force=args.force)
    group = args.from_study.split(".", 1)[0]
    storage = resolve_storage(args.storage or f"sqlite:///studies/{group}.db")
    members = group_members(args.from_study, storage)
    if len(members) != 1:
        raise ConfigError(
            f"--from-study {args.from_study!r} names {len(members)} studies ({', '.join(members)}); name one of them"
        )
    [name] = members
    records, attrs = load_records(storage, name)
    identity = attrs.get("identity") or {}
    model = identity.get("model")
    if not model:
        raise ConfigError(f"study {name!r} in {storage} records no parent model; export its architecture with --arch")
    if args.model is not None and args.model != model:
        raise ConfigError(f"--model {args.model!r} is not the study's parent {model!r}; drop --model or pass that one")
    number = trial if not isinstance(trial, str) else None
    if trial == "recovered":  # the finalist `study finalists` chose after recovery
        from autocompress_opt.recover.finalists import stored_ranking

        ranking = stored_ranking(storage, name)
        number, args.finalists_record = ranking.chosen.trial, ranking.to_dict()
        print(f"{name}: trial {number}, the finalist with the lowest KL after recovery (study finalists)")
    record = _pick_trial(records, number, name)
    _check_mtp(args, model)
    arch = Architecture.from_dict(record.architecture or {})
    if identity.get("mode") != "weights":
        args.model, args.arch = model, None
        return _export_architecture(args, replace(arch, name=Path(args.out).name), name, record)
    workload = (identity.get("target") or {}).get("workload")
    return _export_trial(args, model, dict(identity.get("inner") or {}), arch, name, record, workload)


def _check_mtp(args: argparse.Namespace, model: str) -> None:
    """``--mtp keep`` needs the parent's folder with its MTP weights: checked before any work."""
    if getattr(args, "mtp", "drop") == "keep":
        from autocompress_opt.prune.mtp import check_mtp_keep

        check_mtp_keep(model)


def _trial_choice(text: str | None) -> int | str | None:
    """``--trial``: None for best, ``"recovered"`` for the finalist chosen after recovery, else a
    trial number."""
    if text is None or text == "best":
        return None
    if text == "recovered":
        return text
    try:
        number = int(text)
    except ValueError:
        raise ConfigError(f"--trial must be 'best', 'recovered' or a trial number, got {text!r}") from None
    if number < 0:
        raise ConfigError(f"--trial must be 'best', 'recovered' or a trial number >= 0, got {text!r}")
    return number


def _pick_trial(records: Any, number: int | None, name: str) -> Any:
    """The trial ``number`` (COMPLETE, with an architecture), or the best feasible one."""
    done = [r for r in records if r.state == "COMPLETE" and r.architecture]
    if number is not None:
        match = [r for r in records if r.number == number]
        if not match:
            raise ConfigError(f"study {name!r} has no trial {number}; trials: 0..{len(records) - 1}")
        if match[0] not in done:
            raise ConfigError(f"trial {number} of {name!r} is {match[0].state}, not a COMPLETE trial with a model")
        return match[0]
    pool = [r for r in done if r.feasible and r.quality is not None]
    if not pool:
        raise ConfigError(f"study {name!r} has no feasible COMPLETE trial; pass --trial N to export another one")
    return max(pool, key=lambda r: (r.quality, -r.number))


def _export_trial(
    args: argparse.Namespace,
    model: str,
    inner: dict[str, Any],
    arch: Any,
    name: str,
    record: Any,
    workload: str | None = None,
) -> int:
    """A weights-mode trial: the parent loaded as the trial had it, cut with the kept indices the
    trial stored (:func:`~autocompress_opt.search.study.export.export_trial`): the trial's model on
    any device and in any dtype. A trial stored without them (before trials recorded them) is cut by
    importance recomputed here from its settings, with a warning. The card carries the trial's
    result (measured on the selection split, which chose it) and the model's quality on the test
    split (``test``: never used to choose anything)."""
    from autocompress_opt.prune.expert_kept import is_expert_kept, masks_from_expert_kept
    from autocompress_opt.prune.plan import plan_from_kept, plan_pruning
    from autocompress_opt.prune.slicing import materialize
    from autocompress_opt.quality.metrics import evaluate
    from autocompress_opt.search.study import export_trial, trial_model, trial_parent

    overrides = {k: v for k, v in (("device", args.device), ("compute_dtype", args.compute_dtype)) if v is not None}
    context: Any
    if record.kept and is_expert_kept(record.kept):  # a MoE trial: its kept experts and channels
        from autocompress_opt.prune.experts import slice_experts

        context, config = trial_model(model, {**inner, **overrides}, workload=workload)
        masks = masks_from_expert_kept(context.architecture, record.kept)
        cut: Any = lambda: slice_experts(context.model, masks)
    elif record.kept:
        context, config = trial_model(model, {**inner, **overrides}, workload=workload)
        plan = plan_from_kept(context.architecture, arch, record.kept)
        cut = lambda: materialize(context.model, plan)
    else:
        context, config = trial_parent(model, {**inner, **overrides}, workload=workload)
        weight = next(context.model.parameters())
        print(
            f"warning: trial {record.number} of {name!r} stores no kept indices (it ran before trials recorded "
            f"them): its channels are chosen again by importance computed here ({weight.device}, "
            f"{str(weight.dtype).removeprefix('torch.')}), which picks the trial's channels only where it "
            "ranks them as the trial's device and dtype did",
            file=sys.stderr,
        )
        plan = plan_pruning(context.architecture, context.importance, arch)
        cut = lambda: materialize(context.model, plan)
    child = cut()
    test = evaluate(
        child,
        context.tokenizer,
        parent=context.model,
        n_samples=config.eval_samples,
        seq_len=config.eval_seq_len,
        seed=config.eval_seed,
        data=config.data or None,
        progress=False,
    )
    del child
    card = {
        "recipe": {"mode": "study-trial", "study": name, "trial": record.number, "inner": config.to_dict()},
        "study_result": {
            "split": "selection",
            "quality": record.quality,
            "metrics": record.metrics,
            "selection": record.selection,
        },
        "test": {"split": "test", **test.to_dict()},
        **({"finalists": args.finalists_record} if getattr(args, "finalists_record", None) else {}),
    }
    exported = export_trial(
        context,
        arch,
        args.out,
        kept=record.kept or None,
        parent={"model": model, "num_params": context.architecture.num_params},
        card=card,
        force=args.force,
        decilm=_decilm_for(args, arch),
        mtp=args.mtp,
        parent_dir=model if Path(model).expanduser().is_dir() else None,
    )
    built = exported.plan.architecture if exported.plan is not None else arch  # None: a MoE trial's experts
    print(
        f"study {name}, trial {record.number}: {built.summary()} "
        f"({built.num_params / context.architecture.num_params:.1%} of the parent)\n"
        f"test split: KL to parent {test.kl_to_parent:.5f} nats, perplexity code {test.ppl_code:.3f}, "
        f"prose {test.ppl_prose:.3f}\nwrote {exported.path}"
    )
    return 0


def _export_architecture(args: argparse.Namespace, arch: Any, name: str, record: Any) -> int:
    """A plan-mode trial: cut like ``--arch`` with this command's calibration settings."""
    print(f"study {name}, trial {record.number}")
    study = {
        "recipe": {"mode": "study-trial", "study": name, "trial": record.number},
        "result": {"quality": record.quality, "metrics": record.metrics},
    }
    return _prune(args, None, arch, study)


def _decilm_for(args: argparse.Namespace, arch: Any) -> bool:
    """``--serve-as ENGINE``: a :class:`ConfigError` naming every reason ENGINE cannot load ``arch``
    (``engines.rules.loadable_problems``); True when the export must be DeciLM (a heterogeneous model
    for an engine other than transformers). Without the flag: False, nothing checked."""
    if args.serve_as is None:
        return False
    from autocompress_opt.prune.loadability import loadable_problems

    problems = loadable_problems(arch, args.serve_as)
    if problems:
        raise ConfigError(f"--serve-as {args.serve_as}: {arch.summary()} cannot be served: {'; '.join(problems)}")
    return args.serve_as != "transformers" and not arch.active().is_uniform


def _check_out(out: Path, *, force: bool) -> None:
    """:class:`ConfigError` unless ``out`` can receive the checkpoint: a writable folder (or one that
    can be created; :func:`check_output_dir`), empty unless ``force``. Cheap: nothing is loaded."""
    check_output_dir(out)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"--out {str(out)!r} is not empty; pass --force to replace it")


def _arch_file(args: argparse.Namespace) -> Any:
    """The architecture ``--arch`` names (None without it), read before the model loads."""
    if args.arch is None:
        return None
    from autocompress_opt.arch.catalog import load_architecture

    return load_architecture(args.arch)


def _check_budget(args: argparse.Namespace) -> None:
    """``--params``: a count above the parent's parameter count is a :class:`ConfigError`, and so
    is a budget the uniform recipe cannot meet. The parent's architecture comes from its config or
    GGUF metadata (no weights read); a parent known only to the loader is checked after loading."""
    if args.params is None:
        return
    parent = _parent_architecture(args.model)
    if parent is None:
        return
    _check_params(args.params, parent)
    _target(args, parent)  # the recipe's own errors (e.g. the embeddings exceed the budget)


def _check_params(params: float, parent: Any) -> None:
    if params > 1 and params > parent.num_params:
        raise ConfigError(
            f"--params {params:,.0f} is more than the parent's {parent.num_params:,} parameters; "
            "pass a smaller count or a fraction like 0.6"
        )


def _parent_architecture(model: str) -> Any:
    """The parent's :class:`Architecture` without its weights, or None when only loading can tell."""
    from autocompress_opt.arch.catalog import load_architecture, weights_locator
    from autocompress_opt.errors import AutocompressError

    try:
        return load_architecture(model)
    except AutocompressError:
        pass
    locate = weights_locator(model)
    try:
        return None if locate is None else load_architecture(locate())
    except AutocompressError:
        return None


def _flag_dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _serving_target(args: argparse.Namespace) -> Any:
    """The :class:`~autocompress_opt.serving.targets.Target` of ``--baseline`` (None without it), or a
    :class:`ConfigError` for target flags without ``--baseline``, a missing ``--hardware`` /
    ``--workload``, an unknown name or a bad count. Cheap: nothing is loaded."""
    flags = [*_TARGET_FLAGS, *_CONSTRAINT_FLAGS, ("--top-k", ""), ("--score-samples", ""), ("--space", "")]
    flags += [("--inner", "")]
    given = [flag for flag, _ in flags if getattr(args, _flag_dest(flag)) is not None]
    if args.baseline is None:
        if given:
            raise ConfigError(f"{', '.join(given)} only apply with --baseline {{{','.join(BASELINES)}}}")
        return None
    missing = [flag for flag in ("--hardware", "--workload") if getattr(args, _flag_dest(flag)) is None]
    if missing:
        raise ConfigError(f"--baseline {args.baseline} needs {' and '.join(missing)} (the serving target)")
    check_positive(args, "--top-k")
    check_positive(args, "--score-samples", minimum=0)
    from autocompress_opt.serving.targets import Target

    target = Target(
        hardware=args.hardware,
        workload=args.workload,
        engine=args.engine,
        dtype=args.dtype,
        constraints={
            metric: str(getattr(args, _flag_dest(flag)))
            for flag, metric in _CONSTRAINT_FLAGS
            if getattr(args, _flag_dest(flag)) is not None
        },
    )
    target.engine_obj()  # an unknown --engine fails here, not after the model loads
    return target


def _baseline(
    args: argparse.Namespace, loaded: Any, serving_target: Any, parent: Any
) -> tuple[Any, dict[str, Any], Any]:
    """The architecture ``--baseline`` chooses (named after --out), the recipe record and the
    importance it is cut with; prints why. The study's seeding runs here with the study's inputs
    (:func:`~autocompress_opt.search.study.seeding.choose_baseline`), so a study of the same model,
    target, data, space and inner settings seeds this very model."""
    from autocompress_opt.prune.loadability import rules_engine_for
    from autocompress_opt.search.study.seeding import baseline_rows, baseline_scorer, choose_baseline
    from autocompress_opt.search.study.trial_context import importance_rows, parent_identity, parent_importance

    trial = _baseline_trial(args, serving_target)
    cache = Path(args.cache_dir)
    args.data_record = importance_rows(loaded.tokenizer, trial).to_dict()  # the card's record of the text
    importance = parent_importance(loaded.model, loaded.tokenizer, parent_identity(loaded), trial, cache, folder=cache)
    rows = baseline_rows(loaded.tokenizer, trial)
    score, score_record = None, None
    if rows is not None:
        kl = baseline_scorer(loaded.model, importance, rows.tokens, batch_size=args.batch_size)
        score = _announced(kl, quiet=args.no_progress)
        score_record = {
            "metric": "KL(parent || pruned), nats, mean per position",
            "split": "selection (the inner search's choice rows, none of them the study objective's)",
            "rows": int(rows.tokens.shape[0]),
            "seq_len": int(rows.tokens.shape[1]),
            "data": rows.to_dict(),
        }
    space = _study_space(args)
    serve_as = args.serve_as or rules_engine_for(serving_target.engine_name)
    began = time.perf_counter()
    seed = choose_baseline(
        args.baseline,
        serving_target,
        parent,
        space,
        importance=importance,
        score=score,
        top_k=args.top_k,
        layer_metric=args.layer_metric,  # None: each baseline's default (depth: the better of two orders)
        serve_as=serve_as,
    )
    result = seed.result
    print(f"target: {serving_target.hardware} / {serving_target.workload} ({serving_target.engine_name})")
    print(result.report())
    if seed.snapped:
        print(f"snapped onto the search space ({args.space or 'the study default'}): {seed.point}")
    print(f"chosen in {time.perf_counter() - began:.1f} s")
    if seed.architecture is None:
        raise ConfigError(f"--baseline {args.baseline}: {seed.skipped}; nothing exported")
    recipe = {
        "mode": "baseline",
        "baseline": args.baseline,
        "target": serving_target.to_dict(),
        "score": score_record,
        "search": result.to_dict(),
        "point": seed.point,
        "space": args.space or "study default",
        "serve_as": serve_as,
        "inner": trial.to_dict(),
    }
    return replace(seed.architecture, name=Path(args.out).name), recipe, importance


def _baseline_trial(args: argparse.Namespace, serving_target: Any) -> Any:
    """The study trial settings ``--baseline`` scores with: the study's defaults, --samples, --seq-len,
    --seed (importance), --score-samples (``val_samples``), --data, --device, --compute-dtype, then
    --inner, resolved for the target's workload (:meth:`TrialConfig.for_workload`)."""
    from autocompress_opt.cli._common import setting_options
    from autocompress_opt.search.study.weights_trial import TrialConfig

    settings: dict[str, Any] = {
        "importance_samples": args.samples,
        "importance_seq_len": args.seq_len,
        "data_seed": args.seed,
    }
    if args.score_samples is not None:
        settings["val_samples"] = args.score_samples
    if args.data:
        settings["data"] = list(args.data)
    for key in ("device", "compute_dtype"):
        if getattr(args, key, None) is not None:
            settings[key] = getattr(args, key)
    settings.update(setting_options(args.inner or [], "--inner"))
    return TrialConfig.from_dict(settings).for_workload(serving_target.workload)


def _study_space(args: argparse.Namespace) -> Any:
    """The search space a study of ``--model`` searches (``--space``, else the study's default)."""
    from autocompress_opt.cli.study.config import study_space

    return study_space(str(args.model), "weights", args.space)


def _announced(score: Any, *, quiet: bool) -> Any:
    """``score`` that also reports each call on stderr (scoring takes a forward pass per candidate)."""
    calls = []

    def announced(arch: Any) -> float:
        began = time.perf_counter()
        value = float(score(arch))
        calls.append(value)
        if not quiet:
            print(
                f"  scored candidate {len(calls)}: {arch.summary()}: KL {value:.4f} "
                f"({time.perf_counter() - began:.1f} s)",
                file=sys.stderr,
            )
        return value

    return announced


def _importance(args: argparse.Namespace, loaded: Any, adapter: Any) -> Any:
    """Scores of the parent on calibration text, from the cache when this (model, data) was seen."""
    from autocompress_opt.data.user import data_batches
    from autocompress_opt.prune.importance import estimate_importance, tokens_id

    batches = data_batches(
        loaded.tokenizer,
        data=args.data,
        role="calibration",
        n_samples=args.samples,
        seq_len=args.seq_len,
        seed=args.seed,
    )
    args.data_record = batches.to_dict()  # the card's record of the text (sources' SHA-256, rows per source)
    tokens = batches.tokens
    passes = -(-args.samples // args.batch_size) * (len(adapter.all_layer_parts(loaded.model)) + 1)
    if not args.no_progress:
        print(
            f"importance: {args.samples} rows x {args.seq_len} tokens, {passes} forward passes of up to "
            f"{args.batch_size} rows (reused from {args.cache_dir} when done before; --samples, --seq-len, "
            "--batch-size set it)",
            file=sys.stderr,
        )
    return estimate_importance(
        loaded.model,
        tokens,
        model_id=str(loaded.path),
        seed=args.seed,
        adapter=adapter,
        data_id=f"calibration:n={args.samples}:len={args.seq_len}:seed={args.seed}:{tokens_id(tokens)}",
        batch_size=args.batch_size,
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
    )


def _target(args: argparse.Namespace, parent: Any, arch_file: Any = None) -> tuple[Any, dict[str, Any]]:
    """The architecture to build (named after --out unless the file names it) and the recipe record;
    ``arch_file`` is what ``--arch`` names (:func:`_arch_file`)."""
    from autocompress_opt.prune.baselines import uniform_baseline

    if args.arch is not None:
        target = arch_file
        return replace(target, name=target.name or Path(args.out).name), {"mode": "architecture", "file": args.arch}
    target = uniform_baseline(
        parent, args.params, max_layer_drop=args.max_layer_drop, width_multiple=args.width_multiple, width=args.width
    )
    recipe = {
        "mode": "uniform-baseline",
        "params": args.params,
        "max_layer_drop": args.max_layer_drop,
        "width_multiple": args.width_multiple,
        "width": args.width,
    }
    return replace(target, name=Path(args.out).name), recipe
