"""Trade-off plots of studies (matplotlib, PNG and SVG).

* :func:`plot_pareto` — quality against each cost metric (TTFT, TPOT, throughput, memory), one
  colour per hardware target; feasible trials as dots with the 2-D Pareto staircase drawn through
  them, infeasible trials apart as grey crosses; the parent's cost marked per target. The quality
  axis is labelled by what the trials' quality measures (their ``quality_kind``: retained params,
  retained importance or exp(-KL to parent); :func:`~autocompress_opt.search.study.studyio.quality_label_of`).
  Weights-mode trials (every quality an ``exp(-KL)``) are drawn as the held-out KL itself, in nats on
  a log axis, lower is better: on exp(-KL) every pruned model sits at 0.00-0.05 against the parent's
  1.0 and the fronts flatten at the bottom; on the KL axis they spread over decades. The parent
  (KL 0) is then marked by a dotted line at its cost.
* :func:`plot_structure` — per-layer structure of a chosen architecture beside its parent: which
  layers are kept, each layer's FFN width and query/KV heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_sparse
from autocompress_opt.search.study.studyio import quality_label_of

__all__ = ["plot_pareto", "plot_structure"]

PANELS: tuple[tuple[str, str, bool], ...] = (
    ("ttft_ms", "time to first token (ms, log)", False),
    ("tpot_ms", "time per output token (ms, log)", False),
    ("output_throughput_tok_s", "output throughput (tok/s, log)", True),
    ("peak_memory_gib", "peak memory (GiB, log)", False),
)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [Path(f"{stem}.png"), Path(f"{stem}.svg")]  # not with_suffix: names hold dots ("demo.b200")
    for path in paths:
        fig.savefig(path, dpi=120)
    _plt().close(fig)
    return paths


def _staircase(points: list[tuple[float, float]], higher_better: bool) -> list[tuple[float, float]]:
    """2-D Pareto set of (cost, quality) with quality maximised, sorted by cost."""
    ordered = sorted(points, key=lambda p: (-p[0], -p[1]) if higher_better else (p[0], -p[1]))
    front, best = [], float("-inf")
    for cost, quality in ordered:
        if quality > best:
            front.append((cost, quality))
            best = quality
    return front


def plot_pareto(studies: Sequence[dict[str, Any]], stem: Path, title: str = "") -> list[Path]:
    """``studies``: dicts with ``label``, ``records`` (TrialRecords) and ``parent`` (parent metrics).

    The y axis is named after the trials' quality kind(s), e.g. "exp(-KL to parent)"; the parent
    sits at 1.0 on every kind. When every completed trial's kind is ``exp_neg_kl`` the axis is the
    held-out KL instead (log scale, lower is better) and the parent is a dotted line at its cost."""
    plt = _plt()
    quality = quality_label_of(r for study in studies for r in study["records"])
    kinds = {r.quality_kind for study in studies for r in study["records"] if r.state == "COMPLETE"}
    kl_axis = kinds == {"exp_neg_kl"}
    # the front is found on quality (higher is better) either way; only the drawn value changes
    y = (lambda q: max(-math.log(q), 1e-6)) if kl_axis else (lambda q: q)
    drawn = lambda pts: [(c, y(q)) for c, q in pts]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.4 * len(PANELS), 4.2))
    colours = plt.get_cmap("tab10")
    for ax, (metric, label, higher_better) in zip(axes, PANELS):
        shown_infeasible = False
        for k, study in enumerate(studies):
            done = [r for r in study["records"] if r.state == "COMPLETE" and metric in r.metrics]
            feasible = [(r.metrics[metric], r.quality) for r in done if r.feasible]
            infeasible = [(r.metrics[metric], r.quality) for r in done if not r.feasible]
            colour = colours(k % 10)
            if infeasible:
                ax.scatter(
                    *zip(*drawn(infeasible)),
                    marker="x",
                    s=14,
                    color="0.65",
                    linewidths=0.8,
                    label=None if shown_infeasible else "infeasible (violates a constraint)",
                )
                shown_infeasible = True
            if feasible:
                ax.scatter(*zip(*drawn(feasible)), s=16, color=colour, alpha=0.55)
                front = _staircase(feasible, higher_better)
                ax.plot(
                    *zip(*drawn(front)),
                    drawstyle="steps-post" if not higher_better else "steps-pre",
                    color=colour,
                    linewidth=1.6,
                    label=f"{study['label']} ({len(feasible)} feasible)",
                )
            if study.get("parent") and metric in study["parent"] and kl_axis:
                ax.axvline(study["parent"][metric], color=colour, linestyle=":", linewidth=1.0)
            elif study.get("parent") and metric in study["parent"]:
                ax.scatter(
                    [study["parent"][metric]],
                    [1.0],
                    marker="*",
                    s=90,
                    color=colour,
                    edgecolor="black",
                    linewidths=0.5,
                    zorder=5,
                )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # minor labels collide on short log spans
        ax.set_xlabel(label + ("  → better" if higher_better else "  ← better"))
        if kl_axis:
            ax.set_yscale("log")
            ax.set_ylabel("held-out KL to parent (nats, log)  ↓ better")
        else:
            ax.set_ylabel(f"{quality} (higher is better)")
        ax.grid(True, which="both", alpha=0.25)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if kl_axis:
        handles.append(plt.Line2D([], [], color="0.4", linestyle=":", linewidth=1.0))
        labels.append("parent model's cost (KL 0)")
    else:
        handles.append(
            plt.Line2D([], [], marker="*", color="w", markerfacecolor="0.5", markeredgecolor="black", markersize=11)
        )
        labels.append(f"parent model: {quality} = 1.0")
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8, frameon=False)
    shown = "held-out KL to parent" if kl_axis else quality
    fig.suptitle(title or f"Pareto fronts: {shown} vs serving cost per hardware target", fontsize=11)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    return _save(fig, stem)


def plot_structure(arch: Architecture, parent: Architecture, stem: Path, title: str = "") -> list[Path]:
    """Per-layer FFN width and heads of ``arch`` (filled) over the parent's (outline); for a MoE /
    hybrid parent, :func:`_plot_sparse_structure`."""
    if is_sparse(parent):
        return _plot_sparse_structure(arch, parent, stem, title)
    plt = _plt()
    n = parent.num_layers
    idx = list(range(n))
    fig, (ax_ffn, ax_heads) = plt.subplots(2, 1, figsize=(max(8, 0.3 * n + 3), 5.6), sharex=True)
    parent_ffn = [l.ffn_width if l.ffn else 0 for l in parent.layers]
    child_ffn = [l.ffn_width if l.ffn else 0 for l in arch.layers] + [0] * (n - arch.num_layers)
    ax_ffn.bar(idx, parent_ffn, color="none", edgecolor="0.4", linewidth=0.8, label="parent")
    ax_ffn.bar(idx, child_ffn, color="tab:blue", alpha=0.8, label="pruned")
    dropped = [i for i, l in enumerate(arch.layers) if l.is_noop]
    if dropped:
        ax_ffn.scatter(dropped, [0] * len(dropped), marker="x", color="tab:red", zorder=5, label="layer dropped")
    ax_ffn.set_ylabel("FFN width")
    ax_ffn.legend(fontsize=8, loc="upper right")
    width = 0.4
    ax_heads.bar(
        [i - width / 2 for i in idx],
        [l.num_heads if l.attention else 0 for l in parent.layers],
        width,
        color="none",
        edgecolor="0.4",
        linewidth=0.8,
        label="parent query heads",
    )
    ax_heads.bar(
        [i - width / 2 for i in idx],
        [l.num_heads if l.attention else 0 for l in arch.layers],
        width,
        color="tab:orange",
        alpha=0.8,
        label="pruned query heads",
    )
    ax_heads.bar(
        [i + width / 2 for i in idx],
        [l.num_kv_heads if l.attention else 0 for l in arch.layers],
        width,
        color="tab:green",
        alpha=0.8,
        label="pruned KV heads",
    )
    ax_heads.set_ylabel("heads")
    ax_heads.set_xlabel("layer")
    ax_heads.legend(fontsize=8, loc="upper right")
    ax_heads.set_xticks(idx[:: max(1, n // 30)])
    fig.suptitle(title or f"{arch.summary()}\nvs parent {parent.summary()}", fontsize=10)
    fig.tight_layout()
    return _save(fig, stem)


def _plot_sparse_structure(arch: Architecture, parent: Architecture, stem: Path, title: str = "") -> list[Path]:
    """Per layer of a MoE / hybrid model, one panel per size, the child (filled) over the parent
    (outline): routed experts kept, expert width and experts per token (each MoE layer's own, as the
    Puzzle form keeps them), Mamba-2 heads, attention query heads; a red x marks a dropped layer."""
    plt = _plt()
    n = parent.num_layers
    idx = list(range(n))
    layers = list(arch.layers) + [None] * (n - arch.num_layers)
    panels: list[tuple[str, Any, str]] = [
        ("routed experts", lambda l: l.moe.num_experts if l is not None and l.moe is not None else 0, "tab:purple"),
        ("expert width", lambda l: l.moe.expert_width if l is not None and l.moe is not None else 0, "tab:pink"),
        (
            "experts / token",
            lambda l: l.moe.experts_per_token if l is not None and l.moe is not None else 0,
            "tab:brown",
        ),
        ("Mamba-2 heads", lambda l: l.mamba.num_heads if l is not None and l.mamba is not None else 0, "tab:cyan"),
        ("query heads", lambda l: l.num_heads if l is not None and l.attention else 0, "tab:orange"),
    ]
    panels = [p for p in panels if any(p[1](l) for l in parent.layers)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 0.14 * n + 3), 1.9 * len(panels) + 1), sharex=True)
    axes = axes if len(panels) > 1 else [axes]
    dropped = [i for i, l in enumerate(layers) if l is None or l.is_noop]
    for ax, (label, size, colour) in zip(axes, panels, strict=True):
        ax.bar(idx, [size(l) for l in parent.layers], color="none", edgecolor="0.4", linewidth=0.6, label="parent")
        ax.bar(idx, [size(l) for l in layers], color=colour, alpha=0.85, label="pruned")
        if dropped:
            ax.scatter(dropped, [0] * len(dropped), marker="x", color="tab:red", zorder=5, s=12, label="layer dropped")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("layer")
    axes[-1].set_xticks(idx[:: max(1, n // 30)])
    fig.suptitle(title or f"{arch.summary()}\nvs parent {parent.summary()}", fontsize=9)
    fig.tight_layout()
    return _save(fig, stem)
