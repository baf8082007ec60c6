"""A seeded baseline's own model is a candidate of the trial of its point, so a study seeded with the
baselines never returns, for that point, worse (on the held-out calibration KL) than the baseline's
model itself, whatever layers the baseline kept (issue 12: the study must not lose to a uniform
model it could have found)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import optuna
import pytest
from inner_helpers import TinyParent

from autocompress_opt.arch.search_space import CHOICES, uniform_allocation
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.inner import inner_search
from autocompress_opt.search.inner.budget import Budget
from autocompress_opt.search.inner.inner_search import CANDIDATES
from autocompress_opt.search.study.searcher import baseline_candidates


@pytest.fixture(scope="module")
def parent() -> TinyParent:
    return TinyParent()


def unnamed(arch: Any) -> Any:
    return replace(arch, name="")


def test_a_baseline_model_is_weighed_and_returned_when_it_has_the_lowest_held_out_kl(
    parent: TinyParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's layers kept in the reverse of the importance order (another depth criterion):
    same sizes as the trial's uniform allocation, other layers. With the lowest (synthetic) KL it is
    returned as it is, and every candidate's KL is recorded under its name."""
    point = {"num_layers": 2, "hidden_size": 48, "ffn_width": 32, "num_kv_heads": 1, "q_per_kv": 2}
    assert set(point) == set(CHOICES)
    budget = Budget(**point)
    uniform = parent.uniform(budget)
    other = parent.uniform(budget, list(reversed(parent.importance.layer_order())))
    assert unnamed(other) != unnamed(uniform)  # the baseline kept other layers

    def fake_kl(model: Any, par: Any, imp: Any, arch: Any, rows: Any, adapter: Any) -> list[float]:
        return [0.1 if unnamed(arch) == unnamed(other) else 1.0] * rows.count

    monkeypatch.setattr(inner_search, "_row_kls", fake_kl)
    result = parent.search(budget, start=uniform, extra={"depth": other}, steps=2)
    assert result.selection["chosen"] == "depth" and unnamed(result.architecture) == unnamed(other)
    assert result.choice()["val_kl"] == {"trained": 1.0, "start": 1.0, "uniform": 1.0, "depth": 0.1}


def test_a_baseline_model_that_breaks_the_budgets_is_recorded_but_never_returned(parent: TinyParent) -> None:
    point = {"num_layers": 2, "hidden_size": 48, "ffn_width": 32, "num_kv_heads": 1, "q_per_kv": 2}
    bigger = parent.uniform(Budget(**{**point, "num_layers": 3}))
    result = parent.search(Budget(**point), extra={"depth": bigger}, steps=2)
    assert result.selection["depth"]["feasible"] is False and result.choice()["val_kl"]["depth"] is None
    assert result.selection["chosen"] != "depth"


def test_candidate_names_of_the_search_itself_are_refused(parent: TinyParent) -> None:
    with pytest.raises(ConfigError, match="'uniform'.*taken"):
        parent.search(extra={"uniform": parent.arch})
    assert "uniform" in CANDIDATES


def test_a_seeded_trial_gets_the_own_models_of_the_baselines_at_its_point() -> None:
    """Only baselines named by the trial, whose seed point is the trial's and which needed no
    snapping (an ``architecture`` stored); a sampled trial gets none."""
    study = optuna.create_study()
    a, b = {"num_layers": 3, "ffn_width": 64}, {"num_layers": 2, "ffn_width": 64}
    study.set_user_attr(
        "baseline_seeds",
        {
            "depth": {"point": a, "baseline_point": a, "architecture": {"name": "depth-model"}},
            "best-uniform": {"point": a, "baseline_point": a, "architecture": {"name": "uniform-model"}},
            "minitron": {"point": b, "baseline_point": {"num_layers": 2, "ffn_width": 96}},  # snapped: none
        },
    )
    study.enqueue_trial(a, user_attrs={"baseline": "depth+best-uniform"})
    study.enqueue_trial(b, user_attrs={"baseline": "minitron"})
    dists = {
        "num_layers": optuna.distributions.IntDistribution(1, 4),
        "ffn_width": optuna.distributions.IntDistribution(32, 128, step=32),
    }
    first, second, sampled = (study.ask(dists) for _ in range(3))
    assert baseline_candidates(study, first) == {
        "depth": {"name": "depth-model"},
        "best-uniform": {"name": "uniform-model"},
    }
    assert baseline_candidates(study, second) == {}
    assert baseline_candidates(study, sampled) == {}


def test_a_seeded_trial_returns_the_baseline_model_when_it_scores_better_on_held_out_evaluation(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inner search's choice and the baseline's own model compete on the study's objective too
    (held-out evaluation KL): with the baseline's (synthetically) lower, the trial returns the
    baseline's model, records both KLs, and its quality is the baseline's."""
    import math

    from tiny_lm import save_hf_dir
    from tiny_lm import tiny_model as tiny_llama
    from weights_helpers import PARAMS, request

    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.search.study import weights_trial
    from autocompress_opt.search.study.weights_trial import clear_trial_cache, run_weights_trial

    parent_dir = save_hf_dir(tiny_llama("llama", num_hidden_layers=4), tmp_path / "llama")
    clear_trial_cache()
    req = request(parent_dir, tmp_path / "cache")
    parent = Architecture.from_dict(req["parent"])
    point = {**PARAMS, "num_layers": 2}  # small enough for the tiny target's caps
    req["params"] = point
    # The baseline kept other layers than the inner search returns (which layers that is depends on
    # the importance, and so on the calibration text: pick an order whose allocation differs).
    searched = unnamed(Architecture.from_dict(run_weights_trial(req)["architecture"]))
    orders = ([3, 2, 1, 0], [0, 1, 2, 3], [0, 3, 1, 2], [1, 2, 0, 3])
    other = next(o for o in (uniform_allocation(point, parent, order) for order in orders) if unnamed(o) != searched)
    real_quality = weights_trial._quality

    def quality(ctx: Any, arch: Any, *args: Any, **kwargs: Any) -> Any:
        out, cached = real_quality(ctx, arch, *args, **kwargs)
        kl = 0.01 if unnamed(arch) == unnamed(other) else 5.0
        return {**out, "kl_to_parent": kl}, cached

    monkeypatch.setattr(weights_trial, "_quality", quality)
    plain = run_weights_trial(req)
    seeded = run_weights_trial({**req, "baselines": {"depth": other.to_dict()}})
    assert "heldout_kl" not in plain["selection"] and plain["kl_to_parent"] == 5.0
    assert seeded["selection"]["feasible"]["depth"]  # the tiny target leaves the baseline's model feasible
    assert seeded["selection"]["chosen"] == "depth"
    assert unnamed(Architecture.from_dict(seeded["architecture"])) == unnamed(other)
    assert seeded["quality"] == pytest.approx(math.exp(-0.01))
    if "heldout_kl" in seeded["selection"]:  # the inner search chose another: the objective decided
        assert seeded["selection"]["heldout_kl"]["depth"] == 0.01


def test_a_seeded_trial_first_reports_its_baseline_s_model_as_a_complete_fallback_result(tmp_path: Any) -> None:
    """Before its inner search, a seeded weights trial measures its baseline's own model and reports
    it (phase ``baseline``) as a complete result: what the study records if the scheduler stops the
    trial. The final result's measurement of that model comes from the quality cache."""
    import json

    from tiny_lm import save_hf_dir
    from tiny_lm import tiny_model as tiny_llama
    from weights_helpers import PARAMS, request

    from autocompress_opt.arch.architecture import Architecture
    from autocompress_opt.search.study.progress import FALLBACK, PHASES, TrialProgress, reporting
    from autocompress_opt.search.study.weights_trial import clear_trial_cache, evaluate_architecture, run_weights_trial

    parent_dir = save_hf_dir(tiny_llama("llama", num_hidden_layers=4), tmp_path / "llama")
    clear_trial_cache()
    req = request(parent_dir, tmp_path / "cache")
    parent = Architecture.from_dict(req["parent"])
    point = {**PARAMS, "num_layers": 2}
    baseline = uniform_allocation(point, parent, [3, 2, 1, 0])
    heard: list[TrialProgress] = []
    with reporting(heard.append):
        result = run_weights_trial({**req, "params": point, "baselines": {"depth": baseline.to_dict()}})
    phases = [p.phase for p in heard]
    assert phases.count("baseline") == 2 and phases.index("baseline") < phases.index("inner search")
    assert [PHASES.index(p) for p in phases] == sorted(PHASES.index(p) for p in phases)
    [sent] = [p for p in heard if p.fallback is not None]
    assert FALLBACK in sent.to_result() and sent.inner_step == 0
    fallback = json.loads(sent.fallback)  # type: ignore[arg-type]
    assert fallback["selection"] == {
        "chosen": "depth",
        "heldout_kl": {"depth": fallback["kl_to_parent"]},
        "stopped_at_step": None,
    }
    assert unnamed(Architecture.from_dict(fallback["architecture"])) == unnamed(baseline)
    assert fallback["metrics"] and fallback["timings_s"]["baseline"] > 0
    measured = evaluate_architecture(
        baseline, str(parent_dir), inner=req["inner"], cache_dir=tmp_path / "cache", workload=req["target"]["workload"]
    )
    assert measured["quality_cached"] and fallback["kl_to_parent"] == measured["kl_to_parent"]
    assert result["timings_s"]["baseline"] > 0 and result["selection"]["chosen"] in {
        "depth",
        *result["selection"]["val_kl"],
    }
    plain: list[TrialProgress] = []
    with reporting(plain.append):
        run_weights_trial({**req, "params": point})
    assert "baseline" not in [p.phase for p in plain]  # a sampled trial has nothing to fall back on
