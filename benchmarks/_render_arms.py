"""Rendered blocks of docs/results/inner-arms.md, from ``benchmarks/results/inner_arms.json``.

Kept apart from ``render.py`` (which registers them) so that file stays under the house's 800 lines.
The numbers come from the JSON only: each cell's test KL per arm before recovery, its paired
difference to the best uniform model with the Holm-corrected p-value of the file's one family, and
the recovered arms' test KL per seed with their difference to best-uniform after recovery.
"""

from __future__ import annotations

from typing import Any

from render import commit_of, load, table

NAME = "inner_arms"
ARMS = ("best-uniform", "uniform", "importance", "block-library", "trained", "trained-from-library")
ARM_WORDS = {
    "best-uniform": "best uniform model at the budget's cost",
    "uniform": "uniform allocation of the budget's global choices",
    "importance": "importance start (today's default start, untrained)",
    "block-library": "block-library solver (untrained)",
    "trained": "today's differentiable search, from the importance start",
    "trained-from-library": "differentiable search from the solver's answer",
}
# The cells bench_inner_arms.py runs by default: two targets × a light and an aggressive budget.
PLANNED = tuple(
    f"{target}/{budget}" for target in ("h100-sxm:datacenter", "rtx5070:in-game") for budget in ("light", "aggressive")
)


def _diff(d: dict[str, Any] | None, p_holm: float | None) -> str:
    if not d:
        return "—"
    low, high = d["ci95"]
    text = f"{d['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"
    if p_holm is not None:
        text += f", p_holm {p_holm:.2g}"
    resolved = (high < 0 or low > 0) and (p_holm is None or p_holm < 0.05)
    return f"**{text}**" if resolved else text


def ffn_spread(arm: dict[str, Any]) -> str:
    """How far one arm's per-layer FFN widths spread: ``min..max`` over kept FFNs, and how many layers
    keep attention / an FFN (a uniform model reads ``768, 18/18``)."""
    layers = arm.get("layers") or []
    widths = [layer["ffn"] for layer in layers if layer.get("ffn")]
    kept = f"{len(widths)}/{len(layers)}"
    if not widths:
        return f"none, {kept}"
    low, high = min(widths), max(widths)
    return f"{low}, {kept}" if low == high else f"{low}..{high}, {kept}"


def _recovered_kl(cell: dict[str, Any], arm: str) -> str:
    runs = (cell.get("recovered") or {}).get(arm) or {}
    values = [run["test"]["kl_to_parent"] for _, run in sorted(runs.items()) if "test" in run]
    return " / ".join(f"{v:.3f}" for v in values) if values else "—"


def _p_holm(data: dict[str, Any], key: str) -> float | None:
    entry = ((data.get("corrected") or {}).get("comparisons") or {}).get(key)
    return entry["p_holm"] if entry else None


def cell_table(data: dict[str, Any], key: str) -> str:
    cell = data["cells"][key]
    before = cell.get("vs_best_uniform_kl") or {}
    after = cell.get("vs_best_uniform_kl_recovered") or {}
    rows = []
    recovered = cell.get("recovered") or {}
    for arm in ARMS:
        entry = cell["arms"].get(arm)
        if not entry or not entry.get("available"):
            continue
        reference = arm == "best-uniform"
        rows.append(
            [
                f"{arm}",
                entry["summary"].split(": ", 1)[-1],
                ffn_spread(entry),
                f"{entry['test']['kl_to_parent']:.3f}",
                "(reference)" if reference else _diff(before.get(arm), _p_holm(data, f"{key}/{arm} vs best-uniform")),
                _recovered_kl(cell, arm),
                "(reference)"
                if reference and arm in recovered
                else _diff(after.get(arm), _p_holm(data, f"{key}/{arm} vs best-uniform, after recovery")),
            ]
        )
    header = [
        "arm",
        "architecture",
        "FFN widths (min..max, layers with an FFN)",
        "test KL before recovery",
        "− best-uniform, before [95 % CI]",
        "test KL after recovery (per seed)",
        "− best-uniform, after [95 % CI]",
    ]
    p = cell["params"]
    head = (
        f"**{cell['target']}, {cell['budget']} budget** ({cell['engine']}): the budget's global choices "
        f"{p['num_layers']} layers, hidden {p['hidden_size']}, FFN {p['ffn_width']}, "
        f"{p['num_kv_heads']} KV × {p['q_per_kv']}. Best uniform: {cell.get('best_uniform_finding', '—')}."
    )
    return head + "\n\n" + table(header, rows)


def inner_arms() -> str:
    data = load(NAME)
    if data is None:
        return "not yet measured (`benchmarks/results/inner_arms.json` is not committed)"
    s, r, rows = data["settings"], data["recovery"], data["test_rows"]
    corrected = data.get("corrected") or {}
    intro = (
        f"Measured at {commit_of(data)} ({data['date'][:10]}, {data['machine']['cpus']} CPU cores) on "
        f"{data['model']}: test split, {rows['rows_per_domain']} code + {rows['rows_per_domain']} prose rows × "
        f"{rows['seq_len']} tokens, inner seed {s['seed']}; recovery {r['steps']} distillation steps × "
        f"{r['batch_size']} rows, lr {r['lr']:g}, seeds {', '.join(str(x) for x in r['seeds'])}, for best-uniform and "
        f"the {r['top']} searched arms with the lowest test KL. Differences are paired over test rows (and "
        f"resampled over recovery seeds), {s['n_boot']:,} bootstrap resamples; p_holm is Holm-corrected over all "
        f"{corrected.get('family', 0)} comparisons of the file; bold = resolved after correction."
    )
    parts = [intro]
    for key in PLANNED:
        if key in data["cells"]:
            parts.append(cell_table(data, key))
        else:
            target, budget = key.split("/")
            parts.append(f"**{target}, {budget} budget**: not yet measured.")
    return "\n\n".join(parts)


def inner_arms_verdict() -> str:
    """One sentence per measured cell, from the file: the best searched arm against the best uniform
    model before and after equal recovery, resolved after Holm's correction or not."""
    data = load(NAME)
    if data is None:
        return "The inner search's arms are not yet measured (`benchmarks/results/inner_arms.json`)."
    lines = []
    for key in PLANNED:
        cell = data["cells"].get(key)
        if cell is None:
            continue
        before = cell.get("vs_best_uniform_kl") or {}
        after = cell.get("vs_best_uniform_kl_recovered") or {}
        where = f"{cell['target']} ({cell['budget']} budget)"
        if not before:
            lines.append(f"- {where}: no searched arm to compare.")
            continue
        arm = min(before, key=lambda a: before[a]["mean"])
        p = _p_holm(data, f"{key}/{arm} vs best-uniform")
        size = _sizer(cell)
        text = (
            f"- {where}: {arm} ({size(arm)} parameters; the best uniform model {size('best-uniform')}) "
            f"{_words(before[arm], p)} than the best uniform model before recovery"
        )
        if after:
            recovered = [
                f"{a} ({size(a)}) {_words(after[a], _p_holm(data, f'{key}/{a} vs best-uniform, after recovery'))}"
                for a in sorted(after, key=lambda a: after[a]["mean"])
            ]
            text += "; after equal recovery " + ", and ".join(recovered)
        else:
            text += "; not yet recovered"
        lines.append(text + ".")
    return "\n".join(lines) if lines else "No cell of `benchmarks/results/inner_arms.json` is measured yet."


def _sizer(cell: dict[str, Any]) -> Any:
    """An arm's parameter count in millions, ``99.1M``."""
    return lambda arm: f"{cell['arms'][arm]['params'] / 1e6:.1f}M"


def _words(diff: dict[str, Any], p_holm: float | None) -> str:
    """``is 0.347 nats closer to the parent (resolved after Holm, p 0.01)`` or ``is not resolved ...``."""
    mean, (low, high) = diff["mean"], diff["ci95"]
    resolved = (high < 0 or low > 0) and (p_holm is None or p_holm < 0.05)
    side = "closer to" if mean < 0 else "further from"
    p = f", p_holm {p_holm:.2g}" if p_holm is not None else ""
    if resolved:
        return f"is {abs(mean):.3f} nats {side} the parent (resolved after correction{p})"
    return f"differs by {mean:+.3f} nats [{low:+.3f}, {high:+.3f}]: not resolved{p}"
