"""The width keep-fractions' step rule (:mod:`autocompress_opt.search.inner.optim`)."""

from __future__ import annotations

import pytest
import torch

from autocompress_opt.errors import ConfigError
from autocompress_opt.search.inner.inner_search import InnerConfig
from autocompress_opt.search.inner.optim import SharedScaleAdam

# One gradient over four layers: the second layer's cut hurts ten times more than the fourth's.
GRAD = torch.tensor([0.02, -0.5, 0.2, -0.05])


def steps(optimizer_cls: type, n: int = 5, lr: float = 0.05) -> torch.Tensor:
    keep = torch.zeros(4, requires_grad=True)
    optimizer = optimizer_cls([keep], lr=lr)
    for _ in range(n):
        optimizer.zero_grad()
        keep.grad = GRAD.clone()
        optimizer.step()
    return keep.detach()


def test_elementwise_adam_moves_every_layer_alike_and_the_shared_scale_by_its_own_gradient() -> None:
    adam = steps(torch.optim.Adam)
    assert torch.allclose(adam.abs(), torch.full((4,), 5 * 0.05), rtol=1e-4)  # lockstep: lr·sign(g) a step
    shared = steps(SharedScaleAdam)
    assert torch.equal(torch.sign(shared), -torch.sign(GRAD))  # downhill, as Adam
    ratio = shared.abs() / GRAD.abs()
    assert torch.allclose(ratio, ratio[0].expand(4), rtol=1e-5)  # each layer in proportion to its gradient
    # one shared RMS: the step of the largest gradient is lr·|g|/rms(g) a step
    rms = GRAD.pow(2).mean().sqrt()
    assert shared.abs().max() == pytest.approx(5 * 0.05 * 0.5 / float(rms), rel=1e-4)


def test_width_step_is_a_checked_inner_option() -> None:
    assert InnerConfig().width_step == "adam"
    assert InnerConfig.from_dict({"width_step": "shared"}).width_step == "shared"
    with pytest.raises(ConfigError, match="width_step.*adam.*shared"):
        InnerConfig(width_step="sgd")
    with pytest.raises(ValueError, match="lr must be > 0"):
        SharedScaleAdam([torch.zeros(2, requires_grad=True)], lr=0.0)
