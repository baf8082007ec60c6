"""A trial mode for the placement tests (imported through --plugin, also in Ray workers): a plan
trial that first records where Ray put it, one JSON line per trial in ``request["inner"]["log"]``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from autocompress_opt.search.study.placement import trial_device
from autocompress_opt.search.study.trials import TRIAL_MODES, plan_trial


def _probe(request: Mapping[str, Any]) -> dict[str, Any]:
    import ray

    began = time.time()
    time.sleep(float(request["inner"].get("sleep_s", 1.0)))  # long enough for trials to overlap
    context = ray.get_runtime_context()
    record = {
        "began": began,
        "ended": time.time(),
        "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": trial_device("auto"),
        "cpus": context.get_assigned_resources().get("CPU"),
        "node": context.get_node_id(),
        "parent_model": request.get("parent_model"),
        "cache_dir": request.get("cache_dir"),
    }
    with open(request["inner"]["log"], "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    return plan_trial(request)


if "placement-probe" not in TRIAL_MODES:
    TRIAL_MODES.register("placement-probe", _probe)
