"""``--device`` / ``--compute-dtype`` resolution: one place, clear errors, never a silent CPU fall-back."""

from __future__ import annotations

import warnings

import pytest
import torch

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.device import (
    bf16_supported,
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


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, *gpus: tuple[str, tuple[int, int]]) -> None:
    """torch.cuda answers as if this machine had ``gpus`` (name, compute capability), in index order."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: gpus[index or 0][1])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: gpus[index or 0][0])


def test_auto_dtype_is_bf16_on_cuda_and_names_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, ("NVIDIA H100 80GB HBM3", (9, 0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a bf16 GPU: no warning
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
    with pytest.raises(ConfigError, match=r"is not one of auto, fast, fp32, bf16, fp16"):
        check_compute_dtype(spec)


def test_auto_falls_back_from_bf16_on_a_gpu_without_it_and_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, ("NVIDIA A100-SXM4-80GB", (8, 0)), ("Tesla V100-SXM2-32GB", (7, 0)))
    assert bf16_supported(torch.device("cuda", 0)) and not bf16_supported(torch.device("cuda", 1))
    assert resolve_compute_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    with pytest.warns(UserWarning, match=r"'cuda:1' \(Tesla V100-SXM2-32GB, sm_70\) has no native bf16.*uses fp16"):
        assert resolve_compute_dtype("auto", torch.device("cuda", 1)) == torch.float16
    # A caller that cannot train in fp16 (no loss scaling) asks for fp32 instead.
    with pytest.warns(UserWarning, match=r"Tesla V100.*uses fp32"):
        assert resolve_compute_dtype("auto", torch.device("cuda:1"), without_bf16=torch.float32) == torch.float32
    # bf16 asked for by name is kept (torch emulates it), with the warning that it is slow there.
    with pytest.warns(UserWarning, match=r"Tesla V100.*emulated"):
        assert resolve_compute_dtype("bf16", torch.device("cuda", 1)) == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fp16/fp32 by name, and anything on the CPU: nothing to say
        assert resolve_compute_dtype("fp16", torch.device("cuda", 1)) == torch.float16
        assert resolve_compute_dtype("bf16", torch.device("cpu")) == torch.bfloat16


@pytest.mark.parametrize("native", [True, False])
def test_fast_is_bf16_on_a_cpu_with_bf16_instructions_and_auto_elsewhere(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    import autocompress_opt.hf.device as device_module

    monkeypatch.setattr(device_module, "cpu_bf16_native", lambda: native)
    assert check_compute_dtype(" FAST ") == "fast"
    expected = torch.bfloat16 if native else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_compute_dtype("fast", torch.device("cpu")) == expected
        assert resolve_compute_dtype("auto", torch.device("cpu")) == torch.float32  # auto stays exact on the CPU
    _fake_gpus(monkeypatch, ("NVIDIA A100-SXM4-80GB", (8, 0)), ("Tesla V100-SXM2-32GB", (7, 0)))
    assert resolve_compute_dtype("fast", torch.device("cuda", 0)) == torch.bfloat16  # a GPU: as auto
    with pytest.warns(UserWarning, match=r"Tesla V100.*uses fp16"):
        assert resolve_compute_dtype("fast", torch.device("cuda", 1)) == torch.float16
