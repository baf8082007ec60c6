"""Shared pieces of the inner-search tests (tests/search): a tiny random Llama parent with its
importance, calibration rows and teacher log-probs, the budgets that bind it, and a fast config."""

from __future__ import annotations

from typing import Any

from tiny_families import tiny_model, tokens

from autocompress_opt.arch.search_space import CHOICES, uniform_allocation
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.search.inner.budget import Budget, CostGoal
from autocompress_opt.search.inner.inner_search import InnerConfig, search
from autocompress_opt.search.inner.teacher import teacher_log_probs

# Budgets that bind every mask parameter of the tiny parent (3 layers, 2 KV groups of 3 heads, FFN 48).
TIGHT = Budget(num_layers=2, hidden_size=40, ffn_width=16, num_kv_heads=1, q_per_kv=1)
FAST = InnerConfig(steps=4, batch_size=2, seq_len=12, n_samples=6, val_samples=2, seed=0)


class TinyParent:
    """A tiny random Llama (every parameter random, biases included), its importance and teacher log-probs."""

    def __init__(self) -> None:
        self.model = tiny_model("llama")
        self.arch = adapter_for(self.model).architecture(self.model)
        self.importance = estimate_importance(self.model, tokens(4, 12, seed=1), model_id="tiny", progress=False)
        self.tokens = tokens(6, 12, seed=2)
        self.teacher = teacher_log_probs(self.model, self.tokens, parent_id="tiny")

    def search(
        self,
        budget: Budget | None = None,
        goal: CostGoal | None = None,
        *,
        start: Any = None,
        teacher: Any = None,
        extra: Any = None,
        **config: Any,
    ) -> Any:
        """The inner search with :data:`FAST` changed by ``config``; ``start`` is its ``init``
        architecture (the trial's uniform allocation); ``teacher`` replaces the parent's log-probs
        (e.g. top-k targets); ``extra``: more candidates by name."""
        cfg = InnerConfig(**{**FAST.to_dict(), **config})
        return search(
            self.model,
            self.arch,
            self.importance,
            self.tokens,
            self.teacher if teacher is None else teacher,
            budget=budget or Budget.of(self.arch),
            goal=goal,
            config=cfg,
            init=start,
            extra=extra,
        )

    def uniform(self, budget: Budget, order: Any = None) -> Any:
        """The uniform allocation of ``budget``'s global choices, as a weights trial builds it (layers
        dropped in ``order``, default the importance's)."""
        point = {name: getattr(budget, name) for name in CHOICES}
        return uniform_allocation(point, self.arch, self.importance.layer_order() if order is None else order)
