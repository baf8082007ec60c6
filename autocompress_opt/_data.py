"""Where the package's shipped data lives (``autocompress_opt/data``) and the repository's bundled
search spaces; one place, so that moving a module never breaks a path."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR", "PACKAGE_DIR", "REPO_SEARCH_SPACES"]

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"
# search_spaces/ beside the package in a source checkout (not installed with a wheel).
REPO_SEARCH_SPACES = PACKAGE_DIR.parent / "search_spaces"
