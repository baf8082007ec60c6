"""The inner search over experts of a tiny random Qwen3-MoE (issue 30): masks decide which experts and
expert channels each MoE layer keeps, the trial's point how many; the child is legal, its cost counts
expert parameters by the arch's formulas, and a weights-mode study completes on it end to end."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_families import TINY_MOE, tiny_model, tiny_moe_importance, tiny_moe_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_kind_uniform
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.experts import expert_masks, slice_experts
from autocompress_opt.prune.importance import Importance
from autocompress_opt.prune.masking import apply_masks
from autocompress_opt.quality.metrics import log_probs
from autocompress_opt.search.inner.experts import (
    ExpertMasks,
    discretise_experts,
    expert_param_totals,
    expert_point,
    search_experts,
)
from autocompress_opt.search.inner.inner_search import InnerConfig

POINT = {"num_experts": 4, "experts_per_token": 2, "expert_width": 8}
CONFIG = InnerConfig(steps=6, batch_size=2, seq_len=16, n_samples=6, val_samples=2, gate_lr=1.0)


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    return tiny_moe_model()


@pytest.fixture(scope="module")
def parent(model: Any) -> Architecture:
    return moe_adapter(model).architecture(model)


@pytest.fixture(scope="module")
def importance(model: Any) -> Importance:
    return tiny_moe_importance(model)


@pytest.fixture(scope="module")
def data(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    rows = tokens(6, 16, seed=3)
    with torch.no_grad():
        return rows, log_probs(model(rows).logits)


def _kept(masks: Any, layer: int) -> list[int]:
    return torch.nonzero(masks.layers[layer].experts).flatten().tolist()


def test_param_totals_follow_the_arch_formulas(parent: Architecture) -> None:
    """At integer sizes the differentiable totals equal MoESpec.params / active_params of the sized child."""
    from dataclasses import replace

    experts, width = torch.tensor([4.0, 6.0], dtype=torch.float64), torch.tensor([8.0, 12.0], dtype=torch.float64)
    got = expert_param_totals(parent, experts, width, 2)
    specs = [layer.moe for layer in parent.layers if layer.moe is not None]
    sized = [replace(s, num_experts=int(e), expert_width=int(w)) for s, e, w in zip(specs, experts, width)]
    d = parent.hidden_size
    assert float(got["total"]) == sum(s.params(d) for s in sized)
    assert float(got["active"]) == sum(s.active_params(d) for s in sized)
    experts.requires_grad_(True)
    expert_param_totals(parent, experts, width, 2)["total"].backward()
    assert experts.grad is not None and bool((experts.grad > 0).all())  # one more expert costs parameters


def test_start_masks_are_the_importance_choice(model: Any, parent: Architecture, importance: Importance) -> None:
    start = expert_masks(model, importance, POINT)
    masks = ExpertMasks(moe_adapter(model).all_layer_parts(model), importance, POINT, start)
    chosen = discretise_experts(masks, parent)
    for i in (0, 2):
        assert torch.equal(chosen.layers[i].experts, start.layers[i].experts)
        kept = start.layers[i].experts
        assert torch.equal(chosen.layers[i].expert_ffn[kept], start.layers[i].expert_ffn[kept])


def test_soft_masks_route_like_the_hard_masks_when_sharp(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """At τ → 0 the relaxation computes what apply_masks computes with the discretised masks."""
    start = expert_masks(model, importance, POINT)
    masks = ExpertMasks(moe_adapter(model).all_layer_parts(model), importance, POINT, start)
    ids = tokens(2, 12, seed=5)
    with torch.no_grad():
        with apply_masks(model, discretise_experts(masks, parent), adapter=moe_adapter(model)):
            expected = model(ids).logits
        with masks.install(), masks.use(masks.live(0.0)):
            got = model(ids).logits
    torch.testing.assert_close(got, expected)


def test_masks_change_which_experts_are_kept(model: Any, parent: Architecture, importance: Importance) -> None:
    """Scores that prefer other experts than importance does change the kept set, not its size; the
    training gradient reaches both score tensors."""
    start = expert_masks(model, importance, POINT)
    masks = ExpertMasks(moe_adapter(model).all_layer_parts(model), importance, POINT, start)
    with torch.no_grad():
        masks.expert_score.neg_()  # the least important experts first
    chosen = discretise_experts(masks, parent)
    for i in (0, 2):
        assert int(chosen.layers[i].experts.sum()) == POINT["num_experts"]
        assert not set(_kept(chosen, i)) & set(_kept(start, i))
    masks = ExpertMasks(moe_adapter(model).all_layer_parts(model), importance, POINT, start)
    with masks.install(), masks.use(masks.live(0.5)):
        model(tokens(2, 12, seed=6)).logits.square().mean().backward()
    assert masks.expert_score.grad is not None and bool(masks.expert_score.grad.abs().sum() > 0)
    assert masks.channel_score.grad is not None and bool(masks.channel_score.grad.abs().sum() > 0)


def test_search_returns_a_legal_child_that_slices(
    model: Any, parent: Architecture, importance: Importance, data: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """The discretised child keeps the point's counts in every MoE layer, is kind-uniform, meets its
    budgets, and slices into a plain model whose logits equal the masked parent's; the selection
    returns the candidate with the lower held-out KL."""
    rows, teacher = data
    steps: list[int] = []
    result = search_experts(
        model,
        parent,
        importance,
        rows,
        teacher,
        params=POINT,
        goal=None,
        config=CONFIG,
        on_step=lambda s, k, v: steps.append(s),
    )
    assert steps == list(range(1, CONFIG.steps + 1)) and len(result.history) == CONFIG.steps
    assert result.feasible and all(v <= 1e-12 for v in result.violations.values())
    assert is_kind_uniform(result.architecture)
    moe = {layer.moe for layer in result.architecture.layers if layer.moe is not None}
    assert {(m.num_experts, m.experts_per_token, m.expert_width) for m in moe} == {(4, 2, 8)}
    kls = result.choice()["val_kl"]
    assert set(kls) == {"trained", "start"} and kls[result.selection["chosen"]] == min(kls.values())
    child = slice_experts(model, result.masks)
    assert Architecture.from_hf_config(child.config).num_params == result.architecture.num_params
    ids = tokens(2, 12, seed=7)
    with torch.no_grad(), apply_masks(model, result.masks, adapter=moe_adapter(model)):
        masked = model(ids).logits
    torch.testing.assert_close(child(ids).logits, masked)


def test_a_bad_moe_point_gives_a_clear_error(parent: Architecture) -> None:
    with pytest.raises(ConfigError, match=r"hidden_size=32 prunes an axis of a MoE parent.*valid: hidden_size=48"):
        expert_point({**POINT, "hidden_size": 32}, parent)
    with pytest.raises(ConfigError, match=r"num_experts=9 is outside 1\.\.8"):
        expert_point({"num_experts": 9}, parent)
    with pytest.raises(ConfigError, match=r"experts_per_token=2 exceeds num_experts=1"):
        expert_point({"num_experts": 1, "experts_per_token": 2}, parent)
    with pytest.raises(ConfigError, match=r"mamba_heads=4: the parent has no sub-block for it"):
        expert_point({"mamba_heads": 4}, parent)


@pytest.mark.slow
def test_a_weights_study_on_a_moe_parent_completes_and_its_best_trial_exports(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Ray + Optuna driver runs weights-mode trials on a saved tiny Qwen3-MoE whose space varies the
    expert counts only; each trial stores its kept experts, and the best trial's export loads in
    transformers with the logits of the parent under those masks."""
    import ray
    from tiny_lm import save_hf_dir
    from transformers import AutoModelForCausalLM

    from autocompress_opt.arch.hybrid import sparse_limits
    from autocompress_opt.arch.search_space import Choice, SearchSpace
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.expert_kept import masks_from_expert_kept
    from autocompress_opt.search.study import StudyConfig, export_trial, init_ray, load_records, run_study, trial_model
    from autocompress_opt.serving.targets import Target

    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    model_dir = save_hf_dir(tiny_model("qwen3_moe", **TINY_MOE, vocab_size=260), tmp_path / "moe")
    parent = load_model(model_dir).architecture
    fixed = [Choice(k, (v,)) for k, v in sparse_limits(parent).items() if k not in POINT]
    space = SearchSpace(
        (*fixed, Choice("num_experts", (4, 6)), Choice("experts_per_token", (1, 2)), Choice("expert_width", (8, 16)))
    )
    target = Target("h100-sxm", "datacenter")
    inner = {"steps": 2, "n_samples": 4, "val_samples": 1, "seq_len": 16, "eval_samples": 2, "eval_seq_len": 16}
    cfg = StudyConfig(
        name="moe",
        model=str(model_dir),
        targets=(target,),
        space=space,
        mode="weights",
        inner={**inner, "importance_samples": 2, "importance_seq_len": 16},
        trials=3,
        storage=f"sqlite:///{tmp_path}/studies.db",
        concurrency=1,
        serve_as="any",
        seed_baselines=False,
        proxy=0,
    )
    init_ray(None, 1, ())
    try:
        [outcome] = run_study(cfg, progress=False)
        assert outcome.complete == 3
    finally:
        ray.shutdown()
    records, _ = load_records(cfg.storage_url, cfg.study_name(target))
    done = [r for r in records if r.state == "COMPLETE"]
    assert len(done) == 3
    for r in done:
        assert r.kept["format"] == "autocompress-kept-experts/2" and len(r.kept["layers"]) == 2
        assert r.selection["chosen"] in ("trained", "start")
    best = min(done, key=lambda r: -r.quality)
    arch = Architecture.from_dict(best.architecture)
    loaded, _ = trial_model(str(model_dir), {"device": "cpu", "compute_dtype": "fp32"})
    exported = export_trial(loaded, arch, tmp_path / "out", kept=best.kept)
    child = AutoModelForCausalLM.from_pretrained(exported.path)
    ids = tokens(2, 12, seed=8)
    masks = masks_from_expert_kept(loaded.architecture, best.kept)
    with torch.no_grad(), apply_masks(loaded.model, masks, adapter=moe_adapter(loaded.model)):
        masked = loaded.model(ids).logits
    with torch.no_grad():
        torch.testing.assert_close(child(ids).logits, masked)
    assert child.config.num_experts == best.params["num_experts"]
