"""distill's held-out KL (autocompress_opt.recover.held_out): the value of the quality metrics'
kl_divergence, chunked or not, in any batch size; the models' training flags kept; and its peak
memory as the predictor's "held-out KL" stage says (measured live tensor bytes)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "hf"))
from test_memory import _llama

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.memory import DistillShape, measure_peak_bytes, predict_memory
from autocompress_opt.quality.metrics import kl_divergence
from autocompress_opt.recover.held_out import held_out_kl


def _pair(dtype: str = "fp32", **sizes: Any) -> tuple[Any, Any, Any]:
    student, arch = _llama("cpu", dtype, **sizes)
    teacher, _ = _llama("cpu", dtype, **sizes)
    with torch.no_grad():  # a student that differs from the teacher
        for param in student.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    return student, teacher, arch


@pytest.mark.parametrize(("batch_size", "chunk"), [(2, None), (3, 5), (1, 64), (5, 1)])
def test_the_value_is_kl_divergence(batch_size: int, chunk: int | None) -> None:
    student, teacher, arch = _pair()
    tokens = torch.randint(0, arch.vocab_size, (5, 24), generator=torch.Generator().manual_seed(0))
    want = kl_divergence(student, teacher, tokens, batch_size=2, progress=False)
    assert want > 0.01
    assert held_out_kl(student, teacher, tokens, batch_size, chunk=chunk) == pytest.approx(want, rel=1e-5)


def test_training_flags_are_restored_and_a_bad_chunk_is_refused() -> None:
    student, teacher, arch = _pair()
    student.train()
    teacher.eval()
    tokens = torch.randint(0, arch.vocab_size, (2, 8))
    held_out_kl(student, teacher, tokens, 2)
    assert student.training and not teacher.training
    with pytest.raises(ConfigError, match="kl_chunk"):
        held_out_kl(student, teacher, tokens, 2, chunk=0)


@pytest.mark.parametrize(
    ("dtype", "chunk", "rows", "batch_size", "sizes"),
    [
        ("fp32", None, 4, 2, {}),
        ("fp32", 8, 4, 2, {}),
        ("bf16", None, 4, 4, {}),
        ("bf16", 16, 3, 2, {"vocab_size": 2048}),
        ("fp32", 4, 2, 2, {"vocab_size": 4096}),
        ("fp32", None, 2, 2, {"vocab_size": 64, "intermediate_size": 1024}),  # the forward, not the KL, peaks
    ],
)
def test_peak_is_the_predicted_held_out_stage(
    dtype: str, chunk: int | None, rows: int, batch_size: int, sizes: dict[str, Any]
) -> None:
    student, teacher, arch = _pair(dtype, **sizes)
    seq = 64
    tokens = torch.randint(0, arch.vocab_size, (rows, seq))
    measured = measure_peak_bytes(
        lambda: held_out_kl(student, teacher, tokens, batch_size, chunk=chunk),
        live=[*student.parameters(), *teacher.parameters()],
    )
    shape = DistillShape(batch_size=batch_size, seq_len=seq, kl_chunk=chunk, n_eval_rows=rows, master_dtype=dtype)
    stage = next(
        s
        for s in predict_memory(arch, "distill", compute_dtype=dtype, cuda=False, distill=shape).stages
        if s.name == "held-out KL"
    )
    predicted = stage.peak_bytes - stage.parts["teacher weights"] - stage.parts["student weights (shard)"]
    transient = measured.peak_bytes - measured.baseline_bytes
    assert abs(predicted - transient) <= 0.10 * transient, (predicted, transient, stage.parts)


def test_the_prediction_splits_rows_over_gpus_and_chunks_positions() -> None:
    from autocompress_opt.arch.catalog import load_architecture

    arch = load_architecture("llama-3.2-1b")

    def held_out(**shape: Any) -> int:
        gpus = shape.pop("gpus", 1)
        stages = predict_memory(arch, "distill", gpus=gpus, cuda=False, distill=DistillShape(**shape)).stages
        stage = next(s for s in stages if s.name == "held-out KL")
        weights = ("teacher weights", "teacher gathered weights", "student weights (shard)")
        return stage.peak_bytes - sum(stage.parts.get(name, 0) for name in weights)

    whole = held_out(batch_size=4, seq_len=2048)
    assert held_out(batch_size=4, seq_len=2048, kl_chunk=32) < whole / 4
    # 8 held-out rows, 4 at a time: 2 GPUs still take 4 each; 4 GPUs 2 each, 8 GPUs 1
    assert held_out(batch_size=4, seq_len=2048, gpus=2) == whole
    assert held_out(batch_size=4, seq_len=2048, gpus=8) < held_out(batch_size=4, seq_len=2048, gpus=4) < whole


def test_the_teacher_is_sharded_over_the_gpus_and_gathered_a_layer_at_a_time() -> None:
    """distill(fsdp=True) shards the teacher like the student (recover.fsdp.shard_frozen): each GPU holds
    its share and, for the teacher's forward, one layer and the next plus embeddings and head."""
    from autocompress_opt.arch.catalog import load_architecture

    arch = load_architecture("llama-3.2-1b")

    def parts(gpus: int) -> dict[str, int]:
        stages = predict_memory(arch, "distill", gpus=gpus, cuda=False, distill=DistillShape(batch_size=8)).stages
        return next(s for s in stages if s.name == "held-out KL").parts

    one, eight = parts(1), parts(8)
    assert "teacher gathered weights" not in one
    assert eight["teacher weights"] == -(-one["teacher weights"] // 8)
    widest = max(arch.layer_params(i) for i in range(arch.num_layers))
    assert eight["teacher gathered weights"] == (2 * widest + arch.embedding_params) * 2  # bf16
