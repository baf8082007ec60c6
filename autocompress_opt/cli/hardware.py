"""``autocompress hardware list``: the hardware catalog."""

from __future__ import annotations

import argparse
from typing import Any

from autocompress_opt.cli._common import add_hardware_file, add_verb, load_hardware_files, print_json, table


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "hardware",
        "List the hardware catalog (datasheet figures with sources, plus the calibrated CPU).",
        """
  autocompress hardware list
  autocompress hardware list --json
  autocompress hardware list --hardware-file my_gpus.yaml""",
    )
    p.add_argument("action", choices=["list"], help="what to do (list)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    add_hardware_file(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.serving.hardware import HARDWARE, hardware_aliases

    load_hardware_files(args)
    items = [HARDWARE.get(name) for name in HARDWARE.names()]
    if args.json:
        print_json([{**h.to_dict(), "aliases": list(hardware_aliases(h.name))} for h in items])
        return 0
    rows = [
        [
            h.name,
            ", ".join(hardware_aliases(h.name)) or "-",
            f"{h.memory_gib:g}",
            f"{h.bandwidth_gb_s:g}",
            " ".join(f"{k}={v:g}" for k, v in h.peak_tflops.items()),
            h.interconnect or "-",
            h.source[:60],
        ]
        for h in items
    ]
    print(table(rows, ["name", "aliases", "GiB", "GB/s", "dense TFLOPS", "interconnect", "source"]))
    if "cpu" not in HARDWARE:
        print("\n(cpu is not calibrated yet: run 'autocompress calibrate --hardware cpu')")
    return 0
