"""``autocompress arch``: print an architecture's structure and parameter counts (total and active:
the parameters one token touches, which differ for a mixture of experts)."""

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
  autocompress arch --model nemotron-3-super-120b-a12b   # a hybrid Mamba-2 + latent MoE: total and active
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
                "params": {
                    "total": arch.num_params,
                    "non_embedding": arch.non_embedding_params,
                    # per token: the router, k of E routed experts, shared expert, every dense part
                    "active": arch.active_params(),
                    # the same with the input embedding as the one row a lookup reads (gpt-oss's convention)
                    "active_without_embedding_lookup": arch.active_params(count_embedding=False),
                },
                "kv_bytes_per_token": kv,
                "kv_dtype": args.kv_dtype,
            }
        )
        return 0
    print(arch.summary())
    sliding = " while every sliding window fills" if any(l.window for l in arch.layers) else ""
    active = "" if arch.active_params() == arch.num_params else f", {arch.active_params():,} active per token"
    print(
        f"parameters: {arch.num_params:,} total, {arch.non_embedding_params:,} non-embedding{active}; "
        f"KV cache: {kv:,.0f} bytes/token{sliding} ({args.kv_dtype})"
    )
    rows = [
        [
            str(i),
            "yes" if l.attention else "mamba2" if l.mamba is not None else "-",
            str(l.num_heads or "-"),
            str(l.num_kv_heads or "-"),
            str(l.head_dim or "-"),
            str(l.window or ("full" if l.attention else "-")),
            str(l.ffn_width if l.ffn else _moe(l) if l.moe is not None else "-"),
            f"{arch.layer_params(i):,}",
        ]
        for i, l in enumerate(arch.layers)
    ]
    print(table(rows, ["layer", "attn", "heads", "kv", "head_dim", "window", "ffn", "params"]))
    return 0


def _moe(layer: Any) -> str:
    """A MoE layer's FFN column: experts x width, top-k, and shared / latent widths when present."""
    m = layer.moe
    extra = f" +shared {m.shared_width}" if m.shared_width else ""
    extra += f" latent {m.latent_width}" if m.latent_width else ""
    return f"moe {m.num_experts}x{m.expert_width} top-{m.experts_per_token}{extra}"
