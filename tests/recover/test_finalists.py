"""``autocompress study finalists``: a weights-mode study's best trials, each recovered with the same
short distillation and ranked again on the trials' selection rows; ``prune --trial recovered``
exports the one chosen."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from weights_helpers import INNER as WEIGHTS_INNER
from weights_helpers import tiny_weights_study

from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.export import CARD_FILE
from autocompress_opt.recover.finalists import FinalistRecipe, finalist_records, stored_ranking
from autocompress_opt.search.study import load_records

INNER = {**WEIGHTS_INNER, "steps": 2}
FLAGS = ["--top", "2", "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--lr", "3e-3", "--no-progress"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("top", 0, "finalists top must be a positive int, got 0"),
        ("steps", 1.5, "finalists steps must be a positive int, got 1.5"),
        ("seq_len", 1, "finalists seq_len must be an int >= 2, got 1"),
        ("seed", -1, "finalists seed must be a non-negative int, got -1"),
        ("lr", 0.0, "finalists lr must be a positive number, got 0.0"),
        ("lr", True, "finalists lr must be a positive number, got True"),
    ],
)
def test_a_bad_recipe_is_refused_naming_the_field_and_value(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        FinalistRecipe(**{field: value})


def test_the_recipe_key_ignores_how_many_finalists_are_ranked() -> None:
    """Ranking more finalists later reuses the recoveries done: ``top`` is not part of the key."""
    assert FinalistRecipe(top=2).key == FinalistRecipe(top=5).key
    assert FinalistRecipe(steps=30).key != FinalistRecipe(steps=31).key
    assert FinalistRecipe(seed=0).key != FinalistRecipe(seed=1).key


def test_a_bad_flag_is_a_one_line_error_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = tmp_path / "absent.db"
    assert main(["study", "finalists", "w", "--storage", f"sqlite:///{storage}", "--top", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "finalists top must be a positive int, got 0" in err and len(err.splitlines()) == 1
    assert not storage.exists()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A finished tiny weights-mode study of 4 trials (its caches in its own folder)."""
    root = tmp_path_factory.mktemp("finalists")
    config = tiny_weights_study(root, trials=4, inner=INNER, cache_dir=str(root / ".autocompress"))
    return {"root": root, "url": config.storage_url, "cache": str(root / ".autocompress"), "model": config.model}


@pytest.mark.slow
def test_finalists_are_recovered_alike_stored_and_the_chosen_one_exports(
    study: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cache = study["url"], study["cache"]
    records, _ = load_records(url, "w.h100-sxm")
    expected = finalist_records(records, 2)
    assert len(expected) == 2 and expected[0].quality >= expected[1].quality

    argv = ["study", "finalists", "w.h100-sxm", "--storage", url, "--cache-dir", cache, *FLAGS]
    assert main([*argv, "--json"]) == 0
    ranking = json.loads(capsys.readouterr().out)
    assert [f["trial"] for f in ranking["finalists"]] == [r.number for r in expected]
    for f, r in zip(ranking["finalists"], expected, strict=True):
        assert f["kl_in_study"] == pytest.approx(-math.log(r.quality))
        assert math.isfinite(f["kl_recovered"]) and f["kl_recovered"] >= 0
        # 2 steps at lr 3e-3 move a tiny model: recovery changed its KL
        assert f["kl_recovered"] != pytest.approx(f["kl_in_study"], abs=1e-6)
    chosen = min(ranking["finalists"], key=lambda f: f["kl_recovered"])["trial"]
    assert ranking["chosen"] == chosen

    # stored as it landed: a second run recovers nothing and prints the same table
    import autocompress_opt.recover.finalists as finalists

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a stored finalist was recovered again")

    monkeypatch.setattr(finalists, "_recovered_kl", refuse)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "<- chosen" in out and "KL after 2 steps" in out
    stored = stored_ranking(url, "w.h100-sxm")
    assert stored.chosen.trial == chosen and stored.recipe.steps == 2

    # the recovery is deterministic: one finalist recovered again from scratch gives the same KL
    monkeypatch.undo()
    recipe = FinalistRecipe(top=1, steps=2, batch_size=2, seq_len=16, lr=3e-3, seed=0)
    context, config = finalists.trial_parent_for(url, "w.h100-sxm", cache)
    again, _ = finalists._recovered_kl(context, study["model"], expected[0], recipe, config.data, False)
    assert again == pytest.approx(ranking["finalists"][0]["kl_recovered"], rel=1e-5)

    # prune exports the chosen finalist
    out_dir = tmp_path / "chosen"
    assert main(["prune", "--from-study", "w", "--storage", url, "--trial", "recovered", "--out", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    assert f"trial {chosen}, the finalist with the lowest KL after recovery" in printed
    extra = json.loads((out_dir / CARD_FILE).read_text())["extra"]
    assert extra["recipe"]["trial"] == chosen and extra["finalists"]["chosen"] == chosen


@pytest.mark.slow
def test_recovered_without_a_ranking_says_what_to_run(study: dict[str, Any], tmp_path: Path) -> None:
    import optuna

    from autocompress_opt.search.study import make_storage

    bare = tmp_path / "bare.db"
    optuna.copy_study(
        from_study_name="w.h100-sxm",
        from_storage=make_storage(study["url"]),
        to_storage=make_storage(f"sqlite:///{bare}"),
    )
    store = optuna.load_study(study_name="w.h100-sxm", storage=make_storage(f"sqlite:///{bare}"))
    for key in [k for k in store.user_attrs if k.startswith("finalists.")]:
        store.set_user_attr(key, None)
    with pytest.raises(ConfigError, match="no finalists ranked after recovery; run 'autocompress study finalists"):
        stored_ranking(f"sqlite:///{bare}", "w.h100-sxm")


@pytest.mark.slow
def test_study_run_with_finalists_ranks_each_target_after_its_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``study run --finalists K`` ends with the ranking ``study finalists`` prints, stored on the study."""
    from tiny_lm import save_hf_dir, tiny_model

    monkeypatch.chdir(tmp_path)
    model_dir = save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path / "llama")
    url = f"sqlite:///{tmp_path}/f.db"
    inner = [f"--inner={k}={v}" for k, v in INNER.items()]
    argv = ["study", "run", "--model", str(model_dir), "--mode", "weights", "--targets", "h100-sxm"]
    argv += ["--workload", "datacenter", "--max-tpot-ms", "0.95x", "--min-throughput", "1.05x", "--trials", "2"]
    argv += ["--name", "f", "--storage", url, "--serve-as", "any", "--no-seed-baselines", "--proxy", "0"]
    argv += ["--finalists", "2", "--quiet", *inner]
    try:
        assert main(argv) == 0
    finally:
        import ray

        ray.shutdown()
    out = capsys.readouterr().out
    assert "f.h100-sxm: ranking its 2 best trials again after 30 recovery steps" in out
    assert "<- chosen" in out and "--trial recovered" in out
    ranking = stored_ranking(url, "f.h100-sxm")
    assert ranking.complete and ranking.recipe == FinalistRecipe(top=2)
