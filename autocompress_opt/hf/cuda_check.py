"""``python -m autocompress_opt.hf.cuda_check``: the torch / CUDA / driver triple ``make install-gpu``
ends with, and one line and exit status 1 when CUDA is not usable.

Prints ``torch 2.13.0+cu130, CUDA 13.0, driver 580.65.06: 1 GPU(s): NVIDIA H200`` when torch sees
a GPU. Otherwise one line naming why and what to do: a CPU build of torch (the index pip used has no
CUDA wheel: name one with ``TORCH_INDEX``), or a CUDA build that sees no GPU (torch's own reason,
such as a driver too old for its CUDA, and the driver version ``nvidia-smi`` reports).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings

__all__ = ["cuda_report", "driver_version", "main"]

# The index the Makefile names in its advice (a build of PyTorch's own wheel index).
_INDEX_HINT = "make install-gpu TORCH_INDEX=https://download.pytorch.org/whl/cu130"


def driver_version() -> str | None:
    """The NVIDIA driver version ``nvidia-smi`` reports (None: no ``nvidia-smi`` or it failed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.strip() for line in out.splitlines() if line.strip()), None)


def cuda_report() -> tuple[bool, str]:
    """Whether CUDA is usable, and the line saying so (the triple, or why not and what to do)."""
    import torch

    driver = driver_version()
    triple = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, driver {driver or 'not found'}"
    if torch.version.cuda is None:
        return False, (
            f"{triple}: a CPU build of torch; the index pip used serves no CUDA wheel for this machine. "
            f"Name one: {_INDEX_HINT} (or the CUDA index of your mirror)"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if not available:
        told = "; ".join(dict.fromkeys(" ".join(str(w.message).split()) for w in caught))
        why = f"torch says: {told}" if told else "no GPU or no driver visible"
        return False, f"{triple}: CUDA is not usable ({why})"
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return True, f"{triple}: {torch.cuda.device_count()} GPU(s): {names}"


def main() -> int:
    ok, line = cuda_report()
    print(line if ok else f"error: {line}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
