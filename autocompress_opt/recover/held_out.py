"""Distillation's held-out KL, measured with the memory options of its training step.

``distill`` measures ``KL(teacher ‖ student)`` on its held-out rows before the first update and after
the last. Measured like the quality metrics do (:func:`~autocompress_opt.quality.metrics.kl_divergence`),
it holds both models' logits and three ``(B, L, V)`` float32 tensors at once for every batch, on every
process: at a 128k vocabulary and 2,048 tokens that is tens of GB a GPU, far above the training
step's peak with ``--kl-chunk``. Here:

* the rows are split over the FSDP processes as the training step splits its batch (process ``r`` of
  ``W`` takes rows ``r, r + W, …``; every process runs the same number of forward passes, as FSDP's
  collectives need: a process whose share has run out repeats its first row and counts nothing);
* the float32 log-probabilities and the KL are computed ``chunk`` positions at a time, so only both
  models' logits (in the compute dtype) exist for the whole batch;
* the sums are added over processes (float64), so every process returns the same mean.

The value equals :func:`~autocompress_opt.quality.metrics.kl_divergence`'s up to float rounding
(a test holds them to it).
"""

from __future__ import annotations

from typing import Any

import torch

from autocompress_opt.errors import check_int
from autocompress_opt.quality.metrics import log_probs, token_kl

__all__ = ["held_out_kl", "kl_sums"]


def kl_sums(student_logits: torch.Tensor, teacher_logits: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """``[Σ KL(teacher ‖ student), positions]`` (float64) over ``(B, L, V)`` logits, the float32
    log-probabilities of ``chunk`` positions at a time (None: all ``L`` at once)."""
    check_int(chunk, "kl_chunk (positions per piece)", also=(None,))
    length = student_logits.shape[1]
    step = length if chunk is None else min(chunk, length)
    total = torch.zeros((), dtype=torch.float64, device=student_logits.device)
    for start in range(0, length, step):
        end = start + step
        piece = token_kl(log_probs(student_logits[:, start:end]), log_probs(teacher_logits[:, start:end]))
        total += piece.sum(dtype=torch.float64)
    positions = torch.tensor(float(student_logits.shape[0] * length), dtype=torch.float64, device=total.device)
    return torch.stack([total, positions])


def held_out_kl(
    model: Any,
    teacher: Any,
    tokens: torch.Tensor,
    batch_size: int,
    *,
    chunk: int | None = None,
    world: int = 1,
) -> float:
    """Mean per-position ``KL(teacher ‖ student)`` over ``tokens`` ``(n, L)`` in nats (module doc).

    ``world`` > 1: this process is one of ``world`` (``torch.distributed``'s rank), each taking its
    share of the rows; the result is the mean over all rows on every process. Both models run in
    eval mode under ``no_grad`` (not ``inference_mode``: FSDP2 would keep inference tensors as the
    parameters it all-gathers); their training flags are restored.
    """
    check_int(batch_size, "batch_size")
    rank = torch.distributed.get_rank() if world > 1 else 0
    share = tokens[rank::world]
    per_process = -(-len(tokens) // world)
    device = next(model.parameters()).device
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    flags = [(m, m.training) for m in (model, teacher)]
    try:
        for m, _ in flags:
            m.eval()
        with torch.no_grad():
            for start in range(0, per_process, batch_size):
                rows = share[start : start + batch_size]
                counted = len(rows) > 0
                rows = (rows if counted else tokens[:1]).to(device)
                student_logits = model(input_ids=rows, use_cache=False).logits
                teacher_logits = teacher(input_ids=rows, use_cache=False).logits.to(student_logits.device)
                sums = kl_sums(student_logits, teacher_logits, chunk)
                del student_logits, teacher_logits
                if counted:
                    totals += sums.to(totals.device)
    finally:
        for m, training in flags:
            m.train(training)
    if world > 1:
        from autocompress_opt.recover.fsdp import _collective_device

        reduced = totals.to(_collective_device())
        torch.distributed.all_reduce(reduced)
        totals = reduced.cpu()
    return float(totals[0] / totals[1])
