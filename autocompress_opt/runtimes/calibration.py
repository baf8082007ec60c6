"""Calibrate a real serving engine's cost profile on this machine: ``autocompress calibrate --engine``.

1. **Models.** :func:`engine_architectures` draws pruned architectures of one parent (default
   SmolLM2-135M) that the engine loads (:func:`~autocompress_opt.prune.loadability.loadable_problems`):
   a third uniform, the rest heterogeneous (per-layer KV heads and FFN widths, dropped layers,
   attention-free and FFN-free layers), over a range of depths and hidden sizes. Each is built with
   random weights (timing does not depend on their values), exported as the engine reads it (a plain
   Llama checkpoint when uniform, DeciLM otherwise), timed, and deleted.
2. **Timing the real engine.** llama.cpp: the checkpoint converted by llama.cpp's own
   ``convert_hf_to_gguf.py`` (and ``llama-quantize`` for a quantised type), timed by ``llama-bench``
   (``pp``: prompt tokens/s of one prefill; ``tg``: tokens/s generating from an empty context).
   vLLM: the offline ``LLM`` timed at a few concurrencies (the prefill of a wave of prompts, compared
   as its throughput, then the time per output token of that wave;
   :mod:`~autocompress_opt.runtimes._vllm_bench`, :func:`_vllm_measurements`). Every model is
   prepared first, then timed in ``passes`` passes over all of them in alternating order, and each
   number keeps its fastest pass: on a shared machine a slow spell only ever slows a run (seen here:
   one model's llama-bench prefill at 1,078, 765 and 648 tok/s minutes apart, each run's own
   repetitions within 3 %).
3. **Fit and held-out error.** The models are split at random (seeded) into a fitting part and a
   held-out part; the engine's profile for this hardware (MFU, MBU, kernel launch cost, step
   overhead) is fitted to the fitting part through the cost model
   (:func:`~autocompress_opt.serving.fitting.fit_profile`), and every held-out measurement is
   predicted by it: the median absolute percentage error (MdAPE) over them is the number to trust.
   The error of the profile in use before (shipped or earlier calibration) is reported beside it.
   The held-out residuals are stored with the profile (``fit["heldout"]``), so cost predictions with
   ``--confidence`` get intervals from them. :func:`refit_engine` fits saved timings again at the
   current code (same models, same split) without timing the engine.

The profile is saved as ``<hardware>-<engine>.yaml`` in the user profile folder (it takes precedence
over the shipped profiles), or to ``out``.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.errors import ConfigError, check_choice, check_fraction, check_int
from autocompress_opt.prune.loadability import loadable_problems
from autocompress_opt.serving.calibration import interleaved_passes, measure_cpu_figures
from autocompress_opt.serving.costmodel import Scenario, regime_of
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.fitting import Observation, fit_profile, heldout_split, mdape, predict, relative_errors
from autocompress_opt.serving.hardware import Hardware, get_hardware
from autocompress_opt.serving.profiles import (
    METRIC_PHASES,
    PRIORS,
    CostProfile,
    clear_cache,
    get_profile,
    save_profile,
    time_ratio,
    user_profile_dir,
)

__all__ = [
    "CALIBRATED_ENGINES",
    "GGUF_TO_COST_DTYPE",
    "VLLM_DTYPES",
    "EngineCalibration",
    "Measurement",
    "calibrate_engine",
    "engine_architectures",
    "refit_engine",
]

CALIBRATED_ENGINES = ("llamacpp", "vllm")
# llama.cpp file type -> the cost model's weight format
GGUF_TO_COST_DTYPE = {
    "f32": "fp32",
    "f16": "fp16",
    "bf16": "bf16",
    "q8_0": "q8_0",
    "q6_k": "q6_k",
    "q5_k_m": "q5_k_m",
    "q4_k_m": "q4_k_m",
    "q4_0": "q4_0",
    "iq4_xs": "iq4_xs",
}
# vLLM --dtype -> the cost model's weight format
VLLM_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
FIT_FREE = ("mfu", "mbu", "kernel_launch_us", "step_overhead_ms")


@dataclass(frozen=True)
class Measurement:
    """One number the engine produced for one model: ``metric`` in ``scenario``."""

    scenario: Scenario
    metric: str
    value: float


@dataclass(frozen=True)
class EngineCalibration:
    """What :func:`calibrate_engine` measured and fitted.

    ``heldout_mdape`` / ``train_mdape`` / ``before_mdape``: median absolute percentage error per
    metric and ``"all"`` (held-out, fitting part, and held-out with the profile in use before);
    ``rows``: one mapping per model (architecture, split, measured and predicted values).
    """

    engine: str
    hardware: Hardware
    profile: CostProfile
    path: Path | None
    heldout_mdape: dict[str, float]
    train_mdape: dict[str, float]
    before_mdape: dict[str, float]
    settings: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "hardware": self.hardware.to_dict(),
            "profile": self.profile.to_dict(),
            "path": str(self.path) if self.path else None,
            "heldout_mdape": self.heldout_mdape,
            "train_mdape": self.train_mdape,
            "before_mdape": self.before_mdape,
            "settings": self.settings,
            "rows": self.rows,
        }


# ------------------------------------------------------------------------------------ the models
def engine_architectures(parent: Architecture, engine: str, n: int, *, seed: int = 0) -> list[Architecture]:
    """``n`` pruned architectures of ``parent`` that ``engine`` loads; same seed → same list.

    Each keeps 1/3 to all of the parent's layers and ``ceil(h/2)..h`` of its ``h`` query heads
    (hidden size = query heads × head size, as llama.cpp's DeciLM reader needs). A third are uniform
    (one KV-head count and FFN width, a multiple of 256, for every layer); the others draw per layer:
    KV heads (a divisor of the query heads, at most the parent's), FFN width (a multiple of 256 up to
    the parent's), attention dropped (p 0.15) or FFN dropped (p 0.15), never both. A draw the engine
    cannot load (:func:`loadable_problems`) is drawn again.
    """
    if n < 1:
        raise ConfigError(f"the number of models must be >= 1, got {n!r}")
    ref = next((layer for layer in parent.layers if layer.attention and layer.ffn), None)
    if ref is None:
        raise ConfigError(f"{parent.name or 'the parent'} has no layer with both attention and an FFN to prune from")
    rng = random.Random(seed)
    archs: list[Architecture] = []
    attempts, problems = 0, list[str]()
    while len(archs) < n:
        attempts += 1
        if attempts > 200 * n:
            raise ConfigError(
                f"could not draw {n} architectures of {parent.name or 'the parent'} that {engine} loads "
                f"(last problems: {'; '.join(problems)})"
            )
        arch = _draw(parent, ref, rng, uniform=len(archs) % 3 == 0, name=f"calib-{seed}-{len(archs)}")
        problems = loadable_problems(arch, engine)
        if not problems:
            archs.append(arch)
    return archs


def _draw(parent: Architecture, ref: LayerSpec, rng: random.Random, *, uniform: bool, name: str) -> Architecture:
    heads = rng.randint(-(-ref.num_heads // 2), ref.num_heads)
    kv_choices = [d for d in range(1, min(heads, ref.num_kv_heads) + 1) if heads % d == 0]
    widths = list(range(256, max(256, ref.ffn_width) + 1, 256))
    depth = rng.randint(max(1, parent.num_layers // 3), parent.num_layers)

    def layer(drops: bool) -> LayerSpec:
        roll = rng.random() if drops else 1.0
        attention, ffn = roll >= 0.15, not 0.15 <= roll < 0.30
        return LayerSpec(
            attention=attention,
            num_heads=heads if attention else 0,
            num_kv_heads=rng.choice(kv_choices) if attention else 0,
            head_dim=ref.head_dim if attention else 0,
            ffn=ffn,
            ffn_width=rng.choice(widths) if ffn else 0,
        )

    layers = (layer(False),) * depth if uniform else (layer(False), *(layer(True) for _ in range(depth - 1)))
    return replace(parent, hidden_size=heads * ref.head_dim, layers=layers, name=name)


# ------------------------------------------------------------------------------------ timing
# An engine is timed in two steps: ``prepare`` turns a model's export into what the engine runs (a GGUF
# for llama.cpp, the checkpoint itself for vLLM), once; ``time`` runs it, once per pass, and returns the
# engine's own record of that run, which :func:`_measurements` reads (also from saved results, to refit).
Prepared = tuple[Path, dict[str, Any]]


def _prepare_llamacpp(model_dir: Path, work: Path, settings: dict[str, Any]) -> Prepared:
    from autocompress_opt.runtimes.llamacpp import CONVERTER_TYPES, convert_to_gguf, quantize

    gguf_type = settings["gguf_type"]
    t0 = time.perf_counter()
    converted = work / ("model.gguf" if gguf_type in CONVERTER_TYPES else "model-f16.gguf")
    gguf = convert_to_gguf(model_dir, converted, gguf_type if gguf_type in CONVERTER_TYPES else "f16")
    if gguf_type not in CONVERTER_TYPES:
        gguf = quantize(gguf, work / "model.gguf", gguf_type, threads=settings["threads"])
        converted.unlink()
    shutil.rmtree(model_dir, ignore_errors=True)  # the GGUF is what is timed
    return gguf, {"convert_s": round(time.perf_counter() - t0, 2), "gguf_mib": round(gguf.stat().st_size / 2**20, 1)}


def _time_llamacpp(gguf: Path, arch: Architecture, settings: dict[str, Any]) -> dict[str, Any]:
    from autocompress_opt.runtimes.llamacpp import bench

    result = bench(
        gguf,
        prompt_len=settings["prompt_len"],
        gen_len=settings["gen_len"],
        repetitions=settings["repetitions"],
        threads=settings["threads"],
    )
    return {"llama_bench": result}


def _llamacpp_measurements(run: Mapping[str, Any], settings: dict[str, Any]) -> list[Measurement]:
    """llama-bench's ``pp`` (prompt tokens/s of one prefill) and ``tg`` (tokens/s generating from an
    empty context) as cost-model metrics."""
    pp, tg = run["llama_bench"]["pp"], run["llama_bench"]["tg"]
    dtype = GGUF_TO_COST_DTYPE[settings["gguf_type"]]
    prefill = Scenario(dtype=dtype, input_len=settings["prompt_len"], output_len=1, concurrency=1)
    decode = Scenario(dtype=dtype, input_len=1, output_len=settings["gen_len"], concurrency=1)
    return [
        Measurement(prefill, "prefill_throughput_tok_s", pp),
        Measurement(decode, "decode_throughput_tok_s", tg),
    ]


def _prepare_vllm(model_dir: Path, work: Path, settings: dict[str, Any]) -> Prepared:
    return model_dir, {}


def _time_vllm(model_dir: Path, arch: Architecture, settings: dict[str, Any]) -> dict[str, Any]:
    from autocompress_opt.runtimes.vllm import vllm_timings

    data = vllm_timings(
        model_dir,
        vocab_size=arch.vocab_size,
        prompt_len=settings["prompt_len"],
        gen_len=settings["gen_len"],
        concurrencies=settings["concurrencies"],
        repetitions=settings["repetitions"],
        dtype=settings["vllm_dtype"],
        seed=settings["seed"],
        enforce_eager=settings["vllm_eager"],
    )
    return {"load_s": round(data["load_s"], 2), "vllm": data["vllm"], "timings": data["timings"]}


def _vllm_measurements(run: Mapping[str, Any], settings: dict[str, Any]) -> list[Measurement]:
    """What vLLM's timings of one model say, as cost-model metrics (``run["timings"]``: per concurrency,
    an int or, read back from JSON, its string). ``ttft_ms`` of ``c`` prompts is the
    time until the LAST of them has its first token (the wave's whole prefill), so it is compared as the
    wave's prefill throughput ``c·P / ttft``; the cost model's ``ttft_ms`` is the wave's MEAN, (c+1)/2c of
    it under chunked prefill (compared as TTFT, every model's concurrency-1 TTFT came out over-predicted
    and its concurrency-8 one under-predicted). ``tpot_ms``: one decode step of the ``c`` sequences."""
    dtype = VLLM_DTYPES[settings["vllm_dtype"]]
    measurements = []
    for c, values in sorted((int(c), values) for c, values in run["timings"].items()):
        scenario = Scenario(
            dtype=dtype, input_len=settings["prompt_len"], output_len=settings["gen_len"], concurrency=c
        )
        wave_tok_s = c * settings["prompt_len"] * 1e3 / values["ttft_ms"]
        measurements.append(Measurement(scenario, "prefill_throughput_tok_s", wave_tok_s))
        measurements.append(Measurement(scenario, "tpot_ms", values["tpot_ms"]))
    return measurements


_ENGINES: dict[str, tuple[Callable[..., Prepared], Callable[..., dict[str, Any]]]] = {
    "llamacpp": (_prepare_llamacpp, _time_llamacpp),
    "vllm": (_prepare_vllm, _time_vllm),
}
_MEASUREMENTS: dict[str, Callable[[Mapping[str, Any], dict[str, Any]], list[Measurement]]] = {
    "llamacpp": _llamacpp_measurements,
    "vllm": _vllm_measurements,
}


def _best(a: Measurement, b: Measurement) -> Measurement:
    """The faster of two measurements of one number: other work on a shared machine only ever slows a
    run, so the fastest pass is the closest to the engine's own speed."""
    if a.metric.endswith("_tok_s"):
        return a if a.value >= b.value else b
    return a if a.value <= b.value else b


def _fastest(engine: str, runs: Sequence[Mapping[str, Any]], settings: dict[str, Any]) -> list[Measurement]:
    """Each number of one model at its fastest over the engine's records of its passes."""
    best = _MEASUREMENTS[engine](runs[0], settings)
    for run in runs[1:]:
        best = [_best(a, b) for a, b in zip(best, _MEASUREMENTS[engine](run, settings))]
    return best


def _measured(measurements: Sequence[Measurement]) -> dict[str, float]:
    """A model's numbers keyed as its result row shows them (:func:`_metric_key`)."""
    return {_metric_key(m.scenario, m.metric): round(m.value, 4) for m in measurements}


def _export(arch: Architecture, tokenizer: Any, out: Path, seed: int) -> Path:
    """A random-weight checkpoint of ``arch`` in bf16, as the engines read it (plain Llama or DeciLM)."""
    import torch

    from autocompress_opt.hf.build import build_model
    from autocompress_opt.prune.export import export_model

    model = build_model(arch.active(), dtype=torch.bfloat16, seed=seed)
    return export_model(model, arch, out, tokenizer=tokenizer, decilm=True, force=True)


# ------------------------------------------------------------------------------------ the fit
def _mdape_by_metric(observations: Sequence[Observation], profile: CostProfile | None) -> dict[str, float]:
    errors = relative_errors(observations, profile) if observations else np.array([])
    out = {"all": mdape(errors)}
    for metric in sorted({o.metric for o in observations}):
        out[metric] = mdape([e for e, o in zip(errors, observations) if o.metric == metric])
    return out


def _metric_key(scenario: Scenario, metric: str) -> str:
    """``tpot_ms``, or ``tpot_ms@c8`` at concurrency 8: one key per measured number of a model."""
    return metric if scenario.concurrency == 1 else f"{metric}@c{scenario.concurrency}"


def calibrate_engine(
    engine: str,
    *,
    model: str = "smollm2-135m",
    hardware: str = "cpu",
    n_models: int = 32,
    heldout_fraction: float = 0.5,
    seed: int = 0,
    gguf_type: str = "f16",
    vllm_dtype: str = "bfloat16",
    vllm_eager: bool = False,
    prompt_len: int = 128,
    gen_len: int = 32,
    concurrencies: Sequence[int] = (1, 8),
    repetitions: int = 3,
    passes: int = 2,
    threads: int | None = None,
    out: Path | None = None,
    progress: bool = True,
) -> EngineCalibration:
    """Time ``n_models`` pruned models of ``model`` in the real ``engine``, fit its profile for
    ``hardware``, report held-out error and save the profile (module doc).

    Raises :class:`ConfigError` for a bad setting (before any model is built) and
    :class:`~autocompress_opt.runtimes.install.EngineMissing` when the engine is not installed.
    """
    from autocompress_opt.runtimes import install

    settings = _check_settings(
        engine,
        n_models=n_models,
        heldout_fraction=heldout_fraction,
        seed=seed,
        gguf_type=gguf_type,
        vllm_dtype=vllm_dtype,
        vllm_eager=bool(vllm_eager),
        prompt_len=prompt_len,
        gen_len=gen_len,
        concurrencies=concurrencies,
        repetitions=repetitions,
        passes=passes,
        threads=threads,
    )
    catalog_hw = get_hardware(hardware)
    (install.llamacpp if engine == "llamacpp" else install.vllm)()  # EngineMissing before any work
    from tqdm.auto import tqdm

    # The host CPU's peaks are measured now and kept with the profile (its efficiencies are fractions of
    # them); a GPU keeps its datasheet figures.
    reference = measure_cpu_figures() if hardware == "cpu" else {}
    hw = catalog_hw.with_figures(reference)

    from autocompress_opt.hf.loading import load_model

    loaded = load_model(model, cache=False)
    parent, tokenizer = loaded.architecture, loaded.tokenizer
    del loaded
    archs = engine_architectures(parent, engine, n_models, seed=seed)  # the engine's own loading rules
    prepare, timer = _ENGINES[engine]

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=f"calibrate-{engine}-") as tmp_name:
        tmp = Path(tmp_name)
        prepared: list[Path] = []
        bar = tqdm(archs, desc=f"exporting {len(archs)} models for {engine}", disable=not progress, unit="model")
        for i, arch in enumerate(bar):
            work = tmp / f"model-{i}"
            work.mkdir()
            artefact, details = prepare(_export(arch, tokenizer, work / "hf", seed + i), work, settings)
            prepared.append(artefact)
            rows.append(
                {
                    "model": i,
                    "summary": arch.summary(),
                    "params": arch.active().num_params,
                    "uniform": arch.active().is_uniform,
                    **details,
                    "passes": [],
                }
            )
        bar.close()
        # every number keeps its fastest pass (module doc)
        steps = interleaved_passes(len(archs), passes)
        bar = tqdm(steps, desc=f"timing {engine} on {hw.name}", disable=not progress, unit="run")
        for _, i in bar:
            t0 = time.perf_counter()
            run = timer(prepared[i], archs[i], settings)
            measured = _measured(_MEASUREMENTS[engine](run, settings))
            rows[i]["passes"].append({"measured": measured, "seconds": round(time.perf_counter() - t0, 1), **run})
            bar.set_postfix_str(", ".join(f"{k} {v:.4g}" for k, v in measured.items()))
        bar.close()
    return _fit_and_save(engine, {**settings, "model": model}, catalog_hw, reference, archs, rows, out)


def _fit_and_save(
    engine: str,
    settings: dict[str, Any],
    catalog_hw: Hardware,
    reference: dict[str, Any],
    archs: list[Architecture],
    rows: list[dict[str, Any]],
    out: Path | None,
) -> EngineCalibration:
    """Each model's fastest numbers over its passes (``rows[i]["passes"]``), the seeded split, the fit
    to the fitting part on the measured host figures ``reference``, every model predicted, the profile
    saved."""
    hw, cost_engine = catalog_hw.with_figures(reference), get_engine(engine)
    observations: list[list[Observation]] = []
    for arch, row in zip(archs, rows):
        best = _fastest(engine, row["passes"], settings)
        observations.append(
            [Observation(arch, hw, cost_engine, m.scenario, m.metric, m.value, label=arch.name) for m in best]
        )
        row["measured"] = _measured(best)
    model = settings["model"]
    train, heldout = heldout_split(len(archs), settings["heldout_fraction"], settings["seed"])
    train_obs = [o for i in train for o in observations[i]]
    held_obs = [o for i in heldout for o in observations[i]]
    before = get_profile(engine, hw.name)  # what `autocompress cost` used until now, on the catalog's figures
    before_obs = [replace(o, hardware=catalog_hw) for o in held_obs]
    start = replace(PRIORS[engine], hardware=hw.name, reference=reference)
    profile = fit_profile(train_obs, start, free=FIT_FREE, prior_weight=1e-4)
    errors = {
        "heldout": _mdape_by_metric(held_obs, profile),
        "train": _mdape_by_metric(train_obs, profile),
        "before": _mdape_by_metric(before_obs, before),
    }
    for i, row in enumerate(rows):
        row["split"] = "heldout" if i in heldout else "train"
        row["predicted"] = {
            _metric_key(o.scenario, o.metric): round(float(p), 4)
            for o, (p, _) in zip(observations[i], predict(observations[i], profile))
        }
    recorded = {**settings, "concurrencies": list(settings["concurrencies"])}
    profile = replace(
        profile,
        fit={
            "method": f"log-space least squares (L-BFGS) on real {engine} timings of pruned {model} models",
            "date": f"{datetime.now(timezone.utc):%Y-%m-%d}",
            "free": list(FIT_FREE),
            "settings": recorded,
            "train_mdape": errors["train"],
            "heldout_mdape": errors["heldout"],
            "heldout": [
                {
                    "id": f"{o.label}/{_metric_key(o.scenario, o.metric)}",
                    "regime": regime_of(o.scenario),
                    "phase": METRIC_PHASES[o.metric],
                    "time_ratio": round(time_ratio(o.metric, o.value, float(p)), 4),
                }
                for o, (p, _) in zip(held_obs, predict(held_obs, profile))
            ],
        },
    )
    path = out or user_profile_dir() / f"{hw.name}-{engine}.yaml"
    save_profile(
        path,
        [profile],
        header=f"{engine} profile of {hw.name}, written by 'autocompress calibrate --engine {engine}'.\n"
        f"held-out MdAPE {errors['heldout']['all']:.1%} over {len(heldout)} models "
        f"({len(held_obs)} measurements); before calibration {errors['before']['all']:.1%}",
    )
    clear_cache()
    return EngineCalibration(
        engine=engine,
        hardware=hw,
        profile=profile,
        path=path,
        heldout_mdape=errors["heldout"],
        train_mdape=errors["train"],
        before_mdape=errors["before"],
        settings={**recorded, "reference": reference},
        rows=rows,
    )


def refit_engine(results: Mapping[str, Any], *, out: Path | None = None) -> EngineCalibration:
    """Fit again, at this code, the timings an earlier :func:`calibrate_engine` measured (its
    :meth:`EngineCalibration.to_dict`, as ``benchmarks/bench_engine_calibration.py`` writes it): the same
    models (drawn again from the same seed, and checked to be the same), the same split, each number's
    fastest pass, the same measured host figures. For a change of the cost model or of how a timing is
    compared with it, without timing the engine again (vLLM's compiled loads take about 100 s a model)."""
    from autocompress_opt.hf.loading import load_model

    engine, settings, rows = results["engine"], dict(results["settings"]), list(results["rows"])
    if engine not in CALIBRATED_ENGINES:
        raise ConfigError(f"unknown engine {engine!r} in the results; one of {', '.join(CALIBRATED_ENGINES)}")
    reference = dict(settings.get("reference") or {})
    catalog_hw = get_hardware(results["hardware"]["name"])
    parent = load_model(settings["model"], cache=False).architecture
    archs = engine_architectures(parent, engine, len(rows), seed=settings["seed"])
    for arch, row in zip(archs, rows):
        if arch.summary() != row["summary"]:
            raise ConfigError(
                f"model {row['model']} was {row['summary']!r} when timed but is drawn as {arch.summary()!r} at this "
                "code: the timings belong to other models; time them again (calibrate_engine)"
            )
    settings["concurrencies"] = tuple(settings["concurrencies"])
    return _fit_and_save(engine, settings, catalog_hw, reference, archs, rows, out)


def _check_settings(engine: str, **s: Any) -> dict[str, Any]:
    """The sweep's settings, each checked (the error names the value and what is valid)."""
    check_choice(engine, "the engine to calibrate", CALIBRATED_ENGINES)
    for name in ("n_models", "prompt_len", "repetitions", "passes"):
        check_int(s[name], name, 2 if name == "n_models" else 1)
    check_int(s["gen_len"], "gen_len", 2)
    check_int(s["seed"], "seed", 0)
    frac = check_fraction(s["heldout_fraction"], "heldout_fraction", one=False)
    if round(s["n_models"] * frac) >= s["n_models"]:
        raise ConfigError(f"holding out {frac} of {s['n_models']} models leaves none to fit")
    check_choice(s["gguf_type"], "GGUF type", GGUF_TO_COST_DTYPE)
    check_choice(s["vllm_dtype"], "vLLM dtype", VLLM_DTYPES)
    conc = tuple(s["concurrencies"])
    if not conc:
        raise ConfigError("concurrencies must hold at least one positive int, got none")
    for c in conc:
        check_int(c, f"concurrencies {s['concurrencies']!r}: each")
    s["concurrencies"] = tuple(sorted(set(conc)))
    threads = check_int(s["threads"], "threads", also=(None,))
    import os

    s["threads"] = threads or len(os.sched_getaffinity(0))
    return s
