"""The head-to-head's test-split scoring: per-row KL to the parent and cross-entropy of every model on
the test rows, and the paired differences between arms.

Every KL and perplexity the head-to-head reports is measured on rows of the **test** split
(:mod:`autocompress_opt.data.textdata`: documents that no study, importance, inner search, baseline
scoring or distillation ever reads), ``rows`` rows of ``seq_len`` tokens per built-in domain (code
and prose). Each model's per-row values (:func:`~autocompress_opt.quality.metrics.row_scores`) are
kept, so the difference between two arms, scored on the same rows, gets an interval paired over rows
and resampled over recovery seeds (:func:`~autocompress_opt.tasks.scoring.seeded_bootstrap`, the one
bootstrap of the package, here with ``scale=1``: nats).

- KL: the mean over the two domains (equal rows each) of the per-position ``KL(parent ‖ model)``,
  the held-out KL of the rest of the package; its difference is in nats.
- Perplexity: per domain, ``exp`` of the mean per-row cross-entropy; a difference of perplexities is
  reported as their ratio, ``exp`` of the paired difference of the mean cross-entropy (and of its
  interval's ends).
"""

from __future__ import annotations

import math
import time
from typing import Any

DOMAINS = ("code", "prose")
_DIGITS = 6  # significant digits of the per-row values kept in the JSON (nats)


def _round(values: list[float]) -> list[float]:
    return [float(f"{v:.{_DIGITS}g}") for v in values]


class TestRows:
    """The test rows of each domain and the parent's logits on them (computed on first use, held in
    memory: ``2 · rows · seq_len · V · 4`` bytes, 1.6 GB for SmolLM2 at 32 rows of 128 tokens)."""

    __test__ = False  # pytest: not a test class despite the name

    def __init__(self, parent: Any, tokenizer: Any, *, rows: int, seq_len: int, seed: int) -> None:
        from autocompress_opt.data.textdata import text_batches

        self.parent, self.rows, self.seq_len, self.seed = parent, rows, seq_len, seed
        self.batches = {
            dom: text_batches(tokenizer, role="test", n_samples=rows, seq_len=seq_len, seed=seed, domain=dom)
            for dom in DOMAINS
        }
        self._teacher: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        """Where the reported KL and perplexity come from: role, rows, documents and their digests,
        and the split's per-role document counts and assignment digest."""
        return {
            "role": "test",
            "rows_per_domain": self.rows,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "domains": {dom: b.to_dict() for dom, b in self.batches.items()},
        }

    def key(self) -> dict[str, Any]:
        """What the scores depend on besides the model (part of every stage key)."""
        return {dom: {k: v for k, v in b.to_dict().items() if k != "split"} for dom, b in self.batches.items()}

    def score(self, model: Any) -> dict[str, Any]:
        """Per-row ``kl`` and ``ce`` (nats) of ``model`` on each domain's test rows, and the seconds it took
        (the parent's logits, the first time, counted apart as ``teacher_s``)."""
        from autocompress_opt.quality.metrics import cache_teacher_logits, row_scores

        out: dict[str, Any] = {}
        if self._teacher is None:
            began = time.perf_counter()
            self._teacher = {
                dom: cache_teacher_logits(self.parent, b.tokens, progress=False) for dom, b in self.batches.items()
            }
            out["teacher_s"] = time.perf_counter() - began
        began = time.perf_counter()
        for dom, b in self.batches.items():
            rows = row_scores(model, b.tokens, teacher_logits=self._teacher[dom])
            out[dom] = {"kl": _round(rows["kl"]), "ce": _round(rows["ce"])}
        out["seconds"] = time.perf_counter() - began
        return out


def summary(scores: dict[str, Any]) -> dict[str, float]:
    """``kl_to_parent`` (mean over the domains), ``kl_<domain>`` and ``ppl_<domain>`` of one model's rows."""
    out = {}
    for dom in DOMAINS:
        out[f"kl_{dom}"] = sum(scores[dom]["kl"]) / len(scores[dom]["kl"])
        out[f"ppl_{dom}"] = math.exp(sum(scores[dom]["ce"]) / len(scores[dom]["ce"]))
    out["kl_to_parent"] = sum(out[f"kl_{dom}"] for dom in DOMAINS) / len(DOMAINS)
    return out


def _interval(diff: float, lo: float, hi: float, lower_is_better: bool = True) -> dict[str, Any]:
    better = hi < 0 if lower_is_better else lo > 0
    worse = lo > 0 if lower_is_better else hi < 0
    verdict = (
        "searched better" if better else "baseline better" if worse else "no difference resolved (interval includes 0)"
    )
    return {"mean": diff, "ci95": [lo, hi], "verdict": verdict}


def differences(
    searched: list[dict[str, Any]], baseline: list[dict[str, Any]], *, n_boot: int, seed: int = 0
) -> dict[str, Any]:
    """Searched minus baseline on the test rows, each side one score per run (recovery seed, or the one
    export before recovery): ``kl`` in nats (negative: the searched model is closer to the parent)
    and, per domain, ``ppl_ratio_<domain>`` (searched over baseline; below 1: the searched model's
    perplexity is lower), each with its 95 % interval paired over rows and resampled over runs."""
    from autocompress_opt.tasks.scoring import seeded_bootstrap

    def runs(scores: list[dict[str, Any]], metric: str, domains: tuple[str, ...]) -> list[dict[str, list[float]]]:
        return [{dom: s[dom][metric] for dom in domains} for s in scores]

    kl = seeded_bootstrap(
        runs(searched, "kl", DOMAINS), runs(baseline, "kl", DOMAINS), n_boot=n_boot, seed=seed, scale=1.0
    )
    out = {"kl": _interval(*kl)}
    for dom in DOMAINS:
        ce = seeded_bootstrap(
            runs(searched, "ce", (dom,)), runs(baseline, "ce", (dom,)), n_boot=n_boot, seed=seed, scale=1.0
        )
        ratio = _interval(*ce)  # the verdict of the CE difference is the verdict of the ratio
        ratio.update(mean=math.exp(ce[0]), ci95=[math.exp(ce[1]), math.exp(ce[2])])
        out[f"ppl_ratio_{dom}"] = ratio
    return out


def corrected(targets: list[dict[str, Any]], *, n_boot: int, seed: int = 0) -> dict[str, Any]:
    """Holm's correction over every test-KL comparison of a head-to-head: per target, the searched
    model against each baseline, before and after recovery; each comparison's two-sided bootstrap
    p-value over the test rows (and recovery seeds) from the same replicates as its interval
    (:func:`~autocompress_opt.tasks.scoring.seeded_bootstrap_p`). The accuracy differences are not
    in the family: the file keeps each task's accuracy per seed, not per item."""
    from autocompress_opt.tasks.scoring import seeded_bootstrap_p

    def runs(arm: dict[str, Any], when: str) -> list[dict[str, list[float]]]:
        scores = arm["test_rows"][when]
        scores = scores if isinstance(scores, list) else [scores]
        return [{dom: s[dom]["kl"] for dom in DOMAINS} for s in scores]

    raw: dict[str, float] = {}
    diffs: dict[str, float] = {}
    for row in targets:
        arms = row["arms"]
        for name, diff in (row.get("differences_test") or {}).items():
            for when in ("before", "after"):
                key = f"{row['hardware']}/{row['workload']}: searched vs {name}, {when} recovery"
                raw[key] = seeded_bootstrap_p(
                    runs(arms["searched"], when), runs(arms[name], when), n_boot=n_boot, seed=seed
                )
                diffs[key] = diff[when]["kl"]["mean"]
    return {
        "family": len(raw),
        "method": "Holm over every test-KL comparison of the file (searched vs each baseline, before and after "
        "recovery, every target); bootstrap over test rows and recovery seeds",
        "comparisons": holm_comparisons(raw, diffs, ("searched better", "baseline better", "not resolved")),
    }


def holm_comparisons(
    raw: dict[str, float],
    diffs: dict[str, float],
    verdicts: tuple[str, str, str],
    accuracy: dict[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per comparison its KL difference, raw p-value, Holm-adjusted p-value over the family ``raw``
    and its verdict at 5 % after correction: ``verdicts`` = (the first side better, the second side
    better, not resolved). ``accuracy`` holds the comparisons of the family made in accuracy points
    instead (higher is better; their difference is ``acc_diff_pts``, and ``diffs`` need not name them)."""
    from autocompress_opt.tasks.scoring import holm

    accuracy = accuracy or {}
    adjusted = holm(raw)
    out = {}
    for key, p in raw.items():
        resolved = adjusted[key] < 0.05
        first_better = accuracy[key] > 0 if key in accuracy else diffs[key] < 0
        verdict = (verdicts[0] if first_better else verdicts[1]) if resolved else verdicts[2]
        diff = {"acc_diff_pts": accuracy[key]} if key in accuracy else {"kl_diff": diffs[key]}
        out[key] = {**diff, "p": p, "p_holm": adjusted[key], "verdict": verdict}
    return out
