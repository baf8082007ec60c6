"""``study run --confidence``, ``--device`` and ``--compute-dtype`` reach the study's targets and
trials (checked on the built config, before anything runs), and misuse is a one-line error."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autocompress_opt.cli import build_parser, main
from autocompress_opt.cli.study.config import build_config, merged
from autocompress_opt.errors import ConfigError


def config_of(*argv: str):  # type: ignore[no-untyped-def]
    args: argparse.Namespace = build_parser().parse_args(["study", "run", *argv])
    return build_config(merged(args))


def test_confidence_reaches_every_target_and_binds_at_the_pessimistic_end() -> None:
    """A TPOT limit 3 % above the parent's median prediction is met at the median and missed at 0.9
    (the vLLM profile's held-out TPOT interval reaches further than 3 %)."""
    base = ("--model", "llama-3.1-8b", "--targets", "h100-sxm:datacenter", "--engine", "vllm", "--mode", "plan")
    plain = config_of(*base)
    [target] = plain.targets
    assert target.confidence is None
    from autocompress_opt.arch.catalog import load_architecture

    arch = load_architecture("llama-3.1-8b")
    median = target.cost_metrics(arch)["tpot_ms"]
    limit = ("--max-tpot-ms", f"{1.03 * median:.6f}")
    loose, sure = config_of(*base, *limit), config_of(*base, *limit, "--confidence", "0.9")
    assert [t.confidence for t in sure.targets] == [0.9]
    reference = loose.targets[0].cost_metrics(arch)
    tpot = lambda t: next(v for k, v in t.check(arch, reference)[0].items() if k.startswith("tpot_ms"))
    assert tpot(loose.targets[0]) <= 0 < tpot(sure.targets[0])


def test_device_and_compute_dtype_join_the_trials_inner_settings() -> None:
    config = config_of("--mode", "weights", "--device", "cpu", "--compute-dtype", "bf16", "--inner", "steps=3")
    assert config.inner == {"steps": 3, "device": "cpu", "compute_dtype": "bf16"}


def test_the_driver_reads_the_parent_on_the_cpu_unless_a_gpu_is_named() -> None:
    """``--driver-device`` is the driver's own device, apart from the trials' ``--device``."""
    assert config_of("--mode", "weights", "--device", "cuda").driver_device == "cpu"
    assert config_of("--mode", "weights", "--driver-device", "cuda:1").driver_device == "cuda:1"
    with pytest.raises(ConfigError, match="driver_device 'gpu' is not one of cpu, cuda, cuda:N"):
        config_of("--mode", "weights", "--driver-device", "gpu")


def test_inner_settings_take_numbers_booleans_and_words() -> None:
    config = config_of(
        "--mode", "weights", "--inner", "steps=3", "--inner", "checkpoint_activations=true",
        "--inner", "teacher_budget_gib=0.5", "--inner", "fill=False",
    )  # fmt: skip
    assert config.inner == {"steps": 3, "checkpoint_activations": True, "teacher_budget_gib": 0.5, "fill": False}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--confidence", "1.5"], "confidence must be a number in (0, 1)"),
        (["--mode", "plan", "--device", "cpu"], "--device applies to weights mode"),
        (["--mode", "weights", "--device", "gpu"], "device 'gpu' is not one of"),
        (["--mode", "weights", "--compute-dtype", "int4"], "compute dtype 'int4' is not one of"),
        (
            ["--mode", "weights", "--inner", "checkpoint_activations=maybe"],
            "checkpoint_activations must be true or false, got 'maybe'",
        ),
        (["--mode", "weights", "--inner", "steps"], "--inner expects KEY=VALUE, got 'steps'"),
    ],
)
def test_bad_values_are_one_line_errors_before_any_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    storage = tmp_path / "s.db"
    code = main(["study", "run", "--targets", "rtx5070", "--trials", "1", "--storage", f"sqlite:///{storage}", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not storage.exists()


def test_data_flag_and_yaml_key_reach_the_trials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--data`` (repeatable) and the YAML ``data:`` key become the trials' ``inner.data``; plan mode,
    which reads no text, refuses it; a malformed YAML value, or a YAML spec naming a file that is not
    there, is a one-line error."""
    import datasets

    from autocompress_opt.search.study.weights_trial import TrialConfig

    monkeypatch.chdir(tmp_path)  # the specs are checked: the files exist (relative paths, as users write them)
    for name in ("code.jsonl", "notes.jsonl"):
        (tmp_path / name).write_text('{"text": "x"}\n')
    datasets.Dataset.from_dict({"text": ["y"]}).to_parquet(str(tmp_path / "chat.parquet"))

    flags = config_of("--mode", "weights", "--data", "code.jsonl:0.7", "--data", "chat.parquet:0.3")
    assert flags.inner["data"] == ["code.jsonl:0.7", "chat.parquet:0.3"]
    assert TrialConfig.from_dict(flags.inner).data == ("code.jsonl:0.7", "chat.parquet:0.3")
    yaml_file = tmp_path / "study.yaml"
    yaml_file.write_text("mode: weights\ndata: notes.jsonl\n")
    assert config_of("--config", str(yaml_file)).inner["data"] == ["notes.jsonl"]
    with pytest.raises(ConfigError, match="--data applies to weights mode"):
        config_of("--mode", "plan", "--data", "code.jsonl")
    yaml_file.write_text("mode: weights\ndata: {a: 1}\n")
    with pytest.raises(ConfigError, match="data must be a spec or a list of specs"):
        config_of("--config", str(yaml_file))
    yaml_file.write_text("mode: weights\ndata: [gone.jsonl]\n")
    with pytest.raises(ConfigError, match="'gone.jsonl': no such file or folder"):
        config_of("--config", str(yaml_file))


def test_workload_picks_the_built_in_text_when_no_data_is_given() -> None:
    from autocompress_opt.search.study.weights_trial import TrialConfig, objective_domains

    auto = TrialConfig()
    assert auto.data_domain == "auto"
    assert objective_domains(auto.for_workload("local-coding")) == ("code",)
    assert objective_domains(auto.for_workload("in-game")) == ("prose",)
    assert objective_domains(auto.for_workload("datacenter")) == ("prose",)
    assert objective_domains(auto.for_workload(None)) == ("code", "prose")
    assert objective_domains(TrialConfig(data=("x.jsonl",)).for_workload("local-coding")) == ("data",)
    assert "built-in code" in auto.for_workload("local-coding").data_label()


def test_an_empty_study_exits_1_saying_why_and_a_finished_one_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    """A target whose study holds no COMPLETE trial and no failure (the proxy screened out every point
    the sampler proposed) is not a result: exit 1 with the reason; a resumed study with nothing left
    to run (its trials done before) exits 0; failed trials and no feasible one keep their codes."""
    from autocompress_opt.cli.study.run import exit_status
    from autocompress_opt.search.study.records import TargetOutcome

    screened = TargetOutcome("s.b200", complete=0, screened=200)
    assert exit_status([screened]) == 1
    err = capsys.readouterr().err
    assert "s.b200: the study has no COMPLETE trial" in err and "all 200 points" in err and "--min-throughput" in err
    assert exit_status([TargetOutcome("s.h100", complete=0)]) == 1
    assert "no trial ran" in capsys.readouterr().err
    done = TargetOutcome("s.h100", complete=4, before=4, feasible=2)
    assert exit_status([done]) == 0 and capsys.readouterr().err == ""
    assert exit_status([done, screened]) == 1  # one empty target is enough
    assert exit_status([TargetOutcome("s.x", complete=0, failed=3, first_error="boom")]) == 1
    assert "no trial completed; first error: boom" in capsys.readouterr().err
    assert exit_status([TargetOutcome("s.x", complete=3)]) == 3  # complete, none feasible
    late = TargetOutcome("s.rtx5080", complete=0, out_of_time=True)  # the demo's time budget ended first
    assert exit_status([done, late]) == 0
    assert "s.rtx5080: the time budget ended before any trial of this target completed" in capsys.readouterr().err
