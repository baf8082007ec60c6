"""The own cost model's factors fitted to AIConfigurator per (hardware, engine) (issue 45 item 2).

For every hardware and engine the aic backend covers (H100-SXM, H200, B200 x vLLM, TensorRT-LLM),
in BF16 at tp=1: per-layer pruned children of Llama-3.2-1B, Llama-3.1-8B and Qwen3-8B
(``serving.aic_fit.pruned_children``), the backend's TTFT and TPOT of each at batches 1, 8, 64 and
256 with the datacenter workload's 1024-in / 256-out requests; a quarter of the children held out;
``mfu``, ``mbu``, ``kernel_launch_us`` and ``step_overhead_ms`` of the engine's current profile
fitted to the rest (``serving.aic_fit.fit_to_backend``). Reported: the median |error| against the
backend on the held-out children before (the profile in use: the engine-wide fit to published rows)
and after, TTFT and TPOT apart; and, beside it, the median |error| against the published
measurements of that (hardware, engine) with each profile (``validate``), so a closer match to the
backend that moves the model away from measured numbers shows.

Writes ``results/aic_fit.json`` and the fitted profiles to ``results/aic_fit_profiles.yaml``;
``--install`` also copies them into the user profile folder, where ``get_profile`` (and so the
inner search) reads them. Needs the extra: pip install 'autocompress-opt[aic]'.

PYTHONPATH=. /path/to/venv-with-aic/bin/python benchmarks/bench_aic_fit.py   # ~2 min on 2 CPU threads
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import RESULTS, provenance, write

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.serving import aic
from autocompress_opt.serving.aic_fit import FREE, backend_observations, fit_to_backend, pruned_children
from autocompress_opt.serving.fitting import heldout_split, mdape, relative_errors
from autocompress_opt.serving.profiles import get_profile, save_profile, user_profile_dir
from autocompress_opt.serving.validation import load_measurements, validate

PARENTS = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-8b")  # SmolLM2's 3 KV heads are outside the backend's tables
CHILDREN = 12  # per parent
BATCHES = (1, 8, 64, 256)
INPUT_LEN, OUTPUT_LEN, DTYPE = 1024, 256, "bf16"  # the datacenter workload's requests
SEED = 0
PROFILES = RESULTS / "aic_fit_profiles.yaml"


def _errors(observations: list[Any], profile: Any) -> dict[str, float]:
    """Median |error| of ``profile``'s predictions against the backend, TTFT and TPOT apart."""
    return {
        metric: mdape(relative_errors([o for o in observations if o.metric == metric], profile))
        for metric in ("ttft_ms", "tpot_ms")
    }


def _measured(rows: list[Any], hardware: str, engine: str, profile: Any) -> dict[str, Any]:
    """Median |error| against the published rows of (hardware, engine) with ``profile``."""
    mine = [r for r in rows if r[0].hardware.name == hardware and r[0].engine.name == engine]
    if not mine:
        return {"rows": 0, "median_abs_error": None}
    return {"rows": len(mine), "median_abs_error": mdape([v.error for v in validate(mine, profile)])}


def fit_one(hardware: str, engine: str, archs: list[Any], rows: list[Any]) -> tuple[Any, dict[str, Any]]:
    """The fitted profile of (hardware, engine) and its report."""
    t = time.perf_counter()
    observations, missing = backend_observations(archs, hardware, engine, DTYPE, BATCHES, INPUT_LEN, OUTPUT_LEN)
    priced_s = time.perf_counter() - t
    names = sorted({o.arch.name for o in observations})
    _, held_idx = heldout_split(len(names), 0.25, SEED)
    held_names = {names[i] for i in held_idx}
    train = [o for o in observations if o.arch.name not in held_names]
    held = [o for o in observations if o.arch.name in held_names]
    before = get_profile(engine, hardware)
    t = time.perf_counter()
    after = fit_to_backend(train, before, hardware)
    fit_s = time.perf_counter() - t
    report = {
        "hardware": hardware,
        "engine": engine,
        "observations": {"train": len(train), "held_out": len(held), "left_out_missing_shapes": missing},
        "before": {k: float(getattr(before, k)) for k in FREE} | {"profile": f"{before.engine}@{before.hardware}"},
        "after": {k: float(getattr(after, k)) for k in FREE},
        "held_out_median_abs_error": {"before": _errors(held, before), "after": _errors(held, after)},
        "train_median_abs_error": {"before": _errors(train, before), "after": _errors(train, after)},
        "published_rows": {
            "before": _measured(rows, hardware, engine, before),
            "after": _measured(rows, hardware, engine, after),
        },
        "seconds": {"backend_prices": priced_s, "fit": fit_s},
    }
    version = aic.AicPricer(hardware, engine, DTYPE).version
    fitted = after.with_parameters(
        fit={
            "method": "log-space least squares (L-BFGS) to AIConfigurator's per-layer sums, weak prior to the "
            "engine-wide published fit (benchmarks/bench_aic_fit.py)",
            "backend": f"aiconfigurator-core {metadata.version('aiconfigurator-core')}, database {version}",
            "free": list(FREE),
            "sample": {
                "parents": list(PARENTS),
                "children": CHILDREN,
                "batches": list(BATCHES),
                "dtype": DTYPE,
                "input_len": INPUT_LEN,
                "output_len": OUTPUT_LEN,
                "seed": SEED,
            },
            "held_out_mdape_vs_backend": report["held_out_median_abs_error"]["after"],
        }
    )
    return fitted, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="also copy the profiles into the user profile folder")
    args = parser.parse_args()
    archs = [c for i, p in enumerate(PARENTS) for c in pruned_children(load_architecture(p), CHILDREN, SEED + i)]
    rows = load_measurements()
    profiles, reports = [], []
    for hardware in aic.SYSTEMS:
        for engine in aic.ENGINES:
            fitted, report = fit_one(hardware, engine, archs, rows)
            profiles.append(fitted)
            reports.append(report)
            held = report["held_out_median_abs_error"]
            pub = report["published_rows"]
            before, after = held["before"], held["after"]
            rows_note = (
                f"{pub['before']['median_abs_error']:.1%} -> {pub['after']['median_abs_error']:.1%}"
                if pub["before"]["rows"]
                else "none"
            )
            print(
                f"{hardware:<9} {engine:<7} held-out vs aic: TTFT {before['ttft_ms']:.1%} -> {after['ttft_ms']:.1%}, "
                f"TPOT {before['tpot_ms']:.1%} -> {after['tpot_ms']:.1%}; published rows ({pub['before']['rows']}): "
                f"{rows_note}"
            )
    save_profile(
        PROFILES,
        profiles,
        header="Per-(hardware, engine) profiles fitted to AIConfigurator's per-layer sums by "
        "benchmarks/bench_aic_fit.py (issue 45).\nrouted_passes is not fitted here: it is the engine-wide value of "
        "data/profiles/published.yaml (issue 44\nreplaced the earlier routed_pair_ns, a time per pair, by this count "
        "of weight passes).\nCopy into ~/.cache/autocompress_opt/profiles/ "
        "(or run it with --install) for the own model to use them.",
    )
    if args.install:
        user_profile_dir().mkdir(parents=True, exist_ok=True)
        shutil.copy(PROFILES, user_profile_dir() / PROFILES.name)
    write(
        "aic_fit",
        {"aiconfigurator_core": metadata.version("aiconfigurator-core"), "fits": reports, **provenance(seed=SEED)},
    )


if __name__ == "__main__":
    main()
