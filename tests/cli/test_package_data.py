"""The bundled search spaces ship inside the package: a wheel built from this checkout holds them,
and the package imported from that wheel (not from the checkout) loads one by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built (no build isolation, nothing downloaded) from a copy of the checkout's sources,
    so the build writes nothing into the checkout."""
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "autocompress_opt", src / "autocompress_opt", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("autocompress_opt-*.whl")
    return built


def test_the_wheel_holds_every_bundled_search_space(wheel: Path) -> None:
    bundled = sorted(p.name for p in (REPO / "search_spaces").glob("*.yaml"))
    assert bundled, "no bundled search spaces in search_spaces/"
    with zipfile.ZipFile(wheel) as zf:
        shipped = sorted(Path(n).name for n in zf.namelist() if n.startswith("autocompress_opt/data/search_spaces/"))
    assert shipped == bundled


def test_an_installed_package_finds_a_bundled_space_by_name(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    code = (
        "import autocompress_opt, sys; from autocompress_opt.arch.search_space import load_search_space; "
        "assert autocompress_opt.__file__.startswith(sys.argv[1]), autocompress_opt.__file__; "
        "space = load_search_space('smollm2-135m'); print(space.sampler, max(space['ffn_width'].values))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        cwd=tmp_path,  # not the checkout: no search_spaces/ folder beside the package
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tpe", "1536"], done.stdout  # smollm2-135m.yaml: ffn_width max 1536
