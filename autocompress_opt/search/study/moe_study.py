"""What a weights-mode study of a mixture-of-experts or hybrid parent does differently (issue 30): its
search space, its seeded baseline and its proxy's quality estimate. The trial itself is
:mod:`~autocompress_opt.search.study.moe_trial`.

* **Space.** The outer loop chooses the sparse counts (:data:`~autocompress_opt.prune.experts.EXPERT_CHOICES`
  the parent has: ``num_experts``, ``experts_per_token``, ``expert_width`` and, for Nemotron-H,
  ``shared_width`` and ``mamba_heads``: one value for every layer of a kind, the family's plain
  config); the inner search chooses which experts, channels and heads. Layers, hidden size, attention
  heads and dense FFNs are not pruned in a MoE parent yet, so those choices must hold the parent's
  size only (:func:`check_moe_space`); :func:`expert_space` is the default space
  (:func:`~autocompress_opt.arch.search_space.default_space`'s sparse values, the rest pinned).
* **Seed.** ``minitron`` over the sparse axes (:func:`expert_seeds`): the :data:`SEED_CANDIDATES`
  largest feasible maximal points of the space, each scored by the masked parent's KL
  (:func:`expert_kl_scorer`: the importance choice of experts, channels and heads, as the trial's
  ``start`` candidate), the best enqueued; ``depth`` and ``best-uniform`` are skipped with their reason.
* **Proxy.** A point's plan-mode quality is the importance mass its sparse counts keep
  (:func:`retained_expert_importance`), since the dense plan's retained importance counts no expert.

Only the families of the experts path (:data:`~autocompress_opt.hf.adapters.MOE_ADAPTERS`:
Qwen3-MoE, Mixtral, Nemotron-H) have a weights mode; other MoE and hybrid families are plan-mode only
(:func:`check_moe_space`).
The module imports torch (through :mod:`~autocompress_opt.prune.experts`): import it where weights mode runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import sparse_limits
from autocompress_opt.arch.search_space import Choice, SearchSpace, default_space, uniform_allocation
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.experts import EXPERT_CHOICES

__all__ = [
    "EXPERT_WIDTH_MULTIPLE",
    "SEED_CANDIDATES",
    "check_moe_space",
    "expert_kl_scorer",
    "expert_seeds",
    "expert_space",
    "retained_expert_importance",
]

# Expert widths are multiples of this: transformers' grouped expert matmul (Qwen3-MoE's experts) needs
# 16-byte row strides ("strides should be multiple of 16 bytes", run on CPU), 8 channels in bf16.
EXPERT_WIDTH_MULTIPLE = 8
# Candidates the minitron seed scores: Minitron's top-K (prune.baselines.minitron_search's top_k).
SEED_CANDIDATES = 10


# What the experts path lacks for the MoE / hybrid families transformers has classes for but it does not prune.
_NO_EXPERTS_PATH = {
    "gpt_oss": "transformers' GptOss experts carry biases and a clamped SwiGLU, its router a bias and its "
    "attention sinks: none is masked or sliced by the experts path yet",
    "granitemoehybrid": "transformers' GraniteMoeHybrid experts are stored as one fused input_linear per "
    "layer and its Mamba-2 mixer differs from Nemotron-H's: no adapter reads them yet",
}


def check_moe_space(space: SearchSpace, parent: Architecture) -> None:
    """Raise :class:`ConfigError` (one line) when a weights-mode study of the MoE ``parent`` cannot run:
    its family has no experts path, or ``space`` varies a choice the expert trial does not prune."""
    from autocompress_opt.hf.adapters import MOE_ADAPTERS

    if parent.family not in MOE_ADAPTERS:
        why = _NO_EXPERTS_PATH.get(parent.family, "the experts path has no adapter for its modules")
        raise ConfigError(
            f"--mode weights prunes the sparse blocks of {', '.join(MOE_ADAPTERS)} parents only; "
            f"{parent.family} is plan-mode only ({why}): use --mode plan"
        )
    limits = sparse_limits(parent)
    for choice in space.choices:
        if choice.name not in EXPERT_CHOICES and choice.values != (limits[choice.name],):
            raise ConfigError(
                f"search space: {choice.name} choices {list(choice.values)}: weights mode on a MoE parent prunes "
                f"experts only (issue 30), so {choice.name} must be the parent's {limits[choice.name]}; pin it, "
                f"or drop --space for the default expert space, or use --mode plan"
            )
    odd = (
        [w for w in space["expert_width"].values if w % EXPERT_WIDTH_MULTIPLE] if "expert_width" in space.names else []
    )
    if odd:
        raise ConfigError(
            f"search space: expert_width choices {odd} are not multiples of {EXPERT_WIDTH_MULTIPLE} (the 16-byte rows "
            f"transformers' grouped expert kernels need); valid: multiples of {EXPERT_WIDTH_MULTIPLE} up to "
            f"{limits['expert_width']}"
        )
    groups = next((layer.mamba.groups for layer in parent.layers if layer.mamba is not None), 1)
    uneven = [h for h in space["mamba_heads"].values if h % groups] if "mamba_heads" in space.names else []
    if uneven:
        raise ConfigError(
            f"search space: mamba_heads choices {uneven} are not multiples of the parent's {groups} Mamba-2 groups "
            f"(every group keeps the same number); valid: multiples of {groups} up to {limits['mamba_heads']}"
        )


def expert_space(parent: Architecture, sampler: str = "tpe") -> SearchSpace:
    """The default weights-mode space of a MoE ``parent``: the default space's expert values (widths
    that are multiples of :data:`EXPERT_WIDTH_MULTIPLE`), every other choice pinned to the parent's
    size (module doc)."""
    full = default_space(parent, sampler)
    limits = sparse_limits(parent)

    def pinned(c: Choice) -> Choice:
        if c.name == "expert_width":  # whole 16-byte rows (EXPERT_WIDTH_MULTIPLE); the parent's own if none is
            whole = tuple(w for w in c.values if w % EXPERT_WIDTH_MULTIPLE == 0)
            return Choice(c.name, whole or (limits[c.name],))
        return c if c.name in EXPERT_CHOICES else Choice(c.name, (limits[c.name],))

    return SearchSpace(tuple(pinned(c) for c in full.choices), sampler=sampler)


def _points(space: SearchSpace) -> list[dict[str, int]]:
    """Every point of ``space`` (a MoE weights space: its expert choices vary, the rest is pinned)."""
    import itertools

    names = space.names
    return [dict(zip(names, combo)) for combo in itertools.product(*(space[n].values for n in names))]


def _covers(big: Mapping[str, int], small: Mapping[str, int]) -> bool:
    return all(big[k] >= small[k] for k in small)


def expert_seeds(
    space: SearchSpace,
    parent: Architecture,
    feasible: Callable[[Architecture], bool],
    score: Callable[[Architecture], float] | None,
) -> dict[str, dict[str, Any]]:
    """The seeds of a MoE weights study, in :func:`~.seeding.baseline_seeds`' form (module doc):
    ``minitron`` scores the :data:`SEED_CANDIDATES` feasible points with the most parameters that no
    other feasible point covers (``score``: lower is better; None ranks by parameters), each a
    point of ``space``, so nothing is snapped; ``depth`` and ``best-uniform`` are skipped."""
    out: dict[str, dict[str, Any]] = {
        "depth": {"skipped": "a MoE parent's weights trials keep every layer (the expert search prunes experts only)"},
    }
    ranked = sorted(
        ((uniform_allocation(p, parent).num_params, p) for p in _points(space)), key=lambda r: -r[0]
    )  # most parameters first: a point that covers another comes before it
    found: list[tuple[dict[str, int], Architecture]] = []
    for _, point in ranked:
        if len(found) == SEED_CANDIDATES:
            break
        if point["experts_per_token"] > point["num_experts"] or any(_covers(f, point) for f, _ in found):
            continue
        arch = uniform_allocation(point, parent)
        if feasible(arch):
            found.append((point, arch))
    if not found:
        out["minitron"] = {"skipped": "no point of the expert space meets the target's constraints"}
    else:
        scores = [float(score(arch)) if score is not None else None for _, arch in found]
        best = min(range(len(found)), key=lambda i: (scores[i] if scores[i] is not None else 0.0, i))
        point, arch = found[best]
        how = f"the lowest masked KL ({scores[best]:.4f})" if scores[best] is not None else "the most parameters"
        finding = f"chose {point}: {how} of the {len(found)} largest feasible expert points"
        out["minitron"] = {"point": point, "baseline_point": point, "finding": finding}
    out["best-uniform"] = {
        "skipped": "it scores every point of the expert grid; for a MoE parent the minitron seed scores the largest "
        "feasible ones"
    }
    return out


def expert_kl_scorer(
    model: Any, importance: Any, tokens: Any, *, batch_size: int = 4
) -> Callable[[Architecture], float]:
    """``score(arch)``: mean per-position KL(parent ‖ the parent masked to ``arch``'s sparse counts) on
    ``tokens`` ``(n, L)``, in nats (lower is better), the experts, channels and heads chosen by importance
    (:func:`~autocompress_opt.prune.experts.expert_masks`: the trial's ``start`` candidate). The expert
    counterpart of :func:`~autocompress_opt.prune.baselines.masked_kl_scorer`; ``model`` is unchanged
    after each call."""
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.prune.experts import expert_masks
    from autocompress_opt.prune.masking import apply_masks
    from autocompress_opt.quality.metrics import cache_teacher_logits, kl_divergence

    adapter = moe_adapter(model)
    teacher = cache_teacher_logits(model, tokens, batch_size=batch_size, progress=False)

    def score(arch: Architecture) -> float:
        moe = next(layer.moe for layer in arch.layers if layer.moe is not None)
        point = {"num_experts": moe.num_experts, "experts_per_token": moe.experts_per_token}
        point["expert_width"] = moe.expert_width
        if moe.shared_width:
            point["shared_width"] = moe.shared_width
        mamba = next((layer.mamba for layer in arch.layers if layer.mamba is not None), None)
        if mamba is not None:
            point["mamba_heads"] = mamba.num_heads
        with apply_masks(model, expert_masks(model, importance, point), adapter=adapter):
            return float(
                kl_divergence(model, None, tokens, teacher_logits=teacher, batch_size=batch_size, progress=False)
            )

    return score


def retained_expert_importance(arch: Architecture, importance: Any) -> float:
    """The proxy's quality of a MoE / hybrid point: per MoE layer, the fraction of ``expert_frequency``
    (router use) of the ``num_experts`` most used experts, times the mean fraction of ``expert_ffn``
    mass their ``expert_width`` most active channels hold, times (with a shared expert) the fraction of
    ``shared_ffn`` mass its ``shared_width`` most active channels hold; per Mamba-2 layer, the fraction
    of ``mamba_heads`` mass its kept heads hold (the most active ``H / G`` of each group); averaged over
    those layers. In [0, 1], 1.0 for the parent; the units are the ones
    :func:`~autocompress_opt.prune.experts.expert_masks` keeps (ties aside). Top-``k`` is not in it:
    the ranking's maximal points already prefer the larger."""
    fractions = []
    for i, layer in enumerate(arch.layers):
        if layer.mamba is not None and i < len(importance.mamba_heads) and importance.mamba_heads[i] is not None:
            heads = importance.mamba_heads[i].clamp_min(0).reshape(layer.mamba.groups, -1)  # (G, H/G) of the parent
            fractions.append(_kept_mass_of_groups(heads, layer.mamba.num_heads // layer.mamba.groups))
        if layer.moe is None or i >= len(importance.expert_frequency) or importance.expert_frequency[i] is None:
            continue
        freq = importance.expert_frequency[i].clamp_min(0)  # (E,)
        kept = freq.argsort(descending=True)[: layer.moe.num_experts]
        used = float(freq[kept].sum()) / float(freq.sum()) if float(freq.sum()) > 0 else 1.0
        ffn = importance.expert_ffn[i][kept].clamp_min(0)  # (n, F)
        channels = _kept_mass(ffn, layer.moe.expert_width)
        shared = importance.shared_ffn[i] if i < len(importance.shared_ffn) else None
        if layer.moe.shared_width and shared is not None:
            channels *= _kept_mass(shared.clamp_min(0)[None], layer.moe.shared_width)
        fractions.append(used * channels)
    if not fractions:
        raise ConfigError("the importance record has no expert scores for this MoE architecture")
    return sum(fractions) / len(fractions)


def _kept_mass_of_groups(heads: Any, per_group: int) -> float:
    """The fraction of ``heads`` ``(G, H/G)`` mass (non-negative) that the ``per_group`` highest of each group hold."""
    total = float(heads.sum())
    return float(heads.sort(dim=1, descending=True).values[:, :per_group].sum()) / total if total > 0 else 1.0


def _kept_mass(scores: Any, n: int) -> float:
    """Mean over the rows of ``scores`` ``(rows, units)`` (non-negative) of the fraction of each row's
    mass its ``n`` highest units hold (1.0 for a row without mass)."""
    top = scores.sort(dim=1, descending=True).values[:, :n].sum(dim=1)
    total = scores.sum(dim=1)
    return float((top / total.clamp_min(1e-30)).where(total > 0, top.new_ones(())).mean())
