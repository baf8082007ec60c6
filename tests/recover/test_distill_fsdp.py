"""FSDP2-sharded distillation: 2 processes under torchrun with the gloo backend on the CPU, with
activation checkpointing and the chunked KL on, train a tiny student as one plain process does
(same loss curve, same weights within float rounding) and write a checkpoint in the unsharded
format."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_worker import RECIPE as WORKER_RECIPE
from safetensors.torch import load_file
from tiny_lm import byte_tokenizer, save_hf_dir, tiny_model

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.export import CARD_FILE, export_model
from autocompress_opt.recover.distill import STATE_DIR, DistillRecipe, distill

RECIPE = DistillRecipe(**WORKER_RECIPE)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    teacher = tiny_model("llama", seed=1)
    student = copy.deepcopy(teacher)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    root = tmp_path_factory.mktemp("fsdp")
    arch = adapter_for(student).architecture(student)
    student_dir = export_model(student, arch, root / "student", parent={"model": "t"}, tokenizer=byte_tokenizer())
    return student_dir, save_hf_dir(teacher, root / "teacher")


def _sharded(models: tuple[Path, Path], out: Path, *mode: str) -> dict[str, Any]:
    """The result record of the 2-process worker (``crash``: interrupted in step 3, then resumed)."""
    student_dir, teacher_dir = models
    worker = Path(__file__).with_name("fsdp_worker.py")
    record = out.with_suffix(".json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    args = [str(student_dir), str(teacher_dir), str(out), str(record), *mode]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(record.read_text())


def _assert_trains_as(sharded: dict[str, Any], single: Any, sharded_dir: Path, single_dir: Path) -> None:
    assert sharded["complete"] and len(sharded["losses"]) == RECIPE.steps
    for a, b in zip(sharded["losses"], single.losses):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b))
    assert sharded["final_kl"] == pytest.approx(single.final_kl, rel=1e-4)
    want = load_model(single_dir, cache=False).model.state_dict()
    got = load_model(sharded_dir, cache=False).model.state_dict()
    # Adam divides by sqrt(v): float rounding of the averaged gradients moves a few weights by ~1e-6.
    worst = max(float((got[name] - want[name]).abs().max()) for name in want)
    assert worst <= 2e-5, worst


@pytest.mark.slow
def test_two_sharded_processes_train_as_one(models: tuple[Path, Path], tmp_path: Path) -> None:
    student_dir, teacher_dir = models
    single = distill(student_dir, teacher_dir, tmp_path / "single", RECIPE, progress=False)
    sharded = _sharded(models, tmp_path / "sharded")
    _assert_trains_as(sharded, single, tmp_path / "sharded", tmp_path / "single")
    # The checkpoint holds full (unsharded) AdamW moments under the same names as a one-process run.
    moments = load_file(str(tmp_path / "sharded" / STATE_DIR / "state.safetensors"))
    reference = load_file(str(tmp_path / "single" / STATE_DIR / "state.safetensors"))
    assert {k for k in moments if k.startswith("optimizer/")} == {k for k in reference if k.startswith("optimizer/")}
    for key, value in reference.items():
        if key.startswith("optimizer/"):
            assert moments[key].shape == value.shape, key
    card = json.loads((tmp_path / "sharded" / CARD_FILE).read_text())
    record = card["extra"]["distillation"]
    assert record["fsdp_processes"] == 2 and record["gradient_checkpointing"] and record["kl_chunk"] == 5


@pytest.mark.slow
def test_an_interrupted_sharded_run_resumes_sharded(models: tuple[Path, Path], tmp_path: Path) -> None:
    student_dir, teacher_dir = models
    single = distill(student_dir, teacher_dir, tmp_path / "single", RECIPE, progress=False)
    resumed = _sharded(models, tmp_path / "resumed", "crash")
    assert resumed["resumed_from_step"] == 2
    _assert_trains_as(resumed, single, tmp_path / "resumed", tmp_path / "single")


def test_fsdp_without_a_process_group_is_refused(models: tuple[Path, Path], tmp_path: Path) -> None:
    student_dir, teacher_dir = models
    with pytest.raises(ConfigError, match="torchrun"):
        distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False, fsdp=True)
