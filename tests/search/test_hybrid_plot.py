"""The per-layer structure plot of a MoE / hybrid plan: one panel per sub-block kind the parent has."""

from __future__ import annotations

from pathlib import Path

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.arch.search_space import default_space
from autocompress_opt.search.study.plots import plot_structure


def test_a_hybrid_plan_plots_experts_mamba_heads_and_attention_heads(tmp_path: Path) -> None:
    parent = load_architecture("nemotron-3-nano-30b-a3b")
    space = default_space(parent)
    point = {c.name: max(c.values) for c in space.choices} | {"num_layers": 40, "num_experts": 64}
    child = space.architecture(point, parent)
    written = plot_structure(child, parent, tmp_path / "nano")
    assert sorted(p.suffix for p in written) == [".png", ".svg"]
    svg = next(p for p in written if p.suffix == ".svg").read_text()
    for label in ("routed experts", "Mamba-2 heads", "query heads", "layer dropped"):
        assert label in svg
