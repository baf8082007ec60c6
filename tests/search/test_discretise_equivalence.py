"""Discretisation returns exactly what it returned before it scored moves on packed rows.

``discretise_golden.json`` holds, for every case of :func:`cases`, the architecture and move counts
the earlier implementation returned (the one that built an ``Architecture`` per candidate move and
packed it with ``ArchArrays.from_architectures``; commit c4314df). The cases are random parents and
masks at several depths, budgets that bind in each way (the per-layer budgets, a latency limit, a
memory limit, both kinds at once), with and without a serving engine's shape rules. Regenerate the
file only from that implementation, on the current cost model (a change to the cost model moves the
latency cases): in a checkout of the current code, ``git checkout c4314df --
autocompress_opt/search/inner/discretise.py``, then ``PYTHONPATH=<that checkout> python
tests/search/test_discretise_equivalence.py``. Last regenerated after the burst-TPOT and MoE routing
changes to the cost model: 20 of 68 cases (all with a latency limit) moved, none of the others.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.prune.importance import Importance, ImportanceMeta
from autocompress_opt.prune.loadability import shape_rules
from autocompress_opt.search.inner.budget import Budget, CostGoal
from autocompress_opt.search.inner.discretise import discretise
from autocompress_opt.search.inner.relaxation import ParentMasks
from autocompress_opt.serving.targets import Target

GOLDEN = Path(__file__).with_name("discretise_golden.json")


@dataclass(frozen=True)
class Case:
    parent: str  # "dense" or "mixed" (see _parent)
    depth: int
    binds: str  # "budget", "latency", "memory" or "both"
    rules: str | None  # a serving engine whose shape rules apply, or None
    full: bool  # masks that keep most of the parent (repair works hard) or anything (fill does)
    seed: int

    @property
    def name(self) -> str:
        start = "full" if self.full else "random"
        return f"{self.parent}-{self.depth}-{self.binds}-{self.rules or 'free'}-{start}-{self.seed}"


def cases() -> Iterator[Case]:
    for depth in (6, 12, 24):
        for binds in ("budget", "latency", "memory", "both"):
            for full in (False, True):
                yield Case("mixed", depth, binds, None, full, depth)
                yield Case("dense", depth, binds, "vllm" if full else "llamacpp", full, depth + 2)
            yield Case("dense", depth, binds, None, False, depth + 1)
    yield from repair_cases()


def repair_cases() -> Iterator[Case]:
    """Deeper stacks from near-full masks under a cost limit: hundreds of repair moves each, scored
    by per-layer deltas and screened (``search.inner.candidates``); batch ``"max"`` concurrency
    (latency, both) and a fixed one (memory)."""
    for depth in (30, 80):
        yield Case("mixed", depth, "latency", None, True, depth)
        yield Case("mixed", depth, "both", None, True, depth + 1)
        yield Case("dense", depth, "both", None, True, depth + 2)
        yield Case("dense", depth, "memory", None, True, depth + 3)


def _parent(kind: str, depth: int) -> Architecture:
    """``dense``: 8 query heads of 32 channels in 4 KV groups and FFN 1024 in every layer (room for
    DeciLM's 256-channel rules). ``mixed``: FFN widths 512/768/1024, GQA of 2 or 4 KV groups,
    every third layer sliding (window 96), an attention-free layer, QKV biases, tied embeddings."""
    if kind == "dense":
        layer = LayerSpec(True, 8, 4, 32, True, 1024)
        return Architecture(family="llama", vocab_size=512, hidden_size=256, layers=(layer,) * depth, name="dense")
    layers = []
    for i in range(depth):
        kv = 2 if i % 2 else 4
        window = 96 if i % 3 == 2 else None
        layers.append(LayerSpec(i != 1, 8, kv, 32, True, (512, 768, 1024)[i % 3], window))
    return Architecture(
        family="llama",
        vocab_size=512,
        hidden_size=256,
        layers=tuple(layers),
        tie_embeddings=True,
        qkv_bias=True,
        name="mixed",
    )


def _masks(parent: Architecture, seed: int, full: bool) -> tuple[ParentMasks, Importance]:
    """Random importance and random masks: rounding lands anywhere, often far off the budgets
    (``full``: most gates open and widths over half the parent's)."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.rand(n, generator=gen, dtype=torch.float64)
    n = parent.num_layers
    specs = parent.layers
    importance = Importance(
        parent,
        tuple(rand(s.num_heads) if s.attention else None for s in specs),
        tuple(rand(s.num_kv_heads) if s.attention else None for s in specs),
        tuple(rand(s.ffn_width) for s in specs),
        rand(parent.hidden_size),
        rand(n),
        rand(n),
        ImportanceMeta("synthetic", "none", "minitron", 1, 1, 1),
    )
    masks = ParentMasks(parent, importance, hidden_size=parent.hidden_size)
    with torch.no_grad():
        for p in (masks.kv_keep, masks.q_keep, masks.ffn_keep):
            p.copy_(torch.rand(n, generator=gen) / (2 if full else 1) + (0.5 if full else 0.0))
        for p in (masks.attn_log_alpha, masks.ffn_log_alpha):
            p.copy_(torch.randn(n, generator=gen) * 3 + (4.0 if full else 0.0))
    return masks, importance


# The limits of each kind, relative to the parent (the budgets in layer equivalents and widths).
_LATENCY = Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.75x"})
_MEMORY = Target("rtx5070", "local-coding", constraints={"peak_memory_gib": "0.7x", "ttft_ms": "5x", "tpot_ms": "5x"})


def run(case: Case) -> dict[str, Any]:
    """What :func:`discretise` returns for ``case``: per layer (query heads, KV heads, FFN width),
    0 where dropped; the move counts; feasibility."""
    parent = _parent(case.parent, case.depth)
    masks, importance = _masks(parent, case.seed, case.full)
    loose = Budget.of(parent)
    tight = Budget(num_layers=case.depth * 2 // 3, hidden_size=256, ffn_width=512, num_kv_heads=2, q_per_kv=2)
    budget = tight if case.binds in ("budget", "both") else loose
    target = {"budget": None, "latency": _LATENCY, "memory": _MEMORY, "both": _LATENCY}[case.binds]
    goal = CostGoal.for_target(target, parent) if target else None
    rules = None
    if case.rules:
        heads = budget.num_kv_heads * budget.q_per_kv if budget is tight else 8
        rules = shape_rules(case.rules, parent, hidden_size=256, query_heads=heads)
    out = discretise(masks, importance, budget, goal, rules=rules)
    layers = [[s.num_heads, s.num_kv_heads, s.ffn_width] for s in out.architecture.layers]
    return {"layers": layers, "moves": out.moves, "feasible": out.feasible}


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_the_golden_file_covers_every_case_and_every_way_of_binding() -> None:
    golden = _golden()
    assert sorted(golden) == sorted(c.name for c in cases())
    # the cases exercise repair and fill, feasible and not, under each kind of limit
    assert sum(g["moves"]["repair"] > 0 for g in golden.values()) >= 10
    assert sum(g["moves"]["fill"] > 0 for g in golden.values()) >= 10
    for binds in ("budget", "latency", "memory", "both"):
        assert any(g["moves"]["repair"] > 0 for name, g in golden.items() if f"-{binds}-" in name), binds


@pytest.mark.parametrize("case", list(cases()), ids=lambda c: c.name)
def test_discretise_returns_the_golden_architecture_and_moves(case: Case) -> None:
    assert run(case) == _golden()[case.name]


@pytest.mark.parametrize("binds", ["latency", "both"])
def test_fill_scores_pick_the_argmax_of_every_exact_score_whatever_is_evaluated_first(binds: str) -> None:
    """The fill move's winner and its score are those of scoring every candidate with the exact
    cost model, whichever rows are guessed likely (none, the worst, random ones)."""
    from autocompress_opt.search.inner.discretise import _Evaluator, _fill_scores, _grow_layer, _repair, _unit_values

    case = Case("mixed", 12, binds, None, False, 12)
    parent = _parent(case.parent, case.depth)
    masks, importance = _masks(parent, case.seed, case.full)
    tight = Budget(num_layers=8, hidden_size=256, ffn_width=512, num_kv_heads=2, q_per_kv=2)
    budget = tight if binds == "both" else Budget.of(parent)
    goal = CostGoal.for_target(_LATENCY, parent)
    values, evaluate = _unit_values(masks, importance), _Evaluator(masks, budget, goal)
    # a start well inside the limits: repaired to half the latency the goal allows
    stricter = CostGoal.for_target(replace(_LATENCY, constraints={"tpot_ms": "0.375x"}), parent)
    layers, _ = _repair(masks.discrete(), values, _Evaluator(masks, budget, stricter))
    sizes = [tuple(int(x) for x in row) for row in masks.sizes.tolist()]
    moves = [m for i, d in enumerate(layers) for m in _grow_layer(i, d, values, parent.layers[i], sizes[i])]
    changes = [(m[1], m[2]) for m in moves]
    current = evaluate(layers)[0]
    every = evaluate(layers, changes)  # (N, K): every candidate, exactly
    gained = np.array([m[3] for m in moves])
    used = np.maximum(every - current[None, :], 0).sum(1)
    exact = np.where(np.all(every <= 0, axis=1), gained / np.maximum(used, 1e-12), -np.inf)
    assert np.isfinite(exact).sum() >= 2  # a real choice
    packed = evaluate.pack(layers, changes)
    rng = np.random.default_rng(0)
    guesses = [None, np.argsort(exact)[:3], rng.choice(len(moves), 5, replace=False), np.array([], dtype=int)]
    for likely in guesses:
        score, viol = _fill_scores(packed, gained, current, evaluate, likely)
        best = int(np.argmax(score))
        assert best == int(np.argmax(exact)) and score[best] == exact[best]
        np.testing.assert_array_equal(viol[best], every[best])


@pytest.mark.parametrize("name", ["mixed-30-both-free-full-31", "dense-30-memory-free-full-33"])
def test_screened_repair_scores_decide_as_scoring_every_candidate_exactly(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At each of 12 repair moves (one unit at a time), the screened scores pick the exact best and
    order the exact best rows on 8 distinct layers as scoring every row exactly does, while scoring
    only some rows exactly."""
    from autocompress_opt.search.inner import candidates
    from autocompress_opt.search.inner.candidates import exact_repair_scores, repair_scores

    monkeypatch.setattr(candidates, "DELTA_MIN_CELLS", 0)  # screen these small stacks too
    from autocompress_opt.search.inner.discretise import _applied, _Evaluator, _Shrinks, _unit_values

    case = next(c for c in repair_cases() if c.name == name)
    parent = _parent(case.parent, case.depth)
    masks, importance = _masks(parent, case.seed, case.full)
    tight = Budget(num_layers=case.depth * 2 // 3, hidden_size=256, ffn_width=512, num_kv_heads=2, q_per_kv=2)
    budget = tight if case.binds == "both" else Budget.of(parent)
    goal = CostGoal.for_target(_LATENCY if case.binds == "both" else _MEMORY, parent)
    values, evaluate = _unit_values(masks, importance), _Evaluator(masks, budget, goal)
    layers, shrinks = masks.discrete(), _Shrinks(values, evaluate, None)
    current, screened_rows = evaluate(layers)[0], 0
    for _ in range(12):
        candidates, packed = shrinks(layers)
        lost = np.array([c[3] for c in candidates]) + 1e-12
        exact, exact_viol = exact_repair_scores(packed, lost, current, evaluate)
        score, viol = repair_scores(packed, lost, current, evaluate, 8)
        best = int(np.argmin(exact))
        assert int(np.argmin(score)) == best and score[best] == exact[best]
        np.testing.assert_array_equal(viol[best], exact_viol[best])
        order, layers_seen = np.argsort(exact, kind="stable"), set()
        for j in order:  # the exact prefix spanning 8 layers: scored exactly and in the same order
            assert score[j] == exact[j]
            layers_seen.add(candidates[j][1])
            if len(layers_seen) == 8:
                break
        np.testing.assert_array_equal(
            np.argsort(score, kind="stable")[: order.tolist().index(j) + 1], order[: order.tolist().index(j) + 1]
        )
        screened_rows += int(np.isfinite(score).sum())
        layers, current = _applied(layers, candidates[best][1], candidates[best][2]), exact_viol[best]
    assert screened_rows < 12 * len(candidates) // 2  # most rows were never scored exactly


if __name__ == "__main__":  # regenerate from the reference implementation (module doc)
    results = {case.name: run(case) for case in cases()}
    GOLDEN.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(results)} cases to {GOLDEN}", file=sys.stderr)
