"""Rendered blocks of docs/results/sweep.md and the sweep's plot, from ``benchmarks/results/sweep.json``.

Kept apart from ``render.py`` (which registers :data:`RENDERERS` in one line) so that file stays under
the house's 800 lines. The numbers come from the JSON only (``bench_sweep.py`` writes it): per cell
(target, budget, study seed) the searched model against the best uniform model on the test split
before and after equal recovery, with the Holm-corrected p-values of the file's one family; per
(target, budget) the study seeds pooled, and the spread across study seeds beside the spread across
recovery seeds.

``render.py`` imports this module while its own module is still being built, so the helpers of
``render`` (``load``, ``table``, ``commit_of``) are imported when a block renders, not at the top.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

NAME = "sweep"
BEFORE = "sweep_without_runners_up"  # the first cells: studies seeded with the three baselines only
BUDGET_ORDER = ("light", "middle", "aggressive")
MISSING = "not yet measured (`benchmarks/results/sweep.json` is not committed)"


def _render() -> Any:
    import render

    return render


def _comparison(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    return ((data.get("corrected") or {}).get("comparisons") or {}).get(name)


def cell_comparison(data: dict[str, Any], key: str, when: str) -> dict[str, Any] | None:
    """The corrected comparison of cell ``key`` ``before`` or ``after`` recovery (None: not in the family)."""
    return _comparison(data, f"{key}: searched vs best-uniform, {when} recovery")


def pooled_comparison(data: dict[str, Any], group: str) -> dict[str, Any] | None:
    """The corrected comparison of a (target, budget) with its study seeds pooled."""
    g = (data.get("pooled") or {}).get(group)
    if not g:
        return None
    return _comparison(data, f"{group}: searched vs best-uniform, after recovery, {len(g['cells'])} study seeds pooled")


def _ordered(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The cells by target (as first met), budget (light to aggressive), study seed."""
    cells = data.get("cells") or {}
    targets = list(dict.fromkeys(c["target"] for c in cells.values()))
    rank = lambda c: (targets.index(c["target"]), BUDGET_ORDER.index(c["budget"]), c["study_seed"])
    return sorted(cells.items(), key=lambda kv: rank(kv[1]))


def _interval(d: dict[str, Any] | None, comparison: dict[str, Any] | None, digits: int = 3, unit: str = "") -> str:
    """``-0.067 [-0.091, -0.041]`` (``+1.2 pts [-0.8, +3.1]`` with ``digits`` 1 and ``unit`` " pts"),
    bold when the interval excludes 0 and Holm keeps it (``comparison``)."""
    if not d:
        return "—"
    low, high = d["ci95"]
    text = f"{d['mean']:+.{digits}f}{unit} [{low:+.{digits}f}, {high:+.{digits}f}]"
    resolved = comparison is not None and comparison["p_holm"] < 0.05 and (high < 0 or low > 0)
    return f"**{text}**" if resolved else text


def _margin(arm: dict[str, Any] | None) -> str:
    """The tightest constraint's slack in % of its limit at the cost model's median (``†``: inside the
    model's interval, i.e. missed at its pessimistic end)."""
    if not arm:
        return "—"
    median = arm["margins"]["median"]
    text = f"{100 * min(median.values()):+.1f} %"
    return text + " †" if arm["margins"].get("inside_interval") else text


def _model(arm: dict[str, Any] | None) -> str:
    if not arm:
        return "—"
    shape = arm["summary"].split(": ", 1)[-1]
    return shape + ("" if arm.get("uniform") else " (per-layer)")


def _budget(cell: dict[str, Any]) -> str:
    return f"{cell['budget']} ({100 * cell['keep']:.0f} %)"


def _trials(cell: dict[str, Any]) -> str:
    """``3 + 9 stopped early of 12, 4 screened by the proxy, 1 failed``: complete trials, those ASHA
    stopped, those asked for, the points the proxy kept from running (cells written before the count
    was kept apart include them in the stopped-early count)."""
    t = (cell.get("study") or {}).get("trials") or {}
    text = f"{t.get('complete', 0)} + {t.get('pruned', 0)} stopped early of {t.get('asked', '?')}"
    text += f", {t['proxy_infeasible']} screened by the proxy" if t.get("proxy_infeasible") else ""
    return text + (f", {t['fail']} failed" if t.get("fail") else "")


def _verdict(cell: dict[str, Any], comparison: dict[str, Any] | None) -> str:
    if "unavailable" in cell:
        return cell["unavailable"]
    if cell.get("same_model"):
        return "same model"
    return comparison["verdict"] if comparison else "—"


def intro(data: dict[str, Any]) -> str:
    r = _render()
    s, rows = data["settings"], data.get("test_rows") or {}
    rec = s["recovery"]
    corrected = data.get("corrected") or {}
    return (
        f"Measured at {r.commit_of(data.get('provenance') or data)} (last cell {data['date'][:10]}, "
        f"{data['machine']['cpus']} CPU cores) on {s['model']}: {s['trials']} trials per study; test split, "
        f"{rows.get('rows_per_domain', s['test_rows'])} code + {rows.get('rows_per_domain', s['test_rows'])} prose "
        f"rows × {s['seq_len']} tokens; recovery {rec['steps']} distillation steps × {rec['batch_size']} rows, "
        f"lr {rec['lr']:g}, seeds {', '.join(str(x) for x in rec['seeds'])}, both arms. Differences are searched − "
        f"best-uniform test KL in nats (negative: the searched model is closer to the parent), paired over test "
        f"rows and resampled over recovery seeds, {s['n_boot']:,} bootstrap resamples; p_holm is Holm-corrected "
        f"over all {corrected.get('family', 0)} comparisons of the file; bold = resolved after correction. "
        "Margin: the tightest constraint's slack by the cost model (†: inside its 90 % interval)."
    )


def sweep() -> str:
    """The cell table: one row per (target, budget, study seed)."""
    return cell_table(NAME)


def sweep_without_runners_up() -> str:
    """The cells run before studies seeded best-uniform's runners-up (:data:`BEFORE`), as measured."""
    return cell_table(BEFORE)


def cell_table(name: str) -> str:
    """The cell table of results file ``name``: one row per (target, budget, study seed)."""
    r = _render()
    data = r.load(name)
    if data is None:
        return MISSING.replace(NAME, name)
    rows = []
    for key, c in _ordered(data):
        arms = c.get("arms") or {}
        after = cell_comparison(data, key, "after")
        diff = c.get("difference") or {}
        rows.append(
            [
                c["target"],
                _budget(c),
                c["study_seed"],
                _trials(c),
                _model(arms.get("searched")),
                _model(arms.get("best-uniform")),
                f"{_margin(arms.get('searched'))} / {_margin(arms.get('best-uniform'))}",
                _interval(diff.get("before"), cell_comparison(data, key, "before")),
                _interval(diff.get("after"), after),
                f"{after['p_holm']:.2g}" if after else "—",
                _verdict(c, after),
            ]
        )
    header = [
        "target",
        "budget (cost kept)",
        "study seed",
        "trials (complete + stopped early)",
        "searched",
        "best uniform",
        "margin searched / uniform",
        "− best-uniform, before recovery",
        "− best-uniform, after recovery",
        "p_holm (after)",
        "verdict (after)",
    ]
    return intro(data) + "\n\n" + r.table(header, rows)


def sweep_seeds() -> str:
    """Per (target, budget): the study seeds pooled, and the spread across study seeds beside the
    spread across recovery seeds."""
    r = _render()
    data = r.load(NAME)
    if data is None:
        return MISSING
    rows = []
    for group, g in sorted((data.get("pooled") or {}).items(), key=lambda kv: _group_rank(data, kv[0])):
        comparison = pooled_comparison(data, group)
        rows.append(
            [
                group.replace("/", ", "),
                len(g["cells"]),
                ", ".join(f"{d:+.3f}" for d in g["by_study_seed"]),
                f"{g['sd_across_study_seeds']:.3f}",
                "—" if g["sd_across_recovery_seeds"] is None else f"{g['sd_across_recovery_seeds']:.3f}",
                _interval(g["after"], comparison),
                f"{comparison['p_holm']:.2g}" if comparison else "—",
                comparison["verdict"] if comparison else "—",
            ]
        )
    if not rows:
        return "No (target, budget) has two finished study seeds yet."
    header = [
        "target, budget",
        "study seeds",
        "− best-uniform after recovery, per study seed",
        "SD across study seeds",
        "SD across recovery seeds",
        "pooled [95 % CI]",
        "p_holm",
        "verdict",
    ]
    return r.table(header, rows)


def _group_rank(data: dict[str, Any], group: str) -> tuple[int, int]:
    target, budget = group.split("/")
    targets = list(dict.fromkeys(c["target"] for c in (data.get("cells") or {}).values()))
    return (targets.index(target) if target in targets else len(targets), BUDGET_ORDER.index(budget))


def verdicts(data: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Per (target, budget) in words: its verdict after recovery and what it rests on (the pooled
    study seeds where two or more finished, else the one cell)."""
    out: dict[str, tuple[str, str]] = {}
    for key, c in _ordered(data):
        group = f"{c['target']}/{c['budget']}"
        if group in out:
            continue
        pooled = pooled_comparison(data, group)
        if pooled is not None:
            cells = data["pooled"][group]["cells"]
            keys = {data["cells"][k]["arms"]["searched"].get("model_key") for k in cells if k in data["cells"]}
            one = ", the same model from each" if len(keys) == 1 and None not in keys else ""
            out[group] = (pooled["verdict"], f"{len(cells)} study seeds pooled{one}")
        elif "unavailable" in c:
            out[group] = (c["unavailable"], "1 study seed")
        else:
            comparison = cell_comparison(data, key, "after")
            out[group] = (comparison["verdict"] if comparison else "not measured", "1 study seed")
    return out


def sweep_verdict() -> str:
    """One sentence from the file: where the search beats the best uniform model after correction and
    where it does not; then the first cells' (:data:`BEFORE`) verdicts at the (target, budget) the
    current file has not reached yet."""
    r = _render()
    data, before = r.load(NAME), r.load(BEFORE)
    now = _verdict_sentence(data) if data and data.get("cells") else None
    reached = set(verdicts(data)) if now else set()
    left = {k: v for k, v in (verdicts(before) if before and before.get("cells") else {}).items() if k not in reached}
    if not left:
        return now or "The compression sweep has no finished cell yet (`benchmarks/results/sweep.json`)."
    restarted = "The sweep restarted when studies began to seed best-uniform's runners-up" + (
        f": {now[0].lower()}{now[1:-1]}" if now else "; no cell of it has finished yet"
    )
    first = "; ".join(
        f"{v} at {g.split('/')[0]} at the {g.split('/')[1]} budget ({why})" for g, (v, why) in left.items()
    )
    return f"{restarted}. Not yet rerun: before that change, {first} (Holm-corrected over that file's cells)."


def _verdict_sentence(data: dict[str, Any]) -> str:
    found = verdicts(data)

    def where(verdict: str) -> str:
        places = [
            f"{g.split('/')[0]} at the {g.split('/')[1]} budget ({why})"
            for g, (v, why) in found.items()
            if v == verdict
        ]
        return "; ".join(places)

    family = (data.get("corrected") or {}).get("family", 0)
    parts = []
    if where("searched better"):
        parts.append(f"the search beats the best uniform model after equal recovery at {where('searched better')}")
    else:
        parts.append("the search beats the best uniform model after equal recovery nowhere yet")
    if where("not resolved after correction"):
        parts.append(f"no difference is resolved at {where('not resolved after correction')}")
    if where("best-uniform better"):
        parts.append(f"the best uniform model is better at {where('best-uniform better')}")
    if where("no feasible trial"):
        parts.append(f"the study found no feasible model at {where('no feasible trial')}")
    return f"After Holm's correction over all {family} comparisons of the sweep, " + ", ".join(parts) + "."


def sweep_timing() -> str:
    """How long a cell took, from the cells' own timings (the first cells', :data:`BEFORE`, while the
    current file has none)."""
    r = _render()
    data, which = r.load(NAME), ""
    if data is None or not data.get("cells"):
        data, which = r.load(BEFORE), " before the restart"
    if data is None or not data.get("cells"):
        return "No cell has finished yet, so no cell has been timed."
    cells = list((data.get("cells") or {}).values())
    minutes = lambda part: [c["seconds"].get(part, 0.0) / 60 for c in cells]
    median = statistics.median
    return (
        f"{len(cells)} cell(s) finished{which} on {data['machine']['cpus']} CPU cores: a cell took "
        f"{median(minutes('cell')):.0f} minutes (median; {min(minutes('cell')):.0f} to {max(minutes('cell')):.0f}), of "
        f"which the study {median(minutes('study')):.0f}, recovery {median(minutes('recovery')):.0f} and the "
        f"baselines {median(minutes('baselines')):.0f}."
    )


def plot(data: dict[str, Any], out: Path, *copies: Path) -> Path:
    """Searched − best-uniform test KL after recovery against compression (1 − the cost kept): each
    study seed a dot with its 95 % interval, the pooled seeds a diamond; one colour per target.
    Written to ``out`` and to each of ``copies``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    cells = [c for _, c in _ordered(data) if "difference" in c]
    targets = list(dict.fromkeys(c["target"] for c in cells))
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for t, target in enumerate(targets):
        colour, shift = colours[t % len(colours)], 2.0 * (t - (len(targets) - 1) / 2)
        for c in (c for c in cells if c["target"] == target):
            d = c["difference"]["after"]
            x = 100 * (1 - c["keep"]) + shift + 0.6 * (c["study_seed"] - 1)
            ax.errorbar(
                x,
                d["mean"],
                yerr=[[d["mean"] - d["ci95"][0]], [d["ci95"][1] - d["mean"]]],
                fmt="o",
                ms=4,
                color=colour,
                capsize=2,
                lw=1,
            )
        for group, g in (data.get("pooled") or {}).items():
            if group.split("/")[0] != target:
                continue
            keep = next(c["keep"] for c in cells if f"{c['target']}/{c['budget']}" == group)
            d = g["after"]
            ax.errorbar(
                100 * (1 - keep) + shift + 1.2,
                d["mean"],
                yerr=[[d["mean"] - d["ci95"][0]], [d["ci95"][1] - d["mean"]]],
                fmt="D",
                ms=6,
                color=colour,
                mec="black",
                capsize=3,
                lw=1.5,
            )
        ax.plot([], [], "o", color=colour, label=target)
    ax.plot([], [], "D", color="white", mec="black", label="study seeds pooled")
    ax.axhline(0, color="black", lw=0.8)
    if not cells:
        ax.text(0.5, 0.75, "no cell of the sweep has finished yet", transform=ax.transAxes, ha="center", color="gray")
    budgets = (data.get("settings") or {}).get("budgets") or {}
    ax.set_xticks(
        [100 * (1 - keep) for keep in budgets.values()], [f"{100 * (1 - k):.0f} %\n{b}" for b, k in budgets.items()]
    )
    ax.set_xlim(0, 75)
    ax.set_xlabel("compression: % of the parent's cost removed (budget metric)")
    ax.set_ylabel("searched − best-uniform test KL (nats)")
    ax.set_title("After equal recovery; below 0: the search's model is closer to the parent", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    for path in (out, *copies):
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        print(f"wrote {path}")
    plt.close(fig)
    return out


def _finalist_cell(name: str, cell: dict[str, Any], other: str, comparisons: dict[str, Any]) -> str:
    """Finalist − ``other`` after recovery with its corrected verdict, or ``same model``."""
    if other == "searched" and cell["same_as_searched"]:
        return "same model"
    comparison = comparisons.get(f"{name}: finalist vs {other}, after recovery")
    verdict = comparison["verdict"] if comparison else "—"
    return f"{_interval(cell['difference'][other]['after'], comparison)}: {verdict}"


def finalists() -> str:
    """The study's best against the finalist chosen after a short recovery (``bench_finalists.py``):
    per cell the two trials, their KL in the study, and finalist − best-uniform and finalist − the
    study's best on the test split after equal recovery, Holm-corrected over that file."""
    r = _render()
    data = r.load("finalists")
    if not data or not data.get("cells"):
        return "Not yet measured (`benchmarks/results/finalists.json` is not committed)."
    comparisons = (data.get("corrected") or {}).get("comparisons") or {}
    rows = []
    for name, c in sorted(data["cells"].items()):
        ranking = c["ranking"]
        kl = {f["trial"]: f for f in ranking["finalists"]}
        best, pick = c["study_best_trial"], c["arm"]["trial"]

        rows.append(
            [
                c["cell"] + ("" if c["sweep"] == "sweep.json" else f" ({c['sweep']})"),
                f"{best} ({kl[best]['kl_in_study']:.3f} → {kl[best]['kl_recovered']:.3f})" if best in kl else str(best),
                f"{pick}: {_model(c['arm'])} ({kl[pick]['kl_in_study']:.3f} → {kl[pick]['kl_recovered']:.3f})",
                _finalist_cell(name, c, "searched", comparisons),
                _finalist_cell(name, c, "best-uniform", comparisons),
            ]
        )
    header = [
        "cell",
        "study's best (KL in study → after short recovery)",
        "finalist chosen",
        "finalist − study's best, test KL after recovery",
        "finalist − best-uniform, test KL after recovery",
    ]
    family = (data.get("corrected") or {}).get("family", 0)
    return r.table(header, rows) + f"\n\nHolm over the file's {family} comparisons (before and after recovery)."


TASKS = "sweep_tasks/sweep"  # bench_sweep.py --tasks --results benchmarks/results/sweep_tasks


def _points(d: dict[str, Any] | None, comparison: dict[str, Any] | None = None) -> str:
    return _interval(d, comparison, 1, " pts")


def sweep_tasks() -> str:
    """Per cell of the tasks file: each task's items, what the screen said, both arms' accuracy on the
    report blocks and searched − best-uniform, then the mean over the kept tasks with its Holm p."""
    r = _render()
    data = r.load(TASKS)
    if data is None or not data.get("cells"):
        return "Not yet measured (`benchmarks/results/sweep_tasks/sweep.json` is not committed)."
    s = data["settings"]
    parts = []
    for key, cell in _ordered(data):
        t = cell.get("tasks")
        if not t:
            parts.append(f"{key}: {cell.get('unavailable', 'no task scores')}.")
            continue
        rows = []
        for name, items in t["items"].items():
            sizes = items["block_sizes"]
            report = f"{sizes[1]:,}" + (" (the whole source)" if items["short"] else "")
            rows.append(
                [
                    name,
                    f"{sizes[0]:,} / {report}",
                    f"{items['n_contaminated']:,} of {items['n_built']:,}",
                    t["screen"][name] or "kept",
                    f"{100 * t['scores']['searched'][name]:.1f} %",
                    f"{100 * t['scores']['best-uniform'][name]:.1f} %",
                    _points(t["per_task"].get(name)),
                ]
            )
        name = f"{key}: searched vs best-uniform, mean accuracy over {len(t['kept'])} tasks after recovery"
        comparison = _comparison(data, name)
        mean = _points(t["difference"], comparison)
        holm = f", p_holm {comparison['p_holm']:.2g}: {comparison['verdict']}" if comparison else ""
        header = [
            "task",
            "items: dev / each report block",
            "dropped (shared 13 words with calibration or selection text)",
            "screen (dev block)",
            "searched",
            "best uniform",
            "searched − best-uniform",
        ]
        parts.append(
            f"**{key}** (searched: {_model(cell['arms'].get('searched'))}; best uniform: "
            f"{_model(cell['arms'].get('best-uniform'))})\n\n"
            + r.table(header, rows)
            + f"\n\nMean over the kept tasks ({', '.join(t['kept']) or 'none'}): {mean}{holm}."
        )
    rec = s["recovery"]
    intro = (
        f"Measured at {r.commit_of(data.get('provenance') or data)} ({data['date'][:10]}, {data['machine']['cpus']} "
        f"CPU cores) on {s['model']}: {s['trials']} trials per study, recovery {rec['steps']} steps, seeds "
        f"{', '.join(str(x) for x in rec['seeds'])}. Each recovered model is scored on every task's dev block and on "
        f"the report block of its recovery seed (both arms on the same items; no item in two blocks); accuracy "
        f"is the mean over both seeds' blocks. A task is dropped when every model's dev score is within "
        f"{100 * s['tasks']['floor_margin']:.0f} points of chance (or of 0 for a cloze) or at "
        f"{100 * s['tasks']['ceiling']:.0f} % or more. Differences are paired over items within blocks and resampled "
        f"over blocks ({s['n_boot']:,} resamples); p_holm is Holm-corrected over the file's "
        f"{(data.get('corrected') or {}).get('family', 0)} comparisons (test KL before and after recovery, and this)."
    )
    return "\n\n".join([intro, *parts])


def sweep_tasks_verdict() -> str:
    """One sentence per measured cell of the tasks file: accuracy over the kept tasks beside test KL."""
    r = _render()
    data = r.load(TASKS)
    if data is None or not data.get("cells"):
        return "Accuracy on clean, fresh task items is not yet measured."
    parts = []
    for key, cell in _ordered(data):
        t = cell.get("tasks") or {}
        if not t.get("difference"):
            continue
        acc = _comparison(
            data, f"{key}: searched vs best-uniform, mean accuracy over {len(t['kept'])} tasks after recovery"
        )
        kl = cell_comparison(data, key, "after")
        d, k = t["difference"], cell["difference"]["after"]
        points = f"{d['mean']:+.1f} points [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]"
        nats = f"{k['mean']:+.3f} nats [{k['ci95'][0]:+.3f}, {k['ci95'][1]:+.3f}]"
        parts.append(
            f"at {key}, searched − best-uniform is {points} of mean accuracy over {len(t['kept'])} tasks "
            f"({acc['verdict'] if acc else '—'}), beside {nats} of test KL ({kl['verdict'] if kl else '—'})"
        )
    n = len(parts)
    return (
        f"On accuracy, scored on clean items never reused between evaluations ({n} cell{'s' * (n != 1)} so far, "
        f"Holm over that file): " + "; ".join(parts) + "."
    )


RENDERERS: dict[str, Callable[[], str]] = {
    "finalists": finalists,
    "sweep": sweep,
    "sweep-seeds": sweep_seeds,
    "sweep-verdict": sweep_verdict,
    "sweep-tasks": sweep_tasks,
    "sweep-tasks-verdict": sweep_tasks_verdict,
    "sweep-timing": sweep_timing,
    "sweep-without-runners-up": sweep_without_runners_up,
}
