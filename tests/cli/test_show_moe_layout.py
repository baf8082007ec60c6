"""`study show` says whether a MoE study's layers each keep their own sizes (the per-layer Puzzle form)
or one size per kind, and why (issue 43: the engine rules restrict the search to what the engine loads)."""

from __future__ import annotations

from types import SimpleNamespace

from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.cli.study.show import _moe_layout


def _view(model: str, **identity: str) -> SimpleNamespace:
    return SimpleNamespace(parent=load_architecture(model), attrs={"identity": identity})


def test_the_moe_layout_line_names_the_form_and_who_reads_it() -> None:
    nemotron = "nemotron-3-super-120b-a12b"
    assert _moe_layout(_view("smollm2-135m", serve_as="vllm", mode="weights")) is None  # dense: no line
    per_layer = _moe_layout(_view(nemotron, serve_as="llamacpp", mode="weights"))
    assert (
        per_layer is not None and per_layer.startswith("each its own expert width") and "read by llamacpp" in per_layer
    )
    by_vllm = _moe_layout(_view(nemotron, serve_as="vllm", mode="plan", plan_quality="estimate-per-layer"))
    assert by_vllm is not None and "vllm reads no per-layer form of nemotron_h" in by_vllm
    plan = _moe_layout(_view(nemotron, serve_as="any", mode="plan", plan_quality="estimate"))
    assert plan is not None and "--plan-quality estimate-per-layer" in plan
    planned = _moe_layout(_view(nemotron, serve_as="any", mode="plan", plan_quality="estimate-per-layer"))
    assert planned is not None and "read by llamacpp, transformers" in planned
    qwen = _moe_layout(_view("qwen3-30b-a3b", serve_as="vllm", mode="weights"))
    assert qwen is not None and "no engine here reads a per-layer form of qwen3_moe" in qwen
