"""Fitted efficiency and overhead parameters per (hardware, engine).

A :class:`CostProfile` holds the few numbers the cost model cannot take from a datasheet: how close
an engine gets to peak compute (``mfu``) and bandwidth (``mbu``), and its fixed costs per kernel
launch, per engine step and per all-reduce. They are *fitted*, never assumed to be 1:

* ``data/profiles/published.yaml``: one profile per engine (``hardware: "*"``), fitted to the
  published measurements in ``data/measurements.csv`` (``autocompress validate --fit``).
* ``data/profiles/cpu-torch-eager.yaml``: fitted to real timings on the machine that ran
  ``autocompress calibrate --hardware cpu``; it also carries the measured CPU figures.
* user calibrations, written to :func:`user_profile_dir`, take precedence over shipped ones.

Lookup order for (hardware, engine): user exact → shipped exact → user engine-wide → shipped
engine-wide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt._data import DATA_DIR
from autocompress_opt.errors import ConfigError, check_fraction, reject_unknown_keys

__all__ = [
    "FITTED_PARAMETERS",
    "METRIC_PHASES",
    "PRIORS",
    "CostProfile",
    "Interval",
    "calibrated_hardware_blocks",
    "get_profile",
    "load_profiles",
    "save_profile",
    "time_ratio",
    "user_profile_dir",
]

_SHIPPED = DATA_DIR / "profiles"

# Parameters a fit may change; everything else in a profile is structure or metadata.
FITTED_PARAMETERS: tuple[str, ...] = (
    "mfu",
    "mbu",
    "kernel_launch_us",
    "step_overhead_ms",
    "allreduce_latency_us",
    "request_overhead_ms",
    "routed_passes",
)


# Which phase of a request a measured or predicted metric times: the held-out residuals of a phase
# size the intervals of the metrics of that phase.
METRIC_PHASES: dict[str, str] = {
    "ttft_ms": "prefill",
    "prefill_throughput_tok_s": "prefill",
    "tpot_ms": "decode",
    "decode_throughput_tok_s": "decode",
    "e2e_latency_ms": "whole",
    "output_throughput_tok_s": "whole",
}
# A residual pool narrower than the engine's (one regime, one phase) is used from this many rows.
MIN_POOL = 5


def time_ratio(metric: str, measured: float, predicted: float) -> float:
    """measured / predicted *time*: a latency's ratio as is, a throughput's inverted (twice the
    throughput is half the time), so that one pool of residuals serves both kinds of metric."""
    return measured / predicted if metric.endswith("_ms") else predicted / measured


@dataclass(frozen=True)
class Interval:
    """Multiplicative bounds on a predicted *time* at a confidence level: the true time lies in
    ``[low · t, high · t]`` as often as held-out rows did. ``pool`` names the residuals used
    (``"steady/decode"``, ``"decode"``, ``"steady"`` or ``"all"``) and ``rows`` how many."""

    low: float
    high: float
    pool: str
    rows: int


@dataclass(frozen=True)
class CostProfile:
    """Efficiency factors and fixed overheads of one engine on one (or every) device.

    Attributes:
        engine: serving-engine registry name.
        hardware: hardware name, or ``"*"`` for an engine-wide default.
        mfu: fraction of peak tensor FLOP/s reached by GEMMs and attention (0, 1].
        mfu_by_dtype: per compute-dtype overrides of ``mfu`` (FP4 kernels reach less of their peak).
        mbu: fraction of peak memory bandwidth reached by memory-bound kernels (0, 1].
        kernel_launch_us: fixed cost per kernel (launch + tail); ``engine.kernels_per_*`` count them.
        step_overhead_ms: fixed cost per engine step (scheduling, sampling, Python).
        allreduce_latency_us: fixed latency of one tensor-parallel all-reduce.
        request_overhead_ms: fixed latency an *online* request (``Scenario.online``: through the
            engine's HTTP front end) spends outside the GPU's steps (HTTP, chat template and
            tokenisation, hand-off to the scheduler, streaming the first token back); added to TTFT
            and E2E, not to a run's throughput (the front end overlaps the GPU's work).
        routed_passes: how many times each routed (token, expert) pair's activations cross device
            memory beyond the GEMMs' roofline: the token's hidden vector gathered to the expert and
            its output scattered back and combined, the expert's intermediate activations written
            and read (``ArchArrays.expert_io`` elements a pair, at the activation format), timed at
            the profile's bandwidth. Dimensionless, so one value carries across devices and expert
            shapes (the earlier ``routed_pair_ns``, a time, did not: issue 44). Exactly 0 for a dense
            model (it has no routed pair); fitted to the MoE/hybrid rows only
            (:func:`~autocompress_opt.serving.validation.fit_published`), 0 where none was fitted.
        reference: the device figures the efficiencies are fractions of, when they are not the
            hardware entry's: ``{"peak_tflops": {...}, "bandwidth_gb_s": ...}`` (optionally
            ``fp16_acc_tflops``). A real engine's profile of the host CPU carries the figures measured
            when it was calibrated (``autocompress calibrate --engine``), so it predicts what it was
            fitted to whatever figures the ``cpu`` entry holds (another calibration's); empty: the
            entry's own figures.
        fit: provenance: rows or sweep fitted, error statistics, date. ``fit["heldout"]`` lists the
            held-out residuals (leave-one-source-out) that :meth:`interval` draws on: one mapping
            per row with ``id``, ``regime``, ``phase`` and ``time_ratio`` (:func:`time_ratio`).
    """

    engine: str
    hardware: str = "*"
    mfu: float = 0.5
    mfu_by_dtype: Mapping[str, float] = field(default_factory=dict)
    mbu: float = 0.7
    kernel_launch_us: float = 2.0
    step_overhead_ms: float = 0.5
    allreduce_latency_us: float = 10.0
    request_overhead_ms: float = 0.0
    routed_passes: float = 0.0
    reference: Mapping[str, Any] = field(default_factory=dict)
    fit: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Compared, not type-checked (errors.check_fraction): while a profile is fitted
        # (serving.fitting) its fields are 0-d tensors that carry gradients.
        for name in ("mfu", "mbu"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"profile {self.engine}@{self.hardware}: {name} must be in (0, 1], got {value!r}")
        for dtype, value in self.mfu_by_dtype.items():
            if not 0 < value <= 1:
                raise ConfigError(
                    f"profile {self.engine}@{self.hardware}: mfu_by_dtype[{dtype!r}] must be in (0, 1], got {value!r}"
                )
        for name in (
            "kernel_launch_us",
            "step_overhead_ms",
            "allreduce_latency_us",
            "request_overhead_ms",
            "routed_passes",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"profile {self.engine}@{self.hardware}: {name} must be >= 0, got {getattr(self, name)!r}"
                )
        if self.reference:
            reject_unknown_keys(self.reference, _REFERENCE_KEYS, f"profile {self.engine}@{self.hardware}'s reference")
            if "peak_tflops" not in self.reference or "bandwidth_gb_s" not in self.reference:
                raise ConfigError(
                    f"profile {self.engine}@{self.hardware}: a reference needs peak_tflops and bandwidth_gb_s, "
                    f"got {sorted(self.reference)}"
                )

    def mfu_for(self, compute_dtype: str) -> float:
        return self.mfu_by_dtype.get(compute_dtype, self.mfu)

    def interval(self, metric: str, regime: str, confidence: float, sparse: bool = False) -> Interval | None:
        """Bounds of ``metric`` predicted in ``regime`` at ``confidence`` (e.g. 0.9: the 5th and 95th
        percentiles of log time ratios, linearly interpolated), from the held-out residuals of this
        profile's rows: of the same regime and phase when at least :data:`MIN_POOL` exist, else
        the same phase, else the same regime, else all of them. None without two residuals.

        ``sparse`` (a model with MoE or Mamba-2 layers) draws on the held-out residuals of the
        MoE/hybrid rows (``fit["heldout_moe"]``) the same way, their pool named ``moe ...``; only a
        profile with fewer than two of those falls back to the dense rows' (dense residuals are
        narrower than MoE ones: issue 44)."""
        check_fraction(confidence, "confidence", one=False)
        phase = METRIC_PHASES.get(metric)
        if phase is None:
            raise ConfigError(f"no interval for {metric!r}; metrics with intervals: {', '.join(METRIC_PHASES)}")
        if sparse:
            moe = self._interval(self.fit.get("heldout_moe", []), phase, regime, confidence, "moe ")
            if moe is not None:
                return moe
        return self._interval(self.fit.get("heldout", []), phase, regime, confidence, "")

    @staticmethod
    def _interval(residuals: Any, phase: str, regime: str, confidence: float, prefix: str) -> Interval | None:
        rows = [r for r in residuals if isinstance(r, Mapping)]
        for pool, keep in (
            (f"{regime}/{phase}", lambda r: r["regime"] == regime and r["phase"] == phase),
            (phase, lambda r: r["phase"] == phase),
            (regime, lambda r: r["regime"] == regime),
            ("all", lambda r: True),
        ):
            ratios = [float(r["time_ratio"]) for r in rows if keep(r)]
            if len(ratios) >= (MIN_POOL if pool != "all" else 2):
                logs = np.log(np.array(ratios))
                low, high = np.quantile(logs, [(1 - confidence) / 2, (1 + confidence) / 2])
                return Interval(float(np.exp(low)), float(np.exp(high)), prefix + pool, len(ratios))
        return None

    def with_parameters(self, **values: Any) -> CostProfile:
        """A copy with some fields replaced (the fitted parameters, usually)."""
        return replace(self, **values)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["mfu_by_dtype"] = dict(self.mfu_by_dtype)
        data["reference"] = dict(self.reference)
        data["fit"] = dict(self.fit)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostProfile:
        if "routed_pair_ns" in data:  # a profile written before routed_passes (issue 44)
            if data["routed_pair_ns"]:
                raise ConfigError(
                    f"cost profile {data.get('engine')}@{data.get('hardware', '*')} has routed_pair_ns "
                    f"{data['routed_pair_ns']!r}, a time per routed pair this version replaced by routed_passes "
                    "(passes over the pair's activations); refit it: autocompress validate --fit --out FILE"
                )
            data = {k: v for k, v in data.items() if k != "routed_pair_ns"}  # 0: no MoE fit, nothing lost
        reject_unknown_keys(data, cls.__dataclass_fields__, "a cost profile")
        if "engine" not in data:
            raise ConfigError("a cost profile needs 'engine'")
        return cls(**data)


_REFERENCE_KEYS = ("peak_tflops", "bandwidth_gb_s", "fp16_acc_tflops")


# Starting points (and the weak prior) of every fit — published rows and calibration: typical published
# efficiencies, DESIGN.md §3 ("decode reaches about 45-75 % of peak bandwidth"), launch costs of CUDA-graph replays.
PRIORS: dict[str, CostProfile] = {
    "vllm": CostProfile("vllm", mfu=0.5, mbu=0.7, kernel_launch_us=2.0, step_overhead_ms=1.0, request_overhead_ms=10.0),
    "trtllm": CostProfile(
        "trtllm",
        mfu=0.55,
        mbu=0.75,
        kernel_launch_us=1.5,
        step_overhead_ms=0.3,
        allreduce_latency_us=8.0,
        mfu_by_dtype={"fp4": 0.4},
        request_overhead_ms=10.0,
    ),
    "llamacpp": CostProfile("llamacpp", mfu=0.4, mbu=0.7, kernel_launch_us=2.0, step_overhead_ms=0.3),
    "torch-eager": CostProfile("torch-eager", mfu=0.4, mbu=0.5, kernel_launch_us=10.0, step_overhead_ms=1.0),
}


def user_profile_dir() -> Path:
    """Where ``autocompress calibrate`` saves profiles: ``~/.cache/autocompress_opt/profiles``."""
    return Path.home() / ".cache" / "autocompress_opt" / "profiles"


def _read_profile_file(path: Path) -> tuple[list[CostProfile], dict[str, Any] | None]:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: a profile file must be a mapping with 'profiles' (and optionally 'hardware')")
    profiles = [CostProfile.from_dict(entry) for entry in data.get("profiles", [])]
    return profiles, data.get("hardware")


def load_profiles(directory: Path) -> tuple[dict[tuple[str, str], CostProfile], list[dict[str, Any]]]:
    """All profiles (keyed by (hardware, engine)) and hardware blocks found in ``directory``."""
    profiles: dict[tuple[str, str], CostProfile] = {}
    hardware: list[dict[str, Any]] = []
    if directory.is_dir():
        for path in sorted(directory.glob("*.yaml")):
            items, hw = _read_profile_file(path)
            for item in items:
                profiles[(item.hardware, item.engine)] = item
            if hw:
                hardware.append(dict(hw))
    return profiles, hardware


def save_profile(
    path: Path, profiles: list[CostProfile], hardware: Mapping[str, Any] | None = None, header: str = ""
) -> Path:
    """Write profiles (and the measured hardware block, for calibrated hosts) as YAML."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    if hardware is not None:  # a Hardware.to_dict() of the measured host
        data["hardware"] = dict(hardware)
    data["profiles"] = [p.to_dict() for p in profiles]
    text = "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(data, sort_keys=False)
    path.write_text(text)
    return path


_cache: dict[str, Any] = {}


def _all() -> tuple[list[dict[tuple[str, str], CostProfile]], list[dict[str, Any]]]:
    if "profiles" not in _cache:
        user, user_hw = load_profiles(user_profile_dir())
        shipped, shipped_hw = load_profiles(_SHIPPED)
        _cache["profiles"] = [user, shipped]
        _cache["hardware"] = user_hw + shipped_hw
    return _cache["profiles"], _cache["hardware"]


def clear_cache() -> None:
    """Forget loaded profiles (after a calibration wrote a new one)."""
    _cache.clear()


def get_profile(engine: str, hardware: str) -> CostProfile:
    """The most specific fitted profile for (hardware, engine); see the module doc for the order."""
    layers, _ = _all()
    for key in ((hardware, engine), ("*", engine)):
        for layer in layers:
            if key in layer:
                return layer[key]
    return CostProfile(engine=engine, hardware="*", fit={"note": "unfitted defaults"})


def calibrated_hardware_blocks() -> list[dict[str, Any]]:
    """The ``hardware`` blocks of calibrated profiles (the user's first, then the shipped ones), as
    written by ``autocompress calibrate``: plain mappings that :class:`Hardware` reads."""
    _, hardware = _all()
    return [dict(block) for block in hardware]
