"""The shipped published measurements: enough rows, each sourced, each above its physical floor
(the roofline at 100 % of peak in the row's own arrival regime), and the shipped profiles'
in-sample error and intervals."""

from __future__ import annotations

import csv
import statistics
from collections import Counter

import pytest

from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.profiles import get_profile
from autocompress_opt.serving.validation import SHIPPED_MEASUREMENTS, is_moe, load_measurements, validate


@pytest.fixture(scope="module")
def raw_rows() -> list[dict[str, str]]:
    with SHIPPED_MEASUREMENTS.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def results() -> list:
    return validate(load_measurements())


def test_at_least_40_sourced_rows_over_every_engine(raw_rows: list[dict[str, str]]) -> None:
    assert len(raw_rows) >= 40
    assert len({r["id"] for r in raw_rows}) == len(raw_rows)
    for row in raw_rows:
        for column in ("source", "engine_version", "stated", "url"):
            assert row[column].strip(), (row["id"], column)
    engines = Counter(r["engine"] for r in raw_rows)
    assert {"llamacpp", "vllm", "trtllm"} <= set(engines) and min(engines.values()) >= 5
    assert any("SGLang" in r["engine_detail"] for r in raw_rows)  # SGLang rows, costed as vLLM
    consumer = [r for r in raw_rows if r["hardware"].startswith("rtx")]
    assert len(consumer) >= 8
    assert len({r["source"] for r in raw_rows}) >= 8  # leave-one-source-out has sources to leave out
    assert {r.get("arrival") or "burst" for r in raw_rows} == {"burst", "steady", "poisson"}


def test_every_measurement_is_above_its_physical_floor(results: list) -> None:
    """No measured latency below the 100 %-of-peak floor and no measured throughput above the
    ceiling, in the row's own regime: a row that breaks this would show the equations (or the
    regime given for the row) cannot describe it."""
    broken = [(r.id, r.metric, r.measured, round(r.bound, 3)) for r in results if not r.bound_ok]
    assert not broken, broken


def test_shipped_profiles_fit_the_rows(results: list) -> None:
    """The engine profiles are fitted to the dense rows; the MoE/hybrid rows are a held-out check
    (benchmarks/bench_validation.py reports their error per family), not part of this fit."""
    dense = {obs.label for obs, _ in load_measurements() if not is_moe(obs)}
    results = [r for r in results if r.id in dense]
    errors = [abs(r.error) for r in results]
    assert statistics.median(errors) <= 0.15
    for engine in ("llamacpp", "vllm", "trtllm"):
        mine = [abs(r.error) for r in results if r.engine == engine]
        assert statistics.median(mine) <= 0.25, engine


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "trtllm"])
def test_shipped_profiles_carry_held_out_residuals(engine: str) -> None:
    profile = get_profile(engine, "h100-sxm")
    heldout = profile.fit.get("heldout", [])
    assert len(heldout) >= 5 and all(r["time_ratio"] > 0 for r in heldout)
    band = profile.interval("tpot_ms", "single", 0.9)
    assert band is not None and 0 < band.low < band.high  # need not straddle 1: a biased engine shows it
    free = profile.fit["free"]
    rows = profile.fit["rows"]
    assert len(free) < len(rows)


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_shipped_profiles_carry_moe_residuals_and_a_physical_pass_count(engine: str) -> None:
    """Issue 44: the engines with MoE rows keep those rows' held-out residuals apart (MoE intervals
    come from them) and fit routed_passes, a pass count over each routed pair's activations: a few,
    not a time."""
    profile = get_profile(engine, "b200")
    assert len(profile.fit.get("heldout_moe", [])) >= 5
    assert 0.5 < profile.routed_passes < 20
    band = profile.interval("output_throughput_tok_s", "burst", 0.9, sparse=True)
    assert band is not None and band.pool.startswith("moe ")


def test_per_publication_errors_and_their_median(raw_rows: list[dict[str, str]]) -> None:
    """One figure per publication (dense and MoE rows apart) and the median of those figures."""
    from autocompress_opt.serving.validation import ValidationRow, median_of_medians, per_publication

    def row(id: str, error: float, source: str) -> ValidationRow:
        return ValidationRow(
            id, "m", "h100-sxm", "vllm", "single", "tpot_ms", 1.0, 1.0 + error, error, 0.5, True, source
        )

    results = [row("a", 0.1, "A"), row("b", -0.3, "A"), row("c", 0.2, "A"), row("d", 0.5, "B"), row("e", 0.04, "C")]
    pubs = per_publication(results, moe_ids={"d", "e"})
    assert [(p.source, p.moe, p.rows) for p in pubs] == [("A", False, 3), ("B", True, 1), ("C", True, 1)]
    assert pubs[0].median == pytest.approx(0.2) and pubs[0].worst == pytest.approx(0.3)
    assert median_of_medians(pubs, moe=True) == pytest.approx(0.27)
    assert median_of_medians(pubs, moe=False) == pytest.approx(0.2)
    assert median_of_medians(pubs[:1], moe=True) is None


def test_held_out_routed_passes_never_see_the_same_setup() -> None:
    """A held-out source's MoE rows are predicted with routed_passes fitted without any row of the
    same model, device and engine from another publication (two releases of one benchmark table are
    one experiment): holding out the TensorRT-LLM 1.0 Qwen3-30B-A3B table must give the same
    prediction whether or not the 1.1 table's Qwen3-30B-A3B rows are in the file."""
    from autocompress_opt.serving.validation import leave_one_source_out, setup_of

    rows = load_measurements()
    qwen = [(o, s) for o, s in rows if o.arch.name == "qwen3-30b-a3b"]
    assert len({s for _, s in qwen}) == 2 and len({setup_of(o) for o, _ in qwen}) == 1
    older = {o.label for o, s in qwen if "release 1.0" in s}
    keep = [(o, s) for o, s in rows if o.engine.name == "trtllm"]
    without = [(o, s) for o, s in keep if o.arch.name != "qwen3-30b-a3b" or o.label in older]
    full = {r.id: r.predicted for r in leave_one_source_out(keep) if r.id in older}
    fewer = {r.id: r.predicted for r in leave_one_source_out(without) if r.id in older}
    assert full and full == pytest.approx(fewer)


def test_moe_and_hybrid_rows_name_known_models(raw_rows: list[dict[str, str]]) -> None:
    """At least 8 published MoE/hybrid rows, over three families, each naming a known model."""
    rows = load_measurements()
    families = Counter(obs.arch.family for obs, _ in rows if is_moe(obs))
    assert sum(families.values()) >= 8 and len(families) >= 3, families
    shapeless = [r for r in raw_rows if not r["layers"].strip()]
    assert len(shapeless) == sum(families.values())


def test_nemotron_3_super_rows_cover_b200_and_h100_in_vllm(raw_rows: list[dict[str, str]]) -> None:
    """Issue 30's validation set: published vLLM runs of Nemotron 3 Super on B200 and H100, one
    source (held out together), each run giving a throughput and an ITL row."""
    rows = [r for r in raw_rows if r["model"] == "nemotron-3-super-120b-a12b"]
    assert {r["hardware"] for r in rows} == {"b200", "h100-sxm"}
    assert {r["engine"] for r in rows} == {"vllm"} and len({r["source"] for r in rows}) == 1
    runs = Counter((r["hardware"], r["tp"], r["weight_dtype"]) for r in rows)
    assert len(runs) == 4 and set(runs.values()) == {2}
    assert {r["metric"] for r in rows} == {"output_throughput_tok_s", "tpot_ms"}


def _write(tmp_path, raw_rows: list[dict[str, str]], **changes: str):
    row = {**next(r for r in raw_rows if r["model"] == "qwen3-30b-a3b"), **changes}
    path = tmp_path / "m.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(raw_rows[0]))
        writer.writeheader()
        writer.writerow(row)
    return path


def test_a_shapeless_row_must_name_a_known_model(tmp_path, raw_rows: list[dict[str, str]]) -> None:
    with pytest.raises(ConfigError, match=r"'qwen9-moe' is not a known model.*known models: .*qwen3-30b-a3b"):
        load_measurements(_write(tmp_path, raw_rows, model="qwen9-moe"))


def test_a_partly_filled_shape_is_rejected(tmp_path, raw_rows: list[dict[str, str]]) -> None:
    with pytest.raises(ConfigError, match=r"shape column\(s\) .*empty: fill all of"):
        load_measurements(_write(tmp_path, raw_rows, layers="48"))
