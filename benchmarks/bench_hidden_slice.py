"""Issue 41: does training the masks on the parent cut to the trial's hidden size (``search(slice_hidden=True)``,
the default) choose what training them on the parent under a hidden-channel mask chose?

In float32 the two are the same function up to rounding (``tests/search/test_inner_hidden_slice.py``:
per-step KL within 1e-5). The demo's trials run in bfloat16 (``compute_dtype: fast``), where 24 steps
of Adam amplify rounding; this runs the demo's h100-sxm datacenter trial at the two points whose hidden
size is cut (20/512/896/3/2 and 16/448/768/1/3) at study seeds 0, 1 and 2, each with the mask on the
parent and with the cut parent, in one process (the context warm after the first), and records each
trial's chosen candidate, architecture, held-out KL and CPU seconds.

.venv/bin/python benchmarks/bench_hidden_slice.py   # ~10 min on 2 cores
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import import_tree, provenance, write

TARGET = "h100-sxm:datacenter"
SEEDS = (0, 1, 2)


def main() -> None:
    import_tree(Path(__file__).resolve().parent.parent)
    import bench_trial_phases as phases

    import autocompress_opt.search.study.weights_trial as weights_trial
    from autocompress_opt.search.inner import inner_search

    search = inner_search.search
    cache = Path(tempfile.mkdtemp(prefix="hidden-slice-"))
    rows: list[dict[str, Any]] = []
    try:
        for point in phases.POINTS[1:]:  # the light point keeps the parent's hidden size: nothing is cut
            for seed in SEEDS:
                for sliced in (False, True):
                    weights_trial.search = lambda *a, s=sliced, **k: search(*a, **{**k, "slice_hidden": s})
                    request = {**phases.build_request(TARGET, point, cache), "seed": seed}
                    trial = phases.timed_trial(request)
                    row = {"point": point, "seed": seed, "sliced": sliced, "cpu_s": trial["cpu_s"], **trial["outcome"]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        weights_trial.search = search
    write("hidden_slice", {"target": TARGET, "rows": rows, "provenance": provenance()})


if __name__ == "__main__":
    main()
