"""Distillation reads its rows from a token stream of the user's calibration documents: on a corpus larger
than the budget no token position is trained on twice; on a smaller one the text repeats, with a warning
and the passes counted in the result, the model card and the CLI's output; stopped and resumed across a
pass boundary, a run ends with the weights of an uninterrupted one — tiny random models, a folder corpus."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from test_distill import RECIPE, export, perturbed
from tiny_lm import save_hf_dir, text_folder, tiny_model

import autocompress_opt.recover.distill as distill_module
from autocompress_opt.data.stream import StreamRows, TextRepeatsWarning, TokenStream
from autocompress_opt.data.textdata import data_split
from autocompress_opt.data.user import resolve_data
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.export import CARD_FILE
from autocompress_opt.recover.checkpoint import _STATE_JSON, STATE_DIR
from autocompress_opt.recover.distill import distill


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    teacher = tiny_model("llama", seed=1)
    root = tmp_path_factory.mktemp("models")
    return export(perturbed(teacher, 0.05), root / "student"), save_hf_dir(teacher, root / "teacher")


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every batch the stream hands out (its spans) and every batch trained on (its tokens)."""
    seen: dict[str, list[Any]] = {"spans": [], "taken": [], "trained": []}
    real_take, real_step = TokenStream.take, distill_module._train_step

    def take(self: TokenStream, n_rows: int) -> StreamRows:
        rows = real_take(self, n_rows)
        seen["spans"] += rows.spans
        seen["taken"].append(rows.tokens)
        return rows

    def step(model: Any, teacher: Any, tokens: torch.Tensor, *args: Any) -> float:
        seen["trained"].append(tokens.clone())
        return real_step(model, teacher, tokens, *args)

    monkeypatch.setattr(TokenStream, "take", take)
    monkeypatch.setattr(distill_module, "_train_step", step)
    return seen


def card(directory: Path) -> dict[str, Any]:
    return json.loads((directory / CARD_FILE).read_text())["extra"]["distillation"]


def test_a_corpus_larger_than_the_budget_is_never_trained_on_twice(
    models: tuple[Path, Path], tmp_path: Path, traced: dict[str, list[Any]]
) -> None:
    folder = text_folder(tmp_path, 30, 200)  # ~21 calibration documents, ~4,200 tokens
    recipe = replace(RECIPE, steps=8, batch_size=4)  # 512 tokens
    result = distill(*models, tmp_path / "out", recipe, progress=False, data=[str(folder)])
    positions = [(doc, i) for spans in traced["spans"] for doc, start, end in spans for i in range(start, end)]
    assert len(positions) == len(set(positions)) > 8 * 4 * 14  # every row mostly document tokens, none twice
    split = data_split(resolve_data([str(folder)])[0])
    assert {doc for doc, _ in positions} <= set(split.calibration)  # never a held-out document
    assert torch.equal(torch.cat(traced["trained"]), torch.cat(traced["taken"]))  # trained on the rows traced
    assert len(traced["trained"]) == 8 and all(t.shape == (4, 16) for t in traced["trained"])
    assert result.data_passes == 1 and result.stream["groups"]["user"]["rows"] == 32
    assert result.data["kind"] == "stream" and result.data["role"] == "calibration"
    record = card(result.out_dir)
    assert record["data_passes"] == 1 and record["tokens_seen"] == 512 == recipe.budget_tokens
    assert record["stream"]["groups"]["user"]["text_tokens"] == len(positions)
    assert "1 pass over the calibration text" in result.summary()


def test_a_corpus_smaller_than_the_budget_repeats_warns_and_reports_its_passes(
    models: tuple[Path, Path], tmp_path: Path, traced: dict[str, list[Any]]
) -> None:
    folder = text_folder(tmp_path, 6, 40)  # 5 calibration documents (roles follow the text): 200 tokens
    recipe = replace(RECIPE, steps=10)  # 320 tokens
    with pytest.warns(TextRepeatsWarning, match="calibration user text .* repeats text"):
        result = distill(*models, tmp_path / "out", recipe, progress=False, data=[str(folder)])
    positions = [(doc, i) for spans in traced["spans"] for doc, start, end in spans for i in range(start, end)]
    assert len(set(positions)) == 200 < len(positions)  # every token read, some twice
    assert result.data_passes == 2 == card(result.out_dir)["data_passes"]
    group = result.stream["groups"]["user"]
    assert group["pass_tokens"] == 200 and group["epochs"] == pytest.approx(len(positions) / 200)
    assert "2 passes over the calibration text: it repeats" in result.summary()
    assert json.loads(json.dumps(result.to_dict()))["data_passes"] == 2


def test_stopped_and_resumed_across_a_pass_boundary_ends_with_the_same_weights(
    models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 steps over 200 tokens of text (the wrap comes in step 7); a crash in step 9 resumes from step 8."""
    folder, recipe = text_folder(tmp_path, 6, 40), replace(RECIPE, steps=10)  # 5 calibration documents
    with pytest.warns(TextRepeatsWarning):
        straight = distill(*models, tmp_path / "straight", recipe, progress=False, data=[str(folder)])

    real_step, calls = distill_module._train_step, []

    def crashing_step(*args: Any) -> float:
        calls.append(1)
        if len(calls) == 9:
            raise KeyboardInterrupt
        return real_step(*args)

    monkeypatch.setattr(distill_module, "_train_step", crashing_step)
    with pytest.raises(KeyboardInterrupt), pytest.warns(TextRepeatsWarning):
        distill(*models, tmp_path / "resumed", recipe, progress=False, data=[str(folder)])
    monkeypatch.setattr(distill_module, "_train_step", real_step)
    saved = json.loads((tmp_path / "resumed" / STATE_DIR / _STATE_JSON).read_text())
    assert saved["step"] == 8 and saved["stream"]["groups"]["user"]["pass_"] == 1  # in the second pass
    resumed = distill(*models, tmp_path / "resumed", recipe, progress=False, data=[str(folder)])

    assert resumed.resumed_from_step == 8 and resumed.losses == straight.losses
    assert resumed.data_passes == straight.data_passes == 2 and resumed.stream == straight.stream
    expected = load_model(tmp_path / "straight", cache=False).model.state_dict()
    actual = load_model(tmp_path / "resumed", cache=False).model.state_dict()
    assert expected.keys() == actual.keys()
    assert all(torch.equal(actual[name], expected[name]) for name in expected)


def test_a_checkpoint_of_the_pooled_format_is_refused_naming_restart(models: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    distill(*models, out, replace(RECIPE, steps=1), progress=False)
    path = out / STATE_DIR / _STATE_JSON
    state = json.loads(path.read_text())
    path.write_text(json.dumps(state | {"format": "autocompress-distill-state/1"}))
    with pytest.raises(ConfigError, match="earlier version .* restart"):
        distill(*models, out, replace(RECIPE, steps=2), progress=False)
    assert distill(*models, out, replace(RECIPE, steps=2), progress=False, restart=True).complete


def test_cli_prints_tokens_and_passes(
    models: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli import main

    folder = text_folder(tmp_path, 6, 40)  # 5 calibration documents, 1 test
    student, teacher = models
    argv = ["distill", "--student", str(student), "--teacher", str(teacher), "--out", str(tmp_path / "out")]
    argv += ["--data", str(folder), "--batch-size", "2", "--seq-len", "16", "--eval-rows", "2", "--no-progress"]
    with pytest.warns(TextRepeatsWarning):
        assert main([*argv, "--steps", "10", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["tokens_seen"] == 320 and record["data_passes"] == 2
    assert record["stream"]["groups"]["user"]["pass_tokens"] == 200
    assert main(argv + ["--steps", "10"]) == 0
    assert "320 tokens (2 passes over the calibration text: it repeats)" in capsys.readouterr().out
