"""Fit a :class:`CostProfile` to observations, through the differentiable cost model.

An :class:`Observation` is one measured number (a TTFT, a TPOT, a throughput...) of one
architecture served in one scenario. :func:`fit_profile` adjusts a few profile parameters so the
cost model's predictions match, minimising squared log error (relative error, so a 5 ms TPOT and a
10 s end-to-end latency weigh alike) plus a weak pull toward the starting values, which keeps an
under-determined fit (one published row for an engine) physically plausible. Both the CPU
calibration and the fit to published measurements use it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.costmodel import ArchArrays, Scenario, estimate_batch
from autocompress_opt.serving.engine_models import Engine
from autocompress_opt.serving.hardware import Hardware
from autocompress_opt.serving.profiles import FITTED_PARAMETERS, CostProfile

__all__ = [
    "DERIVED_METRICS",
    "Observation",
    "fit_profile",
    "fit_routed_passes",
    "heldout_split",
    "mdape",
    "metric_with_bound",
    "predict",
    "relative_errors",
]

# Metrics an observation may carry: the cost model's own plus ones derived from them, each with the
# key of its physical bound in ``estimate_batch(..., bounds=True)`` (a floor for a latency, a ceiling
# for a throughput). ``prefill_throughput_tok_s`` is llama-bench's pp (prompt tokens / prefill time),
# ``decode_throughput_tok_s`` its tg (sequences decoding / TPOT).
_BOUNDS: dict[str, str] = {
    "ttft_ms": "ttft_floor_ms",
    "tpot_ms": "tpot_floor_ms",
    "e2e_latency_ms": "e2e_floor_ms",
    "output_throughput_tok_s": "output_throughput_ceiling_tok_s",
    "decode_throughput_tok_s": "decode_throughput_ceiling_tok_s",
    "prefill_throughput_tok_s": "prefill_throughput_ceiling_tok_s",
}
DERIVED_METRICS: tuple[str, ...] = tuple(_BOUNDS)
_EFFICIENCIES = ("mfu", "mbu")

# The fit's unconstrained parameters stay within ±this (sigmoid(-40) ≈ 4e-18, exp(40) ≈ 2e17).
_THETA_BOUND = 40.0


@dataclass(frozen=True)
class Observation:
    """One measured value: ``metric`` of ``arch`` on ``hardware`` with ``engine`` in ``scenario``."""

    arch: Architecture
    hardware: Hardware
    engine: Engine
    scenario: Scenario
    metric: str
    value: float
    label: str = ""

    def __post_init__(self) -> None:
        if self.metric not in DERIVED_METRICS:
            raise ConfigError(f"unsupported metric {self.metric!r}; valid: {', '.join(DERIVED_METRICS)}")
        if not self.value > 0:
            raise ConfigError(f"observation {self.label or self.metric}: value must be > 0, got {self.value!r}")


def metric_with_bound(values: dict[str, Any], metric: str) -> tuple[Any, Any]:
    """(prediction, physical bound) of ``metric`` from ``estimate_batch(..., bounds=True)``; the
    bound is a floor for latencies and a ceiling for throughputs (100 % of peak, no fixed costs, in
    the same arrival regime)."""
    if metric not in _BOUNDS:
        raise ConfigError(f"unsupported metric {metric!r}; valid: {', '.join(DERIVED_METRICS)}")
    return values[metric], values[_BOUNDS[metric]]


def _groups(observations: Sequence[Observation]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, obs in enumerate(observations):
        groups[(obs.hardware.name, obs.engine, obs.scenario)].append(i)
    return groups


def predict(
    observations: Sequence[Observation], profile: CostProfile | None = None, backend: str = "numpy"
) -> list[tuple[Any, Any]]:
    """(prediction, bound) per observation. ``profile=None`` uses each (hardware, engine)'s own."""
    out: list[tuple[Any, Any]] = [(None, None)] * len(observations)
    for indices in _groups(observations).values():
        first = observations[indices[0]]
        arrays = ArchArrays.from_architectures([observations[i].arch for i in indices], backend=backend)
        values = estimate_batch(arrays, first.hardware, first.engine, first.scenario, profile, bounds=True)
        for row, i in enumerate(indices):
            pred, bound = metric_with_bound(values, observations[i].metric)
            out[i] = (pred[row], bound[row])
    return out


def fit_profile(
    observations: Sequence[Observation],
    start: CostProfile,
    free: Sequence[str] = FITTED_PARAMETERS,
    free_mfu_dtypes: Sequence[str] = (),
    prior_weight: float = 0.02,
    steps: int = 200,
) -> CostProfile:
    """Fit ``free`` parameters (and per-dtype MFUs) of ``start`` to ``observations``.

    Minimises ``mean((log pred - log measured)²) + prior_weight · Σ (θ - θ_start)²`` over
    unconstrained θ (logit for efficiencies, log for overheads) with L-BFGS. Deterministic.
    """
    import torch

    unknown = [p for p in free if p not in FITTED_PARAMETERS]
    if unknown:
        raise ConfigError(f"cannot fit {unknown}; fittable: {', '.join(FITTED_PARAMETERS)}")
    if not observations:
        raise ConfigError("no observations to fit")
    names = list(free) + [f"mfu_by_dtype.{d}" for d in free_mfu_dtypes]

    def initial(name: str) -> float:
        value = start.mfu_for(name.split(".")[1]) if name.startswith("mfu_by_dtype.") else getattr(start, name)
        value = max(float(value), 1e-6)
        is_eff = name in _EFFICIENCIES or name.startswith("mfu_by_dtype.")
        value = min(value, 0.999) if is_eff else value
        return float(np.log(value / (1 - value))) if is_eff else float(np.log(value))

    theta0 = torch.tensor([initial(n) for n in names], dtype=torch.float64)
    theta = theta0.clone().requires_grad_(True)
    measured = torch.tensor([obs.value for obs in observations], dtype=torch.float64).log()

    def profile_from(t: torch.Tensor) -> CostProfile:
        values: dict[str, Any] = {}
        by_dtype: dict[str, Any] = dict(start.mfu_by_dtype)
        for name, raw in zip(names, t):
            is_eff = name in _EFFICIENCIES or name.startswith("mfu_by_dtype.")
            # θ is held to ±_THETA_BOUND: a parameter the observations cannot pin down (an mfu when
            # every timed step is overhead-bound) would otherwise drift until sigmoid/exp underflow to
            # exactly 0 in float64, which no profile may hold (seen: mfu 0.0 from 4 tiny models).
            raw = raw.clamp(-_THETA_BOUND, _THETA_BOUND)
            value = torch.sigmoid(raw) if is_eff else torch.exp(raw)
            if name.startswith("mfu_by_dtype."):
                by_dtype[name.split(".")[1]] = value
            else:
                values[name] = value
        return start.with_parameters(**values, mfu_by_dtype=by_dtype)

    def loss_fn() -> torch.Tensor:
        preds = predict(observations, profile_from(theta), backend="torch")
        logp = torch.stack([p.log() for p, _ in preds])
        return ((logp - measured) ** 2).mean() + prior_weight * ((theta - theta0) ** 2).sum()

    optimiser = torch.optim.LBFGS([theta], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    optimiser.step(closure)
    fitted = profile_from(theta.detach())
    plain = {k: float(v) for k, v in ((n, getattr(fitted, n)) for n in free)}
    return fitted.with_parameters(**plain, mfu_by_dtype={k: float(v) for k, v in fitted.mfu_by_dtype.items()})


# routed_passes candidates: 0 and 0.01 to 1000 passes, 51 points (26 % apart), before the refinement.
_ROUTED_PASSES_GRID = np.concatenate([[0.0], np.geomspace(0.01, 1000.0, 51)])


def fit_routed_passes(
    observations: Sequence[Observation], start: CostProfile | Mapping[str, CostProfile], refine_steps: int = 30
) -> Any:
    """``start`` with ``routed_passes`` fitted to ``observations`` (mixture-of-experts rows), every
    other parameter held: the value minimising the mean squared log error, found on a grid (0, and
    0.01 to 1000 log-spaced) then refined by golden-section search in log space between the best
    grid point's neighbours. ``start`` is one profile, or one per engine (rows of several engines
    fitted to one value, each predicted with its engine's profile; the same mapping comes back with
    the value set in each). No prior: nothing published says what the value should be. Deterministic;
    ``start`` itself without observations."""
    if not observations:
        return start
    measured = np.log([obs.value for obs in observations])
    many = isinstance(start, Mapping)
    starts: Mapping[str, CostProfile] = start if isinstance(start, Mapping) else {"": start}
    # The rows each profile predicts (every row for one profile, an engine's rows for a mapping),
    # grouped once: the loss runs about 80 times.
    groups: dict[str, list[int]] = {}
    for i, obs in enumerate(observations):
        groups.setdefault(obs.engine.name if many else "", []).append(i)
    subsets = {key: [observations[i] for i in idx] for key, idx in groups.items()}

    def with_value(passes: float) -> Any:
        out = {e: p.with_parameters(routed_passes=float(passes)) for e, p in starts.items()}
        return out if many else out[""]

    def loss(passes: float) -> float:
        preds = np.empty(len(observations))
        for key, idx in groups.items():
            profile = starts[key].with_parameters(routed_passes=float(passes))
            preds[idx] = [float(p) for p, _ in predict(subsets[key], profile)]
        return float(np.mean((np.log(preds) - measured) ** 2))

    grid = _ROUTED_PASSES_GRID
    best = int(np.argmin([loss(x) for x in grid]))
    if best == 0:
        return with_value(0.0)
    lo, hi = np.log(grid[max(best - 1, 1)]), np.log(grid[min(best + 1, len(grid) - 1)])
    ratio = (np.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = loss(np.exp(a)), loss(np.exp(b))
    for _ in range(refine_steps):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = loss(np.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = loss(np.exp(b))
    return with_value(float(np.exp((lo + hi) / 2)))


def relative_errors(observations: Sequence[Observation], profile: CostProfile | None = None) -> np.ndarray:
    """Signed relative error (pred / measured - 1) per observation."""
    preds = predict(observations, profile)
    return np.array([float(p) / obs.value - 1 for (p, _), obs in zip(preds, observations)])


def heldout_split(n: int, heldout_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(fitting, held-out) indices of ``n`` calibration models: a seeded ``heldout_fraction`` (at least
    one) held out, each part in index order."""
    order = np.random.default_rng(seed).permutation(n)
    k = max(1, round(n * heldout_fraction))
    return sorted(order[k:].tolist()), sorted(order[:k].tolist())


def mdape(errors: Sequence[float] | np.ndarray) -> float:
    """Median absolute (relative) error; nan for none."""
    return float(np.median(np.abs(errors))) if len(errors) else float("nan")
