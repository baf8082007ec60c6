"""``distill``, ``eval`` and ``prune`` compute on the GPU when torch sees one, else on the CPU, unless
``--device`` says otherwise; their ``--help`` says so. No model is loaded: the flags are parsed and the
device resolved as each verb resolves it."""

from __future__ import annotations

import argparse

import pytest
import torch

from autocompress_opt.cli import build_parser
from autocompress_opt.cli._common import compute_of
from autocompress_opt.errors import ConfigError
from autocompress_opt.hf import device as device_module
from autocompress_opt.recover.preflight import training_device

ARGV = {
    "distill": ["distill", "--student", "s", "--teacher", "t", "--steps", "1"],
    "eval": ["eval", "--model", "m"],
    "prune": ["prune", "--model", "m", "--params", "0.5", "--out", "o"],
}


def resolved_device(args: argparse.Namespace) -> torch.device:
    """The device the verb computes on: distill's training device, else ``load_model``'s."""
    if args.verb == "distill":
        return training_device(args.device, bf16=False)[0]
    return compute_of(args)["device"]


@pytest.mark.parametrize("verb", sorted(ARGV))
@pytest.mark.parametrize("cuda", [False, True])
def test_the_default_device_is_the_gpu_when_there_is_one(
    verb: str, cuda: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(device_module, "bf16_supported", lambda device: True)  # no GPU to ask here
    args = build_parser().parse_args(ARGV[verb])
    assert resolved_device(args) == torch.device("cuda:0" if cuda else "cpu")
    explicit = build_parser().parse_args([*ARGV[verb], "--device", "cpu"])
    assert resolved_device(explicit) == torch.device("cpu")


@pytest.mark.parametrize("verb", sorted(ARGV))
def test_help_names_auto_as_the_default(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "auto (default: the first CUDA GPU, else the CPU)" in text


@pytest.mark.parametrize(("device", "expected"), [("auto", "cuda:3"), ("cuda", "cuda:3"), ("cuda:1", "cuda:1")])
def test_torchrun_without_fsdp_puts_each_rank_on_its_local_gpu(
    device: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun sets LOCAL_RANK: distill's ``auto``/``cuda`` is that GPU, not every rank's cuda:0;
    an explicit ``cuda:N`` is kept."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    args = build_parser().parse_args([*ARGV["distill"], "--device", device])
    assert resolved_device(args) == torch.device(expected)


def test_a_local_rank_beyond_the_node_s_gpus_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ConfigError, match="LOCAL_RANK 2: this node has 2 CUDA GPU"):
        training_device("auto", bf16=False)


def test_local_rank_leaves_the_cpu_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert training_device("auto", bf16=False)[0] == torch.device("cpu")


def test_torchrun_without_fsdp_says_each_process_trains_its_own_student(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocompress_opt.cli.distill import _warn_unsharded_processes

    monkeypatch.setenv("WORLD_SIZE", "2")
    _warn_unsharded_processes(build_parser().parse_args(ARGV["distill"]))
    assert "2 processes without --fsdp: each trains its own student on its local GPU" in capsys.readouterr().err
    _warn_unsharded_processes(build_parser().parse_args([*ARGV["distill"], "--fsdp"]))
    assert capsys.readouterr().err == ""
