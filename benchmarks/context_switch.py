"""CPU-seconds of one trial process alternating between a prose target's and a code target's data
contexts (the demo's targets take turns on each trial actor), on the real SmolLM2-135M.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/context_switch.py 4 [CACHE_DIR]

Prints each ``parent_context`` call (index, data domain, built, CPU s, wall s) and the number of
parent loads. Run it once first to fill CACHE_DIR's importance and teacher caches (a study's
seeding and first trials do) so the numbers are those of a switch on warm disk caches.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from autocompress_opt.search.study import weights_trial as wt


def main(n: int, cache: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    loads: list[str] = []
    real = wt.load_parent

    def counted(ref: str, config: wt.TrialConfig, *args: Any) -> Any:
        loads.append(ref)
        return real(ref, config, *args)

    wt.load_parent = counted  # type: ignore[assignment]
    configs = [wt.TrialConfig().for_workload(w) for w in ("datacenter", "local-coding")]
    cpu_s = []
    for i in range(n):
        c0, w0 = time.process_time(), time.perf_counter()
        _, built = wt.parent_context("smollm2-135m", configs[i % 2], cache)
        cpu_s.append(time.process_time() - c0)
        print(i, configs[i % 2].data_domain, built, round(cpu_s[-1], 2), round(time.perf_counter() - w0, 2), flush=True)
    return {"loads": len(loads), "cpu_s_total": round(sum(cpu_s), 2), "cpu_s_after_first_two": round(sum(cpu_s[2:]), 2)}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else ".autocompress"))))
