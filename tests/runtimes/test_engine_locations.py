"""Where the engines are found: the user's own (``AUTOCOMPRESS_VLLM_PYTHON`` / ``--vllm-python``,
``LLAMACPP_DIR`` / ``--llamacpp-dir``, llama.cpp's tools on ``PATH``) before the bundled ``make
engines`` install, and from an installed package (no checkout) the per-user folder or the working
directory, with an error that says what to set. Fake interpreters and tools: no engine runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autocompress_opt.errors import ConfigError
from autocompress_opt.runtimes import install

TOOLS = ("llama-bench", "llama-quantize", "autocompress-logits")


@pytest.fixture(autouse=True)
def no_engines_around(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No user setting, an empty PATH, no checkout, an empty per-user folder and working directory."""
    for env in (install.VLLM_PYTHON_ENV, install.LLAMACPP_DIR_ENV):
        monkeypatch.setenv(env, "")  # recorded, so what use_engines exports is undone after the test
        monkeypatch.delenv(env)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(install, "repo_root", lambda: None)  # as from `pip install .`
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def _cmake_checkout(root: Path) -> Path:
    """A user's llama.cpp: converter at the top, tools in build/bin."""
    (root).mkdir(parents=True)
    (root / "convert_hf_to_gguf.py").write_text("", encoding="utf-8")
    for tool in TOOLS:
        _executable(root / "build" / "bin" / tool)
    return root


def _bundled_llamacpp(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "convert_hf_to_gguf.py").write_text("", encoding="utf-8")
    _executable(root / "venv" / "bin" / "python")
    for tool in TOOLS:
        _executable(root / "build" / "bin" / tool)
    return root


def _bundled_vllm(venv: Path) -> Path:
    _executable(venv / "bin" / "python")
    (venv / ".ok-0.32.0").touch()
    return venv


def test_nothing_installed_says_what_to_set_and_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(install.EngineMissing) as vllm_error:
        install.vllm()
    message = str(vllm_error.value)
    assert "AUTOCOMPRESS_VLLM_PYTHON (--vllm-python)" in message and "make engines" in message
    assert str(tmp_path / "xdg" / "autocompress_opt" / "engines" / ".venv-vllm") in message
    with pytest.raises(install.EngineMissing, match=r"LLAMACPP_DIR \(--llamacpp-dir\).*make engines"):
        install.llamacpp()


def test_a_user_vllm_python_wins_over_the_bundled_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _bundled_vllm(install.user_engines_dir() / ".venv-vllm")
    assert install.vllm().python == install.user_engines_dir() / ".venv-vllm" / "bin" / "python"
    mine = _executable(tmp_path / "cluster" / "vllm-cuda" / "bin" / "python3")
    monkeypatch.setenv(install.VLLM_PYTHON_ENV, str(mine))
    assert install.vllm().python == mine
    monkeypatch.setenv(install.VLLM_PYTHON_ENV, str(tmp_path / "no" / "python"))
    with pytest.raises(install.EngineMissing, match=r"from AUTOCOMPRESS_VLLM_PYTHON=.*no/python"):
        install.vllm()


def test_an_installed_package_finds_engines_in_the_working_directory(tmp_path: Path) -> None:
    _bundled_vllm(tmp_path / "cwd" / ".venv-vllm")
    _bundled_llamacpp(tmp_path / "cwd" / "build" / "llama.cpp")
    assert install.vllm().python == tmp_path / "cwd" / ".venv-vllm" / "bin" / "python"
    assert install.llamacpp().root == tmp_path / "cwd" / "build" / "llama.cpp"


def test_llamacpp_dir_takes_a_cmake_checkout_or_the_bundled_layout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    checkout = _cmake_checkout(tmp_path / "llama.cpp")
    monkeypatch.setenv(install.LLAMACPP_DIR_ENV, str(checkout))
    engine = install.llamacpp()
    assert engine.src == checkout and engine.tool("llama-bench") == checkout / "build" / "bin" / "llama-bench"
    assert engine.python == Path(sys.executable)  # the converter runs in this Python
    bundled = _bundled_llamacpp(tmp_path / "bundled")
    monkeypatch.setenv(install.LLAMACPP_DIR_ENV, str(bundled))
    assert install.llamacpp().src == bundled / "src"
    (checkout / "build" / "bin" / "autocompress-logits").unlink()
    monkeypatch.setenv(install.LLAMACPP_DIR_ENV, str(checkout))
    with pytest.raises(install.EngineMissing, match=r"from LLAMACPP_DIR=.*autocompress-logits"):
        install.llamacpp()


def test_llamacpp_tools_on_path_are_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix" / "bin"
    for tool in (*TOOLS, "convert_hf_to_gguf.py"):
        _executable(prefix / tool)
    monkeypatch.setenv("PATH", str(prefix))
    engine = install.llamacpp()
    assert engine.tool("llama-quantize") == prefix / "llama-quantize" and engine.src == prefix


def test_the_flags_check_the_path_and_reach_the_lookup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mine = _executable(tmp_path / "venv" / "bin" / "python")
    checkout = _cmake_checkout(tmp_path / "llama.cpp")
    install.use_engines(vllm_python=mine, llamacpp_dir=checkout)
    assert install.vllm().python == mine and install.llamacpp().root == checkout
    with pytest.raises(ConfigError, match=r"--vllm-python '.*nothing' is not an executable file"):
        install.use_engines(vllm_python=tmp_path / "nothing")
    with pytest.raises(ConfigError, match=r"--llamacpp-dir '.*nothing' is not a folder"):
        install.use_engines(llamacpp_dir=tmp_path / "nothing")


@pytest.mark.parametrize("verb", ["serve-check", "calibrate"])
def test_serve_check_and_calibrate_take_the_engine_flags(verb: str) -> None:
    from autocompress_opt.cli import build_parser

    head = ["serve-check", "out/x", "--engine", "vllm"] if verb == "serve-check" else ["calibrate", "--engine", "vllm"]
    args: argparse.Namespace = build_parser().parse_args(
        [*head, "--vllm-python", "/p/bin/python", "--llamacpp-dir", "/l"]
    )
    assert (args.vllm_python, args.llamacpp_dir) == ("/p/bin/python", "/l")


@pytest.mark.slow
def test_a_package_installed_from_its_wheel_finds_the_per_user_engines(tmp_path: Path) -> None:
    """Built as a wheel and imported from it (no checkout around it), the package has no repository
    root and finds the engines in the per-user folder; without them it names what to set."""
    import os
    import shutil
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    repo = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    shutil.copytree(repo / "autocompress_opt", src / "autocompress_opt", ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    subprocess.run([*command, str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("autocompress_opt-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "site")
    code = (
        "import sys; from autocompress_opt.runtimes import install as i; "
        "assert i.__file__.startswith(sys.argv[1]), i.__file__; print(i.repo_root()); "
        "print(i.vllm().python if sys.argv[2] == 'found' else i.status()['vllm'])"
    )

    def run(case: str) -> list[str]:
        env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": os.defpath, "XDG_DATA_HOME": str(tmp_path / "xdg")}
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "site"), case],
            cwd=tmp_path / "cwd",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.splitlines()

    root, missing = run("missing")
    assert root == "None" and "set AUTOCOMPRESS_VLLM_PYTHON (--vllm-python)" in missing
    venv = _bundled_vllm(tmp_path / "xdg" / "autocompress_opt" / "engines" / ".venv-vllm")
    assert run("found") == ["None", str(venv / "bin" / "python")]
