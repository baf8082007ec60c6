"""The head-to-head's test-split report: paired differences over test rows (benchmarks/_h2h_test.py)
and the tables rendered from a summary JSON that has them (benchmarks/_h2h_tables.py, render.py)."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _h2h_tables  # noqa: E402
import render  # noqa: E402
from _h2h_test import differences, summary  # noqa: E402

ROWS = 32


def scores(rng: np.random.Generator, hard: dict[str, np.ndarray], shift: float) -> dict[str, Any]:
    """One model's per-row test scores: each row's difficulty plus ``shift`` nats plus a little noise."""
    out = {}
    for dom, base in hard.items():
        kl = base + shift + rng.normal(0, 0.02, size=ROWS)
        out[dom] = {"kl": kl.tolist(), "ce": (base + 2 + shift + rng.normal(0, 0.02, size=ROWS)).tolist()}
    return out


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict[str, Any]]]:
    """Searched 0.2 nats closer to the parent than minitron on every row; depth equal to searched."""
    rng = np.random.default_rng(0)
    hard = {dom: rng.gamma(2.0, 0.5, size=ROWS) for dom in ("code", "prose")}
    return {
        "searched": [scores(rng, hard, 1.0) for _ in range(3)],
        "minitron": [scores(rng, hard, 1.2) for _ in range(3)],
        "depth": [scores(rng, hard, 1.0) for _ in range(3)],
    }


def test_differences_are_paired_over_rows_and_name_the_better_model(runs) -> None:
    better = differences(runs["searched"], runs["minitron"], n_boot=2000)
    assert better["kl"]["mean"] == pytest.approx(-0.2, abs=0.01)
    assert better["kl"]["ci95"][1] < 0 and better["kl"]["verdict"] == "searched better"
    # the rows' difficulty (sd ~0.7 nats) cancels in the pairing: the interval is a few hundredths wide
    assert better["kl"]["ci95"][1] - better["kl"]["ci95"][0] < 0.05
    ratio = better["ppl_ratio_code"]
    assert ratio["mean"] == pytest.approx(math.exp(-0.2), rel=0.02) and ratio["ci95"][1] < 1
    same = differences(runs["searched"], runs["depth"], n_boot=2000)
    assert same["kl"]["ci95"][0] < 0 < same["kl"]["ci95"][1]
    assert same["kl"]["verdict"].startswith("no difference")
    kl = summary(runs["searched"][0])
    assert kl["kl_to_parent"] == pytest.approx((kl["kl_code"] + kl["kl_prose"]) / 2)


def test_a_test_split_summary_renders_paired_intervals_and_names_its_split(runs, monkeypatch) -> None:
    """The committed JSON's first target, given test-split fields as the benchmark writes them."""
    s = copy.deepcopy(json.loads((ROOT / "benchmarks" / "results" / "head_to_head.json").read_text()))
    s["targets"] = s["targets"][:1]
    row = s["targets"][0]
    row["arms"] = {a: row["arms"][a] for a in ("searched", "minitron", "depth")}
    row["differences_points"] = {a: row["differences_points"][a] for a in ("minitron", "depth")}
    for arm, arm_runs in runs.items():
        row["arms"][arm]["test_rows"] = {"before": arm_runs[0], "after": arm_runs}
    row["differences_test"] = {
        a: {
            "before": differences(runs["searched"][:1], runs[a][:1], n_boot=500),
            "after": differences(runs["searched"], runs[a], n_boot=500),
        }
        for a in ("minitron", "depth")
    }
    domain = {"n_documents": 40, "role": "test"}
    s["quality_split"] = {
        "role": "test",
        "rows_per_domain": ROWS,
        "seq_len": 128,
        "seed": 0,
        "domains": {"code": domain, "prose": domain},
    }
    s["parent"]["test"] = {"ppl_code": 9.5, "ppl_prose": 21.0}

    text = _h2h_tables.tables(s)
    assert "KL and perplexity on the test split: 32 rows × 128 tokens per domain" in text
    minitron = next(line for line in text.splitlines() if line.startswith("| minitron"))
    kl = row["differences_test"]["minitron"]["after"]["kl"]
    assert f"**{kl['mean']:+.3f}** [{kl['ci95'][0]:+.3f}, {kl['ci95'][1]:+.3f}]" in minitron  # resolved: bold
    depth = next(line for line in text.splitlines() if line.startswith("| depth"))
    assert "**" not in depth.split("|")[4]  # not resolved: plain

    monkeypatch.setattr(render, "need", lambda name: s)
    readme = render.h2h_summary()
    assert "on the test split" in readme and "perplexity 9.5 code / 21.0 prose on the test rows" in readme
    # with the file's Holm family: the adjusted p beside the interval, bold only when it survives
    assert f"minitron **{kl['mean']:+.3f} [{kl['ci95'][0]:+.3f}, {kl['ci95'][1]:+.3f}], p_holm" in readme
    s.pop("corrected", None)  # a file without the family: bold by the interval alone, as before
    assert f"minitron **{kl['mean']:+.3f}**" in render.h2h_summary()
    findings = render.h2h_findings("head_to_head")()
    assert "Lowest test KL before recovery" in findings
    assert "in test KL after recovery: lower on 1, higher on 0, not resolved on 0" in findings


def test_the_committed_summary_names_its_split() -> None:
    """Before the test split the tables say the KL is on the rows the study selected on; after, the test split."""
    s = json.loads((ROOT / "benchmarks" / "results" / "head_to_head.json").read_text())
    words = _h2h_tables.split_words(s)
    assert words in _h2h_tables.tables(s) and words in render.h2h_summary()
    assert ("on the test split" in words) == ("quality_split" in s)
    assert ("rows the study selected on" in words) == ("quality_split" not in s)


def test_holm_family_of_the_head_to_head_covers_every_test_kl_comparison() -> None:
    """_h2h_test.corrected: per target, searched vs each baseline, before and after recovery; the
    adjusted p-values are Holm's of the raw ones and a verdict is 'resolved' only below 5 %."""
    import json
    from pathlib import Path

    import _h2h_test

    from autocompress_opt.tasks.scoring import holm

    summary = json.loads((Path(__file__).parents[1] / "benchmarks/results/head_to_head.json").read_text())
    family = _h2h_test.corrected(summary["targets"], n_boot=200)
    pairs = sum(len(row["differences_test"]) for row in summary["targets"])
    assert family["family"] == 2 * pairs
    comparisons = family["comparisons"]
    assert {k: v["p_holm"] for k, v in comparisons.items()} == holm({k: v["p"] for k, v in comparisons.items()})
    for entry in comparisons.values():
        assert (entry["verdict"] == "not resolved") == (entry["p_holm"] >= 0.05)
