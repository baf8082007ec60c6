"""Top-k teacher targets and the lumped KL against them: exact at k = V, a lower bound below it,
close for peaked teachers, stable gradients, and the targets a model's batches give."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_lm import VOCAB, tiny_model

from autocompress_opt.errors import ConfigError
from autocompress_opt.quality.metrics import (
    TeacherTargets,
    cache_teacher_logits,
    log_probs,
    sparse_token_kl,
    teacher_kl,
    teacher_targets,
    token_kl,
)


def _pair(seed: int, scale: float = 1.0, shape: tuple[int, ...] = (3, 5, 50)) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probabilities; ``scale`` sharpens the teacher (peaked when large)."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.log_softmax(scale * torch.randn(shape, generator=gen), -1)
    student = torch.log_softmax(teacher + 0.5 * torch.randn(shape, generator=gen), -1)
    return student, teacher


def test_top_k_targets_keep_the_most_likely_tokens_and_the_rest_as_tail_mass() -> None:
    _, teacher = _pair(0)
    targets = TeacherTargets.from_log_probs(teacher, 7, dtype=torch.float32)
    assert targets.shape == (3, 5, 7) and targets.k == 7 and targets.ids.dtype == torch.int32
    torch.testing.assert_close(targets.log_probs, teacher.topk(7, -1).values)
    # top-k mass + tail mass = 1
    total = targets.log_probs.exp().sum(-1) + targets.tail_log_mass.exp()
    torch.testing.assert_close(total, torch.ones(3, 5))
    # 7 ids (int32) + 7 values (float32) + 1 tail (float32) per position
    assert targets.nbytes == 3 * 5 * (7 * 4 + 7 * 4 + 4)
    row = targets[1:2]
    assert row.shape == (1, 5, 7) and torch.equal(row.ids, targets.ids[1:2])
    assert torch.equal(targets[torch.tensor([2, 0])].tail_log_mass, targets.tail_log_mass[[2, 0]])


def test_k_equal_to_the_vocabulary_gives_token_kl() -> None:
    student, teacher = _pair(1)
    full = TeacherTargets.from_log_probs(teacher, teacher.shape[-1], dtype=torch.float32)
    assert torch.isinf(full.tail_log_mass).all()
    torch.testing.assert_close(sparse_token_kl(student, full), token_kl(student, teacher), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(teacher_kl(student, full), teacher_kl(student, teacher), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("k", [1, 5, 20, 49])
def test_fewer_tokens_give_a_lower_bound_of_the_full_kl(k: int) -> None:
    for seed in range(3):
        student, teacher = _pair(seed)
        lumped = sparse_token_kl(student, TeacherTargets.from_log_probs(teacher, k, dtype=torch.float32))
        full = token_kl(student, teacher)
        assert (lumped >= -1e-6).all()
        assert (lumped <= full + 1e-6).all(), (lumped - full).max()


def test_a_peaked_teacher_loses_little_to_its_top_k() -> None:
    student, teacher = _pair(3, scale=6.0, shape=(4, 8, 400))
    full = token_kl(student, teacher).mean()
    lumped = sparse_token_kl(student, TeacherTargets.from_log_probs(teacher, 32, dtype=torch.float32)).mean()
    assert lumped <= full and (full - lumped) / full < 0.02, (float(full), float(lumped))


def test_gradients_are_finite_and_match_at_k_equal_to_v() -> None:
    student, teacher = _pair(4)
    logits = student.clone().requires_grad_()
    token_kl(torch.log_softmax(logits, -1), teacher).sum().backward()
    expected = logits.grad
    for k in (teacher.shape[-1], 10):
        logits = student.clone().requires_grad_()
        targets = TeacherTargets.from_log_probs(teacher, k, dtype=torch.float32)
        sparse_token_kl(torch.log_softmax(logits, -1), targets).sum().backward()
        assert logits.grad is not None and torch.isfinite(logits.grad).all()
        if k == teacher.shape[-1]:
            torch.testing.assert_close(logits.grad, expected, atol=1e-6, rtol=1e-5)


def test_a_position_without_tail_mass_adds_nothing_and_no_nan() -> None:
    student, teacher = _pair(5)
    targets = TeacherTargets.from_log_probs(teacher, 10, dtype=torch.float32)
    tail = targets.tail_log_mass.clone()
    tail[0, 0] = -math.inf  # the teacher's mass is all in its top 10 there
    logits = student.clone().requires_grad_()
    kl = sparse_token_kl(torch.log_softmax(logits, -1), TeacherTargets(targets.ids, targets.log_probs, tail))
    kl.sum().backward()
    assert torch.isfinite(kl).all() and logits.grad is not None and torch.isfinite(logits.grad).all()


def test_targets_of_a_model_match_its_full_log_probs_batch_by_batch() -> None:
    model = tiny_model("llama", seed=0)
    ids = torch.randint(0, VOCAB, (5, 9), generator=torch.Generator().manual_seed(0))
    expected = log_probs(cache_teacher_logits(model, ids, batch_size=2, progress=False))
    full = teacher_targets(model, ids, batch_size=2, dtype=torch.float32)
    assert isinstance(full, torch.Tensor) and not full.is_inference()
    torch.testing.assert_close(full, expected)
    sparse = teacher_targets(model, ids, batch_size=2, dtype=torch.float16, top_k=16)
    assert isinstance(sparse, TeacherTargets) and sparse.shape == (5, 9, 16)
    assert sparse.log_probs.dtype == torch.float16 and sparse.tail_log_mass.dtype == torch.float32
    torch.testing.assert_close(sparse.log_probs.float(), expected.topk(16, -1).values, atol=2e-3, rtol=1e-3)


def test_mismatched_targets_are_config_errors() -> None:
    student, teacher = _pair(6)
    with pytest.raises(ConfigError, match="do not fit"):
        sparse_token_kl(student[:, :4], TeacherTargets.from_log_probs(teacher, 4))
    with pytest.raises(ConfigError, match="k=60 exceeds the vocabulary of 50"):
        TeacherTargets.from_log_probs(teacher, 60)
    with pytest.raises(ConfigError, match="k must be a positive int"):
        TeacherTargets.from_log_probs(teacher, 0)
    with pytest.raises(ConfigError, match="disagree"):
        TeacherTargets(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 4), torch.zeros(2))
