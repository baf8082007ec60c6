"""Baselines on equal terms (issue 47 item 2): the study's seed point of each baseline and the model
``autocompress prune --baseline`` exports are one choice, made by one implementation
(:func:`~autocompress_opt.search.study.seeding.choose_baseline`) on the same importance, the same
score on the same selection rows, the same constraints, engine and search space."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_lm import save_hf_dir, tiny_model
from weights_helpers import INNER, TARGET

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.cli import main
from autocompress_opt.cli.study.config import study_space
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.export import CARD_FILE, load_exported
from autocompress_opt.search.study import StudyConfig, seeding
from autocompress_opt.search.study.weights_trial import TrialConfig, choice_rows, objective_domains

# TARGET's constraints bind: of the tiny parent's 48 uniform candidates only 18 (of 1 or 2 of its 4
# layers) meet them, so each baseline must choose a cut model.
CONSTRAINTS = ["--max-tpot-ms", "0.95x", "--min-throughput", "1.05x"]
# A space whose FFN values are none of the uniform grid's (16, 32, 48), so every choice is snapped
# down (48 to 40, 32 to 24); hidden 32 and both head counts are kept.
SNAPPING_SPACE = {
    "num_layers": {"min": 1, "max": 4},
    "hidden_size": {"choices": [32]},
    "ffn_width": {"choices": [24, 40]},
    "num_kv_heads": {"choices": [1, 2]},
    "q_per_kv": {"choices": [1, 2]},
}


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("agree") / "llama")


def _study_seeds(parent_dir: Path, cache: Path, space_file: Path | None) -> dict[str, dict[str, Any]]:
    """The seeds a weights study of TARGET on the parent stores, from its own scoring (SeedScoring)."""
    config = StudyConfig(
        name="agree",
        model=str(parent_dir),
        targets=(TARGET,),
        space=study_space(str(parent_dir), "weights", None if space_file is None else str(space_file)),
        trials=1,
        mode="weights",
        inner=dict(INNER),
        cache_dir=str(cache),
    )
    importance, score = seeding.seed_scoring(config, TARGET)
    parent = load_model(parent_dir).architecture
    return seeding.baseline_seeds(config, TARGET, parent, importance=importance, score=score)


def _prune(parent_dir: Path, tmp_path: Path, name: str, space_file: Path | None) -> dict[str, Any]:
    """``prune --baseline NAME`` under TARGET with the study's inner settings; the card's recipe."""
    out = tmp_path / f"out-{name}"
    argv = [
        "prune",
        "--model",
        str(parent_dir),
        "--baseline",
        name,
        "--hardware",
        TARGET.hardware,
        "--workload",
        TARGET.workload,
        *CONSTRAINTS,
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "cli-cache" / "importance"),
        "--no-progress",
        *(["--space", str(space_file)] if space_file is not None else []),
    ]
    for key, value in INNER.items():
        argv += ["--inner", f"{key}={value}"]
    assert main(argv) == 0
    return {**json.loads((out / CARD_FILE).read_text())["extra"], "model": load_exported(out)}


@pytest.mark.parametrize("snapping", [False, True], ids=["study-default-space", "snapping-space"])
def test_the_study_seeds_the_model_prune_baseline_exports(
    parent_dir: Path, tmp_path: Path, capsys: Any, snapping: bool
) -> None:
    """For depth, minitron and best-uniform under a binding constraint: the CLI's choice is the seed's
    point, its exported model is the seed's model (the baseline's own, or the snapped point's uniform
    allocation), and every candidate both ranked has the same score, so both chose on the same rows."""
    space_file = None
    if snapping:
        space_file = tmp_path / "space.yaml"
        space_file.write_text(json.dumps(SNAPPING_SPACE))  # JSON is YAML
    seeds = _study_seeds(parent_dir, tmp_path / "study-cache", space_file)
    parent = load_model(parent_dir).architecture
    snapped = []
    for name in ("depth", "minitron", "best-uniform"):
        seed = seeds[name]
        assert "point" in seed, (name, seed)
        assert seed["point"]["num_layers"] < parent.num_layers  # the constraint binds
        card = _prune(parent_dir, tmp_path, name, space_file)
        recipe = card["recipe"]
        assert recipe["point"] == seed["point"], name
        assert recipe["search"]["choice"] == seed["baseline_point"], name
        exported = adapter_for(card["model"]).architecture(card["model"])
        assert {k: getattr(exported.layers[0], k, None) for k in ("ffn_width", "num_kv_heads")} == {
            "ffn_width": seed["point"]["ffn_width"],
            "num_kv_heads": seed["point"]["num_kv_heads"],
        }, name
        if "architecture" in seed:  # unsnapped: the baseline's own model, with its own kept layers
            own = Architecture.from_dict(seed["architecture"])
            kept = [i for i, layer in enumerate(own.layers) if not layer.is_noop]
            assert card["kept_parent_layers"] == kept, name
        else:
            snapped.append(name)
    if snapping:
        assert snapped, "the snapping space must snap at least one baseline's choice"
    out = capsys.readouterr().out
    assert "target: h100-sxm / datacenter" in out


def test_candidate_scores_are_the_study_s_on_selection_rows_disjoint_from_the_objective(
    parent_dir: Path, tmp_path: Path
) -> None:
    """The CLI's recorded score of every ranked best-uniform candidate equals the study's score of it
    (the same scorer on the same rows), and those rows are selection rows, none of them a row of
    the study's objective."""
    config = StudyConfig(
        name="agree",
        model=str(parent_dir),
        targets=(TARGET,),
        space=study_space(str(parent_dir), "weights"),
        trials=1,
        mode="weights",
        inner=dict(INNER),
        cache_dir=str(tmp_path / "study-cache"),
    )
    importance, score = seeding.seed_scoring(config, TARGET)
    search = _prune(parent_dir, tmp_path, "best-uniform", None)["recipe"]["search"]
    parent = load_model(parent_dir).architecture
    from autocompress_opt.arch.search_space import uniform_allocation

    order = importance.layer_order("skip_loss")
    ranked = [(c["point"], c["score"]) for c in search["candidates"]]
    assert len(ranked) > 1 and all(s is not None for _, s in ranked)
    for point, value in ranked:
        assert score(uniform_allocation(point, parent, order)) == pytest.approx(value, rel=1e-6)

    trial = TrialConfig.from_dict(INNER).for_workload(TARGET.workload)
    tokenizer = load_model(parent_dir).tokenizer
    rows = seeding.baseline_rows(tokenizer, trial)
    assert rows is not None and rows.tokens.shape[0] == INNER["val_samples"]
    assert rows.tokens.tolist() == choice_rows(tokenizer, trial).tokens.tolist()
    from autocompress_opt.data.user import data_batches

    objective = {
        tuple(row)
        for dom in objective_domains(trial)
        for row in data_batches(
            tokenizer,
            role="selection",
            n_samples=trial.eval_samples,
            seq_len=trial.eval_seq_len,
            seed=trial.eval_seed,
            domain=dom,
        )
        .tokens[:, : trial.inner.seq_len]
        .tolist()
    }
    assert rows.role == "selection" and not objective & {tuple(r) for r in rows.tokens.tolist()}
