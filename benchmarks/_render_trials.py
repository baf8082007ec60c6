"""Rendered block of the hidden-slice check (issue 41), from ``benchmarks/results/hidden_slice.json``.

Kept apart from ``render.py`` (which registers :data:`RENDERERS` in one line) so that file stays under
the house's 800 lines. ``hidden-slice``: each (point, study seed) trial with the masks trained on the
parent under a hidden-channel mask and on the parent cut to the hidden size, side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def hidden_slice() -> str:
    """One row per (point, seed): the chosen candidate and held-out KL of the masked and the cut
    parent's trial, the difference and each trial's CPU seconds; the counts and mean difference."""
    import render as r

    data: dict[str, Any] = r.need("hidden_slice")
    by = {(str(row["point"]), row["seed"], row["sliced"]): row for row in data["rows"]}
    header = ["point (L/h/ffn/kv/q)", "seed", "masked parent: chosen, KL", "cut parent: chosen, KL",
              "cut − masked (nats)", "CPU s masked / cut"]  # fmt: skip
    rows, diffs = [], []
    for (point, seed, sliced), cut in by.items():
        if not sliced:
            continue
        masked = by[(point, seed, False)]
        p = cut["point"]
        diff = cut["kl_to_parent"] - masked["kl_to_parent"]
        diffs.append(diff)
        rows.append([
            "/".join(str(p[k]) for k in ("num_layers", "hidden_size", "ffn_width", "num_kv_heads", "q_per_kv")),
            seed, f"{masked['chosen']}, {masked['kl_to_parent']:.3f}", f"{cut['chosen']}, {cut['kl_to_parent']:.3f}",
            f"{diff:+.3f}", f"{masked['cpu_s']:.1f} / {cut['cpu_s']:.1f}",
        ])  # fmt: skip
    same = sum(1 for d in diffs if abs(d) < 0.01)
    return (
        f"{data['target']}, the demo's settings (bfloat16), {len(diffs)} trials each way: the same choice "
        f"within 0.01 nats in {same}; mean cut − masked {sum(diffs) / len(diffs):+.3f} nats. Each trial's "
        f"first run in the process pays for the parent's context.\n\n" + r.table(header, rows)
    )


RENDERERS: dict[str, Callable[[], str]] = {"hidden-slice": hidden_slice}
