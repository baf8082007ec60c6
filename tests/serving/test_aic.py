"""The optional AIConfigurator backend (``serving/aic.py``, extra ``aic``).

Without the package (CI): ``autocompress cost`` behaves as before, ``--backend aic`` is a one-line
error naming the install command, and nothing imports ``aiconfigurator_core``. With it (skipped
otherwise): a heterogeneous architecture's price is the sum of its layers' lookups, and a uniform
Llama-3.1-8B agrees with AIConfigurator's own compiled estimate of the same config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.catalog import load_architecture
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving import aic
from autocompress_opt.serving.costmodel import Scenario
from autocompress_opt.serving.engine_models import get_engine

COST = ["cost", "--model", "llama-3.1-8b", "--engine", "trtllm", "--dtype", "fp8", "--concurrency", "16"]
COST += ["--input-len", "1000", "--output-len", "200"]
SKIP = f"AIConfigurator is not installed: {aic.INSTALL_HINT}"


def _cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's parser.error
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behave as CI does, where the extra is not installed, whether or not it is here."""
    monkeypatch.setattr(aic, "aic_installed", lambda: False)


# ------------------------------------------------------------------ without the package
def test_default_backend_without_the_package_is_the_own_model_unchanged(capsys: Any, not_installed: None) -> None:
    code, auto, _ = _cli(capsys, *COST, "--hardware", "h200", "--json")
    code_own, own, _ = _cli(capsys, *COST, "--hardware", "h200", "--json", "--backend", "own")
    assert code == code_own == 0
    assert json.loads(auto) == json.loads(own) and json.loads(auto)["backend"] == "own"


def test_backend_aic_without_the_package_is_a_one_line_error(capsys: Any, not_installed: None) -> None:
    code, out, err = _cli(capsys, *COST, "--hardware", "h200", "--backend", "aic")
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and aic.INSTALL_HINT in err


def test_cost_never_imports_aiconfigurator_unless_asked() -> None:
    """``--backend own`` (and ``import autocompress_opt``) leave ``aiconfigurator_core`` unloaded."""
    code = (
        "import sys; from autocompress_opt.cli import main; "
        f"main({[*COST, '--hardware', 'h200', '--backend', 'own', '--json']!r}); "
        "print('LOADED' if any(m.startswith('aiconfigurator') for m in sys.modules) else 'CLEAN')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("CLEAN")


@pytest.mark.parametrize(
    ("change", "named", "valid"),
    [
        ({"hardware": "rtx5090"}, "'rtx5090'", "h100-sxm, h200, b200"),
        ({"engine": "llamacpp"}, "'llamacpp'", "vllm, trtllm"),
        ({"dtype": "q4_k_m"}, "'q4_k_m'", "bf16, fp16, fp8, fp4"),
        ({"kv_dtype": "q8_0"}, "'q8_0'", "bf16, fp16, fp8"),
        ({"arrival": "steady"}, "'steady'", "--backend own"),
        ({"requests": 64}, "--requests 64", "--backend own"),
    ],
)
def test_an_uncovered_target_names_the_value_and_what_is_valid(change: dict[str, Any], named: str, valid: str) -> None:
    target = {"hardware": "h200", "engine": "trtllm"}
    target.update({k: v for k, v in change.items() if k in target})
    fields = {k: v for k, v in change.items() if k not in target}
    scenario = Scenario(**{"dtype": "fp8", "concurrency": 16, **fields})
    arch = load_architecture("llama-3.1-8b")
    with pytest.raises(ConfigError, match="aic backend") as info:
        aic.check_covered(arch, target["hardware"], target["engine"], scenario)
    assert named in str(info.value) and valid in str(info.value)
    # auto falls back to the own model wherever aic does not cover the target, installed or not
    assert aic.resolve_backend("auto", arch, target["hardware"], target["engine"], scenario) == "own"


def test_moe_and_mamba_layers_are_left_to_the_own_model() -> None:
    arch = load_architecture("nemotron-3-super-120b-a12b")
    with pytest.raises(ConfigError, match="MoE and Mamba-2"):
        aic.check_covered(arch, "b200", "vllm", Scenario("bf16"))


# ------------------------------------------------------------------ with the package
def _hetero() -> Architecture:
    """Llama-3.1-8B's hidden size and vocabulary, 6 layers that all differ: FFN widths, KV heads,
    query heads, one layer without attention, one without an FFN."""
    layers = (
        LayerSpec(True, 32, 8, 128, True, 14336),
        LayerSpec(True, 32, 4, 128, True, 9216),
        LayerSpec(False, ffn=True, ffn_width=6144),
        LayerSpec(True, 24, 8, 128, True, 11264),
        LayerSpec(True, 32, 8, 128, False),
        LayerSpec(True, 16, 2, 128, True, 3072),
    )
    return Architecture(vocab_size=128256, hidden_size=4096, layers=layers, name="hetero-6")


@pytest.fixture(scope="module")
def pricer() -> aic.AicPricer:
    pytest.importorskip("aiconfigurator_core", reason=SKIP)
    return aic.AicPricer("h200", "trtllm", "bf16")


@pytest.mark.parametrize(("context", "batch", "seq"), [(True, 2, 700), (False, 16, 3000)])
def test_a_heterogeneous_price_is_the_sum_of_its_layers_lookups(
    pricer: aic.AicPricer, context: bool, batch: int, seq: int
) -> None:
    arch = _hetero()
    layers = [pricer.layer_ms(arch, i, context=context, batch=batch, seq=seq) for i in range(arch.num_layers)]
    head = pricer.head_ms(arch, context=context, batch=batch, seq=seq)
    whole = pricer.prefill_ms(arch, batch, seq) if context else pricer.decode_step_ms(arch, batch, seq)
    assert whole == pytest.approx(sum(layers) + head, rel=1e-9)
    assert len(set(layers)) == arch.num_layers  # every layer priced at its own shape
    # narrowing one layer's FFN lowers the price by exactly that layer's change
    narrow = replace(arch, layers=(replace(arch.layers[0], ffn_width=4096), *arch.layers[1:]))
    change = pricer.layer_ms(narrow, 0, context=context, batch=batch, seq=seq) - layers[0]
    after = pricer.prefill_ms(narrow, batch, seq) if context else pricer.decode_step_ms(narrow, batch, seq)
    assert change < 0 and after == pytest.approx(whole + change, rel=1e-9)


# (hardware, engine, our dtype, tp) -> AIConfigurator's own compile of meta-llama/Meta-Llama-3.1-8B
UNIFORM = [("h200", "trtllm", "bf16", 1), ("h100-sxm", "vllm", "fp8", 2), ("b200", "trtllm", "fp8", 1)]


@pytest.mark.parametrize(("hardware", "engine", "dtype", "tp"), UNIFORM)
def test_a_uniform_model_agrees_with_aiconfigurators_own_estimate(
    hardware: str, engine: str, dtype: str, tp: int
) -> None:
    """Within 0.1 %: prefill is the same op list (equal to float rounding); a decode step differs
    only in the context its attention is looked up at (ours ``isl + 1``; its
    ``decode_step_latency(isl, osl=2)`` reads ``isl + 2``), measured at about 0.01 %."""
    pytest.importorskip("aiconfigurator_core", reason=SKIP)
    from aiconfigurator_core.sdk.engine import EngineHandle

    pricer = aic.AicPricer(hardware, engine, dtype, tp=tp)
    mode = aic.DTYPES[dtype]
    own = EngineHandle.compile(
        "meta-llama/Meta-Llama-3.1-8B",
        aic.SYSTEMS[hardware],
        aic.ENGINES[engine],
        backend_version=pricer.version,
        tp_size=tp,
        gemm_quant_mode=mode,
        kvcache_quant_mode=aic.KV_DTYPES[get_engine(engine).default_kv_dtype(dtype)],  # as the pricer defaults it
        fmha_quant_mode="bfloat16",
    )
    arch = load_architecture("llama-3.1-8b")
    for batch, isl in [(1, 1000), (8, 4000)]:
        assert pricer.prefill_ms(arch, batch, isl) == pytest.approx(own.predict_prefill_latency(batch, isl), rel=1e-3)
        assert pricer.decode_step_ms(arch, batch, isl + 1) == pytest.approx(
            own.decode_step_latency(batch, isl, 2), rel=1e-3
        )


def test_cost_reports_the_aic_backend(capsys: Any) -> None:
    pytest.importorskip("aiconfigurator_core", reason=SKIP)
    code, out, _ = _cli(capsys, *COST, "--hardware", "h200", "--json")
    data = json.loads(out)
    assert code == 0 and data["backend"] == "aic" and data["tpot_ms_low"] is None
    pricer = aic.AicPricer("h200", "trtllm", "fp8")
    arch = load_architecture("llama-3.1-8b")
    assert data["ttft_ms"] == pytest.approx(pricer.prefill_ms(arch, 16, 1000))
    assert data["tpot_ms"] == pytest.approx(pricer.tpot_ms(arch, 16, 1000, 200))
    code, out, _ = _cli(capsys, *COST, "--hardware", "rtx5090", "--json")  # not covered: auto is own
    assert code == 0 and json.loads(out)["backend"] == "own"


def test_a_format_the_database_did_not_measure_is_a_config_error() -> None:
    """Hopper has no FP4 tensor cores, so AIConfigurator's H100 tables hold no NVFP4 GEMMs."""
    pytest.importorskip("aiconfigurator_core", reason=SKIP)
    with pytest.raises(ConfigError, match=r"no GEMMs in 'fp4' on h100_sxm with trtllm; valid: bf16, fp16, fp8"):
        aic.AicPricer("h100-sxm", "trtllm", "fp4")
    assert (
        aic.resolve_backend("auto", load_architecture("llama-3.1-8b"), "h100-sxm", "trtllm", Scenario("fp4")) == "own"
    )


def _two_rows(tmp_path: Any) -> str:
    """pub1 (Llama-3.1-8B, H100, TRT-LLM: aic expresses it) and the first GeForce row (it does not)."""
    from autocompress_opt.serving.validation import SHIPPED_MEASUREMENTS

    lines = SHIPPED_MEASUREMENTS.read_text().splitlines()
    geforce = next(line for line in lines if ",rtx" in line)
    path = tmp_path / "two.csv"
    path.write_text("\n".join([lines[0], *[line for line in lines if line.startswith("pub1,")], geforce]) + "\n")
    return str(path)


def test_validate_without_the_package_has_no_aic_column(capsys: Any, tmp_path: Any, not_installed: None) -> None:
    code, out, _ = _cli(capsys, "validate", "--measurements", _two_rows(tmp_path), "--json")
    assert code == 0 and all("aic_predicted" not in row for row in json.loads(out))


def test_validate_puts_aic_beside_the_rows_it_expresses(capsys: Any, tmp_path: Any) -> None:
    pytest.importorskip("aiconfigurator_core", reason=SKIP)
    code, out, _ = _cli(capsys, "validate", "--measurements", _two_rows(tmp_path), "--json")
    rows = {row["id"]: row for row in json.loads(out)}
    assert code == 0 and len(rows) == 2
    assert rows["pub1"]["aic_predicted"] > 0 and abs(rows["pub1"]["aic_error"]) < 0.1  # 2.5 % when written
    geforce = next(r for r in rows.values() if r["id"] != "pub1")
    assert geforce["aic_predicted"] is None and geforce["aic_error"] is None


def _plan_study(tmp_path: Any, capsys: Any) -> str:
    storage = f"sqlite:///{tmp_path}/aic.db"
    run = ["study", "run", "--model", "llama-3.1-8b", "--targets", "h200", "--workload", "datacenter"]
    run += ["--engine", "trtllm", "--mode", "plan", "--trials", "6", "--name", "a", "--storage", storage, "--quiet"]
    code, _, err = _cli(capsys, *run)
    assert code == 0, err
    return storage


def test_study_show_checks_the_front_again_with_the_backend(capsys: Any, tmp_path: Any) -> None:
    """The final check of a study's front: each point's constraints with AIConfigurator's prices,
    relative limits against the parent priced the same way; --backend own adds nothing."""
    pytest.importorskip("aiconfigurator_core", reason=SKIP)
    from autocompress_opt.search.study.studyio import load_group
    from autocompress_opt.serving.targets import Target

    storage = _plan_study(tmp_path, capsys)
    code, out, _ = _cli(capsys, "study", "show", "a", "--storage", storage, "--json")
    points = json.loads(out)[0]["pareto"]
    assert code == 0 and points and all(p["backend_check"]["backend"] == "aic" for p in points)
    view = load_group("a", storage)[0]
    target, parent = Target.from_dict(view.target), view.parent
    first = next(r for r in view.pareto() if r.number == points[0]["number"])
    check = aic.backend_check(first.arch(), target, parent)
    assert check == points[0]["backend_check"]
    own = target.cost_metrics(first.arch())
    assert check["metrics"]["ttft_ms"] > 0 and check["metrics"]["ttft_ms"] != own["ttft_ms"]  # the backend's price
    # a relative limit is judged against the parent priced by the backend: the parent itself sits at 1.0x
    parent_check = aic.backend_check(parent, target, parent)
    assert all(v <= 1e-9 for k, v in parent_check["violations"].items() if k.endswith("1.0x"))
    code, out, _ = _cli(capsys, "study", "show", "a", "--storage", storage)
    assert "checked again with AIConfigurator's measured kernels" in out and "aic check" in out
    assert ("meets" in out) or ("misses" in out)
    code, out, _ = _cli(capsys, "study", "show", "a", "--storage", storage, "--backend", "own", "--json")
    assert all("backend_check" not in p for p in json.loads(out)[0]["pareto"])


def test_study_show_without_the_package_has_no_check(capsys: Any, tmp_path: Any, not_installed: None) -> None:
    storage = _plan_study(tmp_path, capsys)
    code, out, _ = _cli(capsys, "study", "show", "a", "--storage", storage)
    assert code == 0 and "aic check" not in out and "AIConfigurator" not in out
