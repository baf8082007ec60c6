"""Render every measured number in README.md and docs/ from the committed results JSON.

A Markdown file holds hand-written prose and rendered blocks::

    <!-- render:NAME -->
    ...what RENDERERS[NAME] returns, rewritten by this script...
    <!-- /render:NAME -->

Each renderer reads ``benchmarks/results/*.json`` only (no run, no model), so the numbers in the
docs are the numbers in the results, and a rerun of a benchmark changes the docs by one command:

    .venv/bin/python benchmarks/render.py           # rewrite the blocks in README.md and docs/**/*.md
    .venv/bin/python benchmarks/render.py --check   # exit 1 and print a diff when a file differs

A results file that is not committed renders as "not yet measured" (the demo until ``make demo``
has written ``results/demo.json``); a block naming an unknown renderer is an error naming the known ones.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- render:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /render:(?P=name) -->)", re.S)
NOT_MEASURED = "not yet measured"


def markdown_files(root: Path | None = None) -> list[Path]:
    """README.md and every Markdown file under docs/ of ``root`` (default: this repository)."""
    root = root or ROOT
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def load(name: str) -> dict[str, Any] | None:
    """``benchmarks/results/<name>.json``, or None when it is not there."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def need(name: str) -> dict[str, Any]:
    data = load(name)
    if data is None:
        raise FileNotFoundError(f"benchmarks/results/{name}.json is referenced by a rendered block but missing")
    return data


# ------------------------------------------------------------------------------ formatting
def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f} %"


def commit_of(result: dict[str, Any]) -> str:
    """The short commit a result was measured at, from whichever provenance field it carries."""
    code = result.get("code") or (result.get("provenance") or {}).get("code") or {}
    commit = code.get("commit")
    if not commit:
        return "not recorded"
    return commit[:7] + (" (dirty)" if code.get("dirty") else "")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def shape(summary: str) -> str:
    """``"name: 19/30 layers, ..."`` -> ``"19/30 layers, ..."``."""
    return summary.split(": ", 1)[-1]


# ------------------------------------------------------------------------- head-to-head
def _h2h_protocol(s: dict[str, Any], commit: bool = True) -> str:
    from _h2h_tables import split_words

    b = s["budgets"]
    seeds = len(s["seeds"]["recovery"])
    parent_ppl = (s["parent"].get("test") or s["parent"]["perplexity"]) if "quality_split" in s else None
    ppl = parent_ppl or s["parent"]["perplexity"]
    return (
        f"{s['parent']['summary'].split(':')[0]}{f', measured at {commit_of(s)}' if commit else ''}: "
        f"a {b['trials']}-trial weights-mode "
        f"study per target; every arm recovered with `autocompress distill` ({b['distill_steps']} steps × "
        f"{b['distill_batch']} rows × {b['distill_seq_len']} tokens, lr {b['distill_lr']:g}) under {seeds} "
        f"seed{'s' if seeds > 1 else ''} and scored on seven accuracy tasks ({b['items']} items each); "
        f"differences bootstrapped ({b['boot']:,} resamples). {split_words(s)}. The parent scores "
        f"{pct(s['parent']['average_accuracy'])} (perplexity {ppl['ppl_code']:.1f} code / "
        f"{ppl['ppl_prose']:.1f} prose{' on the test rows' if parent_ppl else ''})."
    )


def h2h_summary() -> str:
    """README: one row per target, the searched model against the three baselines: on the test split
    (KL after recovery, paired intervals) when the JSON has it, else as measured before the split."""
    s = need("head_to_head")
    from _h2h_tables import accuracy_ci, holm_p, kl_ci
    from bench_head_to_head import BASELINES

    new = "quality_split" in s
    rows = []
    for row in s["targets"]:
        arms, diffs = row["arms"], row["differences_points"]
        versus = " · ".join(f"{a} {accuracy_ci(diffs[a])}" for a in BASELINES if a in diffs)
        searched = arms["searched"]
        if new:
            tests = row["differences_test"]
            kl = f"{searched['kl_after']['mean']:.2f}"
            kl_versus = " · ".join(
                f"{a} {kl_ci(tests[a]['after']['kl'], holm_p(s, row, a))}" for a in BASELINES if a in tests
            )
            cells = [kl, kl_versus]
        else:
            cells = [" / ".join(f"{arms[a]['kl_before']:.2f}" if a in arms else "—" for a in ("searched", *BASELINES))]
        rows.append(
            [
                f"{row['hardware']} {row['workload']}",
                shape(searched["summary"]),
                *cells,
                pct(searched["average_accuracy"]["mean"]),
                versus,
            ]
        )
    if new:
        kl_header = [
            "test KL after recovery, searched (nats)",
            "searched − baseline, test KL after recovery (nats, 95 % CI paired over test rows and seeds; "
            "p Holm-corrected over the file's test-KL comparisons, bold: resolved after correction)",
        ]
    else:
        kl_header = ["KL before recovery on the study's selection rows: searched / minitron / depth / best-uniform"]
    header = [
        "target",
        "searched model",
        *kl_header,
        "accuracy after recovery",
        "searched − baseline, accuracy points [95 % CI]",
    ]
    return _h2h_protocol(s) + "\n\n" + table(header, rows)


def h2h_findings(name: str) -> Callable[[], str]:
    def render() -> str:
        s = need(name)
        from bench_head_to_head import BASELINES

        lines = []
        lowest = sum(
            all(row["arms"]["searched"]["kl_before"] <= row["arms"][a]["kl_before"] for a in row["arms"])
            for row in s["targets"]
        )
        n = len(s["targets"])
        where = "test KL" if "quality_split" in s else "KL on the study's selection rows"
        lines.append(f"- Lowest {where} before recovery (ties included): {lowest} of {n} targets.")
        for a in BASELINES:
            diffs = [row["differences_points"][a] for row in s["targets"] if a in row["differences_points"]]
            won = sum(d["ci95"][0] > 0 for d in diffs)
            lost = sum(d["ci95"][1] < 0 for d in diffs)
            line = (
                f"- Against {a}, in average accuracy: better on {won}, worse on {lost}, "
                f"not resolved on {len(diffs) - won - lost} of {len(diffs)} targets"
            )
            tested = [row["differences_test"] for row in s["targets"] if a in row.get("differences_test", {})]
            tests = [t[a]["after"]["kl"] for t in tested]
            if tests:
                lower, higher = sum(d["ci95"][1] < 0 for d in tests), sum(d["ci95"][0] > 0 for d in tests)
                line += (
                    f"; in test KL after recovery: lower on {lower}, higher on {higher}, "
                    f"not resolved on {len(tests) - lower - higher}"
                )
            lines.append(line + ".")
        return "\n".join(lines)

    return render


def h2h_tables(name: str) -> Callable[[], str]:
    def render() -> str:
        from bench_head_to_head import tables

        s = need(name)
        return _h2h_protocol(s, commit=False) + "\n\n" + tables(s)

    return render


# ------------------------------------------------------------------------------ ablation
def _trained_better(row: dict[str, Any]) -> int:
    return sum(
        r["candidates"]["trained"]["eval_kl"] < r["candidates"]["uniform"]["eval_kl"]
        for r in row["runs"]
        if r["candidates"]["trained"]["eval_kl"] is not None
    )


def ablation() -> str:
    s = need("ablation")
    rows = []
    for row in s["rows"]:
        m, runs = row["summary"], row["runs"]
        g = row["global_choices"]
        trained = m["trained_eval_kl"]
        greedy = row.get("greedy_from_parent", {}).get("eval_kl")
        rows.append(
            [
                f"{row['hardware']} {row['workload']} ({row['serve_as']})",
                f"{g['num_layers']} layers, hidden {g['hidden_size']}, FFN {g['ffn_width']}, "
                f"{g['num_kv_heads']} KV × {g['q_per_kv']}",
                f"{m['uniform_eval_kl']['mean']:.2f}",
                f"{m['start_eval_kl']['mean']:.2f}",
                "—" if greedy is None else f"{greedy:.2f}",
                f"{trained['mean']:.2f} ± {trained['sd']:.2f}",
                f"{m['chosen']['trained']}/{len(runs)}, {_trained_better(row)}/{len(runs)}",
            ]
        )
    header = [
        "target (engine)",
        "global choices",
        "uniform allocation",
        "greedy start point",
        "greedy from the parent",
        "trained masks (mean ± sd)",
        "trained returned / better than uniform",
    ]
    seeds = s["seeds"]["seeds"]
    return (
        f"Measured at {commit_of(s)}, inner seeds {', '.join(map(str, seeds))}, "
        f"{s['seconds'] / 60:.0f} minutes (without the greedy arm). Held-out KL to the parent, nats.\n\n"
        + table(header, rows)
    )


def ablation_history() -> str:
    """The earlier ablation runs kept beside the current one: how often the trained masks beat uniform."""
    lines = []
    for name in ("ablation_ffn256", "ablation_ffn256_h100"):
        s = need(name)
        better = sum(_trained_better(row) for row in s["rows"])
        runs = sum(len(row["runs"]) for row in s["rows"])
        targets = ", ".join(row["hardware"] for row in s["rows"])
        lines.append(
            f"- `{name}.json` ({targets}; FFN unit {s['inner'].get('ffn_unit')}, measured at {commit_of(s)}): "
            f"trained better than uniform in {better} of {runs} runs."
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------ multi-fidelity
def multifidelity(*names: str) -> Callable[[], str]:
    def render() -> str:
        out = []
        for name in names:
            s = need(name)
            summary = s["summary"]
            seeds = ", ".join(map(str, s["provenance"]["seeds"].get("sampler", [])))
            rows = []
            for target, row in summary["per_target"].items():
                one, multi = row["single-fidelity"], row["multi-fidelity"]
                rows.append(
                    [
                        target,
                        f"{one['median_best_kl']:.2f}",
                        f"{multi['median_best_kl']:.2f}",
                        f"{one['points_mean']:g} → {multi['points_mean']:g}",
                    ]
                )
            out.append(
                f"`{name}.json`: {s['budget_minutes']:g} minutes per run, seeds {seeds}, {s['parallel']} trials "
                f"at a time, measured at {commit_of(s)}; multi-fidelity better on {summary['targets_better']} of "
                f"{summary['targets']} targets with {summary['points_ratio']:g}× the points "
                f"({summary['points_total']['multi-fidelity']} against "
                f"{summary['points_total']['single-fidelity']}).\n\n"
                + table(
                    [
                        "target",
                        "best KL, single-fidelity",
                        "best KL, multi-fidelity",
                        "points evaluated (mean over seeds)",
                    ],
                    rows,
                )
            )
        return "\n\n".join(out)

    return render


# ------------------------------------------------------------------------------- calibration
def validation() -> str:
    s = need("validation_published")
    header = ["engine / regime", "rows", "in-sample", "held out", "held-out max"]
    rows = [
        [key, v["held_out"]["rows"], pct(v["in_sample"]["median_abs_error"]), pct(v["held_out"]["median_abs_error"]),
         f"{100 * v['held_out']['max_abs_error']:.0f} %"]
        for key, v in s["by_engine_and_regime"].items()
    ]  # fmt: skip
    overall = s["overall"]
    engines = ", ".join(f"{k} {pct(v['held_out']['median_abs_error'])}" for k, v in s["by_engine"].items())
    return (
        f"{overall['held_out']['rows']} published measurements; median error held out one publication at a time "
        f"{pct(overall['held_out']['median_abs_error'])} (in-sample {pct(overall['in_sample']['median_abs_error'])}); "
        f"per engine, held out: {engines}. Every row above its roofline floor: "
        f"{'yes' if s['all_bounds_ok'] else 'NO'}.\n\n" + table(header, rows)
    )


def engine_calibration() -> str:
    header = [
        "engine on this CPU",
        "models (held out)",
        "held-out median error",
        "by measurement",
        "before calibration",
        "time",
    ]
    rows = []
    for engine in ("llamacpp", "vllm"):
        s = need(f"engine_calibration_{engine}")
        by = ", ".join(
            f"{k.removesuffix('_tok_s').replace('_', ' ')} {pct(v)}"
            for k, v in s["heldout_mdape"].items()
            if k != "all"
        )
        fmt = s["settings"].get("gguf_type") if engine == "llamacpp" else s["settings"].get("vllm_dtype")
        seconds = s.get("refit_of", {}).get("seconds", s["seconds"])  # a refit's timing run, not the refit
        rows.append(
            [
                f"{engine} ({fmt}), measured at {commit_of(s['provenance'])}",
                f"{s['settings']['n_models']} ({s['heldout_models']})",
                f"**{pct(s['heldout_mdape']['all'])}**",
                by,
                pct(s["before_mdape"]["all"]),
                f"{seconds:,.0f} s",
            ]
        )
    return table(header, rows)


def cpu_calibration() -> str:
    s = need("calibration_cpu")
    return (
        f"torch-eager on this CPU ({len(s['rows'])} architectures): held-out median error prefill "
        f"{pct(s['heldout_mdape']['prefill'])}, decode {pct(s['heldout_mdape']['decode'])}; {s['seconds']:.0f} s."
    )


# ------------------------------------------------------------------------------- performance
def performance() -> str:
    cost = need("costmodel_throughput")
    study = need("study_overhead")
    cluster = need("cluster_two_nodes")
    cli = need("cli_help")
    large = study["large_120b"]
    overhead = study["overhead_per_trial_s"]
    best = large.get("best_feasible") or {}
    rows = [
        [
            "vectorised cost model, 30-layer heterogeneous architectures",
            f"{cost['min_archs_per_s']:,} architectures/s (slowest engine; target {cost['target_archs_per_s']:,})",
            "`benchmarks/bench_costmodel.py`",
        ],
        [
            f"Ray Tune + Optuna overhead per plan-mode trial, concurrency {overhead['concurrency']}",
            f"{overhead['median']:.2f} s/trial median (target {overhead['target_s']})",
            "`benchmarks/bench_study.py`",
        ],
        [
            f"120B on one B200 at 128K, {large['trials']} plan-mode trials, Ray start included",
            f"{large['seconds_including_ray_start']:.0f} s (target {large['target_s']} s); "
            f"{large['feasible']} feasible"
            + (f"; best {shape(best['summary'])}, {best['peak_memory_gib']} GiB" if best.get("summary") else ""),
            "`benchmarks/bench_study.py`",
        ],
        [
            "two-node Ray cluster on one machine, worker node killed mid-study",
            f"{cluster['complete']}/{cluster['trials_requested']} COMPLETE, {cluster['distinct_points']} distinct "
            f"points, {cluster['running_left']} left RUNNING, trials on {len(cluster['nodes_that_ran_trials'])} nodes",
            "`benchmarks/cluster_two_nodes.py`",
        ],
        [
            "`autocompress --help`",
            f"{cli['median_s']['--help']:.2f} s median of {cli['runs']} (target {cli['target_s']} s)",
            "`benchmarks/bench_cli_help.py`",
        ],
    ]
    return table(["what", "result", "reproduce"], rows)


def discretise() -> str:
    """The inner search's discretisation at three parent depths, the code before and after in one run."""
    s = need("discretise")
    rows = [
        [
            d["depth"],
            f"{d['old_s']:.2f} s ({d['old_runs']} run{'s' if d['old_runs'] > 1 else ''})",
            f"{d['new_s']:.2f} s (median of {d['new_runs']})",
            f"{d['ratio']:.1f}×",
            "yes" if d["identical"] else "**no**",
            f"{d['moves']['repair']} / {d['moves']['fill']}",
        ]
        for d in s["depths"]
    ]
    out = (
        f"{s['case']}; {s['machine']['cpus']} CPU cores; target ≤ {s['target_s_at_126']:g} s at 126 layers.\n\n"
        + table(["layers", "before", "after", "speed-up", "same architecture", "repair / fill moves"], rows)
    )
    after = s.get("after")
    if not after:
        return out + _discretise_repair(s.get("repair"))
    later = [
        [
            d["depth"],
            f"{d['old_s']:.2f} s / {d['old_cpu_s']:.2f} s",
            f"{d['new_s']:.2f} s / {d['new_cpu_s']:.2f} s (median of {d['new_runs']})",
            f"{d['ratio']:.1f}× / {d['old_cpu_s'] / d['new_cpu_s']:.1f}×",
            "yes" if d["identical"] else "**no**",
        ]
        for d in after["depths"]
    ]
    load = ", ".join(f"{x:.1f}" for x in after["load_average_1min"])
    heads = ["layers", "before (wall / CPU)", "after (wall / CPU)", "speed-up (wall / CPU)", "same architecture"]
    return (
        out
        + "\n\n"
        + after.get("change", "Then fill rebuilt only the moved layer's candidates and evaluated the goal twice")
        + f"; the code before and after in one run on {after['date'][:10]}, wall-clock / CPU seconds"
        + f" (1-minute load average during the run: {load}; on a machine that loaded the wall-clock"
        + " seconds are not comparable with the table above, the ratios within the run are).\n\n"
        + table(heads, later)
        + _discretise_repair(s.get("repair"))
    )


def _discretise_repair(repair: dict[str, Any] | None) -> str:
    """The repair-heavy case's table (``repair`` in the results), or nothing before it was run."""
    if not repair:
        return ""
    rows = [
        [
            d["depth"],
            f"{d['old_s']:.2f} s / {d['old_cpu_s']:.2f} s ({d['old_runs']} run{'s' if d['old_runs'] > 1 else ''})",
            f"{d['new_s']:.2f} s / {d['new_cpu_s']:.2f} s (median of {d['new_runs']})",
            f"{d['ratio']:.1f}× / {d['old_cpu_s'] / d['new_cpu_s']:.1f}×",
            "yes" if d["identical"] else "**no**",
            f"{d['moves']['repair']} / {d['moves']['fill']}",
        ]
        for d in repair["depths"]
    ]
    load = ", ".join(f"{x:.1f}" for x in repair["load_average_1min"])
    heads = ["layers", "before (wall / CPU)", "after (wall / CPU)", "speed-up (wall / CPU)", "same architecture"]
    return (
        f"\n\nRepair-heavy: {repair['case']}. {repair['change']}; the code before and after in one run on"
        f" {repair['date'][:10]} (1-minute load average during the run: {load}).\n\n"
        + table([*heads, "repair / fill moves"], rows)
    )


def _unlined(function: str) -> str:
    """``"path.py:112(name)"`` -> ``"path.py(name)"``: the same function in another version of its file."""
    return re.sub(r":\d+\(", "(", function)


def trial_profile() -> str:
    """One weights trial on SmolLM2-135M, cold and warm, before and after: CPU seconds per phase and the
    functions with the most own CPU time."""
    s = need("trial_profile")
    runs = [(label, kind) for label in ("before", "after") if label in s for kind in ("cold", "warm")]
    phases: list[str] = []
    for label, kind in runs:
        phases += [p for p in s[label][kind]["phase_cpu_s"] if p not in phases and p != "before first report"]

    def cpu(label: str, kind: str, phase: str) -> str:
        value = s[label][kind]["phase_cpu_s"].get(phase)
        return "–" if value is None else f"{value:.1f}"

    rows = [[phase, *(cpu(label, kind, phase) for label, kind in runs)] for phase in phases]
    rows.append(["**total CPU**", *(f"**{s[label][kind]['cpu_s']:.1f}**" for label, kind in runs)])
    rows.append(["wall-clock", *(f"{s[label][kind]['wall_s']:.1f}" for label, kind in runs)])
    header = ["phase (CPU s)", *(f"{label} {kind}" for label, kind in runs)]
    notes = []
    for label in ("before", "after"):
        if label in s:
            r = s[label]
            load = f"{r['load_average_start'][0]:.1f} → {r['load_average_end'][0]:.1f}"
            notes.append(
                f"{label}: commit {commit_of({'code': {'commit': r['commit'], 'dirty': r['dirty']}})}, "
                f"{r['date'][:10]}, 1-minute load average {load}; {shape(r['cold']['outcome']['architecture'])}, "
                f"KL {r['cold']['outcome']['kl_to_parent']:.3f}"
            )
    point = ", ".join(f"{k} {v}" for k, v in s[runs[-1][0]]["point"].items())
    out = (
        f"{s[runs[-1][0]]['model']} at {point} for {s[runs[-1][0]]['target']}; torch 1 thread, "
        "cProfile on, CPU seconds (`time.process_time`) per phase as the trial reports them.\n\n"
        + table(header, rows)
        + "\n\n"
        + "\n".join(f"- {n}" for n in notes)
    )
    unprofiled = s.get("after", {}).get("load_parent_unprofiled")
    if unprofiled:
        out += (
            f"\n- after, the parent's load alone without cProfile: {unprofiled['cpu_s']:.1f} CPU s "
            f"({unprofiled['wall_s']:.1f} s wall-clock)"
        )
    if "before" not in s or "after" not in s:
        return out
    for kind in ("cold", "warm"):
        before = {_unlined(r["function"]): r for r in s["before"][kind]["top_tottime"]}
        tops = [
            [
                f"`{r['function']}`",
                r["calls"],
                f"{before[_unlined(r['function'])]['tottime_s']:.1f}" if _unlined(r["function"]) in before else "–",
                f"{r['tottime_s']:.1f}",
                f"{r['cumtime_s']:.1f}",
            ]
            for r in s["after"][kind]["top_tottime"][:8]
        ]
        out += (
            f"\n\nThe {kind} trial's functions with the most own CPU time (the top 25 by own and by cumulative "
            "time, before and after, are in `benchmarks/results/trial_profile.json`):\n\n"
            + table(["function", "calls (after)", "own CPU s before", "own CPU s after", "cumulative after"], tops)
        )
    return out


# ------------------------------------------------------------------------------ trial phases
def trial_phases() -> str:
    """The demo's trials on its four targets, before and after: CPU seconds per trial, at each ASHA
    rung, and the medians (benchmarks/bench_trial_phases.py)."""
    s = need("trial_phases")
    labels = [label for label in ("before", "after") if label in s]
    rungs = s[labels[-1]]["rungs"]
    header = ["target", "point (L/h/ffn/kv/q)"]
    for label in labels:
        header += [f"{label}: CPU s", *(f"{label}: to step {r}" for r in rungs), f"{label}: chosen, KL"]
    rows = []
    first = s[labels[-1]]["targets"]
    for target, runs in first.items():
        for i, run in enumerate(runs):
            p = run["point"]
            row = [
                target,
                "/".join(str(p[k]) for k in ("num_layers", "hidden_size", "ffn_width", "num_kv_heads", "q_per_kv")),
            ]
            for label in labels:
                other = s[label]["targets"].get(target, [])
                r = other[i] if i < len(other) else None
                if r is None:
                    row += ["–"] * (2 + len(rungs))
                    continue
                row += [f"{r['cpu_s']:.1f}", *(f"{r['to_rung_cpu_s'].get(str(k), '–')}" for k in rungs)]
                row.append(f"{r['outcome']['chosen']}, {r['outcome']['kl_to_parent']:.3f}")
            rows.append(row)
    notes = []
    for label in labels:
        r = s[label]
        m = r["summary"]
        to = ", ".join(f"step {k} {v} s" for k, v in m["median_to_rung_cpu_s"].items())
        load = f"{r['load_average_start'][0]:.1f} → {r['load_average_end'][0]:.1f}"
        notes.append(
            f"{label}: commit {commit_of({'code': {'commit': r['commit'], 'dirty': r['dirty']}})}, {r['date'][:10]}, "
            f"1-minute load average {load}; median warm trial **{m['median_warm_trial_cpu_s']} CPU s** "
            f"over {m['warm_trials']} warm trials (to {to})"
        )
    if len(labels) == 2:
        a, b = (s[label]["summary"]["median_warm_trial_cpu_s"] for label in labels)
        notes.append(
            f"median warm trial, after ÷ before: **{b / a:.2f}×** the CPU seconds (one machine, one session; "
            "below 1 is cheaper)"
        )
    return (
        "Each target's first trial builds the parent context (load, importance, teacher: the cold rows); "
        "the others are warm, as a study worker's trials are. CPU seconds (`time.process_time`, torch 1 "
        "thread), no profiler.\n\n" + table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    )


# ------------------------------------------------------------------------------------- demo
def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} s"


def demo_line() -> str:
    """README: the last recorded `make demo`, or that there is none."""
    s = load("demo")
    if s is None:
        return f"`make demo`: {NOT_MEASURED} (no `benchmarks/results/demo.json` is committed)."
    m, t = s["machine"], s["timings_s"]
    study = f", of which the study {_minutes(t['study_run'])}" if "study_run" in t else ""
    first = f", first trial complete after {_minutes(s['first_trial_s'])}" if s.get("first_trial_s") else ""
    where = "from a clean clone " if s.get("clean_clone") else ""
    return (
        f"Last recorded `make demo`: {_minutes(t['total'])} {where}on {m['cores']} cores "
        f"({m['cpu_model']}){study}{first}; code {s['code_version']}; "
        "details in [docs/results/demo.md](docs/results/demo.md)."
    )


def demo() -> str:
    s = load("demo")
    if s is None:
        return (
            f"**{NOT_MEASURED}**: no `benchmarks/results/demo.json` is committed. `make demo` writes it; "
            "`python benchmarks/render.py` then fills this page."
        )
    m, t = s["machine"], s["timings_s"]
    lines = [
        f"Recorded {s['date']} at code {s['code_version']} on {m['cores']} cores ({m['cpu_model']}), "
        f"{m['memory_gib']} GiB: `{s['command']}`.",
        "",
        table(["phase", "time"], [[phase, _minutes(sec)] for phase, sec in t.items()]),
        "",
    ]
    if s.get("first_trial_s") is not None:
        lines += [f"First trial complete {_minutes(s['first_trial_s'])} after `study run` started.", ""]
    timed = any(target.get("prepared_s") is not None for target in s["targets"])
    rows = []
    for target in s["targets"]:
        best = target["best"] or {}
        trials = ", ".join(f"{n} {state}" for state, n in target["trials"].items()) or "none: not prepared in time"
        rows.append(
            [
                f"{target['hardware']} {target['workload']}",
                f"{trials} ({target['stopped_early']} stopped early, {target['proxy_infeasible']} kept from running "
                f"by the proxy); {target['feasible']} feasible",
                f"trial {best['trial']}: {shape(best['architecture'])}" if best else "none feasible",
                f"{best['quality']:.3f}" if best.get("quality") is not None else "—",
                f"{best['kl_to_parent']:.2f}" if best.get("kl_to_parent") is not None else "—",
                _spread(best.get("spread")),
            ]
            + ([_seconds(target.get("prepared_s")), _seconds(target.get("first_trial_s"))] if timed else [])
        )
    header = ["target", "trials", "best feasible", "quality", "held-out KL", "per-layer spread"]
    lines.append(table(header + (["prepared at", "first trial at"] if timed else []), rows))
    return "\n".join(lines)


def _spread(spread: dict[str, Any] | None) -> str:
    """A best point's per-layer spread (demo_result.width_spread): ``uniform`` or the FFN range."""
    if not spread:
        return "—"
    kept = f"{spread['attention_layers']} attention / {spread['ffn_layers']} FFN of {spread['layers']} layers"
    if (
        spread["ffn_distinct"] <= 1
        and spread["heads_distinct"] <= 1
        and spread["attention_layers"] == spread["ffn_layers"]
    ):
        return f"uniform ({kept})"
    return f"FFN {spread['ffn_min']}..{spread['ffn_max']} ({spread['ffn_distinct']} widths), {kept}"


def _hybrid_point(q: dict[str, Any]) -> list[str]:
    return [
        f"trial {q['trial']}",
        f"{q['params'] / 1e9:.1f}B ({q['active_params'] / 1e9:.1f}B active)",
        f"{q['layers']}",
        f"{q['hidden_size']}",
        f"{q['experts']}, top-{q['experts_per_token']}, width {q['expert_width']}",
        f"{q['mamba_heads']}",
        f"{q['quality']:.3f}",
        f"{q['peak_memory_gib']:.1f}",
        f"{q['tpot_ms']:.2f}",
    ]


def hybrid_plan() -> str:
    """README / docs: the Nemotron 3 Super plan study (benchmarks/bench_hybrid_plan.py)."""
    s = load("nemotron3_super_plan")
    if s is None:
        return f"Nemotron 3 Super plan study: {NOT_MEASURED} (run `python benchmarks/bench_hybrid_plan.py`)."
    m, t = s["machine"], s["timings_s"]
    parent = s["parent"]
    picked = [("best feasible", s["best"]), (f"best at <= {s['limit_params'] / 1e9:.0f}B", s["best_under_limit"])]
    rows = [[label, *_hybrid_point(q)] for label, q in picked if q]
    header = ["", "trial", "params", "layers", "hidden", "experts", "Mamba heads", "quality", "memory GiB", "TPOT ms"]
    return "\n".join(
        [
            f"Parent {parent['params'] / 1e9:.1f}B ({parent['active_params'] / 1e9:.1f}B active). "
            f"{s['trials']} trials, {s['feasible']} feasible, study {t['study_run']:.0f} s on {m['cores']} cores "
            f"({m['cpu_model']}), code {s['code_version']} (`{s['command']}`); quality is the retained-parameter "
            "stand-in (plan mode has no weights).",
            "",
            table(header, rows),
        ]
    )


def arms(name: str) -> Callable[[], str]:
    """The renderer ``name`` of benchmarks/_render_arms.py (imported when a page renders it)."""
    return lambda: getattr(__import__("_render_arms"), name)()


RENDERERS: dict[str, Callable[[], str]] = {
    "hybrid-plan": hybrid_plan,
    "h2h-summary": h2h_summary,
    "h2h-smollm2": h2h_tables("head_to_head"),
    "h2h-smollm2-findings": h2h_findings("head_to_head"),
    "h2h-gemma3": h2h_tables("head_to_head_gemma3-270m"),
    "h2h-gemma3-findings": h2h_findings("head_to_head_gemma3-270m"),
    "ablation": ablation,
    "ablation-history": ablation_history,
    "inner-arms": arms("inner_arms"),
    "inner-arms-verdict": arms("inner_arms_verdict"),
    **__import__("_render_sweep").RENDERERS,  # sweep, sweep-seeds, sweep-verdict, sweep-timing (_render_sweep.py)
    "multifidelity-8min": multifidelity("multifidelity"),
    "multifidelity-15min": multifidelity("multifidelity_15min", "multifidelity_15min_seed1"),
    "validation": validation,
    **__import__("_render_validation").RENDERERS,  # validation-moe, -publications, -dequant, moe-llamacpp
    **__import__("_render_moe").RENDERERS,  # moe-build, moe-axes
    **__import__("_render_estimate").RENDERERS,  # quality-estimate, nemotron-estimate, proxy-quality
    "engine-calibration": engine_calibration,
    "cpu-calibration": cpu_calibration,
    "performance": performance,
    "discretise": discretise,
    "trial-profile": trial_profile,
    "trial-phases": trial_phases,
    **__import__("_render_trials").RENDERERS,  # hidden-slice (_render_trials.py)
    "demo": demo,
    "demo-line": demo_line,
}


# ------------------------------------------------------------------------------------ driver
def render_text(text: str, where: str = "<text>") -> str:
    """``text`` with every rendered block rewritten; a ValueError names an unknown block."""

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise ValueError(f"{where}: unknown rendered block {name!r}; known: {', '.join(sorted(RENDERERS))}")
        return match[1] + RENDERERS[name]().rstrip("\n") + "\n" + match[4]

    return BLOCK.sub(replace, text)


def differences(root: Path | None = None) -> dict[Path, tuple[str, str]]:
    """``{file: (committed, rendered)}`` for each Markdown file of ``root`` whose rendering differs."""
    out = {}
    for path in markdown_files(root):
        text = path.read_text()
        rendered = render_text(text, str(path.relative_to(root or ROOT)))
        if rendered != text:
            out[path] = (text, rendered)
    return out


def main(argv: Sequence[str] | None = None, root: Path | None = None) -> int:
    """The command line; ``root``: the repository whose Markdown is rendered (default: this one)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 and print a diff where a file differs")
    args = p.parse_args(argv)
    root = root or ROOT
    changed = differences(root)
    for path, (old, new) in changed.items():
        name = str(path.relative_to(root))
        if args.check:
            sys.stdout.writelines(
                difflib.unified_diff(old.splitlines(True), new.splitlines(True), name, name + " (rendered)")
            )
        else:
            path.write_text(new)
            print(f"rendered {name}")
    if args.check and changed:
        print(f"{len(changed)} file(s) differ from their rendering: run `python benchmarks/render.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
