"""Distillation recovery: the loss and schedule, loss falling on a perturbed student, the recorded token
budget, bit-exact resume from a checkpoint, refusal of foreign checkpoints and directories, heterogeneous
students staying heterogeneous, and the ``autocompress distill`` verb — all on tiny random models."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_worker import crashing
from tiny_lm import VOCAB, byte_tokenizer, save_hf_dir, tiny_model

import autocompress_opt.recover.distill as distill_module
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.export import CARD_FILE, OutputExistsError, export_model
from autocompress_opt.recover.distill import (
    MIN_LR_RATIO,
    DistillRecipe,
    RecipeMismatchError,
    distill,
    distillation_loss,
    learning_rate,
)

# 4 updates of 2 rows of 16 tokens: 128 tokens, a second or two per run on one core.
RECIPE = DistillRecipe(steps=4, batch_size=2, seq_len=16, lr=3e-3, save_every=2, n_eval_rows=2)


def perturbed(model: Any, scale: float, seed: int = 0) -> Any:
    """A copy of ``model`` with N(0, scale²) noise added to every parameter."""
    copied = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copied.parameters():
            param.add_(scale * torch.randn(param.shape, generator=gen))
    return copied


def export(model: Any, out: Path) -> Path:
    """``model`` as this package exports a pruned model (model card included), with the byte tokenizer."""
    arch = adapter_for(model).architecture(model)
    return export_model(
        model, arch, out, parent={"model": "tiny-teacher"}, card={"hardware": "rtx5070"}, tokenizer=byte_tokenizer()
    )


@pytest.fixture(scope="module")
def teacher() -> Any:
    return tiny_model("llama", seed=1)


@pytest.fixture(scope="module")
def teacher_dir(teacher: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(teacher, tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def student_dir(teacher: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(perturbed(teacher, 0.05), tmp_path_factory.mktemp("student") / "student")


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_model(directory, cache=False).model.state_dict()


def card(directory: Path) -> dict[str, Any]:
    return json.loads((directory / CARD_FILE).read_text())


# ------------------------------------------------------------------------------ recipe and maths
@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", 0),
        ("batch_size", -1),
        ("seq_len", 1),
        ("lr", 0.0),
        ("temperature", -1.0),
        ("grad_clip", float("nan")),
        ("save_every", 0),
        ("n_eval_rows", 0),
        ("warmup_steps", 5),
        ("seed", 1.5),
    ],
)
def test_recipe_rejects_bad_values_naming_field_and_value(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"DistillRecipe\.{field} .*{value!r}"):
        DistillRecipe(**{"steps": 4, field: value})


def test_learning_rate_warms_up_linearly_then_decays_by_cosine() -> None:
    recipe = DistillRecipe(steps=12, lr=1.0, warmup_steps=2)
    # warmup: (s+1)/2 → 0.5, 1.0; then progress p = (s-2)/10 and lr = 0.1 + 0.9·(1+cos πp)/2
    assert learning_rate(recipe, 0) == pytest.approx(0.5)
    assert learning_rate(recipe, 2) == pytest.approx(1.0)
    assert learning_rate(recipe, 7) == pytest.approx(0.1 + 0.45)  # p = 0.5: cos = 0
    assert learning_rate(recipe, 11) == pytest.approx(0.1 + 0.45 * (1 + math.cos(0.9 * math.pi)))
    assert min(learning_rate(recipe, s) for s in range(12)) > MIN_LR_RATIO


def test_distillation_loss_is_the_quality_kl_and_scales_with_t_squared() -> None:
    """At T=1 it is exactly the mean of quality's per-position KL; it is 0 for equal logits and >= 0."""
    from autocompress_opt.quality.metrics import log_probs, token_kl

    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 11, generator=gen), torch.randn(2, 5, 11, generator=gen)
    expected = token_kl(log_probs(student), log_probs(teacher)).mean()
    assert torch.equal(distillation_loss(student, teacher), expected)
    # By hand, independent of quality.metrics: Σ_v p_t (log p_t − log p_s), mean over the 2·5 positions
    by_hand = (teacher.softmax(-1) * (teacher.log_softmax(-1) - student.log_softmax(-1))).sum(-1).mean()
    assert float(distillation_loss(student, teacher)) == pytest.approx(float(by_hand), rel=1e-6)
    assert float(distillation_loss(teacher, teacher)) == pytest.approx(0.0, abs=1e-7)
    hot = float(distillation_loss(student, teacher, temperature=2.0))
    assert hot == pytest.approx(4 * float(distillation_loss(student / 2, teacher / 2)), rel=1e-6)


def test_calibration_rows_are_prefix_stable() -> None:
    """What resume and equal budgets rely on: drawing more rows never changes the first ones."""
    from autocompress_opt.data.textdata import calibration_batches

    few = calibration_batches(byte_tokenizer(), n_samples=3, seq_len=16, seed=4)
    more = calibration_batches(byte_tokenizer(), n_samples=8, seq_len=16, seed=4)
    assert torch.equal(more[:3], few)


# ------------------------------------------------------------------------------------ training
def test_loss_falls_and_held_out_kl_drops_on_a_perturbed_student(
    student_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    result = distill(student_dir, teacher_dir, tmp_path / "out", replace(RECIPE, steps=8), progress=False)
    assert result.complete and len(result.losses) == 8
    assert result.losses[-1] < 0.7 * result.losses[0]
    assert result.final_kl is not None and result.final_kl < result.initial_kl
    assert result.data["role"] == "calibration" and result.eval_data["role"] == "test"


def test_a_student_equal_to_its_teacher_starts_at_zero_kl(teacher: Any, teacher_dir: Path, tmp_path: Path) -> None:
    same = export(copy.deepcopy(teacher), tmp_path / "same")
    result = distill(same, teacher_dir, tmp_path / "out", replace(RECIPE, steps=1), progress=False)
    assert result.initial_kl == pytest.approx(0.0, abs=1e-6)
    assert result.losses[0] == pytest.approx(0.0, abs=1e-6)


def test_output_reloads_and_records_budget_recipe_and_kl(student_dir: Path, teacher_dir: Path, tmp_path: Path) -> None:
    """tokens_seen = steps·batch·seq_len; load_model(out) loads it; the card keeps the student's and adds ours."""
    result = distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False)
    assert result.tokens_seen == 4 * 2 * 16 == RECIPE.budget_tokens
    loaded = load_model(result.out_dir, cache=False)
    assert loaded.num_params == load_model(student_dir, cache=False).num_params
    record = card(result.out_dir)
    assert record["kind"] == "uniform" and record["parent"] == {"model": "tiny-teacher"}
    assert record["extra"]["hardware"] == "rtx5070"
    distillation = record["extra"]["distillation"]
    assert distillation["recipe"] == RECIPE.to_dict() and distillation["tokens_seen"] == 128
    assert distillation["complete"] and distillation["teacher"]["ref"] == str(teacher_dir.resolve())
    assert distillation["held_out_kl"] == {"initial": result.initial_kl, "final": result.final_kl, "n_rows": 2}
    assert result.to_dict()["budget_tokens"] == 128 and json.dumps(result.to_dict())


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(
    student_dir: Path, teacher_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 steps straight vs. a crash in step 3 (after the step-2 checkpoint) and a re-run: equal to the bit."""
    straight = distill(student_dir, teacher_dir, tmp_path / "straight", RECIPE, progress=False)

    real_step = distill_module._train_step
    monkeypatch.setattr(distill_module, "_train_step", crashing(real_step))
    with pytest.raises(KeyboardInterrupt):
        distill(student_dir, teacher_dir, tmp_path / "resumed", RECIPE, progress=False)
    monkeypatch.setattr(distill_module, "_train_step", real_step)
    assert card(tmp_path / "resumed")["extra"]["distillation"]["steps_done"] == 2
    resumed = distill(student_dir, teacher_dir, tmp_path / "resumed", RECIPE, progress=False)

    assert resumed.resumed_from_step == 2 and resumed.tokens_seen == straight.tokens_seen
    assert resumed.losses == straight.losses and resumed.final_kl == straight.final_kl
    expected, actual = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=name)


def test_a_finished_run_called_again_returns_without_training(
    student_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    first = distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False)
    again = distill(student_dir, teacher_dir, tmp_path / "out", replace(RECIPE, save_every=1), progress=False)
    assert again.resumed_from_step == 4 and again.seconds_per_step is None
    assert again.final_kl == first.final_kl and again.losses == first.losses


def test_a_checkpoint_of_another_recipe_is_refused_naming_the_field(
    student_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    distill(student_dir, teacher_dir, tmp_path / "out", replace(RECIPE, steps=2), progress=False)
    with pytest.raises(RecipeMismatchError, match=r"lr=0\.003.*lr=0\.001.*--restart"):
        distill(student_dir, teacher_dir, tmp_path / "out", replace(RECIPE, steps=2, lr=1e-3), progress=False)
    other_teacher = save_hf_dir(tiny_model("llama", seed=7), tmp_path / "other-teacher")
    with pytest.raises(RecipeMismatchError, match="another teacher"):
        distill(student_dir, other_teacher, tmp_path / "out", replace(RECIPE, steps=2), progress=False)
    restarted = distill(
        student_dir, teacher_dir, tmp_path / "out", replace(RECIPE, steps=2, lr=1e-3), progress=False, restart=True
    )
    assert restarted.resumed_from_step == 0 and card(tmp_path / "out")["extra"]["distillation"]["recipe"]["lr"] == 1e-3


def test_an_unrelated_non_empty_output_is_refused_without_force(
    student_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="force"):
        distill(student_dir, teacher_dir, tmp_path / "out", replace(RECIPE, steps=1), progress=False)
    distill(student_dir, teacher_dir, tmp_path / "out", replace(RECIPE, steps=1), progress=False, force=True)
    assert not (tmp_path / "out" / "notes.txt").exists() and (tmp_path / "out" / CARD_FILE).is_file()


def test_bad_inputs_are_named(student_dir: Path, teacher_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="student directory .*nowhere.* does not exist"):
        distill(tmp_path / "nowhere", teacher_dir, tmp_path / "out", RECIPE, progress=False)
    wide = save_hf_dir(tiny_model("llama", vocab_size=VOCAB + 40), tmp_path / "wide-teacher")
    with pytest.raises(ConfigError, match=rf"vocabulary of {VOCAB + 40} tokens .* has {VOCAB}"):
        distill(student_dir, wide, tmp_path / "out", RECIPE, progress=False)
    with pytest.raises(ConfigError, match="differ from the student"):
        distill(student_dir, teacher_dir, student_dir, RECIPE, progress=False)
    with pytest.raises(ConfigError, match="CUDA only"):
        distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False, bf16=True)


def test_a_heterogeneous_student_distils_and_stays_heterogeneous(teacher_dir: Path, tmp_path: Path) -> None:
    """FFN 24 in layer 0, 2 of 4 query heads in layer 1: exported and reloaded as autocompress_decilm."""
    from autocompress_opt.arch.architecture import Architecture, LayerSpec
    from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM

    arch = Architecture(
        vocab_size=VOCAB,
        hidden_size=32,
        family="llama",
        layers=(LayerSpec(True, 4, 2, 8, True, 24), LayerSpec(True, 2, 1, 8, True, 48)),
    )
    torch.manual_seed(0)
    config = AutocompressDeciLMConfig.from_architecture(arch, max_position_embeddings=128, rms_norm_eps=1e-6)
    student = export(AutocompressDeciLMForCausalLM(config).eval(), tmp_path / "hetero")
    assert card(student)["kind"] == "heterogeneous"

    result = distill(student, teacher_dir, tmp_path / "out", RECIPE, progress=False)
    loaded = load_model(result.out_dir, cache=False)
    assert isinstance(loaded.model, AutocompressDeciLMForCausalLM)
    assert loaded.architecture.num_params == arch.num_params
    assert card(result.out_dir)["kind"] == "heterogeneous" and result.final_kl < result.initial_kl


# ------------------------------------------------------------------------------------- the CLI
def test_cli_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    from autocompress_opt.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["distill", "--help"])
    assert exit_info.value.code == 0
    assert "autocompress distill --student" in capsys.readouterr().out


def test_cli_distills_end_to_end_and_resumes(
    student_dir: Path, teacher_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli import main

    argv = [
        "distill",
        "--student",
        str(student_dir),
        "--teacher",
        str(teacher_dir),
        "--out",
        str(tmp_path / "out"),
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--eval-rows",
        "2",
        "--no-progress",
        "--steps",
        "2",
    ]
    assert main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["tokens_seen"] == 64 and record["complete"] and record["recipe"]["steps"] == 2
    assert main(argv) == 0
    assert "already complete" in capsys.readouterr().out
    assert main([*argv, "--lr", "0.5"]) == 2
    assert "lr=0.5" in capsys.readouterr().err
    assert main([*argv[:-1], "0"]) == 2
    assert "DistillRecipe.steps must be a positive int, got 0" in capsys.readouterr().err
