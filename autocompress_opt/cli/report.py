"""``autocompress report``: predicted cost of one model for every workload on every catalog GPU."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import (
    add_hardware_file,
    add_verb,
    check_output_dir,
    load_hardware_files,
    print_json,
    table,
)
from autocompress_opt.errors import ConfigError


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "report",
        "Cost report across the GPU catalog: each workload (with its default engine "
        "and dtype) on each GPU; table, JSON and PNG/SVG plots.",
        """
  autocompress report --model smollm2-135m --out plots/
  autocompress report --model llama-3.1-8b --workload datacenter --hardware h100-sxm,b200 --json""",
    )
    p.add_argument("--model", default="smollm2-135m", help="model reference (default smollm2-135m)")
    p.add_argument("--workload", default=None, help="comma-separated workloads (default: all)")
    p.add_argument("--hardware", default=None, help="comma-separated catalog names (default: every GPU)")
    p.add_argument("--out", type=Path, default=Path("plots"), help="directory for JSON and plots (default plots/)")
    p.add_argument("--json", action="store_true", help="print rows as JSON instead of a table")
    add_hardware_file(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.serving.hardware import get_hardware
    from autocompress_opt.serving.report import cost_report, save_report
    from autocompress_opt.serving.workloads import get_workload

    check_output_dir(args.out)
    load_hardware_files(args)
    arch = load_architecture(args.model)
    workloads = [get_workload(w) for w in _names(args.workload, "--workload")] if args.workload else None
    hardware = [get_hardware(h).name for h in _names(args.hardware, "--hardware")] if args.hardware else None
    rows = cost_report(arch, workloads, hardware)
    paths = save_report(rows, arch, args.out)
    if args.json:
        print_json([r.to_dict() for r in rows])
        return 0
    print(arch.summary())
    body = [
        [r.workload, r.hardware, r.engine, r.dtype]
        + (
            ["error: " + r.error]
            if r.error
            else [
                f"{r.cost.ttft_ms:,.2f}",
                f"{r.cost.tpot_ms:,.3f}",
                f"{r.cost.output_throughput_tok_s:,.0f}",
                f"{r.cost.peak_memory_gib:,.2f}",
                f"{r.cost.max_concurrency:,}",
            ]
        )
        for r in rows
    ]
    print(
        table(body, ["workload", "hardware", "engine", "dtype", "ttft_ms", "tpot_ms", "tok/s", "mem_gib", "max_conc"])
    )
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


def _names(text: str, flag: str) -> list[str]:
    """``"a, b"`` → ``["a", "b"]``; an empty item is a :class:`ConfigError`."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise ConfigError(f"{flag} expects comma-separated names, got {text!r}")
    return names
