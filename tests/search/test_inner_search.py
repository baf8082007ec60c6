"""The inner loop: learnable masks over a frozen parent, the Lagrangian with the differentiable cost
model, and discretise → repair → fill judged by the exact cost model (tiny random Llama parents)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inner_helpers import FAST, TIGHT
from inner_helpers import TinyParent as Parent
from mask_helpers import randomise
from tiny_families import tokens

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for, architecture_mismatch
from autocompress_opt.prune.loadability import ShapeRules
from autocompress_opt.prune.slicing import materialize
from autocompress_opt.search.inner import inner_search
from autocompress_opt.search.inner.budget import Budget, CostGoal, cost_arrays, expected_of
from autocompress_opt.search.inner.discretise import discretise, shape_problems
from autocompress_opt.search.inner.inner_search import CANDIDATES, InnerConfig, objective
from autocompress_opt.search.inner.relaxation import ParentMasks
from autocompress_opt.search.inner.teacher import teacher_log_probs
from autocompress_opt.serving.costmodel import METRICS, ArchArrays, estimate_batch, estimate_cost
from autocompress_opt.serving.targets import Target, device_fit_violation


@pytest.fixture(scope="module")
def parent() -> Parent:
    return Parent()


def layer_equivalents(arch: Any) -> float:
    """Kept sub-blocks, half a layer each: what the layer budget counts."""
    return sum(s.attention + s.ffn for s in arch.layers) / 2


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


# ----------------------------------------------------------------------------- masks
def test_gradients_reach_every_mask_parameter(parent: Parent) -> None:
    """Under binding budgets and a hardware goal, one Lagrangian batch gives every mask parameter a
    finite, non-zero gradient (no stale graph, no saturated relaxation at the start)."""
    masks = ParentMasks(parent.arch, parent.importance, hidden_size=TIGHT.hidden_size)
    goal = CostGoal.for_target(Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.9x"}), parent.arch)
    gen = torch.Generator().manual_seed(0)
    with masks.install(parent.model):
        assert not any(p.requires_grad for p in parent.model.parameters())  # the parent is frozen
        loss, _kl, violations = objective(
            parent.model,
            masks,
            parent.tokens[:2],
            parent.teacher[:2],
            budget=TIGHT,
            goal=goal,
            tau=0.5,
            duals={},
            config=FAST,
            generator=gen,
        )
        assert all(violations[k] > 0 for k in TIGHT.limits())  # every budget binds
        loss.backward()
    for name, p in masks.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert (p.grad != 0).all(), f"{name}: {p.grad}"
    assert all(p.grad is None for p in parent.model.parameters())


def _call_hooks_on_meta(model: Any, hidden: int) -> int:
    """Call every forward (pre-)hook installed on ``model`` with ``meta`` activations of the module's
    shape (a module that is not a Linear is moved to ``meta`` first, as its weights would be on the
    activations' device); returns how many hooks ran. Mixing in a CPU tensor raises, as on CUDA."""
    n = 0
    for module in model.modules():
        pre, post = list(module._forward_pre_hooks.values()), list(module._forward_hooks.values())
        if not pre and not post:
            continue
        if isinstance(module, torch.nn.Linear):
            x = torch.empty(1, 2, module.in_features, device="meta")
            y = torch.empty(1, 2, module.out_features, device="meta")
        else:
            module.to("meta")
            x = y = torch.empty(1, 2, hidden, device="meta")
        for hook in pre:
            out = hook(module, (x,))
            assert out is None or out[0].device.type == "meta"
            n += 1
        for hook in post:
            out = hook(module, (x,), y)
            assert out is None or out.device.type == "meta"
            n += 1
    return n


def test_mask_hooks_follow_the_activations_device(parent: Parent) -> None:
    """Masks away from the activations still compute: the search builds them on the parent's device
    (tests/search/test_inner_device.py), but a layer of a parent spread over several GPUs is on
    another, and ParentMasks defaults to the CPU; a hook then moves its mask to the activations'
    device, and a fixed bool mask is moved once. Checked without a GPU by feeding the hooks ``meta``
    activations, which refuse a CPU operand as CUDA would."""
    import copy

    from autocompress_opt.prune.masking import apply_masks
    from autocompress_opt.prune.plan import plan_pruning

    masks = ParentMasks(parent.arch, parent.importance, hidden_size=TIGHT.hidden_size)
    live = masks.live(0.5, sample=True, generator=torch.Generator().manual_seed(0))
    model = copy.deepcopy(parent.model)
    with masks.install(model), masks.use(live):  # float masks: heads, FFN channels, gates; hidden
        assert _call_hooks_on_meta(model, parent.arch.hidden_size) >= 4 * parent.arch.num_layers
    model = copy.deepcopy(parent.model)
    arch = masks.architecture(masks.discrete())
    with apply_masks(model, plan_pruning(parent.arch, parent.importance, arch).masks()):  # bool masks
        assert _call_hooks_on_meta(model, parent.arch.hidden_size) > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_torch_cost_model_agrees_with_estimate_cost_at_the_discrete_point(parent: Parent, seed: int) -> None:
    """The cost the loss uses (cost_arrays → estimate_batch on torch) equals the scalar estimate_cost of
    the discrete architecture, when the masks sit at that point (hard widths, 0/1 gates)."""
    masks = randomise(ParentMasks(parent.arch, parent.importance, hidden_size=40), seed)
    arch = masks.architecture(masks.discrete())
    for hardware, workload in (("rtx5080", "local-coding"), ("b200", "datacenter"), ("rtx5070", "in-game")):
        target = Target(hardware, workload)
        exact = estimate_cost(arch, hardware, target.engine_obj(), target.scenario()).to_dict()
        for structure in (masks.expected(0.5, hard=True), expected_of(arch)):
            torch_metrics = estimate_batch(
                cost_arrays(parent.arch, 40, structure), hardware, target.engine_obj(), target.scenario()
            )
            for metric in METRICS:
                assert float(torch_metrics[metric][0]) == pytest.approx(exact[metric], rel=1e-12), metric


def test_expected_structure_is_differentiable_and_matches_numpy_batch(parent: Parent) -> None:
    """Off the discrete point the torch path still equals the numpy path of the same equations."""
    masks = randomise(ParentMasks(parent.arch, parent.importance), 5, gate_scale=0.5)
    e = masks.expected(0.4)
    arrays = cost_arrays(parent.arch, parent.arch.hidden_size, e)
    as_numpy = ArchArrays(**{k: getattr(arrays, k).detach().numpy() for k in arrays.__dataclass_fields__})
    t, n = (
        estimate_batch(a, "h100-sxm", "vllm", Target("h100-sxm", "datacenter").scenario()) for a in (arrays, as_numpy)
    )
    for metric in METRICS:
        np.testing.assert_allclose(t[metric].detach().numpy(), n[metric], rtol=1e-12)
    t["tpot_ms"].sum().backward()
    assert masks.ffn_keep.grad is not None and torch.isfinite(masks.ffn_keep.grad).all()


# ----------------------------------------------------------------------------- search
def test_no_penalty_and_full_budgets_keep_the_parent(parent: Parent) -> None:
    """Identity: without constraints and with the parent's own budgets the masks stay all-ones and the
    discrete result is the parent architecture. (Gates are sampled during training, so a noisy Adam
    step can leave a deterministic mask a hair below 1; every one still rounds to kept.)"""
    result = parent.search(init="parent", steps=8)
    assert architecture_mismatch(parent.arch, result.architecture) is None
    assert result.feasible and result.moves == {"repair": 0, "fill": 0}
    live = result.learned.live(InnerConfig().tau_end, sample=False)
    for tensor in (live.attn_gate, live.ffn_gate, live.heads, live.ffn):
        assert torch.all(tensor >= 0.97), tensor
    rounded = result.learned.live(0.0, sample=False)
    assert torch.equal(rounded.heads, torch.ones_like(rounded.heads))
    assert torch.equal(rounded.ffn, torch.ones_like(rounded.ffn))
    assert bool((result.learned.attn_log_alpha > 0).all() and (result.learned.ffn_log_alpha > 0).all())


def test_search_is_deterministic_given_a_seed(parent: Parent) -> None:
    goal = CostGoal.for_target(Target("h100-sxm", "datacenter", constraints={"tpot_ms": "0.9x"}), parent.arch)
    a, b = (parent.search(TIGHT, goal, seed=3) for _ in range(2))
    assert a.architecture == b.architecture and a.history == b.history
    c = parent.search(TIGHT, goal, seed=4)
    assert c.history != a.history


def test_budgets_are_respected_and_the_plan_materialises(parent: Parent) -> None:
    result = parent.search(TIGHT)
    arch = result.architecture
    assert result.feasible and arch.num_layers == parent.arch.num_layers
    assert layer_equivalents(arch) <= TIGHT.num_layers and arch.hidden_size == TIGHT.hidden_size
    assert sum(s.ffn_width for s in arch.layers) <= TIGHT.num_layers * TIGHT.ffn_width
    assert sum(s.num_heads for s in arch.layers) <= TIGHT.num_layers * TIGHT.num_kv_heads * TIGHT.q_per_kv
    assert all(s.ffn_width % 16 == 0 for s in arch.layers)  # FFN 48 allows units of 16
    child = materialize(parent.model, result.plan)
    assert architecture_mismatch(arch.active(), adapter_for(child).architecture(child)) is None


def test_the_shared_width_step_moves_layers_apart_where_adam_moves_them_in_lockstep(parent: Parent) -> None:
    """``width_step``: one step from the same start moves the KV-group keep-fraction of every layer
    that has a gradient by the same amount under elementwise Adam (``lr``), and by amounts that
    differ between layers under ``shared`` (each in proportion to its gradient)."""
    start = parent.search(TIGHT, steps=0).learned.kv_keep.detach()
    moved = {}
    for rule in ("adam", "shared"):
        step = parent.search(TIGHT, steps=1, width_step=rule).learned.kv_keep.detach() - start
        moved[rule] = step.abs()[step != 0]
    assert len(moved["adam"]) >= 2 and len(moved["shared"]) == len(moved["adam"])
    assert torch.allclose(moved["adam"], torch.full_like(moved["adam"], InnerConfig().lr), rtol=0.01)
    assert float(moved["shared"].max()) > 2 * float(moved["shared"].min())


# ----------------------------------------------------------------------------- selection
def unnamed(arch: Any) -> Any:
    return replace(arch, name="")


def test_the_uniform_allocation_is_returned_when_its_held_out_kl_is_the_lowest(
    parent: Parent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Synthetic held-out KL (0.1 for the uniform allocation, 1.0 for anything else): the search
    returns the uniform allocation as it is — budgets met, plan materialising — and records every
    candidate's KL and which one won."""
    budget = Budget(num_layers=2, hidden_size=48, ffn_width=32, num_kv_heads=1, q_per_kv=2)
    uniform = parent.uniform(budget)

    def fake_kl(model: Any, par: Any, imp: Any, arch: Any, rows: Any, adapter: Any) -> list[float]:
        return [0.1 if unnamed(arch) == unnamed(uniform) else 1.0] * rows.count

    monkeypatch.setattr(inner_search, "_row_kls", fake_kl)
    # Start from the parent so the trained and start points differ from the uniform allocation.
    result = parent.search(budget, start=uniform, init="parent", steps=2)
    assert unnamed(result.architecture) == unnamed(uniform) and result.feasible
    assert unnamed(result.architecture) != unnamed(parent.search(budget, init="parent", steps=2).architecture)
    assert result.selection["chosen"] == "uniform"
    assert result.choice() == {
        "chosen": "uniform",
        "val_kl": {"trained": 1.0, "start": 1.0, "uniform": 0.1},
        "feasible": {"trained": True, "start": True, "uniform": True},
        "start_from": "importance",
    }
    child = materialize(parent.model, result.plan)
    assert architecture_mismatch(uniform.active(), adapter_for(child).architecture(child)) is None


@pytest.mark.parametrize(
    "budget, changes",
    [
        (TIGHT, {}),
        (Budget(num_layers=2, hidden_size=48, ffn_width=32, num_kv_heads=1, q_per_kv=2), {"init": "parent"}),
        (Budget(num_layers=1, hidden_size=48, ffn_width=48, num_kv_heads=2, q_per_kv=3), {"steps": 0, "fill": False}),
    ],
)
def test_the_returned_candidate_has_the_lowest_held_out_kl_of_the_feasible_ones(
    parent: Parent, budget: Budget, changes: dict[str, Any]
) -> None:
    """Real held-out KL: every candidate (trained, start, uniform) is measured and recorded, and the
    returned one is feasible with a KL no higher than any feasible candidate's — in particular never
    above the uniform allocation's — unless that lower KL was a heterogeneous candidate's lead that
    its paired interval did not resolve (then the uniform one is returned, and the record says so).
    When every name holds one architecture, nothing is measured."""
    result = parent.search(budget, start=parent.uniform(budget), **changes)
    choice = result.choice()
    assert set(choice["val_kl"]) == set(CANDIDATES) and choice["chosen"] in CANDIDATES
    assert all(choice["feasible"].values()) and result.feasible
    kls = choice["val_kl"]
    if len({unnamed(a) for a in result.candidates.values()}) == 1:
        assert set(kls.values()) == {None}
        return
    assert None not in kls.values()
    if kls[choice["chosen"]] > min(kls.values()):
        assert choice["paired"]["reference"] == choice["chosen"] and not choice["paired"]["won"]
        assert result.architecture.active().is_uniform
    assert kls[choice["chosen"]] <= kls["uniform"]


def test_an_infeasible_uniform_allocation_is_recorded_but_never_returned(parent: Parent) -> None:
    """The parent's own sizes under caps only a smaller model meets: the uniform allocation (the
    parent) breaks them, so it is listed as infeasible with no KL, and a repaired point is returned."""
    caps = {"tpot_ms": "0.99x", "output_throughput_tok_s": "1.01x"}
    goal = CostGoal.for_target(Target("h100-sxm", "datacenter", constraints=caps), parent.arch)
    budget = Budget.of(parent.arch)
    result = parent.search(budget, goal, start=parent.uniform(budget))
    assert result.selection["uniform"]["feasible"] is False
    assert result.choice()["val_kl"]["uniform"] is None
    assert result.selection["chosen"] != "uniform" and result.feasible


def test_without_an_init_there_is_no_uniform_candidate(parent: Parent) -> None:
    result = parent.search(TIGHT)
    assert set(result.choice()["val_kl"]) == {"trained", "start"}


TARGETS = [("rtx5070", "in-game"), ("rtx5080", "local-coding"), ("h100-sxm", "datacenter"), ("b200", "datacenter")]
METRIC_CHOICES = ["ttft_ms", "tpot_ms", "peak_memory_gib", "output_throughput_tok_s", "e2e_latency_ms"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    target=st.sampled_from(TARGETS),
    limits=st.dictionaries(st.sampled_from(METRIC_CHOICES), st.floats(0.3, 1.3), max_size=2),
    layers=st.integers(1, 3),
    ffn=st.sampled_from([16, 32, 48]),
    kv=st.integers(1, 2),
    q=st.integers(1, 3),
    steps=st.integers(0, 2),
)
def test_result_is_feasible_by_the_exact_cost_model_or_reported_infeasible(
    parent: Parent,
    target: tuple[str, str],
    limits: dict[str, float],
    layers: int,
    ffn: int,
    kv: int,
    q: int,
    steps: int,
) -> None:
    """Property: never a false "feasible". The verdict is recomputed here from estimate_cost, the
    workload's constraints and the device-fit constraint; an infeasible result lists a positive violation."""
    hardware, workload = target
    tgt = Target(hardware, workload, constraints={m: f"{v:.3f}x" for m, v in limits.items()})
    goal = CostGoal.for_target(tgt, parent.arch)
    budget = Budget(num_layers=layers, hidden_size=48, ffn_width=ffn, num_kv_heads=kv, q_per_kv=q)
    result = parent.search(budget, goal, steps=steps)
    arch = result.architecture
    metrics = estimate_cost(arch, hardware, tgt.engine_obj(), tgt.scenario()).to_dict()
    values = [
        *tgt.resolved_workload().violations(metrics, goal.parent_metrics).values(),
        device_fit_violation(metrics, tgt),
    ]
    values += [
        layer_equivalents(arch) / layers - 1,
        sum(s.ffn_width for s in arch.layers) / (layers * ffn) - 1,
        sum(s.num_heads for s in arch.layers) / (layers * kv * q) - 1,
        sum(s.num_kv_heads for s in arch.layers) / (layers * kv) - 1,
    ]
    truly_feasible = all(v <= 0 for v in values)
    assert result.feasible == truly_feasible
    if not result.feasible:
        assert max(result.violations.values()) > 0
    assert arch.num_active_layers >= 1


def test_the_layer_budget_counts_sub_blocks_so_depth_can_move_between_them(parent: Parent) -> None:
    """Two full layers of budget: the discrete result may keep three FFN blocks and one attention
    block (2 layer equivalents) — never more than four sub-blocks — and capping drops sub-blocks of
    the lowest-scored layers first, not whole layers."""
    from autocompress_opt.search.inner.discretise import _cap_layers, _unit_values
    from autocompress_opt.search.inner.relaxation import DiscreteLayer

    masks = ParentMasks(parent.arch, parent.importance)
    values = _unit_values(masks, parent.importance)
    full = [DiscreteLayer(True, 2, 3, True, 3, score) for score in (3.0, 1.0, 2.0)]
    capped = _cap_layers(full, 2, values)
    assert sum(d.attention + d.ffn for d in capped) == 4
    assert capped[0] == full[0] and capped[2] == full[2]  # layer 1 has the lowest gate score
    assert not (capped[1].attention and capped[1].ffn)
    odd = _cap_layers(full, 1, values)  # 1 layer = 2 sub-blocks: layer 1 goes, then half of layer 2
    assert sum(d.attention + d.ffn for d in odd) == 2 and odd[0] == full[0]
    budget = Budget(num_layers=2, hidden_size=48, ffn_width=48, num_kv_heads=2, q_per_kv=3)
    arch = parent.search(budget).architecture
    assert layer_equivalents(arch) <= 2


def test_masks_that_drop_every_layer_still_discretise_to_a_decoder(parent: Parent) -> None:
    """All gates closed: discretisation revives the best-scored layer (a decoder needs one), and an
    unreachable constraint is reported infeasible with its violation, never as feasible."""
    masks = ParentMasks(parent.arch, parent.importance)
    with torch.no_grad():
        masks.attn_log_alpha.fill_(-5.0)
        masks.ffn_log_alpha.copy_(torch.tensor([-5.0, -4.0, -6.0]))
    goal = CostGoal.for_target(Target("rtx5070", "in-game", constraints={"ttft_ms": "0.01x"}), parent.arch)
    result = discretise(masks, parent.importance, Budget.of(parent.arch), goal)
    assert result.architecture.num_active_layers == 1 and result.architecture.layers[1].ffn
    assert not result.feasible and result.violations["ttft_ms <= 0.01x"] > 0


# ----------------------------------------------------------------------------- config & caches
def test_inner_config_rejects_unknown_keys_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        InnerConfig.from_dict({"step": 3})
    with pytest.raises(ConfigError, match="batch_size"):
        InnerConfig(batch_size=0)
    assert InnerConfig.from_dict({"steps": 3}).steps == 3


def test_teacher_log_probs_are_cached_in_process_and_on_disk(parent: Parent, tmp_path: Any) -> None:
    from autocompress_opt.search.inner.teacher import clear_teacher_memory

    ids = tokens(3, 8, seed=9)
    first = teacher_log_probs(parent.model, ids, parent_id="tiny", data_id="d", cache_dir=tmp_path)
    assert teacher_log_probs(parent.model, ids, parent_id="tiny", data_id="d", cache_dir=tmp_path) is first
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    clear_teacher_memory()
    again = teacher_log_probs(parent.model, ids, parent_id="tiny", data_id="d", cache_dir=tmp_path)
    assert again is not first and torch.equal(again, first)
    expected = torch.log_softmax(logits(parent.model, ids), dim=-1)
    torch.testing.assert_close(first.float(), expected, atol=2e-2, rtol=1e-3)  # stored as float16


# ----------------------------------------------------------------------------- engine relaxation
def engine_search(parent: Parent, rules: ShapeRules, budget: Budget, **config: Any) -> Any:
    cfg = InnerConfig(**{**FAST.to_dict(), **config})
    return inner_search.search(
        parent.model, parent.arch, parent.importance, parent.tokens, parent.teacher,
        budget=budget, goal=None, config=cfg, init=parent.uniform(budget), rules=rules,
    )  # fmt: skip


def keep_fractions(masks: ParentMasks) -> tuple[torch.Tensor, torch.Tensor]:
    return masks.kv_keep.detach().clone(), masks.q_keep.detach().clone()


def test_under_rules_that_fix_the_query_heads_the_head_masks_stay_at_the_legal_start(parent: Parent) -> None:
    """Rules keeping 3 query heads in every attention layer: the engine relaxation trains no head
    masks (they stay where the legal start point put them, so the trained point is one the rules
    already allow); without it they move and are snapped back only when discretised."""
    rules = ShapeRules("vllm", ffn_multiple=16, query_heads=3)
    budget = Budget(num_layers=2, hidden_size=40, ffn_width=32, num_kv_heads=1, q_per_kv=3)
    start_of = lambda r: ParentMasks(parent.arch, parent.importance, hidden_size=40, init=r.candidates["start"])
    legal = engine_search(parent, rules, budget)
    assert torch.equal(torch.stack(keep_fractions(legal.learned)), torch.stack(keep_fractions(start_of(legal))))
    assert all((d.kv_groups, d.q_per_group) == (1, 3) for d in legal.learned.discrete() if d.attention)
    assert legal.learned.ffn_keep.detach().ne(start_of(legal).ffn_keep.detach()).any()  # the FFN still trains
    free = engine_search(parent, rules, budget, engine_relaxation=False)
    assert not torch.equal(torch.stack(keep_fractions(free.learned)), torch.stack(keep_fractions(start_of(free))))
    for result in (legal, free):
        assert shape_problems(result.architecture, rules) == [] and result.feasible


@pytest.mark.parametrize(("multiple", "unit"), [(48, 48), (32, 16)])
def test_the_engine_relaxation_trains_the_ffn_in_the_engines_multiple_where_it_divides_the_parent(
    parent: Parent, multiple: int, unit: int
) -> None:
    """FFN 48 per layer: an engine multiple of 48 becomes the relaxation's unit; 32 does not divide
    48, so the default unit (16) stays and discretisation moves in steps of two; ``ffn_unit`` set
    explicitly, or the relaxation off, keep their unit."""
    rules = ShapeRules("vllm", ffn_multiple=multiple, query_heads=None)
    budget = Budget(num_layers=3, hidden_size=40, ffn_width=48, num_kv_heads=2, q_per_kv=3)
    result = engine_search(parent, rules, budget)
    assert result.learned.ffn_unit == unit
    assert all(s.ffn_width % multiple == 0 for s in result.candidates["trained"].layers if s.ffn)
    assert engine_search(parent, rules, budget, engine_relaxation=False).learned.ffn_unit == 16
    assert engine_search(parent, rules, budget, ffn_unit=8).learned.ffn_unit == 8


# ------------------------------------------------------------- the choice on paired rows
def _choice_between(parent: Parent, per_row: dict[str, list[float]], margin: float = 0.0) -> dict[str, Any]:
    """``_select`` over a heterogeneous ``trained`` candidate and the ``uniform`` allocation of one
    budget, their per-row choice KLs given (no model run); returns the selection record."""
    budget = Budget(num_layers=2, hidden_size=48, ffn_width=32, num_kv_heads=1, q_per_kv=2)
    uniform = parent.uniform(budget)
    first = next(i for i, layer in enumerate(uniform.layers) if layer.ffn)
    layers = list(uniform.layers)
    layers[first] = replace(layers[first], ffn_width=layers[first].ffn_width // 2)
    hetero = replace(uniform, layers=layers)
    assert hetero.active().is_uniform is False and uniform.active().is_uniform
    pairs = (("trained", hetero), ("uniform", uniform))
    candidates = {name: inner_search._as_candidate(arch, budget, None) for name, arch in pairs}
    n = len(per_row["uniform"])
    rows = inner_search._RowKLs(torch.zeros((n, 4), dtype=torch.long), torch.zeros((n, 4, 8)), batch_size=2)
    for name, cand in candidates.items():
        rows.held[replace(cand.architecture, name="")] = list(per_row[name])
    _, record = inner_search._select(candidates, parent.model, parent.arch, parent.importance, rows, None, margin)  # type: ignore[arg-type]
    return record


def test_a_candidate_whose_kl_is_not_finite_is_never_chosen(parent: Parent) -> None:
    """A NaN on one choice row (a diverged forward pass) disqualifies the candidate, however low its
    other rows: the finite one is returned (the old key scored a non-finite KL as 0.0, the best)."""
    record = _choice_between(parent, {"trained": [0.0, math.nan] + [0.0] * 14, "uniform": [1.0] * 16})
    assert record["chosen"] == "uniform"
    assert math.isnan(record["trained"]["val_kl"]) and record["uniform"]["val_kl"] == 1.0


def test_a_heterogeneous_candidate_replaces_uniform_only_when_it_wins_beyond_its_interval(parent: Parent) -> None:
    """Paired per-row differences on 16 rows: a lead of 0.02 nats with a per-row spread of 0.3 is
    noise (uniform kept, the interval recorded); a steady lead of 0.05 resolves and wins; the
    same lead under a 0.1-nat margin does not."""
    rng = np.random.default_rng(0)
    uniform = list(1.0 + rng.normal(0, 0.3, 16))
    noisy = [u - 0.02 + float(e) for u, e in zip(uniform, rng.normal(0, 0.3, 16), strict=True)]
    steady = [u - 0.05 + float(e) for u, e in zip(uniform, rng.normal(0, 0.01, 16), strict=True)]

    record = _choice_between(parent, {"trained": noisy, "uniform": uniform})
    if sum(noisy) < sum(uniform):  # the lower mean, yet unresolved
        assert record["paired"]["candidate"] == "trained" and record["paired"]["reference"] == "uniform"
        assert record["paired"]["low"] < 0 < record["paired"]["high"] and not record["paired"]["won"]
    assert record["chosen"] == "uniform"

    record = _choice_between(parent, {"trained": steady, "uniform": uniform})
    assert record["chosen"] == "trained" and record["paired"]["won"] and record["paired"]["rows"] == 16
    assert record["paired"]["diff"] == pytest.approx(-0.05, abs=0.01)

    record = _choice_between(parent, {"trained": steady, "uniform": uniform}, margin=0.1)
    assert record["chosen"] == "uniform" and not record["paired"]["won"]
