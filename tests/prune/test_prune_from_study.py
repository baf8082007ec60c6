"""``autocompress prune --from-study``: a study trial exported as the trial built it (its architecture
cut with the trial's own importance), so the export is the model whose quality the study stored."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from weights_helpers import INNER as WEIGHTS_INNER
from weights_helpers import tiny_weights_study

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import default_space
from autocompress_opt.cli import main
from autocompress_opt.prune.export import CARD_FILE, load_exported
from autocompress_opt.search.study import StudyConfig, load_records, run_study
from autocompress_opt.search.study.weights_trial import DEFAULT_CACHE_DIR, TrialConfig, heldout_quality, parent_context
from autocompress_opt.serving.targets import Target

INNER = {**WEIGHTS_INNER, "steps": 2}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "smollm2-135m", "--params", "0.5", "--trial", "3"], "--trial and --storage only apply"),
        (
            ["--from-study", "w", "--trial", "three"],
            "--trial must be 'best', 'recovered' or a trial number, got 'three'",
        ),
        (["--from-study", "w", "--trial", "-1"], "--trial must be 'best', 'recovered' or a trial number >= 0"),
        (["--from-study", "nope"], "no study storage at"),
        (["--params", "0.5"], "--model is required"),
        (["--model", "smollm2-135m", "--params", "0.5", "--device", "gpu"], "device 'gpu' is not one of"),
        (["--model", "smollm2-135m", "--params", "0.5", "--compute-dtype", "int8"], "compute dtype 'int8'"),
    ],
)
def test_bad_from_study_arguments_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    storage = tmp_path / "absent.db"
    extra = ["--storage", f"sqlite:///{storage}"] if "--from-study" in argv and "--params" not in argv else []
    assert main(["prune", *argv, *extra, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not storage.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_from_study_exports_the_model_the_trial_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here, as in a study run
    config = tiny_weights_study(tmp_path, trials=2, inner=INNER)
    model_dir, target = Path(config.model), config.targets[0]
    records, _ = load_records(config.storage_url, "w.h100-sxm")
    best = max((r for r in records if r.state == "COMPLETE" and r.feasible), key=lambda r: (r.quality, -r.number))

    out = tmp_path / "export"
    assert main(["prune", "--from-study", "w", "--storage", config.storage_url, "--out", str(out)]) == 0
    assert f"trial {best.number}" in capsys.readouterr().out
    exported = load_exported(out)
    built = load_architecture(str(out))
    trial_arch = best.arch()
    assert trial_arch is not None
    assert [(s.num_heads, s.num_kv_heads, s.ffn_width, s.attention, s.ffn) for s in built.layers if not s.is_noop] == [
        (s.num_heads, s.num_kv_heads, s.ffn_width, s.attention, s.ffn) for s in trial_arch.layers if not s.is_noop
    ]
    # the same model: its selection-split KL is the one the study stored for the trial (the trials of a
    # datacenter target read the built-in prose)
    trial_config = TrialConfig.from_dict(INNER).for_workload(target.workload)
    context, _ = parent_context(str(model_dir), trial_config, DEFAULT_CACHE_DIR.resolve())
    kl = heldout_quality(context, exported)["kl_to_parent"]
    assert kl == pytest.approx(-math.log(best.quality), rel=1e-4, abs=1e-6)
    # the card reports the model on the test split, which chose nothing, beside the trial's selection result
    extra = json.loads((out / CARD_FILE).read_text())["extra"]
    assert extra["study_result"]["split"] == "selection" and extra["test"]["split"] == "test"
    assert extra["test"]["data"]["code"]["role"] == extra["test"]["data"]["prose"]["role"] == "test"
    assert extra["test"]["kl_to_parent"] >= 0 and extra["test"]["ppl_prose"] > 1
    # cut with the kept indices the study stored with the trial, not with importance computed here
    assert best.kept is not None and extra["kept_from"] == "trial" and "importance" not in extra

    # a trial stored before trials recorded their indices: recomputed importance, with a warning
    import sqlite3

    with sqlite3.connect(tmp_path / "w.db") as db:
        db.execute("DELETE FROM trial_user_attributes WHERE key = 'kept'")
    legacy = tmp_path / "legacy"
    assert main(["prune", "--from-study", "w", "--storage", config.storage_url, "--out", str(legacy)]) == 0
    assert "stores no kept indices" in capsys.readouterr().err
    assert json.loads((legacy / CARD_FILE).read_text())["extra"]["kept_from"] == "importance"

    # an explicit trial number, and one that does not exist
    other = min(r.number for r in records if r.state == "COMPLETE")
    again = tmp_path / "again"
    argv = ["prune", "--from-study", "w.h100-sxm", "--storage", config.storage_url, "--trial", str(other)]
    assert main([*argv, "--out", str(again)]) == 0
    assert main([*argv[:-1], "99", "--out", str(tmp_path / "none")]) == 2
    assert "has no trial 99" in capsys.readouterr().err


@pytest.mark.slow
def test_from_study_exports_a_plan_mode_trial_like_arch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan-mode trial has no importance of its own: it is cut like --arch with this command's
    calibration settings, and the card records the study and trial."""
    import json

    from tiny_lm import save_hf_dir, tiny_model

    from autocompress_opt.prune.export import CARD_FILE

    monkeypatch.chdir(tmp_path)
    model_dir = save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path / "llama")
    config = StudyConfig(
        name="p",
        model=str(model_dir),
        targets=(Target("h100-sxm", "datacenter", constraints={"tpot_ms": "1.5x", "output_throughput_tok_s": "0.5x"}),),
        space=default_space(load_architecture(str(model_dir))),
        trials=2,
        storage=f"sqlite:///{tmp_path}/p.db",
        concurrency=1,
    )
    try:
        run_study(config, progress=False)
    finally:
        import ray

        ray.shutdown()
    out = tmp_path / "export"
    argv = ["prune", "--from-study", "p", "--storage", config.storage_url, "--out", str(out)]
    assert main([*argv, "--samples", "2", "--seq-len", "16", "--no-progress"]) == 0
    assert "study p.h100-sxm, trial" in capsys.readouterr().out
    card = json.loads((out / CARD_FILE).read_text())
    recipe = card["extra"]["recipe"]
    assert recipe["mode"] == "study-trial" and recipe["study"] == "p.h100-sxm" and "study_result" in card["extra"]
    assert load_exported(out) is not None
