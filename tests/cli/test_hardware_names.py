"""User hardware entries may not take a built-in name or alias; ``hardware list`` shows aliases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.cli import main
from autocompress_opt.serving.hardware import HARDWARE, get_hardware

ENTRY = "- name: {name}\n  memory_gib: 24\n  bandwidth_gb_s: 1000\n  peak_tflops: {{bf16: 100}}\n"


@pytest.mark.parametrize(
    "name, needles",
    [
        ("h100", ["'h100'", "alias of the built-in 'h100-sxm'"]),
        ("H100-SXM", ["'H100-SXM'", "built-in hardware 'h100-sxm'"]),
        ("rtx5070", ["'rtx5070'", "built-in hardware 'rtx5070'"]),
    ],
)
def test_a_user_entry_may_not_shadow_a_builtin(tmp_path: Path, capsys: Any, name: str, needles: list[str]) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(ENTRY.format(name=name))
    assert main(["hardware", "list", "--hardware-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autocompress hardware: error:") and err.count("\n") == 1 and "Traceback" not in err
    for needle in [*needles, "gpus.yaml"]:
        assert needle in err, err
    assert get_hardware("h100").memory_gib == 80 and get_hardware("rtx5070").memory_gib == 12


def test_a_name_twice_in_one_file_is_an_error(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(ENTRY.format(name="my-twice") + ENTRY.format(name="My-Twice"))
    assert main(["hardware", "list", "--hardware-file", str(path)]) == 2
    assert "'My-Twice' appears twice" in capsys.readouterr().err
    assert "my-twice" not in HARDWARE


def test_hardware_list_shows_aliases_once_per_entry(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(ENTRY.format(name="my-card"))
    try:
        assert main(["hardware", "list", "--hardware-file", str(path)]) == 0
        out = capsys.readouterr().out
        lines = [line.split() for line in out.splitlines()[2:] if line.strip()]
        names = [cells[0] for cells in lines if not cells[0].startswith("(")]
        assert len(names) == len(set(names)) and "my-card" in names
        assert next(cells for cells in lines if cells[0] == "h100-sxm")[1] == "h100"
        assert main(["hardware", "list", "--json", "--hardware-file", str(path)]) == 0  # the same file again
        rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
        assert rows["h100-sxm"]["aliases"] == ["h100"] and rows["my-card"]["aliases"] == []
    finally:
        HARDWARE._items.pop("my-card", None)
