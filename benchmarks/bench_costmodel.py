"""Vectorised cost-model throughput: architectures evaluated per second (target >= 100,000/s).

Evaluates batches of random heterogeneous 30-layer architectures (SmolLM2-shaped parent with
random per-layer FFN widths, head counts and dropped blocks), already packed as arrays — the form
the outer-loop filter holds candidates in — for each engine. Also times packing Architecture
objects into arrays, and the scalar API, for comparison. Median of repeats.

    .venv/bin/python benchmarks/bench_costmodel.py
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _util import write

from autocompress_opt.arch.architecture import LayerSpec
from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.serving.costmodel import ArchArrays, Scenario, estimate_batch, estimate_cost

N, REPEATS, TARGET = 100_000, 7, 100_000


def random_batch(n: int, seed: int = 0) -> ArchArrays:
    rng = np.random.default_rng(seed)
    parent = ArchArrays.from_architectures([known_architectures()["smollm2-135m"]])
    depth = parent.heads.shape[1]
    tiled = {f.name: np.repeat(getattr(parent, f.name), n, axis=0) for f in dataclasses.fields(parent)}
    attn = (rng.random((n, depth)) > 0.1).astype(float)
    ffn = (rng.random((n, depth)) > 0.1).astype(float)
    kv = 3.0 * attn
    return ArchArrays(
        **{
            **tiled,
            "attn": attn,
            "ffn": ffn,
            "kv_heads": rng.integers(1, 4, (n, depth)) * attn,
            "heads": kv * rng.integers(1, 4, (n, depth)),
            "ffn_width": ffn * rng.integers(1, 25, (n, depth)) * 64.0,
        }
    )


def time_it(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    batch = random_batch(N)
    results = {}
    for engine, scenario in (
        ("vllm", Scenario("bf16", 1024, 256, "max")),
        ("trtllm", Scenario("fp8", 1024, 256, 64)),
        ("llamacpp", Scenario("q4_k_m", 32768, 512, 1)),
        ("torch-eager", Scenario("bf16", 512, 64, 1)),
    ):
        seconds = time_it(lambda e=engine, s=scenario: estimate_batch(batch, "h100-sxm", e, s), REPEATS)
        results[engine] = {"archs_per_s": round(N / seconds), "median_s": round(seconds, 4)}
        print(f"{engine:<12} {N / seconds:>12,.0f} architectures/s (median of {REPEATS}, batch {N:,}, 30 layers)")
    parent = known_architectures()["smollm2-135m"]
    archs = [
        dataclasses.replace(
            parent, layers=tuple(LayerSpec(True, 9, 3, 64, True, 64 * (1 + (i + j) % 24)) for j in range(30))
        )
        for i in range(2000)
    ]
    pack = time_it(lambda: ArchArrays.from_architectures(archs), 3)
    scalar = time_it(
        lambda: [estimate_cost(a, "h100-sxm", "vllm", Scenario("bf16", 1024, 256, 8)) for a in archs[:200]], 3
    )
    worst = min(r["archs_per_s"] for r in results.values())
    write(
        "costmodel_throughput",
        {
            "command": "python benchmarks/bench_costmodel.py",
            "batch": N,
            "layers": 30,
            "repeats": REPEATS,
            "engines": results,
            "min_archs_per_s": worst,
            "target_archs_per_s": TARGET,
            "meets_target": worst >= TARGET,
            "packing_archs_per_s": round(len(archs) / pack),
            "scalar_archs_per_s": round(200 / scalar),
        },
    )
    print(f"packing Architecture objects: {len(archs) / pack:,.0f}/s; scalar API: {200 / scalar:,.0f}/s")
    print(
        f"slowest engine {worst:,} architectures/s: {'meets' if worst >= TARGET else 'MISSES'} the {TARGET:,}/s target"
    )


if __name__ == "__main__":
    main()
