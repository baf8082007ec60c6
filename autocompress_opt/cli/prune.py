"""``autocompress prune``: prune a real model by importance and export it.

Two modes: ``--params`` is the practitioner's Minitron-style baseline (a uniform architecture chosen
by parameter count, :func:`~autocompress_opt.prune.baselines.uniform_baseline`); ``--arch`` exports a
given (e.g. searched, heterogeneous) architecture. Both score the parent on calibration text
(cached), keep the most important layers/heads/channels, and write a checkpoint with a model card.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_verb
from autocompress_opt.prune.baselines import BASELINE_WIDTHS
from autocompress_opt.prune.importance import LAYER_METRICS

_DEFAULT_CACHE = Path(".autocompress") / "importance"
_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9}


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

--params picks a UNIFORM architecture by parameter count, as a practitioner without a hardware model
would: drop the least important layers (at most --max-layer-drop of them), then shrink every FFN to
the widest multiple of --width-multiple that meets the budget (--width hidden+ffn: shrink hidden size
and FFN by one ratio, Minitron's width recipe, which also cuts the embeddings). --arch exports the given architecture
(a file written by Architecture.save, possibly heterogeneous).""",
    )
    p.add_argument("--model", required=True, help="parent: a known name (smollm2-135m), an HF directory or a .gguf")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--params", type=param_budget, help="parameter budget: a fraction (0.6) or a count (80M)")
    target.add_argument("--arch", help="architecture .json/.yaml to materialise (a sub-architecture of the parent)")
    p.add_argument("--out", required=True, help="output checkpoint directory")
    p.add_argument("--force", action="store_true", help="replace --out if it exists and is not empty")
    p.add_argument("--samples", type=int, default=32, help="calibration sequences (default 32)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per calibration sequence (default 256)")
    p.add_argument("--seed", type=int, default=0, help="calibration sampling seed (default 0)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per forward pass (default 4)")
    p.add_argument(
        "--layer-metric",
        choices=LAYER_METRICS,
        default="skip_loss",
        help="layer importance used to choose dropped layers (default skip_loss)",
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
    p.add_argument(
        "--cache-dir",
        default=str(_DEFAULT_CACHE),
        help=f"importance cache folder (default {_DEFAULT_CACHE}); scores are reused across runs",
    )
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.hf.adapters import adapter_for
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.export import export_model
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize

    loaded = load_model(args.model)
    adapter = adapter_for(loaded.model)
    parent = adapter.architecture(loaded.model)
    importance = _importance(args, loaded, adapter)
    target, recipe = _target(args, parent)
    plan = plan_pruning(parent, importance, target, layer_metric=args.layer_metric)
    pruned = materialize(loaded.model, plan, adapter=adapter)
    card = {
        "recipe": {**recipe, "layer_metric": args.layer_metric},
        "kept_parent_layers": [lp.parent_index for lp in plan.layers],
        "importance": {
            "method": importance.meta.method,
            "data_id": importance.meta.data_id,
            "base_loss": importance.meta.base_loss,
        },
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
    )
    print(
        f"parent: {parent.summary()}\npruned: {plan.architecture.summary()} "
        f"({plan.architecture.num_params / parent.num_params:.1%} of the parent)\nwrote {out}"
    )
    return 0


def _importance(args: argparse.Namespace, loaded: Any, adapter: Any) -> Any:
    """Scores of the parent on calibration text, from the cache when this (model, data) was seen."""
    from autocompress_opt.prune.importance import estimate_importance, tokens_id
    from autocompress_opt.quality.textdata import calibration_batches

    tokens = calibration_batches(loaded.tokenizer, n_samples=args.samples, seq_len=args.seq_len, seed=args.seed)
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


def _target(args: argparse.Namespace, parent: Any) -> tuple[Any, dict[str, Any]]:
    """The architecture to build (named after --out unless the file names it) and the recipe record."""
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.prune.baselines import uniform_baseline

    if args.arch is not None:
        target = load_architecture(args.arch)
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
