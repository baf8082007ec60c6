"""Uniform baselines: the practitioner's Minitron-style recipe (:func:`uniform_baseline`), which
fixes the sizes of a uniform model from a parameter target; which heads, channels and layers go is
then decided by :func:`~autocompress_opt.prune.plan.plan_pruning`.

Against a hardware constraint the practitioner picks the largest parameter target that fits:
:func:`minitron_picks` (one pick per width recipe, ranked by :func:`rank_picks`) and
:func:`minitron_pick` (the best of them), given a feasibility predicate built from the target's
constraint check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from autocompress_opt.arch.architecture import Architecture, default_layer_order, uniform_child
from autocompress_opt.errors import ConfigError

__all__ = [
    "BASELINE_WIDTHS",
    "PARAM_FRACTIONS",
    "MinitronPick",
    "minitron_pick",
    "minitron_picks",
    "rank_picks",
    "resolve_param_target",
    "uniform_baseline",
]


# --------------------------------------------------------------------------- baseline recipe
def resolve_param_target(params: float, parent_params: int) -> int:
    """A parameter budget: ``0 < params <= 1`` is a fraction of ``parent_params``, ``> 1`` a count."""
    if isinstance(params, bool) or not isinstance(params, (int, float)) or not params > 0:
        raise ConfigError(f"params must be a fraction in (0, 1] or a parameter count > 1, got {params!r}")
    return int(params * parent_params) if params <= 1 else int(params)


BASELINE_WIDTHS = ("ffn", "hidden+ffn")


def uniform_baseline(
    parent: Architecture,
    params: float,
    *,
    max_layer_drop: float = 0.25,
    width_multiple: int = 64,
    width: str = "ffn",
) -> Architecture:
    """The practitioner's Minitron-style baseline: a UNIFORM target with at most ``params`` parameters.

    This is what a user picks without a hardware model — a parameter count — with a fixed recipe
    for splitting the cut between depth and width:

    1. **Depth**: drop layers, least important first, while the model is over budget and at most
       ``floor(max_layer_drop · L)`` layers are gone (default 25%; Minitron found width pruning
       keeps more accuracy than depth pruning, so depth is capped).
    2. **Width**, by ``width``:

       * ``"ffn"``: the widest FFN, a multiple of ``width_multiple`` (64: GEMM-friendly), that
         meets the budget at that depth. Heads and hidden size are kept.
       * ``"hidden+ffn"``: Minitron's width recipe (Llama-3.1-Minitron-4B-Width shrinks hidden
         4096 → 3072 and MLP 14336 → 9216, heads kept): hidden size and FFN shrink by one shared
         ratio ``r``, each rounded down to a multiple of ``width_multiple`` — the largest ``r``, in
         steps of 1/1024, that meets the budget. Heads are kept. This is the recipe that can reach
         budgets below the embeddings' share of the parent (Gemma 3's 262K vocabulary holds 63% of
         Gemma-3-270M's parameters).
    3. If even the narrowest width is over budget, drop one more layer and retry step 2, down to
       one layer; past that, :class:`ConfigError` (the embeddings alone are too big).

    Which layers, channels and heads go is decided afterwards by :func:`plan_pruning` from the
    importance scores (``layer_metric``); this function only fixes the sizes. Returns ``parent`` itself when it
    already meets the budget. ``parent`` must be uniform (windows may differ: Gemma 3).

    Windows (they change the cost, not the parameter count): an ``n``-layer result lists the windows
    of the parent layers it most likely keeps without knowing the importance scores, the ``n`` first
    of :func:`~autocompress_opt.arch.architecture.default_layer_order` (the first ``n - 1`` and the
    last; the first alone when ``n = 1``). :func:`plan_pruning` then gives every kept layer its
    actual parent layer's window.
    """
    _check_recipe(parent, max_layer_drop, width_multiple, width)
    budget = resolve_param_target(params, parent.num_params)
    if parent.num_params <= budget:
        return parent
    layer, depth = parent.layers[0], parent.num_layers
    name = f"{parent.name.rstrip('/').rsplit('/', 1)[-1] or parent.family}-uniform-{budget}"
    order = default_layer_order(parent)  # the windows' source layers (docstring)

    def build(n: int, shape: tuple[int, int]) -> Architecture:
        hidden, ffn = shape
        return uniform_child(
            parent,
            kept_layers=order[:n],
            hidden_size=hidden,
            num_kv_heads=layer.num_kv_heads,
            q_per_kv=layer.num_heads // layer.num_kv_heads,
            ffn_width=ffn,
            name=name,
        ).active()

    def down(value: int, ratio: float) -> int:
        return max(width_multiple, int(value * ratio) // width_multiple * width_multiple) if ratio < 1 else value

    full = (parent.hidden_size, layer.ffn_width)
    if width == "ffn":
        shapes = [full] + [
            (parent.hidden_size, w)
            for w in range(layer.ffn_width // width_multiple * width_multiple, 0, -width_multiple)
        ]
    else:
        shapes = list(
            dict.fromkeys(
                (down(parent.hidden_size, r / 1024), down(layer.ffn_width, r / 1024)) for r in range(1024, 0, -1)
            )
        )
    min_depth = parent.num_layers - int(max_layer_drop * parent.num_layers)
    while depth > min_depth and build(depth, full).num_params > budget:
        depth -= 1
    for n in range(depth, 0, -1):
        for shape in shapes:
            if build(n, shape).num_params <= budget:
                return build(n, shape)
    smallest = build(1, shapes[-1]).num_params
    raise ConfigError(
        f"cannot reach {budget:,} parameters with a uniform model: the smallest "
        f"(1 layer, hidden {shapes[-1][0]}, FFN {shapes[-1][1]}) has {smallest:,} "
        f"({parent.embedding_params:,} in embeddings)"
        + ("; width='hidden+ffn' also shrinks the embeddings" if width == "ffn" else "")
    )


def _check_recipe(parent: Architecture, max_layer_drop: float, width_multiple: int, width: str) -> None:
    """Raise :class:`ConfigError` naming the first recipe setting :func:`uniform_baseline` cannot use."""
    if not parent.is_uniform:
        raise ConfigError(f"the uniform baseline needs a uniform parent; {parent.summary()} is heterogeneous")
    if not 0.0 <= max_layer_drop < 1.0:
        raise ConfigError(f"max_layer_drop must be a fraction in [0, 1), got {max_layer_drop!r}")
    if not isinstance(width_multiple, int) or width_multiple < 1:
        raise ConfigError(f"width_multiple must be a positive int, got {width_multiple!r}")
    if width not in BASELINE_WIDTHS:
        raise ConfigError(f"width must be one of {', '.join(BASELINE_WIDTHS)}, got {width!r}")


# ------------------------------------------------------------- the pick under a constraint
# Parameter targets a practitioner tries, largest first: 100 % down to 5.25 % in 0.25 % steps.
PARAM_FRACTIONS: tuple[float, ...] = tuple(k / 400 for k in range(400, 20, -1))


@dataclass(frozen=True)
class MinitronPick:
    """The Minitron-style baseline of one width recipe that meets a constraint.

    Attributes:
        width: the width recipe (one of :data:`BASELINE_WIDTHS`).
        param_fraction: the parameter target, a fraction of the parent's parameters.
        architecture: ``uniform_baseline(parent, param_fraction, width=width)``.
    """

    width: str
    param_fraction: float
    architecture: Architecture


def rank_picks(picks: Iterable[MinitronPick]) -> list[MinitronPick]:
    """Best first: more parameters (the practitioner's "largest that fits"); on a tie, the recipe
    listed first in :data:`BASELINE_WIDTHS` (FFN alone)."""
    return sorted(picks, key=lambda p: (-p.architecture.num_params, BASELINE_WIDTHS.index(p.width)))


def minitron_picks(
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    *,
    max_layer_drop: float = 0.25,
    width_multiple: int = 64,
) -> list[MinitronPick]:
    """Per width recipe of :func:`uniform_baseline`: the largest parameter fraction of
    :data:`PARAM_FRACTIONS` whose architecture ``feasible`` accepts, ranked by :func:`rank_picks`.

    ``feasible`` is the target's constraint check (e.g. every constraint of the workload met by the
    cost model); it is called on each candidate, largest first, until one passes.
    ``max_layer_drop`` and ``width_multiple`` go to :func:`uniform_baseline`. A recipe none of whose
    fractions is feasible (or reachable by a uniform model) is left out, so the list may be empty.
    Raises :class:`ConfigError` for a heterogeneous parent or a bad recipe setting.
    """
    picks = []
    for width in BASELINE_WIDTHS:
        _check_recipe(parent, max_layer_drop, width_multiple, width)  # so the loop's ConfigError means "too small"
        for fraction in PARAM_FRACTIONS:
            try:
                arch = uniform_baseline(
                    parent, fraction, max_layer_drop=max_layer_drop, width_multiple=width_multiple, width=width
                )
            except ConfigError:  # below what any uniform model of this recipe can reach
                break
            if feasible(arch):
                picks.append(MinitronPick(width, fraction, arch))
                break
    return rank_picks(picks)


def minitron_pick(
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    *,
    max_layer_drop: float = 0.25,
    width_multiple: int = 64,
) -> MinitronPick:
    """The Minitron-style baseline under a constraint: the first of :func:`minitron_picks`.

    Raises :class:`ConfigError` when no parameter fraction of either width recipe is feasible.
    """
    picks = minitron_picks(parent, feasible, max_layer_drop=max_layer_drop, width_multiple=width_multiple)
    if not picks:
        raise ConfigError(
            f"no Minitron-style baseline of {parent.name or parent.family} meets the constraints "
            f"(widths {', '.join(BASELINE_WIDTHS)}, parameter fractions {PARAM_FRACTIONS[0]:.2%} down to "
            f"{PARAM_FRACTIONS[-1]:.2%})"
        )
    return picks[0]
