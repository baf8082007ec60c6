"""``autocompress calibrate --engine``: the models it times, its settings, the fit through a profile's
measured device figures, and (with `make engines`) a small real calibration of llama.cpp and vLLM."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.loadability import loadable_problems
from autocompress_opt.runtimes import calibration as cal
from autocompress_opt.runtimes.calibration import calibrate_engine, engine_architectures, refit_engine
from autocompress_opt.serving.costmodel import Scenario
from autocompress_opt.serving.engine_models import get_engine
from autocompress_opt.serving.fitting import Observation, predict
from autocompress_opt.serving.hardware import get_hardware
from autocompress_opt.serving.profiles import (
    PRIORS,
    CostProfile,
    clear_cache,
    get_profile,
    load_profiles,
    user_profile_dir,
)

SMOLLM2 = known_architectures()["smollm2-135m"]
# figures of a made-up host CPU (what measure_cpu_figures returns), far from the cpu entry's
FIGURES = {"peak_tflops": {"fp32": 0.9, "bf16": 1.8}, "bandwidth_gb_s": 31.0}


# ------------------------------------------------------------------------------------ the models
@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_engine_architectures_are_loadable_varied_and_seeded(engine: str) -> None:
    archs = engine_architectures(SMOLLM2, engine, 15, seed=3)
    assert len(archs) == 15
    assert [a.summary() for a in archs] == [a.summary() for a in engine_architectures(SMOLLM2, engine, 15, seed=3)]
    assert [a.summary() for a in archs] != [a.summary() for a in engine_architectures(SMOLLM2, engine, 15, seed=4)]
    for i, arch in enumerate(archs):
        assert loadable_problems(arch, engine) == [], arch.summary()
        heads = {layer.num_heads for layer in arch.layers if layer.attention}
        assert len(heads) == 1 and arch.hidden_size == heads.pop() * 64  # query heads global, head size kept
        assert all(layer.ffn_width % 256 == 0 for layer in arch.layers if layer.ffn)
        assert arch.active().is_uniform == (i % 3 == 0)
    layers = [layer for arch in archs for layer in arch.layers]
    assert any(not layer.attention for layer in layers) and any(not layer.ffn for layer in layers)
    assert len({layer.num_kv_heads for layer in layers if layer.attention}) > 1
    assert len({arch.num_layers for arch in archs}) > 5  # depths spread over the range
    if engine == "vllm":
        assert all(arch.layers[0].attention for arch in archs)  # vLLM 0.32 fails to start without it


def test_engine_architectures_refuse_bad_counts() -> None:
    with pytest.raises(ConfigError, match="number of models must be >= 1, got 0"):
        engine_architectures(SMOLLM2, "llamacpp", 0)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"engine": "sglang"}, "the engine to calibrate must be one of llamacpp, vllm, got 'sglang'"),
        ({"n_models": 1}, "n_models must be an int >= 2, got 1"),
        ({"heldout_fraction": 1.0}, r"heldout_fraction must be a number in \(0, 1\), got 1.0"),
        ({"n_models": 3, "heldout_fraction": 0.9}, "holding out 0.9 of 3 models leaves none to fit"),
        ({"gguf_type": "q3_k"}, "GGUF type must be one of f32, f16, .*, got 'q3_k'"),
        ({"vllm_dtype": "int8"}, "vLLM dtype must be one of bfloat16.*, got 'int8'"),
        ({"concurrencies": (1, 0)}, r"concurrencies \(1, 0\): each must be a positive int, got 0"),
        ({"gen_len": 1}, "gen_len must be an int >= 2, got 1"),
        ({"threads": 0}, "threads must be a positive int or None, got 0"),
        ({"repetitions": 0}, "repetitions must be a positive int, got 0"),
        ({"passes": 0}, "passes must be a positive int, got 0"),
    ],
)
def test_bad_settings_are_named_before_any_work(change: dict[str, Any], message: str, tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {"n_models": 4, "out": tmp_path / "p.yaml", "progress": False, **change}
    with pytest.raises(ConfigError, match=message):
        calibrate_engine(kwargs.pop("engine", "llamacpp"), **kwargs)
    assert not (tmp_path / "p.yaml").exists()


# ------------------------------------------------------------------------------------ the reference
def test_a_profile_reference_fixes_the_figures_its_efficiencies_are_fractions_of() -> None:
    """A profile fitted on measured CPU figures predicts the same whatever figures the ``cpu`` entry
    holds (another calibration may rewrite them); without a reference the entry's figures count."""
    cpu, eng = get_hardware("cpu"), get_engine("llamacpp")
    other = replace(cpu, name="cpu-recalibrated", peak_tflops={"fp32": 3.0, "bf16": 6.0}, bandwidth_gb_s=90.0)
    plain = replace(PRIORS["llamacpp"], hardware="cpu")
    pinned = replace(plain, reference=FIGURES)
    pp, tg = Scenario("fp16", 128, 1, 1), Scenario("fp16", 1, 32, 1)
    obs = [Observation(SMOLLM2, hw, eng, pp, "prefill_throughput_tok_s", 1.0) for hw in (cpu, other)]
    obs += [Observation(SMOLLM2, hw, eng, tg, "decode_throughput_tok_s", 1.0) for hw in (cpu, other)]
    (pp_cpu, _), (pp_other, _), (tg_cpu, _), (tg_other, _) = predict(obs, pinned)
    assert pp_cpu == pytest.approx(pp_other) and tg_cpu == pytest.approx(tg_other)
    (pp_cpu, _), (pp_other, _), (tg_cpu, _), (tg_other, _) = predict(obs, plain)
    assert pp_other > 1.5 * pp_cpu and tg_other > 1.5 * tg_cpu
    again = CostProfile.from_dict(json.loads(json.dumps(pinned.to_dict())))
    assert again.reference == FIGURES and again == pinned


def test_a_reference_needs_both_figures_and_known_keys() -> None:
    with pytest.raises(ConfigError, match="a reference needs peak_tflops and bandwidth_gb_s, got \\['peak_tflops'\\]"):
        CostProfile("llamacpp", hardware="cpu", reference={"peak_tflops": {"fp32": 1.0}})
    with pytest.raises(ConfigError, match="bandwith"):
        CostProfile("llamacpp", hardware="cpu", reference={**FIGURES, "bandwith": 3})


# ------------------------------------------------------------------------------------ the fit
def _known_engine(truth: CostProfile) -> Any:
    """A timer that reports what the cost model predicts under ``truth`` on :data:`FIGURES` (so the
    fit's job is known), as llama-bench's two numbers in the record a real run leaves."""
    hw = get_hardware("cpu").with_figures(FIGURES)

    def timer(model_dir: Path, arch: Any, settings: dict[str, Any]) -> dict[str, Any]:
        assert (model_dir / "config.json").is_file()  # the real export was written
        pp = Scenario(dtype="fp16", input_len=settings["prompt_len"], output_len=1, concurrency=1)
        tg = Scenario(dtype="fp16", input_len=1, output_len=settings["gen_len"], concurrency=1)
        obs = [
            Observation(arch, hw, get_engine("llamacpp"), pp, "prefill_throughput_tok_s", 1.0),
            Observation(arch, hw, get_engine("llamacpp"), tg, "decode_throughput_tok_s", 1.0),
        ]
        (pp_tok_s, _), (tg_tok_s, _) = predict(obs, truth)
        return {"llama_bench": {"pp": float(pp_tok_s), "tg": float(tg_tok_s)}}

    return timer


@pytest.mark.slow
def test_the_fit_recovers_a_known_engine_and_holds_models_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smollm2_gguf: Path
) -> None:
    """The whole pipeline (real models drawn, built and exported; split; fit; held-out error; the
    profile saved and found by ``autocompress cost``), with the engine's timings replaced by the cost
    model's own predictions under known parameters: the fit must find them again."""
    from autocompress_opt.runtimes import install

    truth = replace(PRIORS["llamacpp"], hardware="cpu", mfu=0.31, mbu=0.52, kernel_launch_us=9.0, step_overhead_ms=0.7)
    truth = replace(truth, reference=FIGURES)
    monkeypatch.setitem(cal._ENGINES, "llamacpp", (cal._prepare_vllm, _known_engine(truth)))  # the checkpoint
    monkeypatch.setattr(install, "llamacpp", lambda: None)
    monkeypatch.setattr(cal, "measure_cpu_figures", lambda: FIGURES)
    monkeypatch.setenv("HOME", str(tmp_path))  # the user profile folder under it
    out = user_profile_dir() / "cpu-llamacpp.yaml"
    assert out.is_relative_to(tmp_path)
    try:
        result = calibrate_engine("llamacpp", n_models=8, heldout_fraction=0.5, seed=1, progress=False)
        assert result.path == out
        assert get_profile("llamacpp", "cpu") == result.profile  # the user folder wins
    finally:
        clear_cache()  # no other test sees this profile

    assert sorted(row["split"] for row in result.rows) == ["heldout"] * 4 + ["train"] * 4
    assert result.heldout_mdape["all"] < 0.01 and result.train_mdape["all"] < 0.01
    assert set(result.heldout_mdape) == {"all", "prefill_throughput_tok_s", "decode_throughput_tok_s"}
    for row in result.rows:
        for key, value in row["measured"].items():
            assert row["predicted"][key] == pytest.approx(value, rel=0.02)
    assert result.profile.reference == FIGURES and result.profile.hardware == "cpu"
    assert len(result.profile.fit["heldout"]) == 8  # 4 models x 2 measurements, for --confidence
    assert load_profiles(out.parent)[0][("cpu", "llamacpp")] == result.profile


# ------------------------------------------------------------------------------------ the real engines
def test_llamacpp_calibration_for_real(llamacpp_engine: Any, tmp_path: Path) -> None:
    """Four pruned SmolLM2 models converted, quantised (q8_0: the quantise path) and timed by
    llama-bench; the fitted profile predicts the fitting models and is saved."""
    result = calibrate_engine(
        "llamacpp",
        n_models=4,
        gguf_type="q8_0",
        prompt_len=32,
        gen_len=8,
        repetitions=1,
        out=tmp_path / "cpu-llamacpp.yaml",
        progress=False,
    )
    assert len(result.rows) == 4 and result.path == tmp_path / "cpu-llamacpp.yaml"
    for row in result.rows:
        assert row["measured"]["prefill_throughput_tok_s"] > row["measured"]["decode_throughput_tok_s"] > 0
        assert len(row["passes"]) == 2 and row["gguf_mib"] > 0  # two passes by default, the fastest kept
        bench = row["passes"][0]["llama_bench"]
        assert bench["llamacpp"] and bench["threads"] >= 1 and len(bench["pp_samples"]) == 1
        fastest = max(p["measured"]["prefill_throughput_tok_s"] for p in row["passes"])
        assert row["measured"]["prefill_throughput_tok_s"] == fastest
    # four parameters, four models, timings as noisy as the machine: a fit, not a benchmark; within 4x
    # catches a broken metric or unit (ms against s, a throughput compared as a latency), not noise
    for row in result.rows:
        for key, value in row["measured"].items():
            assert value / 4 < row["predicted"][key] < value * 4, (key, row)
    assert result.profile.reference["bandwidth_gb_s"] > 0
    assert load_profiles(tmp_path)[0][("cpu", "llamacpp")] == result.profile

    # the saved timings fitted again (as benchmarks/bench_engine_calibration.py --refit does): same split,
    # same numbers, same profile
    saved = json.loads(json.dumps(result.to_dict()))
    again = refit_engine(saved, out=tmp_path / "refit.yaml")
    assert [row["split"] for row in again.rows] == [row["split"] for row in result.rows]
    assert [row["measured"] for row in again.rows] == [row["measured"] for row in result.rows]
    assert again.heldout_mdape == pytest.approx(result.heldout_mdape, rel=1e-3)
    assert again.profile.mbu == pytest.approx(result.profile.mbu, rel=1e-3)
    saved["rows"][1]["summary"] = "30/30 layers, something else"
    with pytest.raises(ConfigError, match="model 1 was '30/30 layers, something else' when timed"):
        refit_engine(saved, out=tmp_path / "refit.yaml")


def test_vllm_calibration_for_real(vllm_engine: Any, tmp_path: Path) -> None:
    """Two pruned SmolLM2 models (one uniform: a plain Llama checkpoint; one DeciLM) timed by vLLM's
    offline engine; TTFT and TPOT measured and fitted. Eager and one pass: vLLM's compilation (the
    default, which benchmarks/bench_engine_calibration.py times) costs about a minute per load here."""
    result = calibrate_engine(
        "vllm",
        n_models=2,
        prompt_len=32,
        gen_len=4,
        concurrencies=(1,),
        repetitions=1,
        passes=1,
        vllm_eager=True,
        out=tmp_path / "cpu-vllm.yaml",
        progress=False,
    )
    assert [row["uniform"] for row in result.rows] == [True, False]
    for row in result.rows:
        # the wave's prefill is compared as a throughput: c prompts x P tokens / the last first token's time
        ttft = row["passes"][0]["timings"][1]["ttft_ms"]
        assert row["measured"]["prefill_throughput_tok_s"] == pytest.approx(32 * 1e3 / ttft, rel=1e-3)
        assert row["measured"]["tpot_ms"] > 0
        assert row["passes"][0]["vllm"].startswith("0.")
        assert len(row["passes"]) == 1 and row["measured"] == row["passes"][0]["measured"]
    assert load_profiles(tmp_path)[0][("cpu", "vllm")] == result.profile
