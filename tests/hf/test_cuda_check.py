"""``python -m autocompress_opt.hf.cuda_check`` (``make install-gpu``'s last step) and the Makefile's
choice of index."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from autocompress_opt.hf import cuda_check

ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_build_is_one_line_naming_the_fix_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(cuda_check, "driver_version", lambda: None)
    ok, line = cuda_check.cuda_report()
    assert not ok and "a CPU build of torch" in line and "TORCH_INDEX=" in line and "\n" not in line
    assert line.startswith(f"torch {torch.__version__}, CUDA none, driver not found")


def test_a_cuda_build_that_sees_no_gpu_gives_torchs_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> bool:
        warnings.warn("The NVIDIA driver on your system is too old (found version 12020).", stacklevel=1)
        return False

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", unavailable)
    monkeypatch.setattr(cuda_check, "driver_version", lambda: "535.104.05")
    ok, line = cuda_check.cuda_report()
    assert not ok
    assert line == (
        f"torch {torch.__version__}, CUDA 13.0, driver 535.104.05: CUDA is not usable "
        "(torch says: The NVIDIA driver on your system is too old (found version 12020).)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_the_module_exits_1_here_with_one_line() -> None:
    run = subprocess.run([sys.executable, "-m", "autocompress_opt.hf.cuda_check"], capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == "" and len(run.stderr.strip().splitlines()) == 1
    assert run.stderr.startswith("error: torch ")


def test_install_gpu_uses_pips_own_index_unless_one_is_named() -> None:
    def dry(*extra: str) -> str:
        # Under `make test` this make is a sub-make (MAKELEVEL set), which prints "Entering/Leaving
        # directory" lines around its recipe unless told not to.
        return subprocess.run(
            ["make", "--no-print-directory", "-n", "install-gpu", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    default = [line for line in dry().splitlines() if "--force-reinstall" in line]
    assert len(default) == 1 and '"torch==2.13.0"' in default[0] and "--index-url" not in default[0]
    named = [
        line for line in dry("TORCH_INDEX=https://mirror.example/cu128").splitlines() if "--force-reinstall" in line
    ]
    assert named[0].rstrip().endswith("--index-url https://mirror.example/cu128")
    assert dry().rstrip().endswith("-m autocompress_opt.hf.cuda_check")
