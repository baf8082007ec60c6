"""NVIDIA AIConfigurator as an optional per-operation latency backend (the ``aic`` extra).

AIConfigurator (``aiconfigurator`` / ``aiconfigurator-core`` 0.12, Apache-2.0) ships kernel
latencies measured per GPU and serving engine (GEMM by shape and quantisation, context and
generation attention, element-wise ops, all-reduce) and a compiled engine that interpolates them.
Its own model builders read one uniform config per model family; here the same operations are
built **per layer** from an :class:`~autocompress_opt.arch.Architecture`, so a heterogeneous
architecture (each layer its own heads, KV heads, FFN width, or no attention / no FFN) is priced
by summing each layer's measured lookups. Batching and scheduling stay this toolkit's: the backend
prices one prefill of ``batch`` prompts and one decode step of ``batch`` sequences; the caller
(:func:`estimate_cost_aic`) composes them into TTFT, TPOT, E2E and throughput for a static batch.

``aiconfigurator_core`` is imported only inside the functions that need it, so importing this
module (and :mod:`autocompress_opt`) never loads it. The per-op surface used is
``EngineHandle.for_database(db).evaluate_ops_json`` over ``build_ops_json([...])`` (see
``aiconfigurator_core/sdk/operations/README.md``: the old ``PerfDatabase.query_*`` methods were
removed in 0.12); the op constructors follow ``aiconfigurator_core/sdk/models/llama.py``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autocompress_opt.errors import ConfigError

if TYPE_CHECKING:
    from autocompress_opt.arch.architecture import Architecture, LayerSpec
    from autocompress_opt.serving.costmodel import CostEstimate, Scenario
    from autocompress_opt.serving.engine_models import Engine
    from autocompress_opt.serving.fitting import Observation
    from autocompress_opt.serving.targets import Target

__all__ = [
    "BACKENDS",
    "DTYPES",
    "ENGINES",
    "INSTALL_HINT",
    "SYSTEMS",
    "AicPricer",
    "aic_installed",
    "backend_check",
    "check_covered",
    "estimate_cost_aic",
    "estimate_cost_backend",
    "predict_rows",
    "resolve_backend",
]

INSTALL_HINT = "pip install 'autocompress-opt[aic]'"
BACKENDS = ("auto", "own", "aic")

# Our hardware catalog name -> AIConfigurator system (aiconfigurator_core/systems/<system>.yaml with
# measured data under systems/data/<system>/). Only datacenter parts both catalogs hold.
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}
# Our engine name -> AIConfigurator backend. It also has sglang; we have no sglang engine model.
ENGINES = {"vllm": "vllm", "trtllm": "trtllm"}
# Our weight format -> AIConfigurator GEMMQuantMode / KVCacheQuantMode / FMHAQuantMode names.
# fp16 has no table of its own there; bf16 tensor-core rates are the same on these parts.
DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}
KV_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
# Decode contexts sampled to average a request's TPOT: attention time is near-linear in context,
# so a few evenly spaced steps give the mean within interpolation error.
_TPOT_SAMPLES = 8


def aic_installed() -> bool:
    """True when ``aiconfigurator_core`` can be imported (nothing is imported here)."""
    return importlib.util.find_spec("aiconfigurator_core") is not None


def _require_installed() -> None:
    if not aic_installed():
        raise ConfigError(f"--backend aic needs AIConfigurator, which is not installed: {INSTALL_HINT}")


def check_covered(arch: Architecture, hardware: str, engine: str, scenario: Scenario) -> None:
    """:class:`ConfigError` naming the first thing the backend cannot price, with what would be
    valid: hardware, engine, weight / KV format, arrival regime, or a MoE / Mamba-2 layer."""
    if hardware not in SYSTEMS:
        raise ConfigError(
            f"the aic backend has no measured data for hardware {hardware!r}; it covers {', '.join(SYSTEMS)}"
        )
    if engine not in ENGINES:
        raise ConfigError(f"the aic backend does not model engine {engine!r}; it covers {', '.join(ENGINES)}")
    if scenario.dtype not in DTYPES:
        raise ConfigError(
            f"the aic backend has no GEMM tables for weight format {scenario.dtype!r}; valid: {', '.join(DTYPES)}"
        )
    kv = _kv_dtype(engine, scenario.dtype, scenario.kv_dtype)
    if kv not in KV_DTYPES:
        raise ConfigError(
            f"the aic backend has no attention tables for KV format {kv!r}; valid: {', '.join(KV_DTYPES)}"
        )
    if scenario.arrival != "burst" or scenario.online:
        raise ConfigError(
            f"the aic backend prices a static batch (arrival 'burst', offline); got arrival {scenario.arrival!r}"
            f"{' online' if scenario.online else ''}: use --backend own for steady, poisson or online serving"
        )
    waves = (
        scenario.requests is not None
        and scenario.concurrency != "max"
        and scenario.requests > int(scenario.concurrency)
    )
    if waves:
        raise ConfigError(
            f"the aic backend prices one wave; --requests {scenario.requests} > --concurrency {scenario.concurrency}: "
            "use --backend own to schedule several waves"
        )
    if aic_installed():  # what this system's database measured (Hopper has no FP4 GEMMs, vLLM no FP8 prefill FMHA)
        _check_measured(SYSTEMS[hardware], ENGINES[engine], scenario.dtype, kv)
    if any(layer.moe is not None or layer.mamba is not None for layer in arch.layers):
        raise ConfigError(
            "the aic backend prices dense attention/MLP layers only; MoE and Mamba-2 layers: use --backend own"
        )


def _kv_dtype(engine: str, dtype: str, kv_dtype: str | None) -> str:
    """The KV format priced: the user's, else the engine's default for the weight format (as the own model)."""
    from autocompress_opt.serving.engine_models import get_engine

    return kv_dtype or get_engine(engine).default_kv_dtype(dtype)


def _check_measured(system: str, backend: str, dtype: str, kv_dtype: str) -> None:
    """:class:`ConfigError` unless the (system, backend) database holds GEMMs in ``dtype`` and
    generation attention over a ``kv_dtype`` cache, naming the formats it does hold."""
    database, _ = _database(system, backend)
    with _quiet():  # the first read of the modes loads the tables, with their deferred warnings
        modes = database.supported_quant_mode
        gemm, attention = modes.get("gemm", []), modes.get("generation_attention", [])
    for ours, table, theirs, what in (
        (dtype, DTYPES, {str(m) for m in gemm}, "GEMMs"),
        (kv_dtype, KV_DTYPES, {str(m) for m in attention}, "decode attention"),
    ):
        if table[ours] not in theirs:
            valid = [name for name, mode in table.items() if mode in theirs]
            raise ConfigError(
                f"AIConfigurator measured no {what} in {ours!r} on {system} with {backend}; valid: {', '.join(valid)}"
            )


def resolve_backend(requested: str, arch: Architecture, hardware: str, engine: str, scenario: Scenario) -> str:
    """The backend that prices a request: ``own`` or ``aic``. ``auto`` is ``aic`` when it is
    installed and covers the target (:func:`check_covered`), else ``own``; ``aic`` raises a
    one-line :class:`ConfigError` when it is not installed or does not cover the target."""
    if requested not in BACKENDS:
        raise ConfigError(f"unknown cost backend {requested!r}; valid: {', '.join(BACKENDS)}")
    if requested == "own":
        return "own"
    if requested == "aic":
        _require_installed()
        check_covered(arch, hardware, engine, scenario)
        return "aic"
    if not aic_installed():
        return "own"
    try:
        check_covered(arch, hardware, engine, scenario)
    except ConfigError:
        return "own"
    return "aic"


@dataclass(frozen=True)
class _Layer:
    """One layer's shape as the ops see it on one tensor-parallel rank."""

    heads: int  # query heads per rank (0: no attention)
    kv_heads: int  # KV heads per rank (at least 1 when heads > 0: KV heads are replicated when tp > them)
    head_dim: int
    ffn_width: int  # MLP intermediate size per rank (0: no MLP)
    window: int  # sliding window (0: full causal)


class AicPricer:
    """Per-operation latencies (ms) from AIConfigurator's measured database for one
    (hardware, engine, weight format, KV format, tensor-parallel degree).

    Pure given the installed database: the same shapes give the same milliseconds. Not
    differentiable. ``layer_ms`` is the unit every other price is a sum of.
    """

    def __init__(self, hardware: str, engine: str, dtype: str, kv_dtype: str | None = None, tp: int = 1) -> None:
        _require_installed()
        if hardware not in SYSTEMS or engine not in ENGINES or dtype not in DTYPES:
            raise ConfigError(
                f"the aic backend covers hardware {', '.join(SYSTEMS)}, engines {', '.join(ENGINES)}, "
                f"formats {', '.join(DTYPES)}; got {hardware!r}, {engine!r}, {dtype!r}"
            )
        kv = _kv_dtype(engine, dtype, kv_dtype)
        if kv not in KV_DTYPES:
            raise ConfigError(
                f"the aic backend has no attention tables for KV format {kv!r}; valid: {', '.join(KV_DTYPES)}"
            )
        self.system, self.backend, self.tp = SYSTEMS[hardware], ENGINES[engine], tp
        self.gemm_mode, self.kv_mode = DTYPES[dtype], KV_DTYPES[kv]
        _check_measured(self.system, self.backend, dtype, kv)
        self.database, self.handle = _database(self.system, self.backend)
        self.version: str = self.database.version

    # ------------------------------------------------------------------ op lists
    def _shape(self, layer: LayerSpec) -> _Layer:
        tp = self.tp
        if not layer.attention:
            return _Layer(0, 0, 0, layer.ffn_width // tp if layer.ffn else 0, 0)
        return _Layer(
            heads=layer.num_heads // tp,
            kv_heads=max(layer.num_kv_heads // tp, 1),
            head_dim=layer.head_dim,
            ffn_width=layer.ffn_width // tp if layer.ffn else 0,
            window=layer.window or 0,
        )

    def _layer_ops(self, hidden: int, shape: _Layer, context: bool, count: int) -> list[Any]:
        """The ops of ``count`` identical layers, as ``sdk/models/llama.py`` lists them (without MTP,
        context parallelism or pipeline parallelism)."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        p = "context" if context else "generation"
        h, gemm = hidden, getattr(common.GEMMQuantMode, self.gemm_mode)
        kv = getattr(common.KVCacheQuantMode, self.kv_mode)
        out: list[Any] = []
        if shape.heads:
            q_width = shape.heads * shape.head_dim
            attn_kw = dict(head_size=shape.head_dim, window_size=shape.window)
            if context:
                # Context FMHA math stays BF16 with an FP8 KV cache: vLLM has no FP8 prefill
                # attention table, and TensorRT-LLM's FP8 context FMHA is opt-in.
                fmha = common.FMHAQuantMode.bfloat16
                attn = ops.ContextAttention(f"{p}_attention", count, shape.heads, shape.kv_heads, kv, fmha, **attn_kw)
            else:
                attn = ops.GenerationAttention(f"{p}_attention", count, shape.heads, shape.kv_heads, kv, **attn_kw)
            out += [
                ops.ElementWise(f"{p}_add_norm_1", count, 2 * h, 2 * h, 0.8),
                ops.GEMM(f"{p}_qkv_gemm", count, q_width + 2 * shape.head_dim * shape.kv_heads, h, gemm),
                attn,
                ops.GEMM(f"{p}_proj_gemm", count, h, q_width, gemm, low_precision_input=True),
                ops.CustomAllReduce(f"{p}_ar_1", count, h, self.tp),
            ]
        if shape.ffn_width:
            f = shape.ffn_width
            out += [
                ops.ElementWise(f"{p}_add_norm_2", count, 2 * h, 2 * h, 0.8),
                ops.GEMM(f"{p}_gate_ffn1_gemm", count, 2 * f, h, gemm),
                ops.ElementWise(f"{p}_act_gate", count, 2 * f, f, 0.8),
                ops.GEMM(f"{p}_ffn2_gemm", count, h, f, gemm, low_precision_input=True),
                ops.CustomAllReduce(f"{p}_ar_2", count, h, self.tp),
            ]
        return out

    def _head_ops(self, arch: Architecture, context: bool) -> list[Any]:
        """Embedding lookup, its all-reduce, and the LM head (BF16, as AIConfigurator prices it)."""
        import aiconfigurator_core.sdk.operations as ops
        from aiconfigurator_core.sdk import common

        p = "context" if context else "generation"
        h, v = arch.hidden_size, arch.vocab_size // self.tp
        return [
            ops.Embedding(f"{p}_embedding", 1, v, h, 0.3),
            ops.CustomAllReduce(f"{p}_embedding_ar", 1, h, self.tp),
            ops.GEMM(f"{p}_logits_gemm", 1, v, h, common.GEMMQuantMode.bfloat16),
        ]

    def _evaluate(self, op_list: Sequence[Any], context: bool, batch: int, seq: int) -> list[tuple[str, float]]:
        """``(op name, ms)`` per op. Context: ``batch`` prompts of ``seq`` tokens; generation:
        ``batch`` sequences whose cache holds ``seq`` tokens."""
        from aiconfigurator_core.sdk.engine import _resolve_attention_lane_orders, build_ops_json

        if not op_list:
            return []
        # The engine needs each attention op's table lane resolved first (what its own
        # _evaluate_single_op does).
        from aiconfigurator_core.sdk.errors import InterpolationDataNotAvailableError, PerfDataNotAvailableError

        with _quiet():
            _resolve_attention_lane_orders(list(op_list), self.database, None)
            ops_json = build_ops_json(list(op_list))
            try:
                rows = self.handle.evaluate_ops_json(ops_json, is_context=context, batch_size=batch, s=seq)
            except (PerfDataNotAvailableError, InterpolationDataNotAvailableError) as exc:
                # e.g. grouped-query attention with 3, 5, 6 or 7 KV heads: its attention tables hold
                # 1, 2, 4 and 8 KV heads per rank, and any count when every query head has its own.
                first = str(exc).splitlines()[0][:200]
                raise ConfigError(
                    f"AIConfigurator's {self.system}/{self.backend} database lacks a shape: {first}"
                ) from None
        return [(str(name), float(ms)) for name, ms, *_ in rows]

    # ------------------------------------------------------------------ prices (ms)
    def layer_ms(self, arch: Architecture, index: int, *, context: bool, batch: int, seq: int) -> float:
        """One layer's latency: the sum of its ops' lookups."""
        shape = self._shape(arch.layers[index])
        return sum(
            ms for _, ms in self._evaluate(self._layer_ops(arch.hidden_size, shape, context, 1), context, batch, seq)
        )

    def head_ms(self, arch: Architecture, *, context: bool, batch: int, seq: int) -> float:
        """Embedding and LM head: the part of a forward pass outside the layers."""
        return sum(ms for _, ms in self._evaluate(self._head_ops(arch, context), context, batch, seq))

    def forward_ops(self, arch: Architecture, *, context: bool, batch: int, seq: int) -> list[tuple[str, float]]:
        """``(op name, ms)`` for a whole forward pass, layer by layer. Identical layers are
        evaluated once with a repeat count (the engine scales linearly by it), so a uniform
        model costs one lookup per op and a heterogeneous one one per distinct layer shape."""
        counts: dict[_Layer, int] = {}
        for layer in arch.layers:
            shape = self._shape(layer)
            counts[shape] = counts.get(shape, 0) + 1
        op_list = [op for shape, n in counts.items() for op in self._layer_ops(arch.hidden_size, shape, context, n)]
        return self._evaluate(op_list + self._head_ops(arch, context), context, batch, seq)

    def prefill_ms(self, arch: Architecture, batch: int, input_len: int) -> float:
        """One prefill forward pass of ``batch`` prompts of ``input_len`` tokens each."""
        return sum(ms for _, ms in self.forward_ops(arch, context=True, batch=batch, seq=input_len))

    def decode_step_ms(self, arch: Architecture, batch: int, context_len: int) -> float:
        """One decode step of ``batch`` sequences each attending ``context_len`` cached tokens."""
        return sum(ms for _, ms in self.forward_ops(arch, context=False, batch=batch, seq=context_len))

    def tpot_ms(self, arch: Architecture, batch: int, input_len: int, output_len: int) -> float:
        """Mean decode step over a request's ``output_len - 1`` steps (the first token comes from
        prefill), sampled at up to :data:`_TPOT_SAMPLES` evenly spaced contexts."""
        steps = max(output_len - 1, 1)
        n = min(_TPOT_SAMPLES, steps)
        contexts = [input_len + 1 + (steps - 1) * i // max(n - 1, 1) for i in range(n)]
        return sum(self.decode_step_ms(arch, batch, c) for c in contexts) / n


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hold AIConfigurator's loggers at ERROR. Loading and the first lookups log a warning per
    low-fidelity table of model families the dense ops here never read (MLA, DSA), and for trtllm an
    "unknown backend" from the attention lane map on every call (it lists sglang and vllm only;
    AIConfigurator's own compile logs the same)."""
    # Its modules may set their own levels, so hold each existing logger under the package, not only the root one.
    names = ["aiconfigurator_core", "aiconfigurator_core.sdk.perf_database", "aiconfigurator_core.sdk.attention_lanes"]
    names += [n for n in logging.root.manager.loggerDict if n.startswith("aiconfigurator_core.")]
    logs = [logging.getLogger(n) for n in dict.fromkeys(names)]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


@functools.lru_cache(maxsize=8)
def _database(system: str, backend: str) -> tuple[Any, Any]:
    """AIConfigurator's maintained database for (system, backend) and a model-less engine over it
    (loading takes seconds; kept for the process)."""
    from aiconfigurator_core.sdk import perf_database
    from aiconfigurator_core.sdk.engine import EngineHandle

    with _quiet():
        version = perf_database.get_latest_database_version(system, backend)
        database = perf_database.get_database(system, backend, version) if version else None
        if database is None:
            raise ConfigError(f"AIConfigurator has no database for system {system!r}, backend {backend!r}")
        return database, EngineHandle.for_database(database)


def estimate_cost_aic(
    arch: Architecture, hardware: str, engine: Engine, scenario: Scenario, own: CostEstimate
) -> CostEstimate:
    """``own`` (this toolkit's estimate of the same scenario: memory, concurrency, floors) with
    TTFT, TPOT, E2E and throughput from AIConfigurator's per-layer lookups for a static batch:
    the batch is the scenario's concurrency (``max``: ``own.max_concurrency``), one wave of
    prompts prefilled together, then decoded together (more requests than one wave are not
    scheduled here: :func:`check_covered` admits a burst of at most one wave)."""
    check_covered(arch, hardware, engine.name, scenario)
    if scenario.concurrency == "max":
        batch = min(own.max_concurrency, scenario.requests or own.max_concurrency)
    else:
        batch = min(int(scenario.concurrency), scenario.requests or int(scenario.concurrency))
    batch = max(int(batch), 1)
    with _quiet():  # the database's deferred warnings fire at the first lookups, not at loading
        pricer = AicPricer(hardware, engine.name, scenario.dtype, scenario.kv_dtype, scenario.tp)
        ttft = pricer.prefill_ms(arch, batch, scenario.input_len)
        tpot = pricer.tpot_ms(arch, batch, scenario.input_len, scenario.output_len)
    e2e = ttft + tpot * max(scenario.output_len - 1, 0)
    return replace(
        own,
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2e_latency_ms=e2e,
        output_throughput_tok_s=batch * scenario.output_len / e2e * 1e3,
    )


def estimate_cost_backend(
    requested: str, arch: Architecture, hardware: str, engine: Engine, scenario: Scenario, own: CostEstimate
) -> tuple[CostEstimate, str]:
    """``own`` (this toolkit's estimate) priced by the backend ``requested`` resolves to
    (:func:`resolve_backend`), and that backend's name. Under ``auto`` the backend falls back to
    ``own`` also where its database lacks one of ``arch``'s shapes (a :class:`ConfigError` from the
    lookups); under ``aic`` that error is raised."""
    backend = resolve_backend(requested, arch, hardware, engine.name, scenario)
    if backend == "own":
        return own, "own"
    try:
        return estimate_cost_aic(arch, hardware, engine, scenario, own), "aic"
    except ConfigError:
        if requested == "aic":
            raise
        return own, "own"


def backend_check(
    arch: Architecture, target: Target, parent: Architecture, requested: str = "auto"
) -> dict[str, Any] | None:
    """``target``'s constraints on ``arch`` checked again with the prices of the backend ``requested``
    resolves to (:func:`resolve_backend`): the final check of a study's front points, whose trials
    were judged by this toolkit's differentiable model. None where that backend is ``own`` (or,
    under ``auto``, its database lacks one of the shapes). A constraint relative to the parent
    (``0.6x``) is relative to the parent priced by the same backend; no interval is applied (the
    own profile's residuals are not AIConfigurator's errors). Returns ``{"backend", "feasible",
    "violations", "metrics"}`` (violations ``<= 0`` satisfied, as :meth:`Target.violations`)."""
    from autocompress_opt.serving.costmodel import estimate_cost
    from autocompress_opt.serving.hardware import get_hardware
    from autocompress_opt.serving.targets import all_satisfied

    hardware, engine, scenario = get_hardware(target.hardware).name, target.engine_obj(), target.scenario()
    if resolve_backend(requested, arch, hardware, engine.name, scenario) == "own":
        return None
    priced = []
    for model in (arch, parent):
        own = estimate_cost(model, target.hardware, engine, scenario)
        cost, backend = estimate_cost_backend(requested, model, hardware, engine, scenario, own)
        if backend == "own":
            return None
        priced.append(cost.to_dict())
    violations = {k: float(v) for k, v in replace(target, confidence=None).violations(priced[0], priced[1]).items()}
    kept = ("ttft_ms", "tpot_ms", "e2e_latency_ms", "output_throughput_tok_s")
    return {
        "backend": "aic",
        "feasible": all_satisfied(violations),
        "violations": violations,
        "metrics": {k: priced[0][k] for k in kept},
    }


def predict_rows(rows: Sequence[tuple[Observation, str]]) -> dict[str, float]:
    """AIConfigurator's prediction of each measured row it can express, by row label: dense
    models on covered hardware, engines and formats, one offline burst wave
    (:func:`check_covered`); the other rows are left out. Nothing is fitted to the rows."""
    from autocompress_opt.serving.costmodel import estimate_cost
    from autocompress_opt.serving.profiles import get_profile

    out: dict[str, float] = {}
    for obs, _ in rows:
        hardware, engine = obs.hardware.name, obs.engine
        try:
            check_covered(obs.arch, hardware, engine.name, obs.scenario)
        except ConfigError:
            continue
        own = estimate_cost(obs.arch, hardware, engine, obs.scenario, get_profile(engine.name, hardware))
        try:
            value = estimate_cost_aic(obs.arch, hardware, engine, obs.scenario, own).to_dict().get(obs.metric)
        except ConfigError:  # a shape its database lacks
            continue
        if value is not None:
            out[obs.label] = float(value)
    return out
