"""``autocompress study show --test``: the Pareto points of a weights study scored on the test split,
on demand and cached, as the trial built each model (the same numbers as ``prune --from-study``'s card)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from weights_helpers import INNER as WEIGHTS_INNER
from weights_helpers import tiny_weights_study

from autocompress_opt.cli import main
from autocompress_opt.prune.export import CARD_FILE

INNER = {**WEIGHTS_INNER, "steps": 2}


@pytest.mark.slow
def test_show_test_scores_the_pareto_points_on_the_test_split_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here, as in a study run
    config = tiny_weights_study(tmp_path, trials=3, inner=INNER)
    show = ["study", "show", "w", "--storage", config.storage_url]
    cache = tmp_path / ".autocompress" / "test-quality"

    # without --test: no trial is scored on the test split, and the output says how to ask for it
    assert main(show) == 0
    out = capsys.readouterr().out
    assert "quality (selection)" in out and "on the selection split, which chose the points" in out
    assert "study show w.h100-sxm --test" in out and "test quality" not in out
    assert not cache.exists()

    # with --test: one test score per Pareto point, on test rows of the objective's text (prose for datacenter)
    assert main([*show, "--json", "--test"]) == 0
    [view] = json.loads(capsys.readouterr().out)
    assert view["quality_split"] == "selection"
    front = view["pareto"]
    assert front and all(p["test"]["split"] == "test" for p in front)
    assert len(list(cache.glob("*.json"))) == len({json.dumps(p["architecture"], sort_keys=True) for p in front})
    for point in front:
        test = point["test"]
        assert test["objective_domains"] == ["prose"] and test["kl_objective"] == test["kl_prose"] > 0
        assert test["data"]["prose"]["role"] == "test"
        assert test["quality"] == pytest.approx(math.exp(-test["kl_prose"]))

    # the same model as prune --from-study exports: its card's test block holds the same KL
    best = max((p for p in front if p["feasible"]), key=lambda p: (p["quality"], -p["number"]))
    out_dir = tmp_path / "export"
    argv = ["prune", "--from-study", "w", "--storage", config.storage_url, "--trial", str(best["number"])]
    assert main([*argv, "--out", str(out_dir)]) == 0
    capsys.readouterr()
    card = json.loads((out_dir / CARD_FILE).read_text())["extra"]["test"]
    assert best["test"]["kl_prose"] == pytest.approx(card["kl_prose"], rel=1e-6)

    # cached: a second --test computes nothing (evaluation would fail) and prints the column
    import autocompress_opt.quality.metrics as metrics

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the test-split scores should have come from the cache")

    monkeypatch.setattr(metrics, "evaluate", refuse)
    assert main([*show, "--test"]) == 0
    out = capsys.readouterr().out
    assert "test quality: exp(-KL) on the test split" in out and "the Pareto points only" in out
    assert f"{best['test']['quality']:.3f}" in out
