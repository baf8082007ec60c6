"""``autocompress cost`` refuses impossible setups with one line (exit 2, the bad value named, no
traceback) and flags a setup whose peak memory exceeds the device."""

from __future__ import annotations

import json
from typing import Any

import pytest

from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.engine_models import get_engine

BASE = ["cost", "--engine", "vllm", "--dtype", "bf16", "--input-len", "512", "--output-len", "64"]


def cost(*extra: str) -> list[str]:
    return [*BASE, *extra]


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--model", "llama-3.1-8b", "--hardware", "h100", "--tp", "3"], ["--tp 3", "(32)", "(8)"]),
        (["--model", "llama-3.1-8b", "--hardware", "h100", "--tp", "16"], ["--tp 16", "(8)"]),
        (
            ["--model", "llama-3.1-8b", "--hardware", "h100", "--input-len", "10000000"],
            ["10,000,064", "131,072"],
        ),
        (["--model", "smollm2-135m", "--hardware", "h100", "--output-len", "9000"], ["9,512", "8,192"]),
        (
            ["--model", "llama-3.1-8b", "--hardware", "h100", "--engine-option", "memory_fraction=high"],
            ["memory_fraction", "'high'"],
        ),
        (
            ["--model", "llama-3.1-8b", "--hardware", "h100", "--engine-option", "memory_fraction=-0.5"],
            ["memory_fraction", "(0, 1]", "-0.5"],
        ),
        (
            ["--model", "llama-3.1-8b", "--hardware", "h100", "--engine-option", "memory_fraction=1.5"],
            ["memory_fraction", "1.5"],
        ),
        (["--model", "llama-3.1-8b", "--hardware", "h100", "--engine-option", "max_seqs=0"], ["max_seqs", "0"]),
        (["--model", "llama-3.1-8b", "--hardware", "h100", "--engine-option", "max_seqs=2.5"], ["max_seqs", "2.5"]),
        (
            ["--model", "llama-3.1-8b", "--hardware", "h100", "--engine-option", "chunk_tokens=-1"],
            ["chunk_tokens", "-1"],
        ),
    ],
)
def test_impossible_setups_are_one_line_errors(capsys: Any, extra: list[str], needles: list[str]) -> None:
    assert main(cost(*extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("autocompress cost: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_tp_that_divides_the_heads_is_accepted(capsys: Any) -> None:
    assert main(cost("--model", "llama-3.1-8b", "--hardware", "h100", "--tp", "8", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True


def test_a_model_larger_than_the_device_is_flagged(capsys: Any) -> None:
    assert main(cost("--model", "llama-3.1-405b", "--hardware", "rtx5070", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is False
    assert main(cost("--model", "llama-3.1-405b", "--hardware", "rtx5070")) == 0
    out = capsys.readouterr().out
    assert "warning: does not fit" in out and "rtx5070's 12 GiB" in out


def test_concurrency_beyond_the_memory_is_flagged(capsys: Any) -> None:
    assert main(cost("--model", "llama-3.1-8b", "--hardware", "rtx5090", "--concurrency", "100000", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is False


def test_engine_options_in_range_are_kept() -> None:
    engine = get_engine("vllm").with_options(memory_fraction=1, max_seqs=64.0, chunk_tokens=0)
    assert engine.memory_fraction == 1.0 and engine.max_seqs == 64 and isinstance(engine.max_seqs, int)
    with pytest.raises(ConfigError, match="memory_fraction must be a number in"):
        get_engine("trtllm").with_options(memory_fraction=True)


@pytest.mark.parametrize("dtype", ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q4_0"])
def test_gguf_formats_are_priced(capsys: Any, dtype: str) -> None:
    args = ["cost", "--model", "llama-3.1-8b", "--hardware", "rtx5080", "--engine", "llamacpp"]
    assert main([*args, "--dtype", dtype, "--input-len", "512", "--output-len", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 3.5 < out["weights_gib"] < 8.5 and out["tpot_ms"] > out["tpot_floor_ms"]


def test_an_unknown_format_is_a_one_line_error_listing_the_valid_ones(capsys: Any) -> None:
    assert main(cost("--model", "llama-3.1-8b", "--hardware", "h100", "--dtype", "q3_k_s")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "q3_k_s" in err and "q8_0" in err and "iq4_xs" in err, err
    assert main(cost("--model", "llama-3.1-8b", "--hardware", "h100", "--kv-dtype", "int4")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fp8" in err and "q8_0" in err, err


def test_cost_reports_intervals_from_the_held_out_residuals(capsys: Any) -> None:
    args = ["cost", "--model", "qwen3-8b", "--hardware", "h100", "--engine", "vllm", "--dtype", "bf16"]
    args += ["--input-len", "1000", "--output-len", "200", "--concurrency", "16", "--arrival", "steady"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["confidence"] == 0.9
    for metric in ("ttft_ms", "tpot_ms", "e2e_latency_ms", "output_throughput_tok_s"):
        # the band need not hold the median: held-out residuals of a biased engine sit to one side
        assert 0 < data[f"{metric}_low"] < data[f"{metric}_high"], metric
        assert data[f"{metric}_low"] < 2 * data[metric] and data[f"{metric}_high"] > data[metric] / 2, metric
    assert data["tpot_ms_low"] >= data["tpot_floor_ms"]
    assert main([*args, "--json", "--confidence", "0.5"]) == 0
    narrow = json.loads(capsys.readouterr().out)
    assert data["tpot_ms_low"] <= narrow["tpot_ms_low"] <= narrow["tpot_ms_high"] <= data["tpot_ms_high"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tpot_ms" in out and "at 90%" in out
    assert main([*args, "--confidence", "1.5"]) == 2
    assert "--confidence must be a number in (0, 1) (e.g. 0.9)" in capsys.readouterr().err
