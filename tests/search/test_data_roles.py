"""Row identities through a weights trial and the study's baseline scoring: calibration, selection and
test documents reach only what their role allows (data.textdata's three-way split by document)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tiny_lm import save_hf_dir, tiny_model
from weights_helpers import request

from autocompress_opt.data import user
from autocompress_opt.prune import baselines
from autocompress_opt.search.study import seeding, trial_context, weights_trial
from autocompress_opt.serving.targets import Target


def _rows(tokens: Any) -> list[tuple[int, ...]]:
    return [tuple(int(t) for t in row) for row in tokens.tolist()]


@pytest.mark.parametrize("data", ["user", "built-in"])
def test_no_document_reaches_what_its_role_forbids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: str) -> None:
    """Trace every row a trial and the baseline scoring read back to its documents: importance and the
    inner search's training steps read calibration documents only, the inner search's choice and the
    trial's objective selection documents only, and never the same rows; baseline candidate scoring
    the inner search's choice rows (selection, never an objective row); no test document is read at all."""
    parent_dir = save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path / "llama")
    inner = {"steps": 2, "n_samples": 6, "val_samples": 2, "seq_len": 32, "eval_samples": 2, "eval_seq_len": 32}
    inner |= {"importance_samples": 2, "importance_seq_len": 32}
    if data == "user":
        path = tmp_path / "rows.jsonl"
        lines = (
            json.dumps({"text": f"row {i}: " + " ".join(f"w{(i * 5 + j) % 23}" for j in range(80))}) for i in range(60)
        )
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        inner["data"] = [str(path)]

    drawn: dict[tuple[int, ...], tuple[str, tuple[str, ...]]] = {}  # row -> (role, its documents)
    split: dict[str, set[str]] = {}
    real_batches = user.data_batches

    def data_batches(*args: Any, **kwargs: Any) -> Any:
        batches = real_batches(*args, **kwargs)
        split.update({role: set(batches.split.documents(role)) for role in ("calibration", "selection", "test")})
        for row, docs in zip(_rows(batches.tokens), batches.row_documents):
            drawn[row] = (batches.role, docs)
        return batches

    read: dict[str, list[tuple[int, ...]]] = {
        "importance": [],
        "train": [],
        "choice": [],
        "objective": [],
        "baseline": [],
    }

    def spy(name: str, real: Any, position: int) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            read[name] += _rows(args[position])
            return real(*args, **kwargs)

        return wrapped

    real_search = weights_trial.search

    def search(model: Any, parent: Any, importance: Any, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        val = kwargs["config"].val_samples  # the inner search holds out its first val_samples rows for its choice
        read["choice"] += _rows(tokens[:val])
        read["train"] += _rows(tokens[val:])
        return real_search(model, parent, importance, tokens, *args, **kwargs)

    monkeypatch.setattr(user, "data_batches", data_batches)
    monkeypatch.setattr(trial_context, "estimate_importance", spy("importance", trial_context.estimate_importance, 1))
    monkeypatch.setattr(trial_context, "kl_and_perplexity", spy("objective", trial_context.kl_and_perplexity, 1))
    monkeypatch.setattr(weights_trial, "search", search)
    monkeypatch.setattr(baselines, "masked_kl_scorer", spy("baseline", baselines.masked_kl_scorer, 2))

    weights_trial.clear_trial_cache()
    req = request(parent_dir, tmp_path / "cache", inner=inner)
    weights_trial.run_weights_trial(req)
    study = SimpleNamespace(
        mode="weights",
        inner=inner,
        seed=0,
        model=str(parent_dir),
        cache_dir=str(tmp_path / "c2"),
        gpus_per_trial=None,
        address=None,
        driver_device="cpu",
    )
    seeding.seed_scoring(study, Target.from_dict(req["target"]))  # type: ignore[arg-type]  # the trial's data
    weights_trial.clear_trial_cache()

    allowed = {
        "importance": "calibration",
        "train": "calibration",
        "baseline": "selection",
        "choice": "selection",
        "objective": "selection",
    }
    for what, rows in read.items():
        assert rows, f"nothing read for {what}"
        documents = {d for row in rows for d in drawn[row][1]}
        assert {drawn[row][0] for row in rows} == {allowed[what]}, what
        assert documents and documents <= split[allowed[what]], what
        assert not documents & split["test"], f"a test document reached {what}"
        if allowed[what] == "calibration":
            assert not documents & split["selection"], f"a selection document reached {what}"
    # the rows that choose among the inner candidates never score the trial (issue 49: a heterogeneous
    # trial's quality would be inflated by its own pick), nor does any test row reach either
    assert not set(read["choice"]) & set(read["objective"]), "a choice row is an objective row"
    assert len(set(read["choice"])) == inner["val_samples"]
    # the baselines choose among their candidates on those same choice rows (issue 47 item 2)
    assert set(read["baseline"]) == set(read["choice"]), "the baselines' rows are not the choice rows"
    if data == "user":
        assert all(d.startswith("rows.jsonl:") for row in read["train"] for d in drawn[row][1])
