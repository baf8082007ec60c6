"""The head-to-head's markdown tables (README, docs/results), rendered from its summary JSON.

Two generations of the JSON render: one with ``quality_split`` (KL and perplexity on the test
split, with paired intervals over test rows and recovery seeds), and the earlier one without, whose
KL and perplexity were measured on the rows the study selected on (said so in the table).
"""

from __future__ import annotations

from typing import Any

ARMS = ("searched", "minitron", "depth", "best-uniform")


def _pts(value: float) -> str:
    return f"{value:+.1f}"


def _bold(text: str, lo: float, hi: float, zero: float = 0.0) -> str:
    """``text`` in bold where the interval ``[lo, hi]`` excludes ``zero``."""
    return f"**{text}**" if lo > zero or hi < zero else text


def accuracy_ci(diff: dict[str, Any]) -> str:
    lo, hi = diff["ci95"]
    claim = f"{_pts(diff['mean'])} pts"
    return f"{_bold(claim, lo, hi)} [{_pts(lo)}, {_pts(hi)}]"


def kl_ci(diff: dict[str, Any], p_holm: float | None = None) -> str:
    """A test-KL difference in nats with its interval, bold when it excludes zero (and, given the
    Holm-adjusted p-value of the file's family, only when that is below 5 %, which it then names)."""
    lo, hi = diff["ci95"]
    claim = f"{diff['mean']:+.3f}"
    if p_holm is None:
        return f"{_bold(claim, lo, hi)} [{lo:+.3f}, {hi:+.3f}]"
    text = f"{claim} [{lo:+.3f}, {hi:+.3f}], p_holm {p_holm:.2g}"
    return f"**{text}**" if (lo > 0 or hi < 0) and p_holm < 0.05 else text


def holm_p(summary: dict[str, Any], row: dict[str, Any], baseline: str, when: str = "after") -> float | None:
    """The Holm-adjusted p-value of ``row``'s searched-vs-``baseline`` test KL (``when`` recovery),
    from the file's ``corrected`` family (_h2h_test.corrected); None where the file has none."""
    key = f"{row['hardware']}/{row['workload']}: searched vs {baseline}, {when} recovery"
    return ((summary.get("corrected") or {}).get("comparisons", {}).get(key) or {}).get("p_holm")


def ratio_ci(diff: dict[str, Any]) -> str:
    """A perplexity ratio with its interval, bold when it excludes one."""
    lo, hi = diff["ci95"]
    claim = f"{diff['mean']:.3f}"
    return f"{_bold(claim, lo, hi, 1.0)} [{lo:.3f}, {hi:.3f}]"


def split_words(summary: dict[str, Any]) -> str:
    """Which rows the KL and perplexity columns are on, in words."""
    split = summary.get("quality_split")
    if not split:
        return (
            "KL and perplexity on the rows the study selected on (measured before the three-way split: "
            "biased towards the searched arm; no paired interval)"
        )
    docs = " + ".join(f"{d['n_documents']} {dom}" for dom, d in split["domains"].items())
    return (
        f"KL and perplexity on the test split: {split['rows_per_domain']} rows × {split['seq_len']} tokens "
        f"per domain (code, prose) from {docs} test documents that no stage read; differences paired over "
        "those rows and the recovery seeds"
    )


def _arm_line(
    name: str, arm: dict[str, Any], diff: dict[str, Any] | None, test: dict[str, Any] | None, lifted: bool
) -> str:
    """One markdown row: architecture, KL before -> after, perplexity after, accuracy, differences;
    ``test``: the arm's test-split differences (new JSON; None for the searched arm or an old JSON);
    ``lifted``: the baseline's search ran with its limits lifted (none feasible within them)."""
    label = name + (" (limits lifted: none feasible within them)" if lifted else "")
    label += f" (same model as {', '.join(arm['same_model_as'])})" if arm["same_model_as"] else ""
    shape = arm["summary"].split(": ", 1)[-1]
    after, ppl, acc = arm["kl_after"], arm["ppl_after"], arm["average_accuracy"]
    kl = f"{arm['kl_before']:.2f} → {after['mean']:.2f}" + (f" ± {after['sd']:.2f}" if len(after["values"]) > 1 else "")
    accuracy = f"{100 * acc['mean']:.1f}" + (f" ± {100 * acc['sd']:.1f}" if len(acc["values"]) > 1 else "") + " %"
    versus = "—" if diff is None else accuracy_ci(diff)
    perplexity = f"{ppl['ppl_code']['mean']:.1f} / {ppl['ppl_prose']['mean']:.1f}"
    if "test_rows" not in arm:  # the JSON before the test split
        return f"| {label} | {shape} | {kl} | {perplexity} | {accuracy} | {versus} |"
    kl_versus = "—" if test is None else kl_ci(test["after"]["kl"])
    ratio = "—" if test is None else " / ".join(ratio_ci(test["after"][f"ppl_ratio_{d}"]) for d in ("code", "prose"))
    return f"| {label} | {shape} | {kl} | {kl_versus} | {perplexity} | {ratio} | {accuracy} | {versus} |"


def tables(summary: dict[str, Any]) -> str:
    """The head-to-head tables, one per target, from a summary JSON (``bench_head_to_head.summarise``)."""
    seeds = len(summary["seeds"]["recovery"])
    trials = summary["budgets"]["trials"]
    new = "quality_split" in summary
    out = [
        f"Code {summary['code']['commit'][:7]}{' (dirty)' if summary['code']['dirty'] else ''}, "
        f"{summary['parent']['summary'].split(':')[0]}; parent average accuracy "
        f"{100 * summary['parent']['average_accuracy']:.1f} %; recovery seeds "
        f"{', '.join(map(str, summary['seeds']['recovery']))}; "
        + ("complete." if summary["complete"] else "INCOMPLETE (later targets still to run).")
        + f" {split_words(summary)}."
    ]
    seeds_word = f"{seeds} seed{'s' if seeds > 1 else ''}"
    if new:
        header = (
            "| arm | architecture | test KL before → after recovery | searched − arm, test KL after (nats, 95 % CI) "
            "| test perplexity after (code / prose) | perplexity ratio searched / arm after (code / prose, 95 % CI) "
            f"| avg accuracy ({seeds_word}) | searched − arm, accuracy (95 % CI) |"
        )
        rule, empty = "|---|---|---|---|---|---|---|---|", " — | — | — | — | — | — |"
    else:
        header = (
            "| arm | architecture | KL before → after recovery | perplexity after (code / prose) | "
            f"avg accuracy ({seeds_word}) | searched − arm, 95 % CI |"
        )
        rule, empty = "|---|---|---|---|---|---|", " — | — | — | — |"
    for row in summary["targets"]:
        study = row["study"]
        point = f"{study['baseline']} point" if study.get("baseline") else "sampled point"
        chosen = (study.get("selection") or {}).get("chosen", "?")
        no_worse = "yes" if row["searched_no_worse_before_recovery"] else "NO"
        objective = " (on the study's selection rows)" if new else ""
        out += [
            "",
            f"**{row['hardware']} {row['workload']}** ({', '.join(row['constraints'])}); study best: trial "
            f"{study['trial']} ({point}, inner search returned `{chosen}`), {study['n_complete']} complete of "
            f"{trials}; searched no worse before recovery{objective}: {no_worse}",
            "",
            header,
            rule,
        ]
        for name in ARMS:
            if name in row["arms"]:
                diff = None if name == "searched" else row["differences_points"].get(name)
                test = None if name == "searched" else row.get("differences_test", {}).get(name)
                lifted = bool(row["baseline_findings"].get(name, {}).get("lifted_from"))
                out.append(_arm_line(name, row["arms"][name], diff, test, lifted))
            else:
                finding = row["baseline_findings"].get(name, {}).get("finding", "not run")
                out.append(f"| {name} | {finding} |{empty}")
    return "\n".join(out)
