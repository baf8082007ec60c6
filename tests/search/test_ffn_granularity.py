"""Search space and engine granularity agree: a sampled FFN width off the DeciLM readers' 256 is
realised, not floored away. The uniform candidate keeps it exactly (a plain checkpoint loads any
width); a per-layer shape mixes multiples of 256 up to the budget's total rounded down to 256
(``ShapeRules.ffn_total``), never a per-layer floor; the weights trial records both and what it
kept (``ffn_budget``); a study resumed with another FFN step is refused in one line naming it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_lm import save_hf_dir
from tiny_lm import tiny_model as tiny_lm_model
from weights_helpers import INNER, request

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import SearchSpace, load_search_space, space_changes, uniform_allocation
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.importance import estimate_importance
from autocompress_opt.prune.loadability import ShapeRules, loadable_problems, shape_rules
from autocompress_opt.search.inner.budget import Budget
from autocompress_opt.search.inner.inner_search import InnerConfig, search
from autocompress_opt.search.inner.teacher import teacher_log_probs
from autocompress_opt.search.study import StudyConfig
from autocompress_opt.search.study.coordination import open_study
from autocompress_opt.search.study.records import trial_record
from autocompress_opt.search.study.studyio import export_rows
from autocompress_opt.search.study.weights_trial import clear_trial_cache, run_weights_trial
from autocompress_opt.serving.targets import Target

# A Llama vLLM and llama.cpp read per layer: 2 heads of 32 channels (head_dim · heads = hidden), FFN
# 1024 (four of DeciLM's 256), no biases; 5 layers, so 5 · 576 = 2880 channels = 11.25 multiples of 256.
LLAMA = dict(
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=1024,
    num_hidden_layers=5,
)
POINT = {"num_layers": 5, "hidden_size": 64, "ffn_width": 576, "num_kv_heads": 2, "q_per_kv": 1}
# The datacenter workload's constraints (throughput >= 1.5x, TPOT <= 1x) loosened: only the budgets bind.
UNCONSTRAINED = Target("h100-sxm", "datacenter", constraints={"output_throughput_tok_s": "0.01x", "tpot_ms": "100x"})


def ffn_channels(arch: Architecture) -> list[int]:
    return [layer.ffn_width for layer in arch.active().layers if layer.ffn]


def test_ffn_total_rounds_the_budget_down_to_the_engines_multiple_only_for_per_layer_shapes() -> None:
    """SmolLM2's 30 layers at 1088 (a step-64 value of its space): 32640 channels, of which a DeciLM
    per-layer shape keeps at most 32512 (127 multiples of 256); uniform-only rules and a multiple
    that divides the total keep all of it."""
    assert ShapeRules("vllm", ffn_multiple=256).ffn_total(30, 1088) == 32512
    assert ShapeRules("vllm", ffn_multiple=256).ffn_total(20, 1088) == 21760  # 85 multiples: exact
    assert ShapeRules("vllm", heterogeneous=False, ffn_multiple=256).ffn_total(30, 1088) == 32640
    assert ShapeRules("any").ffn_total(30, 1088) == 32640


def test_the_smollm2_space_keeps_step_64_because_every_engine_realises_its_uniform_widths() -> None:
    """Every FFN width of the bundled SmolLM2 space, as a uniform model, loads in every engine whose
    rules a study can search under (a plain checkpoint of any width); so the sampler's axis keeps its
    step of 64 for every target, and only per-layer shapes round their total (the test above)."""
    parent, space = load_architecture("smollm2-135m"), load_search_space("smollm2-135m")
    assert space["ffn_width"].values == tuple(range(256, 1537, 64))
    for width in space["ffn_width"].values:
        point = {"num_layers": 20, "hidden_size": 576, "ffn_width": width, "num_kv_heads": 3, "q_per_kv": 3}
        arch = space.architecture(point, parent)
        for engine in ("vllm", "sglang", "trtllm", "llamacpp", "transformers"):
            assert loadable_problems(arch, engine) == [], (engine, width)


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    """The tiny Llama, its importance, calibration rows and teacher log-probs."""
    model = tiny_lm_model("llama", **LLAMA)
    rows = torch.randint(0, 260, (6, 12), generator=torch.Generator().manual_seed(2))
    return {
        "model": model,
        "arch": adapter_for(model).architecture(model),
        "importance": estimate_importance(
            model, torch.randint(0, 260, (4, 12), generator=torch.Generator().manual_seed(1)), progress=False
        ),
        "tokens": rows,
        "teacher": teacher_log_probs(model, rows, parent_id="tiny-256"),
    }


def inner(tiny: dict[str, Any], engine: str, point: dict[str, int]) -> Any:
    budget = Budget.from_params(point)
    rules = shape_rules(engine, tiny["arch"], hidden_size=budget.hidden_size, query_heads=budget.num_kv_heads)
    config = InnerConfig(steps=4, batch_size=2, seq_len=12, n_samples=6, val_samples=2, seed=0)
    init = uniform_allocation(point, tiny["arch"], tiny["importance"].layer_order())
    result = search(
        tiny["model"], tiny["arch"], tiny["importance"], tiny["tokens"], tiny["teacher"],
        budget=budget, goal=None, config=config, init=init, rules=rules,
    )  # fmt: skip
    return result, rules


def test_under_decilm_rules_per_layer_shapes_mix_multiples_of_256_up_to_the_rounded_total(tiny: dict) -> None:
    """vLLM's rules, a sampled width of 576 over 5 layers: the uniform candidate keeps 576 in every
    layer (2880 channels); every per-layer candidate keeps widths in multiples of 256 summing to
    2816, the budget rounded down to 256 (a mean of 563.2) — mixed widths, not 512 in every layer
    (2560, the per-layer floor)."""
    result, rules = inner(tiny, "vllm", POINT)
    assert rules is not None and rules.heterogeneous and rules.ffn_multiple == 256
    assert ffn_channels(result.candidates["uniform"]) == [576] * 5
    for name in ("start", "trained"):
        widths = ffn_channels(result.candidates[name])
        assert all(w % 256 == 0 for w in widths) and len(set(widths)) > 1, (name, widths)
        assert sum(widths) == rules.ffn_total(5, 576) == 2816, (name, widths)
    assert loadable_problems(result.architecture, "vllm") == []


def test_under_uniform_only_rules_the_sampled_width_is_kept_exactly(tiny: dict) -> None:
    """llama.cpp with one query head of 32 channels at hidden 64 (head_dim ≠ hidden / heads): uniform
    models only, and the sampled 576 is every layer's width, which llama.cpp loads."""
    point = {**POINT, "num_kv_heads": 1}
    result, rules = inner(tiny, "llamacpp", point)
    assert rules is not None and not rules.heterogeneous
    assert ffn_channels(result.architecture) == [576] * 5
    assert rules.ffn_total(5, 576) == 2880
    assert loadable_problems(result.architecture, "llamacpp") == []


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(tiny_lm_model("llama", **LLAMA), tmp_path_factory.mktemp("tiny256") / "llama")


def test_a_weights_trial_records_how_its_sampled_ffn_width_was_realised(parent_dir: Path, tmp_path: Path) -> None:
    """``ffn_budget`` of a vLLM trial at 576 over 5 layers: the budget's 2880 channels, 2816 for a
    per-layer shape (256's multiple), and what the returned model keeps: all 2880 if it is the uniform
    model, the rounded total if it is a per-layer one; a study stores it and exports it."""
    clear_trial_cache()
    space = {"num_layers": [5], "hidden_size": [64], "ffn_width": {"min": 256, "max": 1024, "step": 64}}
    space.update(num_kv_heads=[1, 2], q_per_kv=[1])
    req = request(parent_dir, tmp_path, params=dict(POINT), target=UNCONSTRAINED.to_dict(), serve_as="vllm")
    req["space"] = space
    req["inner"] = {**INNER, "n_samples": 6, "val_samples": 2}
    result = run_weights_trial(req)
    arch = Architecture.from_dict(result["architecture"])
    kept = sum(ffn_channels(arch))
    budget = result["ffn_budget"]
    assert budget == {
        "width": 576,
        "multiple": 256,
        "channels": 2880,
        "heterogeneous_channels": 2816,
        "kept_channels": kept,
    }
    assert kept == (2880 if arch.active().is_uniform else 2816), ffn_channels(arch)

    import optuna

    trial = optuna.trial.create_trial(
        params={}, distributions={}, values=[1.0], user_attrs={"ffn_budget": budget, "architecture": arch.to_dict()}
    )
    record = trial_record("s.h100-sxm", trial)
    assert record.ffn_budget == budget
    view = type("View", (), {"name": "s.h100-sxm", "records": [record]})()
    row = export_rows(view)[0]  # type: ignore[arg-type]
    assert (row["ffn_channels[budget]"], row["ffn_channels[heterogeneous]"], row["ffn_channels[kept]"]) == (
        2880,
        2816,
        kept,
    )
    clear_trial_cache()


def test_a_study_resumed_with_another_ffn_step_is_refused_in_one_line_naming_the_change(tmp_path: Path) -> None:
    """The study's sampler drew every stored trial from the stored space (Optuna itself would take
    a new step for ``ffn_width`` and mix the two): a changed FFN step is refused in one line that
    names the choice and both ranges, and the stored study is left as it was."""
    parent, space = load_architecture("smollm2-135m"), load_search_space("smollm2-135m")
    target = Target("b200", "datacenter")
    cfg = StudyConfig(
        name="g", model="smollm2-135m", targets=(target,), space=space, trials=2, storage=f"sqlite:///{tmp_path}/g.db"
    )
    study, _, _ = open_study(cfg, target, parent)
    study.enqueue_trial({"num_layers": 20, "hidden_size": 576, "ffn_width": 1088, "num_kv_heads": 3, "q_per_kv": 3})
    study.tell(study.ask(space.distributions()), [0.5, 1.0])
    coarse = SearchSpace.from_dict({**space.to_dict(), "ffn_width": {"min": 256, "max": 1536, "step": 256}})
    with pytest.raises(ConfigError) as refused:
        open_study(replace(cfg, space=coarse), target, parent)
    message = str(refused.value)
    assert "\n" not in message and len(message) < 200, message
    assert "space: ffn_width stored 256..1536 step 64, now 256..1536 step 256" in message
    again, _, _ = open_study(cfg, target, parent)  # the stored space still opens it, its trial intact
    assert [t.params["ffn_width"] for t in again.trials] == [1088]


def test_space_changes_names_only_the_choices_that_differ() -> None:
    space = load_search_space("smollm2-135m").to_dict()
    assert space_changes(space, space) == ""
    other = {**space, "hidden_size": {"choices": [384, 576]}, "sampler": "nsga2"}
    assert space_changes(space, other) == (
        "sampler stored 'tpe', now 'nsga2'; hidden_size stored 384..576 step 64, now [384, 576]"
    )
