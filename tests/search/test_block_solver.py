"""The exact solver over the block library (issue 49, item 3): feasible, optimal against exhaustive
enumeration on a tiny random Llama (3 layers x 21 variants: 9,261 architectures), engine rules kept,
clear errors."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from tiny_families import tiny_model, tokens

from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.block_library import BlockLibrary, BlockVariant, build_block_library
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.loadability import ShapeRules
from autocompress_opt.search.inner.block_solver import NAME, legal_variants, solve_block_library
from autocompress_opt.search.inner.budget import Budget, CostGoal, totals_of
from autocompress_opt.serving.arch_arrays import ArchArrays
from autocompress_opt.serving.targets import Target


@pytest.fixture(scope="module")
def library() -> BlockLibrary:
    model = tiny_model("llama")
    importance = estimate_importance(model, tokens(4, 12, seed=1), model_id="tiny", progress=False)
    lib, _ = build_block_library(model, importance, tokens(4, 12, seed=2), ffn_step=24, model_id="tiny")
    return lib


def _brute_force(lib: BlockLibrary, budget: Budget, goal: CostGoal | None) -> float:
    """The least summed score over every feasible choice of one variant per layer (numpy, one batch)."""
    combos = [c for c in itertools.product(*(lib.variants(i) for i in range(3))) if not all(v.skipped for v in c)]
    archs = [replace(lib.parent, layers=tuple(v.spec(p) for v, p in zip(c, lib.parent.layers))) for c in combos]
    ok = np.ones(len(archs), dtype=bool)
    for k, limit in budget.limits().items():
        ok &= np.array([totals_of(a)[k] for a in archs]) <= limit
    if goal is not None:
        violations = goal.violations(goal.metrics(ArchArrays.from_architectures(archs)))
        for v in violations.values():
            ok &= np.asarray(v) <= 0
    scores = np.array([sum(lib.score(i, v) for i, v in enumerate(c)) for c in combos])
    return float(scores[ok].min())


BUDGETS = [
    Budget(num_layers=2, hidden_size=48, ffn_width=24, num_kv_heads=1, q_per_kv=2),
    Budget(num_layers=3, hidden_size=48, ffn_width=36, num_kv_heads=2, q_per_kv=2),
    Budget(num_layers=1, hidden_size=48, ffn_width=48, num_kv_heads=2, q_per_kv=3),
]


@pytest.mark.parametrize("budget", BUDGETS)
def test_budget_only_answer_is_feasible_and_optimal(library: BlockLibrary, budget: Budget) -> None:
    sol = solve_block_library(library, budget)
    assert sol.feasible and sol.optimal
    assert sol.architecture.name == NAME
    assert sol.score == pytest.approx(_brute_force(library, budget, None), abs=1e-12)
    assert sol.score == pytest.approx(sum(library.score(i, v) for i, v in enumerate(sol.variants)))


def test_answer_under_a_target_is_feasible_and_optimal(library: BlockLibrary) -> None:
    """A latency limit that binds the tiny model (fixed costs dominate it, so it must drop whole sub-blocks)."""
    target = Target("rtx5070", "in-game", constraints={"tpot_ms": "0.98x", "ttft_ms": "0.95x"})
    goal = CostGoal.for_target(target, library.parent)
    budget = Budget.of(library.parent)
    sol = solve_block_library(library, budget, goal)
    assert sol.feasible and sol.optimal
    assert set(sol.violations) >= set(goal.violations(goal.parent_metrics))
    assert sol.score == pytest.approx(_brute_force(library, budget, goal), abs=1e-12)
    assert sol.score > 0  # the unconstrained answer (the parent, 0) is not feasible
    assert sol.seconds < 5


def test_engine_rules_are_kept(library: BlockLibrary) -> None:
    rules = ShapeRules("vllm", ffn_multiple=24, query_heads=2, first_layer_attention=True)
    legal = legal_variants(library, rules)
    assert all(v.num_heads == 2 for vs in legal for v in vs if v.attention)
    assert {v.ffn_width for v in legal[0]} == {0, 24, 48}
    budget = Budget(num_layers=2, hidden_size=48, ffn_width=24, num_kv_heads=1, q_per_kv=2)
    sol = solve_block_library(library, budget, rules=rules)
    assert sol.feasible
    first = next(v for v in sol.variants if not v.skipped)
    assert first.attention
    uniform = solve_block_library(library, budget, rules=replace(rules, heterogeneous=False))
    assert uniform.architecture.active().is_uniform and uniform.feasible


def test_bad_input_raises_config_error(library: BlockLibrary) -> None:
    with pytest.raises(ConfigError, match="hidden_size=40 is not the library's 48"):
        solve_block_library(library, Budget(num_layers=2, hidden_size=40, ffn_width=24, num_kv_heads=1, q_per_kv=1))
    with pytest.raises(ConfigError, match="no variant per layer meets"):
        solve_block_library(library, Budget.of(library.parent), rules=ShapeRules("vllm", ffn_multiple=7, query_heads=5))
    with pytest.raises(ConfigError, match="rounds"):
        solve_block_library(library, Budget.of(library.parent), rounds=0)


def test_full_budget_keeps_the_parent(library: BlockLibrary) -> None:
    sol = solve_block_library(library, Budget.of(library.parent))
    assert sol.variants == (BlockVariant(2, 3, 48),) * 3 and sol.score == 0.0
