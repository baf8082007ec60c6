"""The inner search's step rule for the width keep-fractions (:attr:`InnerConfig.width_step`).

Elementwise Adam divides each layer's gradient by that layer's own running root-mean-square, so
after a few steps every layer moves by about ``lr · sign(g)``: the layers of a parent whose layers
share one shape (SmolLM2's 30) move in lockstep, whatever their KL says about how much a cut of
each one hurts. :class:`SharedScaleAdam` keeps Adam's first moment per layer but shares the second
moment across the tensor (the mean over its layers of ``g²``), so one step moves each layer in
proportion to its own gradient: a layer whose cut costs more KL against the same cost push moves
less than one whose cut costs little.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["SharedScaleAdam"]


class SharedScaleAdam(torch.optim.Optimizer):
    """Adam whose second moment is one number per parameter tensor (the mean of ``g²`` over its
    elements) instead of one per element; the first moment and bias corrections are Adam's.

    Args:
        params: the tensors (each a vector over layers) or parameter groups.
        lr / betas / eps: as :class:`torch.optim.Adam`.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"SharedScaleAdam lr must be > 0, got {lr}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros((), dtype=p.dtype, device=p.device)
                state["step"] += 1
                t = state["step"]
                grad = p.grad
                state["m"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["v"].mul_(beta2).add_(grad.pow(2).mean(), alpha=1 - beta2)
                m_hat = state["m"] / (1 - beta1**t)
                v_hat = state["v"] / (1 - beta2**t)
                p.add_(m_hat / (v_hat.sqrt() + group["eps"]), alpha=-group["lr"])
