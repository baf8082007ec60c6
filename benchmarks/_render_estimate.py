"""Rendered blocks of docs/results/moe.md on plan mode's per-axis quality estimate: its fit and checks
(``benchmarks/results/quality_estimate.json``, ``benchmarks/bench_quality_estimate.py``) and the
Nemotron 3 Super plan study ranked by it beside the parameter stand-in
(``nemotron3_super_plan_estimate.json`` / ``nemotron3_super_plan.json``, ``bench_hybrid_plan.py``).

Kept apart from ``render.py`` (which registers :data:`RENDERERS` in one line) so that file stays under
the house's 800 lines; its helpers are imported when a block renders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# What NVIDIA's Puzzle models cut from Nemotron 3 Super (issue 43 / 44, from their model cards and
# configs): every layer and every expert kept, each MoE layer its own expert width and top-k.
PUZZLE = {
    "layers": "88/88",
    "hidden": "—",
    "experts": "512 (all)",
    "experts_per_token": "4-18, per layer",
    "expert_width": "1280-2688, per layer",
    "params": "about 75B",
}


def _render() -> Any:
    import render

    return render


def _rho(d: dict[str, Any]) -> str:
    return f"{d['rho']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}] (n = {d['n']})"


def _diff(d: dict[str, Any]) -> str:
    return f"{d['diff']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"


def proxy_quality() -> str:
    """The weights study's proxy points ranked by importance and by the estimate, scored."""
    r = _render()
    data = r.load("proxy_quality")
    if data is None:
        return "not yet measured (run `python benchmarks/bench_proxy_quality.py`)"
    rows = []
    for c in data["cells"]:
        for quality in ("importance", "estimate"):
            kls = ", ".join(f"{p['kl']:.2f}" for p in c[quality]["points"])
            rows.append([c["cell"].rsplit("/", 1)[0], quality, kls, f"{c['best_uniform']['kl']:.2f}"])
    return (
        f"The {data['k']} points each ranking makes the study enqueue, as uniform models, KL to the parent on the "
        f"choice rows (lower is better), at {r.commit_of(data)}.\n\n"
        + r.table(["sweep cell", "proxy ranked by", "its points' KL, in its order", "best-uniform's KL"], rows)
    )


def quality_estimate() -> str:
    """The fitted coefficients, the held-out rank agreement against the parameter stand-in, the MoE
    leave-one-out check and the published sensitivities ranked by the estimate."""
    r = _render()
    data = r.load("quality_estimate")
    if data is None:
        return "not yet measured (run `python benchmarks/bench_quality_estimate.py`)"
    coefficients = data["estimate"]["coefficients"]
    borrowed = data["estimate"].get("borrowed") or {}
    axes = [
        [axis, f"{c['a']:.3f}", f"{c['p']:g}", f"{c['a'] * 0.25 ** c['p']:.3f}"] for axis, c in coefficients.items()
    ]
    axes += [[axis, f"as {src}", "", ""] for axis, src in borrowed.items()]
    held = data["fit_half"]["spearman_held_out"]
    diff = held["estimate_minus_params_kept"]
    moe = data["moe"]
    single = sum(1 for m in data["measured"] if m["kind"] == "single")
    mixed = len(data["measured"]) - single
    checks = [
        ["estimate (fitted on the rest)", "dense children held out", _rho(held["estimate"])],
        ["fraction of parameters kept (plan mode's default)", "the same", _rho(held["params_kept"])],
        ["importance kept (the weights study's proxy)", "the same", _rho(held["importance_kept"])],
        ["estimate − parameters", "the same, paired", _diff(diff)],
        ["estimate − importance", "the same, paired", _diff(held["estimate_minus_importance_kept"])],
        ["estimate, leave one out", "MoE children", _rho(moe["estimate_leave_one_out"])],
        ["active parameters per token", "the same", _rho(moe["active_params"])],
    ]
    pub = data["published"]
    published = [
        [c["what"], f"{c['mmlu']:.3f}", f"{c['drop']:.3f}", f"{c['estimate_kl']:.3f}"]
        for c in sorted(pub["cuts"], key=lambda c: c["drop"])
    ]
    return (
        f"Fitted at {r.commit_of(data)} on {single} single-axis and {mixed} random mixed uniform children of "
        f"{data['model']} (KL to the parent on the selection split's choice rows, as the seeded baselines score "
        f"their candidates) and the {len(moe['rows'])} children of the real-weights MoE (KL to the MoE). "
        "`KL ≈ Σ a · cut^p`, the cut a fraction of the parent's amount; the last column is one axis cut by a "
        "quarter.\n\n"
        + r.table(["axis", "a", "p", "KL at a 25 % cut"], axes)
        + "\n\nRank agreement with measured KL (Spearman, 95 % bootstrap interval), on children the fit did "
        "not see: the fit for these rows used the single-axis children and every other mixed one, and is "
        "judged on the rest.\n\n"
        + r.table(["ranked by", "rows", "Spearman with measured KL"], checks)
        + f"\n\nPublished, {pub['source']} (parent {pub['base']:.3f}), ranked by the estimate "
        f"(Spearman of the drop with the estimate: {pub['spearman_drop_vs_estimate']:+.2f}, n = "
        f"{len(pub['cuts'])}):\n\n" + r.table(["cut", "MMLU", "drop", "estimated KL"], published)
    )


def _span(values: list[int], per_layer: str = ", per layer") -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}{per_layer}"


def _structure(best: dict[str, Any] | None) -> list[str]:
    if not best:
        return ["—"] * 6
    layers = best.get("moe_layers") or [[0, best["expert_width"], best["experts_per_token"]]]
    return [
        f"{best['layers']}/88",
        f"{best['hidden_size']}",
        f"{best['experts']}",
        _span([k for _, _, k in layers]),
        _span([w for _, w, _ in layers]),
        f"{best['params'] / 1e9:.1f}B ({best['active_params'] / 1e9:.1f}B active)",
    ]


def nemotron_estimate() -> str:
    """The Nemotron 3 Super plan study's best point under the parameter stand-in and under the
    estimate, beside what NVIDIA's Puzzle model keeps."""
    r = _render()
    by_params, by_estimate = r.load("nemotron3_super_plan"), r.load("nemotron3_super_plan_estimate")
    if by_estimate is None:
        return (
            "not yet measured (run `python benchmarks/bench_hybrid_plan.py --config "
            "studies/nemotron3-super-b200-estimate.yaml --out benchmarks/results/nemotron3_super_plan_estimate.json`)"
        )
    by_layer = r.load("nemotron3_super_plan_per_layer")
    rows = [
        ["plan study, ranked by parameters kept", *_structure((by_params or {}).get("best_under_limit"))],
        ["plan study, ranked by the estimate", *_structure(by_estimate.get("best_under_limit"))],
        ["plan study, estimate, per layer", *_structure((by_layer or {}).get("best_under_limit"))],
        ["NVIDIA Puzzle-75B (published)", *PUZZLE.values()],
    ]
    header = ["", "layers", "hidden", "experts", "experts per token", "expert width", "parameters"]
    text = (
        f"One B200, BF16, 128K context (`studies/nemotron3-super-b200*.yaml`), {by_estimate['trials']} plan-mode "
        f"trials each; the best feasible point at or below {by_estimate['limit_params'] / 1e9:.0f}B parameters, "
        f"at {by_estimate.get('code_version', 'not recorded')} "
        f"({by_estimate['timings_s'].get('study_run', 0):.0f} s). The first two studies give "
        "every layer of a kind the same size, so each of their rows is one structure for all 40 MoE layers."
    )
    best = (by_layer or {}).get("best_under_limit")
    if best and best.get("uniform_quality") is not None:
        text += (
            f" The per-layer study (`--plan-quality estimate-per-layer`, at {by_layer.get('code_version')}, "
            f"{by_layer['timings_s'].get('study_run', 0):.0f} s) gives each MoE layer its own expert width and "
            f"experts per token: at its best point exp(−KL̂) is {best['quality']:.3f}, against "
            f"{best['uniform_quality']:.3f} for the same point with every layer alike, at no more total or "
            "active parameters."
        )
    return text + "\n\n" + r.table(header, rows)


def _interval(d: dict[str, Any]) -> str:
    low, high = d["ci95"]
    return f"{d['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def layer_profile() -> str:
    """Per-layer FFN widths allotted by the estimate's layer profile against uniform and the inverted
    profile, on real weights and the test split (``bench_layer_profile.py``), one table per model."""
    r = _render()
    parts = []
    stems = {
        "layer_profile": "",
        "layer_profile_gemma3-270m": "",
        "layer_profile_one_exponent": "the first rule, before the per-layer exponents: one exponent (1.5) for "
        "every layer and the half-width values alone; ",
    }
    for stem, note in stems.items():
        data = r.load(stem)
        if data is None:
            continue
        rows = []
        for c in data["cells"]:
            arms = c["arms"]
            d = c["kl_differences"]
            rows.append(
                [
                    f"{c['ffn_kept']:.0%}",
                    f"{arms['uniform']['kl_to_parent']:.3f}",
                    f"{arms['profile']['kl_to_parent']:.3f}",
                    f"{arms['inverse']['kl_to_parent']:.3f}",
                    _interval(d["profile - uniform"]),
                    _interval(d["inverse - uniform"]),
                ]
            )
        sample = "the profile's own model" if data["in_sample"] else "a model the profile was not measured on"
        parts.append(
            f"**{data['model']}** ({note}{sample}; {data['parent']['layers']} layers, "
            f"FFN {data['parent']['ffn_width']}; "
            f"{data['test_rows']['rows_per_domain']} test rows per domain, at {r.commit_of(data)}, "
            f"{data['seconds'] / 60:.0f} min):\n\n"
            + r.table(
                [
                    "FFN kept",
                    "uniform KL",
                    "profile KL",
                    "inverted KL",
                    "profile − uniform [95 %]",
                    "inverted − uniform [95 %]",
                ],
                rows,
            )
        )
    if not parts:
        return "not yet measured (run `python benchmarks/bench_layer_profile.py`)"
    return "\n\n".join(parts)


RENDERERS: dict[str, Callable[[], str]] = {
    "layer-profile": layer_profile,
    "quality-estimate": quality_estimate,
    "nemotron-estimate": nemotron_estimate,
    "proxy-quality": proxy_quality,
}
