"""Check the cost model against published measurements (and fit engine profiles to them).

A measurements CSV has the columns of ``shared/reference/measurements.csv``::

    id,model,layers,hidden,ffn,heads,kv_heads,head_dim,vocab,tied_embeddings,hardware,tp,engine,
    engine_detail,weight_dtype,concurrency,input_len,output_len,metric,value,source

and optionally ``arrival`` (burst, steady, poisson; default burst), ``requests`` (a burst's size),
``rate`` (poisson requests/s), ``online`` (true: through the engine's HTTP front end), ``kv_dtype``,
``engine_options`` (``memory_fraction=0.95;max_seqs=64``: the run's non-default engine settings),
``engine_version``, ``stated`` (which of ``input``,
``output``, ``concurrency`` the source states; the others were inferred, e.g. llama-bench's
defaults) and ``url``. Rows with the same ``source`` text come from one publication: they are held
out together in leave-one-source-out validation.

A row whose shape columns (``layers`` … ``tied_embeddings``) are all empty names a known model in
``model`` instead (``autocompress arch --model NAME``): how the mixture-of-experts and hybrid
Mamba-2 rows (``qwen3-30b-a3b``, ``gpt-oss-120b``, ``nemotron-3-nano-30b-a3b`` …) give their
architecture, which five dense columns cannot describe. A dense row describes its shape inline.

Each row becomes an :class:`~autocompress_opt.serving.fitting.Observation`; :func:`validate` returns the
prediction, the measurement, the signed error and whether the physical bound (roofline floor for a
latency, ceiling for a throughput) is respected.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from autocompress_opt._data import DATA_DIR
from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.arch.hybrid import is_sparse
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.costmodel import Scenario, regime_of
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.fitting import Observation, fit_profile, fit_routed_passes, predict, relative_errors
from autocompress_opt.serving.hardware import get_hardware
from autocompress_opt.serving.profiles import (
    FITTED_PARAMETERS,
    METRIC_PHASES,
    PRIORS,
    CostProfile,
    get_profile,
    time_ratio,
)

__all__ = [
    "SEGMENTS",
    "SHIPPED_MEASUREMENTS",
    "Publication",
    "ValidationRow",
    "family_of",
    "fit_published",
    "free_parameters",
    "is_moe",
    "leave_one_source_out",
    "load_measurements",
    "median_of_medians",
    "per_publication",
    "segment_of",
    "setup_of",
    "validate",
]

SHIPPED_MEASUREMENTS = DATA_DIR / "measurements.csv"
# The columns that describe a dense row's shape inline; all empty: ``model`` names a known model.
SHAPE_COLUMNS = ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab", "tied_embeddings")
REQUIRED_COLUMNS = (
    "id",
    "model",
    "layers",
    "hidden",
    "ffn",
    "heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "tied_embeddings",
    "hardware",
    "tp",
    "engine",
    "weight_dtype",
    "concurrency",
    "input_len",
    "output_len",
    "metric",
    "value",
)


@dataclass(frozen=True)
class ValidationRow:
    id: str
    model: str
    hardware: str
    engine: str
    regime: str
    metric: str
    measured: float
    predicted: float
    error: float  # predicted / measured - 1
    bound: float  # floor (latency) or ceiling (throughput) at 100 % of peak
    bound_ok: bool
    source: str
    routed_passes: float = 0.0  # the profile's passes over a routed pair's activations it was predicted with
    segment: str = ""  # datacenter or consumer GPU / llama.cpp (segment_of)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _family(model: str) -> str:
    lowered = model.lower()
    for family in ("qwen3", "qwen2", "mistral"):
        if family in lowered:
            return family
    return "llama"


def _known_model(row: dict[str, str]) -> Architecture:
    """The known architecture a shape-less row names; the error lists the names that are valid."""
    known = known_architectures()
    name = row["model"].strip().lower()
    if name not in known:
        raise ValueError(
            f"model {row['model']!r} is not a known model and the row has no shape columns "
            f"({', '.join(SHAPE_COLUMNS)}); known models: {', '.join(sorted(known))}"
        )
    return known[name]


def row_architecture(row: dict[str, str]) -> Architecture:
    """A measurements row's architecture: the known model it names when its shape columns are all
    empty, else the dense shape they describe (a few filled and others empty is an error)."""
    empty = [c for c in SHAPE_COLUMNS if not (row.get(c) or "").strip()]
    if len(empty) == len(SHAPE_COLUMNS):
        return _known_model(row)
    if empty:
        raise ValueError(
            f"shape column(s) {', '.join(empty)} empty: fill all of {', '.join(SHAPE_COLUMNS)} "
            "(a dense shape) or none (model names a known model)"
        )
    return _dense_architecture(row)


def _dense_architecture(row: dict[str, str]) -> Architecture:
    return Architecture.from_hf_config(
        {
            "model_type": _family(row["model"]),
            "vocab_size": int(row["vocab"]),
            "hidden_size": int(row["hidden"]),
            "num_hidden_layers": int(row["layers"]),
            "num_attention_heads": int(row["heads"]),
            "num_key_value_heads": int(row["kv_heads"]),
            "head_dim": int(row["head_dim"]),
            "intermediate_size": int(row["ffn"]),
            "tie_word_embeddings": row["tied_embeddings"].strip().lower() in ("true", "1", "yes"),
            # The CSV has no window column: rows are full-attention models (without this key a
            # mistral row would take MistralConfig's default 4096-token window).
            "sliding_window": None,
        },
        name=row["model"],
    )


def _row_to_observation(row: dict[str, str], where: str) -> tuple[Observation, str]:
    try:
        arch = row_architecture(row)
        concurrency = row["concurrency"].strip()
        scenario = Scenario(
            dtype=row["weight_dtype"].strip(),
            input_len=int(row["input_len"]),
            output_len=int(row["output_len"]),
            concurrency="max" if concurrency == "max" else int(concurrency),
            tp=int(row["tp"]),
            kv_dtype=(row.get("kv_dtype") or "").strip() or None,
            arrival=(row.get("arrival") or "").strip() or "burst",
            requests=int(row["requests"]) if (row.get("requests") or "").strip() else None,
            rate=float(row["rate"]) if (row.get("rate") or "").strip() else None,
            online=(row.get("online") or "").strip().lower() in ("true", "1", "yes"),
        )
        obs = Observation(
            arch,
            get_hardware(row["hardware"].strip()),
            get_engine(row["engine"].strip()).with_options(**_engine_options(row.get("engine_options") or "")),
            scenario,
            row["metric"].strip(),
            float(row["value"]),
            label=row["id"],
        )
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return obs, row.get("source", "")


def _engine_options(text: str) -> dict[str, float]:
    """``"memory_fraction=0.95;max_seqs=64"`` → ``{"memory_fraction": 0.95, "max_seqs": 64.0}``."""
    options: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"engine option {item!r} is not KEY=VALUE")
        options[key.strip()] = float(value)
    return options


def load_measurements(path: str | Path = SHIPPED_MEASUREMENTS) -> list[tuple[Observation, str]]:
    """Parse a measurements CSV into (observation, source) pairs; errors name the row."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"measurements file {str(path)!r} is a folder; give the CSV file itself"
            f" (columns as in {SHIPPED_MEASUREMENTS.name})"
        )
    if not path.is_file():
        raise ConfigError(f"measurements file {str(path)!r} does not exist")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path} lacks column(s) {', '.join(missing)}; required: {', '.join(REQUIRED_COLUMNS)}")
        return [_row_to_observation(row, f"{path}:{n + 2} ({row.get('id', '?')})") for n, row in enumerate(reader)]


def validate(rows: Sequence[tuple[Observation, str]], profile: CostProfile | None = None) -> list[ValidationRow]:
    """Predict every row with its (hardware, engine) profile (or ``profile``) and compare."""
    observations = [obs for obs, _ in rows]
    results = []
    for (obs, source), (pred, bound) in zip(rows, predict(observations, profile)):
        pred, bound = float(pred), float(bound)
        is_latency = obs.metric.endswith("_ms")
        results.append(
            ValidationRow(
                id=obs.label,
                model=obs.arch.name,
                hardware=obs.hardware.name,
                engine=obs.engine.name,
                regime=regime_of(obs.scenario),
                metric=obs.metric,
                measured=obs.value,
                predicted=pred,
                error=pred / obs.value - 1,
                bound=bound,
                bound_ok=bound <= obs.value if is_latency else bound >= obs.value,
                source=source,
                routed_passes=round(float(_used(obs, profile).routed_passes), 4),
                segment=segment_of(obs),
            )
        )
    return results


def _used(obs: Observation, profile: CostProfile | None) -> CostProfile:
    """The profile a row is predicted with: ``profile``, else its (hardware, engine)'s own."""
    return profile or get_profile(obs.engine.name, obs.hardware.name)


_METHOD = "log-space least squares (L-BFGS) with a weak prior toward typical published efficiencies"


def free_parameters(observations: Sequence[Observation]) -> tuple[list[str], list[str]]:
    """(plain parameters, per-dtype MFUs) an engine's rows can pin: always fewer than the rows.

    ``mbu`` from 2 rows and ``step_overhead_ms`` from 3 (decode is bandwidth and overhead bound),
    then ``mfu`` from 4, the per-request front-end latency from 5 where an online row times a first
    token (TTFT or E2E), ``kernel_launch_us`` next, the all-reduce latency from 7 where a row is tensor-
    parallel, and an FP4 MFU from 8 where a row is FP4. One row fits nothing: the prior."""
    n = len(observations)
    order = ["mbu", "step_overhead_ms", "mfu"]
    if any(o.scenario.online and o.metric in ("ttft_ms", "e2e_latency_ms") for o in observations):
        order.append("request_overhead_ms")
    order.append("kernel_launch_us")
    free = order[: max(min(n - 1, len(order)), 0)]
    if n >= 7 and any(o.scenario.tp > 1 for o in observations):
        free.append("allreduce_latency_us")
    fp4 = ["fp4"] if n >= 8 and any(o.scenario.dtype == "fp4" for o in observations) else []
    return free, fp4


def _fit_engine(engine: str, observations: Sequence[Observation]) -> CostProfile:
    start = PRIORS.get(engine, CostProfile(engine))
    free, fp4 = free_parameters(observations)
    if not free:
        return start
    return fit_profile(observations, start, free=free, free_mfu_dtypes=fp4)


def is_moe(obs: Observation) -> bool:
    """Whether a row's model has mixture-of-experts or Mamba-2 layers: the engine-wide profiles are
    fitted to the dense rows only; these rows fit ``routed_passes`` alone (:func:`fit_published`)."""
    return is_sparse(obs.arch)


def family_of(obs: Observation) -> str:
    """The row's model family (``llama``, ``qwen3_moe``, ``gpt_oss``, ``nemotron_h`` …): errors are
    reported per family."""
    return obs.arch.family


# The two kinds of row whose errors are reported apart (issue 45): a better predictor of the
# datacenter rows (e.g. NVIDIA AIConfigurator's kernels) must not hide a loss on the consumer ones,
# which keep this toolkit's own calibrated model.
SEGMENTS: tuple[str, ...] = ("datacenter", "consumer GPU / llama.cpp")


def segment_of(obs: Observation) -> str:
    """Which of :data:`SEGMENTS` a row belongs to: ``consumer GPU / llama.cpp`` for a GeForce card
    (a device with an FP16-accumulate rate of its own, ``Hardware.fp16_acc_tflops``), the host CPU,
    or any row served by llama.cpp; ``datacenter`` for the rest (H100, H200, B200 with vLLM or
    TensorRT-LLM)."""
    consumer = obs.hardware.fp16_acc_tflops is not None or obs.hardware.name == "cpu" or obs.engine.name == "llamacpp"
    return SEGMENTS[1] if consumer else SEGMENTS[0]


def fit_published(rows: Sequence[tuple[Observation, str]], holdout: bool = True) -> list[CostProfile]:
    """One engine-wide profile per engine, fitted to that engine's dense rows (parameters:
    :func:`free_parameters`, shared by every device and row of the engine); then, with those held,
    ``routed_passes`` (how many times a routed pair's activations cross memory, exactly 0 in a dense
    model) fitted to the engine's MoE/hybrid rows (:func:`is_moe`), the one parameter they fit
    (:func:`~autocompress_opt.serving.fitting.fit_routed_passes`). An engine without MoE rows takes
    the value fitted to every engine's MoE rows at once (it is dimensionless: it carries).

    With ``holdout`` each engine is also refitted without each source in turn (leave-one-source-
    out: rows sharing a ``source`` text are held out together; an engine left with no rows falls
    back to its prior), and the held-out residuals are stored in ``fit["heldout"]`` (dense rows)
    and ``fit["heldout_moe"]`` (MoE/hybrid rows): what :meth:`CostProfile.interval` turns into
    error bars, each kind from its own rows.
    """
    dense = [(obs, src) for obs, src in rows if not is_moe(obs)]
    moe = [(obs, src) for obs, src in rows if is_moe(obs)]
    by_engine: dict[str, list[tuple[Observation, str]]] = {}
    for obs, source in dense:
        by_engine.setdefault(obs.engine.name, []).append((obs, source))
    for obs, _ in moe:  # an engine with MoE rows only keeps its prior's dense parameters
        by_engine.setdefault(obs.engine.name, [])
    held_rows = {r.id: r for r in leave_one_source_out(rows)} if holdout else {}
    dense_fits = {engine: _fit_engine(engine, [o for o, _ in items]) for engine, items in by_engine.items()}
    moe_engines = {o.engine.name for o, _ in moe}
    # An engine without MoE rows takes the value every engine's MoE rows fit (fitted only when one exists).
    pooled = fit_routed_passes([o for o, _ in moe], dense_fits) if moe and set(by_engine) - moe_engines else dense_fits
    fitted: dict[str, CostProfile] = {}
    for engine, items in sorted(by_engine.items()):
        observations = [o for o, _ in items]
        moe_observations = [o for o, _ in moe if o.engine.name == engine]
        if moe_observations:
            profile = _rounded(fit_routed_passes(moe_observations, dense_fits[engine]))
        else:
            profile = _rounded(pooled[engine])
        free, fp4 = free_parameters(observations)
        fit: dict[str, object] = {
            "method": _METHOD,
            "free": free
            + [f"mfu_by_dtype.{d}" for d in fp4]
            + (["routed_passes"] if moe_observations else ["routed_passes (every engine's MoE rows)"] if moe else []),
            "rows": {o.label: round(float(e), 4) for o, e in zip(observations, relative_errors(observations, profile))},
        }
        if holdout:
            fit["heldout"] = [_residual(held_rows[o.label]) for o in observations]
            fit["heldout_moe"] = [_residual(held_rows[o.label]) for o in moe_observations]
        fitted[engine] = replace(profile, fit=fit)
    return [fitted[e] for e in sorted(fitted)]


def _residual(row: ValidationRow) -> dict[str, object]:
    return {
        "id": row.id,
        "regime": row.regime,
        "phase": METRIC_PHASES[row.metric],
        "time_ratio": round(time_ratio(row.metric, row.measured, row.predicted), 4),
    }


def leave_one_source_out(rows: Sequence[tuple[Observation, str]]) -> list[ValidationRow]:
    """Each row predicted by its engine's profile refitted without the row's whole source (the
    publication it came from): the dense parameters to the engine's other dense rows, then
    ``routed_passes`` to its other sources' MoE/hybrid rows (:func:`fit_published`; every other
    engine's where none of its own is left), less any row of the same setup (:func:`setup_of`:
    model, device, engine) as one of the held-out source's; out-of-sample errors. A source without
    dense rows is predicted with the dense parameters fitted to all of them; each row carries the
    ``routed_passes`` it was predicted with (one value per fold)."""
    dense = [(obs, src) for obs, src in rows if not is_moe(obs)]
    moe = [(obs, src) for obs, src in rows if is_moe(obs)]
    fits: dict[tuple[str, str], CostProfile] = {}

    def profile_without(engine: str, source: str) -> CostProfile:
        rest = [obs for obs, src in dense if obs.engine.name == engine and src != source]
        key = (engine, source if any(src == source for obs, src in dense if obs.engine.name == engine) else "")
        if key not in fits:
            fits[key] = _fit_engine(engine, rest) if rest else PRIORS.get(engine, CostProfile(engine))
        return fits[key]

    def moe_profile_without(engine: str, source: str) -> CostProfile:
        # The same model on the same device and engine measured by another publication (a later
        # release of one benchmark table, say) is not independent evidence: held out with it.
        setups = {setup_of(obs) for obs, src in moe if src == source}
        rest = [obs for obs, src in moe if src != source and setup_of(obs) not in setups]
        mine = [obs for obs in rest if obs.engine.name == engine]
        if mine:
            return fit_routed_passes(mine, profile_without(engine, source))
        # No row of this engine left: the value every other engine's rows fit (as fit_published).
        starts = {name: profile_without(name, source) for name in {engine} | {obs.engine.name for obs in rest}}
        return fit_routed_passes(rest, starts)[engine]

    out: dict[str, ValidationRow] = {}
    for source in sorted({src for _, src in rows}):
        held = [(obs, src) for obs, src in rows if src == source]
        for engine in sorted({obs.engine.name for obs, _ in held}):
            has_moe = any(is_moe(obs) and obs.engine.name == engine for obs, _ in held)
            profile = moe_profile_without(engine, source) if has_moe else profile_without(engine, source)
            for row in validate([(obs, src) for obs, src in held if obs.engine.name == engine], profile):
                out[row.id] = row
    return [out[obs.label] for obs, _ in rows if obs.label in out]


def setup_of(obs: Observation) -> tuple[str, str, str]:
    """(model, device, engine) of a row: two publications measuring the same setup (two releases of
    one benchmark table) are one experiment repeated, held out together from ``routed_passes``."""
    return (obs.arch.name, obs.hardware.name, obs.engine.name)


@dataclass(frozen=True)
class Publication:
    """One source's held-out errors (:func:`per_publication`)."""

    source: str
    moe: bool  # its MoE/hybrid rows (True) or its dense rows (False)
    rows: int
    median: float  # median |error|
    worst: float  # max |error|


def per_publication(results: Sequence[ValidationRow], moe_ids: set[str]) -> list[Publication]:
    """Median and max |error| of each source's dense rows and of its MoE/hybrid rows (``moe_ids``):
    one figure per publication, so one long sweep weighs as much as one table row. Sorted by kind,
    then source."""
    groups: dict[tuple[bool, str], list[float]] = {}
    for r in results:
        groups.setdefault((r.id in moe_ids, r.source), []).append(abs(r.error))
    return [
        Publication(source, moe, len(errors), float(np.median(errors)), max(errors))
        for (moe, source), errors in sorted(groups.items())
    ]


def median_of_medians(publications: Sequence[Publication], moe: bool) -> float | None:
    """The median over publications of their median |error| (dense or MoE/hybrid); None without one."""
    medians = [p.median for p in publications if p.moe == moe]
    return float(np.median(medians)) if medians else None


def _rounded(profile: CostProfile) -> CostProfile:
    """Four significant digits: the fit is not more precise than that."""
    sig = lambda v: float(f"{v:.4g}")
    return profile.with_parameters(
        **{k: sig(getattr(profile, k)) for k in FITTED_PARAMETERS},
        mfu_by_dtype={k: sig(v) for k, v in profile.mfu_by_dtype.items()},
    )
