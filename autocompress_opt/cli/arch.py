"""``autocompress arch``: print an architecture's structure and parameter counts."""

from __future__ import annotations

import argparse
from typing import Any

from autocompress_opt.cli._common import add_verb, print_json, table


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "arch",
        "Show an architecture: per-layer structure, parameters, KV bytes per token.",
        """
  autocompress arch --model smollm2-135m
  autocompress arch --model path/to/config.json --json
  autocompress arch --model model.gguf --kv-dtype fp8""",
    )
    p.add_argument(
        "--model", required=True, help="known name, HF directory, config.json, .gguf, or architecture .json/.yaml"
    )
    p.add_argument("--kv-dtype", default="bf16", help="KV-cache format for the bytes-per-token figure (default bf16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.serving.dtypes import kv_dtype_bytes

    arch = load_architecture(args.model)
    kv = arch.kv_bytes_per_token(kv_dtype_bytes(args.kv_dtype))
    if args.json:
        print_json(
            {
                **arch.to_dict(),
                "params": {"total": arch.num_params, "non_embedding": arch.non_embedding_params},
                "kv_bytes_per_token": kv,
                "kv_dtype": args.kv_dtype,
            }
        )
        return 0
    print(arch.summary())
    sliding = " while every sliding window fills" if any(l.window for l in arch.layers) else ""
    print(
        f"parameters: {arch.num_params:,} total, {arch.non_embedding_params:,} non-embedding; "
        f"KV cache: {kv:,.0f} bytes/token{sliding} ({args.kv_dtype})"
    )
    rows = [
        [
            str(i),
            "yes" if l.attention else "-",
            str(l.num_heads or "-"),
            str(l.num_kv_heads or "-"),
            str(l.head_dim or "-"),
            str(l.window or ("full" if l.attention else "-")),
            str(l.ffn_width if l.ffn else "-"),
            f"{arch.layer_params(i):,}",
        ]
        for i, l in enumerate(arch.layers)
    ]
    print(table(rows, ["layer", "attn", "heads", "kv", "head_dim", "window", "ffn", "params"]))
    return 0
