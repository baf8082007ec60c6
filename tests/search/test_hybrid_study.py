"""Weights mode on a tiny random Nemotron-H (issue 30, the hybrid half): the outer loop's point sizes the
routed experts, top-k, expert width, shared-expert width and Mamba-2 heads; the inner search learns
which experts, channels, shared channels and heads (the sigmoid router and the latent MoE replayed);
the cost counts them by the arch's formulas; trials store them (kept record v2) and a default study
exports a checkpoint whose logits are the masked parent's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import hybrid_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.hybrid import is_kind_uniform, sparse_limits
from autocompress_opt.arch.search_space import Choice, uniform_allocation
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.baselines import expert_kl_scorer
from autocompress_opt.prune.expert_kept import expert_kept, kept_model, masks_from_expert_kept
from autocompress_opt.prune.experts import expert_masks, slice_experts
from autocompress_opt.prune.importance import Importance, estimate_importance
from autocompress_opt.prune.masking import Masks, apply_masks
from autocompress_opt.quality.metrics import log_probs
from autocompress_opt.search.inner.experts import (
    ExpertMasks,
    discretise_experts,
    expert_param_totals,
    expert_point,
    mamba_param_total,
    search_experts,
)
from autocompress_opt.search.inner.inner_search import InnerConfig
from autocompress_opt.search.study import StudyConfig
from autocompress_opt.search.study.config import check_config, expert_space
from autocompress_opt.search.study.proxy import retained_expert_importance
from autocompress_opt.serving.targets import Target

MAMBA, MOE = (0, 3), (1, 5)  # tiny_families.HYBRID's Mamba-2 and MoE layers
POINT = {"num_experts": 5, "experts_per_token": 1, "expert_width": 8, "shared_width": 16, "mamba_heads": 6}
CONFIG = InnerConfig(steps=4, batch_size=2, seq_len=16, n_samples=6, val_samples=2, gate_lr=1.0)
# Tiny models cost the same at every size but for their parameters: a point of fewer active parameters
# meets this (the parent does not), the throughput held at the parent's.
TARGET = Target("h100-sxm", "datacenter", constraints={"output_throughput_tok_s": "1x", "active_params": "0.9x"})


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    return hybrid_model()


@pytest.fixture(scope="module")
def parent(model: Any) -> Architecture:
    return moe_adapter(model).architecture(model)


@pytest.fixture(scope="module")
def importance(model: Any) -> Importance:
    return estimate_importance(model, tokens(4, 12), adapter=moe_adapter(model), progress=False)


def _masks(model: Any, importance: Importance, point: dict[str, int] = POINT) -> ExpertMasks:
    start = expert_masks(model, importance, point)
    return ExpertMasks(moe_adapter(model).all_layer_parts(model), importance, point, start, scoring="sigmoid")


def _masked_logits(model: Any, masks: Masks, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), apply_masks(model, masks, adapter=moe_adapter(model)):
        return model(ids).logits


def test_a_hybrid_point_sizes_every_sparse_kind_and_bad_points_are_named(parent: Architecture) -> None:
    assert expert_point(POINT, parent) == POINT
    assert expert_point({}, parent) == {
        "num_experts": 8,
        "experts_per_token": 2,
        "expert_width": 16,
        "shared_width": 32,
        "mamba_heads": 8,
    }
    with pytest.raises(
        ConfigError, match=r"mamba_heads=5 is not a multiple of the Mamba-2 groups \(2.*valid: 2, 4, 6, 8"
    ):
        expert_point({**POINT, "mamba_heads": 5}, parent)
    with pytest.raises(ConfigError, match=r"shared_width=40 is outside 1\.\.32"):
        expert_point({**POINT, "shared_width": 40}, parent)
    with pytest.raises(ConfigError, match=r"ffn_width=24 prunes an axis .*valid: ffn_width=48.*mamba_heads free"):
        expert_point({**POINT, "ffn_width": 24}, parent)


def test_param_totals_count_shared_width_and_mamba_heads_by_the_arch_formulas(parent: Architecture) -> None:
    """At integer sizes the differentiable totals are MoESpec.params / active_params and MambaSpec.params
    of the sized child; one more shared channel or head costs parameters."""
    f64 = lambda *v: torch.tensor(v, dtype=torch.float64, requires_grad=True)
    experts, width, shared, heads = f64(5.0, 5.0), f64(8.0, 8.0), f64(16.0, 24.0), f64(6.0, 4.0)
    got = expert_param_totals(parent, experts, width, 1, shared)
    moe = [layer.moe for layer in parent.layers if layer.moe is not None]
    sized = [
        replace(m, num_experts=5, experts_per_token=1, expert_width=8, shared_width=s) for m, s in zip(moe, (16, 24))
    ]
    d = parent.hidden_size
    assert float(got["total"].detach()) == sum(s.params(d, parent.mlp_bias) for s in sized)
    assert float(got["active"].detach()) == sum(s.active_params(d, parent.mlp_bias) for s in sized)
    mamba = [layer.mamba for layer in parent.layers if layer.mamba is not None]
    total = mamba_param_total(parent, heads)
    assert float(total.detach()) == sum(replace(m, num_heads=h).params(d) for m, h in zip(mamba, (6, 4)))
    (got["active"] + total).backward()
    assert bool((shared.grad > 0).all()) and bool((heads.grad > 0).all())


def test_start_and_sharp_soft_masks_are_the_importance_choice_and_route_like_apply_masks(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """The scores start at expert_masks' choice (experts, channels, shared channels, heads); at τ → 0 the
    relaxation (sigmoid router, shared down_proj, Mamba-2 gated norm hooks) computes what apply_masks
    computes with the discretised masks."""
    masks = _masks(model, importance)
    start, chosen = expert_masks(model, importance, POINT), discretise_experts(masks, parent)
    for i in MOE:
        for name in ("experts", "shared_ffn"):
            assert torch.equal(getattr(chosen.layers[i], name), getattr(start.layers[i], name))
        kept = start.layers[i].experts
        assert torch.equal(chosen.layers[i].expert_ffn[kept], start.layers[i].expert_ffn[kept])
    for i in MAMBA:
        assert torch.equal(chosen.layers[i].mamba_heads, start.layers[i].mamba_heads)
        assert chosen.layers[i].mamba_heads.reshape(2, 4).sum(-1).tolist() == [3, 3]
    ids = tokens(2, 12, seed=5)
    with torch.no_grad(), masks.install(), masks.use(masks.live(0.0)):
        got = model(ids).logits
    torch.testing.assert_close(got, _masked_logits(model, chosen, ids))


def test_the_search_learns_every_unit_kind_and_its_masks_equal_the_sliced_child(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """Gradients reach the expert, channel, shared-channel and head scores; other scores change which
    units are kept (not how many, heads per group included); the search's masks meet the budgets, are
    kind-uniform, and slice into a Nemotron-H whose logits equal the masked parent's."""
    masks = _masks(model, importance)
    with masks.install(), masks.use(masks.live(0.5)):
        model(tokens(2, 12, seed=6)).logits.square().mean().backward()
    for score in (masks.expert_score, masks.channel_score, masks.shared_score, masks.mamba_score):
        assert score is not None and score.grad is not None and bool(score.grad.abs().sum() > 0)
    with torch.no_grad():
        masks.shared_score.neg_()
        masks.mamba_score.neg_()
    flipped, start = discretise_experts(masks, parent), expert_masks(model, importance, POINT)
    for i in MOE:
        assert int(flipped.layers[i].shared_ffn.sum()) == 16
        assert not bool((flipped.layers[i].shared_ffn & start.layers[i].shared_ffn).any())
    for i in MAMBA:
        assert flipped.layers[i].mamba_heads.reshape(2, 4).sum(-1).tolist() == [3, 3]
        assert not torch.equal(flipped.layers[i].mamba_heads, start.layers[i].mamba_heads)

    rows = tokens(6, 16, seed=3)
    with torch.no_grad():
        teacher = log_probs(model(rows).logits)
    result = search_experts(model, parent, importance, rows, teacher, params=POINT, goal=None, config=CONFIG)
    assert result.feasible and set(result.violations) == {
        "budget:expert_params",
        "budget:active_expert_params",
        "budget:mamba_params",
    }
    assert all(abs(v) <= 1e-12 for v in result.violations.values())
    arch = result.architecture
    assert is_kind_uniform(arch) and arch == uniform_allocation({**sparse_limits(parent), **POINT}, parent)
    child = slice_experts(model, result.masks)
    assert Architecture.from_hf_config(child.config).num_params == arch.num_params
    assert (child.config.moe_shared_expert_intermediate_size, child.config.mamba_num_heads) == (16, 6)
    ids = tokens(2, 12, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(child(ids).logits, _masked_logits(model, result.masks, ids))


def test_the_kept_record_holds_shared_channels_and_mamba_heads(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """Record v2 round-trips every kind of unit; a v1 record (experts only) keeps the rest whole; a
    record naming the wrong Mamba-2 layers is refused with the layers it needs."""
    masks = expert_masks(model, importance, POINT)
    record = expert_kept(masks, parent)
    assert record["format"] == "autocompress-kept-experts/2" and [e[0] for e in record["mamba"]] == list(MAMBA)
    back = masks_from_expert_kept(parent, record)
    for i in range(len(parent.layers)):
        for name in ("experts", "shared_ffn", "mamba_heads"):
            a, b = getattr(back.layers[i], name), getattr(masks.layers[i], name)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), (i, name)
    for i in MOE:  # the channels of the kept experts (a dropped expert's are not recorded)
        kept = masks.layers[i].experts
        assert torch.equal(back.layers[i].expert_ffn[kept], masks.layers[i].expert_ffn[kept])
    v1 = {"format": "autocompress-kept-experts/1", "experts_per_token": 1, "layers": [e[:3] for e in record["layers"]]}
    old = masks_from_expert_kept(parent, v1)
    assert bool(old.layers[1].shared_ffn.all()) and bool(old.layers[0].mamba_heads.all())
    with pytest.raises(ConfigError, match=r"mamba must list the parent's Mamba-2 layers \[0, 3\]"):
        masks_from_expert_kept(parent, {**record, "mamba": record["mamba"][:1]})


def _config(space: Any) -> StudyConfig:
    return StudyConfig(name="h", model="h", targets=(TARGET,), space=space, mode="weights", trials=2)


def test_the_default_hybrid_space_varies_every_sparse_choice_and_odd_heads_are_refused(
    parent: Architecture,
) -> None:
    space = expert_space(parent)
    varied = {c.name for c in space.choices if len(c.values) > 1}
    sparse = {"num_experts", "experts_per_token", "expert_width", "shared_width", "mamba_heads"}
    assert varied == {"num_layers", "hidden_size", "num_kv_heads", "q_per_kv", *sparse}
    assert space["mamba_heads"].values == (4, 6, 8) and space["expert_width"].values == (8, 16)
    assert space["ffn_width"].values == (48,) and space["num_kv_heads"].values == (1, 2)
    check_config(_config(space), parent)
    odd = replace(space, choices=tuple(Choice(c.name, (5, 8)) if c.name == "mamba_heads" else c for c in space.choices))
    with pytest.raises(ConfigError, match=r"mamba_heads choices \[5\] are not multiples of the parent's 2 Mamba-2"):
        check_config(_config(odd), parent)


def test_the_seed_score_and_the_proxy_count_shared_channels_and_heads(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """The minitron seed's masked KL is 0 at the parent's sizes and positive with fewer Mamba-2 heads,
    shared channels, attention heads (Nemotron-H's attention layers hold no MoE) or residual channels;
    the proxy's retained importance is 1.0 for the parent and falls with each."""
    score = expert_kl_scorer(model, importance, tokens(2, 16, seed=4))
    full = {c.name: c.values[-1] for c in expert_space(parent).choices}
    assert score(parent) == pytest.approx(0.0, abs=1e-6)
    assert retained_expert_importance(parent, importance) == pytest.approx(1.0)
    for smaller in ({"mamba_heads": 4}, {"shared_width": 16}, {"num_kv_heads": 1}, {"hidden_size": 32}):
        arch = uniform_allocation({**full, **smaller}, parent)
        assert score(arch) > 0 and retained_expert_importance(arch, importance) < 1.0


@pytest.mark.slow
def test_a_default_weights_study_on_a_hybrid_parent_exports_the_masked_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seeds, proxy and serve_as at their defaults: the study completes its trials, each stores its
    kept experts, shared channels and Mamba-2 heads, `study show` prints those sizes, and
    `prune --from-study` exports the best feasible trial as a Nemotron-H checkpoint that loads in
    transformers with the parent's logits under those masks."""
    import json
    import re

    import ray
    from tiny_lm import save_hf_dir
    from transformers import AutoModelForCausalLM

    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.export import CARD_FILE
    from autocompress_opt.search.study import init_ray, load_records, run_study

    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    model_dir = save_hf_dir(hybrid_model(vocab_size=260), tmp_path / "hybrid")
    parent = load_model(model_dir).architecture
    inner = {"steps": 2, "n_samples": 4, "val_samples": 1, "seq_len": 16, "eval_samples": 2, "eval_seq_len": 16}
    cfg = StudyConfig(
        name="hybrid",
        model=str(model_dir),
        targets=(TARGET,),
        space=expert_space(parent),
        mode="weights",
        inner={**inner, "importance_samples": 2, "importance_seq_len": 16},
        trials=3,
        storage=f"sqlite:///{tmp_path}/studies.db",
        concurrency=1,
    )
    init_ray(None, 1, ())
    try:
        [outcome] = run_study(cfg, progress=False)
    finally:
        ray.shutdown()
    assert outcome.complete == 3 and any(line.startswith("minitron: {") for line in outcome.seeded)
    records, _ = load_records(cfg.storage_url, cfg.study_name(TARGET))
    done = [r for r in records if r.state == "COMPLETE"]
    assert len(done) == 3 and any(r.feasible for r in done)
    for r in done:
        layers = r.kept.get("kept_layers", [0, 1, 2, 3])  # a trial cut in depth records the layers it keeps
        assert r.kept["format"] in ("autocompress-kept-experts/2", "autocompress-kept-experts/4")
        assert len(r.kept["mamba"]) == sum(parent.layers[i].mamba is not None for i in layers)
        assert r.selection["chosen"] in ("trained", "start")
    best = max((r for r in done if r.feasible), key=lambda r: (r.quality, -r.number))
    assert main(["study", "show", "hybrid", "--storage", cfg.storage_url, "--all"]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"\d x \d+ch, top-\d, shared \d+ch; \d SSM heads", shown), shown
    out_dir = tmp_path / "export"
    assert main(["prune", "--from-study", "hybrid", "--storage", cfg.storage_url, "--out", str(out_dir)]) == 0
    assert f"trial {best.number}:" in capsys.readouterr().out
    card = json.loads((out_dir / CARD_FILE).read_text())
    assert card["extra"]["kept_from"] == "trial" and card["model_type"] == "nemotron_h"
    readme = (out_dir / "README.md").read_text()
    assert "Mamba-2" in readme and re.search(r"\d+ experts × \d+, top-\d, shared \d+", readme), readme
    child = AutoModelForCausalLM.from_pretrained(out_dir)
    c = child.config
    sizes = (c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size)
    assert sizes == tuple(best.params[k] for k in ("num_experts", "experts_per_token", "expert_width"))
    assert (c.moe_shared_expert_intermediate_size, c.mamba_num_heads) == (
        best.params["shared_width"],
        best.params["mamba_heads"],
    )
    ids, loaded = tokens(2, 12, seed=8), load_model(model_dir)
    masked = _masked_logits(*kept_model(loaded.model, best.kept), ids)  # the kept layers' model, if cut in depth
    with torch.no_grad():
        torch.testing.assert_close(child(ids).logits, masked)
