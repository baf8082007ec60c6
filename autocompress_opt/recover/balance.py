"""The optional load-balance loss of a mixture-of-experts student's recovery (``DistillRecipe.load_balance``).

Distillation trains every weight of a pruned MoE student, its routers included. Cutting experts or
experts per token can leave a router that sends most tokens to a few experts; the load-balance loss
of the Switch Transformer (Fedus et al., 2021) pulls against that, as transformers'
``load_balancing_loss_func`` computes it over every MoE layer's tokens at once: ``E · Σ_e f_e · P_e``,
with ``f_e`` the tokens routed to expert ``e`` per token and ``P_e`` the mean router probability of
``e`` (softmax routers: the softmax of the logits; sigmoid routers, Nemotron-H: the sigmoid scores
normalised over the experts), both over the tokens of all MoE layers; ``k`` for a perfectly balanced
top-``k`` router, ``E`` when every token picks the same experts. ``f`` carries no gradient; ``P``
does, into the routers. The recipe adds ``load_balance ×`` it to the distillation loss.

The router outputs are read by forward hooks on the router modules the experts path knows
(:data:`~autocompress_opt.hf.adapters.MOE_ADAPTERS`): every router of those families returns
``(logits, weights, indices)``, so one rule covers Qwen3-MoE, Mixtral and Nemotron-H (whose
transformers classes do not all compute the loss themselves).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from autocompress_opt.errors import ConfigError

__all__ = ["check_balanced_student", "router_balance"]


def _routers(model: Any) -> tuple[list[Any], str]:
    """The router modules of ``model``'s MoE layers and their scoring rule (no routers: an empty list)."""
    from autocompress_opt.hf.adapters import moe_adapter

    try:
        adapter = moe_adapter(model)
    except ConfigError:
        return [], "softmax"
    return [p.router for p in adapter.all_layer_parts(model) if p.moe is not None], adapter.base(model).router_scoring


def check_balanced_student(model: Any, weight: float) -> None:
    """Raise :class:`ConfigError` when ``weight`` > 0 asks for a load-balance loss ``model`` has no router for."""
    if weight > 0:
        _checked(_routers(model)[0], weight)


def _checked(routers: list[Any], weight: float) -> list[Any]:
    """``routers``, or :class:`ConfigError` when there is none to balance."""
    if not routers:
        raise ConfigError(
            f"load_balance={weight:g}: the student has no mixture-of-experts router (Qwen3-MoE, Mixtral or "
            "Nemotron-H MoE layers); use 0 for a dense student"
        )
    return routers


@contextmanager
def router_balance(model: Any, weight: float) -> Iterator[Callable[[], torch.Tensor | None]]:
    """While open, every forward of ``model`` records its MoE layers' routing; the yielded function
    returns ``weight ×`` the mean load-balance loss of the forwards since the last call (module doc),
    or None when ``weight`` is 0 (no hooks are installed then)."""
    if weight <= 0:
        yield lambda: None
        return
    routers, scoring = _routers(model)
    _checked(routers, weight)
    terms: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer and forward: (f, P), each (E,)

    def record(module: Any, args: Any, output: Any) -> None:
        logits, _, indices = output
        logits = logits.float().reshape(-1, logits.shape[-1])  # (T, E)
        scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
        slots = indices.reshape(-1)
        routed = torch.zeros(logits.shape[-1], device=logits.device)
        routed.scatter_add_(0, slots, torch.ones_like(slots, dtype=torch.float32))
        terms.append((routed / logits.shape[0], (scores / scores.sum(-1, keepdim=True)).mean(0)))

    def loss() -> torch.Tensor | None:
        if not terms:
            return None
        routed, probs = (torch.stack(t).mean(0) for t in zip(*terms))
        terms.clear()
        return weight * probs.shape[0] * (routed * probs).sum()

    handles = [router.register_forward_hook(record) for router in routers]
    try:
        yield loss
    finally:
        for handle in handles:
            handle.remove()
