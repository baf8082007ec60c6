"""Uniform baselines: the Minitron-style recipe (sizes from a parameter target, exact hand-checked
counts) and its pick under a constraint (the largest feasible parameter fraction per width recipe,
ranked by parameters)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.baselines import (
    BASELINE_WIDTHS,
    PARAM_FRACTIONS,
    MinitronPick,
    minitron_pick,
    minitron_picks,
    rank_picks,
    resolve_param_target,
    uniform_baseline,
)

SMOLLM2 = known_architectures()["smollm2-135m"]


# ------------------------------------------------------------------------- baseline recipe
def test_baseline_drops_capped_depth_then_shrinks_ffn() -> None:
    """SmolLM2-135M at 0.6: 7 of 30 layers go (the 25% cap), then FFN 1536 → 768, the widest
    multiple of 64 that fits (hand check: 23 layers × (884,736 attention + 3·576·768 FFN + 1,152
    norms) + 576 final norm + 49152·576 tied embedding = 79,210,944 ≤ int(0.6 · 134,515,008) =
    80,709,004; FFN 832 would add 23·3·576·64 = 2,543,616 and overshoot)."""
    target = uniform_baseline(SMOLLM2, 0.6)
    assert target.is_uniform and target.num_layers == 23
    assert target.layers[0].ffn_width == 768 and target.layers[0].num_heads == 9
    assert target.num_params == 79_210_944 <= int(0.6 * SMOLLM2.num_params)
    wider = replace(target, layers=(replace(target.layers[0], ffn_width=832),) * 23)
    assert wider.num_params > int(0.6 * SMOLLM2.num_params)


def test_baseline_uses_depth_alone_when_it_suffices() -> None:
    target = uniform_baseline(SMOLLM2, 0.95)
    assert target.layers[0].ffn_width == 1536 and 23 <= target.num_layers < 30
    assert uniform_baseline(SMOLLM2, 1.0) is SMOLLM2
    assert uniform_baseline(SMOLLM2, 100_000_000).num_params <= 100_000_000  # an absolute count


def test_baseline_hidden_and_ffn_shrink_by_one_ratio() -> None:
    """Minitron's width recipe: hidden and FFN keep the same fraction (each rounded down to a multiple
    of 64), the largest that fits; heads are kept. SmolLM2 at 0.6: 23 layers (the depth cap), then
    hidden 576 → 448 and FFN 1536 → 1344 (ratio ≥ 7/9 for hidden 448, so FFN ≥ 1194.7 → 1344 at the
    largest ratio that fits: hand check 23 × (2·576·448 + 2·192·448 + 3·448·1344 + 2·448) + 448 +
    49152·448 = 79,413,824 ≤ 80,709,004)."""
    target = uniform_baseline(SMOLLM2, 0.6, width="hidden+ffn")
    assert target.is_uniform and target.num_layers == 23 and target.layers[0].num_heads == 9
    assert (target.hidden_size, target.layers[0].ffn_width) == (448, 1344)
    assert target.num_params == 79_413_824 <= int(0.6 * SMOLLM2.num_params)
    hidden_ratio, ffn_ratio = target.hidden_size / 576, target.layers[0].ffn_width / 1536
    assert ffn_ratio >= hidden_ratio and ffn_ratio - hidden_ratio < 64 / 576 + 64 / 1536
    assert uniform_baseline(SMOLLM2, 0.95, width="hidden+ffn") == uniform_baseline(SMOLLM2, 0.95)  # depth alone


def test_baseline_hidden_width_reaches_budgets_below_the_embeddings() -> None:
    """A big vocabulary (embeddings 2/3 of the parent): FFN-only pruning cannot reach 40%, hidden+ffn can."""
    wide_vocab = Architecture.uniform(
        num_layers=8,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=1,
        ffn_width=512,
        vocab_size=8 * 4096,
        name="wide-vocab",
    )
    assert wide_vocab.embedding_params > 0.6 * wide_vocab.num_params
    with pytest.raises(ConfigError, match=r"hidden\+ffn.*embeddings"):
        uniform_baseline(wide_vocab, 0.4)
    target = uniform_baseline(wide_vocab, 0.4, width="hidden+ffn")
    assert target.num_params <= int(0.4 * wide_vocab.num_params) and target.hidden_size < 256
    assert target.hidden_size % 64 == 0 and target.layers[0].ffn_width % 64 == 0


def test_baseline_errors() -> None:
    with pytest.raises(ConfigError, match="cannot reach 1,000,000 parameters.*embeddings"):
        uniform_baseline(SMOLLM2, 1_000_000)
    with pytest.raises(ConfigError, match="needs a uniform parent"):
        uniform_baseline(replace(SMOLLM2, layers=(LayerSpec.dropped(),) + SMOLLM2.layers[1:]), 0.5)
    with pytest.raises(ConfigError, match="fraction in \\(0, 1\\] or a parameter count"):
        resolve_param_target(0, 100)
    with pytest.raises(ConfigError, match="max_layer_drop"):
        uniform_baseline(SMOLLM2, 0.5, max_layer_drop=1.5)
    with pytest.raises(ConfigError, match="width must be one of ffn, hidden\\+ffn, got 'heads'"):
        uniform_baseline(SMOLLM2, 0.5, width="heads")


def test_one_layer_baseline_takes_the_first_layers_window() -> None:
    """The windows come from the first ``n`` of the default layer order: the first ``n - 1`` layers and
    the last, and the first alone at ``n = 1`` (a 4-layer Gemma-style parent sliding over 8 tokens in
    layers 0-2, full attention in layer 3)."""
    base = Architecture.uniform(
        num_layers=4,
        hidden_size=64,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        ffn_width=256,
        vocab_size=64,
        family="gemma3_text",
        qk_norm=True,
        tie_embeddings=True,
    )
    parent = replace(base, layers=tuple(replace(s, window=w) for s, w in zip(base.layers, (8, 8, 8, None))))
    two = uniform_baseline(parent, replace(parent, layers=parent.layers[:2]).num_params, max_layer_drop=0.9)
    assert [s.window for s in two.layers] == [8, None]
    one = uniform_baseline(parent, replace(parent, layers=parent.layers[:1]).num_params, max_layer_drop=0.9)
    assert [s.window for s in one.layers] == [8] and one.layers[0].ffn_width == 256


# ------------------------------------------------------------------ the pick under a constraint
def params_at_most(limit: int) -> Callable[[Architecture], bool]:
    """A constraint check that accepts architectures of at most ``limit`` parameters, counting its calls."""

    def feasible(arch: Architecture) -> bool:
        feasible.calls.append(arch)  # type: ignore[attr-defined]
        return arch.num_params <= limit

    feasible.calls = []  # type: ignore[attr-defined]
    return feasible


def test_param_fractions_are_quarter_percent_steps_from_100_down_to_5_25() -> None:
    assert len(PARAM_FRACTIONS) == 380 and PARAM_FRACTIONS[0] == 1.0 and PARAM_FRACTIONS[-1] == 0.0525
    assert all(a - b == pytest.approx(0.0025) for a, b in itertools.pairwise(PARAM_FRACTIONS))


def test_each_recipe_picks_its_largest_feasible_fraction() -> None:
    """Under "at most 60 % of the parameters" each recipe picks the largest fraction whose baseline fits:
    the next larger fraction's baseline does not."""
    limit = int(0.6 * SMOLLM2.num_params)
    picks = minitron_picks(SMOLLM2, params_at_most(limit))
    assert sorted(p.width for p in picks) == sorted(BASELINE_WIDTHS)
    for pick in picks:
        assert pick.architecture == uniform_baseline(SMOLLM2, pick.param_fraction, width=pick.width)
        assert pick.architecture.num_params <= limit and pick.param_fraction >= 0.6
        larger = PARAM_FRACTIONS[PARAM_FRACTIONS.index(pick.param_fraction) - 1]
        assert uniform_baseline(SMOLLM2, larger, width=pick.width).num_params > limit


def test_picks_are_ranked_by_parameters_and_the_pick_is_the_first() -> None:
    """SmolLM2 under "at most 60 %" (80,709,004): hidden+FFN's largest fitting target is 67.25 %, the
    23-layer hidden 448 / FFN 1344 model of 79,413,824 parameters (the 60 % target's, test above);
    FFN alone's is 60.75 %, 23 layers of FFN 768 (79,210,944). Hidden+FFN keeps more: it comes first."""
    feasible = params_at_most(int(0.6 * SMOLLM2.num_params))
    picks = minitron_picks(SMOLLM2, feasible)
    assert [(p.width, p.param_fraction, p.architecture.num_params) for p in picks] == [
        ("hidden+ffn", 0.6725, 79_413_824),
        ("ffn", 0.6075, 79_210_944),
    ]
    assert minitron_pick(SMOLLM2, feasible) == picks[0]
    assert rank_picks(reversed(picks)) == picks


def test_a_tie_in_parameters_goes_to_the_ffn_recipe() -> None:
    arch = uniform_baseline(SMOLLM2, 0.9)
    tied = [MinitronPick("hidden+ffn", 0.9, arch), MinitronPick("ffn", 0.9, arch)]
    assert [p.width for p in rank_picks(tied)] == ["ffn", "hidden+ffn"]


def test_the_check_runs_largest_first_and_stops_at_the_first_pass() -> None:
    """Fraction 1.0 is the parent itself; with everything feasible each recipe is checked once."""
    feasible = params_at_most(SMOLLM2.num_params)
    picks = minitron_picks(SMOLLM2, feasible)
    assert len(feasible.calls) == 2 and all(a is SMOLLM2 for a in feasible.calls)  # type: ignore[attr-defined]
    assert [(p.width, p.param_fraction) for p in picks] == [("ffn", 1.0), ("hidden+ffn", 1.0)]


def test_no_feasible_fraction_leaves_the_recipe_out_and_the_pick_raises() -> None:
    """A parent whose embeddings hold 79 % of its parameters: at 25 % only hidden+FFN has a pick (FFN
    alone cannot go below the embeddings); a check nothing passes leaves no pick at all."""
    wide_vocab = Architecture.uniform(
        num_layers=8, hidden_size=256, num_heads=4, num_kv_heads=1, ffn_width=512, vocab_size=8 * 4096, name="wv"
    )
    picks = minitron_picks(wide_vocab, params_at_most(int(0.25 * wide_vocab.num_params)))
    assert [p.width for p in picks] == ["hidden+ffn"]
    assert minitron_picks(wide_vocab, lambda arch: False) == []
    with pytest.raises(ConfigError, match="no Minitron-style baseline of wv meets the constraints"):
        minitron_pick(wide_vocab, lambda arch: False)


def test_bad_recipe_settings_are_errors_not_missing_picks() -> None:
    with pytest.raises(ConfigError, match="max_layer_drop"):
        minitron_picks(SMOLLM2, lambda arch: True, max_layer_drop=1.5)
    with pytest.raises(ConfigError, match="needs a uniform parent"):
        minitron_pick(replace(SMOLLM2, layers=(LayerSpec.dropped(),) + SMOLLM2.layers[1:]), lambda arch: True)
