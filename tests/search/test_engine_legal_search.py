"""Engine-legal search: a study's trials are shapes its target's serving engine loads
(``prune.engine_rules``), ``--serve-as ENGINE`` picks another engine's rules and ``--serve-as any``
lifts them; the inner search's discretisation keeps the rules step by step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import Choice, SearchSpace, default_space, load_search_space
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.importance import Importance, ImportanceMeta
from autocompress_opt.prune.loadability import loadable_problems, parent_problems, shape_rules
from autocompress_opt.search.inner.budget import Budget
from autocompress_opt.search.inner.discretise import discretise, shape_problems
from autocompress_opt.search.inner.relaxation import ParentMasks
from autocompress_opt.search.study import (
    Objective,
    StudyConfig,
    check_config,
    init_ray,
    load_records,
    pareto_front,
    run_study,
)
from autocompress_opt.search.study.trials import check_loadable, legal_point, plan_trial
from autocompress_opt.serving.targets import Target

VLLM_TARGET = Target("b200", "datacenter")  # the datacenter workload is served by vLLM
LLAMACPP_TARGET = Target("rtx5070", "local-coding")  # local-coding: llama.cpp


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the studies of this module, shut down after them (later study tests start their own)."""
    import ray

    init_ray(None, 2, ())
    yield
    ray.shutdown()


def study(tmp_path: Path, name: str, **kwargs) -> StudyConfig:
    base = dict(
        name=name,
        model="smollm2-135m",
        targets=(VLLM_TARGET,),
        space=load_search_space("smollm2-135m"),
        trials=6,
        storage=f"sqlite:///{tmp_path}/{name}.db",
        concurrency=2,
    )
    return StudyConfig(**{**base, **kwargs})


def tiny_parent() -> Architecture:
    """A Llama with heads of 8 channels: vLLM's CPU attention takes none of its uniform children."""
    return Architecture(
        family="llama", vocab_size=97, hidden_size=48, layers=(LayerSpec(True, 6, 2, 8, True, 96),) * 4, name="tiny8"
    )


# --------------------------------------------------------------------------- studies
@pytest.mark.slow
def test_every_trial_and_best_point_of_a_plan_study_loads_in_its_targets_engine(local_ray, tmp_path: Path) -> None:
    """vLLM and llama.cpp targets: every COMPLETE trial and every Pareto-best point is a shape the
    target's engine loads; the study records the engine whose rules its trials keep."""
    cfg = study(tmp_path, "legal", targets=(VLLM_TARGET, LLAMACPP_TARGET))
    run_study(cfg, progress=False)
    for target, engine in ((VLLM_TARGET, "vllm"), (LLAMACPP_TARGET, "llamacpp")):
        records, attrs = load_records(cfg.storage_url, cfg.study_name(target))
        assert attrs["serve_as"] == {"engine": engine, "explicit": False, "parent_problems": []}
        assert attrs["identity"]["serve_as"] == engine
        done = [r for r in records if r.state == "COMPLETE"]
        assert len(done) == 6
        for r in done:
            assert loadable_problems(Architecture.from_dict(r.architecture), engine) == [], r.number
        best = pareto_front(records, [Objective.parse(o).direction for o in attrs["objectives"]])
        assert best
        assert all(loadable_problems(Architecture.from_dict(r.architecture), engine) == [] for r in best)


@pytest.mark.slow
def test_serve_as_any_lifts_the_rules_and_an_explicit_engine_that_cannot_serve_the_parent_is_an_error(
    local_ray, tmp_path: Path
) -> None:
    """A parent whose head size vLLM's CPU attention does not take: ``serve_as vllm`` is refused
    before anything runs (naming the reason and ``any``); ``serve_as any`` runs, and its trials are
    shapes vLLM cannot load."""
    parent = tiny_parent()
    path = tmp_path / "tiny8.json"
    parent.save(path)
    space = default_space(parent)
    with pytest.raises(ConfigError, match=r"serve_as vllm: no pruned model of tiny8 loads in vllm \(head size 8.*any"):
        check_config(study(tmp_path, "strict", model=str(path), space=space, serve_as="vllm"), parent)
    cfg = study(tmp_path, "free", model=str(path), space=space, trials=3, serve_as="any")
    run_study(cfg, progress=False)
    records, attrs = load_records(cfg.storage_url, cfg.study_name(VLLM_TARGET))
    assert attrs["serve_as"] == {"engine": "any", "explicit": True, "parent_problems": []}
    done = [r for r in records if r.state == "COMPLETE"]
    assert len(done) == 3
    assert all(loadable_problems(Architecture.from_dict(r.architecture), "vllm") for r in done)


def test_the_targets_engine_decides_unless_serve_as_overrides(tmp_path: Path) -> None:
    cfg = study(
        tmp_path, "d", targets=(VLLM_TARGET, LLAMACPP_TARGET, Target("h100-sxm", "in-game", engine="torch-eager"))
    )
    assert [cfg.serve_as_for(t) for t in cfg.targets] == ["vllm", "llamacpp", "transformers"]
    forced = replace(cfg, serve_as="llamacpp")
    assert {forced.serve_as_for(t) for t in forced.targets} == {"llamacpp"}
    assert replace(cfg, serve_as="any").serve_as_for(VLLM_TARGET) == "any"


@pytest.mark.parametrize("bad", ["vlm", "torch-eager", "", "VLLM"])
def test_a_bad_serve_as_is_a_one_line_error_naming_the_valid_engines(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"serve_as {bad!r} is not an engine.*valid: vllm, sglang, trtllm, llamacpp"):
        study(tmp_path, "b", serve_as=bad)


def test_the_cli_flag_and_the_yaml_key_reach_the_study_and_a_bad_value_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli.study.config import build_config

    assert build_config({**_run_values(), "serve_as": "llamacpp"}).serve_as == "llamacpp"
    argv = ["study", "run", "--targets", "b200", "--trials", "1", "--storage", f"sqlite:///{tmp_path}/x.db"]
    assert main([*argv, "--serve-as", "vlm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'vlm'" in err and "did you mean 'vllm'" in err and "any" in err
    config = tmp_path / "s.yaml"
    config.write_text("serve_as: tensorrt\n")
    assert main([*argv, "--config", str(config)]) == 2
    assert "serve_as 'tensorrt' is not an engine" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()


def _run_values() -> dict:
    from autocompress_opt.cli.study.config import DEFAULTS

    return {**DEFAULTS, "name": "c", "storage": "sqlite:///unused.db"}


# ------------------------------------------------------------------------- plan trial
def test_the_plan_trial_records_its_engine_and_refuses_a_shape_the_engine_cannot_load() -> None:
    parent = load_architecture("smollm2-135m")
    params = {"num_layers": 20, "hidden_size": 512, "ffn_width": 1024, "num_kv_heads": 3, "q_per_kv": 3}
    request = {
        "params": params,
        "parent": parent.to_dict(),
        "space": load_search_space("smollm2-135m").to_dict(),
        "target": VLLM_TARGET.to_dict(),
        "serve_as": "vllm",
    }
    result = plan_trial(request)
    assert result["serve_as"] == "vllm"
    arch = Architecture.from_dict(result["architecture"]).active()
    assert loadable_problems(arch, "vllm") == []
    # 512 is no multiple of 9 query heads: no plain Llama checkpoint; the largest legal point below
    # the sampled one in the space (KV heads 2 of 2 query heads each) is built instead
    assert (arch.hidden_size, arch.layers[0].num_heads, arch.layers[0].num_kv_heads) == (512, 4, 2)
    free = plan_trial({**request, "serve_as": None})  # absent: no rules (older requests)
    assert free["serve_as"] == "any"
    problems = loadable_problems(Architecture.from_dict(free["architecture"]), "vllm")
    assert problems and "hidden size 512 is not a multiple of the 9 query heads" in problems[0]
    with pytest.raises(ConfigError, match="is not an engine"):
        plan_trial({**request, "serve_as": "vlm"})
    # the guard every plan trial passes through: a heterogeneous shape outside vLLM's rules is refused
    odd = list(parent.layers)
    odd[3] = replace(odd[3], ffn_width=640)
    with pytest.raises(ConfigError, match="serve_as vllm: .*FFN width 640 is not a multiple of 256"):
        check_loadable(replace(parent, layers=tuple(odd)), parent, "vllm")
    check_loadable(replace(parent, layers=tuple(odd)), parent, "any")
    # what pruning cannot change is the parent's own, not the trial's fault
    tiny = tiny_parent()
    assert parent_problems(tiny, "vllm") and not parent_problems(tiny, "transformers")
    check_loadable(tiny, tiny, "vllm")


# ------------------------------------------------------------------------- discretise
LAYERS = 6


def masks_case(seed: int, parent: Architecture) -> tuple[ParentMasks, Importance]:
    """Random importance and random masks over ``parent``: rounding lands anywhere."""
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> torch.Tensor:
        return torch.rand(n, generator=gen, dtype=torch.float64)

    specs = parent.layers
    importance = Importance(
        parent,
        tuple(rand(s.num_heads) for s in specs),
        tuple(rand(s.num_kv_heads) for s in specs),
        tuple(rand(s.ffn_width) for s in specs),
        rand(parent.hidden_size),
        rand(LAYERS),
        rand(LAYERS),
        ImportanceMeta("synthetic", "none", "minitron", 1, 1, 1),
    )
    masks = ParentMasks(parent, importance, hidden_size=parent.hidden_size)
    with torch.no_grad():
        for p in (masks.kv_keep, masks.q_keep, masks.ffn_keep):
            p.copy_(torch.rand(LAYERS, generator=gen))
        masks.attn_log_alpha.copy_(torch.randn(LAYERS, generator=gen) * 3)
        masks.ffn_log_alpha.copy_(torch.randn(LAYERS, generator=gen) * 3)
    return masks, importance


def dense_llama(**kwargs) -> Architecture:
    """8 query heads of 32 channels in 4 KV groups, FFN 1024 (four of DeciLM's 256): room for rules to bite."""
    layer = LayerSpec(True, 8, 4, 32, True, 1024)
    return Architecture(family="llama", vocab_size=128, hidden_size=256, layers=(layer,) * LAYERS, name="d", **kwargs)


@pytest.mark.parametrize(
    ("engine", "budget"),
    [
        ("vllm", Budget(num_layers=4, hidden_size=256, ffn_width=512, num_kv_heads=2, q_per_kv=2)),
        ("llamacpp", Budget(num_layers=4, hidden_size=256, ffn_width=512, num_kv_heads=4, q_per_kv=2)),
    ],
)
def test_discretise_keeps_the_engines_rules_where_the_free_search_breaks_them(engine: str, budget: Budget) -> None:
    """Unrestricted rounding, repair and fill give per-layer query heads and FFN widths off 256 that
    the engine cannot load; under its rules every point loads, and stays heterogeneous."""
    parent = dense_llama()
    rules = shape_rules(engine, parent, hidden_size=256, query_heads=budget.num_kv_heads * budget.q_per_kv)
    assert rules is not None and rules.heterogeneous, rules
    free_broken, legal_hetero = 0, 0
    for seed in range(4):
        masks, importance = masks_case(seed, parent)
        free = discretise(masks, importance, budget, None)
        legal = discretise(masks, importance, budget, None, rules=rules)
        free_broken += bool(loadable_problems(free.architecture, engine))
        arch = legal.architecture
        assert loadable_problems(arch, engine) == [] and shape_problems(arch, rules) == [], seed
        assert legal.feasible, (seed, legal.violations)
        heads = {layer.num_heads for layer in arch.layers if layer.attention}
        assert heads == {budget.num_kv_heads * budget.q_per_kv}
        assert all(layer.ffn_width % 256 == 0 for layer in arch.layers if layer.ffn)
        legal_hetero += not arch.active().is_uniform
    assert free_broken >= 2 and legal_hetero >= 2, (free_broken, legal_hetero)


def test_vllm_rules_keep_attention_in_the_first_kept_layer() -> None:
    parent = dense_llama()
    budget = Budget(num_layers=3, hidden_size=256, ffn_width=512, num_kv_heads=2, q_per_kv=2)
    rules = shape_rules("vllm", parent, hidden_size=256, query_heads=4)
    assert rules is not None
    for seed in range(6):
        masks, importance = masks_case(seed, parent)
        with torch.no_grad():
            masks.attn_log_alpha[:2] = -5.0  # the gates drop the first layers' attention
        arch = discretise(masks, importance, budget, None, rules=rules).architecture.active()
        assert arch.layers[0].attention, seed


@pytest.mark.parametrize(
    ("engine", "parent", "hidden", "heads", "why"),
    [
        ("vllm", dense_llama(qkv_bias=True, o_bias=True), 256, 4, "attention biases"),
        ("llamacpp", dense_llama(), 256, 4, "head_dim = hidden / query heads"),
        ("vllm", replace(dense_llama(), family="qwen2"), 256, 4, "not Llama-like"),
    ],
)
def test_where_the_engine_loads_no_per_layer_shapes_discretise_returns_the_uniform_point(
    engine: str, parent: Architecture, hidden: int, heads: int, why: str
) -> None:
    rules = shape_rules(engine, parent, hidden_size=hidden, query_heads=heads)
    assert rules is not None and not rules.heterogeneous and why in rules.why_uniform
    budget = Budget(num_layers=4, hidden_size=hidden, ffn_width=640, num_kv_heads=2, q_per_kv=2)
    masks, importance = masks_case(0, parent)
    arch = discretise(masks, importance, budget, None, rules=rules).architecture
    assert arch.active().is_uniform and arch.num_active_layers == 4
    assert arch.active().layers[0].ffn_width == 640  # a plain checkpoint: any width
    assert loadable_problems(arch, engine) == []


def test_legal_point_keeps_a_legal_point_and_snaps_an_illegal_one_down_within_the_space() -> None:
    parent, space = load_architecture("smollm2-135m"), load_search_space("smollm2-135m")
    point = {"num_layers": 12, "hidden_size": 448, "ffn_width": 640, "num_kv_heads": 3, "q_per_kv": 3}
    assert legal_point(point, space, parent, "any") == point
    snapped = legal_point(point, space, parent, "vllm")
    assert {k: snapped[k] for k in ("num_layers", "ffn_width")} == {"num_layers": 12, "ffn_width": 640}
    assert snapped["hidden_size"] <= 448 and snapped["num_kv_heads"] <= 3 and snapped["q_per_kv"] <= 3
    assert snapped["hidden_size"] % (snapped["num_kv_heads"] * snapped["q_per_kv"]) == 0
    legal = {**point, "hidden_size": 576}
    assert legal_point(legal, space, parent, "llamacpp") == legal
    one = SearchSpace(tuple(Choice(n, (point[n],)) for n in point))  # only the illegal point
    with pytest.raises(ConfigError, match=r"serve_as vllm: no point of the search space at or below .*serve_as any"):
        legal_point(point, one, parent, "vllm")


def test_a_shared_memo_gives_the_same_legal_points_and_builds_each_candidate_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """legal_point with a memo (what the proxy's ranking shares across points and targets) returns
    what it returns without one, and a second pass over the same points builds no architecture."""
    parent, space = load_architecture("smollm2-135m"), load_search_space("smollm2-135m")
    points = [
        {"num_layers": 12, "hidden_size": h, "ffn_width": f, "num_kv_heads": kv, "q_per_kv": q}
        for h in (384, 448, 576)
        for f in (640, 1536)
        for kv in (1, 3)
        for q in (2, 3)
    ]
    plain = [legal_point(p, space, parent, "vllm") for p in points]
    memo: dict = {}
    assert [legal_point(p, space, parent, "vllm", memo) for p in points] == plain
    assert memo and any(not loadable for _, loadable in memo.values())  # illegal shapes are kept too
    built: list[int] = []
    real = SearchSpace.architecture
    monkeypatch.setattr(SearchSpace, "architecture", lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    assert [legal_point(p, space, parent, "vllm", memo) for p in points] == plain and not built
