"""benchmarks/gpu_first_run.sh, the one script of a first GPU run, in its dry mode (what CI can run):
it probes the machine for real, records every other step with the command it would run, and
writes one results JSON; the commands it would run parse as the CLI's own."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_first_run.sh"
STEPS = ["install", "env", "tests-gpu", "bench-gpu", "study", "prune", "serve-check"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu-first-run") / "result.json"
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--python", sys.executable, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"wrote {out}" in done.stdout
    return json.loads(out.read_text(encoding="utf-8"))


def test_a_dry_run_records_every_step_and_probes_the_machine(dry_run: dict) -> None:
    assert dry_run["benchmark"] == "gpu_first_run" and dry_run["dry_run"] and dry_run["ok"]
    assert [s["name"] for s in dry_run["steps"]] == STEPS
    by_name = {s["name"]: s for s in dry_run["steps"]}
    assert all(by_name[name]["status"] == "dry-run" for name in STEPS if name != "env")
    probe = by_name["env"]
    assert probe["status"] == "ok" and probe["exit_code"] == 0
    import torch

    assert probe["result"]["torch"] == torch.__version__
    assert set(probe["result"]["engines"]) == {"llamacpp", "vllm"}
    assert by_name["install"]["command"].strip() == "make install-gpu"
    assert "AUTOCOMPRESS_GPU_SUITE_DEVICE=cuda" in by_name["tests-gpu"]["command"]


@pytest.mark.parametrize("name", ["study", "prune", "serve-check"])
def test_the_commands_it_would_run_parse_as_the_cli(dry_run: dict, name: str) -> None:
    from autocompress_opt.cli import build_parser

    command = next(s["command"] for s in dry_run["steps"] if s["name"] == name)
    argv = shlex.split(command.partition("sys.exit(main())")[2].lstrip("' "))
    args = build_parser().parse_args(argv)
    if name != "serve-check":
        assert args.device == "cuda"
