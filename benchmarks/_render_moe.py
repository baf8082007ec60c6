"""Rendered block of docs/results/moe.md: the real-weights MoE against its dense parent, from
``benchmarks/results/moe_build.json`` (``benchmarks/build_moe.py``).

Kept apart from ``render.py`` (which registers :data:`RENDERERS` in one line) so that file stays under
the house's 800 lines; its helpers (``load``, ``pct``, ``table``, ``commit_of``) are imported when a
block renders, not at the top (``render.py`` imports this module while it is still being built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _render() -> Any:
    import render

    return render


def moe_build() -> str:
    """Dense parent, the MoE as split and (when run) recovered: perplexity, KL to the dense model, sizes."""
    r = _render()
    data = r.load("moe_build")
    if data is None:
        return "not yet measured (run `python benchmarks/build_moe.py --distill-steps 200`)"
    a = data["args"]
    names = [("dense", "dense parent")] + [
        (k, label) for k, label in (("split", "MoE as split"), ("recovered", "MoE after recovery")) if k in data
    ]
    header = ["model", "params", "active per token", "test perplexity", "KL to dense (nats/token)"]
    sizes = {k: (data[k]["num_params"], data[k].get("active_params", data[k]["num_params"])) for k, _ in names}
    rows = [
        [label, f"{sizes[k][0] / 1e6:.1f}M", f"{sizes[k][1] / 1e6:.1f}M", f"{data[k]['perplexity']:.1f}",
         f"{data[k]['kl_to_dense']:.3f}"]
        for k, label in names
    ]  # fmt: skip
    recovery = data.get("recovery")
    # train_s is 0 when the run resumed a finished recovery from the cache (its time is the first run's)
    how = (
        f"recovered by {recovery['recipe']['steps']} distillation steps × {recovery['recipe']['batch_size']} rows "
        f"of {recovery['recipe']['seq_len']} tokens from the dense model (lr {recovery['recipe']['lr']:g})"
        if recovery
        else "not recovered"
    )
    served = data.get("llamacpp") or {}
    agreement = [
        f"{label}: {100 * served[k]['serve_check']['top1_agreement']:.1f} %"
        for k, label in (("split", "as split"), ("recovered", "after recovery"))
        if "serve_check" in served.get(k, {})
    ]
    checked = (
        f"\n\nServed by llama.cpp (f16 GGUF, Mixtral), its next token agrees with transformers' on "
        f"{', '.join(agreement)} of {served[next(iter(served))]['serve_check']['positions']} positions."
        if agreement
        else ""
    )
    return (
        f"{a['model']} split into {a['experts']} experts per layer, top-{a['top_k']}, on {a['calib_rows']} "
        f"calibration rows; {how}. Measured on {a['test_rows']} test-split rows × {a['seq_len']} tokens (half "
        f"code, half prose) at {r.commit_of(data)}.\n\n" + r.table(header, rows) + checked
    )


def moe_axes() -> str:
    """Each MoE axis cut on the recovered MoE: KL to the MoE, sizes, and the paired comparisons."""
    r = _render()
    data = r.load("moe_axes")
    if data is None:
        return "not yet measured (run `python benchmarks/bench_moe_axes.py`)"
    header = ["child (experts × top-k, width)", "params", "active per token", "KL to the MoE (nats/token)"]
    rows = [
        [name, f"{c['params'] / 1e6:.1f}M", f"{c['active_params'] / 1e6:.1f}M", f"**{c['kl_to_moe']:.3f}**"]
        for name, c in sorted(data["children"].items(), key=lambda kv: kv[1]["kl_to_moe"])
    ]
    pairs = ["a", "b", "KL(a) − KL(b), 95 % interval"]
    lines = [[p["a"], p["b"], f"{p['diff']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}]"] for p in data["pairs"]]
    return (
        f"Before recovery, on {data['test_rows']} test-split rows × {data['seq_len']} tokens, intervals paired "
        f"over rows (bootstrap) at {r.commit_of(data)}.\n\n" + r.table(header, rows) + "\n\n" + r.table(pairs, lines)
    )


def moe_h2h() -> str:
    """The MoE head-to-head (``bench_moe_h2h.py``): per target, each arm's sizes, test KL before and after
    recovery, and searched minus each other arm with Holm's verdict."""
    from _h2h_tables import kl_ci

    r = _render()
    data = r.load("moe_h2h")
    if data is None:
        return "not yet measured (run `python benchmarks/bench_moe_h2h.py` once the MoE is built)"
    st = data["settings"]
    holm = data["holm"]["comparisons"]
    parts = [
        f"Parent: the recovered real-weights MoE; each target keeps {100 * st['keep']:.0f} % of the parent's "
        f"cost on its primary metric; {st['trials']} weights-mode trials (study seed {st['study_seed']}); "
        f"{st['test_rows']} code + {st['test_rows']} prose test rows × {st['seq_len']} tokens; recovery "
        f"{st['recovery']['steps']} distillation steps × {st['recovery']['batch']} rows from the MoE parent, seeds "
        f"{', '.join(map(str, st['recovery']['seeds']))}. KL is to the MoE parent, nats per token; differences "
        f"are searched − the other arm (negative: searched closer), paired over rows; Holm over "
        f"{data['holm']['family']} comparisons. Measured at {r.commit_of(data)}."
    ]
    for key, cell in data["cells"].items():
        header = ["arm", "model", "active / total params", "test KL before", "after recovery"]
        rows = []
        for arm in ("searched", "uniform", "experts-only", "depth"):
            a = cell["arms"].get(arm)
            if a is None:
                continue
            if "unavailable" in a:
                rows.append([arm, f"unavailable: {a['unavailable']}", "", "", ""])
                continue
            runs = [x["test"]["kl_to_parent"] for x in a.get("recovered", {}).values()]
            after = f"{sum(runs) / len(runs):.3f}" if runs else "–"
            same = " (the searched model)" if a.get("same_model_as_searched") else ""
            sizes = f"{a['active_params'] / 1e6:.1f}M / {a['params'] / 1e6:.1f}M"
            rows.append(
                [arm + same, a["summary"].split(": ", 1)[-1], sizes,
                 f"{a['test']['kl_to_parent']:.3f}", after]
            )  # fmt: skip
        diffs = ["searched − arm", "before recovery", "after recovery", "verdict (after, Holm)"]
        lines = []
        for arm, d in (cell.get("difference") or {}).items():
            verdict = holm.get(f"{key}: searched vs {arm}, after recovery", {}).get("verdict", "")
            lines.append([arm, kl_ci(d["before"]), kl_ci(d["after"]), verdict])
        limits = ", ".join(f"{k} {v}" for k, v in cell["constraints"].items())
        t = cell["study"]["trials"]
        study = (
            f"{t.get('complete', 0)} complete + {t.get('pruned', 0)} stopped early of {t.get('asked', 0)}, "
            f"{t.get('proxy_infeasible', 0)} screened by the proxy, {t.get('fail', 0)} failed"
        )
        parts.append(f"**{key}** ({limits}; study: {study})\n\n" + r.table(header, rows))
        if lines:
            parts.append(r.table(diffs, lines))
    return "\n\n".join(parts)


RENDERERS: dict[str, Callable[[], str]] = {"moe-build": moe_build, "moe-axes": moe_axes, "moe-h2h": moe_h2h}
