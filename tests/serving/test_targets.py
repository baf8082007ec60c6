"""Target.violations / Target.check: the one feasibility check (relative + absolute constraints + device fit)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.serving.targets import FITS_DEVICE, Target, all_satisfied, parent_metrics

# in-game on an RTX 5070 (12 GiB): the workload's ttft_ms <= 0.7x (relative) and peak_memory_gib <= 4
# (absolute), its tpot_ms <= 0.8x overridden by the target's 0.5x; vLLM with memory_fraction 0.5
# leaves 12 · 0.5 = 6 GiB for the model, its KV cache and activations.
TARGET = Target("rtx5070", "in-game", constraints={"tpot_ms": "0.5x"}, engine_options={"memory_fraction": 0.5})
PARENT = {"ttft_ms": 100.0, "tpot_ms": 10.0}


def test_violations_by_hand() -> None:
    """Each value is the normalised excess; ``<= 0`` means satisfied; device fit comes last."""
    metrics = {"ttft_ms": 77.0, "tpot_ms": 4.0, "peak_memory_gib": 4.5, "max_concurrency": 3.0}
    assert TARGET.violations(metrics, PARENT) == pytest.approx(
        {
            "ttft_ms <= 0.7x": (77 - 70) / 70,  # 0.1: relative limit 0.7 · 100 ms, exceeded
            "tpot_ms <= 0.5x": (4 - 5) / 5,  # -0.2: the target's override, 0.5 · 10 ms, met
            "peak_memory_gib <= 4": (4.5 - 4) / 4,  # 0.125: absolute, not scaled by the parent
            FITS_DEVICE: 4.5 / 6 - 1,  # -0.25: fits the 6 GiB pool
        },
        rel=1e-12,
    )
    assert list(TARGET.violations(metrics, PARENT))[-1] == FITS_DEVICE


def test_device_fit_is_at_least_one_when_no_sequence_fits() -> None:
    """max_concurrency < 1 (not one sequence fits) violates device fit by at least +1, whatever the memory."""
    small = {"ttft_ms": 1.0, "tpot_ms": 1.0, "peak_memory_gib": 3.0, "max_concurrency": 0.0}
    assert TARGET.violations(small, PARENT)[FITS_DEVICE] == 1.0  # 3 / 6 - 1 = -0.5, lifted to 1
    huge = {**small, "peak_memory_gib": 18.0}
    assert TARGET.violations(huge, PARENT)[FITS_DEVICE] == pytest.approx(2.0)  # 18 / 6 - 1 = 2 > 1: kept


def test_violations_work_elementwise_on_numpy_and_torch() -> None:
    """Three architectures at once give, per column, the scalar answer; torch keeps gradients."""
    rows = [
        {"ttft_ms": 77.0, "tpot_ms": 4.0, "peak_memory_gib": 4.5, "max_concurrency": 3.0},
        {"ttft_ms": 50.0, "tpot_ms": 6.0, "peak_memory_gib": 3.0, "max_concurrency": 0.0},
        {"ttft_ms": 60.0, "tpot_ms": 5.0, "peak_memory_gib": 18.0, "max_concurrency": 0.5},
    ]
    scalar = [TARGET.violations(r, PARENT) for r in rows]
    as_numpy = TARGET.violations({k: np.array([r[k] for r in rows]) for k in rows[0]}, PARENT)
    as_torch = {k: torch.tensor([r[k] for r in rows], dtype=torch.float64, requires_grad=True) for k in rows[0]}
    torch_out = TARGET.violations(as_torch, PARENT)
    for key in scalar[0]:
        expected = [s[key] for s in scalar]
        np.testing.assert_allclose(as_numpy[key], expected, rtol=1e-15)
        np.testing.assert_allclose(torch_out[key].detach().numpy(), expected, rtol=1e-15)
    torch_out[FITS_DEVICE].sum().backward()
    # d(peak/6 - 1)/d peak = 1/6 where the memory term is returned (rows 0 and 2), 0 where lifted to 1
    torch.testing.assert_close(as_torch["peak_memory_gib"].grad, torch.tensor([1 / 6, 0.0, 1 / 6], dtype=torch.float64))


def test_check_is_violations_of_the_exact_cost() -> None:
    """check(arch) = violations of cost_metrics(arch) as floats; the parent meets relative limits >= 1x."""
    parent = load_architecture("smollm2-135m")
    reference = parent_metrics(parent, TARGET)
    violations, metrics = TARGET.check(parent, reference)
    assert metrics == TARGET.cost_metrics(parent) == reference
    assert violations == TARGET.violations(metrics, reference)
    assert all(isinstance(v, float) for v in violations.values())
    assert violations["ttft_ms <= 0.7x"] == pytest.approx((1 - 0.7) / 0.7)  # the parent against 0.7 x itself
    loose = Target("rtx5070", "in-game", constraints={"ttft_ms": "1x", "tpot_ms": "1x"})
    relaxed, _ = loose.check(parent, parent_metrics(parent, loose))
    assert relaxed["ttft_ms <= 1x"] == 0.0 and relaxed["tpot_ms <= 1x"] == 0.0


def test_feasible_is_every_violation_of_check_at_most_zero() -> None:
    """all_satisfied: every value <= 0 (0 is on the boundary, still feasible); Target.feasible applies it to check."""
    assert all_satisfied({}) and all_satisfied({"a": 0.0, "b": -1.0}) and not all_satisfied({"a": 0.0, "b": 1e-12})
    parent = load_architecture("smollm2-135m")
    assert not TARGET.feasible(parent, parent_metrics(parent, TARGET))  # the parent misses its own 0.7x TTFT
    loose = Target("rtx5070", "in-game", constraints={"ttft_ms": "1x", "tpot_ms": "1x"})
    violations, _ = loose.check(parent, parent_metrics(parent, loose))
    assert loose.feasible(parent, parent_metrics(parent, loose)) == all_satisfied(violations)
