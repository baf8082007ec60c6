"""The skip budget (tests/skip_budget.py and its hook in tests/conftest.py): a run with it on fails
when tests skip for an unlisted reason or more often than a listed one allows, naming them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from xml.etree import ElementTree

import pytest
from skip_budget import ALLOWED, ENV, Allowance, over_budget

TESTS = Path(__file__).parent

BUDGET = (Allowance("needs a CUDA GPU", 1, "here"), Allowance("root writes", 2, "there"))


def test_listed_reasons_within_their_counts_pass() -> None:
    assert over_budget(["needs a CUDA GPU", "root writes into read-only folders anyway"] * 1, BUDGET) == []
    assert over_budget([], BUDGET) == []


def test_too_many_of_a_reason_and_unlisted_reasons_are_named() -> None:
    reasons = ["needs a CUDA GPU: torch sees none"] * 3 + ["llama.cpp is not installed; run `make engines`"] * 2
    problems = over_budget(reasons, BUDGET)
    assert problems == [
        "3 tests skipped with 'needs a CUDA GPU', 1 allowed (here)",
        "2 test(s) skipped with an unlisted reason: llama.cpp is not installed; run `make engines`",
    ]


def test_the_budget_names_each_reason_once_with_a_place() -> None:
    assert len({a.reason for a in ALLOWED}) == len(ALLOWED)
    assert all(a.count >= 1 and a.where for a in ALLOWED)


def _run(tmp_path: Path, body: str, budget: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_some_skips.py").write_text(body, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]), ENV: "1" if budget else "0"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_hook_fails_a_run_that_skips_beyond_the_budget(tmp_path: Path) -> None:
    body = (
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_engine(i):\n    pytest.skip('vLLM is not installed; run `make engines`')\n"
        "def test_two_gpus():\n    pytest.skip('needs two CUDA GPUs')\n"
        "def test_passes():\n    pass\n"
    )
    over = _run(tmp_path, body, budget=True)
    assert over.returncode == 1, over.stdout[-2000:]
    assert "skip budget exceeded" in over.stdout
    assert "3 test(s) skipped with an unlisted reason: vLLM is not installed" in over.stdout
    assert "needs two CUDA GPUs" not in over.stdout.partition("skip budget exceeded")[2]  # within its count
    assert _run(tmp_path, body, budget=False).returncode == 0  # `make test-fast`: skips are fine


def _gpu_suite_conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_suite_conftest", TESTS / "gpu" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_gpu_suite_skip_on_an_old_driver_names_torch_s_reason_and_no_allowance_covers_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch on a driver older than its CUDA says so in a warning and reports no GPU: the suite's skip
    carries that reason, and the skip budget counts it as a skip of its own, not within
    "needs a CUDA GPU" (the one load test's allowance)."""
    import torch

    def old_driver() -> bool:
        message = "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)."
        warnings.warn(message, stacklevel=2)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", old_driver)
    reason = _gpu_suite_conftest().missing_gpu("cuda")
    assert reason is not None and reason.startswith("GPU suite needs a CUDA GPU")
    assert "driver on your system is too old" in reason
    assert over_budget([reason]) == [f"1 test(s) skipped with an unlisted reason: {reason}"]
    assert _gpu_suite_conftest().missing_gpu("cpu") is None


def test_a_gpu_suite_that_skips_is_reported_as_skipped_and_fails_the_budget(tmp_path: Path) -> None:
    """The GPU suite on a machine where torch sees no GPU (CUDA_VISIBLE_DEVICES empty): its tests are
    skips in pytest's own report (never passes), and a run with the budget on fails naming them."""
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]), ENV: "1"}
    env.update({"CUDA_VISIBLE_DEVICES": "", "AUTOCOMPRESS_GPU_SUITE_DEVICE": "cuda"})
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    command += [str(TESTS / "gpu" / "test_gpu_tiny.py"), "-k", "importance"]
    done = subprocess.run(command, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "skipped with an unlisted reason: GPU suite needs a CUDA GPU" in done.stdout
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests", "0")) >= 1
    assert suite.get("skipped") == suite.get("tests") and suite.get("failures") == suite.get("errors") == "0"
