"""FSDP2-sharded distillation: 2 processes under torchrun with the gloo backend on the CPU, with
activation checkpointing and the chunked KL on, build the student on the meta device (only rank 0
reads its weights), train it as one plain process does (same loss curve, same weights within float
rounding), write a checkpoint in the unsharded format, and resume an interrupted run; in bf16
compute over fp32 master weights too. The collectives' device is checked against a faked NCCL
backend (this machine has no GPU)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_worker import RECIPE as WORKER_RECIPE
from fsdp_worker import crashing
from safetensors.torch import load_file
from tiny_lm import byte_tokenizer, save_hf_dir, tiny_model

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.export import CARD_FILE, export_model
from autocompress_opt.recover import fsdp
from autocompress_opt.recover.distill import STATE_DIR, DistillRecipe, distill

RECIPE = DistillRecipe(**WORKER_RECIPE)


def _models(root: Path, **overrides: Any) -> tuple[Path, Path]:
    teacher = tiny_model("llama", seed=1, **overrides)
    student = copy.deepcopy(teacher)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    arch = adapter_for(student).architecture(student)
    student_dir = export_model(student, arch, root / "student", parent={"model": "t"}, tokenizer=byte_tokenizer())
    return student_dir, save_hf_dir(teacher, root / "teacher")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _models(tmp_path_factory.mktemp("fsdp"))


@pytest.fixture(scope="module")
def tied_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Student and teacher whose output head is the input embedding (one parameter, as SmolLM2's)."""
    return _models(tmp_path_factory.mktemp("fsdp-tied"), tie_word_embeddings=True)


def _sharded(models: tuple[Path, Path], out: Path, *mode: str) -> dict[str, Any]:
    """The result record of the 2-process worker (``crash``: interrupted in step 3, then resumed)."""
    student_dir, teacher_dir = models
    worker = Path(__file__).with_name("fsdp_worker.py")
    record = out.with_suffix(".json")
    # This checkout's package first (the installed one may be another checkout's), then the caller's path.
    path = [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in path if p)}
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


def _assert_each_rank_trained_on_its_rows(record: dict[str, Any], student_dir: Path) -> None:
    """Rank ``r`` trained on rows ``r, r + 2`` of each global batch of the calibration stream: the two
    slices are disjoint and together the batch one process trains on."""
    from transformers import AutoTokenizer

    from autocompress_opt.data.stream import data_stream

    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    stream = data_stream(tokenizer, role="calibration", seq_len=RECIPE.seq_len, seed=RECIPE.seed)
    trained = [seen["trained"] for seen in record["ranks"]]
    assert len(trained[0]) == len(trained[1]) == RECIPE.steps
    for step in range(RECIPE.steps):
        batch = stream.take(RECIPE.batch_size).tokens.tolist()
        assert trained[0][step] == batch[0::2] and trained[1][step] == batch[1::2], step


def _assert_built_sharded(record: dict[str, Any], student_dir: Path) -> None:
    """Every process sharded a meta-device student, and only rank 0 read the student's weights."""
    ranks = record["ranks"]
    assert len(ranks) == 2
    for seen in ranks:
        assert seen["devices_at_shard"] and all(devices == ["meta"] for devices in seen["devices_at_shard"])
    assert any(ref == str(student_dir) for ref in ranks[0]["loaded"])
    # the teacher is sharded too: each process holds about half of its values, together all of them
    (local0, total), (local1, total1) = ranks[0]["teacher_values"], ranks[1]["teacher_values"]
    assert total == total1 and local0 + local1 == total and max(local0, local1) <= 0.6 * total
    assert all(ref != str(student_dir) for ref in ranks[1]["loaded"])  # rank 1: the teacher only


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
    _assert_built_sharded(sharded, student_dir)
    _assert_each_rank_trained_on_its_rows(sharded, student_dir)
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
    # Another recipe on that checkpoint: rank 0 finds the mismatch, and every process raises it.
    refused = _sharded(models, tmp_path / "resumed", "mismatch")
    for seen in refused["ranks"]:
        assert "was made with lr=0.003" in seen["error"][0]


def _stopped_in_step_3(student_dir: Path, teacher_dir: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-process run interrupted in its third update (after the step-2 checkpoint)."""
    import autocompress_opt.recover.distill as distill_module

    with monkeypatch.context() as patch:
        patch.setattr(distill_module, "_train_step", crashing(distill_module._train_step))
        with pytest.raises(KeyboardInterrupt):
            distill(student_dir, teacher_dir, out, RECIPE, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied-embeddings"])
def test_a_run_stopped_under_one_process_count_resumes_under_another(
    models: tuple[Path, Path], tied_models: tuple[Path, Path], tied: bool, tmp_path: Path, monkeypatch
) -> None:
    """The checkpoint is layout-free (full weights and moments, the global batch order): a run stopped
    under 2 sharded processes resumes in one plain process, and one stopped in a plain process resumes
    under 2, each from step 2 and ending with the weights of the uninterrupted run (tied output head
    and embedding included)."""
    pair = tied_models if tied else models
    student_dir, teacher_dir = pair
    single = distill(student_dir, teacher_dir, tmp_path / "single", RECIPE, progress=False)
    if tied:  # the student really has one tensor for both ends, before and after training
        trained = load_model(tmp_path / "single", cache=False).model
        assert trained.lm_head.weight.data_ptr() == trained.get_input_embeddings().weight.data_ptr()
    # 2 → 1
    _sharded(pair, tmp_path / "two-then-one", "stop")
    resumed = distill(student_dir, teacher_dir, tmp_path / "two-then-one", RECIPE, progress=False)
    assert resumed.resumed_from_step == 2
    _assert_trains_as(resumed.to_dict(), single, tmp_path / "two-then-one", tmp_path / "single")
    # 1 → 2
    _stopped_in_step_3(student_dir, teacher_dir, tmp_path / "one-then-two", monkeypatch)
    sharded = _sharded(pair, tmp_path / "one-then-two")
    assert sharded["resumed_from_step"] == 2
    _assert_trains_as(sharded, single, tmp_path / "one-then-two", tmp_path / "single")


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied-embeddings"])
def test_sharded_checkpoints_are_written_per_process_and_resume_under_any_layout(
    models: tuple[Path, Path], tied_models: tuple[Path, Path], tied: bool, tmp_path: Path
) -> None:
    """With sharded_checkpoints each process writes its own shards of the step-2 checkpoint (no
    student files beside them, state.json says so); the run resumes from it under 2 processes and
    under 1, each ending with the weights of the uninterrupted run."""
    pair = tied_models if tied else models
    student_dir, teacher_dir = pair
    single = distill(student_dir, teacher_dir, tmp_path / "single", RECIPE, progress=False)
    _sharded(pair, tmp_path / "stopped", "sharded-stop")
    state = json.loads((tmp_path / "stopped" / STATE_DIR / "state.json").read_text())
    assert state["weights"] == "sharded" and state["step"] == 2
    shards = sorted(p.name for p in (tmp_path / "stopped" / STATE_DIR / "shards").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one file per process
    assert not (tmp_path / "stopped" / "config.json").exists()
    # 2 → 1: a plain process reshards it on load
    shutil.copytree(tmp_path / "stopped", tmp_path / "two-then-one")
    resumed = distill(student_dir, teacher_dir, tmp_path / "two-then-one", RECIPE, progress=False)
    assert resumed.resumed_from_step == 2
    _assert_trains_as(resumed.to_dict(), single, tmp_path / "two-then-one", tmp_path / "single")
    # 2 → 2, interrupted and resumed in one call; the last step is saved whole
    again = _sharded(pair, tmp_path / "crashed", "sharded-crash")
    assert again["resumed_from_step"] == 2
    _assert_trains_as(again, single, tmp_path / "crashed", tmp_path / "single")
    assert "weights" not in json.loads((tmp_path / "crashed" / STATE_DIR / "state.json").read_text())


def test_sharded_checkpoints_without_fsdp_are_refused(models: tuple[Path, Path], tmp_path: Path) -> None:
    student_dir, teacher_dir = models
    with pytest.raises(ConfigError, match="sharded_checkpoints=True .* use it with fsdp=True"):
        distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False, sharded_checkpoints=True)


@pytest.mark.slow
def test_the_cli_under_torchrun_trains_one_sharded_student(models: tuple[Path, Path], tmp_path: Path) -> None:
    """``torchrun --nproc_per_node 2 autocompress distill --fsdp`` as a user runs it: the CLI joins the
    process group (gloo on the CPU, with the checkpoint-sized timeout), rank 0 alone reports, and
    the run is the one-process run's."""
    student_dir, teacher_dir = models
    out = tmp_path / "cli"
    path = [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    argv = ["--student", str(student_dir), "--teacher", str(teacher_dir), "--out", str(out), "--fsdp"]
    sizes = ["--steps", "4", "--batch-size", "4", "--seq-len", "16", "--lr", "3e-3", "--save-every", "2"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "autocompress_opt",
        ]
        + ["distill", *argv, *sizes, "--eval-rows", "2", "--device", "cpu", "--json", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout)  # one JSON object: rank 1 printed nothing
    single = distill(student_dir, teacher_dir, tmp_path / "single", RECIPE, progress=False)
    _assert_trains_as(record, single, out, tmp_path / "single")


def test_fsdp_without_a_process_group_is_refused(models: tuple[Path, Path], tmp_path: Path) -> None:
    student_dir, teacher_dir = models
    with pytest.raises(ConfigError, match="torchrun"):
        distill(student_dir, teacher_dir, tmp_path / "out", RECIPE, progress=False, fsdp=True)


@pytest.mark.slow
def test_sharded_bf16_compute_keeps_fp32_master_weights_and_resumes_to_the_same_weights(
    models: tuple[Path, Path], tmp_path: Path
) -> None:
    student_dir, teacher_dir = models
    single = distill(student_dir, teacher_dir, tmp_path / "single", RECIPE, progress=False)
    whole = _sharded(models, tmp_path / "whole", "bf16")
    resumed = _sharded(models, tmp_path / "resumed", "bf16-crash")
    assert whole["precision"] == resumed["precision"] == "bf16-mixed"
    assert resumed["resumed_from_step"] == 2 and resumed["complete"]
    _assert_built_sharded(whole, student_dir)
    # Stopped and resumed, the run ends with exactly the weights of the uninterrupted one.
    assert resumed["losses"] == whole["losses"]
    got = load_model(tmp_path / "resumed", cache=False).model.state_dict()
    want = load_model(tmp_path / "whole", cache=False).model.state_dict()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
    # The saved master weights are float32 and keep updates finer than bf16 can hold.
    start = load_model(student_dir, cache=False).model.state_dict()
    assert all(value.dtype == torch.float32 for value in got.values())
    fine = sum(
        int((((got[n] - start[n]).abs() > 0) & ((got[n] - start[n]).abs() < start[n].abs() * 2.0**-8)).sum())
        for n in start
    )
    assert fine > 100, fine
    # bf16 compute follows the fp32 run's loss curve within bf16 rounding.
    for a, b in zip(whole["losses"], single.losses):
        assert a == pytest.approx(b, rel=0.05)


# ------------------------------------------------------------------ the collectives' device
class _Collectives:
    """torch.distributed's collectives replaced by recorders (a world of two equal processes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
        import torch.distributed as dist

        self.devices: dict[str, Any] = {}
        monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
        real_tensor = torch.tensor

        def tensor(data: Any, *, device: Any = None, **kwargs: Any) -> torch.Tensor:
            self.devices["tensor"] = torch.device(device) if device is not None else torch.device("cpu")
            return real_tensor(data, **kwargs)  # on the CPU: this machine may have no GPU

        def all_reduce(total: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            total.mul_(2)  # two processes with the same value

        def barrier(*args: Any, device_ids: list[int] | None = None, **kwargs: Any) -> None:
            self.devices["barrier"] = device_ids

        def broadcast_object_list(objects: list[Any], src: int = 0, group: Any = None, device: Any = None) -> None:
            self.devices["broadcast_object_list"] = torch.device(device)

        monkeypatch.setattr(fsdp.torch, "tensor", tensor)
        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        monkeypatch.setattr(dist, "barrier", barrier)
        monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)


def test_collectives_run_on_this_process_gpu_under_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _Collectives(monkeypatch, "nccl").devices
    assert fsdp._collective_device() == torch.device("cuda", 3)
    assert fsdp._mean_over_processes(1.5, 2) == 1.5
    assert seen["tensor"] == torch.device("cuda", 3)  # NCCL has no CPU tensors
    fsdp._barrier(2)
    assert seen["barrier"] == [3]
    assert fsdp._from_rank0(lambda: {"step": 2}, 2) == {"step": 2}
    assert seen["broadcast_object_list"] == torch.device("cuda", 3)


def test_collectives_run_on_the_cpu_under_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _Collectives(monkeypatch, "gloo").devices
    assert fsdp._collective_device() == torch.device("cpu")
    assert fsdp._mean_over_processes(0.25, 2) == 0.25 and seen["tensor"] == torch.device("cpu")
    fsdp._barrier(2)
    assert seen["barrier"] is None
    fsdp._from_rank0(lambda: None, 2)
    assert seen["broadcast_object_list"] == torch.device("cpu")


def test_an_error_rank_0_finds_is_raised_on_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _Collectives(monkeypatch, "gloo")

    def refuse() -> None:
        raise ConfigError("the checkpoint in 'out' was made with lr=0.1")

    with pytest.raises(ConfigError, match="lr=0.1"):
        fsdp._from_rank0(refuse, 2)


def _header_only(path: Path, shapes: dict[str, list[int]]) -> None:
    """A safetensors file whose header names tensors of ``shapes`` (no data: only the header is read)."""
    import struct

    header = json.dumps(
        {name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in shapes.items()}
    )
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode())


def test_the_collective_timeout_covers_rank_0_writing_the_checkpoint(tmp_path: Path) -> None:
    """Rank 0 writes fp32 weights and two moments (12 bytes a parameter) while the others wait at a
    barrier: the group's timeout is torch's 10 minutes for a small student and grows with its size."""
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir(), large.mkdir()
    _header_only(small / "model.safetensors", {"w": [1000, 1000]})
    _header_only(large / "model-00001.safetensors", {"a": [4_000_000_000]})
    _header_only(large / "model-00002.safetensors", {"b": [2_000_000, 2000], "__metadata__": [0]})
    assert fsdp.collective_timeout(small) == fsdp.DEFAULT_TIMEOUT_S
    # 8e9 parameters x 12 bytes at 50 MB/s = 1920 s of writing, doubled
    assert fsdp.collective_timeout(large) == pytest.approx(2 * 8e9 * 12 / 50e6)
