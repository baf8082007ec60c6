"""Wall-clock time of ``autocompress --help`` and of one verb's ``--help`` (issue: the help must not
load torch). Median of 7 runs each, in fresh processes; writes ``results/cli_help.json``.
Run: ``.venv/bin/python benchmarks/bench_cli_help.py``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from _util import write

CLI = str(Path(sys.executable).parent / "autocompress")
RUNS = 7


def seconds(args: list[str]) -> float:
    """Median wall-clock seconds of ``autocompress ARGS`` over RUNS fresh processes."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run([CLI, *args], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    results = {
        " ".join(args): round(seconds(args), 3)
        for args in (["--help"], ["distill", "--help"], ["study", "run", "--help"])
    }
    for command, value in results.items():
        print(f"autocompress {command:<16} {value:.3f} s (median of {RUNS})")
    write("cli_help", {"median_s": results, "runs": RUNS, "target_s": 0.5})


if __name__ == "__main__":
    main()
