"""``autocompress --version`` prints the package version and exits 0."""

from __future__ import annotations

from typing import Any

import pytest

import autocompress_opt
from autocompress_opt.cli import main


def test_version(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"autocompress {autocompress_opt.__version__}"
