"""Custom GPUs reach studies (issue 13): ``study run --hardware-file`` and the study YAML's
``hardware_file:`` key register user hardware (with the collision checks of every other verb) in the
driver and in the Ray trial workers; the profile is part of the study's identity."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autocompress_opt.cli import main
from autocompress_opt.serving.hardware import HARDWARE

pytestmark = pytest.mark.slow
ENTRY = "- name: {name}\n  memory_gib: {memory}\n  bandwidth_gb_s: 900\n  peak_tflops: {{bf16: 120, fp8: 240}}\n"


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    import ray

    from autocompress_opt.search.study import init_ray

    init_ray(None, 2, ())
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def forget_user_hardware() -> Iterator[None]:
    yield
    for name in ("my-gpu", "my-other-gpu"):
        HARDWARE._items.pop(name, None)


def _run(storage: str, *extra: str, name: str = "hw") -> list[str]:
    return [
        "study",
        "run",
        "--targets",
        "my-gpu,rtx5070",
        "--workload",
        "datacenter",
        "--trials",
        "3",
        "--name",
        name,
        "--storage",
        storage,
        "--quiet",
        *extra,
    ]


def test_a_custom_gpu_from_a_hardware_file_is_a_study_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(ENTRY.format(name="my-gpu", memory=20))
    storage = f"sqlite:///{tmp_path}/hw.db"
    assert main(_run(storage)) == 2  # unknown without the file
    assert "my-gpu" in capsys.readouterr().err
    assert not (tmp_path / "hw.db").exists()
    assert main(_run(storage, "--hardware-file", str(gpus))) == 0
    assert "hw.my-gpu: 3 COMPLETE trials" in capsys.readouterr().out
    study = optuna.load_study(study_name="hw.my-gpu", storage=storage)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 3 and all(t.user_attrs["metrics"]["tpot_ms"] > 0 for t in complete)  # costed in workers
    assert study.user_attrs["identity"]["hardware_profile"]["memory_gib"] == 20
    rtx = optuna.load_study(study_name="hw.rtx5070", storage=storage)
    assert rtx.user_attrs["identity"].get("hardware_profile") is None  # a built-in: no profile stored

    # The same name with other numbers is another GPU: not the same study.
    gpus.write_text(ENTRY.format(name="my-gpu", memory=40))
    assert main(_run(storage, "--hardware-file", str(gpus))) == 2
    err = capsys.readouterr().err
    assert "exists with different settings (hardware_profile" in err and err.count("\n") == 1


def test_the_study_yaml_takes_hardware_file_and_collisions_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(ENTRY.format(name="my-gpu", memory=20) + ENTRY.format(name="my-other-gpu", memory=30))
    config = tmp_path / "study.yaml"
    config.write_text(
        f"targets: my-gpu,my-other-gpu\nworkload: datacenter\ntrials: 2\nname: y\n"
        f"storage: sqlite:///{tmp_path}/y.db\nhardware_file: {gpus}\n"
    )
    assert main(["study", "run", "--config", str(config), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "y.my-gpu: 2 COMPLETE trials" in out and "y.my-other-gpu: 2 COMPLETE trials" in out

    clash = tmp_path / "clash.yaml"
    clash.write_text(ENTRY.format(name="h100", memory=20))
    storage = f"sqlite:///{tmp_path}/c.db"
    assert main(["study", "run", "--targets", "h100", "--hardware-file", str(clash), "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'h100'" in err and "alias of the built-in 'h100-sxm'" in err
    assert not (tmp_path / "c.db").exists()
