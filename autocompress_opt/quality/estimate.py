"""A quality estimate without weights: the KL a cut architecture would have, from how much it cuts
along each axis, fitted on measured KL.

Plan mode has no weights to measure, so it needs a stand-in for quality. The fraction of parameters
kept ranks a depth cut, an expert-width cut and a cut of experts per token alike when they remove as
many parameters, which measurements contradict (published: Qwen3-30B-A3B before distillation keeps
far more MMLU with experts 128 → 96 than with hidden 2048 → 1536; measured here: top-k 4 → 2 of a
real-weights MoE costs more than three times an expert-width cut to the same active parameters).
This estimate prices each axis on its own.

**Axes** (:func:`axis_cuts`; each the fraction of the parent's amount removed, in [0, 1]):

- ``depth``: mixers and FFNs (dense or MoE) removed by dropping them, as a fraction of the parent's
  (a dense layer dropped removes two of its ``2 · layers``; a Nemotron-H layer is one of either);
- ``hidden``: ``1 − hidden / parent hidden``;
- ``ffn_width``: dense FFN channels cut in the FFNs kept (summed over them);
- ``kv_heads``: key-value heads (groups) cut in the attention layers kept; ``q_per_kv``: query heads
  per group cut there (apart: on SmolLM2-135M a third of the query heads costs about four times more
  KL cut within the groups than cut as a whole group with its keys and values);
- ``experts``, ``expert_width``, ``experts_per_token``, ``shared_width``: over the MoE layers kept;
- ``mamba_heads``: Mamba-2 heads cut in the Mamba layers kept.

**Model**: ``KL ≈ Σ_axis a_axis · cut_axis ** p_axis`` (``a ≥ 0``, ``p`` in :data:`EXPONENTS`),
additive over axes. :func:`fit_estimate` fits ``a`` and ``p`` by relative least squares
(``Σ ((KL̂ − KL) / KL)²``, non-negative ``a`` for each exponent choice, coordinate descent over
the exponents). An axis with no measurement to fit on borrows another's coefficients
(:data:`FALLBACKS`: ``mamba_heads`` from ``kv_heads``, whole heads with their state,
``shared_width`` from ``expert_width``), and the estimate says which it borrowed. The shipped fit
(:func:`load_estimate`,
``data/quality_estimate.json``) comes from ``benchmarks/bench_quality_estimate.py``: the dense
axes on SmolLM2-135M's uniform children, the expert axes on the real-weights MoE built from it;
its rank agreement with measured KL on architectures it was not fitted on is in that benchmark's
results. KL depends on the model, so the estimate ranks architectures of one parent; its absolute
values transfer poorly between models of different sizes.

**Layers** (:class:`LayerProfile`, optional): the pooled cut above prices a cut the same in every
layer, so it cannot tell a per-layer architecture from the uniform one of the same size. With a
profile for the axis's side (:data:`PROFILE_SIDES`: ``ffn`` for the FFN and expert axes, ``mixer``
for heads and Mamba heads) each layer that keeps the sub-block has its own curve ``k_l · c ** p_l``
(:class:`LayerProfile`, read at the layer's relative depth), and the axis's term is the pooled term
at the mean cut times how much more (or less) the per-layer cuts cost than that mean cut in every
layer, by those curves. A uniform cut gives exactly the pooled term (so the fit above holds
unchanged); a per-layer one is cheaper where it cuts the layers the profile finds insensitive, as
far as their curves allow. The shipped profiles (``benchmarks/fit_layer_profile.py``) are
SmolLM2-135M's replace-one KL per layer (``benchmarks/results/block_library.json``): each layer alone
with half its FFN (``k``) and with no FFN (the exponent), or with one KV group of three and with no
attention; read by relative depth, they are measured on one dense model, a prior for any other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture

__all__ = [
    "AXES",
    "EXPONENTS",
    "FALLBACKS",
    "PROFILE_SIDES",
    "LayerProfile",
    "QualityEstimate",
    "axis_cuts",
    "fit_estimate",
    "layer_cuts",
    "load_estimate",
    "nnls",
]

AXES: tuple[str, ...] = (
    "depth",
    "hidden",
    "ffn_width",
    "kv_heads",
    "q_per_kv",
    "experts",
    "expert_width",
    "experts_per_token",
    "shared_width",
    "mamba_heads",
)
EXPONENTS: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
# An axis no measurement covers borrows the coefficients of the closest one that is measured.
FALLBACKS: dict[str, str] = {"mamba_heads": "kv_heads", "shared_width": "expert_width"}
ESTIMATE_FILE = "quality_estimate.json"
# Which layer profile prices each per-layer axis (module doc, **Layers**); depth and hidden are global.
PROFILE_SIDES: dict[str, str] = {
    "ffn_width": "ffn",
    "experts": "ffn",
    "expert_width": "ffn",
    "experts_per_token": "ffn",
    "shared_width": "ffn",
    "kv_heads": "mixer",
    "q_per_kv": "mixer",
    "mamba_heads": "mixer",
}


def _fraction_cut(kept: float, total: float) -> float:
    return 0.0 if total <= 0 else min(1.0, max(0.0, 1.0 - kept / total))


def _check_layers(arch: Architecture, parent: Architecture) -> None:
    if len(arch.layers) != len(parent.layers):
        raise ValueError(
            f"axis_cuts needs one layer of the architecture per parent layer, got {len(arch.layers)} "
            f"for a parent of {len(parent.layers)}"
        )


def _layer_amounts(arch: Architecture, parent: Architecture) -> Iterator[tuple[int, str, float, float]]:
    """``(layer, axis, kept, total)`` for each per-layer axis of each layer that keeps the sub-block."""
    for i, (child, mother) in enumerate(zip(arch.layers, parent.layers, strict=True)):
        if mother.attention and child.attention:
            yield i, "kv_heads", child.num_kv_heads, mother.num_kv_heads
            yield i, "q_per_kv", child.num_heads / child.num_kv_heads, mother.num_heads / mother.num_kv_heads
        if mother.mamba is not None and child.mamba is not None:
            yield i, "mamba_heads", child.mamba.num_heads, mother.mamba.num_heads
        if mother.ffn and child.ffn:
            yield i, "ffn_width", child.ffn_width, mother.ffn_width
        if mother.moe is not None and child.moe is not None:
            a, b = child.moe, mother.moe
            yield i, "experts", a.num_experts, b.num_experts
            yield i, "expert_width", a.expert_width, b.expert_width
            yield i, "experts_per_token", a.experts_per_token, b.experts_per_token
            if b.shared_width:
                yield i, "shared_width", a.shared_width, b.shared_width


def axis_cuts(arch: Architecture, parent: Architecture) -> dict[str, float]:
    """How much ``arch`` cuts ``parent`` along each of :data:`AXES` (module doc), layer by layer:
    ``arch.layers[i]`` is cut from ``parent.layers[i]`` (the toolkit's architectures list every
    parent layer, dropped ones as no-ops). Raises ``ValueError`` when the layer counts differ."""
    _check_layers(arch, parent)
    blocks = kept_blocks = 0
    for child, mother in zip(arch.layers, parent.layers, strict=True):
        for kind in ("mixer", "ffn_kind"):
            if getattr(mother, kind) != "none":
                blocks += 1
                kept_blocks += getattr(child, kind) != "none"
    sums: dict[str, list[float]] = {axis: [0.0, 0.0] for axis in AXES if axis not in ("depth", "hidden")}
    for _, axis, kept, total in _layer_amounts(arch, parent):
        sums[axis][0] += kept
        sums[axis][1] += total
    cuts = {"depth": _fraction_cut(kept_blocks, blocks), "hidden": _fraction_cut(arch.hidden_size, parent.hidden_size)}
    cuts.update({axis: _fraction_cut(kept, total) for axis, (kept, total) in sums.items()})
    return {axis: cuts[axis] for axis in AXES}


def layer_cuts(arch: Architecture, parent: Architecture) -> dict[str, list[tuple[float, float]]]:
    """For each per-layer axis (:data:`PROFILE_SIDES`), ``(relative depth, cut)`` of every layer that
    keeps the sub-block: the layer's own fraction removed, at depth ``(i + 0.5) / n`` of ``n`` parent
    layers. Layer counts as :func:`axis_cuts`."""
    _check_layers(arch, parent)
    n = len(parent.layers)
    out: dict[str, list[tuple[float, float]]] = {axis: [] for axis in PROFILE_SIDES}
    for i, axis, kept, total in _layer_amounts(arch, parent):
        out[axis].append(((i + 0.5) / n, _fraction_cut(kept, total)))
    return out


@dataclass(frozen=True)
class LayerProfile:
    """How much a cut hurts along the depth of a model (module doc, **Layers**), from measurements of
    ``len(values)`` layers, layer ``j`` at relative depth ``(j + 0.5) / len(values)``: ``values[j]`` is
    the KL of cutting that layer alone by ``cut`` (a fraction of it) and ``exponents[j]`` how fast its
    KL grows with the cut, ``KL_j(c) = values[j] · (c / cut) ** exponents[j]`` (from a second
    measurement, the layer's whole sub-block removed). Read in between by linear interpolation (of the
    logarithm for the values), flat beyond the first and last layer.

    Attributes:
        values: positive KLs of each layer cut by ``cut`` alone (their scale does not matter: the
            estimate uses their ratios).
        exponents: each layer's growth exponent; empty: the axis's own fitted exponent in every layer.
        cut: the fraction cut in the ``values`` measurement.
        source: what was measured, where.
    """

    values: tuple[float, ...]
    exponents: tuple[float, ...] = ()
    cut: float = 0.5
    source: str = ""

    def __post_init__(self) -> None:
        if not self.values or any(not math.isfinite(v) or v <= 0 for v in self.values):
            raise ValueError(f"a layer profile needs positive finite values, got {list(self.values)}")
        if self.exponents and (
            len(self.exponents) != len(self.values) or any(not math.isfinite(e) or e <= 0 for e in self.exponents)
        ):
            raise ValueError(f"a layer profile needs one positive exponent per value, got {list(self.exponents)}")
        if not 0 < self.cut <= 1:
            raise ValueError(f"a layer profile's cut is a fraction in (0, 1], got {self.cut}")

    def _read(self, series: Sequence[float], depth: float, log: bool) -> float:
        n = len(series)
        if n == 1:
            return series[0]
        x = min(max(depth * n - 0.5, 0.0), n - 1.0)
        j = min(int(x), n - 2)
        t = x - j
        if log:
            return math.exp((1 - t) * math.log(series[j]) + t * math.log(series[j + 1]))
        return (1 - t) * series[j] + t * series[j + 1]

    def at(self, depth: float) -> float:
        """The KL of cutting a layer at relative ``depth`` in [0, 1] by :attr:`cut`."""
        return self._read(self.values, depth, log=True)

    def exponent_at(self, depth: float, default: float) -> float:
        """The growth exponent at relative ``depth`` (``default``, the axis's own, without exponents)."""
        return self._read(self.exponents, depth, log=False) if self.exponents else default

    def curves(self, depths: Sequence[float], default: float) -> list[tuple[float, float]]:
        """``(k, p)`` per layer at ``depths``: its KL from a cut ``c`` is ``k · c ** p`` (up to one scale)."""
        out = []
        for d in depths:
            p = self.exponent_at(d, default)
            out.append((self.at(d) / self.cut**p, p))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"values": list(self.values), "exponents": list(self.exponents), "cut": self.cut, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerProfile:
        return cls(
            tuple(float(v) for v in data["values"]),
            tuple(float(v) for v in data.get("exponents") or ()),
            float(data.get("cut", 0.5)),
            str(data.get("source", "")),
        )


@dataclass(frozen=True)
class QualityEstimate:
    """``KL ≈ Σ a · cut ** p`` over :data:`AXES` (module doc).

    Attributes:
        coefficients: ``{axis: (a, p)}`` for the axes fitted on measurements.
        fitted_on: one line per source of the fit's rows (what was measured, where).
        borrowed: ``{axis: axis it borrows from}`` for the axes with no measurement (:data:`FALLBACKS`).
        profiles: ``{side: LayerProfile}`` (sides of :data:`PROFILE_SIDES`); empty: every axis pooled.
    """

    coefficients: Mapping[str, tuple[float, float]]
    fitted_on: tuple[str, ...] = ()
    borrowed: Mapping[str, str] = field(default_factory=dict)
    profiles: Mapping[str, LayerProfile] = field(default_factory=dict)

    def curve(self, axis: str) -> tuple[float, float]:
        """``(a, p)`` of ``axis``: its own fit, the one it borrows, or ``(0, 1)`` (not priced)."""
        source = axis if axis in self.coefficients else self.borrowed.get(axis, axis)
        return self.coefficients.get(source, (0.0, 1.0))

    def term(self, axis: str, cut: float) -> float:
        """The estimate's KL from ``cut`` along ``axis`` alone (every layer cut alike)."""
        a, p = self.curve(axis)
        return a * cut**p if cut > 0 else 0.0

    def profile(self, axis: str) -> LayerProfile | None:
        """The layer profile that prices ``axis`` per layer, if any."""
        side = PROFILE_SIDES.get(axis)
        return self.profiles.get(side) if side is not None else None

    def layer_term(self, axis: str, cuts: Sequence[tuple[float, float]]) -> float:
        """The axis's KL from per-layer ``(relative depth, cut)`` (module doc, **Layers**): the pooled
        term at the mean cut ``c̄``, times ``Σ_l k_l c_l ** p_l / Σ_l k_l c̄ ** p_l`` with the profile's
        per-layer curves (:meth:`LayerProfile.curves`): exactly the pooled term for a uniform cut."""
        mean = sum(c for _, c in cuts) / len(cuts) if cuts else 0.0
        profile = self.profile(axis)
        if profile is None or mean <= 0:
            return self.term(axis, mean)
        _, p = self.curve(axis)
        curves = profile.curves([d for d, _ in cuts], p)
        spread = sum(k * c**q for (k, q), (_, c) in zip(curves, cuts, strict=True) if c > 0)
        return self.term(axis, mean) * spread / sum(k * mean**q for k, q in curves)

    def kl_of_cuts(self, cuts: Mapping[str, float]) -> float:
        return float(sum(self.term(axis, float(cut)) for axis, cut in cuts.items()))

    def kl(self, arch: Architecture, parent: Architecture) -> float:
        """The estimated KL (nats) of ``arch`` cut from ``parent``; 0 for the parent. Axes with a layer
        profile are priced per layer (:meth:`layer_term`), the rest by their pooled cut."""
        pooled = axis_cuts(arch, parent)
        if not self.profiles:
            return self.kl_of_cuts(pooled)
        per_layer = layer_cuts(arch, parent)
        total = 0.0
        for axis, cut in pooled.items():
            if self.profile(axis) is not None:
                total += self.layer_term(axis, per_layer[axis])
            else:
                total += self.term(axis, cut)
        return float(total)

    def quality(self, arch: Architecture, parent: Architecture) -> float:
        """``exp(−KL̂)`` in (0, 1], 1.0 for the parent: plan mode's quality kind ``estimated_kl``."""
        return math.exp(-self.kl(arch, parent))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "KL = sum over axes of a * cut ** p",
            "coefficients": {axis: {"a": a, "p": p} for axis, (a, p) in self.coefficients.items()},
            "borrowed": dict(self.borrowed),
            "fitted_on": list(self.fitted_on),
            **({"layer_profiles": {k: v.to_dict() for k, v in self.profiles.items()}} if self.profiles else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QualityEstimate:
        coefficients = {axis: (float(c["a"]), float(c["p"])) for axis, c in data["coefficients"].items()}
        unknown = sorted(set(coefficients) - set(AXES))
        if unknown:
            raise ValueError(f"quality estimate: unknown axes {unknown}; valid: {', '.join(AXES)}")
        profiles = {side: LayerProfile.from_dict(raw) for side, raw in (data.get("layer_profiles") or {}).items()}
        bad = sorted(set(profiles) - set(PROFILE_SIDES.values()))
        if bad:
            raise ValueError(f"quality estimate: unknown layer profiles {bad}; valid: ffn, mixer")
        return cls(coefficients, tuple(data.get("fitted_on") or ()), dict(data.get("borrowed") or {}), profiles)


def load_estimate(path: str | Path | None = None) -> QualityEstimate:
    """The shipped fit (``autocompress_opt/data/quality_estimate.json``) or the one at ``path``."""
    from autocompress_opt._data import DATA_DIR

    where = Path(path) if path is not None else DATA_DIR / ESTIMATE_FILE
    return QualityEstimate.from_dict(json.loads(where.read_text(encoding="utf-8")))


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """``argmin ||a x − b||`` subject to ``x ≥ 0`` (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
        w = a.T @ (b - a @ x)
    return x


def fit_estimate(
    rows: Iterable[tuple[Mapping[str, float], float]],
    *,
    fitted_on: Sequence[str] = (),
    rounds: int = 4,
) -> QualityEstimate:
    """Fit :class:`QualityEstimate` on ``rows`` of ``(axis cuts, measured KL)`` (module doc). Axes
    no row cuts are left out of the fit and borrow per :data:`FALLBACKS` where they can."""
    data = [(dict(c), float(kl)) for c, kl in rows]
    if not data:
        raise ValueError("fit_estimate needs at least one (cuts, KL) row")
    if any(not math.isfinite(kl) or kl <= 0 for _, kl in data):
        raise ValueError("fit_estimate: every measured KL must be finite and > 0")
    axes = [axis for axis in AXES if any(c.get(axis, 0.0) > 0 for c, _ in data)]
    cuts = np.array([[c.get(axis, 0.0) for axis in axes] for c, _ in data])
    kl = np.array([k for _, k in data])
    scale = 1.0 / kl  # relative error: a 0.1-nat miss matters more at 0.3 nats than at 9

    def solve(powers: Sequence[float]) -> tuple[float, np.ndarray]:
        design = cuts ** np.array(powers) * (cuts > 0)
        a = nnls(design * scale[:, None], np.ones_like(kl))
        return float(np.sum((design @ a * scale - 1.0) ** 2)), a

    powers = [1.0] * len(axes)
    best, a = solve(powers)
    for _ in range(rounds):
        changed = False
        for i in range(len(axes)):
            for p in EXPONENTS:
                trial = [*powers[:i], p, *powers[i + 1 :]]
                err, coef = solve(trial)
                if err < best - 1e-12:
                    best, a, powers, changed = err, coef, trial, True
        if not changed:
            break
    coefficients = {axis: (float(a[i]), float(powers[i])) for i, axis in enumerate(axes)}
    borrowed = {axis: src for axis, src in FALLBACKS.items() if axis not in coefficients and src in coefficients}
    return QualityEstimate(coefficients, tuple(fitted_on), borrowed)
