"""Distillation's memory options: the chunked KL (same loss and gradients, a lower peak), activation
checkpointing (same training, uniform and heterogeneous students), bf16 student and teacher, and
the refusals — on tiny random models."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_lm import VOCAB, byte_tokenizer, save_hf_dir, tiny_model

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.hf.loading import load_model
from autocompress_opt.hf.memory import measure_peak_bytes
from autocompress_opt.prune.export import CARD_FILE, export_model
from autocompress_opt.recover.distill import DistillRecipe, distill, distillation_backward, distillation_loss

RECIPE = DistillRecipe(steps=3, batch_size=2, seq_len=16, lr=3e-3, save_every=3, n_eval_rows=2)


def _export(model: Any, out: Path) -> Path:
    arch = adapter_for(model).architecture(model)
    return export_model(model, arch, out, parent={"model": "tiny-teacher"}, tokenizer=byte_tokenizer())


@pytest.fixture(scope="module")
def teacher() -> Any:
    return tiny_model("llama", seed=1)


@pytest.fixture(scope="module")
def teacher_dir(teacher: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(teacher, tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def student_dir(teacher: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    student = copy.deepcopy(teacher)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return _export(student, tmp_path_factory.mktemp("student") / "student")


# ------------------------------------------------------------------------------ chunked KL
@pytest.mark.parametrize(("chunk", "temperature"), [(5, 1.0), (4, 2.0), (1, 1.0), (16, 1.0), (64, 0.5)])
def test_chunked_kl_gives_the_loss_and_gradients_of_the_whole(chunk: int, temperature: float) -> None:
    """A model's parameter gradients and the loss, chunked (uneven last piece included) vs. whole."""
    model, teacher = tiny_model("llama", seed=3).train(), tiny_model("llama", seed=4)
    tokens = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        target = teacher(input_ids=tokens).logits

    def run(piece: int | None) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = distillation_backward(model(input_ids=tokens).logits, target, temperature, chunk=piece)
        return float(loss), [p.grad.clone() for p in model.parameters()]

    whole_loss, whole_grads = run(None)
    loss, grads = run(chunk)
    with torch.no_grad():
        expected = float(distillation_loss(model(input_ids=tokens).logits, target, temperature))
    assert whole_loss == pytest.approx(expected, abs=1e-6)
    assert abs(loss - whole_loss) <= 1e-5
    for got, want in zip(grads, whole_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


def test_chunked_kl_never_holds_the_whole_float32_log_probabilities() -> None:
    """Peak live bytes of the loss and its backward on (4, 64, 1000) logits, in units of one
    (B, L, V) float32 tensor: the whole KL holds five such temporaries at once on top of the
    logits; in chunks they exist for ``chunk`` positions at a time, so the peak falls with the
    chunk down to the logits, their gradient and the backward's own copies."""
    logits = torch.randn(4, 64, 1000, requires_grad=True)
    target = torch.randn(4, 64, 1000)
    full = 4 * 64 * 1000 * 4

    def peak(chunk: int | None) -> float:
        measured = measure_peak_bytes(lambda: distillation_backward(logits * 1.0, target, chunk=chunk), live=[logits])
        logits.grad = None
        return measured.peak_bytes / full

    whole, by_8, by_2 = peak(None), peak(8), peak(2)
    assert whole >= 7.0  # logits, logits·1, log p_s, log p_t, p_t, log p_t − log p_s, the product
    assert by_2 < by_8 < whole - 1.5
    assert by_8 <= 5.0 + 5 * 8 / 64 + 0.01  # five chunk-sized temporaries above the full-size floor


def test_bad_chunk_is_refused() -> None:
    logits = torch.randn(1, 4, 8, requires_grad=True)
    with pytest.raises(ConfigError, match="kl_chunk.*0"):
        distillation_backward(logits, logits.detach(), chunk=0)


# ------------------------------------------------------------------------------ training options
def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_model(directory, cache=False).model.state_dict()


def test_checkpointing_and_chunked_kl_train_as_the_plain_run(
    student_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    plain = distill(student_dir, teacher_dir, tmp_path / "plain", RECIPE, progress=False)
    lean = distill(
        student_dir, teacher_dir, tmp_path / "lean", RECIPE, progress=False, gradient_checkpointing=True, kl_chunk=5
    )
    assert lean.gradient_checkpointing and lean.kl_chunk == 5 and not plain.gradient_checkpointing
    for a, b in zip(lean.losses, plain.losses):
        assert abs(a - b) <= 1e-5
    want, got = _weights(tmp_path / "plain"), _weights(tmp_path / "lean")
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)
    record = json.loads((tmp_path / "lean" / CARD_FILE).read_text())["extra"]["distillation"]
    assert record["gradient_checkpointing"] is True and record["kl_chunk"] == 5


def test_checkpointing_is_used_by_the_plain_transformers_student(student_dir: Path, teacher_dir: Path) -> None:
    """The switch reaches the model: transformers' layers run under torch.utils.checkpoint."""
    from autocompress_opt.recover.preflight import checkpoint_layers

    model = load_model(student_dir, cache=False).model.train()
    checkpoint_layers(model)
    assert model.is_activation_checkpointing


def test_a_heterogeneous_student_trains_with_checkpointing(teacher_dir: Path, tmp_path: Path) -> None:
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
    student = _export(AutocompressDeciLMForCausalLM(config).eval(), tmp_path / "hetero")
    plain = distill(student, teacher_dir, tmp_path / "plain", RECIPE, progress=False)
    ckpt = distill(student, teacher_dir, tmp_path / "ckpt", RECIPE, progress=False, gradient_checkpointing=True)
    for a, b in zip(ckpt.losses, plain.losses):
        assert abs(a - b) <= 1e-6
    assert ckpt.final_kl is not None and ckpt.final_kl < ckpt.initial_kl


def test_bf16_compute_keeps_fp32_master_weights_and_pure_bf16_is_asked_for(
    student_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    recipe = replace(RECIPE, steps=6)
    fp32 = distill(student_dir, teacher_dir, tmp_path / "fp32", recipe, progress=False)
    mixed = distill(student_dir, teacher_dir, tmp_path / "mixed", recipe, progress=False, compute_dtype="bf16")
    pure = distill(
        student_dir, teacher_dir, tmp_path / "pure", recipe, progress=False, compute_dtype="bf16", pure_bf16=True
    )
    assert (fp32.precision, mixed.precision, pure.precision) == ("fp32", "bf16-mixed", "bf16")
    for run in (mixed, pure):
        assert run.losses[-1] < 0.8 * run.losses[0]
        # bf16 rounding moves the held-out KL, not its scale.
        assert run.initial_kl == pytest.approx(fp32.initial_kl, rel=0.1)
    start = load_model(student_dir, cache=False).model.state_dict()
    master = load_model(tmp_path / "mixed", cache=False).model.state_dict()
    # fp32 master weights keep updates smaller than half a bf16 step of the weight, which bf16
    # weights would round away: there are many such moves in the mixed run's saved weights.
    kept = 0
    for name, before in start.items():
        moved = (master[name] - before).abs()
        half_ulp = before.abs() * 2.0**-8  # bf16 keeps 8 significant bits
        kept += int(((moved > 0) & (moved < half_ulp)).sum())
    assert kept > 100, kept
    assert next(load_model(tmp_path / "mixed", cache=False).model.parameters()).dtype == torch.float32
    saved = load_model(tmp_path / "pure", cache=False, dtype=torch.bfloat16).model
    assert next(saved.parameters()).dtype == torch.bfloat16


def test_pure_bf16_without_bf16_compute_is_refused(student_dir: Path, teacher_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pure_bf16.*needs compute_dtype 'bf16'"):
        distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False, pure_bf16=True)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"compute_dtype": "fp16"}, "fp16"),
        ({"compute_dtype": "int8"}, "'int8'"),
        ({"kl_chunk": 0}, "kl_chunk"),
        ({"kl_chunk": 2.5}, "kl_chunk"),
    ],
)
def test_bad_memory_options_are_named(
    student_dir: Path, teacher_dir: Path, tmp_path: Path, options: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False, **options)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------- the CLI
def test_cli_memory_flags_reach_the_run(
    student_dir: Path, teacher_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli import main

    argv = [
        "distill",
        "--student",
        str(student_dir),
        "--teacher",
        str(teacher_dir),
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--eval-rows",
        "2",
        "--steps",
        "2",
        "--no-progress",
    ]
    out = str(tmp_path / "out")
    lean = ["--gradient-checkpointing", "--kl-chunk", "4", "--compute-dtype", "bf16"]
    assert main([*argv, "--out", out, *lean, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["gradient_checkpointing"] and record["kl_chunk"] == 4 and record["precision"] == "bf16-mixed"
    assert main([*argv, "--out", str(tmp_path / "pure"), *lean, "--pure-bf16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["precision"] == "bf16"
    for bad, needle in (
        (["--kl-chunk", "0"], "--kl-chunk"),
        (["--compute-dtype", "fp64"], "'fp64'"),
        (["--fsdp"], "torchrun"),
    ):
        assert main([*argv, "--out", str(tmp_path / "bad"), *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
