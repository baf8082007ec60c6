"""``autocompress memory``: the 8B figures the issue asks for, the JSON record, and bad inputs as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from autocompress_opt.cli import main


def _json(capsys: Any, *argv: str) -> dict[str, Any]:
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama_8b_weights_trial_predicted_under_60_gb(capsys: Any) -> None:
    assert main(["memory", "--model", "llama-3.1-8b", "--mode", "weights"]) == 0
    out = capsys.readouterr().out
    peak_line = next(line for line in out.splitlines() if line.startswith("peak"))
    assert float(peak_line.split(":")[1].split("GB")[0]) < 60
    for stage in ("importance", "inner search", "materialise child"):
        assert stage in out
    assert "assumes: parent weights in bf16" in out


def test_llama_8b_distill_under_80_gb_per_gpu_with_8_way_sharding(capsys: Any) -> None:
    options = ["--checkpointing", "--kl-chunk", "32"]  # distill --gradient-checkpointing --kl-chunk 32
    sharded = _json(capsys, "--model", "llama-3.1-8b", "--mode", "distill", "--gpus", "8", *options)
    single = _json(capsys, "--model", "llama-3.1-8b", "--mode", "distill", *options)
    assert sharded["peak_bytes"] < 80e9 < single["peak_bytes"]
    assert sharded["gpus"] == 8 and sharded["compute_dtype"] == "bf16"
    assert any("FSDP-sharded 8 ways" in a for a in sharded["assumptions"])
    assert any("checkpointing on" in a and "32 positions" in a for a in sharded["assumptions"])


def test_options_reach_the_prediction(capsys: Any) -> None:
    base = ["--model", "smollm2-135m", "--mode", "distill"]
    default = _json(capsys, *base)["peak_bytes"]
    fp32 = _json(capsys, *base, "--compute-dtype", "fp32")["peak_bytes"]
    assert fp32 > default
    # distill's defaults (no checkpointing, the whole sequence's KL) are the predictor's: the flags lower it
    lean = _json(capsys, *base, "--checkpointing", "--kl-chunk", "32")["peak_bytes"]
    assert lean < default
    fewer = _json(capsys, *base, "--eval-rows", "1", "--batch-size", "8", "--seq-len", "2048")
    more = _json(capsys, *base, "--eval-rows", "8", "--batch-size", "8", "--seq-len", "2048")
    held_out = lambda record: next(s for s in record["stages"] if s["name"] == "held-out KL")["peak_bytes"]
    assert held_out(fewer) < held_out(more)
    small = _json(capsys, "--model", "smollm2-135m", "--mode", "weights", "--batch-size", "1", "--seq-len", "64")
    big = _json(capsys, "--model", "smollm2-135m", "--mode", "weights", "--teacher-on-device", "--batch-size", "8")
    search = lambda record: next(s for s in record["stages"] if s["name"] == "inner search")["peak_bytes"]
    assert search(small) < search(big)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--gpus", "0"], "gpus"),
        (["--compute-dtype", "int8"], "'int8'"),
        (["--master-dtype", "fp64"], "master dtype 'fp64'"),
        (["--kl-chunk", "-1"], "--kl-chunk"),
        (["--batch-size", "0"], "--batch-size"),
        (["--eval-rows", "0"], "--eval-rows"),
        (["--student", "no-such-model"], "no-such-model"),
    ],
)
def test_bad_values_are_one_line_errors(capsys: Any, argv: list[str], needle: str) -> None:
    code = main(["memory", "--model", "smollm2-135m", "--mode", "distill", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and needle in err


def test_weights_trial_on_several_gpus_is_refused(capsys: Any) -> None:
    assert main(["memory", "--model", "smollm2-135m", "--mode", "weights", "--gpus", "2"]) == 2
    assert "gpus=2" in capsys.readouterr().err


def test_unknown_mode_is_an_argparse_error(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--model", "smollm2-135m", "--mode", "train"])
    assert exit_info.value.code == 2
    assert "'train'" in capsys.readouterr().err


def test_prediction_does_not_import_torch() -> None:
    code = (
        "import sys; from autocompress_opt.cli import main; "
        "main(['memory', '--model', 'llama-3.1-8b', '--mode', 'distill', '--gpus', '8', '--json']); "
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_weights_teacher_budget_and_checkpointing_reach_the_prediction(capsys: Any) -> None:
    base = ["--model", "llama-3.1-8b", "--mode", "weights", "--seq-len", "2048"]
    plain = _json(capsys, *base)
    # 20 x 2048 tokens of Llama-3 (V = 128,256) are 9.8 GiB in full: a 2 GiB budget keeps the top k.
    k = (2 * 2**30 // (20 * 2048) - 4) // 6
    assert plain["host_bytes"] == {"teacher targets": 20 * 2048 * (k * 6 + 4)}
    assert any(f"top {k} tokens" in a for a in plain["assumptions"])
    roomy = _json(capsys, *base, "--teacher-budget-gib", "16")
    assert roomy["host_bytes"] == {"teacher targets": 20 * 2048 * 128256 * 2}
    ckpt = _json(capsys, *base, "--checkpointing")
    search = lambda record: next(s for s in record["stages"] if s["name"] == "inner search")["peak_bytes"]
    assert search(ckpt) < search(plain)
    assert main(["memory", *base, "--teacher-budget-gib", "0"]) == 2
    assert "teacher_budget_gib must be a finite number > 0" in capsys.readouterr().err
    main(["memory", *base])
    assert "host memory: teacher targets" in capsys.readouterr().out
