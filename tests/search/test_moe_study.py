"""A weights-mode study of a mixture-of-experts parent with the settings a user gets (issue 30): the
default space prunes experts only, a space that varies a dense axis or a family without an experts
path is refused in one line, the minitron seed and the proxy work on the expert axes, the trial keeps
shapes the target's engine loads, and ``prune --from-study`` / ``study show`` work on the study."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_families import TINY_MOE, tiny_model, tiny_moe_importance, tiny_moe_model, tokens

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import Choice, default_space, uniform_allocation
from autocompress_opt.cli import build_parser, main
from autocompress_opt.cli.study.config import build_config, merged
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import moe_adapter
from autocompress_opt.prune.baselines import expert_kl_scorer, expert_seeds
from autocompress_opt.prune.importance import Importance
from autocompress_opt.search.study import StudyConfig
from autocompress_opt.search.study.config import check_config, expert_space
from autocompress_opt.search.study.proxy import Proxy, retained_expert_importance
from autocompress_opt.search.study.trials import check_loadable
from autocompress_opt.serving.targets import Target, parent_metrics

# Tiny models cost the same at every size but for their parameters: the constraint a point of fewer
# active parameters meets (the parent does not), with the throughput held at the parent's.
TARGET = Target("h100-sxm", "datacenter", constraints={"output_throughput_tok_s": "1x", "active_params": "0.9x"})


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


def _config(space: Any, **changes: Any) -> StudyConfig:
    return StudyConfig(name="m", model="m", targets=(TARGET,), space=space, mode="weights", trials=2, **changes)


def test_the_default_weights_space_prunes_depth_and_experts_and_a_width_axis_is_refused(parent: Architecture) -> None:
    space = expert_space(parent)
    assert {c.name: c.values for c in space.choices if len(c.values) > 1}.keys() == {
        "num_layers",
        "hidden_size",
        "num_kv_heads",
        "q_per_kv",
        "num_experts",
        "experts_per_token",
        "expert_width",
    }
    assert space["hidden_size"].values == default_space(parent)["hidden_size"].values == (36, 39, 42, 45, 48)
    assert space["ffn_width"].values == (48,) and space["num_experts"].values[-1] == 8
    assert space["expert_width"].values == (8, 16)  # whole 16-byte rows only (the default space has 8..16)
    check_config(_config(space), parent)
    assert space["num_layers"].values == default_space(parent)["num_layers"].values == (2, 3)
    with pytest.raises(
        ConfigError,
        match=r"ffn_width choices \[.*\].*layers, hidden size, attention heads and experts only.*--mode plan",
    ):
        check_config(_config(default_space(parent)), parent)
    odd = replace(
        space, choices=tuple(Choice(c.name, (12, 16)) if c.name == "expert_width" else c for c in space.choices)
    )
    with pytest.raises(ConfigError, match=r"expert_width choices \[12\] are not multiples of 8"):
        check_config(_config(odd), parent)


def test_a_moe_family_without_an_experts_path_is_plan_mode_only() -> None:
    gpt_oss = load_architecture("gpt-oss-120b")
    with pytest.raises(
        ConfigError,
        match=r"sparse blocks of qwen3_moe, mixtral, nemotron_h parents only; gpt_oss is plan-mode only "
        r"\(transformers' GptOss experts carry biases.*--mode plan",
    ):
        check_config(_config(expert_space(gpt_oss)), gpt_oss)
    mixtral = load_architecture("mixtral-8x7b")
    check_config(_config(expert_space(mixtral)), mixtral)  # the experts path prunes Mixtral


def test_a_plan_mode_study_of_a_moe_or_hybrid_parent_skips_the_uniform_baselines_with_a_reason() -> None:
    """seed_baselines in plan mode on a MoE / hybrid parent: every baseline is recorded as not seeded
    (they prune dense parents) instead of the depth baseline's "needs a uniform parent" error, which
    stopped the study before its first trial."""
    from autocompress_opt.search.study.seeding import baseline_seeds, seeded_baselines

    for name in ("qwen3-30b-a3b", "nemotron-3-nano-30b-a3b"):
        parent = load_architecture(name)
        target = Target("h100-sxm", "datacenter")
        cfg = StudyConfig(
            name="m", model=name, targets=(target,), space=default_space(parent), trials=3, seed_baselines=True
        )
        assert seeded_baselines(cfg, parent) == ()
        seeds = baseline_seeds(cfg, target, parent)
        assert list(seeds) == ["depth", "minitron", "best-uniform"]
        assert all("prune dense parents only" in seed["skipped"] for seed in seeds.values())


def test_the_cli_gives_a_moe_parent_the_expert_space_in_weights_mode_only() -> None:
    def config_of(*argv: str) -> Any:
        args: argparse.Namespace = build_parser().parse_args(["study", "run", "--model", "qwen3-30b-a3b", *argv])
        return build_config(merged(args))

    weights = config_of("--mode", "weights").space
    assert weights["hidden_size"].values[-1] == 2048 and len(weights["num_experts"].values) > 1
    assert len(weights["hidden_size"].values) > 1  # cut before the expert search too (dense_cut)
    assert len(weights["num_layers"].values) > 1  # depth is cut before the expert search (dense_cut)
    assert len(config_of("--mode", "plan").space["num_layers"].values) > 1


def test_the_minitron_seed_scores_the_largest_feasible_expert_points(
    model: Any, parent: Architecture, importance: Importance
) -> None:
    """The seed is a point of the space that meets the target, chosen by the lowest masked KL among the
    largest feasible points none covers; depth and best-uniform say why they are not seeded."""
    from autocompress_opt.prune.baselines import target_feasibility

    space, feasible = expert_space(parent), target_feasibility(TARGET, parent)
    score = expert_kl_scorer(model, importance, tokens(2, 16, seed=4))
    seeds = expert_seeds(space, parent, feasible, score)
    assert "skipped" in seeds["best-uniform"]
    depth = seeds["depth"]  # the deepest point with every expert, width and head kept, or why not
    assert "point" in depth or "below the space's depth floor" in depth["skipped"] or "no depth" in depth["skipped"]
    if "point" in depth:
        assert all(depth["point"][c.name] == c.values[-1] for c in space.choices if c.name != "num_layers")
        assert feasible(uniform_allocation(depth["point"], parent))
    point = seeds["minitron"]["point"]
    assert all(point[c.name] in c.values for c in space.choices)
    assert feasible(uniform_allocation(point, parent)) and not feasible(parent)
    assert "lowest masked KL" in seeds["minitron"]["finding"]
    # the score is the KL of the parent masked to the importance choice: 0 for the parent's own counts
    assert score(parent) == pytest.approx(0.0, abs=1e-6) and score(uniform_allocation(point, parent)) > 0
    unscored = expert_seeds(space, parent, feasible, None)["minitron"]
    assert "the most parameters" in unscored["finding"]


def test_the_proxy_scores_and_ranks_points_on_the_expert_axes(parent: Architecture, importance: Importance) -> None:
    """The proxy's point keeps the expert choices (a smaller expert count costs less), its quality is
    the expert importance kept (1.0 for the parent, falling with fewer experts), and the ranking
    returns feasible points of the space."""
    space = expert_space(parent)
    proxy = Proxy(parent, space, TARGET, parent_metrics(parent, TARGET), serve_as="vllm", importance=importance)
    full = {c.name: c.values[-1] for c in space.choices}
    small = {**full, "num_experts": 4, "expert_width": 8}
    scores = proxy.check_many([full, small])
    assert [s.point["num_experts"] for s in scores] == [8, 4]
    assert not scores[0].feasible and scores[1].feasible
    assert retained_expert_importance(parent, importance) == pytest.approx(1.0)
    assert retained_expert_importance(uniform_allocation(small, parent), importance) < 1.0
    # an experts-per-token cut is priced by the routing weight it drops (the record's routing_mass)
    mass = next(m for m in importance.routing_mass if m is not None)
    assert mass.shape == (2,) and bool(mass[0] >= mass[1] > 0)
    one = retained_expert_importance(uniform_allocation({**full, "experts_per_token": 1}, parent), importance)
    assert one == pytest.approx(float(mass[0] / mass.sum()), rel=0.2) and one < 1.0
    ranked = proxy.rank(3)
    assert ranked and all(s.feasible and s.quality is not None and 0 < s.quality <= 1 for s in ranked)
    assert [s.quality for s in ranked] == sorted((s.quality for s in ranked), reverse=True)


def test_an_expert_child_is_a_shape_the_engines_load(parent: Architecture) -> None:
    """The trial's point (one expert count, width and top-k for every MoE layer) passes every engine's
    rules beyond the parent's own problems (the tiny head size is not one vLLM's CPU kernels take)."""
    point = {**{c.name: c.values[-1] for c in expert_space(parent).choices}, "num_experts": 4, "expert_width": 8}
    for engine in ("vllm", "llamacpp", "trtllm", "sglang", "transformers"):
        check_loadable(uniform_allocation(point, parent), parent, engine)


@pytest.mark.slow
def test_a_default_weights_study_on_a_moe_parent_exports_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seeds, proxy and serve_as at their defaults (the target's engine, vllm): the study enqueues the
    minitron seed and the proxy's points, completes, `study show` prints the expert sizes and active
    parameters, and `prune --from-study` writes the family's plain checkpoint whose logits are the
    parent's under the trial's kept experts, with a card holding the trial's result."""
    import ray
    from tiny_lm import save_hf_dir
    from transformers import AutoModelForCausalLM

    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.expert_kept import kept_model
    from autocompress_opt.prune.export import CARD_FILE
    from autocompress_opt.prune.masking import apply_masks
    from autocompress_opt.search.study import init_ray, load_records, run_study

    monkeypatch.chdir(tmp_path)  # the trials' caches (.autocompress/) go here
    model_dir = save_hf_dir(tiny_model("qwen3_moe", **TINY_MOE, vocab_size=260), tmp_path / "moe")
    parent = load_model(model_dir).architecture
    inner = {"steps": 2, "n_samples": 4, "val_samples": 1, "seq_len": 16, "eval_samples": 2, "eval_seq_len": 16}
    cfg = StudyConfig(
        name="moe",
        model=str(model_dir),
        targets=(TARGET,),
        space=expert_space(parent),
        mode="weights",
        inner={**inner, "importance_samples": 2, "importance_seq_len": 16},
        trials=3,
        storage=f"sqlite:///{tmp_path}/studies.db",
        concurrency=1,
    )
    assert cfg.seeds_baselines and cfg.proxy_points > 0 and cfg.serve_as_for(TARGET) == "vllm"
    init_ray(None, 1, ())
    try:
        [outcome] = run_study(cfg, progress=False)
    finally:
        ray.shutdown()
    assert outcome.complete == 3 and any(line.startswith("minitron: {") for line in outcome.seeded)
    assert any(line.startswith("proxy #1") for line in outcome.seeded)
    records, _ = load_records(cfg.storage_url, cfg.study_name(TARGET))
    done = [r for r in records if r.state == "COMPLETE"]
    assert any(r.baseline == "minitron" for r in done) and any(r.feasible for r in done)

    assert main(["study", "show", "moe", "--storage", cfg.storage_url, "--all"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"experts +\| +params +\| +active", out) or re.search(r"experts +params +active", out), out
    assert re.search(r"\d x \d+ch, top-\d", out), out

    out_dir = tmp_path / "export"
    assert main(["prune", "--from-study", "moe", "--storage", cfg.storage_url, "--out", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    best = max((r for r in done if r.feasible), key=lambda r: (r.quality, -r.number))
    assert f"trial {best.number}:" in printed and "test split: KL to parent" in printed
    card = json.loads((out_dir / CARD_FILE).read_text())
    assert card["extra"]["study_result"]["quality"] == best.quality and card["extra"]["kept_from"] == "trial"
    assert card["extra"]["test"]["split"] == "test" and card["model_type"] == "qwen3_moe"
    assert re.search(r"\| \d+ experts × \d+, top-\d \|", (out_dir / "README.md").read_text())
    child = AutoModelForCausalLM.from_pretrained(out_dir)
    assert child.config.num_experts == best.params["num_experts"]
    loaded = load_model(model_dir)
    ids = tokens(2, 12, seed=8)
    cut, masks = kept_model(loaded.model, best.kept)  # the kept layers' model, if the trial cut depth
    with torch.no_grad(), apply_masks(cut, masks, adapter=moe_adapter(cut)):
        masked = cut(ids).logits
    with torch.no_grad():
        torch.testing.assert_close(child(ids).logits, masked)
