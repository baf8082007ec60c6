"""Where the package's shipped data lives (``autocompress_opt/data``) and the repository's bundled
search spaces; one place, so that moving a module never breaks a path."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR", "PACKAGE_DIR", "REPO_SEARCH_SPACES"]

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"
# The bundled search spaces ship as package data (pyproject [tool.setuptools.package-data]), so an
# installed wheel finds them; search_spaces/ at the top of a checkout is a link to this folder.
REPO_SEARCH_SPACES = DATA_DIR / "search_spaces"
