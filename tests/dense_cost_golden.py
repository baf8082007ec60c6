"""Write tests/serving/data/dense_cost_golden.json: every cost metric (``bounds=True``) of a fixed set
of dense architectures x hardware x engines x scenarios.

Run once on the code before the cost model learned MoE and Mamba-2 layers (branch h-moecost at
ac47669); tests/serving/test_dense_unchanged.py checks that today's code gives the same numbers
bit for bit. Rerun it only when a change to dense costs is intended, and say so in the commit:
``PYTHONPATH=$PWD python tests/dense_cost_golden.py``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.serving.costmodel import ArchArrays, Scenario, estimate_batch, estimate_cost

GOLDEN = Path(__file__).parent / "serving" / "data" / "dense_cost_golden.json"

MODELS = ("smollm2-135m", "gemma3-270m", "llama-3.1-8b", "qwen3-8b", "llama-3.3-70b")
CASES = (  # (hardware, engine, scenario)
    ("h100-sxm", "vllm", Scenario()),
    ("h100-sxm", "vllm", Scenario(input_len=4096, output_len=512, concurrency="max", arrival="steady")),
    ("b200", "trtllm", Scenario(dtype="fp8", input_len=2048, output_len=256, concurrency=32)),
    ("h200", "vllm", Scenario(input_len=1024, output_len=128, arrival="poisson", rate=4.0)),
    ("h100-sxm", "vllm", Scenario(tp=2, concurrency=8, requests=20)),
    ("rtx4090", "llamacpp", Scenario(dtype="q4_k_m", input_len=512, output_len=128)),
    ("rtx3090", "torch-eager", Scenario(dtype="fp16", input_len=256, output_len=64, concurrency=4)),
)


def architectures() -> list[Architecture]:
    """The dense set: known models, a pruned non-uniform child and one with a dropped layer."""
    known = known_architectures()
    archs = [known[name] for name in MODELS]
    base = known["llama-3.1-8b"]
    layers = list(base.layers)
    layers[3] = replace(layers[3], num_heads=16, num_kv_heads=4, ffn_width=7000)
    layers[5] = replace(layers[5], attention=False)
    layers[7] = replace(layers[7], ffn=False)
    archs.append(replace(base, layers=tuple(layers), name="llama-3.1-8b-pruned"))
    return archs


def compute() -> dict[str, Any]:
    archs = architectures()
    out: dict[str, Any] = {"models": [a.name or a.family for a in archs], "cases": []}
    for hardware, engine, scenario in CASES:
        values = estimate_batch(ArchArrays.from_architectures(archs), hardware, engine, scenario, bounds=True)
        metrics = {k: [float(x) for x in np.asarray(v).reshape(-1)] for k, v in sorted(values.items())}
        single = [estimate_cost(a, hardware, engine, scenario).to_dict() for a in archs]  # each packed alone
        out["cases"].append(
            {"hardware": hardware, "engine": engine, "scenario": repr(scenario), "metrics": metrics, "single": single}
        )
    return out


# Metrics the cost model gained after the golden was first written: checked by test_dense_unchanged.py
# on their own, not stored (so a deliberate rewrite keeps the golden's metric set).
NEWER_METRICS = ("active_params",)


def golden() -> dict[str, Any]:
    """:func:`compute` without :data:`NEWER_METRICS`: what the golden file holds."""
    out = compute()
    for case in out["cases"]:
        for table in (case["metrics"], *case["single"]):
            for name in NEWER_METRICS:
                table.pop(name, None)
    return out


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(golden(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
