"""Search spaces: the *global* choices of the outer loop, as typed data with a YAML form.

A space names, for a parent model, the candidate values of five global choices:

* ``num_layers`` — layers kept (the rest dropped);
* ``hidden_size`` — residual width;
* ``ffn_width`` — FFN intermediate size (every kept layer in plan mode; in weights mode the mean
  budget, which the uniform model keeps exactly and a per-layer shape meets in the engine's width
  multiple, to within the total rounded down to it:
  :meth:`~autocompress_opt.prune.loadability.ShapeRules.ffn_total`);
* ``num_kv_heads`` — KV heads per attention layer;
* ``q_per_kv`` — query heads per KV head (query heads = ``num_kv_heads · q_per_kv``).

Each is a range ``{min, max, step}`` or a list ``{choices: [...]}``, in hardware-friendly
multiples. Values larger than the parent's are an error, so every sampled point is a valid
sub-architecture of the parent (property-tested). YAML example (``search_spaces/smollm2-135m.yaml``)::

    sampler: tpe
    num_layers: {min: 10, max: 30}
    hidden_size: {choices: [384, 448, 512, 576]}
    ffn_width: {min: 256, max: 1536, step: 64}
    num_kv_heads: {choices: [1, 3]}
    q_per_kv: {choices: [1, 2, 3]}
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocompress_opt._data import REPO_SEARCH_SPACES
from autocompress_opt.arch.architecture import Architecture, default_layer_order, reference_layer, uniform_child
from autocompress_opt.arch.hybrid import SPARSE_CHOICES, depth_layers, hybrid_child, is_sparse, sparse_limits
from autocompress_opt.errors import ConfigError, check_int, suggest

__all__ = [
    "CHOICES",
    "SAMPLERS",
    "SPARSE_CHOICES",
    "Choice",
    "SearchSpace",
    "default_space",
    "load_search_space",
    "space_changes",
    "uniform_allocation",
]

CHOICES: tuple[str, ...] = ("num_layers", "hidden_size", "ffn_width", "num_kv_heads", "q_per_kv")
SAMPLERS: tuple[str, ...] = ("tpe", "nsga2", "gp", "random")


@dataclass(frozen=True)
class Choice:
    """The candidate values of one global choice (sorted, unique, positive integers)."""

    name: str
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ConfigError(f"search space: {self.name} has no candidate values (empty range or list)")
        for v in self.values:
            check_int(v, f"search space: each {self.name} value in {list(self.values)}")

    @classmethod
    def parse(cls, name: str, raw: Any) -> Choice:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return cls(name, (raw,))
        if isinstance(raw, Sequence) and not isinstance(raw, str):
            return cls(name, tuple(sorted(set(raw))))
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"search space: {name} must be a number, a list, {{choices: [...]}} or {{min, max, step}}; got {raw!r}"
            )
        keys = set(raw)
        if keys == {"choices"}:
            return cls.parse(name, list(raw["choices"]))
        for key in keys - {"min", "max", "step"}:
            raise ConfigError(
                f"search space: unknown key {key!r} in {name}{suggest(key, ['min', 'max', 'step', 'choices'])}; "
                "use {choices: [...]} or {min, max, step}"
            )
        if not {"min", "max"} <= keys:
            raise ConfigError(f"search space: {name} range needs both min and max, got {dict(raw)}")
        lo, hi, step = raw["min"], raw["max"], raw.get("step", 1)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi, step)) or step < 1:
            raise ConfigError(f"search space: {name} min/max/step must be integers with step >= 1, got {dict(raw)}")
        if lo > hi:
            raise ConfigError(f"search space: {name} range is empty (min {lo} > max {hi})")
        return cls(name, tuple(range(lo, hi + 1, step)))

    def to_yaml(self) -> dict[str, Any]:
        return {"choices": list(self.values)}


@dataclass(frozen=True)
class SearchSpace:
    """Global choices for one parent, plus the sampler that explores them."""

    choices: tuple[Choice, ...]
    sampler: str = "tpe"

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ConfigError(
                f"unknown sampler {self.sampler!r}{suggest(self.sampler, SAMPLERS)}; valid: {', '.join(SAMPLERS)}"
            )
        names = [c.name for c in self.choices]
        if not self.is_sparse:
            if sorted(names) != sorted(CHOICES):
                raise ConfigError(
                    f"search space needs exactly the choices {', '.join(CHOICES)}; got {', '.join(names)}"
                )
            return
        unknown = [n for n in names if n not in CHOICES + SPARSE_CHOICES]
        if unknown or len(set(names)) != len(names) or not {"num_layers", "hidden_size"} <= set(names):
            raise ConfigError(
                "a MoE / hybrid search space needs num_layers and hidden_size, each choice once, from "
                f"{', '.join(CHOICES + SPARSE_CHOICES)}; got {', '.join(names)}"
            )

    @property
    def is_sparse(self) -> bool:
        """True when the space sizes MoE or Mamba-2 layers (any of :data:`SPARSE_CHOICES`); its dense
        choices are then optional (a parent without attention or dense FFNs has nothing for them)."""
        return any(c.name in SPARSE_CHOICES for c in self.choices)

    @property
    def names(self) -> tuple[str, ...]:
        """The space's choices, in order."""
        return tuple(c.name for c in self.choices)

    def __getitem__(self, name: str) -> Choice:
        return next(c for c in self.choices if c.name == name)

    @property
    def size(self) -> int:
        """Number of distinct points."""
        total = 1
        for c in self.choices:
            total *= len(c.values)
        return total

    # ---------------------------------------------------------------- validation
    def check_parent(self, parent: Architecture) -> None:
        """Raise when a choice exceeds what the parent has (nothing can be grown by pruning), or, for a
        MoE / hybrid parent, when the space lacks a choice the parent has a sub-block for or has one
        it has none for."""
        if is_sparse(parent) or self.is_sparse:
            self._check_sparse_parent(parent)
            return
        ref = reference_layer(parent)
        limits = {
            "num_layers": parent.num_active_layers,
            "hidden_size": parent.hidden_size,
            "ffn_width": ref.ffn_width,
            "num_kv_heads": ref.num_kv_heads,
            "q_per_kv": ref.num_heads // ref.num_kv_heads,
        }
        self._check_limits(limits, parent.name or parent.family)

    def _check_limits(self, limits: Mapping[str, int], who: str) -> None:
        """Raise when a choice's largest value exceeds the parent's ``limits[choice]``."""
        for name, limit in limits.items():
            largest = max(self[name].values)
            if largest > limit:
                raise ConfigError(
                    f"search space: {name} choice {largest} is larger than the parent's {limit} ({who}); "
                    f"valid values are <= {limit}"
                )

    def _check_sparse_parent(self, parent: Architecture) -> None:
        limits = sparse_limits(parent) if is_sparse(parent) else {}
        who = parent.name or parent.family
        if not limits:
            raise ConfigError(
                f"search space sizes MoE / Mamba-2 layers ({', '.join(n for n in self.names if n in SPARSE_CHOICES)}) "
                f"but {who} has none; drop those choices"
            )
        missing, extra = sorted(set(limits) - set(self.names)), sorted(set(self.names) - set(limits))
        if missing or extra:
            raise ConfigError(
                f"search space for {who} must have exactly the choices {', '.join(limits)} (its sub-blocks); "
                + "; ".join(
                    p
                    for p in (
                        missing and f"missing {', '.join(missing)}",
                        extra and f"no sub-block for {', '.join(extra)}",
                    )
                    if p
                )
            )
        self._check_limits(limits, who)

    # ------------------------------------------------------------------ optuna
    def distributions(self) -> dict[str, Any]:
        """Optuna distributions, one categorical (or int) per choice."""
        from optuna.distributions import CategoricalDistribution, IntDistribution

        out: dict[str, Any] = {}
        for c in self.choices:
            values = c.values
            steps = {b - a for a, b in itertools.pairwise(values)}
            if len(values) > 1 and len(steps) == 1:
                out[c.name] = IntDistribution(values[0], values[-1], step=steps.pop())
            elif len(values) == 1:
                out[c.name] = IntDistribution(values[0], values[0])
            else:
                out[c.name] = CategoricalDistribution(list(values))
        return out

    def make_sampler(self, seed: int | None = None) -> Any:
        import optuna

        if self.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8)
        if self.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
        if self.sampler == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        return optuna.samplers.RandomSampler(seed=seed)

    # --------------------------------------------------------------- to an arch
    def architecture(
        self, params: Mapping[str, int], parent: Architecture, layer_order: Sequence[int] | None = None
    ) -> Architecture:
        """The architecture a sampled point stands for: :func:`uniform_allocation`."""
        return uniform_allocation(params, parent, layer_order)

    # ------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler, **{c.name: c.to_yaml() for c in self.choices}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        if not isinstance(data, Mapping):
            raise ConfigError(f"a search space must be a mapping, got {type(data).__name__}")
        valid = set(CHOICES) | set(SPARSE_CHOICES) | {"sampler"}
        for key in data:
            if key not in valid:
                raise ConfigError(
                    f"unknown search-space key {key!r}{suggest(str(key), valid)}; valid: {', '.join(sorted(valid))}"
                )
        names = [c for c in CHOICES + SPARSE_CHOICES if c in data]
        missing = [c for c in CHOICES if c not in data]
        if missing and not any(c in data for c in SPARSE_CHOICES):
            raise ConfigError(f"search space lacks {', '.join(missing)}")
        return cls(tuple(Choice.parse(c, data[c]) for c in names), sampler=str(data.get("sampler", "tpe")))


def uniform_allocation(
    params: Mapping[str, int], parent: Architecture, layer_order: Sequence[int] | None = None
) -> Architecture:
    """The plan-mode architecture of a point (its five global choices): the ``num_layers`` first
    present layers of ``layer_order`` kept, every one alike in size and keeping its parent layer's
    attention window (:func:`~autocompress_opt.arch.architecture.uniform_child`); the child lists all
    of the parent's layers.

    ``layer_order`` ranks the parent's layers from most to least important (e.g.
    :meth:`~autocompress_opt.prune.importance.Importance.layer_order`); without it,
    :func:`~autocompress_opt.arch.architecture.default_layer_order` (layers go from the deep end,
    the last one kept). Raises :class:`ConfigError` when a choice is missing or ``num_layers`` is
    outside ``1..`` the parent's present layers.
    """
    sparse = is_sparse(parent)
    missing = [c for c in (("num_layers", "hidden_size") if sparse else CHOICES) if c not in params]
    if missing:
        raise ConfigError(f"point lacks {', '.join(missing)}")
    n = int(params["num_layers"])
    present = [
        i
        for i in (default_layer_order(parent) if layer_order is None else layer_order)
        if 0 <= i < parent.num_layers and not parent.layers[i].is_noop
    ]
    active = parent.num_active_layers
    if not 1 <= n <= active:
        raise ConfigError(f"num_layers={n} is outside 1..{active} (the parent's active layers)")
    if len(present) < n:
        raise ConfigError(f"layer_order ranks {len(present)} present layers of the parent; num_layers={n} needs {n}")
    if sparse:  # a MoE parent's child keeps a MoE layer (depth_layers)
        return hybrid_child(parent, kept_layers=depth_layers(parent, n, present), point=params)
    return uniform_child(
        parent,
        kept_layers=sorted(present[:n]),
        hidden_size=int(params["hidden_size"]),
        num_kv_heads=int(params["num_kv_heads"]),
        q_per_kv=int(params["q_per_kv"]),
        ffn_width=int(params["ffn_width"]),
    )


def default_space(parent: Architecture, sampler: str = "tpe") -> SearchSpace:
    """A space derived from the parent: depth from ~1/3 up, widths in hardware-friendly steps (a MoE /
    hybrid parent: :func:`_sparse_space`)."""
    if is_sparse(parent):
        return _sparse_space(parent, sampler)
    ref = reference_layer(parent)
    depth = parent.num_active_layers
    hidden_step = 64 if parent.hidden_size % 64 == 0 else ref.head_dim
    group = ref.num_heads // ref.num_kv_heads
    kv_choices = sorted({k for k in (1, 2, 4, 8, ref.num_kv_heads) if k <= ref.num_kv_heads})
    return SearchSpace(
        (
            Choice("num_layers", tuple(range(max(1, depth // 3), depth + 1))),
            Choice(
                "hidden_size",
                tuple(
                    range(
                        max(hidden_step, parent.hidden_size // 2 // hidden_step * hidden_step),
                        parent.hidden_size + 1,
                        hidden_step,
                    )
                ),
            ),
            Choice(
                "ffn_width",
                _down_from(
                    ref.ffn_width, 64 if ref.ffn_width >= 512 else max(1, ref.ffn_width // 8), ref.ffn_width // 8
                ),
            ),
            Choice("num_kv_heads", tuple(kv_choices)),
            Choice("q_per_kv", tuple(range(1, group + 1))),
        ),
        sampler=sampler,
    )


def _sparse_space(parent: Architecture, sampler: str) -> SearchSpace:
    """The default space of a MoE / hybrid parent: a choice per sub-block kind it has
    (:func:`~autocompress_opt.arch.hybrid.sparse_limits`). Depth from ~2/3 up and hidden size from
    3/4 up (the axes that cost most quality, ModelOpt's Qwen3-30B-A3B sweep); routed experts from
    1/4 up in 1/16 steps (the cheapest axis there); expert and shared widths from 1/2 up in 1/16 steps
    (multiples of 64 where they divide); top-k from 1/2 up; Mamba heads from 1/2 up in multiples of
    the groups."""
    limits = sparse_limits(parent)
    mamba = next((layer.mamba for layer in parent.layers if layer.mamba is not None), None)

    def fraction_steps(top: int, lowest: float, parts: int = 16, multiple: int = 1) -> tuple[int, ...]:
        step = max(multiple, top // parts // multiple * multiple)
        return _down_from(top, step, max(1, int(top * lowest)))

    ranges: dict[str, tuple[int, ...]] = {
        "num_layers": tuple(range(max(1, limits["num_layers"] * 2 // 3), limits["num_layers"] + 1)),
        "hidden_size": fraction_steps(
            limits["hidden_size"], 0.75, multiple=64 if limits["hidden_size"] % 64 == 0 else 1
        ),
    }
    for name in ("num_kv_heads", "q_per_kv"):
        if name in limits:
            ranges[name] = tuple(k for k in range(1, limits[name] + 1) if limits[name] % k == 0)
    for name in ("ffn_width", "expert_width", "shared_width"):
        if name in limits:
            ranges[name] = fraction_steps(limits[name], 0.5, multiple=64 if limits[name] % 64 == 0 else 1)
    if "num_experts" in limits:
        ranges["num_experts"] = fraction_steps(limits["num_experts"], 0.25)
        top_k = limits["experts_per_token"]
        ranges["experts_per_token"] = tuple(range(max(1, top_k // 2), top_k + 1))
    if mamba is not None:
        ranges["mamba_heads"] = fraction_steps(mamba.num_heads, 0.5, multiple=mamba.groups)
    order = [name for name in CHOICES + SPARSE_CHOICES if name in ranges]  # the YAML form's order
    return SearchSpace(tuple(Choice(name, ranges[name]) for name in order), sampler=sampler)


def space_changes(stored: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """What differs between two serialised spaces (:meth:`SearchSpace.to_dict`), one clause per changed
    key, a range written ``min..max step s``: e.g. ``ffn_width stored 256..1536 step 64, now 256..1536
    step 256``. Empty when they are equal."""

    def brief(raw: Any) -> str:
        values = raw.get("choices") if isinstance(raw, Mapping) else raw
        if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
            return repr(raw)
        steps = {b - a for a, b in itertools.pairwise(values)}
        if len(values) > 2 and len(steps) == 1:
            return f"{values[0]}..{values[-1]} step {steps.pop()}"
        return str(values)

    keys = [k for k in (*stored, *(k for k in now if k not in stored)) if stored.get(k) != now.get(k)]
    return "; ".join(f"{k} stored {brief(stored.get(k))}, now {brief(now.get(k))}" for k in keys)


def _down_from(top: int, step: int, floor: int) -> tuple[int, ...]:
    """``top, top - step, ...`` down to ``floor`` (at least one value: ``top``)."""
    return tuple(sorted(v for v in range(top, max(floor, 1) - 1, -step) if v > 0))


def load_search_space(ref: str | Path) -> SearchSpace:
    """Load YAML from a path, or a bundled space by name (``search_spaces/<name>.yaml``)."""
    import yaml

    path = Path(ref)
    if not path.is_file():
        bundled = REPO_SEARCH_SPACES / f"{ref}.yaml"
        if not bundled.is_file():
            available = sorted(p.stem for p in bundled.parent.glob("*.yaml"))
            raise ConfigError(
                f"search space {str(ref)!r} is neither a file nor a bundled space; bundled: {', '.join(available)}"
            )
        path = bundled
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return SearchSpace.from_dict(data)
