"""The skip budget (tests/skip_budget.py and its hook in tests/conftest.py): a run with it on fails
when tests skip for an unlisted reason or more often than a listed one allows, naming them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
