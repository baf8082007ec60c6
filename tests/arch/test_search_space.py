"""Search spaces: YAML validation and 'every sampled point is a valid sub-architecture'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.arch.search_space import CHOICES, SearchSpace, default_space, load_search_space
from autocompress_opt.errors import ConfigError

BUNDLED = sorted(p.stem for p in (Path(__file__).parents[2] / "search_spaces").glob("*.yaml"))


def test_bundled_spaces_load_and_fit_their_parents() -> None:
    assert {"smollm2-135m", "mistral-large-2"} <= set(BUNDLED)
    for name in BUNDLED:
        space = load_search_space(name)
        space.check_parent(known_architectures()[name])
        assert space.size > 100


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(BUNDLED + ["default:llama-3.1-8b", "default:qwen3-8b"]), st.data())
def test_every_sampled_point_is_a_valid_sub_architecture(name: str, data: st.DataObject) -> None:
    """Any point of the space gives a valid Architecture no larger than the parent anywhere."""
    if name.startswith("default:"):
        parent = known_architectures()[name.split(":")[1]]
        space = default_space(parent)
    else:
        parent, space = known_architectures()[name], load_search_space(name)
    params = {c.name: data.draw(st.sampled_from(c.values)) for c in space.choices}
    arch = space.architecture(params, parent)
    kept = [layer for layer in arch.layers if not layer.is_noop]
    assert len(kept) == params["num_layers"] and arch.num_layers == parent.num_layers
    assert arch.hidden_size == params["hidden_size"] <= parent.hidden_size
    for layer, ref in zip(arch.layers, parent.layers):
        if not layer.is_noop:
            assert layer.ffn_width <= ref.ffn_width and layer.num_heads <= ref.num_heads
            assert layer.num_kv_heads <= ref.num_kv_heads and layer.num_heads % layer.num_kv_heads == 0
    assert arch.num_params <= parent.num_params


def test_layer_order_decides_which_layers_stay() -> None:
    parent = known_architectures()["smollm2-135m"]
    space = load_search_space("smollm2-135m")
    params = {"num_layers": 10, "hidden_size": 576, "ffn_width": 1536, "num_kv_heads": 3, "q_per_kv": 3}
    default = space.architecture(params, parent)
    assert [i for i, l in enumerate(default.layers) if not l.is_noop] == list(range(9)) + [29]
    ranked = space.architecture(params, parent, layer_order=list(range(29, -1, -1)))
    assert [i for i, l in enumerate(ranked.layers) if not l.is_noop] == list(range(20, 30))


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "sampler: tpe\nnum_layer: {min: 1, max: 3}",
            "unknown search-space key 'num_layer' — did you mean 'num_layers'",
        ),
        (
            "num_layers: {min: 9, max: 3}\nhidden_size: 64\nffn_width: 64\nnum_kv_heads: 1\nq_per_kv: 1",
            "num_layers range is empty (min 9 > max 3)",
        ),
        (
            "num_layers: {choices: []}\nhidden_size: 64\nffn_width: 64\nnum_kv_heads: 1\nq_per_kv: 1",
            "no candidate values",
        ),
        (
            "num_layers: 3\nhidden_size: 64\nffn_width: 64\nnum_kv_heads: 1\nq_per_kv: 1\nsampler: cmaes",
            "unknown sampler 'cmaes'",
        ),
        (
            "num_layers: {min: 1, max: 3, stride: 2}\nhidden_size: 64\nffn_width: 64\nnum_kv_heads: 1\nq_per_kv: 1",
            "unknown key 'stride' in num_layers",
        ),
    ],
)
def test_bad_yaml_is_rejected_with_a_clear_message(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_search_space(path)


def test_a_choice_larger_than_the_parent_is_an_error() -> None:
    space = SearchSpace.from_dict(
        {"num_layers": 31, "hidden_size": 576, "ffn_width": 1536, "num_kv_heads": 3, "q_per_kv": 3}
    )
    with pytest.raises(ConfigError, match="num_layers choice 31 is larger than the parent's 30"):
        space.check_parent(known_architectures()["smollm2-135m"])
    space = SearchSpace.from_dict(
        {"num_layers": 3, "hidden_size": 576, "ffn_width": 2048, "num_kv_heads": 3, "q_per_kv": 3}
    )
    with pytest.raises(ConfigError, match="ffn_width choice 2048 is larger than the parent's 1536"):
        space.check_parent(known_architectures()["smollm2-135m"])


def test_yaml_round_trip_and_distributions() -> None:
    space = load_search_space("smollm2-135m")
    assert SearchSpace.from_dict(space.to_dict()) == space
    dists = space.distributions()
    assert set(dists) == set(CHOICES)
    assert (dists["hidden_size"].low, dists["hidden_size"].high, dists["hidden_size"].step) == (384, 576, 64)
    uneven = SearchSpace.from_dict({**space.to_dict(), "num_kv_heads": {"choices": [1, 2, 8]}})
    assert list(uneven.distributions()["num_kv_heads"].choices) == [1, 2, 8]  # uneven steps: categorical


def test_plan_mode_scores_retained_importance_when_given_an_importance_record(tmp_path: Path) -> None:
    """With the parent's importance record the plan proxy is the retained importance mass:
    1 for the whole parent, in (0, 1) for a smaller point, and it drops layers by importance."""
    import torch
    from tiny_families import tiny_model

    from autocompress_opt.hf.adapters import adapter_for
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.search.study.trials import plan_trial

    model = tiny_model("llama", num_hidden_layers=4)
    parent = adapter_for(model).architecture(model)
    tokens = torch.randint(0, parent.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    importance = estimate_importance(model, tokens, model_id="tiny", data_id="t", seed=0, progress=False)
    path = importance.save(tmp_path / "imp")
    space = default_space(parent)
    full = {c.name: max(c.values) for c in space.choices}
    small = {c.name: min(c.values) for c in space.choices}
    request = {
        "parent": parent.to_dict(),
        "space": space.to_dict(),
        "importance": str(path),
        "target": {"hardware": "rtx5070", "workload": "in-game"},
    }
    whole = plan_trial({**request, "params": full})
    part = plan_trial({**request, "params": small})
    assert whole["quality_kind"] == "retained_importance" and whole["quality"] == pytest.approx(1.0)
    assert 0 < part["quality"] < 1
    kept = [i for i, layer in enumerate(part["architecture"]["layers"]) if layer["attention"] or layer["ffn"]]
    ranked = importance.layer_order()
    assert kept == sorted(ranked[: small["num_layers"]])
    plain = plan_trial({**request, "importance": None, "params": small})
    assert plain["quality_kind"] == "retained_params"
