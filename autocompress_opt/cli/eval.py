"""``autocompress eval``: held-out perplexity (code, prose) of a model and its KL to a parent."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_verb, print_json, table


def add_parser(sub: Any) -> None:
    p = add_verb(sub, "eval", "Score a model on held-out code and prose: perplexity, and KL to a parent.", """
  autocompress eval --model smollm2-135m                            # parent perplexities, 16 x 256 tokens per domain
  autocompress eval --model pruned/ --parent smollm2-135m --json    # a pruned checkpoint against its parent
  autocompress eval --model smollm2-135m --samples 64 --seq-len 512 --seed 1 --out eval.json""")
    p.add_argument("--model", required=True,
                   help="model with offline weights (smollm2-135m), Hugging Face directory (safetensors) or .gguf")
    p.add_argument("--parent", default=None, help="reference model for KL(parent || model); same forms as --model")
    p.add_argument("--samples", type=int, default=16, help="held-out rows per domain (default 16)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row (default 256)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0); the held-out split stays fixed")
    p.add_argument("--batch-size", type=int, default=4, help="rows per forward pass (default 4)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--json", action="store_true", help="print the full report as one JSON object")
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="also write the JSON report to FILE")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.loading import load_model
    from autocompress_opt.quality import evaluate

    model = load_model(args.model)
    parent = load_model(args.parent) if args.parent else None
    report = evaluate(model.model, model.tokenizer, parent=parent.model if parent else None,
                      n_samples=args.samples, seq_len=args.seq_len, seed=args.seed,
                      batch_size=args.batch_size, progress=not args.no_progress)
    result = {"model": model.source, "parent": parent.source if parent else None,
              "num_params": model.num_params, "parent_num_params": parent.num_params if parent else None,
              **report.to_dict()}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    if args.json:
        print_json(result)
        return 0
    _print_table(model.source, parent.source if parent else None, report)
    return 0


def _print_table(model: str, parent: str | None, report: Any) -> None:
    kl = lambda v: "-" if v is None else f"{v:.5f}"  # noqa: E731
    rows = [["code", f"{report.ppl_code:.3f}", kl(report.kl_code), f"{report.timings_s['code']:.1f}"],
            ["prose", f"{report.ppl_prose:.3f}", kl(report.kl_prose), f"{report.timings_s['prose']:.1f}"],
            ["all", "", kl(report.kl_to_parent), f"{report.timings_s['total']:.1f}"]]
    print(f"model:  {model}\nparent: {parent or '(none)'}\n"
          f"held-out: {report.n_samples} rows x {report.seq_len} tokens per domain, seed {report.seed}")
    print(table(rows, ["domain", "perplexity", "KL(parent||model) nats", "seconds"]))
