"""The uniform candidate grid the baselines choose from (:func:`uniform_grid`): every uniform child of
a parent on hardware-friendly sizes, each knowing its global point in the search space's keys
(:attr:`UniformCandidate.point`), and Minitron's limits on how far such a point may cut
(:class:`MinitronLimits`). Pure: no weights, no cost model. The baselines that choose among these
candidates live in :mod:`autocompress_opt.prune.baselines`, which re-exports these names."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autocompress_opt.arch.architecture import Architecture, reference_layer
from autocompress_opt.arch.search_space import CHOICES, uniform_allocation
from autocompress_opt.errors import ConfigError

__all__ = [
    "MAX_WIDTH_VALUES",
    "MINITRON_LIMITS",
    "MinitronLimits",
    "UniformCandidate",
    "grid_values",
    "point_cuts",
    "uniform_grid",
]


# ------------------------------------------------------------------- the uniform candidate grid
# At most this many values per width dimension: a wider parent's step grows in whole multiples of
# its base step (Llama-3-8B's FFN of 14,336 goes in steps of 448, not 64), so the grid stays small
# enough to check every candidate with the exact cost model.
MAX_WIDTH_VALUES = 32


@dataclass(frozen=True)
class UniformCandidate:
    """One point of the uniform grid: every kept layer alike (:func:`uniform_grid`).

    Attributes:
        num_layers / hidden_size / ffn_width / num_kv_heads / q_per_kv: the five global choices of
            :data:`~autocompress_opt.arch.search_space.CHOICES` (query heads = ``num_kv_heads · q_per_kv``).
        num_params: parameters of :attr:`architecture`.
        parent / layer_order: what :attr:`architecture` is cut from, and the parent's layers most worth
            keeping first (None: :func:`~autocompress_opt.arch.architecture.default_layer_order`).

    Equality and hashing use the five choices and ``num_params`` only. Build one with :meth:`build`.
    """

    num_layers: int
    hidden_size: int
    ffn_width: int
    num_kv_heads: int
    q_per_kv: int
    num_params: int
    parent: Architecture = field(compare=False, repr=False)
    layer_order: tuple[int, ...] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(
        cls, point: Mapping[str, int], parent: Architecture, layer_order: Sequence[int] | None = None
    ) -> UniformCandidate:
        """The candidate of a point (keys :data:`CHOICES`), its parameters counted on its architecture."""
        order = None if layer_order is None else tuple(layer_order)
        arch = uniform_allocation(point, parent, order)
        candidate = cls(
            **{c: int(point[c]) for c in CHOICES}, num_params=arch.num_params, parent=parent, layer_order=order
        )
        candidate.__dict__["architecture"] = arch  # the cached_property's slot: built once
        return candidate

    @functools.cached_property
    def architecture(self) -> Architecture:
        """``uniform_allocation(point, parent, layer_order)``: the first ``num_layers`` of the layer order
        kept; it lists all the parent's layers (dropped ones as no-ops), so
        :func:`~autocompress_opt.prune.plan.plan_pruning` keeps exactly those layers. Built on first use."""
        return uniform_allocation(self.point, self.parent, self.layer_order)

    @property
    def point(self) -> dict[str, int]:
        """The global choices keyed as :data:`~autocompress_opt.arch.search_space.CHOICES` (what a study enqueues)."""
        return {name: getattr(self, name) for name in CHOICES}

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.q_per_kv

    def cuts(self, parent: Architecture) -> dict[str, float]:
        """:func:`point_cuts` of this candidate's point."""
        return point_cuts(self.point, parent)

    def label(self) -> str:
        """Short form: ``"24L h512 ffn1280 kv3x2"`` (KV groups x query heads per group)."""
        return f"{self.num_layers}L h{self.hidden_size} ffn{self.ffn_width} kv{self.num_kv_heads}x{self.q_per_kv}"


def uniform_grid(
    parent: Architecture,
    *,
    layer_order: Sequence[int] | None = None,
    width_multiple: int | None = None,
    limits: MinitronLimits | None = None,
) -> list[UniformCandidate]:
    """Every uniform child of ``parent`` on the sizes of :func:`grid_values` (only those ``limits``
    allows, when given), most parameters first.

    A candidate keeps the first ``num_layers`` of ``layer_order`` (e.g.
    :meth:`~autocompress_opt.prune.importance.Importance.layer_order`; default
    :func:`~autocompress_opt.arch.architecture.default_layer_order`). Ordered by parameters, most
    first; ties by the choices in :data:`CHOICES` order, larger first. Pure. Raises
    :class:`ConfigError` as :func:`grid_values` does.
    """
    values = grid_values(parent, width_multiple)
    order = None if layer_order is None else tuple(layer_order)
    grid = []
    for widths in itertools.product(*(values[c] for c in CHOICES[1:])):
        # Every kept layer has the same parameters (windows do not count), so the total is affine in
        # the depth: count it on 1 and 2 layers, not on every depth.
        one, two = (
            uniform_allocation(dict(zip(CHOICES, (n, *widths))), parent, order).num_params
            for n in (1, min(2, len(values["num_layers"])))
        )
        for n in values["num_layers"]:
            point = dict(zip(CHOICES, (n, *widths)))
            if limits is None or limits.allows(point, parent):
                grid.append(
                    UniformCandidate(**point, num_params=one + (n - 1) * (two - one), parent=parent, layer_order=order)
                )
    return sorted(grid, key=lambda c: (-c.num_params, *(-v for v in c.point.values())))


def grid_values(parent: Architecture, width_multiple: int | None = None) -> dict[str, tuple[int, ...]]:
    """The values of each choice of :data:`CHOICES` in the uniform grid of ``parent``, ascending:

    * ``num_layers``: 1 .. the parent's layers;
    * ``hidden_size`` and ``ffn_width``: the parent's size and the multiples of a step below it. The
      step is ``width_multiple``, by default 64 when the size is a multiple of 64, else the largest
      power of two dividing it (the parent's own step); grown in whole steps when a dimension would
      have more than :data:`MAX_WIDTH_VALUES` values;
    * ``num_kv_heads``: every whole number of KV groups, 1 .. the parent's; ``q_per_kv``: every whole
      number of query heads per group, 1 .. the parent's.

    Raises :class:`ConfigError` for a heterogeneous parent (windows may differ: Gemma 3) or a
    ``width_multiple`` that is not a positive int.
    """
    if not parent.is_uniform:
        raise ConfigError(f"the uniform grid needs a uniform parent; {parent.summary()} is heterogeneous")
    if width_multiple is not None and (
        not isinstance(width_multiple, int) or isinstance(width_multiple, bool) or width_multiple < 1
    ):
        raise ConfigError(f"width_multiple must be a positive int or None, got {width_multiple!r}")
    ref = reference_layer(parent)
    return {
        "num_layers": tuple(range(1, parent.num_active_layers + 1)),
        "hidden_size": _width_values(parent.hidden_size, width_multiple),
        "ffn_width": _width_values(ref.ffn_width, width_multiple),
        "num_kv_heads": tuple(range(1, ref.num_kv_heads + 1)),
        "q_per_kv": tuple(range(1, ref.num_heads // ref.num_kv_heads + 1)),
    }


def point_cuts(point: Mapping[str, int], parent: Architecture) -> dict[str, float]:
    """Fraction of each dimension of ``parent`` a uniform point (keys :data:`CHOICES`) removes
    (0 = kept whole): depth (``num_layers``) and the widths ``hidden_size``, ``ffn_width``,
    ``num_kv_heads`` and ``num_heads`` (query heads, ``num_kv_heads · q_per_kv``)."""
    ref = reference_layer(parent)
    kept = {**point, "num_heads": point["num_kv_heads"] * point["q_per_kv"]}
    whole = {
        "num_layers": parent.num_active_layers,
        "hidden_size": parent.hidden_size,
        "ffn_width": ref.ffn_width,
        "num_kv_heads": ref.num_kv_heads,
        "num_heads": ref.num_heads,
    }
    return {name: 1 - kept[name] / size for name, size in whole.items()}


def _width_values(size: int, multiple: int | None) -> tuple[int, ...]:
    """``size`` and the multiples of the step below it, ascending (see :func:`uniform_grid`)."""
    base = multiple or (64 if size % 64 == 0 else math.gcd(size, 64))
    step = base * max(1, math.ceil(size / base / MAX_WIDTH_VALUES))
    return tuple(sorted({size, *range(step, size, step)}))


# ----------------------------------------------------------------------- Minitron's limits
@dataclass(frozen=True)
class MinitronLimits:
    """How far ModelOpt's Minitron searcher may cut (``max_width_pruning`` / ``max_depth_pruning``).

    Attributes:
        width: largest fraction removed from each width dimension (hidden size, FFN, KV groups,
            query heads); ModelOpt's default 0.4.
        depth: largest fraction of the layers removed; ModelOpt's default 0.2.

    ModelOpt applies the fractions to its list of choices (``sorted(choices)[int((1 - f) · n):]``);
    here they bound the cut itself (:meth:`UniformCandidate.cuts`), the same on an evenly spaced grid
    and exact on the uneven KV-group counts of small models.
    """

    width: float = 0.4
    depth: float = 0.2

    def __post_init__(self) -> None:
        for name in ("width", "depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ConfigError(f"MinitronLimits.{name} must be a fraction in [0, 1), got {value!r}")

    def allows(self, point: Mapping[str, int], parent: Architecture) -> bool:
        """Whether a uniform point (e.g. :attr:`UniformCandidate.point`) cuts no width of ``parent`` by
        more than :attr:`width` and the depth by no more than :attr:`depth` (:func:`point_cuts`)."""
        eps = 1e-9  # 1 - 24/30 is 0.2 on paper, 0.19999... in floats
        return all(
            cut <= (self.depth if name == "num_layers" else self.width) + eps
            for name, cut in point_cuts(point, parent).items()
        )

    def describe(self) -> str:
        return f"width cut <= {self.width:.0%} per dimension, depth cut <= {self.depth:.0%}"


MINITRON_LIMITS = MinitronLimits()
