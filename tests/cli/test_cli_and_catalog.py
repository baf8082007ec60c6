"""CLI verbs, hardware catalog, workloads and constraints."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.costmodel import METRICS, Scenario, estimate_cost
from autocompress_opt.serving.hardware import HARDWARE, get_hardware, load_hardware_file
from autocompress_opt.serving.workloads import WORKLOADS, Constraint, get_workload, parse_constraint


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cost_json_has_exactly_the_metric_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys,
        "cost",
        "--model",
        "smollm2-135m",
        "--hardware",
        "rtx5070",
        "--engine",
        "vllm",
        "--dtype",
        "bf16",
        "--input-len",
        "512",
        "--output-len",
        "64",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert list(data)[: len(METRICS) + 1] == [*METRICS, "fits"] and data["fits"] is True  # then regime, intervals
    expected = estimate_cost(known_architectures()["smollm2-135m"], "rtx5070", "vllm", Scenario("bf16", 512, 64, 1))
    assert data["tpot_ms"] == pytest.approx(expected.tpot_ms)


def test_cost_concurrency_max_and_tp(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys,
        "cost",
        "--model",
        "llama-3.3-70b",
        "--hardware",
        "h100",
        "--engine",
        "trtllm",
        "--dtype",
        "fp8",
        "--tp",
        "2",
        "--concurrency",
        "max",
        "--input-len",
        "1000",
        "--output-len",
        "1000",
        "--json",
    )
    assert code == 0 and json.loads(out)["max_concurrency"] > 1


def test_arch_json_reports_params_and_layers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "arch", "--model", "smollm2-135m", "--json")
    data = json.loads(out)
    assert code == 0
    # dense and tied: every parameter is active, and the tied embedding is the LM head (counted either way)
    assert data["params"] == {
        "total": 134515008,
        "non_embedding": 134515008 - 49152 * 576,
        "active": 134515008,
        "active_without_embedding_lookup": 134515008,
    }
    assert len(data["layers"]) == 30 and data["kv_bytes_per_token"] == 2 * 2 * 3 * 64 * 30


def test_bad_names_exit_2_with_a_helpful_message(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys,
        "cost",
        "--model",
        "smollm2-135m",
        "--hardware",
        "rtx5070ti",
        "--engine",
        "vllm",
        "--dtype",
        "bf16",
        "--input-len",
        "8",
        "--output-len",
        "8",
    )
    assert code == 2 and "unknown hardware 'rtx5070ti'" in err and "did you mean 'rtx5070'" in err and "h100-sxm" in err
    code, _, err = run_cli(
        capsys,
        "cost",
        "--model",
        "smollm2-135m",
        "--hardware",
        "rtx5070",
        "--engine",
        "sglang",
        "--dtype",
        "bf16",
        "--input-len",
        "8",
        "--output-len",
        "8",
    )
    assert code == 2 and "unknown serving engine 'sglang'" in err and "llamacpp, torch-eager, trtllm, vllm" in err
    code, _, err = run_cli(
        capsys,
        "cost",
        "--model",
        "smollm2-135m",
        "--hardware",
        "rtx5070",
        "--engine",
        "vllm",
        "--dtype",
        "bf16",
        "--input-len",
        "-3",
        "--output-len",
        "8",
    )
    assert code == 2 and "input_len must be a positive int, got -3" in err


def test_every_verb_has_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("arch", "cost", "hardware", "report", "validate", "calibrate"):
        with pytest.raises(SystemExit) as info:
            main([verb, "--help"])
        assert info.value.code == 0
        assert "examples:" in capsys.readouterr().out


def test_hardware_list_json_keeps_sources(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "hardware", "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and {"rtx5070", "rtx5080", "h100-sxm", "h200", "b200"} <= set(rows)
    assert rows["h100-sxm"]["bandwidth_gb_s"] == 3350 and "datasheet" in rows["h100-sxm"]["source"]
    assert rows["rtx5070"]["peak_tflops"]["bf16"] == 61.7  # the FP32-accumulate rate (DESIGN.md §3)


def test_user_hardware_yaml_joins_the_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "- name: my-gpu\n  memory_gib: 24\n  bandwidth_gb_s: 1000\n  peak_tflops: {bf16: 100}\n  source: my bench\n"
    )
    code, out, _ = run_cli(
        capsys,
        "cost",
        "--hardware-file",
        str(path),
        "--model",
        "smollm2-135m",
        "--hardware",
        "my-gpu",
        "--engine",
        "vllm",
        "--dtype",
        "bf16",
        "--input-len",
        "64",
        "--output-len",
        "8",
        "--json",
    )
    assert code == 0 and json.loads(out)["tpot_ms"] > 0
    assert get_hardware("my-gpu").source == "my bench"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  memory_gib: 24\n  bandwith_gb_s: 1000\n  peak_tflops: {bf16: 1}\n")
    with pytest.raises(
        ConfigError, match="unknown key 'bandwith_gb_s' in a hardware entry — did you mean 'bandwidth_gb_s'"
    ):
        load_hardware_file(bad)
    HARDWARE._items.pop("my-gpu")


def test_compute_dtype_falls_back_to_wider_math() -> None:
    assert get_hardware("h100-sxm").compute_dtype("fp4") == "fp8"  # no FP4 tensor cores on Hopper
    assert get_hardware("b200").compute_dtype("fp4") == "fp4"
    assert get_hardware("h100-sxm").interconnect_gb_s == 900 and get_hardware("b200").interconnect_gb_s == 1800


def test_validate_verb_prints_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "validate", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows][:6] == ["pub1", "pub2", "pub3", "pub4", "pub5", "pub6"]  # then 51 more
    assert all({"predicted", "measured", "error", "bound"} <= set(r) for r in rows)


def test_validate_verb_prints_the_error_per_model_family(capsys: pytest.CaptureFixture[str]) -> None:
    """One line per family of the shipped rows, dense and MoE/hybrid, each with its row count."""
    code, out, _ = run_cli(capsys, "validate")
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("family ")}
    assert code == 0 and {"llama", "qwen3_moe", "gpt_oss", "nemotron_h"} <= set(lines)
    assert re.search(r"nemotron_h +26 rows: median \|error\| \d+\.\d%, max \d+\.\d%", lines["nemotron_h"])
    # and the two kinds apart, since each kind's profile parameters are fitted on its own rows
    assert re.search(r"^dense +72 rows: median \|error\| \d+\.\d%", out, re.M)
    assert re.search(r"^MoE/hybrid +55 rows: median \|error\| \d+\.\d%", out, re.M)


def test_validate_rejects_a_csv_without_the_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,model,value\nx,y,1\n")
    code, _, err = run_cli(capsys, "validate", "--measurements", str(path))
    assert code == 2 and "lacks column(s) layers" in err


def test_report_writes_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys,
        "report",
        "--model",
        "smollm2-135m",
        "--workload",
        "in-game",
        "--hardware",
        "rtx5070,b200",
        "--out",
        str(tmp_path),
    )
    assert code == 0 and "in-game" in out
    data = json.loads((tmp_path / "cost-report-smollm2-135m.json").read_text())
    assert {r["hardware"] for r in data["rows"]} == {"rtx5070", "b200"}
    assert (tmp_path / "cost-report-smollm2-135m.png").stat().st_size > 1000


# ------------------------------------------------------------------ workloads
def test_builtin_workloads_have_shapes_and_constraints() -> None:
    assert set(WORKLOADS.names()) == {"local-coding", "datacenter", "in-game"}
    for name in WORKLOADS.names():
        wl = get_workload(name)
        assert wl.constraints and wl.scenario().input_len == wl.input_len
    assert get_workload("local-coding").input_len >= 32768 and get_workload("datacenter").concurrency == "max"


def test_constraints_absolute_and_relative() -> None:
    rel = parse_constraint("tpot_ms", "0.6x")
    absolute = parse_constraint("tpot_ms", "20")
    assert rel == Constraint("tpot_ms", 0.6, relative=True) and absolute == Constraint("tpot_ms", 20.0)
    parent = {"tpot_ms": 10.0, "output_throughput_tok_s": 1000.0}
    assert rel.violation({"tpot_ms": 5.0}, parent) == pytest.approx((5 - 6) / 6)  # feasible: <= 0
    assert absolute.violation({"tpot_ms": 30.0}) == pytest.approx(0.5)  # 50 % over
    thr = parse_constraint("output_throughput_tok_s", "1.5x")
    assert thr.violation({"output_throughput_tok_s": 1200.0}, parent) == pytest.approx((1500 - 1200) / 1500)
    with pytest.raises(ConfigError, match="relative to the parent"):
        rel.violation({"tpot_ms": 5.0})
    with pytest.raises(ConfigError, match="'fast' is neither a number"):
        parse_constraint("tpot_ms", "fast")
    with pytest.raises(ConfigError, match="cannot constrain 'tpot' — did you mean 'tpot_ms'"):
        Constraint("tpot", 1.0)


def test_workload_constraint_overrides() -> None:
    wl = get_workload("in-game").with_constraints({"peak_memory_gib": "4", "tpot_ms": "0.5x"})
    by_metric = {c.metric: c for c in wl.constraints}
    assert by_metric["peak_memory_gib"] == Constraint("peak_memory_gib", 4.0)
    assert by_metric["tpot_ms"] == Constraint("tpot_ms", 0.5, relative=True)


@pytest.mark.slow
def test_validate_held_out_predicts_each_source_without_its_own_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`validate --held-out`: every row is predicted by its engine's profile refitted without the row's
    source (dense parameters from the other dense sources, routed_passes from the other MoE sources),
    so its error differs from the in-sample one; the summary lines say "held-out"."""
    import csv

    from autocompress_opt.serving.validation import SHIPPED_MEASUREMENTS

    with SHIPPED_MEASUREMENTS.open(encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    keep = ("GPUStack performance lab: Qwen3", "Vultr inference cookbook", "Lambda inference models page")
    subset = [r for r in rows if r["engine"] == "vllm" and r["source"].startswith(keep)]
    assert len({r["source"] for r in subset}) >= 4  # three dense GPUStack sources, two MoE/hybrid ones
    path = tmp_path / "subset.csv"
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(subset)
    code, out, _ = run_cli(capsys, "validate", "--measurements", str(path), "--json")
    in_sample = {r["id"]: r["predicted"] for r in json.loads(out)}
    code_held, out_held, _ = run_cli(capsys, "validate", "--measurements", str(path), "--held-out", "--json")
    held = {r["id"]: r["predicted"] for r in json.loads(out_held)}
    assert code == code_held == 0 and set(held) == set(in_sample) == {r["id"] for r in subset}
    assert sum(held[k] != in_sample[k] for k in held) >= len(held) // 2  # refitted per source
    code, out, _ = run_cli(capsys, "validate", "--measurements", str(path), "--held-out")
    assert code == 0 and re.search(r"family nemotron_h +\d+ rows: held-out median \|error\| \d+\.\d%", out)
    assert re.search(r"^MoE/hybrid +\d+ rows: held-out median \|error\| \d+\.\d%", out, re.M)
    # one figure per publication and their median (issue 44): two MoE/hybrid sources, three dense
    assert re.search(r"^MoE/hybrid +median of 2 publication medians: \d+\.\d%", out, re.M)
    assert re.search(r"^dense +median of 3 publication medians: \d+\.\d%", out, re.M)
    assert len(re.findall(r"^  (dense|MoE/hybrid) +\d+ rows  median ", out, re.M)) == 5


def test_validate_held_out_reports_datacenter_and_consumer_rows_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45: consumer GPUs and llama.cpp keep the own model, so their error is printed on a line of
    its own beside the datacenter rows' (a gain on one cannot hide a loss on the other), and each
    JSON row says which it is. pub1 is Llama-3.1-8B on H100 with TensorRT-LLM; the others run llama.cpp
    on GeForce cards."""
    from autocompress_opt.serving.validation import SHIPPED_MEASUREMENTS

    lines = SHIPPED_MEASUREMENTS.read_text(encoding="utf-8").splitlines()
    geforce = [line for line in lines if ",rtx" in line][:2]
    path = tmp_path / "three.csv"
    path.write_text("\n".join([lines[0], *[line for line in lines if line.startswith("pub1,")], *geforce]) + "\n")
    code, out, _ = run_cli(capsys, "validate", "--measurements", str(path), "--held-out", "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert code == 0 and rows.pop("pub1")["segment"] == "datacenter"
    assert [r["segment"] for r in rows.values()] == ["consumer GPU / llama.cpp"] * 2
    code, out, _ = run_cli(capsys, "validate", "--measurements", str(path), "--held-out")
    consumer = statistics.median(abs(r["error"]) for r in rows.values())
    assert code == 0 and re.search(r"^datacenter +1 rows: held-out median \|error\| \d+\.\d%", out, re.M)
    assert re.search(rf"^consumer GPU / llama\.cpp +2 rows: held-out median \|error\| {consumer:.1%}", out, re.M)


def test_validate_held_out_and_fit_together_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "validate", "--held-out", "--fit")
    assert code == 2 and "--held-out refits a profile per held-out source itself" in err
