"""``--device`` / ``--compute-dtype`` resolution: one place, clear errors, never a silent CPU fall-back."""

from __future__ import annotations

import pytest
import torch

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.device import (
    check_compute_dtype,
    check_device,
    dtype_name,
    resolve_compute_dtype,
    resolve_device,
)


def test_auto_is_the_cpu_in_fp32_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    device = resolve_device("auto")
    assert device == torch.device("cpu")
    assert resolve_compute_dtype("auto", device) == torch.float32


def test_auto_dtype_is_bf16_on_cuda_and_names_round_trip() -> None:
    assert resolve_compute_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert resolve_compute_dtype("BF16", torch.device("cpu")) == torch.bfloat16
    for name in ("fp32", "bf16", "fp16"):
        assert dtype_name(resolve_compute_dtype(name, torch.device("cpu"))) == name


def test_cuda_asked_for_without_a_gpu_is_an_error_not_a_fallback() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    for spec in ("cuda", "cuda:1", "CUDA:0"):
        assert check_device(spec) == spec.lower()  # a driver may check a GPU worker's setting
        with pytest.raises(ConfigError, match="sees no CUDA GPU"):
            resolve_device(spec)


@pytest.mark.parametrize("spec", ["gpu", "cuda0", "cuda:-1", "tpu", ""])
def test_bad_device_names_the_value_and_the_valid_ones(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"is not one of auto, cpu, cuda, cuda:N"):
        check_device(spec)


@pytest.mark.parametrize("spec", ["float32", "int8", "q4_k_m", ""])
def test_bad_compute_dtype_names_the_value_and_the_valid_ones(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"is not one of auto, fp32, bf16, fp16"):
        check_compute_dtype(spec)
