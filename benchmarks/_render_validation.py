"""Rendered blocks of the cost model's MoE/hybrid validation, from ``benchmarks/results/validation_published.json``.

Kept apart from ``render.py`` (which registers :data:`RENDERERS` in one line) so that file stays under
the house's 800 lines. ``validation-moe``: the MoE/hybrid rows' held-out error per model family;
``validation-publications``: one line per publication (its rows' median and max |error| held out),
and the median of the publications' medians, dense and MoE/hybrid apart, so one long sweep weighs as
much as a one-row table.

``render.py`` imports this module while its own module is still being built, so its helpers
(``need``, ``pct``, ``table``) are imported when a block renders, not at the top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _render() -> Any:
    import render

    return render


def validation_moe() -> str:
    """The MoE/hybrid rows' held-out error per model family (``moe_hybrid`` in the results)."""
    r = _render()
    s = r.need("validation_published")["moe_hybrid"]
    held = s["overall"]["held_out"]
    header = ["model family", "rows", "held-out median", "held-out max", "predicted faster than measured"]
    rows = [
        [family, v["held_out"]["rows"], f"**{r.pct(v['held_out']['median_abs_error'])}**",
         f"{100 * v['held_out']['max_abs_error']:.0f} %", f"{v['held_out']['optimistic_rows']}/{v['held_out']['rows']}"]
        for family, v in s["by_family"].items()
    ]  # fmt: skip
    return (
        f"{held['rows']} published mixture-of-experts and hybrid measurements, predicted by the engine "
        f"profiles fitted to the dense rows plus one count per engine, `routed_passes` (how many times a "
        f"routed (token, expert) pair's activations cross memory), fitted to the other publications' "
        f"MoE/hybrid rows: median error held out one publication at a time "
        f"**{r.pct(held['median_abs_error'])}** (max {r.pct(held['max_abs_error'], 0)}); "
        f"{held['optimistic_rows']} of {held['rows']} rows predict less time than was measured.\n\n"
        + r.table(header, rows)
    )


def validation_publications() -> str:
    """One row per publication, held out, and the median of the publications' medians."""
    r = _render()
    data = r.need("validation_published")
    pubs = data.get("per_publication")
    if not pubs:
        return "not yet measured (run `python benchmarks/bench_validation.py`)"
    mm = data["median_of_publication_medians"]
    header = ["rows of", "publication", "rows", "held-out median", "held-out max"]
    rows = [
        ["MoE/hybrid" if p["moe"] else "dense", p["source"], p["rows"], f"**{r.pct(p['median'])}**",
         f"{100 * p['worst']:.0f} %"]
        for p in sorted(pubs, key=lambda p: (not p["moe"], p["source"]))
    ]  # fmt: skip
    kinds = [(k, label) for k, label in (("moe_hybrid", "MoE/hybrid"), ("dense", "dense")) if mm.get(k) is not None]
    verdict = "; ".join(
        f"{label}: median of {sum(1 for p in pubs if p['moe'] == (k == 'moe_hybrid'))} publication medians "
        f"**{r.pct(mm[k])}**"
        for k, label in kinds
    )
    return f"Held out one publication at a time, one figure per publication. {verdict}.\n\n" + r.table(header, rows)


def validation_dequant() -> str:
    """The MoE/hybrid publications' held-out medians at other dequantisation costs per element
    (``dequant_sensitivity`` in the results): what another choice of the kernel constant gives."""
    r = _render()
    sens = r.need("validation_published").get("dequant_sensitivity")
    if not sens:
        return "not yet measured (run `python benchmarks/bench_validation.py` without `--no-sensitivity`)"
    runs = sens["rows"]
    sources = list(runs[0]["moe_publications"])
    base = {s: s.split(":")[0].split(",")[0] for s in sources}
    # Two tables of one site: name the table too.
    short = {
        s: b + ", " + s.split(",", 1)[1].split("(")[0].strip()[:40] if list(base.values()).count(b) > 1 else b
        for s, b in base.items()
    }
    header = [
        "operations per element",
        "MoE/hybrid median of publication medians",
        "MoE/hybrid row median",
        "dense median of publication medians",
        *(short[s] for s in sources),
    ]
    tag = lambda run: " (shipped)" if run["shipped"] else " (off)" if run["ops_per_element"] == 0 else ""
    rows = [
        [f"{run['ops_per_element']:g}" + tag(run),
         f"**{r.pct(run['moe_median_of_publication_medians'])}**", r.pct(run["moe_row_median"]),
         r.pct(run["dense_median_of_publication_medians"]),
         *(r.pct(run["moe_publications"][s]) for s in sources)]
        for run in runs
    ]  # fmt: skip
    return (
        f"Held out one publication at a time, with the dequantisation of weight-only routed experts "
        f"costed at each number of CUDA-core operations per weight element (M-tile of "
        f"{sens['tile_tokens']:g} tokens); 0 is the model without the term.\n\n" + r.table(header, rows)
    )


def moe_llamacpp() -> str:
    """The real-weights MoE and its children timed in llama.cpp here, against the CPU profile."""
    r = _render()
    data = r.load("moe_llamacpp")
    if data is None:
        return "not yet measured (run `python benchmarks/bench_moe_llamacpp.py`)"
    passes, s = data["routed_passes"], data["summary"]
    labels = {
        "none": "0: the dense terms alone",
        "gpu_pooled": f"GPU engines' pooled value ({passes['gpu_pooled']:g})",
        "fitted": f"fitted to these MoE timings, in-sample ({passes['fitted']:.2f}; shipped in cpu-llamacpp.yaml)",
        "held_out": "fitted to the other MoE models, each held out",
    }
    header = ["routed_passes", "MoE median error", "prefill", "decode"]
    rows = [
        [labels[k], f"**{r.pct(v['moe_mdape'])}**", r.pct(v["moe_prefill_mdape"]), r.pct(v["moe_decode_mdape"])]
        for k, v in s.items()
    ]
    dense = data["dense_control"]["errors"]
    models = data["models"]
    # moe-EXPERTSxTOPK-wWIDTH; the dense parent's errors are the shipped profile's (no MoE term)
    per = ["model", "active params", "measured pp / tg (tok/s)", "error held out (pp, tg)"]
    lines = [
        [name, f"{m['active_params'] / 1e6:.1f}M", f"{m['measured']['pp']:.0f} / {m['measured']['tg']:.1f}",
         ", ".join(f"{100 * e:+.0f} %" for e in m["error"].get("held_out", m["error"]["none"]))]
        for name, m in models.items()
    ]  # fmt: skip
    return (
        f"{len(models) - 1} MoE models (the real-weights MoE and its pruned children) timed with llama-bench "
        f"(f16, {data['settings']['threads']} threads) on this CPU; the dense parent, the control, is "
        f"predicted {100 * dense[0]:+.0f} % (prefill) and {100 * dense[1]:+.0f} % (decode) by the same "
        f"profile.\n\n" + r.table(header, rows) + "\n\n" + r.table(per, lines)
    )


RENDERERS: dict[str, Callable[[], str]] = {
    "validation-moe": validation_moe,
    "validation-publications": validation_publications,
    "moe-llamacpp": moe_llamacpp,
    "validation-dequant": validation_dequant,
}
