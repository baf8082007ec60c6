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


def test_two_sharded_processes_train_as_one(models: tuple[Path, Path], tmp_path: Path) -> None:
    student_dir, teacher_dir = models
    single = distill(student_dir, teacher_dir, tmp_path / "single", RECIPE, progress=False)

    worker = Path(__file__).with_name("fsdp_worker.py")
    record = tmp_path / "sharded.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(worker),
            str(student_dir),
            str(teacher_dir),
            str(tmp_path / "sharded"),
            str(record),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = json.loads(record.read_text())

    assert sharded["complete"] and len(sharded["losses"]) == RECIPE.steps
    for a, b in zip(sharded["losses"], single.losses):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b))
    assert sharded["final_kl"] == pytest.approx(single.final_kl, rel=1e-4)
    want = load_model(tmp_path / "single", cache=False).model.state_dict()
    got = load_model(tmp_path / "sharded", cache=False).model.state_dict()
    # Adam divides by sqrt(v): float rounding of the averaged gradients moves a few weights by ~1e-6.
    worst = max(float((got[name] - want[name]).abs().max()) for name in want)
    assert worst <= 2e-5, worst
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


def test_fsdp_without_a_process_group_is_refused(models: tuple[Path, Path], tmp_path: Path) -> None:
    student_dir, teacher_dir = models
    with pytest.raises(ConfigError, match="torchrun"):
        distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False, fsdp=True)
